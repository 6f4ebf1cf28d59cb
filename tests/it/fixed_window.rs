//! The fixed window decided on Redis without a script (issue 28 item 1): `INCRBY` + `PEXPIRE
//! NX` pipelined on a key per window, a refusal given back, a call given up on given back when
//! it lands, on one Redis and on a Cluster, and the script when Redis refuses `PEXPIRE NX`.

use std::net::IpAddr;
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use tollgate::algorithms::{Cost, FixedWindow, Policy};
use tollgate::rules::Rule;
use tollgate::stores::{RedisStore, RedisTarget, StoreError};

use crate::support::{Backend, Gateway, RedisCluster, RedisServer, admitted_at_once, get};

/// 10^7 s: a window boundary (aligned to the epoch) almost never falls inside a test run.
const LONG_MS: u64 = 10_000_000_000;

fn rule(limit: u64) -> Rule {
    Rule::new(
        0,
        "general",
        Policy::FixedWindow(FixedWindow {
            limit,
            window_ms: LONG_MS,
        }),
    )
}

fn store(redis: &RedisServer, prefix: &str, timeout: Duration) -> RedisStore {
    RedisStore::new(&RedisTarget::Single(redis.url()), prefix, timeout).unwrap()
}

/// The key of `client`'s count in the window now on `redis`'s clock.
fn counter(redis: &RedisServer, store: &RedisStore, rule: &Rule, client: IpAddr) -> String {
    let time = redis.cli(&["TIME"]);
    let mut time = time.lines().map(|line| line.trim().parse::<u64>().unwrap());
    let now_ms = time.next().unwrap() * 1_000 + time.next().unwrap() / 1_000;
    format!("{}:{}", store.key(rule, client.into()), now_ms / LONG_MS)
}

/// The count on `key`, 0 for no key.
fn count(redis: &RedisServer, key: &str) -> i64 {
    redis.cli(&["GET", key]).trim().parse().unwrap_or(0)
}

/// Whether `store` admits one request of `client` under `rule`.
async fn admits(store: &RedisStore, rule: &Rule, client: IpAddr) -> bool {
    store.check(rule, client.into(), Cost::ONE).await.unwrap().allowed
}

/// Three stores (three replicas' connections) deciding 300 requests at once for one client
/// under a limit of 25 admit exactly 25, without a script; the 275 refusals gave back what
/// they counted, so the window's count is exactly 25 afterwards.
#[tokio::test]
async fn replicas_at_once_admit_exactly_the_limit_without_a_script() {
    let redis = RedisServer::start();
    let rule = rule(25);
    let stores: Vec<RedisStore> = (0..3)
        .map(|_| store(&redis, "fw-exact:", Duration::from_secs(5)))
        .collect();
    let client: IpAddr = "192.0.2.1".parse().unwrap();
    let allowed = admitted_at_once(&stores, &rule, client, 300).await;
    assert_eq!(allowed, 25);
    assert_eq!(count(&redis, &counter(&redis, &stores[0], &rule, client)), 25);
    assert_eq!(redis.calls("incrby"), 300, "a pipeline per decision");
    assert_eq!(redis.calls("decrby"), 275, "every refusal given back");
    assert_eq!(redis.calls("fcall") + redis.calls("evalsha"), 0, "no script");
    // The count lives past the window's end: its window and a second, set once.
    let ttl: u64 = redis
        .cli(&["PTTL", &counter(&redis, &stores[0], &rule, client)])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > LONG_MS - 60_000 && ttl <= LONG_MS + 1_000, "{ttl}");
}

/// Costs of 1 to 7 from three stores at once, 40 rounds of 30 requests, each round a window
/// of its own (another client): the costs admitted never sum above the limit, and once every
/// refusal is given back the window's count is exactly what was admitted. (With costs, a
/// request may be refused while another's increment is out, although it would have fitted:
/// conservative for a round trip, never over.)
#[tokio::test]
async fn costs_at_once_never_pass_the_limit_and_refusals_leave_no_trace() {
    let redis = RedisServer::start();
    let rule = rule(20);
    let stores: Vec<RedisStore> = (0..3)
        .map(|_| store(&redis, "fw-costs:", Duration::from_secs(5)))
        .collect();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..40u32 {
        let client: IpAddr = format!("198.51.100.{}", round + 1).parse().unwrap();
        let costs: Vec<u64> = (0..30)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                1 + seed % 7
            })
            .collect();
        let decisions = join_all(
            costs
                .iter()
                .enumerate()
                .map(|(i, &cost)| stores[i % 3].check(&rule, client.into(), Cost::saturating(cost))),
        )
        .await;
        let admitted: u64 = decisions
            .iter()
            .zip(&costs)
            .filter(|(decision, _)| decision.as_ref().unwrap().allowed)
            .map(|(_, cost)| cost)
            .sum();
        assert!(admitted <= 20, "round {round}: {admitted} admitted");
        assert!(admitted > 0, "round {round}: nothing admitted");
        let key = counter(&redis, &stores[0], &rule, client);
        assert_eq!(count(&redis, &key), admitted as i64, "round {round}");
    }
}

/// A refusal leaves the count as it was, a cost above the limit (however hostile) is refused
/// and spends nothing, and the numbers are the algorithm's.
#[tokio::test]
async fn a_refusal_spends_nothing() {
    let redis = RedisServer::start();
    let store = store(&redis, "fw-refused:", Duration::from_secs(5));
    let rule = rule(3);
    let client: IpAddr = "192.0.2.2".parse().unwrap();
    for remaining in [2, 1, 0] {
        let decision = store.check(&rule, client.into(), Cost::ONE).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, remaining);
        assert_eq!(decision.retry_after, Duration::ZERO);
    }
    let key = counter(&redis, &store, &rule, client);
    for cost in [1, 2, 4, 1 << 53, u64::MAX] {
        let refused = store
            .check(&rule, client.into(), Cost::saturating(cost))
            .await
            .unwrap();
        assert!(!refused.allowed, "cost {cost}");
        assert_eq!(refused.remaining, 0);
        assert!(refused.retry_after > Duration::from_secs(1));
        assert_eq!(refused.retry_after, refused.reset_after);
        assert_eq!(count(&redis, &key), 3, "cost {cost}: given back");
    }
    // A fresh client: a cost above the limit is refused and spends nothing; the limit passes.
    let fresh: IpAddr = "192.0.2.3".parse().unwrap();
    let key = counter(&redis, &store, &rule, fresh);
    for cost in [4, u64::MAX] {
        let refused = store
            .check(&rule, fresh.into(), Cost::saturating(cost))
            .await
            .unwrap();
        assert!(!refused.allowed);
        assert_eq!(count(&redis, &key), 0);
    }
    let whole = store
        .check(&rule, fresh.into(), Cost::saturating(3))
        .await
        .unwrap();
    assert!(whole.allowed);
    assert_eq!(whole.remaining, 0);
    // What hostile INCRBYs could have reached: nothing above the limit + 1.
    let stats = redis.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_incrby:"), "{stats}");
}

/// Calls frozen past their deadline (SIGSTOP) were answered by the timeout; when Redis wakes
/// it runs them, and what they counted is given back: the client has exactly what it had. A
/// freeze longer than the connection's own response timeout (10 times the timeout) leaves
/// them counted instead (nothing proves that such a call reached Redis, and a give-back of a
/// count never made would admit past the limit): conservative, never over the limit.
#[tokio::test]
async fn calls_given_up_on_are_given_back_when_redis_wakes() {
    let redis = RedisServer::start();
    let store = store(&redis, "fw-frozen:", Duration::from_millis(100));
    let rule = rule(5);
    let client: IpAddr = "192.0.2.4".parse().unwrap();
    for _ in 0..2 {
        assert!(admits(&store, &rule, client).await);
    }
    let key = counter(&redis, &store, &rule, client);
    for (frozen, left) in [(Duration::from_millis(250), 2), (Duration::from_millis(1_200), 7)] {
        redis.freeze();
        let decisions = join_all((0..5).map(|_| store.check(&rule, client.into(), Cost::ONE))).await;
        for decision in decisions {
            assert!(matches!(decision, Err(StoreError::Timeout(_))), "{decision:?}");
        }
        tokio::time::sleep(frozen).await;
        redis.thaw();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while count(&redis, &key) != left && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            count(&redis, &key),
            left,
            "frozen {frozen:?}: late counts given back, or left counted past the response timeout"
        );
    }
    // 7 of 5 counted: refused until the window ends, never admitted past the limit.
    assert!(!admits(&store, &rule, client).await);
}

/// On a Cluster every client's count is on the master of its key's slot (the hash tag's), and
/// the budget is exact there.
#[tokio::test]
async fn a_cluster_counts_each_window_on_its_keys_master() {
    let cluster = RedisCluster::start();
    let store = cluster.store("fw-cluster:");
    let rule = rule(4);
    for n in 1..=6u8 {
        let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
        let allowed = admitted_at_once(std::slice::from_ref(&store), &rule, client, 10).await;
        assert_eq!(allowed, 4, "client {client}");
        let owner = &cluster.nodes[cluster.owner_of(&store.key(&rule, client.into()))];
        let key = counter(owner, &store, &rule, client);
        assert_eq!(count(owner, &key), 4, "client {client}: counted on its master");
    }
    assert!(
        cluster.masters_holding_keys() >= 2,
        "keys spread over the masters"
    );
}

/// A Redis that refuses `PEXPIRE ... NX` (before 7.0; here a user the ACL forbids `PEXPIRE`)
/// is decided by the fixed window's script instead, from the first request on, exactly.
#[tokio::test]
async fn without_pexpire_nx_the_script_decides() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url_of_user_without("nopexpire", "-pexpire");
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_URL", &url),
            ("ALGORITHM", "fixed_window"),
            ("LIMIT", "3"),
            ("WINDOW_SIZE", "10000000"),
        ],
    )
    .await;
    for remaining in [2, 1, 0] {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining);
    }
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(redis.calls("fcall") >= 3, "decided by the script");
    assert_eq!(redis.calls("pexpire"), 0, "refused, and not tried again");
    assert_eq!(
        redis.calls("decrby"),
        1,
        "the first request's increment given back"
    );
}

/// The admin's inspection reads a fixed window without writing (its script with a cost of 0
/// writes nothing), and a reset deletes the window's count: the whole limit is back.
#[tokio::test]
async fn inspecting_writes_nothing_and_a_reset_gives_the_window_back() {
    let redis = RedisServer::start();
    let store = store(&redis, "fw-reset:", Duration::from_secs(5));
    let rule = rule(3);
    let client: IpAddr = "192.0.2.9".parse().unwrap();
    for _ in 0..3 {
        assert!(admits(&store, &rule, client).await);
    }
    let key = store.key(&rule, client.into());
    let keys = || {
        let mut keys: Vec<String> = redis.cli(&["--scan"]).lines().map(str::to_owned).collect();
        keys.sort();
        keys
    };
    let before = keys();
    let seen = store.inspect_key(&rule, &key).await.unwrap();
    assert_eq!(seen.remaining, 0);
    assert_eq!(keys(), before, "inspecting wrote nothing");
    assert!(store.reset_key(&rule, &key, client.into()).await.unwrap());
    assert!(keys().is_empty(), "{:?}", keys());
    let decision = store.check(&rule, client.into(), Cost::ONE).await.unwrap();
    assert_eq!((decision.allowed, decision.remaining), (true, 2));
}
