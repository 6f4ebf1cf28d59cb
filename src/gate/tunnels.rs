//! `MAX_UPGRADES_PER_CLIENT`: the tunnels (WebSocket) one client may hold open.
//!
//! After `101 Switching Protocols` a door copies bytes both ways and sees no more requests:
//! whatever the client sends inside a tunnel is not rate-limited. The upgrade request itself
//! is decided like any other; this cap bounds how many tunnels one client can hold at once.
//!
//! A client is its address as the rules see it (after `TRUSTED_PROXIES`, IPv6 grouped by
//! `IPV6_PREFIX`), whatever `KEY_BY` says: a header value is the client's to choose. The place
//! is taken when the upgrade request arrives (before any budget is spent, so a refused upgrade
//! costs none) and held by the [`TunnelSlot`] the verdict carries, which the tunnel keeps until
//! it closes; a request that is not switched (refused, or the backend did not agree) gives it
//! back when it ends. Entries are removed at zero, so the table holds only clients with a
//! tunnel open.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::rules::ClientIp;

/// Open tunnels per client.
#[derive(Debug)]
pub(crate) struct Tunnels {
    /// `MAX_UPGRADES_PER_CLIENT`; `None` is unlimited (and nothing is counted).
    limit: Option<u32>,
    /// `IPV6_PREFIX`: clients are keyed as the rules key them.
    ipv6_prefix: u8,
    /// Tunnels (and upgrade requests in progress) per client; no zero entries.
    open: Arc<Mutex<HashMap<ClientIp, u32>>>,
}

/// One client's place under `MAX_UPGRADES_PER_CLIENT`, given back when dropped.
#[derive(Debug)]
pub struct TunnelSlot {
    open: Arc<Mutex<HashMap<ClientIp, u32>>>,
    client: ClientIp,
}

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl Tunnels {
    /// At most `limit` tunnels per client (`None`: unlimited), IPv6 clients grouped by
    /// `ipv6_prefix` as the rules group them.
    pub(crate) fn new(limit: Option<u32>, ipv6_prefix: u8) -> Tunnels {
        Tunnels {
            limit,
            ipv6_prefix,
            open: Arc::default(),
        }
    }

    /// For an upgrade request from `client`: its place (`None` when tunnels are not counted),
    /// or the limit it is at.
    pub(crate) fn admit(&self, client: IpAddr) -> Result<Option<TunnelSlot>, u32> {
        let Some(limit) = self.limit else {
            return Ok(None);
        };
        let client = ClientIp::new(client, self.ipv6_prefix);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                open.remove(&client);
            }
            return Err(limit);
        }
        *count += 1;
        Ok(Some(TunnelSlot {
            open: self.open.clone(),
            client,
        }))
    }

    #[cfg(test)]
    /// Clients holding at least one tunnel.
    pub(crate) fn clients(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_gets_at_most_the_limit_and_a_closed_tunnel_frees_its_slot() {
        let tunnels = Tunnels::new(Some(2), 64);
        let mut held: Vec<TunnelSlot> = (0..2)
            .map(|_| tunnels.admit(ip("192.0.2.1")).unwrap().unwrap())
            .collect();
        assert_eq!(tunnels.admit(ip("192.0.2.1")).unwrap_err(), 2);
        // Another client is counted apart.
        let other = tunnels.admit(ip("192.0.2.2")).unwrap();
        assert_eq!(tunnels.clients(), 2);
        held.pop();
        let again = tunnels.admit(ip("192.0.2.1")).unwrap();
        // Every slot given back: nothing is left in the table.
        drop((held, other, again));
        assert_eq!(tunnels.clients(), 0);
    }

    #[test]
    fn ipv6_clients_are_grouped_as_the_rules_group_them() {
        let tunnels = Tunnels::new(Some(1), 64);
        let _first = tunnels.admit(ip("2001:db8:1:2::1")).unwrap();
        // The same /64 is the same client.
        assert!(tunnels.admit(ip("2001:db8:1:2::2")).is_err());
        assert!(tunnels.admit(ip("2001:db8:1:3::1")).is_ok());
    }

    #[test]
    fn an_unlimited_gateway_counts_nothing() {
        let unlimited = Tunnels::new(None, 64);
        assert!(unlimited.admit(ip("192.0.2.1")).unwrap().is_none());
        assert_eq!(unlimited.clients(), 0);
    }

    #[test]
    fn zero_refuses_every_upgrade_and_leaves_no_entry() {
        let tunnels = Tunnels::new(Some(0), 64);
        assert!(tunnels.admit(ip("192.0.2.1")).is_err());
        assert_eq!(tunnels.clients(), 0);
    }
}
