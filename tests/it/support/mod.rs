//! The test harness: real sockets all the way. A recording backend, the gateway served
//! in-process on `127.0.0.1:0` (or the real binary), `redis-server` processes on free ports,
//! and a small client that can connect from any 127.x source address.

pub mod backend;
pub mod client;
pub mod gateway;
pub mod otlp;
pub mod redis;

pub use backend::Backend;
pub use client::{Reply, get, get_from, raw_status_line, read_head, request};
pub use gateway::Gateway;
pub use redis::{RedisCluster, RedisServer, SentinelGroup, admitted_at_once};

use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// A TCP port nothing listens on right now (see [`free_ports`]).
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` distinct ports nothing listens on right now, for servers a test starts later, or
/// kills and restarts on the same port.
///
/// They are taken below the kernel's ephemeral range (`ip_local_port_range`), never from it
/// (`bind` to port 0 would): while such a server is down, the gateway keeps reconnecting to
/// it, and a port in the ephemeral range can be handed to one of those outgoing connections
/// as its own address (on loopback, even connecting it to itself), so the server could not
/// bind its port again. Each port is handed out once per process, from a random start, and
/// is held until all `N` are picked. They are below 20,000, and the port 10,000 above each (a
/// Redis Cluster node's bus) is below the ephemeral range too and never handed out itself.
pub fn free_ports<const N: usize>() -> [u16; N] {
    /// Ports from here up to 20,000 (or 10,000 below the ephemeral range) are handed out.
    const FIRST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Up to 20,000 at most, so the bus ports (20,000 and up) are never handed out themselves.
    let end = ephemeral_range_start().saturating_sub(10_000).min(20_000);
    assert!(
        end >= FIRST + 1_000,
        "the ephemeral range starts too low for ports below it (ip_local_port_range)"
    );
    let span = end - FIRST;
    // A random start (std's hasher is seeded randomly in each process), so test processes
    // running at once take ports far apart.
    let start = RandomState::new().hash_one(std::process::id()) % u64::from(span);
    let _ = NEXT.compare_exchange(0, start as u32 + 1, Ordering::Relaxed, Ordering::Relaxed);
    let mut held: Vec<TcpListener> = Vec::with_capacity(N);
    for _ in 0..span {
        if held.len() == N {
            break;
        }
        let port = FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    assert_eq!(held.len(), N, "no {N} free ports below the ephemeral range");
    std::array::from_fn(|i| held[i].local_addr().expect("a bound address").port())
}

/// The first port of the kernel's ephemeral range (32768 unless configured otherwise).
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
