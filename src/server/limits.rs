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

use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// File descriptors kept apart from client connections and their backend connections: the
/// standard streams, the listeners, the runtime's own, Redis connections (one per cluster
/// master, plus reconnects), admin-listener scrapes and probes.
pub const RESERVED_FDS: u64 = 128;

/// The smallest `MAX_CONNECTIONS` sized from a file-descriptor limit, however low.
pub const MIN_CONNECTIONS: usize = 16;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and return the new soft limit. Called
/// once by the binary at startup; a library user decides for its own process.
pub fn raise_fd_limit() -> io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// The soft `RLIMIT_NOFILE` in force, if it can be read.
pub fn fd_limit() -> Option<u64> {
    rlimit::Resource::NOFILE.get().ok().map(|(soft, _)| soft)
}

/// `MAX_CONNECTIONS` as it follows from a soft file-descriptor limit: what is left after
/// [`RESERVED_FDS`], halved because a forwarded request holds a backend connection too, and
/// never below [`MIN_CONNECTIONS`].
pub fn connections_for(fd_limit: u64) -> usize {
    let pairs = fd_limit.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(pairs).unwrap_or(usize::MAX).max(MIN_CONNECTIONS)
}

/// The cap in force and, when an explicit `MAX_CONNECTIONS` is more than the file-descriptor
/// limit leaves room for, a warning saying so (it is kept: the operator may know the traffic
/// holds few backend connections, and running out is survivable, only slower to recover).
pub fn effective_max_connections(
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
pub struct ConnectionSlots {
    /// Connections open now (sockets not yet closed, tunnels included).
    open: Arc<AtomicUsize>,
    /// `MAX_CONNECTIONS`.
    max: usize,
}

impl ConnectionSlots {
    /// At most `max` at once.
    pub fn new(max: usize) -> ConnectionSlots {
        ConnectionSlots {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A slot for one more connection, or `None` when `max` are open.
    pub fn try_acquire(&self) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self.open.clone()))
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// `MAX_CONNECTIONS`.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// One connection's place under `MAX_CONNECTIONS`, given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a failed `accept` concerns only the connection being accepted (the client gave
/// up before we took it), so the loop carries on at once; anything else (`EMFILE`, `ENFILE`,
/// `ENOBUFS`, `ENOMEM`) is about the process or the system, and the loop backs off.
pub fn is_connection_error(error: &io::Error) -> bool {
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
pub struct IntervalLog {
    /// At most one line per this.
    interval: Duration,
    /// When the last line was admitted.
    last: Option<Instant>,
    /// Events since then, the current one included.
    events: u64,
}

impl IntervalLog {
    /// One line per `interval` at most.
    pub fn new(interval: Duration) -> IntervalLog {
        IntervalLog {
            interval,
            last: None,
            events: 0,
        }
    }

    /// Record one event: `Some(n)` when a line is due now, `n` being the events it stands for
    /// (this one and those not logged since the last line); `None` otherwise.
    pub fn event(&mut self) -> Option<u64> {
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
