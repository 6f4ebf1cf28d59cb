//! What `STATE_FILE` costs at a million clients: the time to save the memory store (copy out,
//! encode, write, fsync, rename, fsync of the directory), the time to load it back into an
//! empty store (read, checksum, parse, restore through the store's insertion path), and the
//! file's size. Release build, on the file system of the temporary directory (or of
//! `STATE_BENCH_DIR`).
//!
//! ```sh
//! cargo run --release --example state_file_bench            # 1,000,000 clients, 5 rounds
//! STATE_BENCH_CLIENTS=100000 STATE_BENCH_ROUNDS=3 cargo run --release --example state_file_bench
//! ```
//!
//! Two stores of one rule each: a token bucket keyed by IPv4 address (the default
//! configuration's case, the smallest record) and a sliding window keyed by address and API key
//! (`KEY_BY=ip+header:...`, the largest fixed-size record). Each round saves and loads once;
//! the median and the range of the rounds are printed.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::algorithms::Policy;
use tollgate::algorithms::{SlidingWindow, TokenBucket};
use tollgate::rules::key::Digest;
use tollgate::rules::{ClientIp, ClientKey, Rule};
use tollgate::stores::MemoryStore;
use tollgate::stores::state_file;

fn number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn median_and_range(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "{:.0} ms [{:.0}-{:.0}]",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    )
}

fn main() {
    let clients = number("STATE_BENCH_CLIENTS", 1_000_000);
    let rounds = number("STATE_BENCH_ROUNDS", 5).max(1);
    let dir = match std::env::var_os("STATE_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("a temporary directory");
    let path = dir.path().join("tollgate.state");
    let fingerprint = [0; 16];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let scenarios = [
        (
            "token bucket, IPv4 keys",
            Policy::TokenBucket(TokenBucket {
                capacity: 100,
                // A token a minute: nothing spent is back before the load.
                interval_us: 60_000_000,
            }),
            false,
        ),
        (
            "sliding window, IPv4 + header keys",
            Policy::SlidingWindow(SlidingWindow {
                limit: 100,
                window_ms: 3_600_000,
            }),
            true,
        ),
    ];
    println!("{clients} clients, {rounds} rounds, in {}", dir.path().display());
    for (name, policy, header) in scenarios {
        let rules = [Rule::new(0, "general", policy)];
        // Twice the room: shards fill unevenly, and none may evict before the save.
        let room = NonZeroUsize::new(clients * 2).expect("clients > 0");
        let store = MemoryStore::new(room, &rules);
        for n in 0..clients as u32 {
            let ip = ClientIp::new(std::net::Ipv4Addr::from(0x0A00_0000 + n).into(), 64);
            let key = if header {
                let mut digest = [0; 16];
                digest[..4].copy_from_slice(&n.to_le_bytes());
                ClientKey::IpAndHeader(ip, Digest::from_bytes(digest))
            } else {
                ClientKey::Ip(ip)
            };
            store.check_at(&rules[0], key, tollgate::algorithms::Cost::from(1 + n % 7), now);
        }
        assert_eq!(store.len(), clients, "every client held");
        let (mut saves, mut loads, mut encodes) = (Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..rounds {
            // The part that takes the shard locks, one at a time (64 shards a rule here).
            let started = Instant::now();
            let (file, _) = state_file::encode(&store, &rules, fingerprint);
            encodes.push(started.elapsed());
            drop(file);
            let saved = state_file::save(&path, &store, &rules, fingerprint).expect("saved");
            assert_eq!(saved.clients, clients as u64);
            bytes = saved.bytes;
            saves.push(saved.duration);
            let fresh = MemoryStore::new(room, &rules);
            let started = Instant::now();
            let loaded = state_file::load(&path, &fresh, &rules, fingerprint)
                .expect("loaded")
                .expect("a file");
            loads.push(started.elapsed());
            assert_eq!(loaded.restored(), clients as u64);
            assert_eq!(fresh.len(), clients);
        }
        println!(
            "{name}: file {:.1} MB ({:.1} bytes a client); save {} (of which copying out and \
             encoding {}); load {}",
            bytes as f64 / 1e6,
            bytes as f64 / clients as f64,
            median_and_range(saves),
            median_and_range(encodes),
            median_and_range(loads),
        );
    }
}
