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

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::identity::X_FORWARDED_FOR;

/// `X-Forwarded-Proto`: the scheme the client used.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`: the `Host` the client asked for.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Hop-by-hop headers that are always dropped, whether or not `Connection` names them.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Does this message ask for (or, on a 101, accept) a protocol upgrade?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|token| token.eq_ignore_ascii_case("upgrade"))
}

/// Remove every hop-by-hop header. With `keep_upgrade`, `Upgrade` survives and
/// `Connection: upgrade` is put back, so the upgrade handshake reaches the other side.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Names listed in Connection, read before Connection itself goes.
    let listed: Vec<HeaderName> = connection_tokens(headers)
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

/// The comma-separated tokens of every `Connection` line.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

/// Set the `X-Forwarded-*` headers for the backend. `peer` is appended to
/// `X-Forwarded-For` (all earlier lines folded into one list). `X-Forwarded-Proto` and
/// `X-Forwarded-Host` from a trusted proxy are kept, since it saw the original request;
/// from anyone else they are overwritten.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: IpAddr,
    peer_is_trusted: bool,
    host: Option<&HeaderValue>,
) {
    let mut forwarded_for = String::new();
    for line in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(line) = line.to_str() {
            forwarded_for.push_str(line.trim());
            forwarded_for.push_str(", ");
        }
    }
    forwarded_for.push_str(&peer.to_string());
    if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    if !(peer_is_trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !(peer_is_trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        match host {
            Some(host) => headers.insert(&X_FORWARDED_HOST, host.clone()),
            None => headers.remove(&X_FORWARDED_HOST),
        };
    }
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

    #[test]
    fn forwarded_headers() {
        let host = HeaderValue::from_static("example.com");
        let mut map = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(&mut map, "10.0.0.1".parse().unwrap(), true, Some(&host));
        assert_eq!(map["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["x-forwarded-host"], "example.com");

        let mut map = headers(&[("x-forwarded-proto", "https"), ("x-forwarded-host", "evil")]);
        set_forwarded(&mut map, "203.0.113.1".parse().unwrap(), false, Some(&host));
        assert_eq!(map["x-forwarded-for"], "203.0.113.1");
        assert_eq!(map["x-forwarded-proto"], "http");
        assert_eq!(map["x-forwarded-host"], "example.com");
    }
}
