//! Redis-backed decisions per second, at 1 and at 64 concurrent callers, through
//! `tollgate::stores::RedisStore` (one multiplexed connection, `EVALSHA` of
//! `scripts/token_bucket.lua`), against a `redis-server` this bench starts on a free port.
//!
//! After the criterion measurements (only under `cargo bench`, not in `--test` or `--list`
//! mode), the same Redis is measured with `redis-benchmark` running a comparable `EVALSHA`
//! (same script, same arguments, keys spread over as many clients), interleaved with runs of
//! the store, and the ratio store / redis-benchmark is printed: how close one multiplexed
//! connection gets to what the server itself can do.
//!
//! Needs `redis-server` and `redis-benchmark` (Debian: redis-server, redis-tools);
//! `scripts/bench.sh` installs them when missing.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tollgate::algorithms::TokenBucket;
use tollgate::algorithms::{Cost, Policy};
use tollgate::rules::{ClientKey, Rule};
use tollgate::stores::{RedisStore, RedisTarget};

const TOKEN_BUCKET_LUA: &str = include_str!("../scripts/token_bucket.lua");

/// Distinct clients the calls are spread over (`redis-benchmark -r` gets the same number).
const CLIENTS: u64 = 100_000;

/// Capacity and microseconds per token, as passed to the script by both sides: with
/// `CLIENTS` keys taking turns, every decision is allowed and writes its key.
const CAPACITY: u64 = 100_000;
const INTERVAL_US: u64 = 1_000;

/// A deadline on the Redis clock (µs, below 2^53) that no run reaches: the script checks it as
/// it checks the store's.
const FAR_DEADLINE_US: &str = "9000000000000000";

/// Decisions per side and round in the side-by-side comparison.
const COMPARE_DECISIONS: u64 = 100_000;
const COMPARE_ROUNDS: usize = 3;

/// A `redis-server` on a free loopback port, killed when dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is required for this bench (apt-get install redis-server)");
        let server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.answers_ping() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rule() -> Rule {
    Rule::new(
        0,
        "general",
        Policy::TokenBucket(TokenBucket {
            capacity: CAPACITY,
            interval_us: INTERVAL_US,
        }),
    )
}

fn client(n: u64) -> ClientKey {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000_u32.wrapping_add((n % CLIENTS) as u32))).into()
}

/// `decisions` decisions split over `callers` concurrent tasks, each waiting for its answer
/// before asking again (as a request would); returns the wall time. Client numbers start at
/// `first_client`, so consecutive runs keep walking the key space.
async fn run(store: &RedisStore, callers: u64, decisions: u64, first_client: u64) -> Duration {
    let rule = std::sync::Arc::new(rule());
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for caller in 0..callers {
        let share = decisions / callers + u64::from(caller < decisions % callers);
        let (store, rule) = (store.clone(), rule.clone());
        tasks.spawn(async move {
            for i in 0..share {
                let ip = client(first_client + i * callers + caller);
                store.check(&rule, ip, Cost::ONE).await.expect("redis answered");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("bench task panicked");
    }
    start.elapsed()
}

fn store(server: &RedisServer) -> RedisStore {
    // A generous timeout: this measures throughput, a timeout would only abort the bench.
    RedisStore::new(
        &RedisTarget::Single(server.url()),
        "bench:",
        Duration::from_millis(1000),
    )
    .expect("a valid redis URL")
}

fn criterion_benches(c: &mut Criterion, runtime: &Runtime, store: &RedisStore) {
    let mut group = c.benchmark_group("redis");
    group.throughput(Throughput::Elements(1));
    // Equal, large samples: with criterion's default linear sampling the first samples are a
    // few dozen calls, too few to keep 64 callers busy, and the ramp-up would be measured.
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
    let mut next_client = 0u64;
    for callers in [1u64, 64] {
        group.bench_function(format!("{callers}_callers"), |b| {
            b.iter_custom(|iters| {
                let elapsed = runtime.block_on(run(store, callers, iters, next_client));
                next_client += iters;
                elapsed
            })
        });
    }
    group.finish();
}

/// `redis-benchmark`'s requests per second for the same `EVALSHA` the store sends.
fn redis_benchmark(port: u16, sha: &str, connections: u64, pipeline: u64) -> f64 {
    let output = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q"])
        .args(["-n", &COMPARE_DECISIONS.to_string()])
        .args(["-c", &connections.to_string(), "-P", &pipeline.to_string()])
        .args(["-r", &CLIENTS.to_string()])
        // Key shaped like the store's ("bench:{general:10.0.0.1}:tb"), same arguments: "" so
        // the script reads the Redis clock, as in production, "" for a decision (not a
        // refund), and a deadline (one never reached, in 2255) for the script to check.
        .args(["EVALSHA", sha, "1", "bench:{k:__rand_int__}:tb"])
        .args([
            &CAPACITY.to_string(),
            &INTERVAL_US.to_string(),
            "1",
            "",
            "",
            FAR_DEADLINE_US,
        ])
        .output()
        .expect("redis-benchmark is required for this bench (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&output.stdout);
    // -q prints progress lines separated by '\r', then "<command>: N requests per second, ...".
    text.split(['\r', '\n'])
        .filter_map(|line| line.split_once(" requests per second"))
        .filter_map(|(before, _)| before.split_whitespace().last()?.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Interleaves the store and `redis-benchmark` on the same server and prints both rates and
/// their ratio (medians of a few rounds, so one noisy moment does not decide it).
fn compare_with_redis_benchmark(server: &RedisServer, runtime: &Runtime, store: &RedisStore) {
    let sha: String = runtime.block_on(async {
        let client = redis::Client::open(server.url()).expect("redis URL");
        let mut connection = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(TOKEN_BUCKET_LUA)
            .query_async(&mut connection)
            .await
            .expect("SCRIPT LOAD")
    });
    assert_eq!(
        sha,
        redis::Script::new(TOKEN_BUCKET_LUA).get_hash(),
        "same script as the store's"
    );

    println!(
        "\nside by side on 127.0.0.1:{}: {COMPARE_DECISIONS} EVALSHA token_bucket.lua per run, \
         keys over {CLIENTS} clients, median of {COMPARE_ROUNDS} rounds",
        server.port
    );
    let mut next_client = 1u64 << 32;
    for callers in [1u64, 64] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..COMPARE_ROUNDS {
            let elapsed = runtime.block_on(run(store, callers, COMPARE_DECISIONS, next_client));
            next_client += COMPARE_DECISIONS;
            ours.push(COMPARE_DECISIONS as f64 / elapsed.as_secs_f64());
            theirs.push(redis_benchmark(server.port, &sha, callers, 1));
        }
        let (ours, theirs) = (median(ours), median(theirs));
        println!(
            "  {callers:>2} caller(s): tollgate RedisStore {ours:>9.0} decisions/s   \
             redis-benchmark -c {callers:<2} {theirs:>9.0} req/s   ratio {:.2}",
            ours / theirs
        );
    }
    // What one connection can carry when 64 calls are in flight on it, as the store's
    // multiplexed connection does with 64 callers.
    let pipelined = median(
        (0..COMPARE_ROUNDS)
            .map(|_| redis_benchmark(server.port, &sha, 1, 64))
            .collect(),
    );
    println!("  reference: redis-benchmark -c 1 -P 64 (one connection, 64 pipelined) {pipelined:.0} req/s\n");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Under `cargo bench` the harness gets --bench; --test and --list only check the bench.
    let measuring =
        args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test" || a == "--list");

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The store's connection manager spawns onto the runtime, so build it inside one.
    let store = {
        let _runtime = runtime.enter();
        store(&server)
    };
    // Connect (lazily) and load the script before anything is timed.
    runtime
        .block_on(store.check(&rule(), client(0), Cost::ONE))
        .expect("redis answers");

    let mut criterion = Criterion::default().configure_from_args();
    criterion_benches(&mut criterion, &runtime, &store);
    if measuring {
        compare_with_redis_benchmark(&server, &runtime, &store);
    }
    criterion.final_summary();
}
