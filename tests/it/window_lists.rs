//! Limit lists of fixed and sliding windows decided on Redis without a script (issue 28 item
//! 1): each limit's `INCRBY` + `PEXPIRE NX` (and a sliding window's `GET` of the window
//! before) in one pipeline, every increment given back when any limit refuses; as the memory
//! store decides, across replicas exactly, and on a Cluster.

use std::net::IpAddr;
use std::time::Duration;

use tollgate::algorithms::{Cost, FixedWindow, Limits, Policy, SlidingWindow};
use tollgate::rules::Rule;
use tollgate::stores::{MemoryStore, RedisStore, RedisTarget};

use crate::support::{RedisCluster, RedisServer, admitted_at_once};

/// 10^7 s: a window boundary (aligned to the epoch) almost never falls inside a test run.
const LONG_MS: u64 = 10_000_000_000;

fn fixed(limit: u64, window_ms: u64) -> Policy {
    Policy::FixedWindow(FixedWindow { limit, window_ms })
}

fn sliding(limit: u64, window_ms: u64) -> Policy {
    Policy::SlidingWindow(SlidingWindow { limit, window_ms })
}

fn rule(limits: &[Policy]) -> Rule {
    Rule::new(0, "general", Limits::new(limits.to_vec()).unwrap())
}

fn store(redis: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::new(&RedisTarget::Single(redis.url()), prefix, Duration::from_secs(5)).unwrap()
}

/// Every key on `redis` with its count, sorted by key.
fn counts(redis: &RedisServer) -> Vec<(String, i64)> {
    let mut keys: Vec<String> = redis.cli(&["--scan"]).lines().map(str::to_owned).collect();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let count = redis.cli(&["GET", &key]).trim().parse().unwrap();
            (key, count)
        })
        .collect()
}

fn no_script(redis: &RedisServer) {
    assert_eq!(
        redis.calls("fcall") + redis.calls("evalsha") + redis.calls("eval"),
        0,
        "no script"
    );
}

/// Three replicas deciding 300 requests at once for one client under a fixed window of 25
/// and a sliding window of 40 admit exactly 25, without a script: two increments a decision
/// in one pipeline, and each of the 275 refusals gave both back, so each window holds
/// exactly 25 afterwards.
#[tokio::test]
async fn replicas_at_once_admit_the_tightest_limit_without_a_script() {
    let redis = RedisServer::start();
    let rule = rule(&[fixed(25, LONG_MS), sliding(40, LONG_MS)]);
    let stores: Vec<RedisStore> = (0..3).map(|_| store(&redis, "wl-exact:")).collect();
    let client: IpAddr = "192.0.2.1".parse().unwrap();
    let allowed = admitted_at_once(&stores, &rule, client, 300).await;
    assert_eq!(allowed, 25);
    assert_eq!(redis.calls("incrby"), 600, "an increment per limit and decision");
    assert_eq!(redis.calls("decrby"), 550, "every refusal gave back both");
    no_script(&redis);
    let counts = counts(&redis);
    assert_eq!(counts.len(), 2, "a counter per limit, nothing else: {counts:?}");
    for (key, count) in &counts {
        assert_eq!(*count, 25, "{key}");
        let ttl: u64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > LONG_MS - 60_000, "{key} expires: {ttl}");
    }
}

/// A request one limit refuses spends nothing in the others, whatever its cost (hostile ones
/// included), and their parts of the refusal say what they hold with nothing spent.
#[tokio::test]
async fn a_refusal_by_one_limit_spends_nothing_in_the_others() {
    let redis = RedisServer::start();
    let store = store(&redis, "wl-refused:");
    for (n, limits, tighter) in [
        (1, [fixed(3, LONG_MS), sliding(5, LONG_MS)], 0),
        (2, [sliding(3, LONG_MS), fixed(5, LONG_MS)], 0),
        (3, [fixed(5, LONG_MS), sliding(3, LONG_MS)], 1),
    ] {
        let rule = rule(&limits);
        let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
        assert_eq!(
            admitted_at_once(std::slice::from_ref(&store), &rule, client, 3).await,
            3
        );
        for cost in [1, 2, 4, 1 << 53, u64::MAX] {
            let refused = store
                .check(&rule, client.into(), Cost::saturating(cost))
                .await
                .unwrap();
            assert!(!refused.allowed, "list {n}, cost {cost}");
            assert!(refused.retry_after > Duration::from_secs(1));
            let parts: Vec<_> = refused.parts().into_iter().collect();
            assert!(!parts[tighter].allowed, "list {n}, cost {cost}");
            // A cost that fits the other limit: it allowed the request, and says it holds
            // what it held (a larger cost is refused by both).
            if cost <= 2 {
                assert_eq!(refused.described(), tighter, "list {n}: the limit that refused");
                let other = &parts[1 - tighter];
                assert!(other.allowed, "list {n}, cost {cost}: the other limit allowed it");
                assert_eq!(other.remaining, 2, "list {n}, cost {cost}: nothing spent");
            }
        }
    }
    // Three clients, two counters each, each holding the 3 allowed.
    let counts = counts(&redis);
    assert_eq!(counts.len(), 6, "{counts:?}");
    assert!(counts.iter().all(|(_, count)| *count == 3), "{counts:?}");
    no_script(&redis);
}

/// Lists of windows short and long, fixed and sliding, decided on Redis without a script and
/// by a memory store at the time Redis decided at: every decision the same, every part
/// included, through window boundaries (a 1 s window's) and refusals by either limit.
#[tokio::test]
async fn lists_of_windows_agree_with_memory() {
    let redis = RedisServer::start();
    let store = store(&redis, "wl-diff:");
    let lists = [
        vec![fixed(5, 1_000), sliding(7, 60_000)],
        vec![sliding(3, 1_000), fixed(10, LONG_MS)],
        vec![fixed(2, 1_000), sliding(4, 1_000), fixed(30, LONG_MS)],
    ];
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for (n, limits) in lists.iter().enumerate() {
        let rule = rule(limits);
        let memory = MemoryStore::new(100.try_into().unwrap(), std::slice::from_ref(&rule));
        let client: IpAddr = format!("192.0.2.{}", 10 + n).parse().unwrap();
        for i in 0..150 {
            if next(10) == 0 {
                tokio::time::sleep(Duration::from_millis(50 + next(200))).await;
            }
            let cost = match next(13) {
                0 => [1 << 31, 1 << 53, i64::MAX as u64, u64::MAX][next(4) as usize],
                _ => 1 + next(2),
            };
            let actual = store
                .check(&rule, client.into(), Cost::saturating(cost))
                .await
                .unwrap();
            let expected = memory.check_at(&rule, client.into(), Cost::saturating(cost), actual.at_us);
            assert_eq!(actual, expected, "list {n}, step {i}, cost {cost}");
        }
    }
    no_script(&redis);
}

/// On a Cluster, a list's counters share the client's hash slot: one pipeline to its master,
/// which counts them all.
#[tokio::test]
async fn a_cluster_counts_a_list_on_the_clients_master() {
    let cluster = RedisCluster::start();
    let store = cluster.store("wl-cluster:");
    let rule = rule(&[sliding(4, LONG_MS), fixed(6, LONG_MS)]);
    for n in 1..=6u8 {
        let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
        let allowed = admitted_at_once(std::slice::from_ref(&store), &rule, client, 10).await;
        assert_eq!(allowed, 4, "client {client}");
        let owner = &cluster.nodes[cluster.owner_of(&store.key(&rule, client.into()))];
        let prefix = store.key(&rule, client.into());
        let tag = &prefix[..=prefix.find('}').unwrap()];
        let keys = owner.cli(&["--scan", "--pattern", &format!("{tag}*")]);
        let mut counts: Vec<i64> = keys
            .lines()
            .map(|key| owner.cli(&["GET", key]).trim().parse().unwrap())
            .collect();
        counts.sort();
        assert_eq!(counts, [4, 4], "client {client}: both counted on its master");
    }
}

/// A Redis that refuses `PEXPIRE ... NX` (before 7.0; here a user the ACL forbids `PEXPIRE`)
/// decides a list of windows by the batch script instead, from the first request on,
/// exactly: that request's increments, one per limit, given back.
#[tokio::test]
async fn without_pexpire_nx_the_script_decides_a_list() {
    let redis = RedisServer::start();
    let url = redis.url_of_user_without("nopexpire", "-pexpire");
    let store = RedisStore::new(&RedisTarget::Single(url), "wl-nx:", Duration::from_secs(5)).unwrap();
    let rule = rule(&[sliding(3, LONG_MS), fixed(5, LONG_MS)]);
    let client: IpAddr = "192.0.2.20".parse().unwrap();
    let mut allowed = 0;
    for _ in 0..6 {
        if store
            .check(&rule, client.into(), Cost::ONE)
            .await
            .unwrap()
            .allowed
        {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3);
    assert_eq!(
        redis.calls("decrby"),
        2,
        "the first request's increments given back"
    );
    assert!(redis.calls("fcall") >= 6, "decided by the script");
}

/// A limit whose count fails (its key holds another type) fails the request, and what the
/// other limits counted for it is given back: the error answers the request, which spends
/// nothing.
#[tokio::test]
async fn a_count_that_fails_gives_the_others_back() {
    let redis = RedisServer::start();
    let store = store(&redis, "wl-error:");
    let rule = rule(&[fixed(5, LONG_MS), sliding(5, LONG_MS)]);
    let client: IpAddr = "192.0.2.30".parse().unwrap();
    assert_eq!(
        admitted_at_once(std::slice::from_ref(&store), &rule, client, 1).await,
        1
    );
    let counts = counts(&redis);
    let fixed_key = counts
        .iter()
        .find(|(key, _)| key.contains(":fw:"))
        .unwrap()
        .0
        .clone();
    let sliding_key = counts
        .iter()
        .find(|(key, _)| key.contains(":sw:"))
        .unwrap()
        .0
        .clone();
    redis.cli(&["DEL", &sliding_key]);
    redis.cli(&["HSET", &sliding_key, "planted", "1"]);
    let failed = store.check(&rule, client.into(), Cost::ONE).await;
    assert!(failed.is_err(), "{failed:?}");
    // The give-back runs in a task of its own: give it a moment.
    let mut count = 0;
    for _ in 0..100 {
        count = redis.cli(&["GET", &fixed_key]).trim().parse::<i64>().unwrap();
        if count == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count, 1, "the fixed window's increment given back");
}
