//! Redis outages: down at boot, killed, frozen, restarted empty. The gateway keeps serving
//! (fail open) or refuses cleanly (fail closed), never waits on a dead Redis for every
//! request, and resumes limiting by itself.
//!
//! The latency bounds here are deliberately loose multiples: they tell "the breaker answers"
//! (microseconds) from "every request waits for a timeout" (hundreds of milliseconds), not
//! fine timings.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::{Backend, Gateway, Reply, get, get_from, redis::RedisServer};

/// `GET /` every 50 ms, for up to 10 s, until a reply satisfies `done`; returns that reply.
async fn poll(gateway: &Gateway, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = get(gateway.addr, "/").await;
        if done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "{what}: last status {}", reply.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Poll until a request is decided again (the backend sends an X-RateLimit-Limit of its own,
/// never a Remaining).
async fn until_limiting_resumes(gateway: &Gateway) -> Reply {
    poll(gateway, "limiting did not resume", |reply| {
        reply.headers.contains_key("x-ratelimit-remaining")
    })
    .await
}

#[tokio::test]
async fn redis_down_at_boot_fails_open_without_waiting() {
    let backend = Backend::start().await;
    let port = crate::support::free_port();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", &format!("127.0.0.1:{port}")),
            ("REDIS_TIMEOUT_MS", "200"),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("MAX_TOKENS", "3"),
        ],
    )
    .await;
    let started = Instant::now();
    for _ in 0..20 {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::OK, "fail open forwards");
        assert!(
            !reply.headers.contains_key("x-ratelimit-remaining"),
            "no invented budget"
        );
    }
    // 20 timeouts would be 4 s; the breaker makes it a few failures at most.
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "took {:?}",
        started.elapsed()
    );

    // Redis comes up: limiting starts by itself.
    let _redis = RedisServer::start_with(port, &[]);
    let reply = until_limiting_resumes(&gateway).await;
    assert_eq!(reply.number("x-ratelimit-limit"), 3);
}

#[tokio::test]
async fn redis_killed_mid_run_fails_open_then_resumes_when_restarted() {
    let backend = Backend::start().await;
    let mut redis = RedisServer::start();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", &redis.addr()),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.01"),
        ],
    )
    .await;
    assert_eq!(get(gateway.addr, "/").await.number("x-ratelimit-remaining"), 1);
    assert_eq!(get(gateway.addr, "/").await.number("x-ratelimit-remaining"), 0);
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);

    redis.kill();
    // The client Redis has refused stays refused until its retry time: the denial cache
    // repeats Redis's own answer without asking it.
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
    // Everyone else is served: fail open.
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    for _ in 0..20 {
        let reply = get_from(gateway.addr, other, "/", &[]).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "fail open: the backend is still served"
        );
    }

    // Restarted empty: the budget starts over, enforced again.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let reply = loop {
        let reply = get_from(gateway.addr, other, "/", &[]).await;
        if reply.headers.contains_key("x-ratelimit-remaining") {
            break reply;
        }
        assert!(Instant::now() < deadline, "limiting did not resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(reply.status, StatusCode::OK);
    let mut statuses = vec![reply.status];
    for _ in 0..2 {
        statuses.push(get_from(gateway.addr, other, "/", &[]).await.status);
    }
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
}

#[tokio::test]
async fn redis_killed_with_fail_closed_refuses_with_503_then_recovers() {
    let backend = Backend::start().await;
    let mut redis = RedisServer::start();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", &redis.addr()),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("FAIL_MODE", "closed"),
        ],
    )
    .await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    redis.kill();
    let seen_before = backend.seen().len();
    for _ in 0..10 {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.number("retry-after"), 1);
        assert_eq!(
            reply.text(),
            r#"{"error":"rate limiter unavailable","retry_after":1}"#
        );
    }
    assert_eq!(
        backend.seen().len(),
        seen_before,
        "fail closed: nothing reaches the backend"
    );
    redis.restart();
    assert_eq!(until_limiting_resumes(&gateway).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_frozen_redis_costs_one_timeout_per_request_until_the_breaker_opens() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", &redis.addr()),
            ("REDIS_TIMEOUT_MS", "300"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            ("REDIS_PROBE_INTERVAL_MS", "200"),
        ],
    )
    .await;
    assert!(
        get(gateway.addr, "/")
            .await
            .headers
            .contains_key("x-ratelimit-remaining")
    );

    redis.freeze();
    // The first requests each wait about one REDIS_TIMEOUT_MS, never much more.
    for _ in 0..3 {
        let started = Instant::now();
        let reply = get(gateway.addr, "/").await;
        let waited = started.elapsed();
        assert_eq!(reply.status, StatusCode::OK);
        assert!(
            waited >= Duration::from_millis(250),
            "answered in {waited:?}: redis was frozen"
        );
        assert!(
            waited < Duration::from_millis(2_000),
            "waited {waited:?}, far above the timeout"
        );
    }
    // Then the breaker is open: 20 requests take less than a third of 20 timeouts.
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    }
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "took {:?}",
        started.elapsed()
    );

    redis.thaw();
    until_limiting_resumes(&gateway).await;
}

#[tokio::test]
async fn redis_killed_with_fail_local_limits_per_replica_then_resumes() {
    let backend = Backend::start().await;
    let mut redis = RedisServer::start();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", &redis.addr()),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("FAIL_MODE", "local"),
            ("MAX_TOKENS", "3"),
            ("REFILL_RATE", "0.01"),
        ],
    )
    .await;
    assert_eq!(get(gateway.addr, "/").await.number("x-ratelimit-remaining"), 2);
    redis.kill();
    // This replica's own budget takes over, fresh: 3 more, then 429.
    let statuses: Vec<StatusCode> = futures_util::future::join_all((0..4).map(|_| get(gateway.addr, "/")))
        .await
        .iter()
        .map(|reply| reply.status)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        1
    );
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("x-ratelimit-limit"), 3);
    redis.restart();
    // The local budget is spent, so the first 200 is Redis deciding again, from a fresh budget.
    let reply = poll(&gateway, "redis limiting did not resume", |reply| {
        reply.status == StatusCode::OK
    })
    .await;
    assert_eq!(
        reply.number("x-ratelimit-remaining"),
        2,
        "decided by the restarted redis"
    );
}
