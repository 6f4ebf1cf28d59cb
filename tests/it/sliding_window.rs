//! The sliding window decided on Redis without a script (issue 28 item 1): `INCRBY` + `PEXPIRE
//! NX` + `GET` of the window before, pipelined, on the fixed window's counters, a refusal given
//! back; on one Redis and on a Cluster.

use std::net::IpAddr;
use std::time::Duration;

use tollgate::algorithms::{Cost, Policy, SlidingWindow};
use tollgate::rules::Rule;
use tollgate::stores::{RedisStore, RedisTarget};

use crate::support::{RedisCluster, RedisServer, admitted_at_once};

/// 10^7 s: a window boundary (aligned to the epoch) almost never falls inside a test run, and
/// the window before weighs all it holds for the whole test.
const LONG_MS: u64 = 10_000_000_000;

fn rule(limit: u64) -> Rule {
    Rule::new(
        0,
        "general",
        Policy::SlidingWindow(SlidingWindow {
            limit,
            window_ms: LONG_MS,
        }),
    )
}

fn store(redis: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::new(&RedisTarget::Single(redis.url()), prefix, Duration::from_secs(5)).unwrap()
}

/// The key of `client`'s count in the window now on `redis`'s clock, `back` windows before.
fn counter(redis: &RedisServer, store: &RedisStore, rule: &Rule, client: IpAddr, back: u64) -> String {
    format!(
        "{}:{}",
        store.key(rule, client.into()),
        redis.now_ms() / LONG_MS - back
    )
}

/// The count on `key`, 0 for no key.
fn count(redis: &RedisServer, key: &str) -> i64 {
    redis.cli(&["GET", key]).trim().parse().unwrap_or(0)
}

/// Three stores (three replicas' connections) deciding 300 requests at once for one client
/// under a limit of 25 admit exactly 25, without a script: a pipeline of `INCRBY`, `PEXPIRE
/// NX` and `GET` each; the 275 refusals gave back what they counted, so the window's count is
/// exactly 25 afterwards, and it lives two windows and a second.
#[tokio::test]
async fn replicas_at_once_admit_exactly_the_limit_without_a_script() {
    let redis = RedisServer::start();
    let rule = rule(25);
    let stores: Vec<RedisStore> = (0..3).map(|_| store(&redis, "sw-exact:")).collect();
    let client: IpAddr = "192.0.2.1".parse().unwrap();
    let allowed = admitted_at_once(&stores, &rule, client, 300).await;
    assert_eq!(allowed, 25);
    assert_eq!(redis.calls("incrby"), 300, "a pipeline per decision");
    assert_eq!(redis.calls("get"), 300, "the window before read by each");
    let key = counter(&redis, &stores[0], &rule, client, 0);
    assert_eq!(count(&redis, &key), 25);
    assert_eq!(redis.calls("decrby"), 275, "every refusal given back");
    assert_eq!(
        redis.calls("fcall") + redis.calls("evalsha") + redis.calls("eval"),
        0,
        "no script"
    );
    let ttl: u64 = redis.cli(&["PTTL", &key]).trim().parse().unwrap();
    assert!(ttl > 2 * LONG_MS - 60_000 && ttl <= 2 * LONG_MS + 1_000, "{ttl}");
    // Nothing else: no `:w` (only a script moves it), no hash.
    let keys = redis.cli(&["--scan"]);
    assert_eq!(keys.lines().collect::<Vec<_>>(), [key.as_str()]);
}

/// The window before weighs what it counted: with 6 of a limit of 10 there, `e` into this
/// window, `floor(4 + 6 · e / W)` more fit (the weight is 6 · (W − e) / W; W is 10^7 s, so it
/// barely changes during the test); from three replicas at once, exactly that many, and the
/// refusals leave no trace.
#[tokio::test]
async fn the_window_before_weighs_on_every_replica() {
    let redis = RedisServer::start();
    let rule = rule(10);
    let stores: Vec<RedisStore> = (0..3).map(|_| store(&redis, "sw-before:")).collect();
    let client: IpAddr = "192.0.2.2".parse().unwrap();
    let before = counter(&redis, &stores[0], &rule, client, 1);
    redis.cli(&["SET", &before, "6", "PX", "600000"]);
    let elapsed = redis.now_ms() % LONG_MS;
    let fits = (10 * LONG_MS - 6 * (LONG_MS - elapsed)) / LONG_MS;
    let allowed = admitted_at_once(&stores, &rule, client, 60).await as u64;
    assert_eq!(allowed, fits);
    assert_eq!(
        count(&redis, &counter(&redis, &stores[0], &rule, client, 0)),
        fits as i64
    );
    assert_eq!(count(&redis, &before), 6, "the window before only read");
}

/// A refusal leaves the count as it was, a cost above the limit (however hostile) is refused
/// and spends nothing, and the numbers are the algorithm's: the whole window and the next
/// until this window's count has slid out.
#[tokio::test]
async fn a_refusal_spends_nothing() {
    let redis = RedisServer::start();
    let store = store(&redis, "sw-refused:");
    let rule = rule(3);
    let client: IpAddr = "192.0.2.3".parse().unwrap();
    for remaining in [2, 1, 0] {
        let decision = store.check(&rule, client.into(), Cost::ONE).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, remaining);
        assert_eq!(decision.retry_after, Duration::ZERO);
        // This window's count leaves the sliding window when the next window ends.
        assert!(
            decision.reset_after > Duration::from_millis(LONG_MS),
            "{decision:?}"
        );
    }
    let key = counter(&redis, &store, &rule, client, 0);
    for cost in [1, 2, 4, 1 << 53, u64::MAX] {
        let refused = store
            .check(&rule, client.into(), Cost::saturating(cost))
            .await
            .unwrap();
        assert!(!refused.allowed, "cost {cost}");
        assert_eq!(refused.remaining, 0);
        assert!(refused.retry_after > Duration::from_secs(1));
        assert!(refused.retry_after <= refused.reset_after);
        assert!(refused.reset_after > Duration::from_millis(LONG_MS));
        assert_eq!(count(&redis, &key), 3, "cost {cost}: given back");
    }
    // A fresh client: a cost above the limit is refused and spends nothing; the limit passes.
    let fresh: IpAddr = "192.0.2.4".parse().unwrap();
    let key = counter(&redis, &store, &rule, fresh, 0);
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
    assert_eq!(redis.calls("fcall") + redis.calls("evalsha"), 0, "no script");
}

/// The scripts read what the decisions without one wrote: a refund gives the count back in
/// its window, the admin's inspection reads the window without writing, and a reset deletes
/// the counts around now (and `:w`): the whole limit is back.
#[tokio::test]
async fn refunds_inspection_and_reset_read_the_counters() {
    let redis = RedisServer::start();
    let store = store(&redis, "sw-reset:");
    let rule = rule(3);
    let client: IpAddr = "192.0.2.9".parse().unwrap();
    let mut last = None;
    for _ in 0..3 {
        let decision = store.check(&rule, client.into(), Cost::ONE).await.unwrap();
        assert!(decision.allowed);
        last = Some(decision);
    }
    let key = store.key(&rule, client.into());
    store
        .refund_key(&rule, &key, Cost::ONE, last.unwrap().at_us)
        .await
        .unwrap();
    assert_eq!(
        count(&redis, &counter(&redis, &store, &rule, client, 0)),
        2,
        "refunded"
    );
    let keys = || {
        let mut keys: Vec<String> = redis.cli(&["--scan"]).lines().map(str::to_owned).collect();
        keys.sort();
        keys
    };
    let before = keys();
    let seen = store.inspect_key(&rule, &key).await.unwrap();
    assert_eq!((seen.allowed, seen.remaining), (true, 1));
    assert_eq!(keys(), before, "inspecting wrote nothing");
    // A charge (a script) moves `:w`; the reset takes it too.
    store.charge_key(&rule, &key, Cost::ONE).await.unwrap();
    assert!(keys().contains(&format!("{key}:w")), "{:?}", keys());
    assert!(
        !store
            .check(&rule, client.into(), Cost::ONE)
            .await
            .unwrap()
            .allowed
    );
    assert!(store.reset_key(&rule, &key, client.into()).await.unwrap());
    assert!(keys().is_empty(), "{:?}", keys());
    let decision = store.check(&rule, client.into(), Cost::ONE).await.unwrap();
    assert_eq!((decision.allowed, decision.remaining), (true, 2));
}

/// On a Cluster the window before's count is in the same slot (the hash tag's): one pipeline
/// to the key's master, and the budget exact there.
#[tokio::test]
async fn a_cluster_counts_each_window_on_its_keys_master() {
    let cluster = RedisCluster::start();
    let store = cluster.store("sw-cluster:");
    let rule = rule(4);
    for n in 1..=6u8 {
        let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
        let allowed = admitted_at_once(std::slice::from_ref(&store), &rule, client, 10).await;
        assert_eq!(allowed, 4, "client {client}");
        let owner = &cluster.nodes[cluster.owner_of(&store.key(&rule, client.into()))];
        let key = counter(owner, &store, &rule, client, 0);
        assert_eq!(count(owner, &key), 4, "client {client}: counted on its master");
    }
}
