//! Memory per client of the in-memory store, as the operating system sees it (RSS).
//!
//! Builds a `MemoryStore`, fills it with distinct clients, and reads `VmRSS` from
//! `/proc/self/status` (Linux only) before the store exists, once it is built and once it is
//! full. Bytes per client is the growth divided by the clients held, so it counts everything
//! the store costs: its tables, their empty slack, and the allocator's overhead.
//!
//! ```sh
//! cargo run --release --example memory_per_client                      # 1,000,000 IPv4 clients
//! cargo run --release --example memory_per_client -- 1000000 2000000    # CLIENTS MAX_KEYS
//! cargo run --release --example memory_per_client -- 1000000 1000000 header
//! ```
//!
//! Arguments: the number of clients (default 1,000,000); `MAX_KEYS` (default: the number of
//! clients, a store exactly full); the key kind, `ip` (IPv4 addresses, the default), `ipv6`, or
//! `header` (an API-key digest, the largest key). Every client is held under a token bucket
//! rule, the default algorithm, with a budget none of them exhausts or refills during the run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroUsize;
use std::process::ExitCode;

use tollgate::algorithms::Policy;
use tollgate::algorithms::TokenBucket;
use tollgate::rules::{ClientIp, ClientKey, KeyBy, KeyHasher, Rule};
use tollgate::stores::MemoryStore;

/// Resident set size of this process, in bytes.
fn rss_bytes() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("reading /proc/self/status (Linux only): {e}"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .ok_or("no VmRSS line in /proc/self/status")?;
    Ok(kib * 1024)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memory_per_client: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let clients: u32 = match args.next() {
        Some(n) => n.parse().map_err(|_| format!("CLIENTS: {n:?} is not a number"))?,
        None => 1_000_000,
    };
    let max_keys = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("MAX_KEYS: {n:?} is not a number"))?,
        None => clients as usize,
    };
    let max_keys = NonZeroUsize::new(max_keys).ok_or("MAX_KEYS must be at least 1")?;
    let kind = args.next().unwrap_or_else(|| "ip".into());
    let hasher = KeyHasher::from_secret("memory_per_client");
    let by_header = KeyBy::parse("header:x-api-key")?;
    let client = |n: u32| -> Result<ClientKey, String> {
        Ok(match kind.as_str() {
            "ip" => IpAddr::V4(Ipv4Addr::from(0x0A00_0000_u32.wrapping_add(n))).into(),
            "ipv6" => IpAddr::V6(Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(n) << 64)).into(),
            "header" => {
                let ip = ClientIp::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 64);
                ClientKey::new(&by_header, ip, Some(&[&n.to_le_bytes()]), &hasher)
            }
            other => return Err(format!("key kind {other:?}: ip, ipv6 or header")),
        })
    };
    let rule = Rule::new(
        0,
        "general",
        Policy::TokenBucket(TokenBucket {
            capacity: 1_000_000_000,
            interval_us: 1,
        }),
    );

    let before = rss_bytes()?;
    let store = MemoryStore::new(max_keys, std::slice::from_ref(&rule));
    let built = rss_bytes()?;
    for n in 0..clients {
        store.check_at(&rule, client(n)?, tollgate::algorithms::Cost::ONE, u64::from(n));
    }
    let filled = rss_bytes()?;

    let held = store.len() as u64;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!("clients offered     {clients}");
    println!("MAX_KEYS            {max_keys}");
    println!("key kind            {kind}");
    println!("clients held        {held} ({} evicted)", store.evictions());
    println!("RSS before          {:>9.1} MiB", mib(before));
    println!(
        "RSS, empty store    {:>9.1} MiB (+{:.1})",
        mib(built),
        mib(built - before)
    );
    println!(
        "RSS, filled store   {:>9.1} MiB (+{:.1})",
        mib(filled),
        mib(filled - before)
    );
    if held > 0 {
        println!(
            "bytes per client    {:>9.1}",
            filled.saturating_sub(before) as f64 / held as f64
        );
    }
    Ok(())
}
