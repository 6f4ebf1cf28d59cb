//! Who a budget belongs to: the [`ClientKey`] a request is counted under.
//!
//! A key is the client's IP address, a digest of what the request says in some of its parts
//! (a header such as an API key, a cookie, a query parameter, the host, the path), or both. It
//! is a small `Copy` value of fixed size, so the memory store hashes and compares it without
//! allocating, and it never holds a raw value: values are hashed with a keyed hash
//! ([`KeyHasher`], SipHash-2-4 with a 128-bit output), so an API key never appears in a log
//! line or a Redis key, and a client cannot aim many values at one memory-store shard.
//!
//! A key of several sources (`header:X-API-Key+query:tenant`) is one digest of all their
//! values, each framed by its source's name and its length, so `a`+`bc` is not `ab`+`c` and
//! `query:x` is not `header:x`. One header alone is digested as its bare value, as before there
//! were other sources, so the Redis keys of `header:NAME` rules stayed the same. A request
//! missing any of its rule's sources is keyed by its address alone: never by the sources it
//! has, which would give a client a fresh budget for dropping one.
//!
//! IPv6 clients are keyed by their network (`IPV6_PREFIX`, a /64 by default): one subscriber
//! is routinely handed a whole /64, so keying single addresses would give each of them 2^64
//! budgets. IPv4-mapped IPv6 addresses are keyed as the IPv4 address they are.

use std::borrow::Cow;
use std::fmt;
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::HeaderName;
use percent_encoding::percent_decode;
use siphasher::sip128::{Hasher128, SipHasher24};

/// Most parts one key is made of (`ip` counted): more is a mistake, not a policy.
pub const MAX_SOURCES: usize = 8;

/// One part of the request a key is made of, besides the address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `header:NAME`: the header's value, as sent.
    Header(HeaderName),
    /// `cookie:NAME`: the first cookie of that name in the `Cookie` lines, percent-decoded.
    Cookie(Box<str>),
    /// `query:NAME`: the parameter of that name in the query, form-decoded (named twice: an
    /// error, see [`query_value`]).
    Query(Box<str>),
    /// `host`: the host the request is for, lower case, without a default port.
    Host,
    /// `path`: the resource the canonical path names to the loosest reader, as rules match it:
    /// without `PATH_INFO` after a script or an extension ([`crate::rules::pattern::resource`]).
    Path,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Header(name) => write!(f, "header:{name}"),
            Source::Cookie(name) => write!(f, "cookie:{name}"),
            Source::Query(name) => write!(f, "query:{name}"),
            Source::Host => f.write_str("host"),
            Source::Path => f.write_str("path"),
        }
    }
}

/// What a rule keys its budgets by (`KEY_BY`, `AUTH_KEY_BY`, or a route's `key=`): sources
/// joined by `+`, `ip` possibly one of them.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyBy {
    /// Whether the address is part of the key.
    ip: bool,
    /// The other sources, as written; empty for `ip`.
    sources: Vec<Source>,
}

/// What `KeyBy::parse` accepts, for error messages.
pub const KEY_BY_FORMS: &str = "ip, header:NAME, cookie:NAME, query:NAME, host or path, or several \
                                joined by + (e.g. header:X-API-Key, ip+path, header:X-API-Key+query:tenant)";

impl KeyBy {
    /// `ip`: the client address alone.
    pub fn ip() -> KeyBy {
        KeyBy {
            ip: true,
            sources: Vec::new(),
        }
    }

    /// Parse `ip`, `header:NAME`, `cookie:NAME`, `query:NAME`, `host`, `path`, or several of
    /// them joined by `+`. The error names the part at fault (and [`KEY_BY_FORMS`] says what
    /// is accepted).
    pub fn parse(value: &str) -> Result<KeyBy, String> {
        let mut key_by = KeyBy {
            ip: false,
            sources: Vec::new(),
        };
        let parts = value.split('+');
        if parts.clone().count() > MAX_SOURCES {
            return Err(format!("at most {MAX_SOURCES} parts joined by +"));
        }
        for part in parts {
            let source = match part.split_once(':') {
                None if part == "ip" => {
                    if key_by.ip {
                        return Err("ip is named twice".into());
                    }
                    key_by.ip = true;
                    continue;
                }
                None if part == "host" => Source::Host,
                None if part == "path" => Source::Path,
                None if part.is_empty() => return Err(format!("{value:?} has an empty part")),
                Some(("header", name)) => Source::Header(
                    HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{part:?}: {name:?} is not a valid header name"))?,
                ),
                Some(("cookie", name)) if is_token(name) => Source::Cookie(name.into()),
                Some(("cookie", name)) => {
                    return Err(format!(
                        "{part:?}: {name:?} is not a cookie name (a token: letters, digits and !#$&'*-.^_`|~, RFC 6265 section 4.1.1)"
                    ));
                }
                Some(("query", name)) if is_query_name(name) => Source::Query(name.into()),
                Some(("query", name)) => {
                    return Err(format!(
                        "{part:?}: {name:?} is not a query parameter name (1 to 128 of letters, digits and -._~[], as decoded)"
                    ));
                }
                _ => return Err(format!("{part:?} is not a key source")),
            };
            if key_by.sources.contains(&source) {
                return Err(format!("{source} is named twice"));
            }
            key_by.sources.push(source);
        }
        Ok(key_by)
    }

    /// Whether the address is part of the key.
    pub fn has_ip(&self) -> bool {
        self.ip
    }

    /// The sources besides the address, as written.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Whether some part of the key is digested (anything but the address alone).
    pub fn digests(&self) -> bool {
        !self.sources.is_empty()
    }

    /// The headers this rule reads.
    pub fn headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.sources.iter().filter_map(|source| match source {
            Source::Header(name) => Some(name),
            _ => None,
        })
    }

    /// The one source besides the address, when there is exactly one: a key whose raw value
    /// an operator can name (`EXEMPT`'s and the admin's `key:VALUE`).
    pub fn single(&self) -> Option<&Source> {
        match &self.sources[..] {
            [source] => Some(source),
            _ => None,
        }
    }
}

/// As [`KeyBy::parse`] reads it: `ip`, `header:x-api-key`, `ip+path`, ...
impl fmt::Display for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        if self.ip {
            f.write_str("ip")?;
            first = false;
        }
        for source in &self.sources {
            if !first {
                f.write_str("+")?;
            }
            write!(f, "{source}")?;
            first = false;
        }
        Ok(())
    }
}

/// `Ip`, `Header("x-api-key")` and `IpAndHeader("x-api-key")` for the three forms there were
/// before other sources, so the rule table's digest (`tollgate_config_hash`) of a table using
/// only them is what it was; `KeyBy("ip+path")` otherwise.
impl fmt::Debug for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ip, &self.sources[..]) {
            (true, []) => f.write_str("Ip"),
            (false, [Source::Header(name)]) => f.debug_tuple("Header").field(name).finish(),
            (true, [Source::Header(name)]) => f.debug_tuple("IpAndHeader").field(name).finish(),
            _ => f.debug_tuple("KeyBy").field(&self.to_string()).finish(),
        }
    }
}

/// RFC 9110's `token`, which RFC 6265 makes a cookie's name.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*-.^_`|~".contains(&b))
}

/// A query parameter name as a rule writes it, decoded: unreserved characters and brackets.
fn is_query_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~[]".contains(&b))
}

/// The value of the `name` parameter in `query` (the raw text after `?`), decoded as HTML
/// forms encode it (`+` is a space, then `%XX`), as the backends' query readers decode it; so
/// `%41` and `A` are one value. Parameter names are decoded before they are compared. Pairs
/// are split at `&` and at `;` (as Rack, older Python and many other readers split them), and
/// a parameter named twice is an error ([`RepeatedParameter`]): readers differ on which one
/// they take (the first, the last, all of them), so no one of them can be the key. An empty
/// value is none. Names are compared as PHP reads them ([`same_parameter`]), so `api.key` is a
/// second `api_key`. One pass over the query, and nothing allocated unless the value is
/// encoded: a query of many parameters costs its length, which the request head's bound caps.
pub fn query_value<'q>(query: &'q str, name: &str) -> Result<Option<Cow<'q, [u8]>>, RepeatedParameter> {
    let mut found = None;
    for pair in query.split(['&', ';']) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if same_parameter(form_decode(key.as_bytes()), name) {
            if found.is_some() {
                return Err(RepeatedParameter);
            }
            found = Some(value);
        }
    }
    Ok(found
        .map(|value| decoded(value.as_bytes(), true))
        .filter(|value| !value.is_empty()))
}

/// Whether the decoded parameter name `key` is `name` to some backend: PHP turns `.`, ` ` and
/// `[` in a parameter's name into `_` (`api.key`, `api key` and `api[key` are all
/// `$_GET['api_key']`, the last one winning), so those bytes are compared as `_` on both sides.
fn same_parameter(key: impl Iterator<Item = u8>, name: &str) -> bool {
    let php = |byte: u8| match byte {
        b'.' | b' ' | b'[' => b'_',
        other => other,
    };
    key.map(php).eq(name.bytes().map(php))
}

/// A query parameter a key is read from, named more than once in the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedParameter;

/// Every value of a `name` parameter in `query`, decoded as [`query_value`] decodes it, in
/// order: PHP believes the last, Express's `qs` all of them, others the first.
pub fn query_values<'q>(query: &'q str, name: &'q str) -> impl Iterator<Item = Cow<'q, [u8]>> {
    query.split(['&', ';']).filter_map(move |pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        same_parameter(form_decode(key.as_bytes()), name).then(|| decoded(value.as_bytes(), true))
    })
}

/// The value of the first cookie called `name` in `lines` (every `Cookie` line, in order:
/// HTTP/2 may split one cookie-string into several, RFC 9113 section 8.2.3), read as RFC 6265
/// section 5.4 writes a cookie-string, `name=value; name2=value2`, and leniently as servers
/// read it (pairs split at `;`, spaces around them dropped, a pair without `=` passed over).
/// Names are compared exactly (they are case-sensitive); the value loses one pair of
/// surrounding double quotes and is percent-decoded, as the frameworks that read cookies do.
/// An empty value is none.
pub fn cookie_value<'c>(lines: impl Iterator<Item = &'c [u8]>, name: &str) -> Option<Cow<'c, [u8]>> {
    lines
        .flat_map(|line| line.split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|&b| b == b'=')?;
            let (key, value) = (pair[..at].trim_ascii(), pair[at + 1..].trim_ascii());
            (key == name.as_bytes()).then_some(value)
        })
        .map(|value| match value {
            [b'"', inner @ .., b'"'] => inner,
            value => value,
        })
        .map(|value| decoded(value, false))
        .filter(|value| !value.is_empty())
}

/// The host a request names (`Host`, or the target's authority), as keys compare it: lower
/// case, without a trailing dot, without the default port of HTTP or HTTPS (`:80`, `:443`) or
/// an empty one. An empty host is none.
pub fn host_value(host: &[u8]) -> Option<Cow<'_, [u8]>> {
    let host = host.trim_ascii();
    // The port follows the last `:` after an IPv6 literal's `]`.
    let colon = host
        .iter()
        .rposition(|&b| b == b':')
        .filter(|&at| !host[at..].contains(&b']'));
    let host = match colon {
        Some(at) if matches!(&host[at + 1..], b"" | b"80" | b"443") => &host[..at],
        _ => host,
    };
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some(match host.iter().any(u8::is_ascii_uppercase) {
        true => Cow::Owned(host.to_ascii_lowercase()),
        false => Cow::Borrowed(host),
    })
}

/// `value` with `%XX` decoded (and `+` read as a space when `form`); borrowed when nothing was
/// encoded. A `%` not followed by two hex digits stands for itself, as backends read it.
fn decoded(value: &[u8], form: bool) -> Cow<'_, [u8]> {
    if form && value.contains(&b'+') {
        let spaced: Vec<u8> = value.iter().map(|&b| if b == b'+' { b' ' } else { b }).collect();
        return Cow::Owned(percent_decode(&spaced).collect());
    }
    percent_decode(value).into()
}

/// `bytes` form-decoded, byte by byte, for comparing without allocating.
fn form_decode(bytes: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let byte = *bytes.get(i)?;
        i += 1;
        Some(match byte {
            b'+' => b' ',
            b'%' => match (bytes.get(i).and_then(hex), bytes.get(i + 1).and_then(hex)) {
                (Some(high), Some(low)) => {
                    i += 2;
                    high << 4 | low
                }
                _ => b'%',
            },
            byte => byte,
        })
    })
}

fn hex(digit: &u8) -> Option<u8> {
    (*digit as char).to_digit(16).map(|d| d as u8)
}

/// A client address as budgets are keyed: IPv4 as is, IPv6 masked to the configured prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp {
    /// The address, with host bits beyond `prefix` cleared.
    addr: IpAddr,
    /// 32 for IPv4; the IPv6 prefix length otherwise.
    prefix: u8,
}

impl ClientIp {
    /// Key `ip` (IPv4-mapped addresses as IPv4), grouping IPv6 by its first `ipv6_prefix` bits
    /// (1 to 128).
    pub fn new(ip: IpAddr, ipv6_prefix: u8) -> ClientIp {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ClientIp {
                addr: IpAddr::V4(v4),
                prefix: 32,
            },
            IpAddr::V6(v6) => {
                let prefix = ipv6_prefix.clamp(1, 128);
                let mask = u128::MAX << (128 - u32::from(prefix));
                ClientIp {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)),
                    prefix,
                }
            }
        }
    }
}

impl ClientIp {
    /// The address, host bits beyond [`prefix`](ClientIp::prefix) cleared.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// 32 for IPv4; the IPv6 prefix length otherwise.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

/// `203.0.113.7`, `2001:db8::1` (a single IPv6 address) or `2001:db8:1:2::/64`.
impl fmt::Display for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V6(v6) if self.prefix < 128 => write!(f, "{v6}/{}", self.prefix),
            addr => write!(f, "{addr}"),
        }
    }
}

/// A keyed 128-bit digest of a header value. Two `u64`s rather than a `u128`, so a
/// [`ClientKey`] stays 8-byte aligned and small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u64; 2]);

impl Digest {
    /// The digest's 16 bytes, for comparing in constant time.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.0[0].to_le_bytes());
        bytes[8..].copy_from_slice(&self.0[1].to_le_bytes());
        bytes
    }
}

impl Digest {
    /// A digest as [`Display`](fmt::Display) writes it: 32 hex digits.
    pub fn parse(text: &str) -> Option<Digest> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let high = u64::from_str_radix(&text[..16], 16).ok()?;
        let low = u64::from_str_radix(&text[16..], 16).ok()?;
        Some(Digest([high, low]))
    }

    /// The digest whose [`to_bytes`](Digest::to_bytes) are `bytes` (one read back from a file).
    pub fn from_bytes(bytes: [u8; 16]) -> Digest {
        let [a, b] = [&bytes[..8], &bytes[8..]].map(|half| {
            let mut word = [0; 8];
            word.copy_from_slice(half);
            u64::from_le_bytes(word)
        });
        Digest([a, b])
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.0[0], self.0[1])
    }
}

/// Who a budget belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// Keyed by address.
    Ip(ClientIp),
    /// Keyed by a header's value.
    Header(Digest),
    /// Keyed by address and a header's value together.
    IpAndHeader(ClientIp, Digest),
}

impl ClientKey {
    /// The key of a rule keyed `by`, for a client at `ip` whose request holds `values` for
    /// `by`'s sources, in their order (`None` when any is missing or empty: such requests are
    /// keyed by their address alone).
    pub fn new(by: &KeyBy, ip: ClientIp, values: Option<&[&[u8]]>, hasher: &KeyHasher) -> ClientKey {
        match values {
            Some(values) if by.digests() && values.len() == by.sources.len() => {
                let digest = hasher.digest_of(&by.sources, values);
                match by.ip {
                    true => ClientKey::IpAndHeader(ip, digest),
                    false => ClientKey::Header(digest),
                }
            }
            _ => ClientKey::Ip(ip),
        }
    }

    /// The address part, if the key has one.
    pub fn ip(&self) -> Option<ClientIp> {
        match self {
            ClientKey::Ip(ip) | ClientKey::IpAndHeader(ip, _) => Some(*ip),
            ClientKey::Header(_) => None,
        }
    }

    /// The header digest, if the key has one.
    pub fn digest(&self) -> Option<Digest> {
        match self {
            ClientKey::Header(digest) | ClientKey::IpAndHeader(_, digest) => Some(*digest),
            ClientKey::Ip(_) => None,
        }
    }
}

/// A single address (IPv6 unmasked): what tests and benchmarks usually mean by a client.
impl From<IpAddr> for ClientKey {
    fn from(ip: IpAddr) -> ClientKey {
        ClientKey::Ip(ClientIp::new(ip, 128))
    }
}

impl ClientKey {
    /// Append the key to `out` as [`Display`](fmt::Display) writes it; an IPv4 client (the
    /// common case) without `core::fmt`, which costs several times as much, on every Redis
    /// decision.
    pub fn push_to(&self, out: &mut String) {
        match self {
            ClientKey::Ip(ClientIp {
                addr: IpAddr::V4(v4), ..
            }) => out.push_str(ipv4_text(*v4, &mut [0; 15])),
            _ => {
                use fmt::Write;
                // Writing to a String cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    }
}

impl ClientKey {
    /// A key as [`Display`](fmt::Display) writes it (`203.0.113.7`, `2001:db8:1:2::/64`,
    /// `key:<32 hex digits>`, `<ip>+key:<hex>`): what another replica names it by in a reset it
    /// announces. `None` for anything else.
    pub fn parse(text: &str) -> Option<ClientKey> {
        let ip = |text: &str| match text.split_once('/') {
            Some((address, prefix)) => {
                let address: Ipv6Addr = address.parse().ok()?;
                let prefix: u8 = prefix.parse().ok().filter(|prefix| (1..128).contains(prefix))?;
                Some(ClientIp::new(IpAddr::V6(address), prefix))
            }
            None => Some(ClientIp::new(text.parse().ok()?, 128)),
        };
        match text.split_once("key:") {
            Some(("", digest)) => Some(ClientKey::Header(Digest::parse(digest)?)),
            Some((address, digest)) => Some(ClientKey::IpAndHeader(
                ip(address.strip_suffix('+')?)?,
                Digest::parse(digest)?,
            )),
            None => Some(ClientKey::Ip(ip(text)?)),
        }
    }
}

/// `v4` in dotted decimal, as `Display` writes it, digit by digit into `buffer`.
pub fn ipv4_text(v4: Ipv4Addr, buffer: &mut [u8; 15]) -> &str {
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buffer[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            buffer[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            buffer[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        buffer[len] = b'0' + octet % 10;
        len += 1;
    }
    // Digits and dots only.
    std::str::from_utf8(&buffer[..len]).unwrap_or_default()
}

/// As in logs and Redis keys: `203.0.113.7`, `key:<32 hex digits>`, or `<ip>+key:<hex>`.
impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::Ip(ip) => write!(f, "{ip}"),
            ClientKey::Header(digest) => write!(f, "key:{digest}"),
            ClientKey::IpAndHeader(ip, digest) => write!(f, "{ip}+key:{digest}"),
        }
    }
}

/// Turns header values into [`Digest`]s with a secret key. Every replica sharing a Redis must
/// use the same key (`KEY_HASH_SECRET`), or each would count one client under a different
/// name; a gateway with its own memory store draws a random key at startup.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyHasher {
    keys: (u64, u64),
}

/// Fixed, public input that separates this use of the secret from any other.
const KEY_DERIVATION_CONTEXT: &[u8] = b"tollgate client-key digest v1\0";

impl KeyHasher {
    /// A key derived from `secret` (`KEY_HASH_SECRET`): the same secret gives the same digests.
    pub fn from_secret(secret: &str) -> KeyHasher {
        let mut derive = SipHasher24::new_with_keys(0, 0);
        derive.write(KEY_DERIVATION_CONTEXT);
        derive.write(secret.as_bytes());
        let key = derive.finish128();
        KeyHasher {
            keys: (key.h1, key.h2),
        }
    }

    /// A key drawn from the operating system's random source, for one process alone.
    pub fn random() -> Result<KeyHasher, getrandom::Error> {
        Ok(KeyHasher {
            keys: (getrandom::u64()?, getrandom::u64()?),
        })
    }

    /// The digest of one header value (and of a name a door gives a client itself: the JSON
    /// API's `key`, an Envoy descriptor).
    pub fn digest(&self, value: &[u8]) -> Digest {
        let mut hasher = SipHasher24::new_with_keys(self.keys.0, self.keys.1);
        hasher.write(value);
        let hash = hasher.finish128();
        Digest([hash.h1, hash.h2])
    }

    /// The digest of `values`, one for each of `sources` in order. A single header's is its
    /// bare value's ([`KeyHasher::digest`]), as it was before keys had other sources, so the
    /// budgets of `header:NAME` rules outlive the upgrade. Any other is framed: a NUL byte
    /// (which no header value holds, so no framed input is a header's), then for each source
    /// its name and its value, each after its length. So `a`+`bc` is not `ab`+`c`, and a
    /// query parameter is not a header of the same name and value.
    pub fn digest_of(&self, sources: &[Source], values: &[&[u8]]) -> Digest {
        if let ([Source::Header(_)], [value]) = (sources, values) {
            return self.digest(value);
        }
        let mut hasher = SipHasher24::new_with_keys(self.keys.0, self.keys.1);
        hasher.write(&[0]);
        for (source, value) in sources.iter().zip(values) {
            let (kind, name): (&[u8], &str) = match source {
                Source::Header(name) => (b"header:", name.as_str()),
                Source::Cookie(name) => (b"cookie:", name),
                Source::Query(name) => (b"query:", name),
                Source::Host => (b"host", ""),
                Source::Path => (b"path", ""),
            };
            hasher.write(&((kind.len() + name.len()) as u64).to_le_bytes());
            hasher.write(kind);
            hasher.write(name.as_bytes());
            hasher.write(&(value.len() as u64).to_le_bytes());
            hasher.write(value);
        }
        let hash = hasher.finish128();
        Digest([hash.h1, hash.h2])
    }
}

/// The key is a secret: never printed.
impl KeyHasher {
    /// A digest of a fixed label: equal for two hashers exactly when they digest every value
    /// alike (in practice), so a state file can tell whether the header keys it holds still
    /// mean the same clients. Tells nothing of the key (SipHash is a keyed PRF).
    pub fn fingerprint(&self) -> [u8; 16] {
        self.digest(b"tollgate key-hasher fingerprint").to_bytes()
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn push_to_writes_what_display_writes(
            v4 in any::<u32>(),
            v6 in any::<u128>(),
            prefix in 1u8..=128,
            digest in any::<[u64; 2]>(),
        ) {
            let v4 = ClientIp::new(IpAddr::V4(Ipv4Addr::from(v4)), prefix);
            let v6 = ClientIp::new(IpAddr::V6(Ipv6Addr::from(v6)), prefix);
            for key in [
                ClientKey::Ip(v4),
                ClientKey::Ip(v6),
                ClientKey::Header(Digest(digest)),
                ClientKey::IpAndHeader(v4, Digest(digest)),
            ] {
                let mut pushed = String::from("prefix:");
                key.push_to(&mut pushed);
                prop_assert_eq!(pushed, format!("prefix:{key}"));
            }
        }

        #[test]
        fn a_key_written_reads_back_as_itself(
            v4 in any::<u32>(),
            v6 in any::<u128>(),
            prefix in 1u8..=128,
            digest in any::<[u64; 2]>(),
            noise in "[0-9a-fk:+/.]{0,48}",
        ) {
            let v4 = ClientIp::new(IpAddr::V4(Ipv4Addr::from(v4)), prefix);
            let v6 = ClientIp::new(IpAddr::V6(Ipv6Addr::from(v6)), prefix);
            for key in [
                ClientKey::Ip(v4),
                ClientKey::Ip(v6),
                ClientKey::Header(Digest(digest)),
                ClientKey::IpAndHeader(v4, Digest(digest)),
                ClientKey::IpAndHeader(v6, Digest(digest)),
            ] {
                prop_assert_eq!(ClientKey::parse(&key.to_string()), Some(key));
            }
            // Anything else never panics, and what does parse is what it writes.
            if let Some(key) = ClientKey::parse(&noise) {
                prop_assert_eq!(ClientKey::parse(&key.to_string()), Some(key));
            }
        }
    }

    #[test]
    fn malformed_keys_do_not_parse() {
        for text in [
            "",
            "key:",
            "key:xyz",
            "203.0.113.7+",
            "203.0.113.7key:0123456789abcdef0123456789abcdef",
            "2001:db8::/0",
            "2001:db8::/129",
            "203.0.113.7/24",
            "host.example",
        ] {
            assert_eq!(ClientKey::parse(text), None, "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn every_spelling_of_a_query_value_is_one_value(
            value in proptest::collection::vec(any::<u8>(), 1..64),
            noise in "[a-z0-9=&%+]{0,40}",
        ) {
            // Every byte escaped, and only what must be: the same value.
            let all: String = value.iter().map(|b| format!("%{b:02X}")).collect();
            let needed: String = value
                .iter()
                .map(|&b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => char::from(b).to_string(),
                    _ => format!("%{b:02x}"),
                })
                .collect();
            let (first, second) = (format!("tenant={all}&x=1"), format!("a=1;tenant={needed}"));
            let read = |query: &str| query_value(query, "tenant").map(|value| value.map(Cow::into_owned));
            prop_assert_eq!(read(&first), Ok(Some(value.clone())));
            prop_assert_eq!(read(&second), Ok(Some(value.clone())));
            // Named again, however spelled and separated: no value is the key.
            prop_assert_eq!(read(&format!("{first};tenant={needed}")), Err(RepeatedParameter));
            prop_assert_eq!(read(&format!("ten%61nt={needed}&{second}")), Err(RepeatedParameter));
            // Whatever else a query holds, reading it never panics.
            let _ = query_value(&noise, "tenant");
            let _ = cookie_value(std::iter::once(noise.as_bytes()), "tenant");
            let _ = host_value(noise.as_bytes());
        }
    }

    fn ip(s: &str, prefix: u8) -> String {
        ClientIp::new(s.parse().unwrap(), prefix).to_string()
    }

    #[test]
    fn ipv6_is_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        assert_eq!(ip("2001:db8:1:2:aaaa::1", 64), "2001:db8:1:2::/64");
        assert_eq!(ip("2001:db8:1:2:bbbb::9", 64), "2001:db8:1:2::/64");
        assert_eq!(ip("2001:db8:1:2:bbbb::9", 48), "2001:db8:1::/48");
        assert_eq!(ip("2001:db8::5", 128), "2001:db8::5");
        assert_eq!(ip("::ffff:203.0.113.7", 64), "203.0.113.7");
        assert_eq!(ip("203.0.113.7", 64), "203.0.113.7");
    }

    fn addr() -> ClientIp {
        ClientIp::new("192.0.2.1".parse().unwrap(), 64)
    }

    fn hasher() -> KeyHasher {
        KeyHasher::from_secret("correct horse battery staple")
    }

    fn key(by: &str, values: &[&[u8]]) -> ClientKey {
        ClientKey::new(&KeyBy::parse(by).unwrap(), addr(), Some(values), &hasher())
    }

    #[test]
    fn header_keys_are_keyed_digests_never_raw_values() {
        let hasher = hasher();
        let by = KeyBy::parse("header:X-API-Key").unwrap();
        let value: &[&[u8]] = &[b"sk_live_secret"];
        let key = ClientKey::new(&by, addr(), Some(value), &hasher);
        let shown = key.to_string();
        assert!(shown.starts_with("key:") && shown.len() == 4 + 32, "{shown}");
        assert!(!shown.contains("secret"));
        // Same secret, same digest (replicas agree); another secret, another digest.
        assert_eq!(key, ClientKey::new(&by, addr(), Some(value), &self::hasher()));
        let other = KeyHasher::from_secret("another secret");
        assert_ne!(key, ClientKey::new(&by, addr(), Some(value), &other));
        // Without the header: the address.
        assert_eq!(
            ClientKey::new(&by, addr(), None, &hasher).to_string(),
            "192.0.2.1"
        );
        let both = KeyBy::parse("ip+header:x-api-key").unwrap();
        let key = ClientKey::new(&both, addr(), Some(&[b"k"]), &hasher).to_string();
        assert!(key.starts_with("192.0.2.1+key:"), "{key}");
        assert!(!format!("{hasher:?}").contains(&format!("{}", hasher.keys.0)));
    }

    #[test]
    fn a_single_header_digests_as_it_always_has() {
        // The digest a `header:NAME` rule keyed by before other sources existed: the bare
        // value's, so Redis keys (and budgets) survive the upgrade. Pinned by value.
        let hasher = hasher();
        assert_eq!(
            key("header:x-api-key", &[b"sk_live_secret"]),
            ClientKey::Header(hasher.digest(b"sk_live_secret"))
        );
        assert_eq!(
            key("ip+header:x-api-key", &[b"k"]),
            ClientKey::IpAndHeader(addr(), hasher.digest(b"k"))
        );
        let mut sip = SipHasher24::new_with_keys(hasher.keys.0, hasher.keys.1);
        sip.write(b"sk_live_secret");
        let hash = sip.finish128();
        assert_eq!(hasher.digest(b"sk_live_secret"), Digest([hash.h1, hash.h2]));
        // As the code before other sources computed it, for this secret and value.
        assert_eq!(
            hasher.digest(b"sk_live_secret").to_string(),
            "a7c1d30e36781daa5fe47969be625b35"
        );
    }

    #[test]
    fn digests_of_several_sources_keep_them_apart() {
        // Where one value ends and the next begins.
        assert_ne!(
            key("header:a+header:b", &[b"a", b"bc"]),
            key("header:a+header:b", &[b"ab", b"c"])
        );
        // Which source a value came from.
        assert_ne!(key("query:x", &[b"v"]), key("cookie:x", &[b"v"]));
        assert_ne!(key("query:x", &[b"v"]), key("header:x", &[b"v"]));
        assert_ne!(key("query:x", &[b"v"]), key("query:y", &[b"v"]));
        assert_ne!(key("host", &[b"v"]), key("path", &[b"v"]));
        // A framed digest is never a bare header value's: the frame starts with a NUL.
        let hasher = hasher();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&9u64.to_le_bytes());
        framed.extend_from_slice(b"cookie:id");
        framed.extend_from_slice(&1u64.to_le_bytes());
        framed.push(b'v');
        assert_eq!(
            key("cookie:id", &[b"v"]),
            ClientKey::Header(hasher.digest(&framed))
        );
        assert!(http::HeaderValue::from_bytes(&framed).is_err());
        // The same values, the same key; with ip, the address and the digest.
        assert_eq!(
            key("header:x-api-key+query:tenant", &[b"k", b"t"]),
            key("header:x-api-key+query:tenant", &[b"k", b"t"])
        );
        let ClientKey::IpAndHeader(ip, digest) = key("ip+path", &[b"/a"]) else {
            panic!("ip+path is an address and a digest")
        };
        assert_eq!((ip, ClientKey::Header(digest)), (addr(), key("path", &[b"/a"])));
        // A missing source: the address alone, never the sources there are.
        let by = KeyBy::parse("header:x-api-key+query:tenant").unwrap();
        assert_eq!(ClientKey::new(&by, addr(), None, &hasher), ClientKey::Ip(addr()));
        assert_eq!(
            ClientKey::new(&by, addr(), Some(&[b"k"]), &hasher),
            ClientKey::Ip(addr())
        );
        assert_eq!(std::mem::size_of::<ClientKey>(), 40);
    }

    #[test]
    fn digests_parse_as_they_print() {
        let digest = hasher().digest(b"k");
        assert_eq!(Digest::parse(&digest.to_string()), Some(digest));
        assert_eq!(Digest::parse(&digest.to_string().to_uppercase()), Some(digest));
        assert_eq!(Digest::parse("abc"), None);
        assert_eq!(Digest::parse(&"g".repeat(32)), None);
        assert_eq!(Digest::parse(&"+1".repeat(16)), None);
    }

    #[test]
    fn key_by_parses_and_prints() {
        for value in [
            "ip",
            "header:x-api-key",
            "ip+header:authorization",
            "cookie:session",
            "query:tenant",
            "host",
            "path",
            "ip+path",
            "header:x-api-key+query:tenant",
            "ip+path+cookie:__Host-id",
            "query:filter[]",
        ] {
            assert_eq!(KeyBy::parse(value).unwrap().to_string(), value);
        }
        assert_eq!(
            KeyBy::parse("header:X-Api-Key").unwrap().to_string(),
            "header:x-api-key"
        );
        // The address is written first, wherever it was.
        assert_eq!(KeyBy::parse("path+ip").unwrap().to_string(), "ip+path");
        let by = KeyBy::parse("ip+header:X-API-Key+query:tenant").unwrap();
        assert!(by.has_ip());
        assert_eq!(
            by.headers().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-api-key"]
        );
        assert_eq!(by.single(), None);
        assert_eq!(KeyBy::parse("ip+host").unwrap().single(), Some(&Source::Host));
        // The table's digest of the three forms there were is what it was.
        assert_eq!(format!("{:?}", KeyBy::ip()), "Ip");
        assert_eq!(
            format!("{:?}", KeyBy::parse("ip+header:X-A").unwrap()),
            "IpAndHeader(\"x-a\")"
        );
        assert_eq!(
            format!("{:?}", KeyBy::parse("ip+path").unwrap()),
            "KeyBy(\"ip+path\")"
        );
    }

    #[test]
    fn key_by_errors_name_the_part_at_fault() {
        for (value, expected) in [
            ("header:", "\"header:\": \"\" is not a valid header name"),
            ("header:bad name", "\"bad name\" is not a valid header name"),
            ("cookie:", "\"cookie:\": \"\" is not a cookie name"),
            ("cookie:a=b", "\"a=b\" is not a cookie name"),
            ("query:", "\"query:\": \"\" is not a query parameter name"),
            ("query:a&b", "\"a&b\" is not a query parameter name"),
            ("ip+ip", "ip is named twice"),
            ("path+path", "path is named twice"),
            ("header:a+header:A", "header:a is named twice"),
            ("ip+", "\"ip+\" has an empty part"),
            ("+path", "has an empty part"),
            ("ip+body:x", "\"body:x\" is not a key source"),
            ("IP", "\"IP\" is not a key source"),
            (
                "ip+path+host+query:a+query:b+query:c+query:d+query:e+query:f",
                "at most 8 parts",
            ),
        ] {
            let error = KeyBy::parse(value).unwrap_err();
            assert!(error.contains(expected), "{value}: {error}");
        }
    }

    fn query(query: &str, name: &str) -> Option<String> {
        query_value(query, name)
            .unwrap()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(query("tenant=acme", "tenant").as_deref(), Some("acme"));
        assert_eq!(query("a=1&tenant=acme&b=2", "tenant").as_deref(), Some("acme"));
        // Two spellings of one value are one value, as backends decode them.
        assert_eq!(query("tenant=%41cme", "tenant"), query("tenant=Acme", "tenant"));
        assert_eq!(query("tenant=a+b", "tenant").as_deref(), Some("a b"));
        assert_eq!(query("tenant=a%20b", "tenant").as_deref(), Some("a b"));
        assert_eq!(query("tenant=a%2Bb", "tenant").as_deref(), Some("a+b"));
        // Names are decoded before they are compared.
        assert_eq!(query("ten%61nt=x&other=y", "tenant").as_deref(), Some("x"));
        // `;` separates pairs as `&` does; an encoded one is part of a value.
        assert_eq!(query("a=1;tenant=acme;b=2", "tenant").as_deref(), Some("acme"));
        assert_eq!(query("tenant=a%3Bb", "tenant").as_deref(), Some("a;b"));
        // Missing, empty, or a name that only starts alike: none.
        assert_eq!(query("tenants=a&xtenant=b", "tenant"), None);
        assert_eq!(query("tenant=&other=1", "tenant"), None);
        assert_eq!(query("tenant", "tenant"), None);
        assert_eq!(query("", "tenant"), None);
        // Malformed escapes stand for themselves; other bytes are values too.
        assert_eq!(query("tenant=%zz%4", "tenant").as_deref(), Some("%zz%4"));
        assert_eq!(query("tenant=%", "tenant").as_deref(), Some("%"));
        assert_eq!(query("tenant=a=b", "tenant").as_deref(), Some("a=b"));
        assert_eq!(
            query_value("tenant=%FF", "tenant").unwrap().as_deref(),
            Some(&[0xFF][..])
        );
        // Not allocated when nothing is encoded.
        assert!(matches!(
            query_value("tenant=acme", "tenant"),
            Ok(Some(Cow::Borrowed(_)))
        ));
    }

    #[test]
    fn a_query_parameter_named_twice_is_no_value() {
        // Backends take the first (Flask), the last (PHP, Rack) or all (Express): refused.
        for twice in [
            "tenant=a&tenant=b",
            "tenant=a&tenant=a",
            "tenant=R;tenant=A",
            "tenant=R&x=1;tenant=A",
            "ten%61nt=a&tenant=b",
            "tenant=&tenant=acme",
            "tenant&tenant=acme",
            "tenant=acme&tenant",
        ] {
            assert_eq!(query_value(twice, "tenant"), Err(RepeatedParameter), "{twice}");
        }
        // PHP reads `.`, ` ` and `[` in a name as `_`: `api.key` is a second `api_key`.
        for twice in [
            "api_key=fresh&api.key=victim",
            "api_key=fresh&api+key=victim",
            "api_key=fresh&api%20key=victim",
            "api_key=fresh&api[key=victim",
        ] {
            assert_eq!(query_value(twice, "api_key"), Err(RepeatedParameter), "{twice}");
        }
        assert_eq!(query("api.key=victim", "api_key").as_deref(), Some("victim"));
        // Another parameter named twice is not the key's business.
        assert_eq!(query("a=1&a=2&tenant=acme", "tenant").as_deref(), Some("acme"));
    }

    #[test]
    fn a_hostile_query_costs_its_length() {
        // 200 000 parameters before the one keyed by: one pass, found.
        let mut hostile = "a=1&".repeat(200_000);
        hostile.push_str("tenant=acme");
        let started = std::time::Instant::now();
        assert_eq!(query(&hostile, "tenant").as_deref(), Some("acme"));
        let escapes = "%25".repeat(300_000);
        assert_eq!(query(&format!("{escapes}=1"), "tenant"), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    fn cookie(lines: &[&str], name: &str) -> Option<String> {
        cookie_value(lines.iter().map(|line| line.as_bytes()), name)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn cookies_are_read_from_every_line_and_the_first_wins() {
        assert_eq!(cookie(&["session=abc"], "session").as_deref(), Some("abc"));
        assert_eq!(
            cookie(&["a=1; session=abc; b=2"], "session").as_deref(),
            Some("abc")
        );
        // HTTP/2 splits a cookie-string into lines; their order is kept.
        assert_eq!(cookie(&["a=1", "session=abc"], "session").as_deref(), Some("abc"));
        assert_eq!(
            cookie(&["session=one", "session=two"], "session").as_deref(),
            Some("one")
        );
        assert_eq!(
            cookie(&["session=one; session=two"], "session").as_deref(),
            Some("one")
        );
        // Lenient as servers are: no space, extra spaces, a pair without '='.
        assert_eq!(cookie(&["a=1;session=abc"], "session").as_deref(), Some("abc"));
        assert_eq!(
            cookie(&[" junk ;  session = abc ; "], "session").as_deref(),
            Some("abc")
        );
        // Quotes and escapes are spellings: one value.
        assert_eq!(cookie(&["session=\"abc\""], "session").as_deref(), Some("abc"));
        assert_eq!(cookie(&["session=%61bc"], "session").as_deref(), Some("abc"));
        // '+' is not a space in a cookie.
        assert_eq!(cookie(&["session=a+b"], "session").as_deref(), Some("a+b"));
        // Names are case-sensitive; a prefix is not a name; empty is none.
        assert_eq!(cookie(&["Session=abc; sessionid=x"], "session"), None);
        assert_eq!(cookie(&["session="], "session"), None);
        assert_eq!(cookie(&["session=\"\""], "session"), None);
        assert_eq!(cookie(&[], "session"), None);
        assert_eq!(cookie(&[";;;"], "session"), None);
    }

    fn host(value: &str) -> Option<String> {
        host_value(value.as_bytes()).map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn hosts_are_lower_case_without_a_default_port() {
        assert_eq!(host("Example.COM").as_deref(), Some("example.com"));
        assert_eq!(host("example.com:80").as_deref(), Some("example.com"));
        assert_eq!(host("example.com:443").as_deref(), Some("example.com"));
        assert_eq!(host("example.com.").as_deref(), Some("example.com"));
        assert_eq!(host("example.com:").as_deref(), Some("example.com"));
        assert_eq!(host("example.com:8080").as_deref(), Some("example.com:8080"));
        assert_eq!(host("[2001:DB8::1]:443").as_deref(), Some("[2001:db8::1]"));
        assert_eq!(host("[2001:db8::80]").as_deref(), Some("[2001:db8::80]"));
        assert_eq!(host(""), None);
        assert_eq!(host(":80"), None);
        assert!(matches!(host_value(b"example.com"), Some(Cow::Borrowed(_))));
    }
}
