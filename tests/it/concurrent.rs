//! Concurrency limits (`concurrent:N`): places held while a request is in flight, decided
//! alike in memory and in Redis, given back when the response ends or the client goes away,
//! renewed while a request outlives its lease, and in Redis leases that expire when the
//! gateway holding them dies.

use std::net::IpAddr;
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tollgate::algorithms::{Concurrent, FixedWindow, SlidingLog, TokenBucket};
use tollgate::algorithms::{Cost, Decision, Limits, Policy};
use tollgate::rules::Rule;
use tollgate::stores::{MemoryStore, RedisStore, RedisTarget};

use crate::binary::Running;
use crate::support::{Backend, Gateway, RedisCluster, RedisServer, Reply, get, get_from, read_head, request};

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

fn concurrent(places: u64, lease_ms: u64) -> Policy {
    Policy::Concurrent(Concurrent { places, lease_ms })
}

/// 300 steps for client `n` under `limits`, each a decision, a place given back or a lease
/// renewed, as the gate does them, at pseudo-random times from `seed` (some past a lease's
/// end): the memory store and `store` must agree on every decision, every part included.
async fn agree_with_memory(store: &RedisStore, limits: Limits, n: usize, seed: u64) {
    let mut sequence = Sequence(seed);
    let rule = Rule::new(0, "general", limits);
    let memory = MemoryStore::new(100.try_into().unwrap(), std::slice::from_ref(&rule));
    // Each concurrency limit alone, by its position: what the gate gives back and renews.
    let places: Vec<(usize, Rule)> = rule
        .limits
        .iter()
        .enumerate()
        .filter(|(_, policy)| policy.is_concurrent())
        .map(|(position, policy)| (position, Rule::new(0, "general", *policy)))
        .collect();
    let client: IpAddr = format!("192.0.2.{n}").parse().unwrap();
    let client = client.into();
    let mut now_us = 1_764_000_000_000_000 + sequence.next(1_000_000_000);
    let mut held: Vec<(Decision, u64)> = Vec::new();
    for i in 0..300 {
        now_us += sequence.next(400_000);
        match sequence.next(4) {
            0 if !held.is_empty() => {
                let (decision, cost) = held.swap_remove(sequence.next(held.len() as u64) as usize);
                for (position, places) in &places {
                    let at_us = decision.parts()[*position].at_us;
                    memory.refund(places, client, Cost::saturating(cost), at_us);
                    store
                        .refund_at(places, client, Cost::saturating(cost), at_us, now_us)
                        .await
                        .unwrap();
                }
            }
            1 if !held.is_empty() => {
                let (decision, cost) = held[sequence.next(held.len() as u64) as usize].clone();
                for (position, places) in &places {
                    let at_us = decision.parts()[*position].at_us;
                    memory.renew_at(places, client, at_us, now_us);
                    store
                        .renew_at(places, client, Cost::saturating(cost), at_us, now_us)
                        .await
                        .unwrap();
                }
            }
            _ => {
                let cost = 1 + sequence.next(2);
                let expected = memory.check_at(&rule, client, Cost::saturating(cost), now_us);
                let actual = store
                    .check_at(&rule, client, Cost::saturating(cost), now_us)
                    .await
                    .unwrap();
                assert_eq!(
                    actual, expected,
                    "{}, step {i}, now {now_us}, cost {cost}",
                    rule.limits
                );
                if expected.allowed {
                    held.push((expected, cost));
                }
            }
        }
    }
}

#[tokio::test]
async fn redis_and_memory_agree_on_concurrency_limits() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisTarget::Single(redis.url()), "cc:", Duration::from_secs(5)).unwrap();
    let lists = [
        vec![concurrent(3, 1_000)],
        vec![concurrent(1, 2_000)],
        vec![
            concurrent(2, 1_500),
            Policy::TokenBucket(TokenBucket {
                capacity: 5,
                interval_us: 300_000,
            }),
        ],
        vec![
            Policy::FixedWindow(FixedWindow {
                limit: 9,
                window_ms: 5_000,
            }),
            concurrent(3, 1_000),
        ],
        vec![
            Policy::SlidingLog(SlidingLog {
                limit: 6,
                window_ms: 3_000,
            }),
            concurrent(4, 2_500),
            concurrent(2, 1_000),
        ],
    ];
    for (n, limits) in lists.into_iter().enumerate() {
        let limits = Limits::new(limits).unwrap();
        agree_with_memory(&store, limits, n, 0x9E37_79B9_7F4A_7C15 + n as u64).await;
    }
}

/// The gateway's environment for each store: memory, and Redis at `redis`.
fn on_each_store(redis: &RedisServer, vars: &[(&str, &str)]) -> [Vec<(String, String)>; 2] {
    let owned: Vec<(String, String)> = vars
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let mut with_redis = owned.clone();
    with_redis.push(("REDIS_ADDR".into(), redis.addr()));
    [owned, with_redis]
}

/// The real binary with `vars`.
fn binary(vars: &[(String, String)]) -> Running {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    Running::start(&vars)
}

/// `GET path` through `gateway` from 127.0.0.1, in a task of its own.
fn spawn_get(gateway: std::net::SocketAddr, path: &'static str) -> tokio::task::JoinHandle<Reply> {
    tokio::spawn(async move { get(gateway, path).await })
}

/// A place given back with Redis goes in a task of its own, one round trip after the
/// response: ask until `path` is allowed, for at most `within`.
async fn allowed_within(gateway: std::net::SocketAddr, path: &str, within: Duration) -> Reply {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let reply = get(gateway, path).await;
        if reply.status != StatusCode::TOO_MANY_REQUESTS || tokio::time::Instant::now() >= deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn n_plus_one_requests_in_flight_get_one_429_and_a_finished_one_gives_its_place_back() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let backend_url = backend.url();
    for vars in on_each_store(
        &redis,
        &[("BACKEND_URL", &backend_url), ("LIMITS", "concurrent:3")],
    ) {
        let tollgate = binary(&vars);
        let addr = tollgate.addr;
        let short = spawn_get(addr, "/slow/600");
        let long = [spawn_get(addr, "/slow/2500"), spawn_get(addr, "/slow/2500")];
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Three in flight: a fourth, and a fifth, are refused, and take nothing.
        for _ in 0..2 {
            let refused = get(addr, "/slow/10").await;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{vars:?}");
            assert_eq!(
                refused.header("retry-after"),
                Some("1"),
                "its retry time is unknown"
            );
            assert_eq!(refused.header("x-ratelimit-limit"), Some("3"));
            assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
        }
        assert_eq!(short.await.unwrap().status, StatusCode::OK);
        // The short one ended: its place is back, and only its.
        let next = allowed_within(addr, "/slow/10", Duration::from_millis(500)).await;
        assert_eq!(
            next.status,
            StatusCode::OK,
            "{vars:?}: a finished request's place is back"
        );
        assert_eq!(
            next.header("x-ratelimit-remaining"),
            Some("0"),
            "two in flight and this one"
        );
        let in_flight = spawn_get(addr, "/slow/800");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(get(addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
        for reply in join_all(long).await {
            assert_eq!(reply.unwrap().status, StatusCode::OK);
        }
        assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
        // All ended: three at once pass again.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = join_all((0..3).map(|_| spawn_get(addr, "/slow/300"))).await;
        for reply in again {
            assert_eq!(reply.unwrap().status, StatusCode::OK, "{vars:?}");
        }
        drop(tollgate);
    }
}

#[tokio::test]
async fn a_client_that_goes_away_mid_response_gives_its_place_back() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let backend_url = backend.url();
    for vars in on_each_store(
        &redis,
        &[("BACKEND_URL", &backend_url), ("LIMITS", "concurrent:1")],
    ) {
        let tollgate = binary(&vars);
        let addr = tollgate.addr;
        // A body far larger than the sockets' buffers, which the client stops reading.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /bytes/200000000 HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
            .await
            .unwrap();
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            get(addr, "/").await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{vars:?}: the download holds the place"
        );
        drop(stream);
        // Well before the lease (60 s) ends.
        let after = allowed_within(addr, "/", Duration::from_secs(2)).await;
        assert_eq!(after.status, StatusCode::OK, "{vars:?}: the place came back");

        // Gone before the response head: the request is dropped, and its place with it.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /slow/5000 HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(get(addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
        drop(stream);
        let after = allowed_within(addr, "/", Duration::from_secs(2)).await;
        assert_eq!(after.status, StatusCode::OK, "{vars:?}: the place came back");
        drop(tollgate);
    }
}

#[tokio::test]
async fn a_request_longer_than_its_lease_keeps_its_place_by_renewing_it() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let backend_url = backend.url();
    for vars in on_each_store(
        &redis,
        &[("BACKEND_URL", &backend_url), ("LIMITS", "concurrent:1:1")],
    ) {
        let tollgate = binary(&vars);
        let addr = tollgate.addr;
        let long = spawn_get(addr, "/slow/3200");
        // Twice past the lease of 1 s, and later again: still held.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(900)).await;
            assert_eq!(
                get(addr, "/").await.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{vars:?}: the lease was renewed"
            );
        }
        assert_eq!(long.await.unwrap().status, StatusCode::OK);
        let after = allowed_within(addr, "/", Duration::from_millis(500)).await;
        assert_eq!(after.status, StatusCode::OK);
        drop(tollgate);
    }
}

/// A replica killed (SIGKILL: nothing given back, nothing renewed) with places held: another
/// replica sharing the Redis sees them held until their leases expire, then gets them back.
#[tokio::test]
async fn the_places_of_a_killed_gateway_come_back_when_their_leases_expire() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let backend_url = backend.url();
    let vars = [
        ("BACKEND_URL", backend_url.as_str()),
        ("REDIS_ADDR", &redis.addr()),
        ("LIMITS", "concurrent:2:2"),
    ];
    let mut doomed = Running::start(&vars);
    let other = Running::start(&vars);
    let held = [
        spawn_get(doomed.addr, "/slow/20000"),
        spawn_get(doomed.addr, "/slow/20000"),
    ];
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        get(other.addr, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the places are shared through Redis"
    );
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let killed = tokio::time::Instant::now();
    for request in held {
        // The client saw its connection cut.
        request.abort();
    }
    assert_eq!(
        get(other.addr, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a killed gateway gives nothing back"
    );
    // The leases were renewed at most 2/3 s before the kill: they end within 2 s of it.
    tokio::time::sleep(Duration::from_millis(2_100).saturating_sub(killed.elapsed())).await;
    let both = join_all([
        spawn_get(other.addr, "/slow/300"),
        spawn_get(other.addr, "/slow/300"),
    ])
    .await;
    for reply in both {
        assert_eq!(reply.unwrap().status, StatusCode::OK, "the places came back");
    }
}

/// `POST /v1/check` answers before the request happens and never hears of its end: its place
/// is a lease that runs its full time, in memory and in Redis alike.
#[tokio::test]
async fn at_the_decision_api_a_place_is_held_for_its_whole_lease() {
    let redis = RedisServer::start();
    // A decision service with Redis digests named keys with a shared secret.
    let limits = [
        ("LIMITS", "concurrent:1:1"),
        ("KEY_HASH_SECRET", "shared-secret-for-the-test"),
    ];
    for vars in on_each_store(&redis, &limits) {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let gateway = Gateway::start_decide(None, &vars).await;
        let check = || async {
            request(
                gateway.decide.unwrap(),
                [127, 0, 0, 1].into(),
                http::Method::POST,
                "/v1/check",
                &[("content-type", "application/json")],
                bytes::Bytes::from_static(br#"{"rule": "general", "key": "user-7"}"#),
            )
            .await
        };
        let answer = |reply: Reply| -> serde_json::Value { serde_json::from_slice(&reply.body).unwrap() };
        assert_eq!(answer(check().await)["allowed"], true, "{vars:?}");
        let refused = answer(check().await);
        assert_eq!(refused["allowed"], false, "the first place is still held");
        assert_eq!(refused["retry_after_s"], 1, "its retry time is unknown: a second");
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(answer(check().await)["allowed"], true, "the lease ran out");
        gateway.stop().await;
    }
}

/// On a Redis Cluster, beside a rate limit (one script call over both keys, on the client's
/// master): two replicas share each client's places, whichever master holds them, and the
/// places go back to the right key.
#[tokio::test]
async fn a_cluster_shares_places_across_replicas_and_masters() {
    let cluster = RedisCluster::start();
    let backend = Backend::start().await;
    let seeds = cluster.seeds();
    let vars = [
        ("REDIS_CLUSTER_NODES", seeds.as_str()),
        ("REDIS_TIMEOUT_MS", "5000"),
        ("LIMITS", "token_bucket:100:100+concurrent:2"),
    ];
    let one = Gateway::start(&backend.url(), &vars).await;
    let other = Gateway::start(&backend.url(), &vars).await;
    let clients: Vec<IpAddr> = (2..=7).map(|n| format!("127.0.0.{n}").parse().unwrap()).collect();
    let (one_addr, other_addr) = (one.addr, other.addr);
    let held: Vec<_> = clients
        .iter()
        .flat_map(|&client| {
            (0..2).map(move |_| {
                tokio::spawn(async move { get_from(one_addr, client, "/slow/1500", &[]).await })
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    for &client in &clients {
        let refused = get_from(other_addr, client, "/", &[]).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{client}");
    }
    for reply in join_all(held).await {
        assert_eq!(reply.unwrap().status, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for &client in &clients {
        let both = join_all((0..2).map(|_| get_from(other_addr, client, "/slow/200", &[]))).await;
        for reply in both {
            assert_eq!(reply.status, StatusCode::OK, "{client}: the places came back");
        }
    }
    assert!(
        cluster.masters_holding_keys() >= 2,
        "the clients' keys are spread"
    );
}

/// `count=failures` refunds a success's cost to the rule's rate limits, never its place: the
/// place goes back only when the response ends, once.
#[tokio::test]
async fn count_failures_refunds_the_rates_and_leaves_the_places_to_the_response() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let backend_url = backend.url();
    let routes = "/slow/*=token_bucket:2:0.001+concurrent:1,count=failures";
    for vars in on_each_store(&redis, &[("BACKEND_URL", &backend_url), ("ROUTES", routes)]) {
        let tollgate = binary(&vars);
        let addr = tollgate.addr;
        let long = spawn_get(addr, "/slow/800");
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Settled (a 200, refunded) but still streaming its response: the place is held.
        assert_eq!(
            get(addr, "/slow/1").await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{vars:?}"
        );
        assert_eq!(long.await.unwrap().status, StatusCode::OK);
        // Successes, one after the other: each refunded, so the 2-token bucket never runs out,
        // and each gives its one place back.
        for i in 0..4 {
            let reply = allowed_within(addr, "/slow/1", Duration::from_millis(500)).await;
            assert_eq!(reply.status, StatusCode::OK, "{vars:?}: success {i}");
        }
        drop(tollgate);
    }
}
