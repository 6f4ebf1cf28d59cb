//! Header rewriting between client and backend.
//!
//! Hop-by-hop headers describe one connection, not the message, and must not be forwarded
//! (RFC 9110 section 7.6.1): `Connection` itself, every header named in a `Connection` line,
//! and the well-known ones (`Keep-Alive`, `Proxy-Connection`, `TE`, `Transfer-Encoding`,
//! `Upgrade`, plus the `Proxy-Authenticate`/`Proxy-Authorization` pair meant for the next
//! proxy, RFC 9110 section 11.7). The names listed in `Connection` are read *before*
//! `Connection` is removed. An upgrade (RFC 9110 section 7.8, e.g. WebSocket) is the one case
//! where `Connection: upgrade` and `Upgrade` must reach the other side, so they are put back
//! for upgrade requests and `101 Switching Protocols` responses.
//!
//! The forwarding headers tell the backend who called and how ([`set_forwarded`]). Those that
//! identify the client are always the gateway's own decision, whatever the client sent:
//! `X-Real-IP` is the address the rules used, and `Forwarded` (RFC 7239) from an untrusted peer
//! is replaced by the gateway's element; lists (`X-Forwarded-For`, `Forwarded`) keep what a
//! trusted proxy wrote before it and end with the gateway's entry. The other headers that
//! claim something about the client or the original request (`X-Forwarded-Port`,
//! `X-Forwarded-Prefix`, `True-Client-IP`, `CF-Connecting-IP`, ... see [`is_client_claim`])
//! are kept from a trusted proxy, which wrote them, and removed from anyone else, who chose
//! them.
//!
//! Header names with `_` are the `-` spelling to CGI-style backends (PHP, WSGI, Rack:
//! `X_API_Key` and `X-API-Key` are both `HTTP_X_API_KEY`), so a client could send a second,
//! unchecked copy of a header the gateway keys by or writes itself. As nginx does by default
//! (`underscores_in_headers off`), they are not forwarded ([`UnderscoreHeaders`]).

use std::cell::RefCell;
use std::net::IpAddr;

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::request_id::X_REQUEST_ID;
use crate::gate::identity::{X_FORWARDED_FOR, X_FORWARDED_FOR_NAME};
use crate::header_arena;
use crate::rules::key::ipv4_text;
use crate::rules::table::METHOD_OVERRIDE_HEADERS;

/// `X-Forwarded-Proto`: the scheme the client used.
pub static X_FORWARDED_PROTO: HeaderName = X_FORWARDED_PROTO_NAME;
/// `X-Forwarded-Host`: the `Host` the client asked for.
pub static X_FORWARDED_HOST: HeaderName = X_FORWARDED_HOST_NAME;
/// `X-Real-IP`: the client address the gateway decided on (nginx's name for it).
#[cfg(any(test, feature = "testing"))]
pub static X_REAL_IP: HeaderName = X_REAL_IP_NAME;

// The names above as constants, for the inserts that take a name by value (see
// `X_FORWARDED_FOR_NAME`).
#[allow(clippy::declare_interior_mutable_const)]
const X_FORWARDED_PROTO_NAME: HeaderName = HeaderName::from_static("x-forwarded-proto");
#[allow(clippy::declare_interior_mutable_const)]
const X_FORWARDED_HOST_NAME: HeaderName = HeaderName::from_static("x-forwarded-host");
#[allow(clippy::declare_interior_mutable_const)]
const X_REAL_IP_NAME: HeaderName = HeaderName::from_static("x-real-ip");

/// Hop-by-hop headers that are always dropped, whether or not `Connection` names them.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    // RFC 9113 section 3.1 (RFC 7540 section 3.2.1): connection-specific, the h2c upgrade's.
    HeaderName::from_static("http2-settings"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// `UNDERSCORE_HEADERS`: what becomes of request headers with `_` in their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnderscoreHeaders {
    /// Not forwarded (the default; nginx's `underscores_in_headers off`).
    Drop,
    /// Forwarded, except an underscore spelling of a header the gateway writes itself (always
    /// dropped) or keys budgets by (the request is refused: the backend could read either).
    Forward,
}

/// `METHOD_OVERRIDE`: what becomes of the headers that ask a backend to read a request as
/// another method (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`:
/// [`crate::rules::table::METHOD_OVERRIDE_HEADERS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodOverride {
    /// Forwarded, and the request matches a route of the method it names as well as of its
    /// own (the default): whichever the backend believes, the request was counted as it.
    Meter,
    /// Removed before the request is decided: the backend reads the method the gateway
    /// counted, and nothing else.
    Strip,
}

impl MethodOverride {
    /// Parse `meter` or `strip`.
    pub fn parse(value: &str) -> Option<MethodOverride> {
        match value {
            "meter" => Some(MethodOverride::Meter),
            "strip" => Some(MethodOverride::Strip),
            _ => None,
        }
    }

    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            MethodOverride::Meter => "meter",
            MethodOverride::Strip => "strip",
        }
    }

    /// Under `strip`, remove the override headers from `headers`: one pass over the names
    /// finds nothing to do in the common case.
    pub fn apply(self, headers: &mut HeaderMap) {
        if self == MethodOverride::Strip && headers.keys().any(|name| METHOD_OVERRIDE_HEADERS.contains(name))
        {
            for name in &METHOD_OVERRIDE_HEADERS {
                headers.remove(name);
            }
        }
    }
}

impl UnderscoreHeaders {
    /// Parse `drop` or `forward`.
    pub fn parse(value: &str) -> Option<UnderscoreHeaders> {
        match value {
            "drop" => Some(UnderscoreHeaders::Drop),
            "forward" => Some(UnderscoreHeaders::Forward),
            _ => None,
        }
    }

    /// The value as written in `UNDERSCORE_HEADERS`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnderscoreHeaders::Drop => "drop",
            UnderscoreHeaders::Forward => "forward",
        }
    }
}

/// The first of `names` (the headers budgets are keyed by) that `headers` also carries spelled
/// with `_` for `-`: `X_API_Key` beside a `KEY_BY=header:X-API-Key`.
pub fn underscore_alias<'a>(
    headers: &HeaderMap,
    mut names: impl Iterator<Item = &'a HeaderName>,
) -> Option<&'a HeaderName> {
    if !headers.keys().any(|name| name.as_str().contains('_')) {
        return None;
    }
    names.find(|name| {
        headers
            .keys()
            .any(|alias| alias != *name && same_with_underscores(name.as_str(), alias.as_str()))
    })
}

/// Whether `alias` is `name` with some of its `-` written `_` (both lower case).
fn same_with_underscores(name: &str, alias: &str) -> bool {
    name.len() == alias.len()
        && name
            .bytes()
            .zip(alias.bytes())
            .all(|(n, a)| n == a || (n == b'-' && a == b'_'))
}

/// Headers that claim something about the client or the request as it reached the first
/// proxy. Believed from a trusted proxy; from anyone else, a forgery that could move the
/// backend's idea of the client (`True-Client-IP`, `CF-Connecting-IP`, ...) or of the URL it
/// answers for (`X-Forwarded-Port`, `X-Forwarded-Prefix`, ...).
pub fn is_client_claim(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "x-forwarded-port"
            | "x-forwarded-prefix"
            | "x-forwarded-server"
            | "x-forwarded-ssl"
            | "x-forwarded-scheme"
            | "x-forwarded-protocol"
            | "x-forwarded-uri"
            | "x-forwarded-method"
            | "x-original-forwarded-for"
            | "x-original-uri"
            | "x-original-url"
            | "x-rewrite-url"
            | "front-end-https"
            | "true-client-ip"
            | "cf-connecting-ip"
            | "cf-connecting-ipv6"
            | "fastly-client-ip"
            | "x-client-ip"
            | "x-cluster-client-ip"
            | "x-envoy-external-address"
    )
}

/// Whether a header with `_` in its name is the underscore spelling of one the gateway writes
/// (or removes) itself, which is never forwarded whatever `UNDERSCORE_HEADERS` says.
fn is_managed_alias(name: &str) -> bool {
    const MANAGED: [&str; 9] = [
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-real-ip",
        "x-request-id",
        "forwarded",
        // The method-override headers (`METHOD_OVERRIDE`): the gate reads, or `strip`
        // removes, only their `-` spellings, and Rack or PHP would believe an
        // `X_HTTP_Method_Override` as well.
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ];
    MANAGED.iter().any(|managed| same_with_underscores(managed, name))
        || HeaderName::from_bytes(name.replace('_', "-").as_bytes()).is_ok_and(|name| is_client_claim(&name))
}

/// Remove what a request's headers must not carry to the backend: from an untrusted peer the
/// client claims ([`is_client_claim`]); under `UNDERSCORE_HEADERS=drop` every name with `_`,
/// under `forward` those that spell a header the gateway writes. One pass over the names
/// finds nothing to do in the common case.
pub fn remove_unbelieved(headers: &mut HeaderMap, peer_is_trusted: bool, underscore: UnderscoreHeaders) {
    let doomed = |name: &HeaderName| {
        (!peer_is_trusted && is_client_claim(name))
            || (name.as_str().contains('_')
                && (underscore == UnderscoreHeaders::Drop || is_managed_alias(name.as_str())))
    };
    if !headers.keys().any(doomed) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|name| doomed(name)).cloned().collect();
    for name in names {
        headers.remove(&name);
    }
}

/// Does this message ask for (or, on a 101, accept) a protocol upgrade?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && list_tokens(headers, &header::CONNECTION).any(|token| token.eq_ignore_ascii_case("upgrade"))
}

/// Remove every hop-by-hop header. With `keep_upgrade`, `Upgrade` survives and
/// `Connection: upgrade` is put back, so the upgrade handshake reaches the other side.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // The common case: no hop-by-hop header at all (without `Connection`, no other name can
    // be one). One pass over the names, compared without hashing, instead of a hashed
    // `remove` per name.
    if !keep_upgrade && !headers.keys().any(is_hop_by_hop) {
        return;
    }
    // Names listed in Connection, read before Connection itself goes.
    let listed: Vec<HeaderName> = list_tokens(headers, &header::CONNECTION)
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP) {
        if !(keep_upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// What one pass over a request's header names found: the checks and filters that look for
/// names most requests never carry (`Transfer-Encoding`, `Upgrade`, the hop-by-hop ones, a `_`,
/// a method override, a client claim, an `X-Request-Id`) each skip their own pass or hashed lookup when the scan
/// saw none. Read once, before anything is removed: a flag means "may be there" (a name removed
/// since leaves it set, which costs only the check it would have cost anyway), and the names the
/// gateway adds afterwards (`X-Request-Id`, the forwarding headers) are none of these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HeadScan {
    /// A `Transfer-Encoding` line.
    pub(crate) transfer_encoding: bool,
    /// An `Upgrade` line.
    pub(crate) upgrade: bool,
    /// A hop-by-hop name ([`is_hop_by_hop`]; `Upgrade` among them).
    pub(crate) hop_by_hop: bool,
    /// A name with `_` in it.
    pub(crate) underscore: bool,
    /// One of the method-override headers.
    pub(crate) method_override: bool,
    /// A client claim ([`is_client_claim`]).
    pub(crate) client_claim: bool,
    /// An `X-Request-Id` line.
    pub(crate) request_id: bool,
    /// An `X-Forwarded-For` line.
    pub(crate) forwarded_for: bool,
    /// A `traceparent` line (W3C Trace Context): read only when traces are on.
    pub(crate) traceparent: bool,
}

impl HeadScan {
    /// Scan `headers`' names once.
    pub(crate) fn of(headers: &HeaderMap) -> HeadScan {
        let mut scan = HeadScan::default();
        for name in headers.keys() {
            if is_hop_by_hop(name) {
                scan.hop_by_hop = true;
                scan.transfer_encoding |= name == header::TRANSFER_ENCODING;
                scan.upgrade |= name == header::UPGRADE;
            } else if is_client_claim(name) {
                scan.client_claim = true;
            } else if METHOD_OVERRIDE_HEADERS.contains(name) {
                scan.method_override = true;
            } else if name == X_REQUEST_ID {
                scan.request_id = true;
            } else if name == X_FORWARDED_FOR {
                scan.forwarded_for = true;
            } else if name == crate::telemetry::trace::TRACEPARENT {
                scan.traceparent = true;
            } else if name.as_str().contains('_') {
                scan.underscore = true;
            }
        }
        scan
    }
}

/// `Upgrade`, or one of the names that are always hop-by-hop (`Connection` among them).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    // A `match` on the (lower-case) name: a length switch, then one comparison at most.
    matches!(
        name.as_str(),
        "upgrade"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "http2-settings"
    )
}

/// The comma-separated tokens of every `name` line (`Connection`, `Upgrade`); lines that are
/// not visible ASCII name nothing.
pub fn list_tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

/// The hop a request came in on, as the forwarding headers describe it.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The TCP peer (IPv4-mapped addresses as IPv4).
    pub peer: IpAddr,
    /// Whether `peer` is one of `TRUSTED_PROXIES`: only then are its forwarding headers kept.
    pub peer_is_trusted: bool,
    /// The client address the gateway decided on (the peer, or from a trusted
    /// `X-Forwarded-For`).
    pub client: IpAddr,
    /// The host the request is for (see [`super::strict::target_host`]).
    pub host: Option<&'a HeaderValue>,
    /// The request came over TLS: the scheme is `https`.
    pub tls: bool,
}

impl Hop<'_> {
    /// The scheme the client used to reach the gateway.
    fn proto(&self) -> &'static str {
        match self.tls {
            true => "https",
            false => "http",
        }
    }
}

/// Set the forwarding headers for the backend:
///
/// - `X-Forwarded-For`: `peer` appended (all earlier lines folded into one list);
/// - `X-Forwarded-Proto`, `X-Forwarded-Host`: a trusted proxy's are kept, since it saw the
///   original request; anyone else's are overwritten (`http` or `https`, and the host);
/// - `X-Real-IP`: `client`, always ours;
/// - `Forwarded` (RFC 7239): our element `for=peer;proto=http;host=host` (`https` over TLS) appended to a trusted
///   proxy's list; anyone else's lines are dropped and ours is the only element.
#[cfg(any(test, feature = "testing"))]
pub fn set_forwarded(headers: &mut HeaderMap, hop: &Hop<'_>) {
    set_forwarded_scanned(headers, hop, true);
}

/// Set the forwarding headers for the backend, as `set_forwarded` (the tests' and fuzzers'
/// entry) says, for a caller whose [`HeadScan`] of the names tells whether the request may
/// carry an `X-Forwarded-For` (`false`: it has none, and none is looked up).
pub(crate) fn set_forwarded_scanned(headers: &mut HeaderMap, hop: &Hop<'_>, may_have_forwarded_for: bool) {
    let values =
        match hop.peer_is_trusted || (may_have_forwarded_for && headers.contains_key(&X_FORWARDED_FOR)) {
            true => forwarding_values(headers, hop),
            // Then the values depend on the hop alone: a thread's last ones are likely the same
            // (the same client on the same keep-alive connection).
            false => LAST_HOP
                .try_with(|last| {
                    let mut last = last.borrow_mut();
                    match &*last {
                        Some(last) if last.is(hop) => last.values.clone(),
                        _ => {
                            let values = forwarding_values(headers, hop);
                            *last = Some(LastHop::new(hop, values.clone()));
                            values
                        }
                    }
                })
                .unwrap_or_else(|_| forwarding_values(headers, hop)),
        };
    let ForwardingValues {
        forwarded_for,
        real_ip,
        forwarded,
    } = values;
    if let Some(value) = forwarded_for {
        headers.insert(X_FORWARDED_FOR_NAME, value);
    }
    if !(hop.peer_is_trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO_NAME, HeaderValue::from_static(hop.proto()));
    }
    if !(hop.peer_is_trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        match hop.host {
            Some(host) => headers.insert(X_FORWARDED_HOST_NAME, host.clone()),
            None => headers.remove(&X_FORWARDED_HOST),
        };
    }
    if let Some(value) = real_ip {
        headers.insert(X_REAL_IP_NAME, value);
    }
    match forwarded {
        Some(value) => headers.insert(header::FORWARDED, value),
        None => headers.remove(header::FORWARDED),
    };
}

/// The values of `X-Forwarded-For`, `X-Real-IP` and `Forwarded` for one request (`None`: not
/// a valid value, which the text written never is).
#[derive(Clone)]
struct ForwardingValues {
    forwarded_for: Option<HeaderValue>,
    real_ip: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
}

/// The forwarding values of a thread's last request from an untrusted peer that sent no
/// `X-Forwarded-For`, and what they were made of.
struct LastHop {
    peer: IpAddr,
    client: IpAddr,
    tls: bool,
    host: Option<HeaderValue>,
    values: ForwardingValues,
}

impl LastHop {
    fn new(hop: &Hop<'_>, values: ForwardingValues) -> LastHop {
        LastHop {
            peer: hop.peer,
            client: hop.client,
            tls: hop.tls,
            host: hop.host.cloned(),
            values,
        }
    }

    /// Whether its values are those of `hop`.
    fn is(&self, hop: &Hop<'_>) -> bool {
        self.peer == hop.peer
            && self.client == hop.client
            && self.tls == hop.tls
            && self.host.as_ref() == hop.host
    }
}

thread_local! {
    static LAST_HOP: RefCell<Option<LastHop>> = const { RefCell::new(None) };
}

/// The forwarding values for `hop`, from the request's own lines (see [`set_forwarded`]).
fn forwarding_values(headers: &HeaderMap, hop: &Hop<'_>) -> ForwardingValues {
    // Formatted once: it is written into three headers. The values are cut from the thread's
    // header buffer (crate::header_arena): no allocation of their own.
    let mut peer_text = IpText::new();
    let peer = peer_text.format(hop.peer);
    let mut earlier = false;
    let forwarded_for = header_arena::value(|value| {
        for line in headers.get_all(&X_FORWARDED_FOR) {
            if let Ok(line) = line.to_str() {
                value.put_slice(line.trim().as_bytes());
                value.put_slice(b", ");
                earlier = true;
            }
        }
        value.put_slice(peer.as_bytes());
    });
    let real_ip = match (hop.client == hop.peer, &forwarded_for) {
        // The same text: one value, shared.
        (true, Some(peer_only)) if !earlier => Some(peer_only.clone()),
        (true, _) => header_arena::copy(peer.as_bytes()),
        (false, _) => header_arena::copy(IpText::new().format(hop.client).as_bytes()),
    };
    // Visible ASCII throughout (lines that are not are skipped), so this always succeeds.
    let forwarded = header_arena::value(|list| forwarded(list, headers, hop, peer));
    ForwardingValues {
        forwarded_for,
        real_ip,
        forwarded,
    }
}

/// The `Forwarded` list to send, into `list`: a trusted peer's elements, then ours (`peer` is
/// the peer's address as text).
fn forwarded(list: &mut BytesMut, headers: &HeaderMap, hop: &Hop<'_>, peer: &str) {
    if hop.peer_is_trusted {
        for line in headers.get_all(header::FORWARDED) {
            if let Ok(line) = line.to_str() {
                let line = line.trim();
                if !line.is_empty() {
                    list.put_slice(line.as_bytes());
                    list.put_slice(b", ");
                }
            }
        }
    }
    push_element(list, hop, peer);
}

/// `for=...;proto=http;host=...` (RFC 7239 section 4): an IPv6 node is bracketed and quoted,
/// a host that is not a token (it has a port, say) quoted.
fn push_element(element: &mut BytesMut, hop: &Hop<'_>, peer: &str) {
    match hop.peer {
        IpAddr::V4(_) => {
            element.put_slice(b"for=");
            element.put_slice(peer.as_bytes());
        }
        IpAddr::V6(_) => {
            element.put_slice(b"for=\"[");
            element.put_slice(peer.as_bytes());
            element.put_slice(b"]\"");
        }
    }
    element.put_slice(b";proto=");
    element.put_slice(hop.proto().as_bytes());
    if let Some(host) = hop.host.and_then(|host| host.to_str().ok())
        && !host.is_empty()
    {
        element.put_slice(b";host=");
        if host.bytes().all(is_tchar) {
            element.put_slice(host.as_bytes());
        } else {
            element.put_u8(b'"');
            if host.contains(['"', '\\']) {
                for byte in host.bytes() {
                    if matches!(byte, b'"' | b'\\') {
                        element.put_u8(b'\\');
                    }
                    element.put_u8(byte);
                }
            } else {
                // The usual reason to quote: a port (`:`).
                element.put_slice(host.as_bytes());
            }
            element.put_u8(b'"');
        }
    }
}

/// An address as text, IPv4 written digit by digit into a buffer on the stack: `core::fmt`
/// (`to_string`) costs about ten times as much, on every request. IPv6 goes through `fmt`.
struct IpText {
    /// `255.255.255.255` at most.
    v4: [u8; 15],
    v6: String,
}

impl IpText {
    fn new() -> Self {
        IpText {
            v4: [0; 15],
            v6: String::new(),
        }
    }

    /// `address` as `Display` writes it.
    fn format(&mut self, address: IpAddr) -> &str {
        match address {
            IpAddr::V4(v4) => ipv4_text(v4, &mut self.v4),
            IpAddr::V6(v6) => {
                self.v6 = v6.to_string();
                &self.v6
            }
        }
    }
}

/// A `token` character (RFC 9110 section 5.6.2).
pub fn is_tchar(byte: u8) -> bool {
    matches!(byte, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'!' | b'#' | b'$' | b'%' | b'&'
        | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn one_scan_sees_each_kind_of_name_and_nothing_in_an_ordinary_head() {
        let ordinary = headers(&[("host", "a"), ("user-agent", "h2load"), ("accept", "*/*")]);
        assert_eq!(HeadScan::of(&ordinary), HeadScan::default());
        let scan = |name: &str| HeadScan::of(&headers(&[("host", "a"), (name, "x")]));
        assert!(scan("transfer-encoding").transfer_encoding && scan("transfer-encoding").hop_by_hop);
        assert!(scan("upgrade").upgrade && scan("upgrade").hop_by_hop);
        assert!(scan("keep-alive").hop_by_hop && !scan("keep-alive").upgrade);
        assert!(scan("connection").hop_by_hop);
        assert!(scan("x_api_key").underscore);
        assert!(scan("x-http-method-override").method_override);
        assert!(scan("x-method-override").method_override);
        assert!(scan("true-client-ip").client_claim);
        assert!(scan("x-request-id").request_id);
        assert!(scan("x-forwarded-for").forwarded_for);
        assert!(scan("traceparent").traceparent && !scan("tracestate").traceparent);
        // Each of those names is seen whatever comes before it.
        let many = headers(&[
            ("x-request-id", "1"),
            ("upgrade", "websocket"),
            ("x_real_ip", "1"),
            ("x-forwarded-port", "1"),
            ("x-http-method", "GET"),
            ("x-forwarded-for", "192.0.2.9"),
        ]);
        let scan = HeadScan::of(&many);
        assert!(scan.request_id && scan.upgrade && scan.hop_by_hop && scan.underscore);
        assert!(scan.client_claim && scan.method_override && !scan.transfer_encoding);
        assert!(scan.forwarded_for);
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for address in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "127.0.0.1",
            "203.0.113.7",
            "2001:db8::1",
            "::ffff:1.2.3.4",
        ] {
            let address: IpAddr = address.parse().unwrap();
            assert_eq!(IpText::new().format(address), address.to_string());
        }
        for octet in 0..=255u8 {
            let address = IpAddr::from([octet, 0, 10, octet]);
            assert_eq!(IpText::new().format(address), address.to_string());
        }
    }

    #[test]
    fn the_name_match_agrees_with_the_list() {
        for name in HOP_BY_HOP.iter().chain([&header::UPGRADE]) {
            assert!(is_hop_by_hop(name), "{name}");
        }
        for name in [header::HOST, header::ACCEPT, header::TRAILER, X_REAL_IP.clone()] {
            assert!(!is_hop_by_hop(&name), "{name}");
        }
        let tchars: Vec<u8> = (0..=255u8).filter(|&b| is_tchar(b)).collect();
        let expected: Vec<u8> = (0..=255u8)
            .filter(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
            .collect();
        assert_eq!(tchars, expected);
    }

    #[test]
    fn without_hop_by_hop_headers_nothing_changes() {
        let mut map = headers(&[("host", "example.com"), ("x-keep", "1"), ("accept", "*/*")]);
        let before = map.clone();
        strip_hop_by_hop(&mut map, false);
        assert_eq!(map, before);
        // Upgrade alone (no Connection) still goes.
        let mut map = headers(&[("upgrade", "websocket"), ("x-keep", "1")]);
        strip_hop_by_hop(&mut map, false);
        assert_eq!(map.keys().map(HeaderName::as_str).collect::<Vec<_>>(), ["x-keep"]);
    }

    #[test]
    fn connection_listed_and_standard_hop_by_hop_headers_go() {
        let mut map = headers(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "x-other"),
            ("x-secret-hop", "1"),
            ("x-other", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic x"),
            ("upgrade", "websocket"),
            ("x-end-to-end", "kept"),
        ]);
        strip_hop_by_hop(&mut map, false);
        let left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-end-to-end"]);
    }

    #[test]
    fn upgrades_keep_their_handshake() {
        let mut map = headers(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
        ]);
        assert!(is_upgrade(&map));
        strip_hop_by_hop(&mut map, true);
        assert_eq!(map["connection"], "upgrade");
        assert_eq!(map["upgrade"], "websocket");
        assert!(!map.contains_key("x-hop"));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
    }

    fn hop<'a>(peer: &str, trusted: bool, client: &str, host: Option<&'a HeaderValue>) -> Hop<'a> {
        Hop {
            peer: peer.parse().unwrap(),
            peer_is_trusted: trusted,
            client: client.parse().unwrap(),
            host,
            tls: false,
        }
    }

    #[test]
    fn forwarded_headers() {
        let host = HeaderValue::from_static("example.com");
        let mut map = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(&mut map, &hop("10.0.0.1", true, "2.2.2.2", Some(&host)));
        assert_eq!(map["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["x-forwarded-host"], "example.com");
        assert_eq!(map["x-real-ip"], "2.2.2.2");

        let mut map = headers(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil"),
            ("x-real-ip", "6.6.6.6"),
        ]);
        set_forwarded(&mut map, &hop("203.0.113.1", false, "203.0.113.1", Some(&host)));
        assert_eq!(map["x-forwarded-for"], "203.0.113.1");
        assert_eq!(map["x-forwarded-proto"], "http");
        assert_eq!(map["x-forwarded-host"], "example.com");
        assert_eq!(map["x-real-ip"], "203.0.113.1");
        assert_eq!(map.get_all("x-real-ip").iter().count(), 1);
    }

    #[test]
    fn told_by_the_scan_the_forwarding_headers_are_the_same() {
        let host = HeaderValue::from_static("example.com");
        for lines in [
            &[("accept", "*/*")][..],
            &[("x-forwarded-for", "1.1.1.1"), ("x-forwarded-for", "2.2.2.2")][..],
            &[("x-forwarded-proto", "https"), ("forwarded", "for=5.6.7.8")][..],
        ] {
            for (peer, trusted) in [("10.0.0.1", true), ("203.0.113.1", false), ("203.0.113.2", false)] {
                let hop = hop(peer, trusted, peer, Some(&host));
                let (mut looked_up, mut scanned) = (headers(lines), headers(lines));
                set_forwarded(&mut looked_up, &hop);
                let scan = HeadScan::of(&scanned);
                set_forwarded_scanned(&mut scanned, &hop, scan.forwarded_for);
                assert_eq!(looked_up, scanned, "{lines:?} from {peer}");
            }
        }
    }

    #[test]
    fn forwarded_from_an_untrusted_peer_is_replaced() {
        let host = HeaderValue::from_static("example.com");
        let mut map = headers(&[
            ("forwarded", "for=1.2.3.4;proto=https"),
            ("forwarded", "for=5.6.7.8"),
        ]);
        set_forwarded(&mut map, &hop("203.0.113.1", false, "203.0.113.1", Some(&host)));
        assert_eq!(map.get_all("forwarded").iter().count(), 1);
        assert_eq!(map["forwarded"], "for=203.0.113.1;proto=http;host=example.com");
    }

    #[test]
    fn a_threads_last_values_are_reused_only_for_the_same_hop() {
        let (a, b) = (
            HeaderValue::from_static("a.example"),
            HeaderValue::from_static("b.example:8080"),
        );
        let cases = [
            (
                hop("203.0.113.1", false, "203.0.113.1", Some(&a)),
                "203.0.113.1",
                "for=203.0.113.1;proto=http;host=a.example",
            ),
            (
                hop("203.0.113.1", false, "203.0.113.1", Some(&a)),
                "203.0.113.1",
                "for=203.0.113.1;proto=http;host=a.example",
            ),
            (
                hop("203.0.113.1", false, "203.0.113.1", Some(&b)),
                "203.0.113.1",
                "for=203.0.113.1;proto=http;host=\"b.example:8080\"",
            ),
            (
                hop("203.0.113.1", false, "203.0.113.1", None),
                "203.0.113.1",
                "for=203.0.113.1;proto=http",
            ),
            (
                hop("203.0.113.2", false, "203.0.113.2", None),
                "203.0.113.2",
                "for=203.0.113.2;proto=http",
            ),
            (
                hop("203.0.113.2", false, "198.51.100.7", None),
                "198.51.100.7",
                "for=203.0.113.2;proto=http",
            ),
        ];
        for (hop, real_ip, forwarded) in cases {
            let mut map = HeaderMap::new();
            set_forwarded(&mut map, &hop);
            assert_eq!(map["x-forwarded-for"], hop.peer.to_string().as_str());
            assert_eq!(map["x-real-ip"], real_ip);
            assert_eq!(map["forwarded"], forwarded);
            assert_eq!(map.get("x-forwarded-host"), hop.host);
        }
        let mut over_tls = hop("203.0.113.2", false, "198.51.100.7", None);
        over_tls.tls = true;
        let mut map = HeaderMap::new();
        set_forwarded(&mut map, &over_tls);
        assert_eq!(map["forwarded"], "for=203.0.113.2;proto=https");
        // A client's own list is never served from the last values.
        let mut map = headers(&[("x-forwarded-for", "192.0.2.9")]);
        set_forwarded(&mut map, &over_tls);
        assert_eq!(map["x-forwarded-for"], "192.0.2.9, 203.0.113.2");
    }

    #[test]
    fn forwarded_from_a_trusted_peer_gets_our_element_appended() {
        let host = HeaderValue::from_static("example.com:8080");
        let mut map = headers(&[
            ("forwarded", "for=198.51.100.7;proto=https"),
            ("forwarded", "for=\"[2001:db8::9]\""),
        ]);
        set_forwarded(&mut map, &hop("2001:db8::1", true, "198.51.100.7", Some(&host)));
        assert_eq!(
            map["forwarded"],
            "for=198.51.100.7;proto=https, for=\"[2001:db8::9]\", \
             for=\"[2001:db8::1]\";proto=http;host=\"example.com:8080\""
        );
        // No host known: no host= parameter.
        let mut map = HeaderMap::new();
        set_forwarded(&mut map, &hop("192.0.2.1", false, "192.0.2.1", None));
        assert_eq!(map["forwarded"], "for=192.0.2.1;proto=http");
    }

    #[test]
    fn over_tls_the_proto_is_https_unless_a_trusted_proxy_said_otherwise() {
        let host = HeaderValue::from_static("example.com");
        let tls = |peer, trusted| Hop {
            tls: true,
            ..hop(peer, trusted, peer, Some(&host))
        };
        let mut map = headers(&[("x-forwarded-proto", "http"), ("forwarded", "proto=http")]);
        set_forwarded(&mut map, &tls("203.0.113.1", false));
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["forwarded"], "for=203.0.113.1;proto=https;host=example.com");
        // A trusted proxy saw the original scheme: its word stands, our element says ours.
        let mut map = headers(&[("x-forwarded-proto", "http")]);
        set_forwarded(&mut map, &tls("10.0.0.1", true));
        assert_eq!(map["x-forwarded-proto"], "http");
        assert_eq!(map["forwarded"], "for=10.0.0.1;proto=https;host=example.com");
    }
}
