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
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("no free port")
}
