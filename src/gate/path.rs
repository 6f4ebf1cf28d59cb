//! Reads a request path once: into the canonical form that rules match against, and into what
//! is forwarded to the backend.
//!
//! What is counted is what is forwarded. A gateway that matches one spelling of a path while the
//! backend reads another is a way around the limit, and backends read paths differently: Java
//! servlet containers drop `;` parameters and read `..;` as `..`, Rails routes `/login.json` to
//! the login action, IIS reads `\` as `/`, a server that decodes twice reads `%256c` as `l`. So
//! [`parse`] reads a path the way the most lenient backend would, and refuses the spellings that
//! backends read in ways no single reading covers.
//!
//! # The canonical form
//!
//! Percent escapes are decoded; `%2F` splits segments like `/` (any spelling that could be a
//! separator is one) and `%3B` cuts parameters like `;`. Each segment is cut at its first `;`,
//! ASCII letters are lowercased (matching is case-insensitive), empty and `.` segments are
//! dropped, `..` pops a segment (never above the root), and there is no trailing slash. So
//! `/Login;jsessionid=x`, `//login/`, `/x/..;/login` and `/log%69n` all read as `/login`. An
//! extension stays (`/login.json`), and so does what follows a segment naming a script
//! (`/wp-login.php/x`, PHP's `PATH_INFO`): rule patterns ([`crate::rules::pattern`]) ignore
//! both, and the `path` key source keys without them. A `%`
//! decoded from `%25` stays a literal `%`, so a canonical path holding one is not itself a
//! valid raw path.
//!
//! # What is forwarded
//!
//! A path with a dot segment is forwarded with the dots resolved, rebuilt from the raw text of
//! the segments that survive (escapes and parameters reach the backend as sent), since backends
//! resolve dots differently (`..;` is `..` to Tomcat and a name to others). A path that starts
//! with an empty segment (`//evil/login`) is forwarded with its leading slashes merged into one
//! (`/evil/login`): a backend that reads its target as a URL reference (Node's
//! `new URL(req.url, base)`, Python's `urlsplit`, RFC 3986 section 4.2) takes `//evil` for an
//! authority and serves `/login`, past the budget that counted `/evil/login`. Any other path is
//! forwarded byte for byte: where a backend's reading still differs from ours (`/a//login` may
//! be another resource to it), ours is the one that matches more rules.
//!
//! # What is refused
//!
//! - Not starting with `/`: there is no path to read.
//! - `\`, raw or `%5C`: IIS and other Windows servers read it as `/`, so `/x\..\login` is `/login`.
//! - NUL, raw or `%00`: C code and filesystems end the string there, so `/login%00.png` is `/login`.
//! - Other control bytes and spaces, raw or encoded: servers that trim them read `/login%0a` as `/login`.
//! - `%` not followed by two hex digits: servers keep it, refuse it, or read IIS's `%u006c` as `l`.
//! - `%25` followed by two hex digits (`%256c`, `%25%36%63`): a server that decodes twice reads `l`.
//! - Escapes that are not UTF-8: servers replace, drop or refuse them, so one spelling is several paths.
//! - `%2F` with a dot segment or `;`: decoding it before or after resolving those gives two paths.
//! - A dot segment with a non-final empty one: RFC 3986 reads `/a//../b` as `/a/b`, slash-mergers as `/b`.
//! - `%3F` (`?`) or `%23` (`#`): a backend that decodes before splitting reads `/login%3Fx` as the
//!   path `/login` with a query, while the rules saw one segment `login?x`.
//! - A first segment that starts with `%2F`: a backend that decodes before reading the target as a
//!   URL reference reads `/%2Fevil/login` as `//evil/login`, authority `evil`, path `/login`.

use std::borrow::Cow;

/// A request path read one way only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    /// The canonical form rules match against (see the module docs); borrowed from the raw path
    /// when the raw path is already canonical (the common case allocates nothing).
    pub canonical: Cow<'a, str>,
    /// `Some` when the path must be forwarded rewritten (dot segments resolved); `None`: forward
    /// the raw path byte for byte.
    pub rewritten: Option<String>,
}

/// Why a path is refused rather than read one way; the module docs say what each risks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not starting with `/`: there is no path to read.
    #[error("the path does not start with '/'")]
    NotAbsolute,
    /// `\`, raw or `%5C`: Windows servers read it as `/`.
    #[error("the path contains a backslash")]
    Backslash,
    /// NUL, raw or `%00`: C code ends the path there.
    #[error("the path contains a NUL byte")]
    Nul,
    /// Another control byte or a space, raw or encoded: servers trim them.
    #[error("the path contains a control character or a space")]
    Control,
    /// A `%` not followed by two hex digits: servers disagree on what it is.
    #[error("the path has a '%' not followed by two hex digits")]
    MalformedEscape,
    /// `%25` followed by two hex digits: a server that decodes twice reads another path.
    #[error("the path is percent-encoded twice")]
    DoubleEncoded,
    /// Escapes that do not decode to UTF-8: servers replace, drop or refuse them.
    #[error("the path's escapes do not decode to UTF-8")]
    InvalidUtf8,
    /// `%2F` with a dot segment or a `;` parameter: backends that decode it read another path.
    #[error("the path is ambiguous: an encoded '/' with a dot segment or a ';' parameter")]
    AmbiguousEncodedSlash,
    /// A dot segment with a non-trailing empty segment: slash-merging servers read another path.
    #[error("the path is ambiguous: a dot segment with an empty segment")]
    AmbiguousEmptySegment,
    /// `%3F` or `%23`: a backend that decodes before splitting reads a query or a fragment.
    #[error("the path is ambiguous: an encoded '?' or '#'")]
    EncodedDelimiter,
    /// An encoded `/` at the start: a backend that decodes first reads `//`, an authority.
    #[error("the path is ambiguous: it starts with an encoded '/'")]
    EncodedLeadingSlash,
}

/// Read `raw` (`http::Uri::path()`, without the query) into its canonical form and what is
/// forwarded, or say why it is refused.
pub fn parse(raw: &str) -> Result<RequestPath<'_>, PathError> {
    if is_canonical(raw) {
        return Ok(RequestPath {
            canonical: Cow::Borrowed(raw),
            rewritten: None,
        });
    }
    read(raw)
}

/// The fast path: true for a path [`read`] would return unchanged because it holds nothing to
/// decode, cut, lowercase or resolve. It may say false for a canonical path, never true for
/// another.
fn is_canonical(raw: &str) -> bool {
    let plain =
        |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"-._~!$&'()*+,:=@".contains(&byte);
    raw == "/"
        || raw.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|segment| !matches!(segment, "" | "." | "..") && segment.bytes().all(plain))
        })
}

/// The slow path: everything the module docs describe.
fn read(raw: &str) -> Result<RequestPath<'static>, PathError> {
    let rest = raw.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
    // Empty leading segments are merged away in what is forwarded (see the module docs), so
    // the first segment a backend reads is the first non-empty one.
    let leading_empty = rest.starts_with('/');
    let first = rest.trim_start_matches('/');
    if first.len() >= 3 && first.as_bytes()[0] == b'%' && first.as_bytes()[1..3].eq_ignore_ascii_case(b"2f") {
        return Err(PathError::EncodedLeadingSlash);
    }
    let mut canonical = String::with_capacity(raw.len());
    // The surviving segments: raw text (to rebuild the forwarded path) and where each starts in
    // `canonical` (so `..` can take it back).
    let mut kept: Vec<(&str, usize)> = Vec::new();
    let mut decoded = Vec::new();
    let mut dots = false; // a `.` or `..` segment
    let mut params = false; // a `;` parameter
    let mut encoded_slash = false;
    let mut inner_empty = false; // an empty segment before another segment
    let mut after_empty = false; // the segment just read was empty
    let mut directory = false; // the segment just read was empty or a dot segment
    for raw_segment in rest.split('/') {
        decode(raw_segment, &mut decoded)?;
        let segment = std::str::from_utf8(&decoded).map_err(|_| PathError::InvalidUtf8)?;
        encoded_slash |= segment.contains('/');
        for part in segment.split('/') {
            let name = part.split_once(';').map_or(part, |(name, _)| name);
            params |= name.len() < part.len();
            inner_empty |= after_empty;
            after_empty = name.is_empty();
            directory = matches!(name, "" | "." | "..");
            match name {
                "" => {}
                "." => dots = true,
                ".." => {
                    dots = true;
                    if let Some((_, start)) = kept.pop() {
                        canonical.truncate(start);
                    }
                }
                name => {
                    // With an encoded slash the raw segment holds several names, but then a dot
                    // segment is refused below and the raw text is never used.
                    kept.push((raw_segment, canonical.len()));
                    canonical.push('/');
                    canonical.push_str(name);
                }
            }
        }
    }
    if encoded_slash && (dots || params) {
        return Err(PathError::AmbiguousEncodedSlash);
    }
    if dots && inner_empty {
        return Err(PathError::AmbiguousEmptySegment);
    }
    // RFC 3986 remove_dot_segments keeps the slash of a final empty or dot segment: `/a/b/..` is
    // `/a/`.
    let rewritten = if dots {
        let mut path: String = kept
            .iter()
            .flat_map(|&(raw_segment, _)| ["/", raw_segment])
            .collect();
        if path.is_empty() || directory {
            path.push('/');
        }
        Some(path)
    } else if leading_empty {
        Some(format!("/{first}"))
    } else {
        None
    };
    if canonical.is_empty() {
        canonical.push('/');
    }
    canonical.make_ascii_lowercase();
    Ok(RequestPath {
        canonical: Cow::Owned(canonical),
        rewritten,
    })
}

/// Percent-decode one raw segment into `out`, refusing the octets and escapes the module docs
/// list. A `/` in the result was `%2F`.
fn decode(raw_segment: &str, out: &mut Vec<u8>) -> Result<(), PathError> {
    out.clear();
    let mut bytes = raw_segment.bytes();
    while let Some(byte) = bytes.next() {
        let octet = if byte == b'%' {
            let (high, low) = (bytes.next().and_then(hex), bytes.next().and_then(hex));
            high.zip(low)
                .map(|(high, low)| (high << 4) | low)
                .ok_or(PathError::MalformedEscape)?
        } else {
            byte
        };
        match octet {
            0 => return Err(PathError::Nul),
            b'\\' => return Err(PathError::Backslash),
            // A raw `?` or `#` cannot be in a path (the target's parser split it off): this
            // one was encoded.
            b'?' | b'#' => return Err(PathError::EncodedDelimiter),
            b' ' => return Err(PathError::Control),
            octet if octet.is_ascii_control() => return Err(PathError::Control),
            octet => out.push(octet),
        }
    }
    // A raw `%` always starts an escape, so any `%` here was `%25`.
    let double = |window: &[u8]| matches!(*window, [b'%', high, low] if hex(high).and(hex(low)).is_some());
    if out.windows(3).any(double) {
        return Err(PathError::DoubleEncoded);
    }
    Ok(())
}

/// The value of one hex digit, either case.
fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};

    use super::*;
    use crate::rules::pattern::PathPattern;

    /// Checks what holds for every path `parse` accepts: the canonical form has the promised
    /// shape and reads as itself, and what is forwarded reads as what was counted.
    fn assert_consistent(raw: &str) {
        let Ok(path) = parse(raw) else { return };
        let canonical = path.canonical.as_ref();
        assert!(canonical.starts_with('/'), "{raw:?} -> {canonical:?}");
        assert!(
            canonical == "/" || !canonical.ends_with('/'),
            "{raw:?} -> {canonical:?}"
        );
        assert!(
            !canonical.contains(';') && !canonical.bytes().any(|b| b.is_ascii_uppercase()),
            "{raw:?} -> {canonical:?}"
        );
        assert!(
            !canonical[1..].split('/').any(|s| matches!(s, "" | "." | "..")) || canonical == "/",
            "{raw:?} -> {canonical:?}"
        );
        if canonical.contains('%') {
            // Only a literal `%` from `%25`, never followed by two hex digits.
            assert_eq!(
                parse(canonical),
                Err(PathError::MalformedEscape),
                "{raw:?} -> {canonical:?}"
            );
        } else {
            let again = parse(canonical).expect("a canonical path parses");
            assert_eq!(
                (again.canonical.as_ref(), again.rewritten),
                (canonical, None),
                "{raw:?}"
            );
        }
        let forwarded = path.rewritten.as_deref().unwrap_or(raw);
        // A URL-reference reader (RFC 3986 section 4.2) would take `//x` for an authority,
        // and a decoding one `/%2Fx`.
        assert!(!forwarded.starts_with("//"), "{raw:?} -> {forwarded:?}");
        assert!(
            !forwarded.to_ascii_lowercase().starts_with("/%2f"),
            "{raw:?} -> {forwarded:?}"
        );
        let again = parse(forwarded).expect("what is forwarded parses");
        assert_eq!(
            (again.canonical.as_ref(), again.rewritten),
            (canonical, None),
            "{raw:?}"
        );
    }

    #[test]
    fn ordinary_paths_stay_borrowed() {
        for raw in [
            "/api/items",
            "/a.b",
            "/..a",
            "/",
            "/v1/users/42",
            "/login.json",
            "/~u/a-b_c:d@e",
        ] {
            let path = parse(raw).expect("an ordinary path");
            assert!(matches!(path.canonical, Cow::Borrowed(c) if c == raw), "{raw:?}");
            assert_eq!(path.rewritten, None, "{raw:?}");
        }
    }

    #[test]
    fn canonical_and_forwarded_forms() {
        for (raw, canonical, rewritten) in [
            ("/Login", "/login", None),
            ("/LOG%49N", "/login", None),
            ("/log%69n", "/login", None),
            ("//login", "/login", Some("/login")),
            ("//evil/login", "/evil/login", Some("/evil/login")),
            ("///evil//login", "/evil/login", Some("/evil//login")),
            ("//", "/", Some("/")),
            ("//a;x/B", "/a/b", Some("/a;x/B")),
            ("/a%2F%2Fb", "/a/b", None),
            ("/login/", "/login", None),
            ("/login;jsessionid=x", "/login", None),
            ("/;x=1/login", "/login", None),
            ("/LOGIN;a=b", "/login", None),
            ("/login.json", "/login.json", None),
            ("/a%2Fb", "/a/b", None),
            ("/a%2f", "/a", None),
            ("/a%3Bb/c", "/a/c", None),
            ("/100%25", "/100%", None),
            ("/%25zz", "/%zz", None),
            ("/%25%2Fa", "/%/a", None),
            ("/caf%C3%A9", "/café", None),
            ("/CAFÉ", "/cafÉ", None),
            ("/a\"b", "/a\"b", None),
            ("/./login", "/login", Some("/login")),
            ("/x/../login", "/login", Some("/login")),
            ("/login/..;/login", "/login", Some("/login")),
            ("/x/..;/Login;p", "/login", Some("/Login;p")),
            ("/a/%7Euser/../b", "/a/b", Some("/a/b")),
            ("/a/%7Euser/b/..", "/a/~user", Some("/a/%7Euser/")),
            ("/a/b/..", "/a", Some("/a/")),
            ("/a/b/.", "/a/b", Some("/a/b/")),
            ("/a/./b/", "/a/b", Some("/a/b/")),
            ("/a/../b/;x", "/b", Some("/b/")),
            ("/../..", "/", Some("/")),
            ("/a/.%2E", "/", Some("/")),
            ("/%2e%2E/login", "/login", Some("/login")),
            ("/a/.;x/b", "/a/b", Some("/a/b")),
        ] {
            let path = parse(raw).unwrap_or_else(|error| panic!("{raw:?}: {error}"));
            assert_eq!(path.canonical, canonical, "{raw:?}");
            assert_eq!(path.rewritten.as_deref(), rewritten, "{raw:?}");
            assert_consistent(raw);
        }
    }

    #[test]
    fn refused_forms() {
        use PathError::*;
        for (raw, error) in [
            ("", NotAbsolute),
            ("login", NotAbsolute),
            ("*", NotAbsolute),
            ("%2Flogin", NotAbsolute),
            ("/login\\", Backslash),
            ("/a%5cb", Backslash),
            ("/a%5C", Backslash),
            ("/login%00", Nul),
            ("/a\0b", Nul),
            ("/login%0a", Control),
            ("/login%0D", Control),
            ("/login%09", Control),
            ("/login%20", Control),
            ("/a b", Control),
            ("/a\tb", Control),
            ("/a%7F", Control),
            ("/a\x7f", Control),
            ("/a%1b", Control),
            ("/a%", MalformedEscape),
            ("/a%4", MalformedEscape),
            ("/a%zz", MalformedEscape),
            ("/a%G0", MalformedEscape),
            ("/%u006c", MalformedEscape),
            ("/a%%41", MalformedEscape),
            ("/a%é", MalformedEscape),
            ("/%256cogin", DoubleEncoded),
            ("/login%252f", DoubleEncoded),
            ("/%25%36%63", DoubleEncoded),
            ("/%254%31", DoubleEncoded),
            ("/%25252f", DoubleEncoded),
            ("/a%C3", InvalidUtf8),
            ("/a%FF", InvalidUtf8),
            ("/%C3%28", InvalidUtf8),
            ("/%C0%AF", InvalidUtf8),
            ("/%ED%A0%80", InvalidUtf8),
            ("/a%2F..%2Flogin", AmbiguousEncodedSlash),
            ("/a%2Fb/../c", AmbiguousEncodedSlash),
            ("/x/./a%2fb", AmbiguousEncodedSlash),
            ("/login;x%2Fy", AmbiguousEncodedSlash),
            ("/a%2Fb;c", AmbiguousEncodedSlash),
            ("/a%3Bb%2Fc", AmbiguousEncodedSlash),
            ("/a//../b", AmbiguousEmptySegment),
            ("//..", AmbiguousEmptySegment),
            ("/x/..//login", AmbiguousEmptySegment),
            ("/a/;x/../b", AmbiguousEmptySegment),
            ("/a/../b//", AmbiguousEmptySegment),
            ("/login%3f", EncodedDelimiter),
            ("/login%3Fx=1", EncodedDelimiter),
            ("/login%23", EncodedDelimiter),
            ("/a/%23/b", EncodedDelimiter),
            ("/%2Fevil/login", EncodedLeadingSlash),
            ("/%2fevil", EncodedLeadingSlash),
            ("//%2Fevil/login", EncodedLeadingSlash),
            ("/%2F", EncodedLeadingSlash),
        ] {
            assert_eq!(parse(raw), Err(error), "{raw:?}");
        }
    }

    #[test]
    fn attacker_spellings_of_login_are_refused_or_login() {
        for raw in [
            "/login;jsessionid=x",
            "/;x=1/login",
            "/login/..;/login",
            "/LOGIN;a=b",
            "/login%00",
            "/login%0a",
            "/login%20",
            "/login%5c",
            "/login\\",
            "/%256cogin",
            "/login%252f",
            "/log%69n",
            "//login",
            "/login/",
            "/./login",
            "/x/../login",
            "/Login",
        ] {
            if let Ok(path) = parse(raw) {
                assert_eq!(path.canonical, "/login", "{raw:?}");
            }
        }
    }

    #[test]
    fn the_fast_path_agrees_with_the_slow_path() {
        // Every path of up to five characters after the leading `/` over an alphabet that
        // spells separators, dot segments, escapes (`%2e`, `%2f`, `%2B`), parameters and case.
        const ALPHABET: &[u8] = b"/aB.%2ef;";
        let mut fast = 0;
        for len in 0..=5u32 {
            for mut n in 0..ALPHABET.len().pow(len) {
                let mut raw = String::from("/");
                for _ in 0..len {
                    raw.push(char::from(ALPHABET[n % ALPHABET.len()]));
                    n /= ALPHABET.len();
                }
                if is_canonical(&raw) {
                    fast += 1;
                    let path = read(&raw).expect("a fast path parses");
                    assert_eq!((path.canonical.as_ref(), path.rewritten), (raw.as_str(), None));
                }
                assert_consistent(&raw);
            }
        }
        assert!(fast > 1000, "only {fast} paths took the fast path");
    }

    /// Segments put before a segment of the target, none of which changes the path it reads as.
    const NOISE: &[&str] = &["./", "x/../", "/", ";p=1/"];
    /// Octets that must get any path refused.
    const HOSTILE: &[&str] = &["%00", "%5c", "%5C", "%2525", "%3f", "%3F", "%23"];

    prop_compose! {
        /// A random spelling of the path with these segments: noise segments, `;` parameters, an
        /// extension and a trailing slash, then case flips, escapes and maybe a hostile octet
        /// (and whether it has one).
        fn spelling(segments: &'static [&'static str])(
            noise in vec(vec(select(NOISE), 0..3), segments.len()),
            params in vec(any::<bool>(), segments.len()),
            extension in any::<bool>(),
            trailing_slash in any::<bool>(),
            // Per character: flip its case; escape it (0: upper-case hex, 1: lower-case hex).
            chars in vec((any::<bool>(), 0..8u8), 64),
            hostile in option::weighted(0.1, (any::<Index>(), select(HOSTILE))),
        ) -> (String, bool) {
            let mut plain = String::new();
            for (i, ((segment, noise), param)) in segments.iter().zip(noise).zip(params).enumerate() {
                plain.push('/');
                plain.extend(noise);
                plain.push_str(segment);
                if extension && i + 1 == segments.len() {
                    plain.push_str(".json");
                }
                if param {
                    plain.push_str(";jsessionid=Ab1");
                }
            }
            if trailing_slash {
                plain.push('/');
            }
            // The leading `/` stays as it is: without it every spelling is refused.
            let mut spelled = String::from("/");
            for (c, &(flip, escape)) in plain.chars().skip(1).zip(chars.iter().cycle()) {
                let c = match (flip, c.is_ascii_uppercase()) {
                    (false, _) => c,
                    (true, true) => c.to_ascii_lowercase(),
                    (true, false) => c.to_ascii_uppercase(),
                };
                match escape {
                    0 => spelled.push_str(&format!("%{:02X}", u32::from(c))),
                    1 => spelled.push_str(&format!("%{:02x}", u32::from(c))),
                    _ => spelled.push(c),
                }
            }
            if let Some((at, octet)) = hostile {
                spelled.insert_str(at.index(spelled.len() + 1), octet);
            }
            (spelled, hostile.is_some())
        }
    }

    /// `spelling` is refused, or counted under `pattern` and forwarded as what was counted; with
    /// a hostile octet it is refused.
    fn refused_or_matched((spelling, hostile): (String, bool), pattern: &str) -> Result<(), TestCaseError> {
        let pattern = PathPattern::parse(pattern).expect("a valid pattern");
        if let Ok(path) = parse(&spelling) {
            prop_assert!(!hostile, "{spelling:?} was accepted");
            prop_assert!(
                pattern.matches(&path.canonical),
                "{spelling:?} read as {}",
                path.canonical
            );
            assert_consistent(&spelling);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn every_spelling_of_a_rule_path_is_refused_or_matched(
            login in spelling(&["login"]),
            token in spelling(&["auth", "token"]),
        ) {
            refused_or_matched(login, "/login")?;
            refused_or_matched(token, "/auth/*")?;
        }
    }
}
