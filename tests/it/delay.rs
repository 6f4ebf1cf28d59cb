//! Delay instead of refuse (a route's `delay=`, `DELAY_MAX_MS`), through the real binary over
//! real sockets, on the memory store and on a real Redis: a request refused within its delay
//! waits and is forwarded, one past it (or past the client's place in the queue) is refused at
//! once, a client that disconnects while waiting frees its place, and the decision endpoints
//! (forward-auth, the JSON API) wait as the proxy does.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::binary::Running;
use crate::support::{Backend, RedisServer, Reply, free_port, get, request};

/// Where budgets are kept.
#[derive(Clone, Copy, Debug)]
enum Store {
    Memory,
    Redis,
}

/// `slow`: one token a second, waited for up to 1.5 s; `far`: one token each 2 s, past its
/// 1.5 s; one place per client.
const ROUTES: &str =
    "/slow=token_bucket:1:1,name=slow,delay=1500;/far=token_bucket:1:0.5,name=far,delay=1500";

/// The binary in front of `backend` with `ROUTES` and `vars`, on `store` (`redis` for Redis),
/// the decision endpoints on a port of their own.
fn gateway(backend: &Backend, redis: Option<&RedisServer>, vars: &[(&str, &str)]) -> (Running, SocketAddr) {
    let decide_port = free_port().to_string();
    let backend_url = backend.url();
    let redis_addr = redis.map(RedisServer::addr);
    let mut all = vec![
        ("BACKEND_URL", backend_url.as_str()),
        ("ROUTES", ROUTES),
        ("DECIDE_PORT", decide_port.as_str()),
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("DELAY_QUEUE_PER_CLIENT", "1"),
    ];
    if let Some(addr) = &redis_addr {
        all.push(("REDIS_ADDR", addr.as_str()));
        all.push(("KEY_HASH_SECRET", "a shared secret of the replicas"));
    }
    all.extend_from_slice(vars);
    let tollgate = Running::start(&all);
    let decide = SocketAddr::from(([127, 0, 0, 1], decide_port.parse().unwrap()));
    crate::support::redis::wait_for(
        || std::net::TcpStream::connect(decide).is_ok(),
        "the decision port",
    );
    (tollgate, decide)
}

/// The sample `series` (`name{labels}`) of `tollgate`'s `/metrics`.
async fn sample(tollgate: &Running, series: &str) -> f64 {
    let admin = SocketAddr::from(([127, 0, 0, 1], tollgate.admin_port));
    let text = get(admin, "/metrics").await;
    text.text()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {}", text.text()))
}

/// Until `series` is `value` (5 s at most): how long it took.
async fn until(tollgate: &Running, series: &str, value: f64) -> Duration {
    let started = Instant::now();
    while sample(tollgate, series).await != value {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{series} never became {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// `GET path` from 127.0.0.1 with its time.
async fn timed(to: SocketAddr, path: &str) -> (Reply, Duration) {
    let started = Instant::now();
    let reply = get(to, path).await;
    (reply, started.elapsed())
}

async fn waits_then_goes(store: Store) {
    let redis = matches!(store, Store::Redis).then(RedisServer::start);
    let backend = Backend::start().await;
    let (tollgate, _) = gateway(&backend, redis.as_ref(), &[]);
    let (first, _) = timed(tollgate.addr, "/slow").await;
    assert_eq!(first.status, StatusCode::OK, "{store:?}");
    // The second waits for the next token, about a second away.
    let addr = tollgate.addr;
    let second = tokio::spawn(async move { timed(addr, "/slow").await });
    until(&tollgate, "tollgate_delayed_requests", 1.0).await;
    // A third from the same client finds its one place taken: refused at once, before the
    // second is answered.
    let (third, _) = timed(tollgate.addr, "/slow").await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS, "{store:?}");
    assert!(!second.is_finished(), "{store:?}: the refusal came first");
    let (second, waited) = second.await.unwrap();
    assert_eq!(second.status, StatusCode::OK, "{store:?}");
    assert!(waited >= Duration::from_millis(500), "{store:?}: {waited:?}");
    // The headers are the allowed decision's.
    assert_eq!(second.header("x-ratelimit-remaining"), Some("0"), "{store:?}");
    assert_eq!(second.header("retry-after"), None, "{store:?}");
    // Past the delay (2 s to the next token, 1.5 s allowed): refused at once.
    assert_eq!(timed(tollgate.addr, "/far").await.0.status, StatusCode::OK);
    let (far, _) = timed(tollgate.addr, "/far").await;
    assert_eq!(far.status, StatusCode::TOO_MANY_REQUESTS, "{store:?}");
    assert_eq!(backend.seen().len(), 3, "{store:?}: two of slow, one of far");
    assert_eq!(
        sample(&tollgate, r#"tollgate_delay_seconds_count{rule="slow"}"#).await,
        1.0
    );
    assert_eq!(
        sample(&tollgate, r#"tollgate_delay_seconds_count{rule="far"}"#).await,
        0.0
    );
    assert_eq!(sample(&tollgate, "tollgate_delayed_requests").await, 0.0);
    assert_eq!(
        sample(&tollgate, r#"tollgate_delay_queue_full_total{queue="client"}"#).await,
        1.0
    );
    assert_eq!(
        sample(
            &tollgate,
            r#"tollgate_requests_total{rule="slow",decision="allowed"}"#
        )
        .await,
        2.0
    );
    assert_eq!(
        sample(
            &tollgate,
            r#"tollgate_requests_total{rule="slow",decision="limited"}"#
        )
        .await,
        1.0
    );
    tollgate.terminate().await;
}

#[tokio::test]
async fn a_request_within_its_delay_waits_and_goes_and_one_past_it_is_refused_at_once() {
    for store in [Store::Memory, Store::Redis] {
        waits_then_goes(store).await;
    }
}

async fn disconnect_frees_the_place(store: Store) {
    let redis = matches!(store, Store::Redis).then(RedisServer::start);
    let backend = Backend::start().await;
    // A token each 10 s, waited for up to 15 s: nothing ends the wait but the client.
    let (tollgate, _) = gateway(
        &backend,
        redis.as_ref(),
        &[("ROUTES", "/slow=token_bucket:1:0.1,name=slow,delay=15000")],
    );
    assert_eq!(get(tollgate.addr, "/slow").await.status, StatusCode::OK);
    let mut waiting = tokio::net::TcpStream::connect(tollgate.addr).await.unwrap();
    waiting
        .write_all(b"GET /slow HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
        .await
        .unwrap();
    until(&tollgate, "tollgate_delayed_requests", 1.0).await;
    drop(waiting);
    let freed = until(&tollgate, "tollgate_delayed_requests", 0.0).await;
    assert!(freed < Duration::from_secs(5), "{store:?}: {freed:?}");
    // The place is the next request's: it waits (the token is still ~10 s away) rather than
    // being refused for a full queue.
    let addr = tollgate.addr;
    let next = tokio::spawn(async move { get(addr, "/slow").await });
    until(&tollgate, "tollgate_delayed_requests", 1.0).await;
    assert_eq!(
        sample(&tollgate, r#"tollgate_delay_queue_full_total{queue="client"}"#).await,
        0.0,
        "{store:?}"
    );
    next.abort();
    // Neither waiting request spent anything or reached the backend.
    assert_eq!(backend.seen().len(), 1, "{store:?}");
    tollgate.terminate().await;
}

#[tokio::test]
async fn a_client_that_disconnects_while_waiting_frees_its_place() {
    for store in [Store::Memory, Store::Redis] {
        disconnect_frees_the_place(store).await;
    }
}

async fn decision_endpoints_wait(store: Store) {
    let redis = matches!(store, Store::Redis).then(RedisServer::start);
    let backend = Backend::start().await;
    let (tollgate, decide) = gateway(&backend, redis.as_ref(), &[]);
    let forward_auth = || async move {
        let headers = [
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/slow"),
            ("x-forwarded-host", "app.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-for", "198.51.100.7"),
        ];
        let started = Instant::now();
        let from = IpAddr::from([127, 0, 0, 1]);
        let reply = request(
            decide,
            from,
            Method::GET,
            "/v1/forward-auth",
            &headers,
            Bytes::new(),
        )
        .await;
        (reply.status, started.elapsed())
    };
    assert_eq!(forward_auth().await.0, StatusCode::OK, "{store:?}");
    let (status, waited) = forward_auth().await;
    assert_eq!(status, StatusCode::OK, "{store:?}: waited, then allowed");
    assert!(waited >= Duration::from_millis(500), "{store:?}: {waited:?}");
    let check = || async move {
        let started = Instant::now();
        let reply = request(
            decide,
            IpAddr::from([127, 0, 0, 1]),
            Method::POST,
            "/v1/check",
            &[("content-type", "application/json")],
            Bytes::from_static(br#"{"rule": "slow", "key": "acme"}"#),
        )
        .await;
        let answer: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        (answer["allowed"].clone(), started.elapsed())
    };
    assert_eq!(check().await.0, true, "{store:?}");
    let (allowed, waited) = check().await;
    assert_eq!(allowed, true, "{store:?}: waited, then allowed");
    assert!(waited >= Duration::from_millis(500), "{store:?}: {waited:?}");
    assert_eq!(
        sample(&tollgate, r#"tollgate_delay_seconds_count{rule="slow"}"#).await,
        2.0
    );
    tollgate.terminate().await;
}

#[tokio::test]
async fn forward_auth_and_the_json_api_wait_as_the_proxy_does() {
    for store in [Store::Memory, Store::Redis] {
        decision_endpoints_wait(store).await;
    }
}
