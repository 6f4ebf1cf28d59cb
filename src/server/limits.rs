//! How many client connections may be open at once (`MAX_CONNECTIONS`), sized from the
//! process's file-descriptor limit, and what the accept loop does when it runs out anyway.
//!
//! Every client connection costs a file descriptor, and another for the backend connection
//! its request is forwarded on (an upgraded tunnel always holds both). When the limit is
//! reached `accept` fails with `EMFILE`, the connection stays in the kernel's queue, and
//! every new client waits behind it: the gateway is off the air. So the soft limit is raised
//! to the hard limit at startup ([`raise_fd_limit`]), connections are capped below it, and a
//! connection past the cap is accepted and closed at once (with a reset) rather than left to
//! starve the queue.
//!
//! A slot is held by the socket itself ([`super::connection::ClientStream`]), not by the task
//! serving it: an upgraded connection hands its socket to a tunnel and keeps its slot until the
//! tunnel closes.
//!
//! One peer may hold at most `MAX_CONNECTIONS_PER_CLIENT` of them ([`ClientConnections`]), so
//! a single address cannot take every slot. A peer is its TCP address, IPv6 grouped by
//! `IPV6_PREFIX` as the rate limiter groups it (one subscriber is handed a whole /64); peers in
//! `TRUSTED_PROXIES` are not capped, as a load balancer in front carries every client. Unset,
//! the cap is [`default_per_client`]: three quarters of `MAX_CONNECTIONS`, so whatever one
//! address does, a quarter of the slots stays for everyone else, while a crowd behind one NAT
//! address, or a load balancer not listed in `TRUSTED_PROXIES`, is only cut once it holds most
//! of the gateway.
//!
//! Requests in flight are capped at `MAX_CONNECTIONS` too (HTTP/2 streams can outnumber
//! connections), and one client may hold at most `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` of them
//! across its connections ([`ClientRequests`], the same share by default): without it, one
//! address with 3 HTTP/2 connections of 150 streams holds every place of a small gateway and
//! everyone else gets `503`. A request's places ([`RequestPlace`]) go back once its response
//! body has handed its last frame over (see [`super::connection::Tracked`]).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ipnet::IpNet;
use tokio::time::Instant;

use crate::rules::ClientIp;

/// File descriptors kept apart from client connections and their backend connections: the
/// standard streams, the listeners, the runtime's own, Redis connections (one per cluster
/// master, plus reconnects), admin-listener scrapes and probes.
pub(crate) const RESERVED_FDS: u64 = 128;

/// The smallest `MAX_CONNECTIONS` sized from a file-descriptor limit, however low.
pub(crate) const MIN_CONNECTIONS: usize = 16;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and return the new soft limit. Called
/// once by the binary at startup; a library user decides for its own process.
pub fn raise_fd_limit() -> io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// The soft `RLIMIT_NOFILE` in force, if it can be read.
pub(crate) fn fd_limit() -> Option<u64> {
    rlimit::Resource::NOFILE.get().ok().map(|(soft, _)| soft)
}

/// `MAX_CONNECTIONS` as it follows from a soft file-descriptor limit: what is left after
/// [`RESERVED_FDS`], halved because a forwarded request holds a backend connection too, and
/// never below [`MIN_CONNECTIONS`].
pub(crate) fn connections_for(fd_limit: u64) -> usize {
    let pairs = fd_limit.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(pairs).unwrap_or(usize::MAX).max(MIN_CONNECTIONS)
}

/// The cap in force and, when an explicit `MAX_CONNECTIONS` is more than the file-descriptor
/// limit leaves room for, a warning saying so (it is kept: the operator may know the traffic
/// holds few backend connections, and running out is survivable, only slower to recover).
pub(crate) fn effective_max_connections(
    configured: Option<NonZeroUsize>,
    fd_limit: Option<u64>,
) -> (usize, Option<String>) {
    let sized = fd_limit.map(connections_for);
    match (configured, sized) {
        (Some(configured), Some(sized)) if configured.get() > sized => (
            configured.get(),
            Some(format!(
                "MAX_CONNECTIONS={configured} is more than the file-descriptor limit ({}) leaves \
                 room for ({sized} client connections, each with a backend connection); \
                 accept and backend connects may fail with EMFILE: raise `ulimit -n` (the hard \
                 limit) or lower MAX_CONNECTIONS",
                fd_limit.unwrap_or_default()
            )),
        ),
        (Some(configured), _) => (configured.get(), None),
        (None, Some(sized)) => (sized, None),
        // No limit to read (not a Unix system): what a 1024-descriptor process could hold.
        (None, None) => (connections_for(1024), None),
    }
}

/// Open client connections, counted against `MAX_CONNECTIONS`.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSlots {
    /// Connections open now (sockets not yet closed, tunnels included).
    open: Arc<AtomicUsize>,
    /// `MAX_CONNECTIONS`.
    max: usize,
}

impl ConnectionSlots {
    /// At most `max` at once.
    pub(crate) fn new(max: usize) -> ConnectionSlots {
        ConnectionSlots {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A slot for one more connection, or `None` when `max` are open.
    pub(crate) fn try_acquire(&self) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self.open.clone()))
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// `MAX_CONNECTIONS`.
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// What the metrics read of the slots at scrape time.
impl crate::metrics::Occupancy for ConnectionSlots {
    fn open(&self) -> usize {
        ConnectionSlots::open(self)
    }

    fn max(&self) -> usize {
        ConnectionSlots::max(self)
    }
}

/// One connection's place under `MAX_CONNECTIONS`, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `MAX_CONNECTIONS_PER_CLIENT` as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PerClientCap {
    /// Unset: [`default_per_client`] of `MAX_CONNECTIONS`.
    #[default]
    Default,
    /// `0`: no cap per client; `MAX_CONNECTIONS` alone applies.
    Off,
    /// At most this many per client.
    At(NonZeroUsize),
}

impl PerClientCap {
    /// `0` (off) or a whole number.
    pub(crate) fn parse(value: &str) -> Option<PerClientCap> {
        let n: usize = value.parse().ok()?;
        Some(NonZeroUsize::new(n).map_or(PerClientCap::Off, PerClientCap::At))
    }

    /// The cap in force under `max_connections`, or `None` when it would never bite (off, or
    /// not below `max_connections`): then nothing is counted per client.
    pub(crate) fn effective(self, max_connections: usize) -> Option<usize> {
        let cap = match self {
            PerClientCap::Default => default_per_client(max_connections),
            PerClientCap::Off => return None,
            PerClientCap::At(cap) => cap.get(),
        };
        (cap < max_connections).then_some(cap)
    }
}

/// `MAX_CONNECTIONS_PER_CLIENT` when unset: `MAX_CONNECTIONS` less a quarter of it (rounded
/// down), the quarter kept for other clients. Below 4 nothing is kept apart: a cap that small
/// is a test's or a tiny deployment's, where one client is all there is.
pub(crate) fn default_per_client(max_connections: usize) -> usize {
    max_connections - max_connections / 4
}

/// Open client connections per peer, capped at `MAX_CONNECTIONS_PER_CLIENT`. Entries are
/// removed when their count returns to zero, so the table holds only peers with a connection
/// open: never more entries than `MAX_CONNECTIONS`.
#[derive(Debug, Clone)]
pub(crate) struct ClientConnections {
    /// The cap in force; `None`: nothing is counted.
    max: Option<usize>,
    /// `IPV6_PREFIX`: peers are grouped as the limiter groups clients.
    ipv6_prefix: u8,
    /// `TRUSTED_PROXIES`: peers not capped.
    trusted: Arc<[IpNet]>,
    /// Connections per peer; no zero entries.
    open: Arc<Mutex<HashMap<ClientIp, usize>>>,
}

impl ClientConnections {
    /// At most `max` per peer (`None`: no cap), IPv6 grouped by `ipv6_prefix`, peers in
    /// `trusted` not capped.
    pub(crate) fn new(max: Option<usize>, ipv6_prefix: u8, trusted: &[IpNet]) -> ClientConnections {
        ClientConnections {
            max,
            ipv6_prefix,
            trusted: trusted.into(),
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `peer`, or the peer as counted when it holds `max`
    /// already.
    pub(crate) fn try_acquire(&self, peer: IpAddr) -> Result<ClientSlot, ClientIp> {
        let Some(max) = self.max else {
            return Ok(ClientSlot { _held: None });
        };
        let peer = peer.to_canonical();
        if self.trusted.iter().any(|net| net.contains(&peer)) {
            return Ok(ClientSlot { _held: None });
        }
        let client = ClientIp::new(peer, self.ipv6_prefix);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_insert(0);
        if *count >= max {
            return Err(client);
        }
        *count += 1;
        Ok(ClientSlot {
            _held: Some(Counted {
                open: self.open.clone(),
                client,
            }),
        })
    }

    #[cfg(test)]
    /// Peers holding at least one counted connection.
    pub(crate) fn clients(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One connection's place under `MAX_CONNECTIONS_PER_CLIENT` (none for a peer not counted),
/// given back when dropped.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    /// Given back when dropped; `None` for a peer not counted.
    _held: Option<Counted>,
}

#[derive(Debug)]
struct Counted {
    open: Arc<Mutex<HashMap<ClientIp, usize>>>,
    client: ClientIp,
}

impl Drop for Counted {
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

/// Requests in flight per client, capped at `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`: a share of the
/// places under `MAX_CONNECTIONS` (which caps requests in flight too), as
/// [`ClientConnections`] is of the connections, so one address with a few HTTP/2 connections
/// of many streams cannot take every place. A client is the connection's peer as the listener
/// believes it (the PROXY header's source, when there is one), IPv6 grouped by `IPV6_PREFIX`;
/// peers in `TRUSTED_PROXIES` are not capped.
///
/// The table is touched once per connection, when it starts and when it and its requests are
/// gone ([`ConnectionShare`]); a request takes its place with one atomic operation on its
/// client's count, as under `MAX_CONNECTIONS`. It holds only clients with a connection open.
#[derive(Debug, Clone)]
pub(crate) struct ClientRequests {
    /// The cap in force; `None`: nothing is counted.
    max: Option<usize>,
    /// `IPV6_PREFIX`: peers are grouped as the limiter groups clients.
    ipv6_prefix: u8,
    /// `TRUSTED_PROXIES`: peers not capped.
    trusted: Arc<[IpNet]>,
    /// Per client with a connection open: its connections, and its requests in flight.
    clients: Arc<Mutex<HashMap<ClientIp, Shared>>>,
}

/// One client's entry: how many connections share its count, and the count.
#[derive(Debug)]
struct Shared {
    connections: usize,
    requests: Arc<AtomicUsize>,
}

impl ClientRequests {
    /// At most `max` requests in flight per peer (`None`: no cap), IPv6 grouped by
    /// `ipv6_prefix`, peers in `trusted` not capped.
    pub(crate) fn new(max: Option<usize>, ipv6_prefix: u8, trusted: &[IpNet]) -> ClientRequests {
        ClientRequests {
            max,
            ipv6_prefix,
            trusted: trusted.into(),
            clients: Arc::default(),
        }
    }

    /// The share of a connection from `peer`: its requests are counted with the other
    /// connections of the same client.
    pub(crate) fn connection(&self, peer: IpAddr) -> ConnectionShare {
        let Some(max) = self.max else {
            return ConnectionShare(None);
        };
        let peer = peer.to_canonical();
        if self.trusted.iter().any(|net| net.contains(&peer)) {
            return ConnectionShare(None);
        }
        let client = ClientIp::new(peer, self.ipv6_prefix);
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = clients.entry(client).or_insert_with(|| Shared {
            connections: 0,
            requests: Arc::default(),
        });
        shared.connections += 1;
        ConnectionShare(Some(Arc::new(Joined {
            requests: shared.requests.clone(),
            max,
            clients: self.clients.clone(),
            client,
        })))
    }

    #[cfg(test)]
    /// Clients with a connection open (or a request still in flight).
    pub(crate) fn clients(&self) -> usize {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One connection's way to its client's count of requests in flight (none for a peer not
/// counted). Its client's entry stays in the table while this, or a request it let in, lives.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionShare(Option<Arc<Joined>>);

impl ConnectionShare {
    /// A place for one more request of this connection's client, `Ok(None)` when it is not
    /// counted, or `Err` when it has `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` in flight already.
    pub(crate) fn try_acquire(&self) -> Result<Option<ClientPlace>, ()> {
        let Some(joined) = &self.0 else {
            return Ok(None);
        };
        joined
            .requests
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < joined.max).then_some(held + 1)
            })
            .map_err(|_| ())?;
        Ok(Some(ClientPlace(joined.clone())))
    }
}

/// A client's count as one connection holds it; the entry goes when the last holder does.
#[derive(Debug)]
struct Joined {
    requests: Arc<AtomicUsize>,
    /// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` in force.
    max: usize,
    clients: Arc<Mutex<HashMap<ClientIp, Shared>>>,
    client: ClientIp,
}

impl Drop for Joined {
    fn drop(&mut self) {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = clients.get_mut(&self.client) {
            shared.connections -= 1;
            if shared.connections == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// One request's place under `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`, given back when dropped.
#[derive(Debug)]
pub(crate) struct ClientPlace(Arc<Joined>);

impl Drop for ClientPlace {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Which cap of requests in flight a request arrived past: it is answered `503` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overload {
    /// `MAX_CONNECTIONS` requests in flight across all clients.
    Total,
    /// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` of its client's.
    Client,
}

impl Overload {
    /// The variable that sets the cap.
    pub(crate) fn variable(self) -> &'static str {
        match self {
            Overload::Total => crate::variables::MAX_CONNECTIONS.name,
            Overload::Client => crate::variables::MAX_REQUESTS_IN_FLIGHT_PER_CLIENT.name,
        }
    }
}

/// One request's places among the requests in flight: under `MAX_CONNECTIONS`, and under its
/// client's `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` when counted. Given back when dropped.
#[derive(Debug)]
pub(crate) struct RequestPlace {
    _total: Slot,
    _client: Option<ClientPlace>,
}

impl RequestPlace {
    /// A place under both caps, or the cap that refused.
    pub(crate) fn take(total: &ConnectionSlots, client: &ConnectionShare) -> Result<RequestPlace, Overload> {
        let total = total.try_acquire().ok_or(Overload::Total)?;
        let client = client.try_acquire().map_err(|()| Overload::Client)?;
        Ok(RequestPlace {
            _total: total,
            _client: client,
        })
    }
}

/// Whether a failed `accept` concerns only the connection being accepted (the client gave
/// up before we took it), so the loop carries on at once; anything else (`EMFILE`, `ENFILE`,
/// `ENOBUFS`, `ENOMEM`) is about the process or the system, and the loop backs off.
pub(crate) fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Admits one log line per interval about a recurring event, counting the events in between,
/// so a condition that recurs thousands of times a second (a full file table, a full
/// connection cap) costs one line every few seconds. Owned by the accept loop: no locking.
#[derive(Debug)]
pub(crate) struct IntervalLog {
    /// At most one line per this.
    interval: Duration,
    /// When the last line was admitted.
    last: Option<Instant>,
    /// Events since then, the current one included.
    events: u64,
}

impl IntervalLog {
    /// One line per `interval` at most.
    pub(crate) fn new(interval: Duration) -> IntervalLog {
        IntervalLog {
            interval,
            last: None,
            events: 0,
        }
    }

    /// Record one event: `Some(n)` when a line is due now, `n` being the events it stands for
    /// (this one and those not logged since the last line); `None` otherwise.
    pub(crate) fn event(&mut self) -> Option<u64> {
        self.events += 1;
        let now = Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < self.interval => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.events))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_follows_the_file_descriptor_limit() {
        // Half of what is left after the reserve: a client connection and its backend one.
        assert_eq!(connections_for(1024), (1024 - 128) / 2);
        assert_eq!(connections_for(1_048_576), (1_048_576 - 128) / 2);
        assert_eq!(connections_for(100), MIN_CONNECTIONS);
        assert_eq!(connections_for(u64::MAX), ((u64::MAX - 128) / 2) as usize);
    }

    #[test]
    fn an_explicit_cap_is_kept_and_warned_about_only_above_the_limit() {
        let n = |n| NonZeroUsize::new(n);
        assert_eq!(effective_max_connections(None, Some(1024)), (448, None));
        assert_eq!(effective_max_connections(n(100), Some(1024)), (100, None));
        assert_eq!(effective_max_connections(n(448), Some(1024)), (448, None));
        let (cap, warning) = effective_max_connections(n(5000), Some(1024));
        assert_eq!(cap, 5000);
        let warning = warning.expect("a warning");
        assert!(warning.starts_with("MAX_CONNECTIONS=5000 "), "{warning}");
        assert!(warning.contains("(1024)") && warning.contains("448"), "{warning}");
        assert_eq!(effective_max_connections(n(5000), None), (5000, None));
        assert_eq!(effective_max_connections(None, None), (448, None));
    }

    #[test]
    fn slots_are_capped_and_given_back_on_drop() {
        let slots = ConnectionSlots::new(2);
        let first = slots.try_acquire().expect("first");
        let second = slots.try_acquire().expect("second");
        assert!(slots.try_acquire().is_none());
        assert_eq!(slots.open(), 2);
        drop(first);
        assert_eq!(slots.open(), 1);
        let third = slots.try_acquire().expect("a slot was given back");
        drop((second, third));
        assert_eq!(slots.open(), 0);
    }

    #[test]
    fn the_default_per_client_cap_keeps_a_quarter_for_the_others() {
        let n = |n| PerClientCap::At(NonZeroUsize::new(n).unwrap());
        assert_eq!(PerClientCap::Default.effective(448), Some(336));
        assert_eq!(PerClientCap::Default.effective(4), Some(3));
        // Below 4, a quarter is nothing: no cap of its own.
        assert_eq!(PerClientCap::Default.effective(3), None);
        assert_eq!(PerClientCap::Default.effective(1), None);
        assert_eq!(PerClientCap::Off.effective(448), None);
        assert_eq!(n(10).effective(448), Some(10));
        assert_eq!(
            n(448).effective(448),
            None,
            "not below MAX_CONNECTIONS: never bites"
        );
        assert_eq!(PerClientCap::parse("0"), Some(PerClientCap::Off));
        assert_eq!(PerClientCap::parse("12"), Some(n(12)));
        assert_eq!(PerClientCap::parse("-1"), None);
        assert_eq!(PerClientCap::parse("half"), None);
    }

    #[test]
    fn a_peer_is_capped_as_the_limiter_keys_it_and_forgotten_at_zero() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let clients = ClientConnections::new(Some(2), 64, &trusted);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let first = clients.try_acquire(ip("203.0.113.7")).expect("first");
        // The same address, mapped into IPv6: the same peer.
        let second = clients.try_acquire(ip("::ffff:203.0.113.7")).expect("second");
        let refused = clients.try_acquire(ip("203.0.113.7")).expect_err("a third");
        assert_eq!(refused.to_string(), "203.0.113.7");
        // Another address is counted apart; two addresses of one /64 are one peer.
        let other = clients.try_acquire(ip("2001:db8:1:2::1")).expect("other");
        let same_net = clients.try_acquire(ip("2001:db8:1:2::ffff")).expect("same /64");
        let refused = clients
            .try_acquire(ip("2001:db8:1:2:aaaa::1"))
            .expect_err("/64 full");
        assert_eq!(refused.to_string(), "2001:db8:1:2::/64");
        // A trusted proxy carries every client: never capped, never counted.
        let proxied: Vec<_> = (0..10)
            .map(|_| clients.try_acquire(ip("10.1.2.3")).expect("a trusted peer"))
            .collect();
        assert_eq!(clients.clients(), 2);
        drop(first);
        let again = clients.try_acquire(ip("203.0.113.7")).expect("a place came back");
        drop((second, again, other, same_net, proxied));
        assert_eq!(clients.clients(), 0, "no entry is kept at zero");
    }

    #[test]
    fn with_no_cap_nothing_is_counted() {
        let clients = ClientConnections::new(None, 64, &[]);
        let held: Vec<_> = (0..100)
            .map(|_| clients.try_acquire([127, 0, 0, 1].into()).expect("no cap"))
            .collect();
        assert_eq!(clients.clients(), 0);
        drop(held);
    }

    #[test]
    fn a_client_s_requests_are_capped_across_its_connections() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let requests = ClientRequests::new(Some(3), 64, &trusted);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let (first, second) = (
            requests.connection(ip("203.0.113.7")),
            requests.connection(ip("::ffff:203.0.113.7")),
        );
        let mut held = vec![
            first.try_acquire().unwrap().expect("counted"),
            second.try_acquire().unwrap().expect("counted"),
            first.try_acquire().unwrap().expect("counted"),
        ];
        assert!(
            first.try_acquire().is_err(),
            "three in flight, on either connection"
        );
        assert!(second.try_acquire().is_err());
        // Another address, and a /64 other than the first's, are counted apart.
        let other = requests.connection(ip("2001:db8:1:2::1"));
        let other_place = other.try_acquire().unwrap().expect("counted apart");
        assert_eq!(requests.clients(), 2);
        held.pop();
        held.push(second.try_acquire().unwrap().expect("a place came back"));
        // A trusted proxy carries every client: never capped, never counted.
        let proxy = requests.connection(ip("10.1.2.3"));
        assert!((0..100).all(|_| matches!(proxy.try_acquire(), Ok(None))));
        assert_eq!(requests.clients(), 2);
        // The entry outlives its connections while a request they let in is in flight.
        drop((first, second));
        assert_eq!(requests.clients(), 2);
        let again = requests.connection(ip("203.0.113.7"));
        assert!(again.try_acquire().is_err(), "the count went on");
        drop(held);
        assert!(again.try_acquire().unwrap().is_some());
        drop((again, other, other_place));
        assert_eq!(requests.clients(), 0, "no entry is kept without a connection");
        let off = ClientRequests::new(None, 64, &[]);
        assert!(matches!(
            off.connection(ip("203.0.113.7")).try_acquire(),
            Ok(None)
        ));
        assert_eq!(off.clients(), 0);
    }

    #[test]
    fn only_client_side_accept_errors_are_skipped_without_backing_off() {
        assert!(is_connection_error(&io::ErrorKind::ConnectionAborted.into()));
        assert!(is_connection_error(&io::ErrorKind::ConnectionReset.into()));
        // EMFILE ("Too many open files") and ENFILE on Linux and macOS alike.
        assert!(!is_connection_error(&io::Error::from_raw_os_error(24)));
        assert!(!is_connection_error(&io::Error::from_raw_os_error(23)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_recurring_event_is_logged_once_per_interval_with_a_count() {
        let mut log = IntervalLog::new(Duration::from_secs(10));
        assert_eq!(log.event(), Some(1), "the first is logged at once");
        for _ in 0..999 {
            assert_eq!(log.event(), None);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(log.event(), Some(1000), "999 unlogged, and this one");
        assert_eq!(log.event(), None);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(log.event(), Some(2));
    }
}
