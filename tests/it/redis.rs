//! The Redis store: exact limits across replicas, the same decisions as memory, TTLs, and
//! script reloading.

use std::net::IpAddr;
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use tollgate::algorithms::{Cost, Limits, Policy};
use tollgate::algorithms::{
    FixedWindow, SlidingLog, SlidingWindow, TokenBucket, batch_script, function_library,
};
use tollgate::rules::Rule;
use tollgate::stores::{MemoryStore, RedisStore, RedisTarget};

use crate::binary::Running;
use crate::support::{Backend, Gateway, RedisServer, get, get_from};

/// Budget 25, no refill worth speaking of during a test, for every algorithm. The fixed
/// window is 10^7 s long, so a window boundary (aligned to the epoch) almost never falls
/// inside a test run and splits the budget.
pub const EXACT_25: [&[(&str, &str)]; 5] = [
    &[
        ("ALGORITHM", "token_bucket"),
        ("MAX_TOKENS", "25"),
        ("REFILL_RATE", "0.0001"),
    ],
    &[
        ("ALGORITHM", "gcra"),
        ("MAX_TOKENS", "25"),
        ("REFILL_RATE", "0.0001"),
    ],
    &[
        ("ALGORITHM", "sliding_window"),
        ("LIMIT", "25"),
        ("WINDOW_SIZE", "3600"),
    ],
    &[
        ("ALGORITHM", "fixed_window"),
        ("LIMIT", "25"),
        ("WINDOW_SIZE", "10000000"),
    ],
    &[
        ("ALGORITHM", "sliding_log"),
        ("LIMIT", "25"),
        ("WINDOW_SIZE", "3600"),
    ],
];

/// 300 concurrent requests from each of `clients`, spread round-robin over `gateways`;
/// returns how many got 200 per client.
pub async fn flood(gateways: &[Gateway], clients: &[IpAddr]) -> Vec<usize> {
    let mut counts = Vec::new();
    for client in clients {
        let replies =
            join_all((0..300).map(|i| get_from(gateways[i % gateways.len()].addr, *client, "/", &[]))).await;
        for reply in &replies {
            assert!(
                reply.status == StatusCode::OK || reply.status == StatusCode::TOO_MANY_REQUESTS,
                "unexpected {}",
                reply.status
            );
            // Only a decision carries Remaining (and Limit 25, not the backend's own 999).
            assert!(
                reply.headers.contains_key("x-ratelimit-remaining"),
                "decided by redis"
            );
            assert_eq!(reply.number("x-ratelimit-limit"), 25);
        }
        counts.push(replies.iter().filter(|r| r.status == StatusCode::OK).count());
    }
    counts
}

#[tokio::test]
async fn three_replicas_share_one_exact_budget() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    for algorithm in EXACT_25 {
        let prefix = format!("exact-{}:", algorithm[0].1);
        let mut vars = vec![
            ("REDIS_ADDR", redis.addr()),
            ("KEY_PREFIX", prefix),
            ("REDIS_TIMEOUT_MS", "5000".into()),
        ];
        vars.extend(algorithm.iter().map(|(k, v)| (*k, v.to_string())));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut gateways = Vec::new();
        for _ in 0..3 {
            gateways.push(Gateway::start(&backend.url(), &vars).await);
        }
        let allowed = flood(&gateways, &["127.0.0.1".parse().unwrap()]).await;
        assert_eq!(allowed, [25], "{algorithm:?}");
    }
}

/// Issue 28: at the default `REDIS_TIMEOUT_MS` (50 ms) a loaded machine made three replicas
/// of a sliding log admit 94 of 25 at `FAIL_MODE=open`: their calls waited behind the
/// machine, not behind Redis, timed out into the fail mode, and the timeouts opened the
/// circuit breaker, which let the rest through unlimited. A decision now waits on while Redis
/// keeps answering (`RedisStore::patiently`). Three replicas (the binary, each a process of
/// its own, having served a request before) take a flood of 300 while busy loops of this test
/// keep every core loaded; at the default timeout, every answer is decided and the budget is
/// exact. (`TOLLGATE_UNDER_TEST` runs it on another build.)
#[tokio::test]
async fn three_replicas_hold_one_exact_budget_on_a_loaded_machine_at_the_default_timeout() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = backend.url();
    let addr = redis.addr();
    let vars = [
        ("BACKEND_URL", url.as_str()),
        ("REDIS_ADDR", addr.as_str()),
        ("ALGORITHM", "sliding_log"),
        ("LIMIT", "25"),
        ("WINDOW_SIZE", "3600"),
    ];
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&vars)).collect();
    // Each has served before: connected, its Redis clock estimated.
    for replica in &replicas {
        assert_eq!(get(replica.addr, "/").await.status, StatusCode::OK);
    }
    let hogs = CpuHogs::start();
    let replies = join_all((0..300).map(|i| get(replicas[i % 3].addr, "/"))).await;
    drop(hogs);
    let undecided = replies
        .iter()
        .filter(|reply| !reply.headers.contains_key("x-ratelimit-remaining"))
        .count();
    let allowed = replies
        .iter()
        .filter(|reply| reply.status == StatusCode::OK)
        .count();
    let warnings: Vec<String> = replicas
        .iter()
        .flat_map(|replica| {
            replica
                .log()
                .lines()
                .filter(|line| line.contains("WARN"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .take(8)
        .collect();
    assert_eq!(
        undecided, 0,
        "answered by the fail mode; {allowed} allowed; {warnings:#?}"
    );
    assert_eq!(allowed, 25 - 3, "the budget of 25, 3 spent before");
}

/// Busy loops, one per core, until dropped.
struct CpuHogs(Vec<std::process::Child>);

impl CpuHogs {
    fn start() -> CpuHogs {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        CpuHogs(
            (0..cores)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}

#[tokio::test]
async fn keys_are_hash_tagged_and_all_expire() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    for (algorithm, prefix) in [
        ("token_bucket", "ttl-tb:"),
        ("sliding_window", "ttl-sw:"),
        ("fixed_window", "ttl-fw:"),
        ("sliding_log", "ttl-sl:"),
    ] {
        let gateway = Gateway::start(
            &backend.url(),
            &[
                ("REDIS_ADDR", &redis.addr()),
                ("ALGORITHM", algorithm),
                ("KEY_PREFIX", prefix),
                // The general bucket is full again 10 s after a request: its key outlives a
                // slow (loaded) test run between the request and the TTL read.
                ("REFILL_RATE", "0.1"),
            ],
        )
        .await;
        get(gateway.addr, "/").await;
        get(gateway.addr, "/login").await;
        get_from(gateway.addr, "127.0.0.9".parse().unwrap(), "/", &[]).await;
    }
    let mut keys: Vec<String> = redis.cli(&["--scan"]).lines().map(str::to_owned).collect();
    keys.sort();
    // Each key ends in its policy's fingerprint: 8 hex digits; a fixed or sliding window's
    // count is on a key per window, the fingerprint then `:` and the window's index.
    let unprinted: Vec<&str> = keys
        .iter()
        .map(|key| {
            let key = match key.rsplit_once(':') {
                Some((key, index))
                    if key.ends_with(|c: char| c.is_ascii_hexdigit())
                        && (key.contains(":fw:") || key.contains(":sw:")) =>
                {
                    assert!(index.bytes().all(|b| b.is_ascii_digit()), "{key}:{index}");
                    key
                }
                _ => key.as_str(),
            };
            let (key, fingerprint) = key.rsplit_once(':').unwrap();
            assert!(
                fingerprint.len() == 8 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()),
                "{key}"
            );
            key
        })
        .collect();
    assert_eq!(
        unprinted,
        [
            "ttl-fw:{auth:127.0.0.1}:fw",
            "ttl-fw:{general:127.0.0.1}:fw",
            "ttl-fw:{general:127.0.0.9}:fw",
            "ttl-sl:{auth:127.0.0.1}:sl",
            "ttl-sl:{general:127.0.0.1}:sl",
            "ttl-sl:{general:127.0.0.9}:sl",
            "ttl-sw:{auth:127.0.0.1}:sw",
            "ttl-sw:{general:127.0.0.1}:sw",
            "ttl-sw:{general:127.0.0.9}:sw",
            "ttl-tb:{auth:127.0.0.1}:tb",
            "ttl-tb:{general:127.0.0.1}:tb",
            "ttl-tb:{general:127.0.0.9}:tb",
        ]
    );
    for key in &keys {
        let ttl: i64 = redis.cli(&["TTL", key]).trim().parse().unwrap();
        assert!(ttl >= 1, "{key} has TTL {ttl}");
    }
    // Token bucket keys live until the bucket is full again: 10 s for the general rule
    // (one token at 0.1/s), 100 s for auth (one token at 0.01/s); a sliding window's count two
    // windows and a second from its first count (set once).
    let ttl = |key: &str| {
        let key = keys.iter().find(|full| full.starts_with(key)).unwrap();
        redis.cli(&["TTL", key]).trim().parse::<i64>().unwrap()
    };
    assert!((1..=10).contains(&ttl("ttl-tb:{general:127.0.0.1}:tb")));
    assert!((99..=100).contains(&ttl("ttl-tb:{auth:127.0.0.1}:tb")));
    assert!((115..=121).contains(&ttl("ttl-sw:{general:127.0.0.1}:sw")));
    // A fixed window's count lives to the window's end (and a second, from its first count:
    // set once), a log's until its newest entry expires.
    assert!((1..=61).contains(&ttl("ttl-fw:{general:127.0.0.1}:fw")));
    assert!((59..=60).contains(&ttl("ttl-sl:{general:127.0.0.1}:sl")));
}

/// A gateway on a fresh Redis decides one request (4 of 5 left), `checked` looks at Redis, Redis
/// is sent `flush` (`SCRIPT FLUSH`, `FUNCTION FLUSH`), and a second request must still be
/// decided by Redis (3 left: `why`). The Redis, for what a test checks next.
async fn decided_again_after_a_flush(flush: &str, checked: impl Fn(&RedisServer), why: &str) -> RedisServer {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("REDIS_ADDR", &redis.addr()), ("MAX_TOKENS", "5")],
    )
    .await;
    assert_eq!(get(gateway.addr, "/").await.number("x-ratelimit-remaining"), 4);
    checked(&redis);
    assert_eq!(redis.cli(&[flush, "FLUSH"]).trim(), "OK");
    let reply = get(gateway.addr, "/").await;
    assert_eq!(reply.number("x-ratelimit-remaining"), 3, "{why}");
    redis
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    decided_again_after_a_flush("SCRIPT", |_| {}, "decided by redis after NOSCRIPT").await;
}

/// Decisions are `FCALL`s of the function library, loaded once: a Redis whose functions were
/// flushed (or a new master) answers "Function not found", and the library is loaded again.
#[tokio::test]
async fn functions_are_reloaded_after_function_flush() {
    let redis = decided_again_after_a_flush(
        "FUNCTION",
        |redis| assert_eq!(redis.calls("evalsha"), 0, "decided by FCALL"),
        "decided by redis after the library was loaded again",
    )
    .await;
    let loaded = redis.cli(&["FUNCTION", "LIST", "LIBRARYNAME", function_library().name()]);
    assert!(loaded.contains(function_library().decide(0)), "{loaded}");
}

/// A Redis user the ACL forbids `FUNCTION` is still decided for, by `EVALSHA` of the scripts,
/// with the same budget.
#[tokio::test]
async fn a_user_without_functions_is_decided_by_scripts() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url_of_user_without("nofunctions", "-function");
    let gateway = Gateway::start(&backend.url(), &[("REDIS_URL", &url), ("MAX_TOKENS", "5")]).await;
    for remaining in (0..5).rev() {
        assert_eq!(
            get(gateway.addr, "/").await.number("x-ratelimit-remaining"),
            remaining
        );
    }
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(redis.calls("evalsha") >= 4, "decided by scripts");
}

/// A Redis (or a machine) under load answers late for a while: here it is frozen 80 ms out of
/// every 120, longer than `REDIS_TIMEOUT_MS` (50 ms). A fixed timeout handed every call sent
/// early in a pause to the fail mode (issue 28: three replicas of a sliding log admitted 94 of
/// 25 at `FAIL_MODE=open`); the deadline now follows the lag replies show, so after the first
/// pauses the decisions wait for their answers (but for a pause a loaded machine stretches past
/// the 200 ms bound), and the budget is exact.
#[tokio::test]
async fn decisions_wait_longer_while_redis_answers_late() {
    let redis = RedisServer::start();
    let store = RedisStore::new(
        &RedisTarget::Single(redis.url()),
        "late:",
        Duration::from_millis(50),
    )
    .unwrap()
    .with_calls_in_flight(0);
    let policy = Policy::TokenBucket(TokenBucket {
        capacity: 25,
        interval_us: 1_000_000_000,
    });
    let rule = Rule::new(0, "general", policy);
    let client: IpAddr = "192.0.2.9".parse().unwrap();
    // Loads the library and gives the clock its first estimate, on another client's budget
    // (a first call that loads the library may take longer than 50 ms on a busy machine).
    let warm: IpAddr = "192.0.2.10".parse().unwrap();
    for _ in 0..20 {
        if store.check(&rule, warm.into(), Cost::ONE).await.is_ok() {
            break;
        }
    }
    let info = redis.cli(&["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let pauses = std::thread::spawn(move || {
        let signal = |signal: &str| {
            let status = std::process::Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap();
            assert!(status.success());
        };
        for _ in 0..20 {
            signal("-STOP");
            std::thread::sleep(Duration::from_millis(80));
            signal("-CONT");
            std::thread::sleep(Duration::from_millis(40));
        }
    });
    let start = tokio::time::Instant::now();
    let (mut allowed, mut failed_early, mut failed_late) = (0, 0, 0);
    while !pauses.is_finished() {
        match store.check(&rule, client.into(), Cost::ONE).await {
            Ok(decision) => allowed += u64::from(decision.allowed),
            Err(_) if start.elapsed() < Duration::from_millis(700) => failed_early += 1,
            Err(error) => {
                failed_late += 1;
                eprintln!("late failure at {:?}: {error}", start.elapsed());
            }
        }
    }
    pauses.join().unwrap();
    redis.thaw();
    // A fixed timeout fails a call in most pauses (this test fails with the lag set to zero);
    // a pause stretched past 200 ms by a loaded machine may still fail one or two.
    assert!(
        failed_late <= 2,
        "{failed_late} decisions timed out after the first pauses ({failed_early} before)"
    );
    // A call given up on just as its deadline passed may still have been counted by Redis.
    assert!(
        (25 - failed_early.min(25)..=25).contains(&allowed),
        "{allowed} allowed of 25, {failed_early} failed"
    );
}

/// A deterministic pseudo-random sequence (xorshift), so a failure replays exactly.
struct Sequence(u64);

impl Sequence {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Every algorithm, with parameters from generous to tiny.
fn differential_policies() -> Vec<Policy> {
    let mut policies = vec![
        Policy::TokenBucket(TokenBucket {
            capacity: 5,
            interval_us: 1_000_000,
        }),
        Policy::TokenBucket(TokenBucket {
            capacity: 3,
            interval_us: 333_333,
        }),
        Policy::TokenBucket(TokenBucket {
            capacity: 1,
            interval_us: 100_000_000,
        }),
    ];
    for (limit, window_ms) in [(5, 1_000), (7, 60_000), (1, 10)] {
        policies.push(Policy::SlidingWindow(SlidingWindow { limit, window_ms }));
        policies.push(Policy::FixedWindow(FixedWindow { limit, window_ms }));
        policies.push(Policy::SlidingLog(SlidingLog { limit, window_ms }));
    }
    // Any algorithm listed since, with its own examples (`Algorithm::EXAMPLES`); the
    // concurrency limit, whose places come back when requests end, has tests of its own.
    for example in Policy::examples() {
        if !example.is_concurrent() && !policies.iter().any(|policy| policy.name() == example.name()) {
            policies.push(example);
        }
    }
    policies
}

/// Rules of two and three limits, every algorithm beside every other: a burst limit and a
/// longer quota, as people write them.
fn differential_lists() -> Vec<Limits> {
    let policies = differential_policies();
    let mut lists = Vec::new();
    for (i, first) in policies.iter().enumerate().step_by(2) {
        for second in policies.iter().skip(i % 3 + 1).step_by(4) {
            if first != second {
                lists.push(Limits::new(vec![*first, *second]).unwrap());
            }
        }
    }
    lists.push(Limits::new(vec![policies[0], policies[4], policies[9]]).unwrap());
    lists
}

/// Costs no budget holds, which the differential sequences draw now and then.
const HOSTILE_COSTS: [u64; 6] = [
    1 << 31,
    u32::MAX as u64,
    1 << 53,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// 400 decisions (and some refunds and charges) for client `n` under `limits`, pseudo-random times and
/// costs from `seed`, each decided by `store` and by a memory store: they must agree, every
/// limit's part included.
async fn agree_with_memory(store: &RedisStore, limits: impl Into<Limits>, n: usize, seed: u64) {
    let mut sequence = Sequence(seed);
    let limits: Limits = limits.into();
    let policy = limits.clone();
    let rule = Rule::new(0, "general", limits);
    let memory = MemoryStore::new(100.try_into().unwrap(), std::slice::from_ref(&rule));
    let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
    let client = client.into();
    // A realistic wall-clock time, so the script's numbers are as large as in production.
    let mut now_us = 1_764_000_000_000_000 + sequence.next(1_000_000_000);
    // The slowest limit's pace, so it refuses now and then (the quicker ones do when a cost
    // is above their capacity). Never quicker: the clock is pinned but Redis expires keys on
    // its own, so pinned time must pass at least as fast as real time, or a key would expire
    // while the window it counts is still open (on a loaded machine, a 1 s window's key did).
    let step = policy
        .iter()
        .map(|policy| match policy {
            Policy::TokenBucket(tb) => tb.interval_us,
            other => other.window().as_micros() as u64 / other.limit(),
        })
        .max()
        .unwrap_or(1);
    for i in 0..400 {
        now_us += sequence.next(2 * step);
        if i % 17 == 16 {
            // Now and then the clock steps back, as a wall clock may: both must agree.
            now_us -= sequence.next(4 * step);
        }
        // Now and then a hostile cost, as a door makes it: both must refuse it alike.
        let cost = match sequence.next(13) {
            0 => HOSTILE_COSTS[sequence.next(HOSTILE_COSTS.len() as u64) as usize],
            _ => 1 + sequence.next(2),
        };
        let expected = memory.check_at(&rule, client, Cost::saturating(cost), now_us);
        let actual = store
            .check_at(&rule, client, Cost::saturating(cost), now_us)
            .await
            .unwrap();
        assert_eq!(
            actual, expected,
            "{policy:?}, step {i}, now {now_us}, cost {cost}"
        );

        // Now and then an allowed request is refunded (`count=failures`): both must give
        // back the same.
        if expected.allowed && sequence.next(3) == 0 {
            memory.refund(&rule, client, Cost::saturating(cost), expected.at_us);
            store
                .refund_at(&rule, client, Cost::saturating(cost), actual.at_us, now_us)
                .await
                .unwrap();
        }
        // Now and then the backend reports a cost above the one charged: both must charge
        // it, into debt if need be, alike.
        if sequence.next(11) == 0 {
            let more = match sequence.next(5) {
                0 => HOSTILE_COSTS[sequence.next(HOSTILE_COSTS.len() as u64) as usize],
                _ => 1 + sequence.next(2 * policy.capacity()),
            };
            memory.charge_at(&rule, client, Cost::saturating(more), now_us);
            store
                .charge_at(&rule, client, Cost::saturating(more), now_us)
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn redis_and_memory_make_identical_decisions() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), "diff:", Duration::from_secs(5)).unwrap();
    for (n, policy) in differential_policies().into_iter().enumerate() {
        agree_with_memory(&store, policy, n, 0x9E37_79B9_7F4A_7C15 + n as u64).await;
    }
}

/// Rules of several limits: every limit decided in one script call, a refused request
/// spending nothing in any, as the memory store decides it.
#[tokio::test]
async fn redis_and_memory_agree_on_rules_of_several_limits() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), "diff:", Duration::from_secs(5)).unwrap();
    for (n, limits) in differential_lists().into_iter().enumerate() {
        agree_with_memory(&store, limits, n, 0x2545_F491_4F6C_DD1D + n as u64).await;
    }
}

/// The same, every client at once: requests of several limits batched with each other.
#[tokio::test]
async fn rules_of_several_limits_sent_together_agree_with_memory_too() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), "diff:", Duration::from_secs(5)).unwrap();
    let lists = differential_lists();
    let clients = lists.len();
    join_all(
        lists
            .into_iter()
            .enumerate()
            .map(|(n, limits)| agree_with_memory(&store, limits, n, 0x5851_F42D_4C95_7F2D + n as u64)),
    )
    .await;
    let decisions = 400 * clients as u64;
    let calls = script_calls(&redis);
    assert!(
        calls < decisions,
        "{calls} script calls for {decisions} decisions: nothing was sent together"
    );
}

/// The same sequences, every client's at once: past `MAX_CALLS_IN_FLIGHT` calls out, the
/// decisions waiting go to Redis together in one script call, every algorithm mixed in it.
#[tokio::test]
async fn decisions_sent_together_agree_with_memory_too() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), "diff:", Duration::from_secs(5)).unwrap();
    let policies = differential_policies();
    let clients = policies.len();
    join_all(
        policies
            .into_iter()
            .enumerate()
            .map(|(n, policy)| agree_with_memory(&store, policy, n, 0xD1B5_4A32_D192_ED03 + n as u64)),
    )
    .await;
    let decisions = 400 * clients as u64;
    let calls = script_calls(&redis);
    assert!(
        calls < decisions,
        "{calls} script calls for {decisions} decisions and their refunds: nothing was sent together"
    );
}

/// Hostile costs (issue 26), as a door makes them (`Cost::saturating`): 0, 1, the capacity,
/// the capacity + 1, 2^31, 2^32 - 1, 2^53, 2^63 - 1, 2^63 and 2^64 - 1, decided, charged (a
/// backend reporting them) and refunded, for every algorithm alone and in lists and for a
/// concurrency limit: Redis and memory agree on every decision, nothing above the capacity
/// passes, no call fails, and the debt is paid back within two windows.
#[tokio::test]
async fn hostile_costs_agree_with_memory() {
    let redis = RedisServer::start();
    let store = RedisStore::new(
        &RedisTarget::Single(redis.url()),
        "hostile:",
        Duration::from_secs(5),
    )
    .unwrap();
    let mut all: Vec<Limits> = differential_policies().into_iter().map(Limits::from).collect();
    all.push(
        Policy::Concurrent(tollgate::algorithms::Concurrent {
            places: 3,
            lease_ms: 10_000,
        })
        .into(),
    );
    all.extend(differential_lists());
    for (n, limits) in all.into_iter().enumerate() {
        let rule = Rule::new(0, "general", limits.clone());
        let memory = MemoryStore::new(100.try_into().unwrap(), std::slice::from_ref(&rule));
        let client: IpAddr = format!("198.51.100.{n}").parse().unwrap();
        let client = client.into();
        let capacity = limits.capacity();
        let window = limits
            .iter()
            .map(|policy| policy.window().as_micros() as u64)
            .max()
            .unwrap_or(0);
        let mut now_us = 1_764_000_000_000_000 + n as u64 * 1_000;
        let costs = [
            0,
            1,
            capacity,
            capacity + 1,
            1 << 31,
            u64::from(u32::MAX),
            1 << 53,
            i64::MAX as u64,
            1 << 63,
            u64::MAX,
        ];
        for round in 0..2 {
            for raw in costs {
                now_us += 1_000;
                let cost = Cost::saturating(raw);
                let expected = memory.check_at(&rule, client, cost, now_us);
                let actual = store.check_at(&rule, client, cost, now_us).await.unwrap();
                assert_eq!(actual, expected, "{limits}: cost {raw}, round {round}");
                assert!(raw <= capacity || !expected.allowed, "{limits}: cost {raw}");
                if expected.allowed && raw > 0 {
                    memory.refund(&rule, client, cost, expected.at_us);
                    store
                        .refund_at(&rule, client, cost, actual.at_us, now_us)
                        .await
                        .unwrap();
                }
                memory.charge_at(&rule, client, cost, now_us);
                store.charge_at(&rule, client, cost, now_us).await.unwrap();
            }
            // Every debt paid back within two windows: a request of 1 passes again.
            now_us += 2 * window;
            let expected = memory.check_at(&rule, client, Cost::ONE, now_us);
            let actual = store.check_at(&rule, client, Cost::ONE, now_us).await.unwrap();
            assert_eq!(actual, expected, "{limits}: after the debt, round {round}");
            assert!(expected.allowed, "{limits}: after the debt, round {round}");
        }
    }
}

/// A bucket poisoned before the debt bound (a charge of 18446744073709 tokens used to store a
/// TAT near 1.8e19, refusing the client for ever or failing every decision): the next decision
/// tidies it to the bound, refuses within two refills, and the client passes after them.
#[tokio::test]
async fn a_bucket_poisoned_before_the_debt_bound_heals_within_two_refills() {
    let redis = RedisServer::start();
    let (store, rule) = token_bucket_on(&redis, "poisoned:", 10, 100_000);
    let client: IpAddr = "192.0.2.200".parse().unwrap();
    let key = store.key(&rule, client.into());
    assert_eq!(redis.cli(&["SET", &key, "18446744073709000000000"]).trim(), "OK");
    let now_us = 1_764_000_000_000_000;
    let refused = store
        .check_at(&rule, client.into(), Cost::ONE, now_us)
        .await
        .unwrap();
    assert!(!refused.allowed);
    // tau = 1 s: the TAT tidied to now + 2 s, one token in 1.1 s.
    assert_eq!(refused.retry_after, Duration::from_micros(1_100_000));
    assert_eq!(refused.reset_after, Duration::from_secs(2));
    let ttl: u64 = redis.cli(&["TTL", &key]).trim().parse().unwrap();
    assert!(ttl <= 2, "the key lives as long as the bound: {ttl}");
    let healed = store
        .check_at(&rule, client.into(), Cost::ONE, now_us + 1_100_000)
        .await
        .unwrap();
    assert!(healed.allowed, "{healed:?}");
}

/// A store on `redis` under `prefix`, and a token-bucket rule for it.
fn token_bucket_on(redis: &RedisServer, prefix: &str, capacity: u64, interval_us: u64) -> (RedisStore, Rule) {
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), prefix, Duration::from_secs(5)).unwrap();
    let policy = Policy::TokenBucket(TokenBucket {
        capacity,
        interval_us,
    });
    (store, Rule::new(0, "general", policy))
}

/// Many requests for one budget at once, sent together: still exactly the budget is allowed.
#[tokio::test]
async fn a_burst_sent_together_is_exact() {
    let redis = RedisServer::start();
    let (store, rule) = token_bucket_on(&redis, "burst:", 50, 1_000_000_000);
    let client: IpAddr = "192.0.2.7".parse().unwrap();
    let decisions = join_all((0..300).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
    let allowed = decisions.iter().filter(|d| d.as_ref().unwrap().allowed).count();
    assert_eq!(allowed, 50);
    let calls = script_calls(&redis);
    assert!(calls < 300, "{calls} script calls for 300 decisions");
    // A fresh Redis had no functions: the first call met "Function not found" and loaded them.
    let loaded = redis.cli(&["FUNCTION", "LIST", "LIBRARYNAME", function_library().name()]);
    assert!(
        loaded.contains(function_library().batch()),
        "the batch function was loaded"
    );
}

/// `REDIS_CALLS_IN_FLIGHT=0`: every decision its own call, however many at once.
#[tokio::test]
async fn coalescing_can_be_turned_off() {
    let redis = RedisServer::start();
    let (store, rule) = token_bucket_on(&redis, "alone:", 50, 1_000_000_000);
    let store = store.with_calls_in_flight(0);
    let client: IpAddr = "192.0.2.8".parse().unwrap();
    let decisions = join_all((0..100).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
    let allowed = decisions.iter().filter(|d| d.as_ref().unwrap().allowed).count();
    assert_eq!(allowed, 50);
    // One FCALL each (those that met "Function not found" on the fresh Redis loaded the
    // library and went again).
    assert_eq!(redis.calls("fcall") - redis_failed_calls(&redis, "fcall"), 100);
}

/// A key of the wrong type in a call that carries others fails alone, as a fault of that key.
#[tokio::test]
async fn a_wrong_type_key_in_a_batch_fails_alone() {
    let redis = RedisServer::start();
    let (store, rule) = token_bucket_on(&redis, "mixed:", 10, 1_000_000);
    let bad: IpAddr = "192.0.2.66".parse().unwrap();
    redis.cli(&["LPUSH", &store.key(&rule, bad.into()), "not a budget"]);
    let clients: Vec<IpAddr> = (0..64u8)
        .map(|n| format!("192.0.2.{}", 100 + n).parse().unwrap())
        .chain(std::iter::once(bad))
        .collect();
    let decisions = join_all(
        clients
            .iter()
            .map(|&client| store.check(&rule, client.into(), Cost::ONE)),
    )
    .await;
    for (client, decision) in clients.iter().zip(&decisions) {
        match decision {
            Ok(decision) => {
                assert_ne!(*client, bad, "the wrong-type key was decided");
                assert!(decision.allowed);
            }
            Err(error) => {
                assert_eq!(*client, bad, "{client} failed: {error}");
                assert!(error.is_about_one_key(), "{error}");
            }
        }
    }
    assert!(decisions.last().unwrap().is_err());
    let calls = script_calls(&redis);
    assert!(
        calls < 65,
        "{calls} script calls for 65 decisions: nothing was sent together"
    );
}

/// Decision calls: `FCALL`s, and `EVALSHA`s and `EVAL`s (a Redis before 7).
fn script_calls(redis: &RedisServer) -> u64 {
    redis.calls("fcall") + redis.calls("evalsha") + redis.calls("eval")
}

/// `failed_calls` of one command in `INFO commandstats`: answered with an error.
fn redis_failed_calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find(|line| line.starts_with(&format!("cmdstat_{command}:")))
        .and_then(|line| line.split("failed_calls=").nth(1))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.trim().parse().unwrap())
}

/// A flood from a refused client is answered locally until its retry time: near zero Redis
/// calls per denied request, and the same answer Redis would give.
#[tokio::test]
async fn a_flood_of_denials_does_not_reach_redis() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("REDIS_ADDR", &redis.addr()),
            ("REDIS_TIMEOUT_MS", "5000"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.5"),
        ],
    )
    .await;
    for _ in 0..2 {
        assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    }
    let first = get(gateway.addr, "/").await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    let calls = script_calls(&redis);
    for _ in 0..20 {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.number("x-ratelimit-remaining"), 0);
        assert_eq!(reply.number("x-ratelimit-limit"), 2);
        assert!((1..=2).contains(&reply.number("retry-after")));
    }
    let after = script_calls(&redis);
    assert_eq!(after, calls, "no Redis call for 20 denials");
    let metrics = gateway.admin_get("/metrics").await;
    assert!(
        metrics
            .text()
            .lines()
            .any(|line| line == "tollgate_cached_denials_total 20"),
        "{}",
        metrics.text()
    );
    // At the retry time (one token every 2 s, counted from the first denial) Redis is asked
    // again and admits.
    tokio::time::sleep(Duration::from_millis(2_050)).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
}

/// A decision's script with its clock pinned at `now` and the given deadline, sent alone.
async fn eval_with_deadline(
    connection: &mut redis::aio::MultiplexedConnection,
    policy: Policy,
    key: &str,
    now: u64,
    deadline: u64,
) -> redis::Value {
    let (script, [first, second]) = policy.script();
    redis::cmd("EVAL")
        .arg(script.source())
        .arg(1)
        .arg(key)
        .arg(first)
        .arg(second)
        .arg(1)
        .arg(now)
        .arg("")
        .arg(deadline)
        .query_async(connection)
        .await
        .unwrap()
}

/// Every algorithm's script, alone and in a batch, run after its deadline: it changes nothing
/// (not the state, not the expiry) and answers `{-1, now}`. At the deadline itself it decides.
#[tokio::test]
async fn a_script_run_past_its_deadline_changes_nothing() {
    use redis::Value::{Array, Int};
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let now: u64 = 1_764_000_000_000_000;
    let expired = |at: u64| Array(vec![Int(-1), Int(at as i64)]);
    for (n, policy) in differential_policies().into_iter().enumerate() {
        let key = format!("deadline:{{{n}}}:{}", policy.key_suffix());
        // A client never seen, late: no key is made.
        let reply = eval_with_deadline(&mut connection, policy, &key, now, now - 1).await;
        assert_eq!(reply, expired(now), "{policy:?}");
        assert_eq!(redis.cli(&["EXISTS", &key]).trim(), "0", "{policy:?}");
        // On time (the deadline is the last moment that counts): decided and counted.
        let Array(decided) = eval_with_deadline(&mut connection, policy, &key, now, now).await else {
            panic!("{policy:?}: not a decision");
        };
        assert_eq!(decided[0], Int(1), "{policy:?}: allowed");
        let state = redis.cli(&["DUMP", &key]);
        let expiry = redis.cli(&["PEXPIRETIME", &key]);
        // Late again, on a client with a budget spent: nothing changes.
        let reply = eval_with_deadline(&mut connection, policy, &key, now + 1_000, now + 999).await;
        assert_eq!(reply, expired(now + 1_000), "{policy:?}");
        assert_eq!(redis.cli(&["DUMP", &key]), state, "{policy:?}: state untouched");
        assert_eq!(
            redis.cli(&["PEXPIRETIME", &key]),
            expiry,
            "{policy:?}: expiry untouched"
        );
    }

    // In a batch each decision has its deadline: the late one alone is not counted.
    let policy = differential_policies()[0];
    let (_, [first, second]) = policy.script();
    let index = policy.script_index();
    let mut batch = redis::cmd("EVAL");
    batch
        .arg(batch_script().source())
        .arg(2)
        .arg("late:{a}:tb")
        .arg("on-time:{b}:tb");
    for deadline in [now - 1, now] {
        batch
            .arg(index)
            .arg(first)
            .arg(second)
            .arg(1)
            .arg(now)
            .arg("")
            .arg(deadline);
    }
    let Array(replies) = batch.query_async::<redis::Value>(&mut connection).await.unwrap() else {
        panic!("not a batch reply");
    };
    assert_eq!(replies[0], expired(now));
    assert!(
        matches!(&replies[1], Array(fields) if fields[0] == Int(1)),
        "{:?}",
        replies[1]
    );
    assert_eq!(redis.cli(&["EXISTS", "late:{a}:tb"]).trim(), "0");
    assert_eq!(redis.cli(&["EXISTS", "on-time:{b}:tb"]).trim(), "1");
}

/// A clock estimate far off cannot refuse a call: a deadline found passed while the gateway
/// still waits renews the estimate, and the call is sent once more and decided, counted
/// once. An estimate too far ahead only widens the deadline.
#[tokio::test]
async fn a_wrong_clock_estimate_costs_one_more_call_never_a_refusal() {
    use tokio::time::Instant;
    use tollgate::stores::redis_clock::RedisClock;
    let redis = RedisServer::start();
    let (store, rule) = token_bucket_on(&redis, "skew:", 5, 1_000_000_000);
    let store = store.with_calls_in_flight(0);
    // Loads the script, so the calls counted below are the decisions' own.
    let warm: IpAddr = "192.0.2.1".parse().unwrap();
    assert!(store.check(&rule, warm.into(), Cost::ONE).await.unwrap().allowed);
    let client: IpAddr = "192.0.2.2".parse().unwrap();
    let key = || store.key(&rule, client.into());

    // Redis believed to be in 1970: every deadline looks long past to it.
    let behind = RedisClock::new();
    behind.reset(Instant::now(), 1_000_000);
    let calls = redis.calls("fcall");
    let decision = store.check_key(&rule, key(), Cost::ONE, &behind).await.unwrap();
    assert_eq!((decision.allowed, decision.remaining), (true, 4));
    assert_eq!(redis.calls("fcall") - calls, 2, "expired once, then decided");
    let decision = store.check_key(&rule, key(), Cost::ONE, &behind).await.unwrap();
    assert_eq!((decision.allowed, decision.remaining), (true, 3));
    assert_eq!(redis.calls("fcall") - calls, 3, "the estimate was renewed");

    // Redis believed to be a year ahead: decided at once, as without a deadline.
    let ahead = RedisClock::new();
    let year_ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
        + 365 * 86_400 * 1_000_000;
    ahead.reset(Instant::now(), year_ahead);
    let decision = store.check_key(&rule, key(), Cost::ONE, &ahead).await.unwrap();
    assert_eq!((decision.allowed, decision.remaining), (true, 2));
    assert_eq!(redis.calls("fcall") - calls, 4);
}

/// Calls written to a frozen Redis's socket time out; when it thaws it runs them, and each
/// finds its deadline passed: a budget of 5 with 3 spent still has exactly 2 after 10 calls
/// that timed out, sent alone or waiting in batches. A refund that timed out is applied
/// late, which gives back what it would have on time.
#[tokio::test]
async fn calls_that_timed_out_in_a_frozen_redis_cost_nothing_when_it_thaws() {
    let redis = RedisServer::start();
    let store = RedisStore::new(
        &RedisTarget::Single(redis.url()),
        "frozen:",
        Duration::from_millis(300),
    )
    .unwrap();
    let rule = Rule::new(
        0,
        "general",
        Policy::TokenBucket(TokenBucket {
            capacity: 5,
            interval_us: 1_000_000_000,
        }),
    );
    let client: IpAddr = "192.0.2.9".parse().unwrap();
    let spent: Vec<_> = join_all((0..3).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
    assert!(spent.iter().all(|d| d.as_ref().unwrap().allowed));
    let refunded: IpAddr = "192.0.2.10".parse().unwrap();
    let to_refund = store.check(&rule, refunded.into(), Cost::ONE).await.unwrap();
    assert_eq!(to_refund.remaining, 4);

    redis.freeze();
    // More at once than REDIS_CALLS_IN_FLIGHT: some go alone, the rest wait and go together.
    let frozen = join_all((0..10).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
    assert!(frozen.iter().all(Result::is_err), "{frozen:?}");
    let refund = store
        .refund(&rule, refunded.into(), Cost::ONE, to_refund.at_us)
        .await;
    assert!(refund.is_err(), "the refund timed out");
    redis.thaw();

    let after = join_all((0..3).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
    let allowed = after.iter().filter(|d| d.as_ref().unwrap().allowed).count();
    assert_eq!(allowed, 2, "{after:?}");
    let decision = store.check(&rule, refunded.into(), Cost::ONE).await.unwrap();
    assert_eq!(decision.remaining, 4, "the late refund gave its token back");
}

/// The lean decisions (`<library>_d<i>` of the token bucket and the sliding window) against
/// their full scripts on a real redis-server, over capacities, intervals and windows from
/// tiny to the largest accepted, costs from 0 to hostile, charges into debt, states past the
/// debt bound, windows ahead of the clock and values that are not numbers: at every step the
/// full script, pinned at the time the lean reply reports, runs on a twin of the state the
/// lean call read (every key of the client's: a sliding window's counts and `:w`), and its
/// decision is the one the gateway works out from the lean reply, and the state it leaves the
/// lean call's, byte for byte (but a sliding window's `:w`, which only the full script
/// moves), on keys that live as long as the state matters. Late, the lean call changes
/// nothing.
#[tokio::test]
async fn lean_decisions_are_the_full_scripts_decisions() {
    use redis::Value::{Array, Int};
    let (redis, mut connection) = redis_with_the_library().await;
    let library = function_library();
    let mut policies = vec![
        Policy::TokenBucket(TokenBucket {
            capacity: 3,
            interval_us: 2_000,
        }),
        Policy::TokenBucket(TokenBucket {
            capacity: 10,
            interval_us: 700,
        }),
        Policy::TokenBucket(TokenBucket {
            capacity: 1,
            interval_us: 1,
        }),
        Policy::SlidingWindow(SlidingWindow {
            limit: 4,
            window_ms: 7,
        }),
        Policy::SlidingWindow(SlidingWindow {
            limit: 10,
            window_ms: 30,
        }),
        Policy::SlidingWindow(SlidingWindow {
            limit: 1,
            window_ms: 1,
        }),
        Policy::FixedWindow(FixedWindow {
            limit: 4,
            window_ms: 7,
        }),
        Policy::FixedWindow(FixedWindow {
            limit: 10,
            window_ms: 30,
        }),
        Policy::FixedWindow(FixedWindow {
            limit: 1,
            window_ms: 1,
        }),
    ];
    policies.extend(Policy::examples().filter(|p| {
        matches!(
            p,
            Policy::TokenBucket(_) | Policy::SlidingWindow(_) | Policy::FixedWindow(_)
        )
    }));
    let mut seen = [0usize; 2];
    for (n, policy) in policies.into_iter().enumerate() {
        let mut sequence = Sequence(0xA076_1D64_78BD_642F + n as u64);
        let (script, [first, second]) = policy.script();
        let function = library.decide(policy.script_index());
        let lean_key = format!("lean:{{{n}}}:{}", policy.key_suffix());
        let full_key = format!("full:{{{n}}}:{}", policy.key_suffix());
        // Reads a client's keys into a transaction: each key's name after the client's key
        // and its value.
        let read = |pipe: &mut redis::Pipeline, key: &str| {
            pipe.cmd("EVAL").arg(FAMILY).arg(0).arg(key);
        };
        for step in 0..300 {
            let cost = match sequence.next(10) {
                0 => HOSTILE_COSTS[sequence.next(HOSTILE_COSTS.len() as u64) as usize],
                1 => 0,
                2 => policy.limit() + sequence.next(2),
                _ => 1 + sequence.next(2),
            };
            let cost = Cost::saturating(cost);
            let arguments = policy.lean_arguments(cost).expect("a lean decision");
            // Now and then a deadline long past: nothing changes, the reply says so.
            let late = sequence.next(19) == 0;
            // One transaction, so no key expires between its commands (Redis 7 reads expiry
            // on the time the transaction began): the twin made, the lean call, what it left.
            let mut pipe = redis::pipe();
            pipe.atomic();
            read(&mut pipe, &lean_key);
            pipe.cmd("EVAL")
                .arg(TWIN)
                .arg(0)
                .arg(&lean_key)
                .arg(&full_key)
                .ignore();
            pipe.cmd("FCALL").arg(function).arg(1).arg(&lean_key);
            for argument in arguments.as_slice() {
                pipe.arg(*argument);
            }
            pipe.arg(if late { "1" } else { "" });
            read(&mut pipe, &lean_key);
            pipe.cmd("PEXPIRETIME").arg(&lean_key);
            let (before, reply, after, expires_ms): (Vec<String>, redis::Value, Vec<String>, i64) =
                pipe.query_async(&mut connection).await.unwrap();
            // A decision's numbers come as one string of them; a late call's as a table.
            let reply = match reply {
                redis::Value::BulkString(text) => String::from_utf8(text)
                    .unwrap()
                    .split(' ')
                    .map(|number| Int(number.parse().unwrap()))
                    .collect(),
                Array(reply) => reply,
                reply => panic!("{policy:?}: not a reply: {reply:?}"),
            };
            let number = |value: &redis::Value| match value {
                Int(n) => u64::try_from(*n).unwrap(),
                other => panic!("{policy:?}: {other:?} in a lean reply"),
            };
            if late {
                assert_eq!(reply.len(), 2, "{policy:?}: {reply:?}");
                assert_eq!(reply[0], Int(-1), "{policy:?}: late");
                // Nothing written (a key may only have expired meanwhile, as one does in the
                // middle of a stalled transaction).
                assert!(
                    after.iter().all(|entry| before.contains(entry)),
                    "{policy:?}: a late call changed the state: {before:?}, {after:?}"
                );
                continue;
            }
            let now = number(&reply[0]);
            let state: Vec<u64> = reply[1..].iter().map(number).collect();
            let lean_decision = policy.lean_decision(now, &state, cost).expect("a decision");
            // The full script on the twin, at the lean call's time, and what it left.
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.cmd("EVAL")
                .arg(script.source())
                .arg(1)
                .arg(&full_key)
                .arg(first)
                .arg(second)
                .arg(cost.get())
                .arg(now)
                .arg("")
                .arg("");
            read(&mut pipe, &full_key);
            let (full, mut full_after): (Vec<i64>, Vec<String>) =
                pipe.query_async(&mut connection).await.unwrap();
            // The lean part does not move a sliding window's `:w` (as a decision without a
            // script does not): the counts must be the same, byte for byte.
            let mut after = after;
            for family in [&mut after, &mut full_after] {
                family.retain(|entry| !entry.starts_with(":w="));
            }
            let full_decision = (
                full[0] == 1,
                full[1] as u64,
                Duration::from_micros(full[2] as u64),
                Duration::from_micros(full[3] as u64),
                full[4] as u64,
            );
            assert_eq!(
                (
                    lean_decision.allowed,
                    lean_decision.remaining,
                    lean_decision.retry_after,
                    lean_decision.reset_after,
                    lean_decision.at_us
                ),
                full_decision,
                "{policy:?}, step {step}, cost {cost:?}, state {before:?} read as {state:?}, now {now}"
            );
            // The token bucket's TAT (ms) matters until it has passed.
            let tat_ms = |state: &[String]| -> u64 {
                state
                    .iter()
                    .find_map(|entry| entry.strip_prefix('='))
                    .and_then(|tat| tat.parse::<u64>().ok())
                    .unwrap_or(0)
                    / 1_000
            };
            if after != full_after {
                // Only a bucket whose TAT has passed, expired already (a transaction the loaded
                // machine stalled): a sliding window's keys expire relative to their first
                // count, seconds on.
                let (seconds, micros): (u64, u64) =
                    redis::cmd("TIME").query_async(&mut connection).await.unwrap();
                assert!(
                    matches!(policy, Policy::TokenBucket(_))
                        && after.is_empty()
                        && seconds * 1_000 + micros / 1_000 >= tat_ms(&full_after),
                    "{policy:?}, step {step}: the states differ: {after:?}, {full_after:?}"
                );
            }
            seen[usize::from(lean_decision.allowed)] += 1;
            if lean_decision.allowed && (cost.get() > 0 || matches!(policy, Policy::TokenBucket(_))) {
                // What was counted lives as long as it matters: the TAT until it has passed, a
                // window's count until the window after it has ended.
                // A window's count: its window, and how many windows on from its start it
                // matters (a sliding window's is the previous count through the next one).
                let counted = match policy {
                    Policy::SlidingWindow(sw) => Some((sw.window_ms, 2)),
                    Policy::FixedWindow(fw) => Some((fw.window_ms, 1)),
                    _ => None,
                };
                let (expires_ms, matters_until_ms) = match counted {
                    Some((window_ms, windows)) => {
                        let window = state.first().copied().unwrap_or(now / 1_000 / window_ms);
                        let expires_ms: i64 = redis::cmd("PEXPIRETIME")
                            .arg(format!("{lean_key}:{window}"))
                            .query_async(&mut connection)
                            .await
                            .unwrap();
                        (expires_ms, (window + windows) * window_ms)
                    }
                    _ => (expires_ms, tat_ms(&after)),
                };
                assert!(
                    expires_ms == -2 || expires_ms as u64 >= matters_until_ms,
                    "{policy:?}, step {step}: the key expires at {expires_ms} ms, its state matters until {matters_until_ms}"
                );
            }
            match sequence.next(23) {
                // A cost reported above the one charged (the full script, on Redis's clock),
                // into debt.
                0 => {
                    let charged = 1 + sequence.next(2 * policy.limit());
                    let _: i64 = redis::cmd("EVAL")
                        .arg(script.source())
                        .arg(1)
                        .arg(&lean_key)
                        .arg(first)
                        .arg(second)
                        .arg(charged)
                        .arg("")
                        .arg("charge")
                        .arg("")
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                }
                // A state no decision leaves: a TAT past the debt bound, a window ahead of the
                // clock (a clock stepped back), not a number.
                1 => plant_state(&redis, &lean_key, &policy, Some(now + sequence.next(9))),
                2 => plant_state(&redis, &lean_key, &policy, None),
                // Time passes: a refill, a window slides.
                3..=8 => tokio::time::sleep(Duration::from_micros(sequence.next(3_000))).await,
                _ => {}
            }
        }
    }
    assert!(
        seen[0] > 50 && seen[1] > 50,
        "allowed and refused both decided: {seen:?}"
    );
}

/// The lean batch (`<library>_lean`) against the full batch (`<library>_batch`), as a property
/// on a real redis-server: requests of one limit and of several (a limit listed twice
/// included), several of them on one key in one call, costs from 0 to hostile, states past
/// the debt bound, windows ahead of the clock and values that are not numbers. Each lean call
/// runs in a transaction with a persisted twin of every key it reads; then the full batch runs
/// on the twins, pinned at the time the lean reply reports. The decisions the gateway works
/// out from the lean replies (a refused request's allowing limits at a cost of 0) must be the
/// full batch's, and the states the two leave decide alike (the full batch's refund leaves a
/// full bucket's TAT, or a window moved on, where the lean batch left what it read). Late, the
/// lean call changes nothing.
#[tokio::test]
async fn lean_batches_are_the_full_batchs_decisions() {
    use redis::Value::{Array, Int};
    let (redis, mut connection) = redis_with_the_library().await;
    let library = function_library();
    let bucket = |capacity, interval_us| {
        Policy::TokenBucket(TokenBucket {
            capacity,
            interval_us,
        })
    };
    let window = |limit, window_ms| Policy::SlidingWindow(SlidingWindow { limit, window_ms });
    let fixed = |limit, window_ms| Policy::FixedWindow(FixedWindow { limit, window_ms });
    // Numbers whose states outlive the test's steps (a key expiring between the lean call and
    // its twin's would be a difference the test would have to excuse).
    let rules: Vec<Vec<Policy>> = vec![
        vec![bucket(3, 20_000)],
        vec![bucket(5, 7_000)],
        vec![window(4, 300)],
        vec![window(10, 1_000)],
        vec![bucket(3, 20_000), window(4, 300)],
        vec![window(10, 1_000), bucket(5, 7_000), window(2, 500)],
        vec![bucket(3, 20_000), bucket(3, 20_000)],
        vec![fixed(4, 300)],
        vec![bucket(3, 20_000), fixed(4, 300)],
        vec![fixed(10, 1_000), bucket(5, 7_000), window(2, 500)],
    ];
    let key = |side: &str, client: u64, policy: &Policy| {
        format!(
            "{side}:{{{client}}}:{}:{:08x}",
            policy.key_suffix(),
            policy.fingerprint()
        )
    };
    // A client's keys under a limit: each one's name after the client's key, and its value.
    let read = |pipe: &mut redis::Pipeline, key: &str| {
        pipe.cmd("EVAL").arg(FAMILY).arg(0).arg(key);
    };
    let mut sequence = Sequence(0x51_7CC1_B727_220A);
    let mut seen = [0usize; 2];
    for step in 0..400 {
        // 1 to 8 requests, from 3 clients, so keys repeat within a call.
        let requests: Vec<(usize, u64, u64)> = (0..1 + sequence.next(8))
            .map(|_| {
                let rule = sequence.next(rules.len() as u64) as usize;
                let limit = rules[rule][0].limit();
                let cost = match sequence.next(10) {
                    0 => HOSTILE_COSTS[sequence.next(HOSTILE_COSTS.len() as u64) as usize],
                    1 => 0,
                    2 => limit + sequence.next(2),
                    _ => 1 + sequence.next(2),
                };
                (rule, sequence.next(3), cost)
            })
            .collect();
        let limits: Vec<(&Policy, u64, bool, Cost)> = requests
            .iter()
            .flat_map(|&(rule, client, cost)| {
                let count = rules[rule].len();
                rules[rule]
                    .iter()
                    .enumerate()
                    .map(move |(i, policy)| (policy, client, i + 1 < count, Cost::saturating(cost)))
            })
            .collect();
        // States as they decide at `now` or later: the full batch gives a refused request's cost
        // back where the lean batch writes nothing, which leaves a TAT of now (a full bucket), or
        // a window's count of 0 and `:w` moved on to now's window, where the lean call left the
        // state it read.
        let states = |values: &[Vec<String>], now: u64| -> Vec<String> {
            values
                .iter()
                .zip(&limits)
                .map(|(family, (policy, ..))| {
                    let value = |suffix: &str| {
                        family
                            .iter()
                            .find_map(|entry| entry.strip_prefix(suffix)?.strip_prefix('='))
                    };
                    let number = |suffix: &str| value(suffix).and_then(|v| v.parse::<i64>().ok());
                    match policy {
                        // Not a number, or passed: a client never seen.
                        Policy::TokenBucket(_) => match number("").filter(|&tat| tat > now as i64) {
                            Some(tat) => tat.to_string(),
                            None => "none".to_owned(),
                        },
                        Policy::SlidingWindow(sw) => {
                            let now_window = (now / 1_000 / sw.window_ms) as i64;
                            let window = number(":w").map_or(now_window, |w| w.max(now_window));
                            let count = |window: i64| number(&format!(":{window}")).unwrap_or(0).max(0);
                            match (window, count(window - 1), count(window)) {
                                (w, 0, 0) if w == now_window => "none".to_owned(),
                                (w, p, c) => format!("{w} {p} {c}"),
                            }
                        }
                        Policy::FixedWindow(fw) => {
                            let now_window = (now / 1_000 / fw.window_ms) as i64;
                            let window = number(":w").map_or(now_window, |w| w.max(now_window));
                            match (window, number(&format!(":{window}")).unwrap_or(0).max(0)) {
                                (w, 0) if w == now_window => "none".to_owned(),
                                (w, c) => format!("{w} {c}"),
                            }
                        }
                        other => panic!("{other:?} has no lean decision"),
                    }
                })
                .collect()
        };
        let late = sequence.next(29) == 0;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for &(policy, client, _, _) in &limits {
            let (lean, full) = (key("lean", client, policy), key("full", client, policy));
            pipe.cmd("EVAL").arg(TWIN).arg(0).arg(&lean).arg(&full).ignore();
        }
        for &(policy, client, _, _) in &limits {
            read(&mut pipe, &key("lean", client, policy));
        }
        pipe.cmd("FCALL").arg(library.lean()).arg(limits.len());
        for &(policy, client, _, _) in &limits {
            pipe.arg(key("lean", client, policy));
        }
        pipe.arg(if late { "1" } else { "" });
        // Each limit once (its algorithm and parameters), then each key's limit and cost.
        let arguments = |policy: &Policy, cost| policy.lean_arguments(cost).expect("a lean decision");
        let mut distinct: Vec<(usize, Vec<u64>)> = Vec::new();
        for &(policy, _, _, cost) in &limits {
            let arguments = arguments(policy, cost);
            let (_, parameters) = arguments.as_slice().split_last().unwrap();
            if !distinct.contains(&(policy.script_index(), parameters.to_vec())) {
                distinct.push((policy.script_index(), parameters.to_vec()));
            }
        }
        pipe.arg(distinct.len());
        for (index, parameters) in &distinct {
            pipe.arg(*index).arg(parameters);
        }
        for &(policy, _, continued, cost) in &limits {
            let arguments = arguments(policy, cost);
            let (cost, parameters) = arguments.as_slice().split_last().unwrap();
            let number = 1 + distinct
                .iter()
                .position(|(index, p)| *index == policy.script_index() && p == parameters)
                .unwrap() as i64;
            pipe.arg(if continued { -number } else { number }).arg(*cost);
        }
        for &(policy, client, _, _) in &limits {
            read(&mut pipe, &key("lean", client, policy));
        }
        let mut results: Vec<redis::Value> = pipe.query_async(&mut connection).await.unwrap();
        let families = |values: Vec<redis::Value>| -> Vec<Vec<String>> {
            values
                .into_iter()
                .map(|value| redis::from_redis_value(value).unwrap())
                .collect()
        };
        let after = families(results.split_off(limits.len() + 1));
        let Some(Array(flat)) = results.pop() else {
            panic!("step {step}: not a lean batch's reply");
        };
        let before = families(results);
        let number = |value: &redis::Value| match value {
            Int(n) => u64::try_from(*n).unwrap(),
            other => panic!("step {step}: {other:?} in a lean reply"),
        };
        if late {
            assert_eq!(flat.len(), 2, "step {step}: {flat:?}");
            assert_eq!(flat[0], Int(-1), "step {step}: late");
            // Nothing written: a key may only have expired between the reads, within the same
            // transaction on a loaded machine (a bucket the millisecond after its TAT, a
            // window's `:w` or count at the end of its TTL), as the single decision's test
            // allows.
            for (i, (after, before)) in after.iter().zip(&before).enumerate() {
                assert!(
                    after.iter().all(|entry| before.contains(entry)),
                    "step {step}: a late call changed key {i}'s state: {before:?} -> {after:?}"
                );
            }
            continue;
        }
        // The flat reply: the time, then for each key the count of its numbers and them.
        let now = number(&flat[0]);
        let mut replies: Vec<Vec<u64>> = Vec::new();
        let mut rest = &flat[1..];
        while let [count, tail @ ..] = rest {
            let (numbers, tail) = tail.split_at(number(count) as usize);
            replies.push(numbers.iter().map(number).collect());
            rest = tail;
        }
        assert_eq!(replies.len(), limits.len(), "step {step}: {flat:?}");
        // The full batch on the twins, at the lean call's time.
        let mut full = redis::cmd("FCALL");
        full.arg(library.batch()).arg(limits.len());
        for &(policy, client, _, _) in &limits {
            full.arg(key("full", client, policy));
        }
        for &(policy, _, continued, cost) in &limits {
            let (_, [a, b]) = policy.script();
            full.arg(policy.script_index() + if continued { 100 } else { 0 })
                .arg(a)
                .arg(b)
                .arg(cost.get())
                .arg(now)
                .arg("")
                .arg("");
        }
        let full: Vec<Vec<i64>> = full.query_async(&mut connection).await.unwrap();
        let mut pipe = redis::pipe();
        for &(policy, client, _, _) in &limits {
            read(&mut pipe, &key("full", client, policy));
        }
        let full_after: Vec<Vec<String>> = pipe.query_async(&mut connection).await.unwrap();
        // A bucket's key expires the millisecond after its TAT (`PXAT`), and Redis may expire
        // it while the lean call's transaction runs on: a bucket a few hundred µs from full
        // can be gone by the read after the call on a loaded machine, where its persisted twin
        // stays. Only such a bucket, expired by now, may differ, as "none".
        let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut connection).await.unwrap();
        let now_ms = seconds * 1_000 + micros / 1_000;
        let lean_states = states(&after, now);
        let full_states: Vec<String> = states(&full_after, now)
            .into_iter()
            .zip(&lean_states)
            .zip(&limits)
            .map(
                |((full, lean), (policy, ..))| match (policy, lean.as_str(), full.parse::<u64>()) {
                    (Policy::TokenBucket(_), "none", Ok(tat)) if now_ms > tat / 1_000 => "none".to_owned(),
                    _ => full,
                },
            )
            .collect();
        assert_eq!(
            lean_states, full_states,
            "step {step}: {requests:?} at {now}, from {before:?}: lean {flat:?}, full {full:?}"
        );
        // Each request's decision, as the gateway works it out from the lean replies.
        let mut at = 0;
        for &(rule, _, cost) in &requests {
            let policies = &rules[rule];
            let cost = Cost::saturating(cost);
            let decide = |cost| -> Vec<_> {
                policies
                    .iter()
                    .zip(&replies[at..at + policies.len()])
                    .map(|(policy, state)| policy.lean_decision(now, state, cost).expect("a decision"))
                    .collect()
            };
            let mut parts = decide(cost);
            let allowed = parts.iter().all(|part| part.allowed);
            if !allowed {
                for (part, nothing) in parts.iter_mut().zip(decide(Cost::ZERO)) {
                    if part.allowed {
                        *part = nothing;
                    }
                }
            }
            for (i, part) in parts.iter().enumerate() {
                let expected = &full[at + i];
                assert_eq!(
                    (
                        i64::from(part.allowed),
                        part.remaining as i64,
                        part.retry_after.as_micros() as i64,
                        part.reset_after.as_micros() as i64,
                        part.at_us as i64
                    ),
                    (expected[0], expected[1], expected[2], expected[3], expected[4]),
                    "step {step}, request of rule {rule} at {now}, limit {i}: {requests:?}"
                );
            }
            seen[usize::from(allowed)] += 1;
            at += policies.len();
        }
        match sequence.next(17) {
            // A state no decision leaves: a TAT past the debt bound, a window ahead of the
            // clock (a clock stepped back), not a number.
            0 | 1 => {
                let client = sequence.next(3);
                let number = step % 2 == 0;
                for policy in rules.iter().flatten() {
                    let at = number.then(|| now + sequence.next(9));
                    plant_state(&redis, &key("lean", client, policy), policy, at);
                }
            }
            // Time passes: a refill, a window slides.
            2..=9 => tokio::time::sleep(Duration::from_micros(sequence.next(20_000))).await,
            _ => {}
        }
    }
    assert!(
        seen[0] > 50 && seen[1] > 50,
        "allowed and refused both decided: {seen:?}"
    );
}

/// Plant at `key` a state no lean decision of `policy` leaves: with `at` (about now, µs), a
/// TAT past the debt bound or a window ahead of the clock (a clock stepped back); without,
/// values that are not numbers (a sliding window's `:w` and its counts about now).
fn plant_state(redis: &RedisServer, key: &str, policy: &Policy, at: Option<u64>) {
    redis.cli(&[
        "EVAL",
        "for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do redis.call('DEL', k) end",
        "0",
        key,
    ]);
    match (policy, at) {
        (Policy::TokenBucket(tb), Some(at)) => {
            let tat = at + 3 * tb.capacity * tb.interval_us;
            redis.cli(&["SET", key, &tat.to_string(), "PX", "60000"]);
        }
        (Policy::SlidingWindow(sw), Some(at)) => {
            // The window after now's, newest counted, with a previous count of 1 (now's
            // window: living as long as a count made now would).
            let window = at / 1_000 / sw.window_ms + 1;
            let ttl = (2 * sw.window_ms + 1_000).to_string();
            redis.cli(&["SET", &format!("{key}:w"), &window.to_string(), "PX", &ttl]);
            redis.cli(&["SET", &format!("{key}:{}", window - 1), "1", "PX", &ttl]);
        }
        (Policy::FixedWindow(fw), Some(at)) => {
            // The window after now's, newest counted, holding 1 (a clock stepped back).
            let window = at / 1_000 / fw.window_ms + 1;
            let ttl = (2 * fw.window_ms + 1_000).to_string();
            redis.cli(&["SET", &format!("{key}:w"), &window.to_string(), "PX", &ttl]);
            redis.cli(&["SET", &format!("{key}:{window}"), "1", "PX", &ttl]);
        }
        (Policy::TokenBucket(_), None) => {
            redis.cli(&["SET", key, "x", "PX", "60000"]);
        }
        (Policy::FixedWindow(fw), None) => {
            let window = redis.now_ms() / fw.window_ms;
            redis.cli(&["SET", &format!("{key}:w"), "x", "PX", "60000"]);
            for index in [window, window + 1] {
                redis.cli(&["SET", &format!("{key}:{index}"), "x", "PX", "60000"]);
            }
        }
        (Policy::SlidingWindow(sw), None) => {
            let window = redis.now_ms() / sw.window_ms;
            redis.cli(&["SET", &format!("{key}:w"), "x", "PX", "60000"]);
            for index in [window.saturating_sub(1), window, window + 1] {
                redis.cli(&["SET", &format!("{key}:{index}"), "x", "PX", "60000"]);
            }
        }
        _ => unreachable!("a lean algorithm"),
    }
}

/// Every key of a client's under one limit (`ARGV[1]`, and `ARGV[1] .. ':' ..` anything: a
/// window's counts and `:w`), sorted, each as its name after `ARGV[1]`, `=` and its value (a
/// hash's fields and values, comma-separated).
const FAMILY: &str = r#"
local keys = redis.call('KEYS', ARGV[1] .. '*')
table.sort(keys)
local out = {}
for _, key in ipairs(keys) do
  local value
  if redis.call('TYPE', key).ok == 'hash' then
    value = table.concat(redis.call('HGETALL', key), ',')
  else
    value = redis.call('GET', key)
  end
  out[#out + 1] = string.sub(key, #ARGV[1] + 1) .. '=' .. value
end
return out
"#;

/// A twin of a client's keys under one limit: every key of `ARGV[2]`'s (as [`FAMILY`] finds
/// them) deleted, then each of `ARGV[1]`'s copied to the same name under `ARGV[2]`, persisted
/// (so nothing of it expires between the lean call and the full script's run).
const TWIN: &str = r#"
for _, key in ipairs(redis.call('KEYS', ARGV[2] .. '*')) do
  redis.call('DEL', key)
end
for _, key in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do
  local twin = ARGV[2] .. string.sub(key, #ARGV[1] + 1)
  redis.call('COPY', key, twin)
  redis.call('PERSIST', twin)
end
return 0
"#;

/// A fresh redis-server with the function library loaded, and a connection to it.
/// A lean decision reads nothing but a whole number in [0, 2^53) as a stored state: Lua's
/// `tonumber` takes `"2.5"`, `"nan"`, `"inf"` or `"1e300"`, which Redis would hand the gateway
/// as other integers, so Lua (which counts) and the gateway (which answers) would disagree and a
/// request refused in Lua, never counted, be let through. Planted so, a key is a client never
/// seen: the reply says so, and the allowed request's count replaces the value.
#[tokio::test]
async fn lean_decisions_read_only_whole_numbers_as_state() {
    let (_redis, mut connection) = redis_with_the_library().await;
    let library = function_library();
    let bucket = Policy::TokenBucket(TokenBucket {
        capacity: 3,
        interval_us: 1_000_000,
    });
    let window = Policy::SlidingWindow(SlidingWindow {
        limit: 3,
        window_ms: 60_000,
    });
    let decide = |policy: &Policy, key: &str| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(library.decide(policy.script_index())).arg(1).arg(key);
        for argument in policy.lean_arguments(Cost::ONE).unwrap().as_slice() {
            cmd.arg(*argument);
        }
        cmd.arg("");
        cmd
    };
    let numbers = |reply: redis::Value| -> Vec<u64> {
        let redis::Value::BulkString(text) = reply else {
            panic!("not a lean reply: {reply:?}");
        };
        String::from_utf8(text)
            .unwrap()
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect()
    };
    for hostile in ["2.5", "nan", "inf", "-inf", "-1", "1e300", "9007199254740993"] {
        // The bucket: its TAT.
        let _: () = redis::cmd("SET")
            .arg("b")
            .arg(hostile)
            .query_async(&mut connection)
            .await
            .unwrap();
        let reply = numbers(decide(&bucket, "b").query_async(&mut connection).await.unwrap());
        assert_eq!(
            reply[1], reply[0],
            "{hostile}: a TAT of {reply:?}, not a bucket never seen"
        );
        let tat: String = redis::cmd("GET")
            .arg("b")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(tat.parse::<u64>().unwrap(), reply[0] + 1_000_000, "{hostile}");
        // The window: `:w` and the counts of every window near now.
        let (seconds, _): (u64, u64) = redis::cmd("TIME").query_async(&mut connection).await.unwrap();
        let now_window = seconds * 1_000 / 60_000;
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg("s:w").arg(hostile).ignore();
        for index in now_window - 1..=now_window + 1 {
            pipe.cmd("SET").arg(format!("s:{index}")).arg(hostile).ignore();
        }
        let _: () = pipe.query_async(&mut connection).await.unwrap();
        let reply = numbers(decide(&window, "s").query_async(&mut connection).await.unwrap());
        assert_eq!(reply.len(), 1, "{hostile}: {reply:?}, not a client never seen");
        let counted_window = reply[0] / 1_000 / 60_000;
        let count: String = redis::cmd("GET")
            .arg(format!("s:{counted_window}"))
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(count, "1", "{hostile}");
    }
}

async fn redis_with_the_library() -> (RedisServer, redis::aio::MultiplexedConnection) {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(function_library().source())
        .query_async(&mut connection)
        .await
        .unwrap();
    (redis, connection)
}
