//! The test harness: real sockets all the way. A recording backend, the gateway served
//! in-process on `127.0.0.1:0` (or the real binary), `redis-server` processes on free ports,
//! and a small client that can connect from any 127.x source address.

pub mod backend;
pub mod client;
pub mod gateway;
pub mod redis;

pub use backend::Backend;
pub use client::{Reply, get, get_from, raw_status_line, read_head, request};
pub use gateway::Gateway;
pub use redis::{RedisCluster, RedisServer};

use std::net::TcpListener;

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` distinct free ports: each is held until all are picked, so two calls in a row cannot
/// hand out the same port twice (the kernel reuses a released one readily).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("no free port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("a bound address").port())
}
