//! Who is calling: the key a client's budget is filed under.
//!
//! The key is the TCP peer's IP address (never IP:port: a client opens as many ports as it
//! likes). Only when the peer is one of `TRUSTED_PROXIES` is `X-Forwarded-For` believed, and
//! then it is walked right to left (each proxy appends the address it received from, so the
//! rightmost entries are the ones our own proxies wrote) until the first address that is not
//! a trusted proxy: the client as seen by our outermost proxy. Entries left of it were written
//! by the client itself and are ignored, so a client can never choose its own key.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::HeaderName;
use ipnet::IpNet;

/// `X-Forwarded-For` (de facto standard, see RFC 7239 section 4 for its successor).
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// What the listener tells the proxy about the connection a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The connection's other end as the gateway believes it: the TCP peer, or the source
    /// address of the PROXY header a trusted proxy sent (`PROXY_PROTOCOL=true`). This is the
    /// peer the client address and the forwarding headers start from.
    pub address: SocketAddr,
    /// The connection is TLS (the listener is HTTPS): `X-Forwarded-Proto` and the `Forwarded`
    /// element say `https`.
    pub tls: bool,
}

impl Peer {
    /// A plain-HTTP connection from `address`.
    pub fn plain(address: SocketAddr) -> Peer {
        Peer { address, tls: false }
    }
}

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

    /// The client's address for a request that came from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        // Several header lines are one list, in order (RFC 9110 section 5.3).
        let mut nearest_trusted = peer;
        for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            let Ok(line) = line.to_str() else {
                return nearest_trusted;
            };
            for entry in line.rsplit(',') {
                match parse_entry(entry) {
                    Some(ip) if self.is_trusted(ip) => nearest_trusted = ip,
                    Some(ip) => return ip,
                    // Garbage written by (or passed through) a trusted hop: file the request
                    // under that hop rather than under anything the client could choose.
                    None => return nearest_trusted,
                }
            }
        }
        // Every hop is a trusted proxy: the leftmost one is the best we know.
        nearest_trusted
    }
}

/// One `X-Forwarded-For` entry: `1.2.3.4`, `2001:db8::1`, `[2001:db8::1]`, or any of these
/// with a port, as some proxies write them.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
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

    fn client(peer: &str, xff: &[&str]) -> String {
        let mut headers = HeaderMap::new();
        for line in xff {
            headers.append(&X_FORWARDED_FOR, line.parse().unwrap());
        }
        identity().client(peer.parse().unwrap(), &headers).to_string()
    }

    #[test]
    fn untrusted_peers_are_themselves_whatever_they_send() {
        assert_eq!(client("203.0.113.9", &[]), "203.0.113.9");
        assert_eq!(client("203.0.113.9", &["1.1.1.1"]), "203.0.113.9");
        assert_eq!(client("::ffff:203.0.113.9", &["1.1.1.1"]), "203.0.113.9");
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
        assert_eq!(client("10.0.0.1", &["198.51.100.7:5555"]), "198.51.100.7");
    }

    #[test]
    fn garbage_and_all_trusted_chains_stop_at_a_trusted_hop() {
        assert_eq!(client("10.0.0.1", &[]), "10.0.0.1");
        assert_eq!(client("10.0.0.1", &["10.0.0.3, 10.0.0.2"]), "10.0.0.3");
        assert_eq!(client("10.0.0.1", &["1.2.3.4, bogus, 10.0.0.2"]), "10.0.0.2");
        assert_eq!(client("10.0.0.1", &["unknown"]), "10.0.0.1");
    }
}
