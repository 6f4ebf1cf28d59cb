//! Who is calling: the key a client's budget is filed under.
//!
//! The key is the TCP peer's IP address (never IP:port: a client opens as many ports as it
//! likes). Only when the peer is one of `TRUSTED_PROXIES` is `X-Forwarded-For` believed, and
//! then it is walked right to left (each proxy appends the address it received from, so the
//! rightmost entries are the ones our own proxies wrote) until the first address that is not
//! a trusted proxy: the client as seen by our outermost proxy. Entries left of it were written
//! by the client itself and are ignored, so a client can never choose its own key.
//!
//! Every element the walk reaches was written by a trusted proxy (the one it just stepped to),
//! about the peer that proxy saw, unless a proxy passed on what it was sent. An element there
//! that is not an address (`\xff`, `unknown`, `bogus`) names no client, and taking the trusted
//! proxy for the client instead would file the request under the proxy's budget, which
//! operators commonly exempt (`EXEMPT=10.0.0.0/8` beside `TRUSTED_PROXIES=10.0.0.0/8`): a
//! client able to put one bad byte where the walk stops would never be limited. So the request
//! is refused ([`Unreadable`], a `400` on every door). Elements are read one by one from the
//! header's bytes, so a malformed one left of the client's address (the client's own
//! `X-Forwarded-For: \xff`, with the proxy's address appended) is never reached and changes
//! nothing. Empty elements (`a, , b`) are passed over, as RFC 9110 section 5.6.1 asks.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::HeaderName;
use ipnet::IpNet;

/// `X-Forwarded-For` (de facto standard, see RFC 7239 section 4 for its successor).
pub static X_FORWARDED_FOR: HeaderName = X_FORWARDED_FOR_NAME;

/// [`X_FORWARDED_FOR`] as a constant, for the inserts that take a name by value: a copy of a
/// constant is a few stores, where a static's name is cloned by a call (about 36 instructions,
/// on every request: docs/benchmarks.md, part 21). Never mutated, as any `HeaderName`.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const X_FORWARDED_FOR_NAME: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Works out client keys from the peer address and, for trusted peers, `X-Forwarded-For`.
#[derive(Debug, Clone, Default)]
pub struct ClientIdentity {
    /// `TRUSTED_PROXIES`.
    trusted: Vec<IpNet>,
}

impl ClientIdentity {
    /// Believe `X-Forwarded-For` only from peers inside `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        ClientIdentity { trusted }
    }

    /// Is this address one of our proxies?
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address for a request that came from `peer` with `headers`: the peer
    /// itself, or for a trusted peer the rightmost address of `X-Forwarded-For` that is not a
    /// trusted proxy's (the leftmost when all are). An element the walk reaches that is not an
    /// address is an error: never the trusted peer instead.
    ///
    /// With it, whether `peer` is trusted: read once, for the forwarding headers a trusted
    /// peer's request keeps and the tiers it may name.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Result<(IpAddr, bool), Unreadable> {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return Ok((peer, false));
        }
        // Several header lines are one list, in order (RFC 9110 section 5.3). Read as bytes,
        // element by element: a byte that is not text in one element says nothing about the
        // others.
        let mut nearest_trusted = peer;
        for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            for element in line.as_bytes().rsplit(|&byte| byte == b',') {
                let element = element.trim_ascii();
                if element.is_empty() {
                    continue;
                }
                match parse_entry(element) {
                    Some(ip) if self.is_trusted(ip) => nearest_trusted = ip,
                    Some(ip) => return Ok((ip, true)),
                    None => return Err(Unreadable::of(element)),
                }
            }
        }
        // Every hop is a trusted proxy: the leftmost one is the best we know.
        Ok((nearest_trusted, true))
    }
}

/// An `X-Forwarded-For` element where the client's address was to be, that is not an address:
/// the request is refused (`400`) rather than filed under the trusted proxy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("X-Forwarded-For: {element} is not an IP address, where the trusted proxies' chain names the client")]
pub struct Unreadable {
    /// The element, escaped and cut short: it is the client's (or a broken proxy's) bytes.
    element: String,
}

impl Unreadable {
    /// The longest part of the element shown.
    const SHOWN: usize = 64;

    fn of(element: &[u8]) -> Unreadable {
        let shown = &element[..element.len().min(Self::SHOWN)];
        let more = if element.len() > Self::SHOWN { "..." } else { "" };
        Unreadable {
            element: format!("\"{}{more}\"", shown.escape_ascii()),
        }
    }
}

/// One `X-Forwarded-For` entry: `1.2.3.4`, `2001:db8::1`, `[2001:db8::1]`, or any of these
/// with a port, as some proxies write them.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?;
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|addr| addr.ip()))
        .or_else(|| entry.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ClientIdentity {
        ClientIdentity::new(vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()])
    }

    fn walk(peer: &str, xff: &[&[u8]]) -> Result<String, Unreadable> {
        let mut headers = HeaderMap::new();
        for line in xff {
            headers.append(&X_FORWARDED_FOR, http::HeaderValue::from_bytes(line).unwrap());
        }
        identity()
            .client(peer.parse().unwrap(), &headers)
            .map(|(ip, _)| ip.to_string())
    }

    fn client(peer: &str, xff: &[&str]) -> String {
        let lines: Vec<&[u8]> = xff.iter().map(|line| line.as_bytes()).collect();
        walk(peer, &lines).unwrap()
    }

    #[test]
    fn untrusted_peers_are_themselves_whatever_they_send() {
        assert_eq!(client("203.0.113.9", &[]), "203.0.113.9");
        assert_eq!(client("203.0.113.9", &["1.1.1.1"]), "203.0.113.9");
        assert_eq!(client("::ffff:203.0.113.9", &["1.1.1.1"]), "203.0.113.9");
        assert_eq!(walk("203.0.113.9", &[b"\xff", b"bogus"]).unwrap(), "203.0.113.9");
    }

    #[test]
    fn trusted_peers_are_walked_right_to_left() {
        assert_eq!(client("10.0.0.1", &["198.51.100.7"]), "198.51.100.7");
        // The client forged the first entry; our proxies appended the rest.
        assert_eq!(
            client("10.0.0.1", &["6.6.6.6, 198.51.100.7, 10.0.0.2"]),
            "198.51.100.7"
        );
        assert_eq!(
            client("10.0.0.1", &["6.6.6.6", "198.51.100.7", "10.0.0.2"]),
            "198.51.100.7"
        );
        assert_eq!(client("::1", &["[2001:db8::5]:443"]), "2001:db8::5");
        assert_eq!(client("::1", &["[2001:db8::5]"]), "2001:db8::5");
        assert_eq!(client("10.0.0.1", &["198.51.100.7:5555"]), "198.51.100.7");
        assert_eq!(
            client("10.0.0.1", &["\t198.51.100.7 ,10.0.0.2\t"]),
            "198.51.100.7"
        );
    }

    #[test]
    fn all_trusted_chains_stop_at_the_leftmost_hop() {
        assert_eq!(client("10.0.0.1", &[]), "10.0.0.1");
        assert_eq!(client("10.0.0.1", &["10.0.0.3, 10.0.0.2"]), "10.0.0.3");
        // Empty elements are no elements (RFC 9110 section 5.6.1).
        assert_eq!(client("10.0.0.1", &[", ,10.0.0.3,"]), "10.0.0.3");
        assert_eq!(client("10.0.0.1", &[""]), "10.0.0.1");
    }

    #[test]
    fn a_malformed_element_left_of_the_client_changes_nothing() {
        // The client's own header, the proxy's address appended: `$proxy_add_x_forwarded_for`.
        let forged: [&[u8]; 5] = [b"\xff", b"bogus", b"unknown", b"\xff\xfe, 1.2.3.4:x", b"\x80"];
        for forged in forged {
            let mut line = forged.to_vec();
            line.extend_from_slice(b", 198.51.100.7");
            assert_eq!(walk("10.0.0.1", &[&line]).unwrap(), "198.51.100.7");
            // As a line of its own, before the proxy's.
            assert_eq!(
                walk("10.0.0.1", &[forged, b"198.51.100.7, 10.0.0.2"]).unwrap(),
                "198.51.100.7"
            );
        }
    }

    #[test]
    fn a_malformed_element_where_the_client_should_be_is_refused_never_the_proxy() {
        let cases: [(&[&[u8]], &str); 7] = [
            (&[b"\xff"], "\"\\xff\""),
            (&[b"1.2.3.4, bogus, 10.0.0.2"], "\"bogus\""),
            (&[b"unknown"], "\"unknown\""),
            (&[b"1.2.3.4", b"\xff, 10.0.0.2"], "\"\\xff\""),
            (&[b"1.2.3.4, 10.0.0.2", b"10.0.0.3 junk"], "\"10.0.0.3 junk\""),
            (&[b"fe80::1%eth0"], "\"fe80::1%eth0\""),
            (&[b"10.0.0.2, 256.1.1.1"], "\"256.1.1.1\""),
        ];
        for (lines, shown) in cases {
            let error = walk("10.0.0.1", lines).unwrap_err();
            let message = error.to_string();
            assert!(
                message.starts_with("X-Forwarded-For: ") && message.contains(shown),
                "{lines:?}: {message}"
            );
        }
        // What is shown of a long element is bounded.
        let long = vec![b'x'; 10_000];
        let message = walk("10.0.0.1", &[&long]).unwrap_err().to_string();
        assert!(message.len() < 200, "{message}");
    }

    proptest::proptest! {
        #[test]
        fn no_bytes_make_a_trusted_peer_the_client_past_a_malformed_element(
            forged in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            tail in proptest::collection::vec(proptest::num::u8::ANY, 1..40),
        ) {
            // Whatever a proxy appended after the client's bytes: the answer is an address
            // read from the header (never the peer 10.0.0.1 unless it is written there), or a
            // refusal; nothing panics.
            let mut line = forged.clone();
            line.push(b',');
            line.extend_from_slice(&tail);
            if let Ok(value) = http::HeaderValue::from_bytes(&line) {
                let mut headers = HeaderMap::new();
                headers.append(&X_FORWARDED_FOR, value);
                if let Ok((client, _)) = identity().client("10.0.0.1".parse().unwrap(), &headers) {
                    let written = line
                        .split(|&byte| byte == b',')
                        .filter_map(|element| parse_entry(element.trim_ascii()))
                        .any(|ip| ip == client);
                    proptest::prop_assert!(written, "{client} from {line:?}");
                }
            }
        }
    }
}
