//! Rules of several limits (`+` lists) through the real binary, on both stores: every limit
//! enforced, a refused request spending nothing in any, `Retry-After` from the refusing limit
//! that frees last, the legacy headers describing the limit closest to exhaustion, the draft
//! headers and a problem body naming each policy, and in Redis one exact budget for all
//! replicas with a key per limit.

use std::net::IpAddr;
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;

use crate::support::redis::keys_of;
use crate::support::{Backend, Gateway, RedisServer, Reply, get, get_from, request};

/// A burst of 2 refilling one every 2 s, and 3 an hour (an exact rolling window).
const API: &str = "/api/*=token_bucket:2:0.5+sliding_log:3:3600,name=api";

async fn api(gateway: &Gateway) -> Reply {
    get(gateway.addr, "/api/items").await
}

/// The sequence of [`API`]'s promises, against a gateway started with `vars` (a store).
async fn every_limit_is_enforced_and_a_refusal_spends_nothing(vars: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let mut all = vec![
        ("ROUTES", API),
        ("RATE_LIMIT_HEADERS", "both"),
        ("DENY_FORMAT", "problem"),
    ];
    all.extend_from_slice(vars);
    let gateway = Gateway::start(&backend.url(), &all).await;

    let first = api(&gateway).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""api.1";q=2;w=4, "api.2";q=3;w=3600"#),
        "every policy listed, in the order written"
    );
    assert_eq!(
        first.header("ratelimit").map(|value| value.split(", ").count()),
        Some(2)
    );
    assert!(first.header("ratelimit").unwrap().starts_with(r#""api.1";r=1;"#));
    assert!(first.header("ratelimit").unwrap().contains(r#""api.2";r=2;"#));
    assert_eq!(api(&gateway).await.status, StatusCode::OK);

    // The burst is spent: refused by it alone, and the hour's quota keeps its place.
    let burst = api(&gateway).await;
    assert_eq!(burst.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        (1..=2).contains(&burst.number("retry-after")),
        "the burst's retry time"
    );
    assert_eq!(
        burst.number("x-ratelimit-limit"),
        2,
        "described: the limit that refused"
    );
    assert!(
        burst.header("ratelimit").unwrap().contains(r#""api.2";r=1;"#),
        "nothing spent"
    );
    let problem: serde_json::Value = serde_json::from_slice(&burst.body).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["api.1"]));

    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let last = api(&gateway).await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(last.number("x-ratelimit-remaining"), 0);
    assert_eq!(
        last.number("x-ratelimit-limit"),
        3,
        "both at 0: the one whose budget is back later is described"
    );

    // The burst has a token again, the hour's quota none: refused until the hour is over,
    // and the burst's token is given back (twice: a second refusal spends nothing either).
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    for _ in 0..2 {
        let quota = api(&gateway).await;
        assert_eq!(quota.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            quota.number("retry-after") > 3_500,
            "the quota's retry time, the latest"
        );
        assert!(
            quota.header("ratelimit").unwrap().starts_with(r#""api.1";r=1;"#),
            "token given back"
        );
        let problem: serde_json::Value = serde_json::from_slice(&quota.body).unwrap();
        assert_eq!(problem["violated-policies"], serde_json::json!(["api.2"]));
    }
    // Other paths are the general rule's, of one limit, as before.
    let other = get(gateway.addr, "/").await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.header("ratelimit-policy"), Some(r#""general";q=10;w=10"#));
}

#[tokio::test]
async fn several_limits_in_memory() {
    every_limit_is_enforced_and_a_refusal_spends_nothing(&[]).await;
}

#[tokio::test]
async fn several_limits_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    let vars = [("REDIS_ADDR", addr.as_str()), ("REDIS_TIMEOUT_MS", "5000")];
    every_limit_is_enforced_and_a_refusal_spends_nothing(&vars).await;
    // A key per limit, each expiring, in one hash slot.
    let mut config = vec![("ROUTES", API)];
    config.extend_from_slice(&vars);
    let keys = keys_of(&config, "api", "127.0.0.1");
    assert_eq!(keys.len(), 2);
    for key in &keys {
        let ttl: i64 = redis.cli(&["TTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key}: ttl {ttl}");
    }
    assert_eq!(
        redis.cli(&["CLUSTER", "KEYSLOT", &keys[0]]).trim(),
        redis.cli(&["CLUSTER", "KEYSLOT", &keys[1]]).trim()
    );
}

/// The general rule's `LIMITS` list across three replicas: one exact budget, the tighter
/// limit's, however the requests are spread and however many arrive at once.
#[tokio::test]
async fn replicas_share_every_limit_exactly() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let addr = redis.addr();
    let vars = [
        ("REDIS_ADDR", addr.as_str()),
        ("REDIS_TIMEOUT_MS", "5000"),
        ("LIMITS", "token_bucket:100:0.001+fixed_window:25:86400"),
        ("AUTH_LIMITS", "fixed_window:3:86400+sliding_window:2:3600"),
    ];
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(Gateway::start(&backend.url(), &vars).await);
    }
    let client: IpAddr = "127.0.0.1".parse().unwrap();
    let replies = join_all((0..60).map(|n| get_from(gateways[n % 3].addr, client, "/", &[]))).await;
    let allowed = replies
        .iter()
        .filter(|reply| reply.status == StatusCode::OK)
        .count();
    assert_eq!(allowed, 25, "the daily quota across every replica");
    for reply in replies.iter().filter(|reply| reply.status == StatusCode::OK) {
        assert_eq!(
            reply.number("x-ratelimit-limit"),
            25,
            "the limit closest to exhaustion"
        );
    }
    // The token bucket spent only what went through: 75 of 100 left.
    let key = &keys_of(&vars, "general", "127.0.0.1")[0];
    let tat: u64 = redis.cli(&["GET", key]).trim().parse().unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let spent = (tat - now_us).div_ceil(1_000_000_000);
    assert_eq!(
        spent, 25,
        "one token per allowed request, none for the 35 refused"
    );
    // AUTH_LIMITS: the auth rule's own list.
    let logins = join_all((0..5).map(|n| get_from(gateways[n % 3].addr, client, "/login", &[]))).await;
    let allowed = logins
        .iter()
        .filter(|reply| reply.status == StatusCode::OK)
        .count();
    assert_eq!(allowed, 2, "the auth rule's tighter limit");
}

/// The admin's inspection lists every limit of a rule, and a reset gives each back.
#[tokio::test]
async fn the_admin_sees_and_resets_every_limit() {
    let backend = Backend::start().await;
    let token = "admin-token-for-the-limit-lists";
    let gateway = Gateway::start_with_admin(&backend.url(), &[("ROUTES", API), ("ADMIN_TOKEN", token)]).await;
    let client = "/v1/clients/api/127.0.0.1";
    assert_eq!(api(&gateway).await.status, StatusCode::OK);
    let inspected = gateway.admin(http::Method::GET, client, Some(token)).await;
    assert_eq!(inspected.status, StatusCode::OK, "{}", inspected.text());
    let body: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    let limits = body["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{body}");
    assert_eq!(limits[0]["algorithm"], "token_bucket");
    assert_eq!(limits[0]["remaining"], 1);
    assert_eq!(limits[1]["algorithm"], "sliding_log");
    assert_eq!(limits[1]["limit"], 3);
    assert_eq!(limits[1]["remaining"], 2);
    let reset = gateway.admin(http::Method::DELETE, client, Some(token)).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    let inspected = gateway.admin(http::Method::GET, client, Some(token)).await;
    let body: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    assert_eq!(body["limits"][0]["remaining"], 2);
    assert_eq!(body["limits"][1]["remaining"], 3);
}

/// The decision doors decide a rule of several limits as the proxy does: forward-auth refuses
/// with the refusing limit's retry time and lists every policy; the JSON answer has each
/// limit's part.
#[tokio::test]
async fn the_decision_doors_enforce_every_limit() {
    let gateway = Gateway::start_decide(
        None,
        &[
            ("ROUTES", API),
            ("RATE_LIMIT_HEADERS", "draft"),
            ("TRUSTED_PROXIES", "127.0.0.1"),
        ],
    )
    .await;
    let ask = || {
        request(
            gateway.decide.unwrap(),
            "127.0.0.1".parse().unwrap(),
            http::Method::POST,
            "/v1/check",
            &[("content-type", "application/json")],
            bytes::Bytes::from_static(br#"{"path":"/api/x","client_ip":"203.0.113.9"}"#),
        )
    };
    let first: serde_json::Value = serde_json::from_slice(&ask().await.body).unwrap();
    assert_eq!(first["allowed"], true);
    let limits = first["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{first}");
    assert_eq!(
        (limits[0]["name"].as_str(), limits[0]["remaining"].as_u64()),
        (Some("api.1"), Some(1))
    );
    assert_eq!(
        (limits[1]["name"].as_str(), limits[1]["remaining"].as_u64()),
        (Some("api.2"), Some(2))
    );
    let forward_auth = || {
        request(
            gateway.decide.unwrap(),
            "127.0.0.1".parse().unwrap(),
            http::Method::GET,
            "/v1/forward-auth",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/api/y"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
            bytes::Bytes::new(),
        )
    };
    assert_eq!(
        forward_auth().await.status,
        StatusCode::OK,
        "the burst's last token"
    );
    let refused = forward_auth().await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!((1..=2).contains(&refused.number("retry-after")));
    assert!(
        refused.header("ratelimit").unwrap().contains(r#""api.2";r=1;"#),
        "nothing spent"
    );
    let refused: serde_json::Value = serde_json::from_slice(&ask().await.body).unwrap();
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["limits"][0]["allowed"], false);
    assert_eq!(refused["limits"][1]["allowed"], true);
}
