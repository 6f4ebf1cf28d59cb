//! Rule path patterns (the entries of `AUTH_PATHS`, `ROUTES`, `COSTS` and `SKIP_PATHS`),
//! matched against the canonical paths that [`crate::gate::path`] reads.
//!
//! A pattern is written the way a canonical path reads: lower case, no escapes, no `;`
//! parameters, no dot segments. `/login` is that path, `/auth/*` is `/auth` and everything below
//! it, `/auth*` is every path that starts with `/auth`. Matching ignores an extension on the
//! path's last segment, because frameworks route `/login.json` to the `/login` action (Rails
//! formats, Spring's suffix matching): a rule for `/login` that `/login.json` escapes would be
//! walked around.
//!
//! A segment that names a script covers what follows it: PHP (CGI, FastCGI), Perl and other
//! CGI scripts, ASP.NET pages and handlers, ISAPI extensions run `/wp-login.php/x` as
//! `/wp-login.php` with `PATH_INFO=/x`. So a path is matched as itself and as each of its
//! prefixes that ends with such a segment ([`SCRIPT_EXTENSIONS`]): a pattern matches if it
//! matches any of those readings ([`PathPattern::matches`]). `SKIP_PATHS` exempts only what it
//! matches as the path itself ([`PathPattern::matches_itself`]): `/index.php/admin/login` is a
//! front controller's login, not its `/index.php`.

use std::fmt;

/// Extensions of the scripts servers run with the rest of the path as `PATH_INFO` (or its
/// equivalent): PHP (`cgi.fix_pathinfo`, nginx's `fastcgi_split_path_info`, Apache), CGI and
/// FastCGI scripts (`AcceptPathInfo`), Perl and Python CGI, classic ASP, ASP.NET pages,
/// services and handlers (`Request.PathInfo`), JSP, IIS's ISAPI DLLs and CGI executables. A
/// segment names a script when any of its extensions (after a dot that does not start it) is
/// one of these: Apache's `AddHandler` runs `x.php.txt` as PHP.
pub const SCRIPT_EXTENSIONS: &[&str] = &[
    "php", "php3", "php4", "php5", "php7", "php8", "phtml", "phar", "cgi", "fcgi", "pl", "py", "asp", "aspx",
    "asmx", "ashx", "axd", "svc", "jsp", "jspx", "dll", "exe",
];

/// Does this segment of a canonical path (lower case) name a script ([`SCRIPT_EXTENSIONS`])?
pub fn names_script(segment: &str) -> bool {
    // The first dot that does not start the name (`.php` is a dot-file, not a script); a `.`
    // is one byte, so where it is, a character ends.
    let Some(dot) = segment.bytes().skip(1).position(|byte| byte == b'.') else {
        return false;
    };
    segment[dot + 2..]
        .split('.')
        .any(|extension| SCRIPT_EXTENSIONS.contains(&extension))
}

/// The resource a canonical path names to the loosest reader, as the `path` key source keys
/// it: cut after its first segment that names a script (what follows is `PATH_INFO`), and its
/// last segment cut at its first dot that does not start it (an extension: a format to Rails,
/// a suffix to Spring). So `/api/search.json`, `/api/search.a1` and `/api/search` are one
/// resource, and so are `/wp-login.php/x` and `/wp-login.php`. A prefix of the path: nothing
/// is allocated.
pub fn resource(canonical: &str) -> &str {
    let mut end = 0;
    let mut last = 0; // where the last segment kept starts, after its `/`
    for segment in canonical.split('/').skip(1) {
        last = end + 1;
        end = last + segment.len();
        if names_script(segment) {
            break;
        }
    }
    // A `.` is one byte, so where it is, a character ends.
    let dot = canonical.as_bytes()[last..end]
        .iter()
        .skip(1)
        .position(|&byte| byte == b'.');
    match dot {
        Some(dot) => &canonical[..last + 1 + dot],
        None => &canonical[..end.max(1)],
    }
}

/// One entry of a rule's path list, in the normal form [`PathPattern::parse`] gives it; the
/// set algebra ([`PathPattern::covers`], [`PathPattern::overlaps`]) relies on that form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    /// `/login`: that path, with or without an extension (`/login.json`).
    Exact(String),
    /// `/auth/*`: `/auth` (with or without an extension) and every path below it; `/*` is every
    /// path.
    Subtree(String),
    /// `/auth*`: every path that starts with `/auth` (`/authorize` too).
    Prefix(String),
}

impl PathPattern {
    /// Parse one entry of `AUTH_PATHS`/`ROUTES`/`COSTS`/`SKIP_PATHS`: it starts with `/`, and a
    /// trailing `*` makes a prefix (`/auth/*`: `/auth` and everything below it; `/auth*`: every
    /// path starting with `/auth`; `/*`: every path). Letters are lowercased, `//` collapsed and
    /// a trailing `/` dropped, so `/Login/` is `/login`. The error says what is wrong in a few
    /// words.
    pub fn parse(entry: &str) -> Result<Self, String> {
        if !entry.starts_with('/') {
            return Err("a path must start with '/'".into());
        }
        // None of these can appear in a canonical path (so a pattern holding one would never
        // match), or they would break the list syntax or Redis hash tags.
        let refused = |c: char| !c.is_ascii() || c.is_ascii_whitespace() || c.is_ascii_control();
        if let Some(c) = entry.chars().find(|&c| refused(c) || "%;\\?#{}=,".contains(c)) {
            return Err(format!("{c:?} is not allowed in a path"));
        }
        let (body, wildcard) = entry
            .strip_suffix('*')
            .map_or((entry, false), |body| (body, true));
        if body.contains('*') {
            return Err("'*' is only allowed at the end of a path".into());
        }
        let segments: Vec<&str> = body.split('/').filter(|segment| !segment.is_empty()).collect();
        // A prefix's last segment is the start of a name, not a dot segment: `/.*` is every
        // dot-file.
        let prefix = wildcard && !body.ends_with('/');
        let whole = segments.len() - usize::from(prefix);
        if segments
            .iter()
            .take(whole)
            .any(|segment| matches!(*segment, "." | ".."))
        {
            return Err("'.' and '..' segments are not allowed".into());
        }
        let base = format!("/{}", segments.join("/")).to_ascii_lowercase();
        Ok(match (wildcard, prefix) {
            (false, _) => PathPattern::Exact(base),
            (true, false) => PathPattern::Subtree(base),
            (true, true) => PathPattern::Prefix(base),
        })
    }

    /// Does this canonical path (as produced by `gate::path::parse`) match, as itself or as one
    /// of its prefixes that ends with a segment naming a script (see the module docs)?
    pub fn matches(&self, canonical: &str) -> bool {
        self.matches_itself(canonical) || self.matches_script(canonical)
    }

    /// Does this canonical path match as itself, not as a script it names (`SKIP_PATHS`)?
    pub fn matches_itself(&self, canonical: &str) -> bool {
        match self {
            PathPattern::Exact(path) => canonical
                .strip_prefix(path.as_str())
                .is_some_and(|rest| rest.is_empty() || (path != "/" && is_extension(rest))),
            PathPattern::Subtree(base) => {
                base == "/"
                    || canonical
                        .strip_prefix(base.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || is_extension(rest))
            }
            PathPattern::Prefix(base) => canonical.starts_with(base.as_str()),
        }
    }

    /// Does a prefix of this canonical path that ends with a segment naming a script match?
    /// Only the prefix ending with the segment in which the pattern's base ends can: a
    /// matched path starts with the base, and a prefix reaching past that segment is a path
    /// below it, which the path itself shows already. A prefix pattern gains nothing: what
    /// starts with its base, the path does too.
    fn matches_script(&self, canonical: &str) -> bool {
        let base = match self {
            PathPattern::Exact(base) | PathPattern::Subtree(base) => base,
            PathPattern::Prefix(_) => return false,
        };
        let Some(rest) = canonical.strip_prefix(base.as_str()) else {
            return false;
        };
        // Without a `/` after the base, the only prefix is the path itself.
        let Some(slash) = rest.find('/') else {
            return false;
        };
        let reading = &canonical[..base.len() + slash];
        let segment = reading.rsplit('/').next().unwrap_or(reading);
        names_script(segment) && self.matches_itself(reading)
    }

    /// True when every path `other` matches is matched by `self` too (used to know which rules
    /// a `COSTS` entry can reach).
    pub fn covers(&self, other: &PathPattern) -> bool {
        use PathPattern::{Exact, Prefix, Subtree};
        match (self, other) {
            // A pattern matching a path also matches it with any extension, and those are all
            // the paths an exact pattern matches.
            (_, Exact(path)) => self.matches(path),
            // Every other pattern matches paths of any depth; an exact pattern only those
            // below a script it names (`/a.php` covers `/a.php/*`), which this leaves out:
            // a `false` here only makes the `COSTS` check and the shadowing warnings
            // consider more routes.
            (Exact(_), _) => false,
            (Subtree(base), _) if base == "/" => true,
            // Not `/auth.v1/*` under `/auth/*`: `/auth.v1/x` is not below `/auth`.
            (Subtree(base), Subtree(other_base)) => other_base == base || is_below(other_base, base),
            // Not `/auth*` under `/auth/*`: `/authx` is not below `/auth`.
            (Subtree(base), Prefix(other_base)) => is_below(other_base, base),
            (Prefix(base), Subtree(other_base) | Prefix(other_base)) => other_base.starts_with(base.as_str()),
        }
    }

    /// True when some path is matched by both.
    pub fn overlaps(&self, other: &PathPattern) -> bool {
        // Every path a pattern matches starts with its base, and so does every prefix of it at
        // least as long as the base. So a path both match starts with the longer base, which
        // the other pattern then matches; and that base (plus a letter, for a prefix ending in
        // `.`) is a path both match.
        self.matches(other.base()) || other.matches(self.base())
    }

    /// The path every matched path starts with.
    fn base(&self) -> &str {
        match self {
            PathPattern::Exact(base) | PathPattern::Subtree(base) | PathPattern::Prefix(base) => base,
        }
    }
}

/// Is `rest`, what follows a pattern's last segment in a path, an extension on that segment?
fn is_extension(rest: &str) -> bool {
    rest.starts_with('.') && !rest.contains('/')
}

/// Is `path` strictly below the directory `base` (which is not `/`)?
fn is_below(path: &str, base: &str) -> bool {
    path.strip_prefix(base).is_some_and(|rest| rest.starts_with('/'))
}

impl fmt::Display for PathPattern {
    /// The pattern as it would be written in the configuration.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathPattern::Exact(path) => f.write_str(path),
            PathPattern::Subtree(base) if base == "/" => f.write_str("/*"),
            PathPattern::Subtree(base) => write!(f, "{base}/*"),
            PathPattern::Prefix(base) => write!(f, "{base}*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(entry: &str) -> PathPattern {
        PathPattern::parse(entry).unwrap_or_else(|error| panic!("{entry:?}: {error}"))
    }

    #[test]
    fn matching() {
        for (entry, matched, unmatched) in [
            (
                "/login",
                &["/login", "/login.json", "/login.", "/login.tar.gz"][..],
                &["/logins", "/login/x", "/api/login", "/log", "/", "/login.x/y"][..],
            ),
            (
                "/auth/*",
                &["/auth", "/auth.json", "/auth/x/y", "/auth/x.y"],
                &["/authx", "/", "/auth.v1/x"],
            ),
            (
                "/auth*",
                &["/auth", "/authx", "/auth/x/y", "/auth.json"],
                &["/aut", "/", "/x/auth"],
            ),
            (
                "/v1.0/x",
                &["/v1.0/x", "/v1.0/x.json"],
                &["/v1/x", "/v1.0/xy", "/v1.0"],
            ),
            (
                "/file.txt",
                &["/file.txt", "/file.txt.gz"],
                &["/file", "/file.txtx", "/file.tx"],
            ),
            ("/", &["/"], &["/x", "/.json"]),
            ("/*", &["/", "/x", "/x/y.z"], &[]),
            ("/.*", &["/.well-known", "/.git/config"], &["/x", "/"]),
        ] {
            let pattern = pattern(entry);
            for path in matched {
                assert!(pattern.matches(path), "{entry} should match {path}");
            }
            for path in unmatched {
                assert!(!pattern.matches(path), "{entry} should not match {path}");
            }
        }
    }

    #[test]
    fn a_segment_naming_a_script_covers_what_follows_it() {
        for (entry, matched, unmatched) in [
            (
                "/wp-login.php",
                &[
                    "/wp-login.php/x",
                    "/wp-login.php/x/y.json",
                    "/wp-login.php/",
                    "/wp-login.php.php/x",
                ][..],
                &[
                    "/wp-login.phpx/y",
                    "/wp-login.html/x",
                    "/x/wp-login.php/y",
                    "/wp-login.phps/x",
                ][..],
            ),
            (
                "/wp-login",
                &["/wp-login.php/x", "/wp-login.php.txt/x"],
                &["/wp-login.json/x", "/wp-loginx.php/x"],
            ),
            (
                "/admin/*",
                &["/admin.cgi/x", "/admin/x.php/y", "/admin.pl/x"],
                &["/administrator.php/x", "/x/admin.php/y"],
            ),
            (
                "/api/login",
                &[
                    "/api/login.aspx/x",
                    "/api/login.jsp/x",
                    "/api/login.asmx/m",
                    "/api/login.dll/x",
                ],
                &["/api.php/login", "/api/login.htm/x"],
            ),
            // A path below a script is matched as itself too: a front controller's routes.
            ("/index.php/api/*", &["/index.php/api/x"], &["/index.php/x"]),
            ("/", &["/"], &["/x.php/y", "/.php/x"]),
            // A dot-file is not a script.
            ("/.php", &["/.php"], &["/.php/x"]),
        ] {
            let pattern = pattern(entry);
            for path in matched {
                assert!(pattern.matches(path), "{entry} should match {path}");
            }
            for path in unmatched {
                assert!(!pattern.matches(path), "{entry} should not match {path}");
            }
        }
        // `SKIP_PATHS`: the path itself only.
        assert!(!pattern("/wp-login.php").matches_itself("/wp-login.php/x"));
        assert!(!pattern("/index.php").matches_itself("/index.php/admin/login"));
        assert!(pattern("/index.php/*").matches_itself("/index.php/admin/login"));
    }

    #[test]
    fn resources_drop_path_info_and_the_extension() {
        for (path, expected) in [
            ("/", "/"),
            ("*", "*"),
            ("/api/search", "/api/search"),
            ("/api/search.json", "/api/search"),
            ("/api/search.a1", "/api/search"),
            ("/api/search.tar.gz", "/api/search"),
            ("/api/search.", "/api/search"),
            ("/v1.0/search", "/v1.0/search"),
            ("/wp-login.php", "/wp-login"),
            ("/wp-login.php/x", "/wp-login"),
            ("/wp-login.php/x.json/y", "/wp-login"),
            ("/a/b.cgi/c.php/d", "/a/b"),
            ("/.well-known", "/.well-known"),
            ("/.well-known/x.json", "/.well-known/x"),
            ("/.env.php/x", "/.env"),
            ("/.php/x", "/.php/x"),
            ("/café.json", "/café"),
            ("/é.json", "/é"),
        ] {
            assert_eq!(resource(path), expected, "{path:?}");
        }
    }

    #[test]
    fn covers_and_overlaps_for_every_pair_of_kinds() {
        for (a, b, covers, overlaps) in [
            ("/a", "/a", true, true),
            ("/a", "/a.json", true, true),
            ("/a.json", "/a", false, true),
            ("/a", "/b", false, false),
            ("/", "/a", false, false),
            ("/a", "/a/*", false, true),
            ("/a/*", "/a", true, true),
            ("/a/*", "/a.json", true, true),
            ("/a/*", "/a/b", true, true),
            ("/a/*", "/ab", false, false),
            ("/a", "/a*", false, true),
            ("/a*", "/a", true, true),
            ("/ab*", "/a", false, false),
            ("/a.*", "/a", false, true),
            ("/a/*", "/a/*", true, true),
            ("/a/*", "/a/b/*", true, true),
            ("/a/b/*", "/a/*", false, true),
            ("/a/*", "/a.v1/*", false, true),
            ("/a/*", "/ab/*", false, false),
            ("/*", "/a/*", true, true),
            ("/a/*", "/*", false, true),
            ("/a/*", "/a*", false, true),
            ("/a/*", "/a/b*", true, true),
            ("/a/*", "/a.*", false, true),
            ("/a*", "/a/*", true, true),
            ("/a*", "/*", false, true),
            ("/ab*", "/a/*", false, false),
            ("/a*", "/ab*", true, true),
            ("/ab*", "/a*", false, true),
            ("/a*", "/b*", false, false),
            ("/", "/*", false, true),
            ("/*", "/", true, true),
        ] {
            let (a, b) = (pattern(a), pattern(b));
            assert_eq!(a.covers(&b), covers, "{a} covers {b}");
            assert_eq!(a.overlaps(&b), overlaps, "{a} overlaps {b}");
            assert_eq!(b.overlaps(&a), overlaps, "{b} overlaps {a}");
        }
    }

    /// `covers` and `overlaps` agree with `matches` over every canonical path of up to three
    /// segments of up to three characters from `a`, `b`, `.`, for every pattern short enough
    /// that those paths reach past it.
    #[test]
    fn covers_and_overlaps_agree_with_matches() {
        let names = |alphabet: &[char], max: usize| {
            let mut names = vec![String::new()];
            for _ in 0..max {
                let longer: Vec<String> = names
                    .iter()
                    .flat_map(|n| alphabet.iter().map(move |c| format!("{n}{c}")))
                    .collect();
                names.extend(longer);
            }
            names.sort();
            names.dedup();
            names.retain(|n| !matches!(n.as_str(), "" | "." | ".."));
            names
        };
        let paths_of = |names: &[String], depth: usize| {
            let mut paths = vec![String::new()];
            let mut all = vec!["/".to_string()];
            for _ in 0..depth {
                paths = paths
                    .iter()
                    .flat_map(|p| names.iter().map(move |n| format!("{p}/{n}")))
                    .collect();
                all.extend(paths.iter().cloned());
            }
            all
        };
        let paths = paths_of(&names(&['a', 'b', '.'], 3), 3);
        let mut entries = Vec::new();
        for base in paths_of(&names(&['a', '.'], 2), 2) {
            entries.extend([
                base.clone(),
                format!("{base}*"),
                format!("{}/*", base.trim_end_matches('/')),
            ]);
        }
        // Prefixes ending in what would be a dot segment if it were whole.
        entries.extend(["/.*", "/..*", "/a/.*", "/a/..*"].map(String::from));
        let patterns: Vec<PathPattern> = entries
            .iter()
            .filter_map(|e| PathPattern::parse(e).ok())
            .collect();
        // Which paths each pattern matches, as a bit set.
        let matched: Vec<Vec<u64>> = patterns
            .iter()
            .map(|p| {
                let bit = |(i, path): (usize, &String)| u64::from(p.matches(path)) << i;
                paths
                    .chunks(64)
                    .map(|chunk| chunk.iter().enumerate().map(bit).sum())
                    .collect()
            })
            .collect();
        for (a, a_matched) in patterns.iter().zip(&matched) {
            for (b, b_matched) in patterns.iter().zip(&matched) {
                let mut pairs = a_matched.iter().zip(b_matched);
                assert_eq!(
                    a.covers(b),
                    pairs.clone().all(|(a, b)| b & !a == 0),
                    "{a} covers {b}"
                );
                assert_eq!(a.overlaps(b), pairs.any(|(a, b)| a & b != 0), "{a} overlaps {b}");
            }
        }
    }

    /// With segments naming scripts, `overlaps` still agrees with `matches`, and `covers`
    /// never claims what `matches` denies.
    #[test]
    fn covers_and_overlaps_hold_with_scripts() {
        let names = ["a", "b", "a.php", "a.php.php", "b.cgi", "a.json"];
        let mut paths = vec!["/".to_string()];
        let mut last = vec![String::new()];
        for _ in 0..3 {
            last = last
                .iter()
                .flat_map(|p| names.iter().map(move |n| format!("{p}/{n}")))
                .collect();
            paths.extend(last.iter().cloned());
        }
        let mut entries = vec!["/".to_string(), "/*".to_string()];
        for base in ["/a", "/a.php", "/a/a.php", "/a.php/a", "/b.cgi", "/a.php.php"] {
            entries.extend([base.to_string(), format!("{base}*"), format!("{base}/*")]);
        }
        let patterns: Vec<PathPattern> = entries.iter().map(|e| pattern(e)).collect();
        for a in &patterns {
            for b in &patterns {
                let both = paths.iter().any(|p| a.matches(p) && b.matches(p));
                assert_eq!(a.overlaps(b), both, "{a} overlaps {b}");
                if a.covers(b) {
                    let missed = paths.iter().find(|p| b.matches(p) && !a.matches(p));
                    assert_eq!(missed, None, "{a} covers {b}");
                }
            }
        }
    }

    #[test]
    fn parsing_normalises() {
        for (entry, parsed) in [
            ("/Login/", PathPattern::Exact("/login".into())),
            ("/login//", PathPattern::Exact("/login".into())),
            ("/", PathPattern::Exact("/".into())),
            ("//", PathPattern::Exact("/".into())),
            ("//API//V1", PathPattern::Exact("/api/v1".into())),
            ("/auth/*", PathPattern::Subtree("/auth".into())),
            ("//Auth//*", PathPattern::Subtree("/auth".into())),
            ("/*", PathPattern::Subtree("/".into())),
            ("//*", PathPattern::Subtree("/".into())),
            ("/O*", PathPattern::Prefix("/o".into())),
            ("/a/.*", PathPattern::Prefix("/a/.".into())),
            ("/.well-known/*", PathPattern::Subtree("/.well-known".into())),
            ("/v1.0/x", PathPattern::Exact("/v1.0/x".into())),
        ] {
            assert_eq!(pattern(entry), parsed, "{entry:?}");
        }
    }

    #[test]
    fn bad_patterns_say_why() {
        for entry in [
            "", "login", "*", "/a*b", "/**", "/*/a", "/a b", "/a\tb", "/a\n", "/a\x7f", "/a%20", "/a;b",
            "/a\\b", "/a?b", "/a#b", "/{a}", "/a}", "/a=1", "/a,/b", "/./a", "/a/..", "/a/../*", "/a/./*",
            "/é",
        ] {
            let error = PathPattern::parse(entry).expect_err(entry);
            assert!(!error.is_empty(), "{entry:?}");
        }
        assert_eq!(
            PathPattern::parse("/a;b"),
            Err("';' is not allowed in a path".into())
        );
        assert_eq!(
            PathPattern::parse("/a*b"),
            Err("'*' is only allowed at the end of a path".into())
        );
    }

    #[test]
    fn display_is_what_parses_back() {
        for entry in ["/login", "/auth/*", "/o*", "/*", "/", "/a/.*", "/v1.0/x"] {
            let pattern = pattern(entry);
            assert_eq!(pattern.to_string(), entry);
            assert_eq!(PathPattern::parse(&pattern.to_string()), Ok(pattern));
        }
        assert_eq!(pattern("/Login/").to_string(), "/login");
        assert_eq!(pattern("//auth//*").to_string(), "/auth/*");
    }
}
