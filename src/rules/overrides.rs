//! Per-client overrides (`OVERRIDES_FILE`) and tiers (`TIERS` with `TIER_HEADER`): other
//! numbers for some clients of a rule.
//!
//! An override or a tier that gives other limits gives them through a **variant** of the rule:
//! a rule of its own in the table (after the classified rules), the same in everything but its
//! name and its limits, named `RULE@TIER` for a tier and `RULE@LIMITS` (the limits as written)
//! for an override. So a client's budget under one set of limits is never mixed with its
//! budget under another: each variant has its own states in memory and its own Redis keys, and
//! its own metric series. Two overrides of one rule with the same limits share the variant,
//! each client still its own budget in it.
//!
//! A request is matched in this order, the first that applies wins: an override of the
//! client's key (`key:VALUE`, as the rule digests its key source), an override of the client's
//! address (the most specific network that holds it), the tier its `TIER_HEADER` names (only
//! from a peer in `TRUSTED_PROXIES`), then the rule's own limits. An override is `LIMITS`,
//! `unlimited` (exempt: forwarded, nothing counted) or `deny` (refused at once, with no
//! `Retry-After`: no wait would help).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::rules::key::{ClientKey, Digest};

/// What an override makes of a client's requests under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    /// Decided under the variant of this id (its limits are the override's).
    Limits(u16),
    /// Never limited: forwarded without a decision, as `EXEMPT` is.
    Unlimited,
    /// Refused at once, without `Retry-After`.
    Deny,
}

/// Who an override is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// Every address in the network (an address alone is its /32 or /128).
    Network(IpNet),
    /// The clients whose key under the rule digests to this (`key:VALUE`).
    Key(Digest),
}

/// One line of `OVERRIDES_FILE`, compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The rule's id (a classified rule).
    pub rule: u16,
    /// Whose requests.
    pub client: Client,
    /// What becomes of them.
    pub what: Override,
}

/// One tier of `TIERS`: its name, and per classified rule the variant it decides under
/// (`None` for a rule tiers leave alone, the auth rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    /// As `TIER_HEADER` names it.
    pub name: Arc<str>,
    /// By rule id.
    pub variants: Vec<Option<u16>>,
}

/// Overrides and tiers of one rule table. Empty: every request gets its rule's own limits,
/// at the cost of one branch.
#[derive(Clone, Default)]
pub struct Overrides {
    /// Every entry, in file order: what the table's digest and comparison see.
    entries: Vec<Entry>,
    /// Key overrides, by rule and digest.
    keys: HashMap<(u16, Digest), Override>,
    /// Network overrides by prefix length, the longest first: a client's address masked to
    /// each length in turn finds the most specific network that holds it.
    networks: Vec<(u8, NetworkOverrides)>,
    /// `TIER_HEADER` and `TIERS`; `None` when unset.
    tiers: Option<(HeaderName, Vec<Tier>)>,
}

/// The network overrides of one prefix length, by rule and network.
type NetworkOverrides = HashMap<(u16, IpNet), Override>;

/// `TIER_HEADER` from a trusted peer, readable more than one way: an authentication layer
/// that appends its header rather than replacing it leaves the client's own first, so the
/// request is refused (`400`) as a repeated key header is, never given either plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmbiguousTier {
    /// Two lines or more.
    #[error("the {0} header (TIER_HEADER) appears more than once")]
    Repeated(HeaderName),
    /// A comma list (`pro, free`), which a proxy may have merged from two lines: no tier name
    /// holds a comma.
    #[error("the {0} header (TIER_HEADER) holds a comma-separated list")]
    List(HeaderName),
}

/// What [`Overrides::find`] found for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The override or tier that applies, if any.
    pub what: Option<Override>,
    /// The request named a tier but its peer is not a trusted proxy: the header was not
    /// believed (counted in `tollgate_tier_header_untrusted_total`).
    pub untrusted_tier: bool,
}

impl Overrides {
    /// Overrides of `entries` (an entry of a rule and client written before wins: the parser
    /// refuses repeats anyway) and `tiers`, read from `header`.
    pub fn new(entries: Vec<Entry>, tiers: Option<(HeaderName, Vec<Tier>)>) -> Overrides {
        let mut keys = HashMap::new();
        let mut networks: Vec<(u8, NetworkOverrides)> = Vec::new();
        for entry in &entries {
            match entry.client {
                Client::Key(digest) => {
                    keys.entry((entry.rule, digest)).or_insert(entry.what);
                }
                Client::Network(network) => {
                    let length = network.prefix_len() + if network.addr().is_ipv4() { 0 } else { 128 };
                    let at = match networks.iter().position(|(held, _)| *held == length) {
                        Some(at) => at,
                        None => {
                            networks.push((length, HashMap::new()));
                            networks.len() - 1
                        }
                    };
                    networks[at].1.entry((entry.rule, network)).or_insert(entry.what);
                }
            }
        }
        // IPv6 lengths sort above IPv4's (offset by 128): an address is looked up only among
        // its own family's, the longest first either way.
        networks.sort_by_key(|(length, _)| std::cmp::Reverse(*length));
        Overrides {
            entries,
            keys,
            networks,
            tiers,
        }
    }

    /// True when there is nothing to look up.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.tiers.is_none()
    }

    /// Every override, in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// `TIER_HEADER` and the tiers, if set.
    pub fn tiers(&self) -> Option<&(HeaderName, Vec<Tier>)> {
        self.tiers.as_ref()
    }

    /// What applies to a request of `key` from `ip` under the rule `rule`, whose `headers`
    /// name its tier if `trusted` (its peer is one of `TRUSTED_PROXIES`); an error when they
    /// name it more than one way.
    pub fn find(
        &self,
        rule: u16,
        key: &ClientKey,
        ip: IpAddr,
        headers: &HeaderMap,
        trusted: bool,
    ) -> Result<Found, AmbiguousTier> {
        let mut found = Found {
            what: None,
            untrusted_tier: false,
        };
        if let Some(digest) = key.digest()
            && let Some(what) = self.keys.get(&(rule, digest))
        {
            found.what = Some(*what);
            return Ok(found);
        }
        let ip = ip.to_canonical();
        for (length, networks) in &self.networks {
            let network = match (ip, *length) {
                (IpAddr::V4(v4), length @ 0..=32) => {
                    ipnet::Ipv4Net::new(v4, length).map(|net| IpNet::V4(net.trunc()))
                }
                (IpAddr::V6(v6), length @ 128..) => {
                    ipnet::Ipv6Net::new(v6, length - 128).map(|net| IpNet::V6(net.trunc()))
                }
                _ => continue,
            };
            if let Ok(network) = network
                && let Some(what) = networks.get(&(rule, network))
            {
                found.what = Some(*what);
                return Ok(found);
            }
        }
        if let Some((header, tiers)) = &self.tiers {
            let mut lines = headers.get_all(header).iter();
            let Some(named) = lines.next() else {
                return Ok(found);
            };
            if !trusted {
                found.untrusted_tier = true;
                return Ok(found);
            }
            if lines.next().is_some() {
                return Err(AmbiguousTier::Repeated(header.clone()));
            }
            if named.as_bytes().contains(&b',') {
                return Err(AmbiguousTier::List(header.clone()));
            }
            let variant = tiers
                .iter()
                .find(|tier| tier.name.as_bytes() == named.as_bytes())
                .and_then(|tier| tier.variants.get(usize::from(rule)).copied().flatten());
            found.what = variant.map(Override::Limits);
        }
        Ok(found)
    }
}

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Overrides")
            .field("entries", &self.entries)
            .field("tiers", &self.tiers)
            .finish()
    }
}

impl PartialEq for Overrides {
    fn eq(&self, other: &Overrides) -> bool {
        // The lookups are built from these alone.
        self.entries == other.entries && self.tiers == other.tiers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::ClientIp;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn network(rule: u16, text: &str, what: Override) -> Entry {
        Entry {
            rule,
            client: Client::Network(text.parse().unwrap()),
            what,
        }
    }

    #[test]
    fn the_most_specific_network_wins_and_keys_come_first() {
        let digest = crate::rules::KeyHasher::from_secret("a secret of sixteen bytes").digest(b"sk_live_abc");
        let overrides = Overrides::new(
            vec![
                network(0, "10.0.0.0/8", Override::Unlimited),
                network(0, "10.1.0.0/16", Override::Limits(5)),
                network(0, "10.1.2.3/32", Override::Deny),
                network(1, "2001:db8::/32", Override::Deny),
                Entry {
                    rule: 0,
                    client: Client::Key(digest),
                    what: Override::Limits(6),
                },
            ],
            None,
        );
        let none = HeaderMap::new();
        let by_ip = |rule, address: &str| {
            let key = ClientKey::Ip(ClientIp::new(ip(address), 64));
            overrides
                .find(rule, &key, ip(address), &none, false)
                .unwrap()
                .what
        };
        assert_eq!(by_ip(0, "10.9.9.9"), Some(Override::Unlimited));
        assert_eq!(by_ip(0, "10.1.9.9"), Some(Override::Limits(5)));
        assert_eq!(by_ip(0, "10.1.2.3"), Some(Override::Deny));
        assert_eq!(
            by_ip(0, "::ffff:10.1.2.3"),
            Some(Override::Deny),
            "IPv4-mapped is IPv4"
        );
        assert_eq!(by_ip(0, "192.0.2.1"), None);
        assert_eq!(by_ip(1, "10.1.2.3"), None, "another rule's overrides");
        assert_eq!(by_ip(1, "2001:db8:1::1"), Some(Override::Deny));
        assert_eq!(by_ip(0, "2001:db8:1::1"), None);
        let keyed = ClientKey::Header(digest);
        assert_eq!(
            overrides
                .find(0, &keyed, ip("10.1.2.3"), &none, false)
                .unwrap()
                .what,
            Some(Override::Limits(6)),
            "a key's override before its address's"
        );
    }

    #[test]
    fn a_tier_is_believed_from_a_trusted_peer_only_and_an_unknown_one_changes_nothing() {
        let header = HeaderName::from_static("x-plan");
        let tiers = vec![Tier {
            name: "pro".into(),
            variants: vec![Some(3), None],
        }];
        let overrides = Overrides::new(Vec::new(), Some((header, tiers)));
        let key = ClientKey::Ip(ClientIp::new(ip("192.0.2.1"), 64));
        let mut headers = HeaderMap::new();
        headers.insert("x-plan", "pro".parse().unwrap());
        let find = |rule, headers: &HeaderMap, trusted| {
            overrides
                .find(rule, &key, ip("192.0.2.1"), headers, trusted)
                .unwrap()
        };
        assert_eq!(find(0, &headers, true).what, Some(Override::Limits(3)));
        assert_eq!(find(1, &headers, true).what, None, "a rule tiers leave alone");
        let untrusted = find(0, &headers, false);
        assert_eq!((untrusted.what, untrusted.untrusted_tier), (None, true));
        headers.insert("x-plan", "enterprise".parse().unwrap());
        assert_eq!(
            find(0, &headers, true).what,
            None,
            "an unknown tier: the rule's own"
        );
        assert!(!find(0, &HeaderMap::new(), false).untrusted_tier);
    }

    #[test]
    fn a_tier_named_two_ways_by_a_trusted_peer_is_refused_and_ignored_from_others() {
        let header = HeaderName::from_static("x-plan");
        let tiers = vec![
            Tier {
                name: "pro".into(),
                variants: vec![Some(3)],
            },
            Tier {
                name: "free".into(),
                variants: vec![Some(4)],
            },
        ];
        let overrides = Overrides::new(Vec::new(), Some((header.clone(), tiers)));
        let key = ClientKey::Ip(ClientIp::new(ip("192.0.2.1"), 64));
        let find = |lines: &[&str], trusted| {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append("x-plan", line.parse().unwrap());
            }
            overrides.find(0, &key, ip("192.0.2.1"), &headers, trusted)
        };
        // The client's copy first, the authentication layer's appended: neither plan.
        assert_eq!(
            find(&["pro", "free"], true),
            Err(AmbiguousTier::Repeated(header.clone()))
        );
        assert_eq!(
            find(&["free", "free"], true),
            Err(AmbiguousTier::Repeated(header.clone()))
        );
        // Merged by a proxy into one line.
        assert_eq!(
            find(&["pro, free"], true),
            Err(AmbiguousTier::List(header.clone()))
        );
        assert_eq!(
            find(&["pro", "free"], true).unwrap_err().to_string(),
            "the x-plan header (TIER_HEADER) appears more than once"
        );
        // From a peer whose tier is not believed anyway: ignored, and counted.
        let untrusted = find(&["pro", "free"], false).unwrap();
        assert_eq!((untrusted.what, untrusted.untrusted_tier), (None, true));
        assert_eq!(find(&["free"], true).unwrap().what, Some(Override::Limits(4)));
    }
}
