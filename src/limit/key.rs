//! Who a budget belongs to: the [`ClientKey`] a request is counted under.
//!
//! A key is the client's IP address, a digest of a header (an API key, say), or both. It is a
//! small `Copy` value of fixed size, so the memory store hashes and compares it without
//! allocating, and it never holds a raw header value: header values are hashed with a keyed
//! hash ([`KeyHasher`], SipHash-2-4 with a 128-bit output), so an API key never appears in a
//! log line or a Redis key, and a client cannot aim many values at one memory-store shard.
//!
//! IPv6 clients are keyed by their network (`IPV6_PREFIX`, a /64 by default): one subscriber
//! is routinely handed a whole /64, so keying single addresses would give each of them 2^64
//! budgets. IPv4-mapped IPv6 addresses are keyed as the IPv4 address they are.

use std::fmt;
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::HeaderName;
use siphasher::sip128::{Hasher128, SipHasher24};

/// What a rule keys its budgets by (`KEY_BY`, or a route's `key=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBy {
    /// `ip`: the client address (after `TRUSTED_PROXIES`).
    Ip,
    /// `header:NAME`: the header's value; requests without it are keyed by their IP.
    Header(HeaderName),
    /// `ip+header:NAME`: one budget per (address, header value); without the header, the IP.
    IpAndHeader(HeaderName),
}

impl KeyBy {
    /// Parse `ip`, `header:NAME` or `ip+header:NAME`.
    pub fn parse(value: &str) -> Result<KeyBy, String> {
        let header = |name: &str| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a valid header name"))
        };
        if value == "ip" {
            Ok(KeyBy::Ip)
        } else if let Some(name) = value.strip_prefix("ip+header:") {
            header(name).map(KeyBy::IpAndHeader)
        } else if let Some(name) = value.strip_prefix("header:") {
            header(name).map(KeyBy::Header)
        } else {
            Err("ip, header:NAME or ip+header:NAME (e.g. header:X-API-Key)".into())
        }
    }

    /// The header this rule reads, if any.
    pub fn header(&self) -> Option<&HeaderName> {
        match self {
            KeyBy::Ip => None,
            KeyBy::Header(name) | KeyBy::IpAndHeader(name) => Some(name),
        }
    }
}

impl fmt::Display for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyBy::Ip => f.write_str("ip"),
            KeyBy::Header(name) => write!(f, "header:{name}"),
            KeyBy::IpAndHeader(name) => write!(f, "ip+header:{name}"),
        }
    }
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
    /// The key of a rule keyed `by`, for a client at `ip` whose keyed header (if the rule has
    /// one) holds `header` (`None` when absent or empty: such requests are keyed by IP).
    pub fn new(by: &KeyBy, ip: ClientIp, header: Option<&[u8]>, hasher: &KeyHasher) -> ClientKey {
        match (by, header) {
            (KeyBy::Header(_), Some(value)) => ClientKey::Header(hasher.digest(value)),
            (KeyBy::IpAndHeader(_), Some(value)) => ClientKey::IpAndHeader(ip, hasher.digest(value)),
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

    /// The digest of one header value.
    pub fn digest(&self, value: &[u8]) -> Digest {
        let mut hasher = SipHasher24::new_with_keys(self.keys.0, self.keys.1);
        hasher.write(value);
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

    #[test]
    fn header_keys_are_keyed_digests_never_raw_values() {
        let hasher = KeyHasher::from_secret("correct horse battery staple");
        let by = KeyBy::parse("header:X-API-Key").unwrap();
        let addr = ClientIp::new("192.0.2.1".parse().unwrap(), 64);
        let key = ClientKey::new(&by, addr, Some(b"sk_live_secret"), &hasher);
        let shown = key.to_string();
        assert!(shown.starts_with("key:") && shown.len() == 4 + 32, "{shown}");
        assert!(!shown.contains("secret"));
        // Same secret, same digest (replicas agree); another secret, another digest.
        assert_eq!(
            key,
            ClientKey::new(
                &by,
                addr,
                Some(b"sk_live_secret"),
                &KeyHasher::from_secret("correct horse battery staple")
            )
        );
        assert_ne!(
            key,
            ClientKey::new(
                &by,
                addr,
                Some(b"sk_live_secret"),
                &KeyHasher::from_secret("another secret")
            )
        );
        // Without the header: the address.
        assert_eq!(ClientKey::new(&by, addr, None, &hasher).to_string(), "192.0.2.1");
        let both = KeyBy::parse("ip+header:x-api-key").unwrap();
        let key = ClientKey::new(&both, addr, Some(b"k"), &hasher).to_string();
        assert!(key.starts_with("192.0.2.1+key:"), "{key}");
        assert!(!format!("{hasher:?}").contains(&format!("{}", hasher.keys.0)));
    }

    #[test]
    fn key_by_parses_and_prints() {
        for value in ["ip", "header:x-api-key", "ip+header:authorization"] {
            assert_eq!(KeyBy::parse(value).unwrap().to_string(), value);
        }
        assert_eq!(
            KeyBy::parse("header:X-Api-Key").unwrap().to_string(),
            "header:x-api-key"
        );
        assert!(KeyBy::parse("header:").is_err());
        assert!(KeyBy::parse("header:bad name").is_err());
        assert!(KeyBy::parse("cookie:x").is_err());
    }
}
