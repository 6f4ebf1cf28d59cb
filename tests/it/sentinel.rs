//! Redis Sentinel through the real binary: a real group (one master, one replica, three
//! Sentinels) gives two gateways one exact budget through the master they are told of, and a
//! master killed under load is followed to the promoted replica without a restart, every
//! request meanwhile answered as its fail mode says.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::StatusCode;

use crate::binary::{Running, until_metrics_say};
use crate::faults::{Load, Sample, clients, exact_budget, exact_budget_once_decided, tally};
use crate::support::redis::{SENTINEL_MASTER, wait_for};
use crate::support::{Backend, SentinelGroup, get_from};

/// The load's rule and path.
const LOAD_ROUTE: &str = "/load/*=token_bucket:5:50,name=load";
const LOAD_PATH: &str = "/load/x";

/// The binary on `group`'s Sentinels failing `fail_mode`, 5 requests per client that do not
/// refill during a test; returned once it has decided one request through the master.
async fn gateway(group: &SentinelGroup, backend: &Backend, fail_mode: &str) -> Running {
    let (url, sentinels) = (backend.url(), group.sentinels());
    let gateway = Running::start(&[
        ("BACKEND_URL", url.as_str()),
        ("REDIS_SENTINELS", sentinels.as_str()),
        ("REDIS_SENTINEL_MASTER", SENTINEL_MASTER),
        ("FAIL_MODE", fail_mode),
        // Generous for a loaded machine; the breaker's threshold and probe interval are the
        // defaults (3 failures, 500 ms), so the time to follow a failover is the default's.
        ("REDIS_TIMEOUT_MS", "200"),
        ("MAX_TOKENS", "5"),
        ("REFILL_RATE", "0.0001"),
        // The load's own rule: 5 requests refilled at 50/s, so its denials are short and
        // Redis keeps being asked (see faults.rs); `/` stays the exact rule's.
        ("ROUTES", LOAD_ROUTE),
    ]);
    until_metrics_say(&gateway, "tollgate_breaker_open 0").await;
    gateway
}

/// `requests` requests of `client`, sent at once and spread over `gateways`: how many were
/// allowed. Every one must be decided (a 200 or 429 carrying `X-RateLimit-Remaining`).
async fn allowed(gateways: &[SocketAddr], client: IpAddr, requests: usize) -> usize {
    let replies =
        join_all((0..requests).map(|i| get_from(gateways[i % gateways.len()], client, "/", &[]))).await;
    for reply in &replies {
        assert!(
            matches!(reply.status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS),
            "{client}: {}",
            reply.status
        );
        assert!(
            reply.headers.contains_key("x-ratelimit-remaining"),
            "{client}: decided"
        );
    }
    replies
        .iter()
        .filter(|reply| reply.status == StatusCode::OK)
        .count()
}

#[tokio::test]
async fn two_gateways_share_one_exact_budget_on_the_master_the_sentinels_name() {
    let group = SentinelGroup::start();
    let backend = Backend::start().await;
    let a = gateway(&group, &backend, "open").await;
    let b = gateway(&group, &backend, "open").await;
    let addrs = [a.addr, b.addr];
    for client in clients(20, 22) {
        assert_eq!(allowed(&addrs, client, 60).await, 5, "{client}");
    }
    // On the master, and replicated to the replica.
    let key = &crate::support::redis::key_of(
        &[
            ("MAX_TOKENS", "5"),
            ("REFILL_RATE", "0.0001"),
            ("ROUTES", LOAD_ROUTE),
        ],
        "general",
        "127.0.0.20",
    );
    assert_eq!(group.servers[0].cli(&["EXISTS", key]).trim(), "1");
    wait_for(
        || group.servers[1].cli(&["EXISTS", key]).trim() == "1",
        "the key on the replica",
    );
    assert!(a.log().contains("redis sentinel: the master"), "{}", a.log());
}

/// Both fail modes at once: gateway `open` fails open, gateway `closed` fails closed, both
/// under load from four clients each when the master is killed. Every answer is what its
/// mode says (a decision, or else 200 from `open` and 503 from `closed`, never anything
/// else), and once the Sentinels have promoted the replica both decide again, exactly, on a
/// budget they share. The time from the promotion (as the test sees it, polling a Sentinel
/// every 20 ms) to each gateway's first decision is printed, and held to the 2 s: the
/// gateway follows `+switch-master` at once and the breaker's probe (every 500 ms) closes the
/// breaker, so the expected time is about half a second, and 2 s is four times that.
#[tokio::test]
async fn a_master_killed_under_load_is_followed_to_the_promoted_replica() {
    let mut group = SentinelGroup::start();
    let backend = Backend::start().await;
    let open = gateway(&group, &backend, "open").await;
    let closed = gateway(&group, &backend, "closed").await;
    exact_budget(open.addr, [127, 0, 0, 30].into(), 5, "before").await;
    exact_budget(closed.addr, [127, 0, 0, 31].into(), 5, "before").await;

    let open_load = Load::start(open.addr, &clients(40, 43), LOAD_PATH);
    let closed_load = Load::start(closed.addr, &clients(44, 47), LOAD_PATH);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let old_master = group.servers[0].port;
    group.servers[0].kill();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(20);
    while group.master_port() == Some(old_master) {
        assert!(
            Instant::now() < deadline,
            "the sentinels never promoted the replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = Instant::now();
    assert_eq!(group.master_port(), Some(group.servers[1].port));

    let open_decided = exact_budget_once_decided(open.addr, [127, 0, 0, 50].into(), 5, StatusCode::OK).await;
    let closed_decided = exact_budget_once_decided(
        closed.addr,
        [127, 0, 0, 51].into(),
        5,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let open_after = open_decided.saturating_duration_since(promoted);
    let closed_after = closed_decided.saturating_duration_since(promoted);
    eprintln!(
        "sentinel failover: promoted {:?} after the kill; exact limiting again {open_after:?} \
         (open) and {closed_after:?} (closed) after the promotion",
        promoted - killed
    );
    // Both gateways on the new master, one budget between them.
    assert_eq!(
        allowed(&[open.addr, closed.addr], [127, 0, 0, 52].into(), 40).await,
        5
    );

    let open_samples = open_load.finish().await;
    let closed_samples = closed_load.finish().await;
    assert_answered_as_the_fail_mode_says(&open_samples, StatusCode::OK);
    assert_answered_as_the_fail_mode_says(&closed_samples, StatusCode::SERVICE_UNAVAILABLE);
    for log in [open.log(), closed.log()] {
        assert!(log.contains("redis sentinel: a new master"), "{log}");
    }
    assert!(
        open_after < Duration::from_secs(2),
        "open: {open_after:?} after the promotion"
    );
    assert!(
        closed_after < Duration::from_secs(2),
        "closed: {closed_after:?} after the promotion"
    );
}

/// Every request got a response: a decision (200 or 429 with `X-RateLimit-Remaining`), or
/// the fail mode's `undecided` status without it; and the outage was seen.
fn assert_answered_as_the_fail_mode_says(samples: &[Sample], undecided: StatusCode) {
    let counts = tally(samples);
    for sample in samples {
        match &sample.outcome {
            Ok((status, true)) => assert!(
                matches!(*status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS),
                "a decision is 200 or 429: {counts:?}"
            ),
            Ok((status, false)) => assert_eq!(*status, undecided, "{counts:?}"),
            Err(error) => panic!("no response ({error}): {counts:?}"),
        }
    }
    assert!(
        samples
            .iter()
            .any(|sample| matches!(sample.outcome, Ok((_, false)))),
        "some requests came during the outage: {counts:?}"
    );
}
