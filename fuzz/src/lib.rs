//! Fuzz targets for the parsers that read text tollgate does not control: the configuration
//! (every variable, and the `ROUTES`/`COSTS` grammar), request paths, `X-Forwarded-For`, the
//! `Forwarded`/`X-Forwarded-*`/`X-Real-IP` writer, rule path patterns, key specs and the
//! PROXY protocol header.
//!
//! Each target is a plain function that panics when an invariant breaks, so two drivers share
//! it: `tests/fuzz.rs` (proptest on stable, part of `cargo test`; it includes this file as a
//! module) and `fuzz/fuzz_targets/*.rs` (cargo-fuzz, nightly). The `*_bytes` functions turn a
//! raw fuzzer input into a target's arguments, in a line format a libFuzzer dictionary
//! (`fuzz/dict/`) can steer; proptest feeds them arbitrary bytes too.

#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};

use http::Method;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use tollgate::config::VARIABLES;
use tollgate::rules::pattern::PathPattern;
use tollgate::rules::{KeyBy, RequestHead};
use tollgate::testing::headers::{self as forwarding, Hop, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REAL_IP};
use tollgate::testing::identity::{ClientIdentity, X_FORWARDED_FOR};
use tollgate::testing::path;
use tollgate::{Config, ConfigError};

// ---------------------------------------------------------------------------------------------
// Configuration

/// What the drivers put inside secret values. Seen in any error, `Display`, `Debug` or warning
/// of the configuration, and not written anywhere public, it is a leaked secret.
pub const SECRET_MARK: &str = "Hunter2";

/// The `BACKEND_URL` the byte decoder starts from, so random input gets past the first check.
pub const BACKEND_URL: &str = "http://127.0.0.1:8000";

/// `Config::from_vars` never panics; an error names a variable and never shows a secret
/// (`REDIS_URL`'s password, `REDIS_PASSWORD`, `KEY_HASH_SECRET`, `EXEMPT`'s key values); a
/// configuration it accepts shows no secret either and holds a rule table that keeps its
/// promises (one rule per `ROUTES` entry, and no request priced above its rule's capacity).
pub fn config(vars: &[(String, String)]) {
    let result = Config::from_vars(vars.iter().cloned());
    match result {
        Err(error) => {
            let message = error.to_string();
            assert!(
                VARIABLES.iter().any(|var| message.contains(var)),
                "the error names no variable: {message:?}\nvars: {vars:?}"
            );
            let shown = format!("{message}\n{error:?}");
            if secret_marked(vars, false) && shown.contains(SECRET_MARK) {
                panic!("a secret is echoed: {message:?}\nvars: {vars:?}");
            }
            if let ConfigError::Missing { var, .. }
            | ConfigError::Invalid { var, .. }
            | ConfigError::Entry { var, .. }
            | ConfigError::InvalidSecret { var, .. } = &error
            {
                assert!(VARIABLES.contains(var), "{var} is not in VARIABLES");
            }
        }
        Ok(config) => {
            let shown = format!("{config}\n{config:?}\n{}", config.warnings().join("\n"));
            if secret_marked(vars, true) {
                assert!(
                    !shown.contains(SECRET_MARK),
                    "a secret is shown: {shown}\nvars: {vars:?}"
                );
            }
            rule_table(&config, vars);
        }
    }
}

/// `NAME=value` lines (lossy UTF-8) after `BACKEND_URL=http://127.0.0.1:8000`, which a line
/// may override; a line without `=` is a name with an empty value.
pub fn config_bytes(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut vars = vec![("BACKEND_URL".to_owned(), BACKEND_URL.to_owned())];
    for line in text.split('\n') {
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        vars.push((name.to_owned(), value.to_owned()));
    }
    config(&vars);
}

/// The value `from_vars` sees for `name`: the last one given that is not empty once trimmed
/// (an empty value is dropped before a later pair can win).
fn effective<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .rev()
        .filter(|(n, _)| n == name)
        .map(|(_, value)| value.trim())
        .find(|value| !value.is_empty())
}

/// True when some secret value holds [`SECRET_MARK`] and nothing public does, so the marker in
/// any output can only have come from a secret. `parsed`: the configuration was accepted, so
/// `REDIS_URL` is a URL and its password is what a URL parser reads as one.
fn secret_marked(vars: &[(String, String)], parsed: bool) -> bool {
    let mut secret = false;
    for (name, value) in vars {
        if name.contains(SECRET_MARK) {
            return false; // names are shown in warnings
        }
        let (private, public) = split_secret(name, value, parsed);
        if public.iter().any(|part| part.contains(SECRET_MARK)) {
            return false;
        }
        secret |= private.iter().any(|part| part.contains(SECRET_MARK));
    }
    secret
}

/// The secret and the public parts of one variable's value.
fn split_secret<'a>(name: &str, value: &'a str, parsed: bool) -> (Vec<&'a str>, Vec<&'a str>) {
    match name {
        "REDIS_PASSWORD" | "KEY_HASH_SECRET" => (vec![value], vec![]),
        // Unparsed (a URL the error hints at), whatever precedes the last `@` after `://` may be
        // credentials: a password holding `/`, `?` or `#` spoils the URL, but is a password
        // still. Parsed, the credentials end at the first `@` in the authority (which ends at
        // the first `/`, `?` or `#`). Either way the user part is shown, the password (after
        // the first `:`) never. Without `://` the whole value may be a mistyped URL with a
        // password in it.
        "REDIS_URL" => match value.split_once("://") {
            None => (vec![value], vec![]),
            Some((scheme, rest)) => {
                let authority = match parsed {
                    true => &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())],
                    false => rest,
                };
                match authority.rfind('@') {
                    None => (vec![], vec![value]),
                    Some(at) => match authority[..at].split_once(':') {
                        None => (vec![], vec![value]),
                        Some((user, password)) => (vec![password], vec![scheme, user, &rest[at + 1..]]),
                    },
                }
            }
        },
        // The value of a `SOURCE=VALUE` or `key:VALUE` entry is an API key (the parser itself
        // writes them as `query:tenant=***`, `key:***`); the source is public.
        "EXEMPT" => {
            let (mut private, mut public) = (vec![], vec![]);
            for entry in value.split(',').map(str::trim) {
                match (entry.strip_prefix("key:"), entry.split_once('=')) {
                    (Some(key), _) => private.push(key),
                    (None, Some((source, key))) => {
                        public.push(source);
                        private.push(key);
                    }
                    (None, None) => public.push(entry),
                }
            }
            (private, public)
        }
        _ => (vec![], vec![value]),
    }
}

/// The rule table of an accepted configuration keeps its promises.
fn rule_table(config: &Config, vars: &[(String, String)]) {
    let rules = config.rule_table().rules();
    let routes = effective(vars, "ROUTES").map_or(0, |value| {
        value.split(';').filter(|entry| !entry.trim().is_empty()).count()
    });
    assert_eq!(
        rules.len(),
        routes + 2,
        "one rule per ROUTES entry, then auth and general"
    );
    assert_eq!(&*rules[rules.len() - 1].name, "general");
    assert_eq!(&*rules[rules.len() - 2].name, "auth");
    for (i, rule) in rules.iter().enumerate() {
        assert_eq!(usize::from(rule.id), i, "rule ids are indexes");
        assert!(
            rules[..i].iter().all(|other| other.name != rule.name),
            "two rules named {:?}",
            rule.name
        );
        assert!(rule.cost >= 1 && rule.cost <= rule.limits.capacity(), "{rule:?}");
    }
    // Every request is priced within the capacity of the rule it falls under: what the table
    // checks for COSTS at startup through PathPattern::covers and overlaps.
    let methods = [Method::GET, Method::POST, Method::HEAD, Method::DELETE];
    let headers = HeaderMap::new();
    for path in probe_paths(vars) {
        for method in &methods {
            let head = RequestHead {
                method,
                path: &path,
                query: None,
                authority: None,
                headers: &headers,
                client_ip: IpAddr::from([192, 0, 2, 1]),
                trusted: false,
            };
            let matched = config
                .rule_table()
                .classify(&head)
                .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
            assert!(
                matched.cost >= 1 && matched.cost <= matched.rule.limits.capacity(),
                "{method} {path} costs {} under rule {:?} of capacity {}\nvars: {vars:?}",
                matched.cost,
                matched.rule.name,
                matched.rule.limits.capacity()
            );
        }
    }
}

/// Canonical paths at and around every path written in the rule variables.
fn probe_paths(vars: &[(String, String)]) -> Vec<String> {
    let mut paths = vec!["/".to_owned(), "/x".to_owned()];
    for name in ["ROUTES", "COSTS", "AUTH_PATHS", "SKIP_PATHS"] {
        let Some(value) = effective(vars, name) else {
            continue;
        };
        for written in value.split([';', ',', '=', '*']) {
            let Some(start) = written.find('/') else {
                continue;
            };
            let Ok(read) = path::parse(&written[start..]) else {
                continue;
            };
            let base = read.canonical.trim_end_matches('/');
            for suffix in ["", ".json", "/x", "x", "/x.y", "."] {
                if let Ok(read) = path::parse(&format!("{base}{suffix}")) {
                    paths.push(read.canonical.into_owned());
                }
            }
        }
    }
    paths.sort();
    paths.dedup();
    paths
}

// ---------------------------------------------------------------------------------------------
// Request paths

/// `path::parse` never panics, and a path it accepts reads as a canonical form with the promised
/// shape (starts with `/`, no `//`, no trailing `/`, no dot segment, no `;`, no upper-case ASCII,
/// no byte it refuses) that reads as itself, and what is forwarded (the rewritten path, or the
/// raw one) reads as what was counted.
pub fn path(raw: &str) {
    let Ok(read) = path::parse(raw) else { return };
    let canonical: &str = &read.canonical;
    let context = || format!("{raw:?} -> {canonical:?} (rewritten {:?})", read.rewritten);
    assert!(canonical.starts_with('/'), "{}", context());
    assert!(!canonical.contains("//"), "{}", context());
    assert!(canonical == "/" || !canonical.ends_with('/'), "{}", context());
    assert!(
        !canonical.split('/').any(|segment| matches!(segment, "." | "..")),
        "{}",
        context()
    );
    assert!(!canonical.contains(';'), "{}", context());
    assert!(
        !canonical.bytes().any(|b| b.is_ascii_uppercase()),
        "{}",
        context()
    );
    assert!(
        !canonical
            .bytes()
            .any(|b| b == b'\\' || b == b' ' || b.is_ascii_control()),
        "{}",
        context()
    );
    if canonical.contains('%') {
        // Only a literal `%` decoded from `%25`: not itself a valid raw path.
        assert!(path::parse(canonical).is_err(), "{}", context());
    } else {
        let again = path::parse(canonical).unwrap_or_else(|error| panic!("{}: {error}", context()));
        assert_eq!(
            (&*again.canonical, again.rewritten),
            (canonical, None),
            "{}",
            context()
        );
    }
    if let Some(rewritten) = &read.rewritten {
        assert!(rewritten.starts_with('/'), "{}", context());
        let again = path::parse(rewritten).unwrap_or_else(|error| panic!("{}: {error}", context()));
        assert_eq!(
            (&*again.canonical, again.rewritten),
            (canonical, None),
            "{}",
            context()
        );
    }
    // A canonical path written as a rule pattern is that path, and matches it.
    let plain = |c: char| c.is_ascii_graphic() && !"%;\\?#{}=,*".contains(c);
    if canonical.chars().all(plain) {
        let pattern = PathPattern::parse(canonical).unwrap_or_else(|error| panic!("{}: {error}", context()));
        assert_eq!(pattern, PathPattern::Exact(canonical.to_owned()), "{}", context());
        assert!(pattern.matches(canonical), "{}", context());
    }
}

/// The input as a path (lossy UTF-8), and as a request target through `http::Uri` when it is
/// one, as the proxy reads it.
pub fn path_bytes(data: &[u8]) {
    path(&String::from_utf8_lossy(data));
    if let Ok(uri) = http::Uri::try_from(data) {
        path(uri.path());
    }
}

// ---------------------------------------------------------------------------------------------
// Client identity: X-Forwarded-For

/// `ClientIdentity::client` never panics; an untrusted peer is always its own client; for a
/// trusted one the client is the peer or an address written in the header, found by walking
/// the elements right to left (read from the bytes, one by one, empty ones passed over) to the
/// first that is not a trusted proxy, so elements a client wrote left of it never count; an
/// element reached that is not an address refuses the request, never making the peer (or any
/// trusted hop) the client.
pub fn forwarded_for(peer: IpAddr, trusted: &[IpNet], lines: &[Vec<u8>]) {
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(&X_FORWARDED_FOR, value);
        }
    }
    let client = ClientIdentity::new(trusted.to_vec())
        .client(peer, &headers)
        .map(|(client, _)| client);
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(&ip));
    let context = || format!("peer {peer}, trusted {trusted:?}, lines {headers:?}: {client:?}");
    if !is_trusted(peer) {
        assert_eq!(client, Ok(peer), "{}", context());
        return;
    }
    // Every element, in order; one that is not an address (text or not) is `None`.
    let entries: Vec<Option<IpAddr>> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .flat_map(|line| line.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|entry| !entry.is_empty())
        .map(|entry| std::str::from_utf8(entry).ok().and_then(read_entry))
        .collect();
    let mut expected = Some(peer);
    for entry in entries.iter().rev() {
        match *entry {
            Some(ip) if is_trusted(ip) => expected = Some(ip),
            Some(ip) => {
                expected = Some(ip);
                break;
            }
            None => {
                expected = None;
                break;
            }
        }
    }
    assert_eq!(client.as_ref().ok(), expected.as_ref(), "{}", context());
    if let Ok(client) = client.clone() {
        assert!(client == peer || entries.contains(&Some(client)), "{}", context());
    }
}

/// Line 1: the peer (default `10.0.0.1`); line 2: `TRUSTED_PROXIES` as written (default
/// `10.0.0.0/8,::1/128,fd00::/8`); every further line is one `X-Forwarded-For` line.
pub fn forwarded_for_bytes(data: &[u8]) {
    let (peer, trusted, lines) = hop_lines(data);
    forwarded_for(peer, &trusted, &lines);
}

/// One `X-Forwarded-For` entry as a proxy may write it: an address, `[v6]`, or either with a
/// port; IPv4-mapped addresses as IPv4.
fn read_entry(entry: &str) -> Option<IpAddr> {
    let ip = match entry.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => match entry.parse::<SocketAddr>() {
            Ok(addr) => addr.ip(),
            Err(_) => entry.strip_prefix('[')?.strip_suffix(']')?.parse().ok()?,
        },
    };
    Some(ip.to_canonical())
}

/// The peer, the trusted networks and the remaining lines of a fuzzer input.
fn hop_lines(data: &[u8]) -> (IpAddr, Vec<IpNet>, Vec<Vec<u8>>) {
    let mut lines = data.split(|&b| b == b'\n');
    let peer = lines
        .next()
        .and_then(|line| std::str::from_utf8(line).ok()?.trim().parse().ok())
        .unwrap_or(IpAddr::from([10, 0, 0, 1]));
    let trusted = match lines.next().map(String::from_utf8_lossy) {
        Some(line) if !line.trim().is_empty() => line
            .split(',')
            .filter_map(|entry| {
                let entry = entry.trim();
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .ok()
            })
            .collect(),
        _ => ["10.0.0.0/8", "::1/128", "fd00::/8"]
            .iter()
            .filter_map(|net| net.parse().ok())
            .collect(),
    };
    (peer, trusted, lines.map(<[u8]>::to_vec).collect())
}

// ---------------------------------------------------------------------------------------------
// Forwarding headers: Forwarded (RFC 7239), X-Forwarded-*, X-Real-IP

/// A header a client (or a trusted proxy before us) may send that the writer rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// `Forwarded`.
    Forwarded,
    /// `X-Forwarded-For`.
    XForwardedFor,
    /// `X-Forwarded-Proto`.
    XForwardedProto,
    /// `X-Forwarded-Host`.
    XForwardedHost,
    /// `X-Real-IP`.
    XRealIp,
}

impl Sent {
    fn name(self) -> &'static HeaderName {
        match self {
            Sent::Forwarded => &header::FORWARDED,
            Sent::XForwardedFor => &X_FORWARDED_FOR,
            Sent::XForwardedProto => &X_FORWARDED_PROTO,
            Sent::XForwardedHost => &X_FORWARDED_HOST,
            Sent::XRealIp => &X_REAL_IP,
        }
    }
}

/// The forwarding headers as the proxy writes them, after working out the client as it does:
/// never a panic; `X-Real-IP` is the client decided on; `X-Forwarded-For` is one line ending
/// with the peer; from an untrusted peer `Forwarded` is our element alone and
/// `X-Forwarded-Proto`/`-Host` are ours; from a trusted one `Forwarded` ends with our element
/// and, when the proxy's lines are valid RFC 7239, is their elements then ours. Our element is
/// valid RFC 7239 and says `for=` the peer, `proto=http` (`https` over TLS) and `host=` the
/// host.
pub fn forwarding(peer: IpAddr, trusted: &[IpNet], host: Option<&[u8]>, tls: bool, sent: &[(Sent, Vec<u8>)]) {
    let mut headers = HeaderMap::new();
    for (name, value) in sent {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name.name(), value);
        }
    }
    let host = host.and_then(|host| HeaderValue::from_bytes(host).ok());
    let identity = ClientIdentity::new(trusted.to_vec());
    let peer = peer.to_canonical();
    // A chain naming no client is refused before anything is forwarded.
    let Ok((client, _)) = identity.client(peer, &headers) else {
        return;
    };
    let hop = Hop {
        peer,
        peer_is_trusted: identity.is_trusted(peer),
        client,
        host: host.as_ref(),
        tls,
    };
    let before = headers.clone();
    forwarding::set_forwarded(&mut headers, &hop);
    let context = || format!("{hop:?}\nsent {before:?}\nwritten {headers:?}");

    let single = |name: &HeaderName| -> Option<String> {
        let mut values = headers.get_all(name).iter();
        let value = values.next()?;
        assert!(values.next().is_none(), "two {name} lines\n{}", context());
        Some(
            value
                .to_str()
                .unwrap_or_else(|_| panic!("{name} is not text\n{}", context()))
                .to_owned(),
        )
    };
    assert_eq!(single(&X_REAL_IP), Some(client.to_string()), "{}", context());
    let forwarded_for =
        single(&X_FORWARDED_FOR).unwrap_or_else(|| panic!("no X-Forwarded-For\n{}", context()));
    assert!(forwarded_for.ends_with(&peer.to_string()), "{}", context());

    // Our element: for=, proto=, host= (when the host is text and not empty).
    let node = match peer {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let proto = if tls { "https" } else { "http" };
    let mut ours = vec![("for".to_owned(), node), ("proto".to_owned(), proto.to_owned())];
    if let Some(host) = hop
        .host
        .and_then(|host| host.to_str().ok())
        .filter(|host| !host.is_empty())
    {
        ours.push(("host".to_owned(), host.to_owned()));
    }
    let written = single(&header::FORWARDED).unwrap_or_else(|| panic!("no Forwarded\n{}", context()));
    if hop.peer_is_trusted {
        let lines: Vec<&str> = before
            .get_all(header::FORWARDED)
            .iter()
            .filter_map(|line| line.to_str().ok())
            .collect();
        let theirs: Option<Vec<_>> = lines.iter().map(|line| parse_forwarded(line)).collect();
        if let Some(theirs) = theirs {
            let mut expected: Vec<_> = theirs.into_iter().flatten().collect();
            expected.push(ours);
            assert_eq!(parse_forwarded(&written), Some(expected), "{}", context());
        }
    } else {
        assert_eq!(parse_forwarded(&written), Some(vec![ours]), "{}", context());
        assert_eq!(
            single(&X_FORWARDED_PROTO).as_deref(),
            Some(proto),
            "{}",
            context()
        );
        let written: Vec<&HeaderValue> = headers.get_all(&X_FORWARDED_HOST).iter().collect();
        assert_eq!(written, Vec::from_iter(hop.host), "{}", context());
    }
}

/// Line 1: the peer; line 2: the trusted networks (as for [`forwarded_for_bytes`]); line 3:
/// the host (`-` alone: none); every further line is a header sent, named by its first byte:
/// `f` Forwarded, `x` X-Forwarded-For, `p` X-Forwarded-Proto, `h` X-Forwarded-Host, `r`
/// X-Real-IP (others ignored). An input of odd length came over TLS.
pub fn forwarding_bytes(data: &[u8]) {
    let (peer, trusted, lines) = hop_lines(data);
    let mut lines = lines.into_iter();
    let host = lines.next().filter(|host| host.as_slice() != b"-");
    let sent: Vec<(Sent, Vec<u8>)> = lines
        .filter_map(|line| {
            let (&kind, value) = line.split_first()?;
            let kind = match kind {
                b'f' => Sent::Forwarded,
                b'x' => Sent::XForwardedFor,
                b'p' => Sent::XForwardedProto,
                b'h' => Sent::XForwardedHost,
                b'r' => Sent::XRealIp,
                _ => return None,
            };
            Some((kind, value.to_vec()))
        })
        .collect();
    forwarding(peer, &trusted, host.as_deref(), data.len() % 2 == 1, &sent);
}

// ---------------------------------------------------------------------------------------------
// The PROXY protocol

/// The start of a connection read as a PROXY header: never a panic; a complete header is
/// within the bytes, parses the same alone, and every shorter prefix of it waits for more (a
/// header split across reads is never refused); what waits is shorter than the longest header.
pub fn proxy_header(bytes: &[u8]) {
    use tollgate::testing::proxy_protocol::{MAX_HEADER, parse};
    match parse(bytes) {
        Ok(Some(header)) => {
            assert!(header.len <= bytes.len() && header.len > 0, "{header:?}");
            assert_eq!(parse(&bytes[..header.len]), Ok(Some(header)));
            for end in 0..header.len {
                assert_eq!(parse(&bytes[..end]), Ok(None), "prefix {:?}", &bytes[..end]);
            }
        }
        Ok(None) => assert!(bytes.len() < MAX_HEADER),
        Err(_) => {}
    }
}

/// An RFC 7239 `Forwarded` value: elements (empty list elements skipped, as RFC 9110 section
/// 5.6.1 asks of recipients), each a list of pairs with names lower-cased and quoted values
/// unescaped; `None` when it is not valid.
///
/// ```text
/// Forwarded         = 1#forwarded-element
/// forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
/// forwarded-pair    = token "=" value
/// value             = token / quoted-string
/// ```
pub fn parse_forwarded(value: &str) -> Option<Vec<Vec<(String, String)>>> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let bytes = value.as_bytes();
    let mut at = 0;
    let mut elements = Vec::new();
    loop {
        while at < bytes.len() && matches!(bytes[at], b' ' | b'\t') {
            at += 1;
        }
        if at == bytes.len() {
            return Some(elements);
        }
        if bytes[at] == b',' {
            at += 1;
            continue;
        }
        let mut pairs = Vec::new();
        loop {
            if at < bytes.len() && tchar(bytes[at]) {
                let start = at;
                while at < bytes.len() && tchar(bytes[at]) {
                    at += 1;
                }
                let name = value[start..at].to_ascii_lowercase();
                if bytes.get(at) != Some(&b'=') {
                    return None;
                }
                at += 1;
                let mut pair_value = Vec::new();
                if bytes.get(at) == Some(&b'"') {
                    at += 1;
                    loop {
                        match *bytes.get(at)? {
                            b'"' => break,
                            b'\\' => {
                                let escaped = *bytes.get(at + 1)?;
                                if escaped != b'\t' && !(b' '..=b'~').contains(&escaped) && escaped < 0x80 {
                                    return None;
                                }
                                pair_value.push(escaped);
                                at += 2;
                            }
                            b if b == b'\t' || b >= 0x20 && b != 0x7f => {
                                pair_value.push(b);
                                at += 1;
                            }
                            _ => return None,
                        }
                    }
                    at += 1;
                } else {
                    let start = at;
                    while at < bytes.len() && tchar(bytes[at]) {
                        at += 1;
                    }
                    if at == start {
                        return None;
                    }
                    pair_value.extend_from_slice(&bytes[start..at]);
                }
                pairs.push((name, String::from_utf8(pair_value).ok()?));
            }
            if bytes.get(at) == Some(&b';') {
                at += 1;
            } else {
                break;
            }
        }
        if !pairs.is_empty() {
            elements.push(pairs);
        }
        while at < bytes.len() && matches!(bytes[at], b' ' | b'\t') {
            at += 1;
        }
        match bytes.get(at) {
            None => return Some(elements),
            Some(b',') => at += 1,
            Some(_) => return None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rule path patterns and key specs

/// `PathPattern::parse` never panics, and a pattern it accepts is written back (`Display`) as
/// text that parses to the same pattern, matches its own base, covers and overlaps itself; an
/// exact or subtree pattern's base is a canonical path.
pub fn path_pattern(entry: &str) {
    let Ok(pattern) = PathPattern::parse(entry) else {
        return;
    };
    let written = pattern.to_string();
    assert_eq!(
        PathPattern::parse(&written).as_ref(),
        Ok(&pattern),
        "{entry:?} -> {written:?}"
    );
    assert!(
        pattern.covers(&pattern) && pattern.overlaps(&pattern),
        "{entry:?}"
    );
    let (PathPattern::Exact(base) | PathPattern::Subtree(base) | PathPattern::Prefix(base)) = &pattern;
    assert!(pattern.matches(base), "{entry:?} does not match {base:?}");
    assert!(
        base.starts_with('/') && !base.bytes().any(|b| b.is_ascii_uppercase()),
        "{entry:?}"
    );
    if let PathPattern::Exact(base) | PathPattern::Subtree(base) = &pattern {
        let read = path::parse(base).unwrap_or_else(|error| panic!("{entry:?} -> {base:?}: {error}"));
        assert_eq!(read.canonical, base.as_str(), "{entry:?}");
    }
}

/// Two patterns' set algebra agrees with matching, on the paths given and on paths at and
/// around both bases: when `a` covers `b`, every path `b` matches `a` matches; when they do not
/// overlap, no path matches both; overlapping is symmetric.
pub fn path_pattern_pair(a: &str, b: &str, paths: &[&str]) {
    let (Ok(a), Ok(b)) = (PathPattern::parse(a), PathPattern::parse(b)) else {
        return;
    };
    assert_eq!(a.overlaps(&b), b.overlaps(&a), "{a} / {b}");
    let mut probes: Vec<String> = Vec::new();
    for pattern in [&a, &b] {
        let (PathPattern::Exact(base) | PathPattern::Subtree(base) | PathPattern::Prefix(base)) = pattern;
        let base = base.trim_end_matches('/');
        for suffix in ["", "/", ".", ".x", "x", "/x", "/x.y", ".x/y", "x/y", "/.x"] {
            probes.push(format!("{base}{suffix}"));
        }
        if let Some((parent, _)) = base.rsplit_once('/') {
            probes.push(format!("{parent}/"));
            probes.push(format!("{parent}/x"));
        }
    }
    probes.extend(paths.iter().map(|path| (*path).to_owned()));
    for probe in &probes {
        let Ok(read) = path::parse(probe) else { continue };
        let path: &str = &read.canonical;
        if a.covers(&b) {
            assert!(
                !b.matches(path) || a.matches(path),
                "{a} covers {b}, yet only {b} matches {path:?}"
            );
        }
        if !a.overlaps(&b) {
            assert!(
                !(a.matches(path) && b.matches(path)),
                "{a} and {b} both match {path:?} yet do not overlap"
            );
        }
    }
}

/// Line 1 and line 2 are patterns, every further line a path.
pub fn path_pattern_bytes(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let a = lines.next().unwrap_or_default();
    path_pattern(a);
    let b = lines.next().unwrap_or_default();
    path_pattern(b);
    path_pattern_pair(a, b, &lines.collect::<Vec<_>>());
}

/// `KeyBy::parse` never panics, and a spec it accepts is written back as text that parses to
/// the same spec.
pub fn key_by(value: &str) {
    let Ok(key_by) = KeyBy::parse(value) else { return };
    let written = key_by.to_string();
    assert_eq!(
        KeyBy::parse(&written).as_ref(),
        Ok(&key_by),
        "{value:?} -> {written:?}"
    );
    assert!(
        written == "ip" || written.starts_with("header:") || written.starts_with("ip+header:"),
        "{value:?} -> {written:?}"
    );
}

/// The input as a key spec (lossy UTF-8).
pub fn key_by_bytes(data: &[u8]) {
    key_by(&String::from_utf8_lossy(data));
}

// ---------------------------------------------------------------------------------------------
// The decision endpoints: the JSON body of POST /v1/check and forward-auth's headers

/// The rule table every check body is asked against: the defaults (general, auth) and one
/// route, as a deployment has them.
fn check_rules() -> &'static [tollgate::rules::Rule] {
    static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            Config::from_vars([
                ("BACKEND_URL", BACKEND_URL),
                ("ROUTES", "/api/*=token_bucket:20:2,name=api"),
            ])
            .expect("the fuzzed table's configuration is valid")
        })
        .rule_table()
        .rules()
}

/// `check::ask` never panics, and what it accepts keeps the API's promises: a named question's
/// rule is one of the table's, its key 1 to 1024 bytes, its cost 1 to the rule's capacity; a
/// described one's path starts with `/` (or is `*`) and holds no query. A refusal names a
/// field the body can hold or holds, or none.
pub fn check_body(body: &[u8]) {
    use tollgate::testing::check::{Ask, MAX_KEY, ask};
    let rules = check_rules();
    match ask(body, rules) {
        Ok(Ask::Named { rule, key, cost }) => {
            assert!(rules.iter().any(|known| std::ptr::eq(known, rule)));
            assert!(!key.is_empty() && key.len() <= MAX_KEY, "{key:?}");
            assert!((1..=rule.limits.capacity()).contains(&cost.get()), "{cost}");
        }
        Ok(Ask::Classified { path, .. }) => {
            assert!(path.starts_with('/') || path == "*", "{path:?}");
            assert!(!path.contains('?'), "{path:?}");
        }
        Err(bad) => {
            const FIELDS: &[&str] = &[
                "rule",
                "key",
                "cost",
                "method",
                "path",
                "client_ip",
                "headers",
                "body",
            ];
            // Or an unknown (or repeated) one, as the body spells it and the reason names it.
            assert!(
                bad.field
                    .as_deref()
                    .is_none_or(|field| FIELDS.contains(&field) || bad.reason.contains(field)),
                "{bad:?}"
            );
            assert!(!bad.reason.is_empty());
        }
    }
}

/// `forward_auth::original` never panics on any header lines (one per input line, `name:
/// value`), and what it reads is a path starting with `/` (or `*`) without a query.
pub fn forward_auth_headers(data: &[u8]) {
    use tollgate::testing::forward_auth::original;
    let mut headers = HeaderMap::new();
    for line in data.split(|&byte| byte == b'\n') {
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    if let Ok(read) = original(&headers, &Method::GET) {
        assert!(read.path.starts_with('/') || read.path == "*", "{:?}", read.path);
        assert!(!read.path.contains('?'), "{:?}", read.path);
    }
}

// ---------------------------------------------------------------------------------------------
// Envoy's rate limit service: RLS_CONFIG's YAML and the descriptor matcher

/// `DescriptorTable::parse` never panics on any text; a table it accepts names each counted
/// limit by a distinct rule, and the matcher, for any descriptor of `entries`, finds one of
/// the table's limits or none.
pub fn rls_config(text: &str, entries: &[(&str, &str)]) {
    use tollgate::testing::{DescriptorTable, matcher};
    let Ok(table) = DescriptorTable::parse([("fuzz.yaml", text)]) else {
        return;
    };
    for domain in ["d", "edge", ""] {
        if let Some(found) = matcher::find(&table, domain, entries.iter().copied()) {
            let id = found.limit;
            assert!(id < table.limits.len(), "{id} of {}", table.limits.len());
            // A shared entry is one of the descriptor's, matched by its pattern.
            for (index, pattern) in &found.shared {
                assert!(*index < entries.len() && pattern.contains('*'), "{found:?}");
            }
        }
    }
    let rules = table.specs(tollgate::rules::FailMode::Open, false);
    let names: std::collections::HashSet<_> = rules.iter().map(|spec| spec.rule.name.clone()).collect();
    assert_eq!(names.len(), rules.len(), "rule names are distinct");
}

/// The input as YAML, then one descriptor per later line (`key=value`, one entry each) after a
/// line `---descriptor`.
pub fn rls_config_bytes(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (yaml, descriptor) = text.split_once("\n---descriptor\n").unwrap_or((&text, ""));
    let entries: Vec<(&str, &str)> = descriptor
        .lines()
        .map(|line| line.split_once('=').unwrap_or((line, "")))
        .collect();
    rls_config(yaml, &entries);
}
