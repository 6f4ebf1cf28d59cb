//! The admin operations on one client (`ADMIN_TOKEN`): inspect and reset a budget on both
//! stores (memory, and a real Redis shared by two replicas), the list of clients refused most
//! under a flood of distinct keys, and the token in front of them all.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::support::{Backend, Gateway, RedisServer, get, get_from};

const TOKEN: &str = "admin-token-for-the-tests";

fn json(reply: &crate::support::Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|_| panic!("not JSON: {}", reply.text()))
}

async fn inspect(gateway: &Gateway, rule: &str, client: &str) -> Value {
    let reply = gateway
        .admin(Method::GET, &format!("/v1/clients/{rule}/{client}"), Some(TOKEN))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    json(&reply)
}

#[tokio::test]
async fn admin_operations_inspect_reset_and_list_a_memory_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_TOKENS", "3"),
            ("REFILL_RATE", "0.001"),
            ("ADMIN_TOKEN", TOKEN),
        ],
    )
    .await;
    let client = "127.0.0.9".parse().unwrap();
    let fresh = inspect(&gateway, "general", "127.0.0.9").await;
    assert_eq!(fresh["remaining"], 3, "never seen: the whole budget: {fresh}");
    assert_eq!(fresh["limited"], false);
    assert_eq!(fresh["algorithm"], "token_bucket");
    for _ in 0..2 {
        assert_eq!(
            get_from(gateway.addr, client, "/", &[]).await.status,
            StatusCode::OK
        );
    }
    for _ in 0..5 {
        let seen = inspect(&gateway, "general", "127.0.0.9").await;
        assert_eq!(seen["remaining"], 1, "reading spends nothing: {seen}");
        assert_eq!(seen["client"], "127.0.0.9");
    }
    assert_eq!(
        get_from(gateway.addr, client, "/", &[]).await.status,
        StatusCode::OK
    );
    for _ in 0..4 {
        let reply = get_from(gateway.addr, client, "/", &[]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let limited = inspect(&gateway, "general", "127.0.0.9").await;
    assert_eq!(
        (limited["remaining"].as_u64(), limited["limited"].as_bool()),
        (Some(0), Some(true))
    );

    let list = gateway.admin(Method::GET, "/v1/limited?top=5", Some(TOKEN)).await;
    assert_eq!(list.status, StatusCode::OK);
    let list = json(&list);
    assert_eq!(list["window_seconds"], 60);
    assert_eq!(list["rules"][1]["rule"], "general", "in table order, after auth");
    assert_eq!(list["rules"][0]["clients"], serde_json::json!([]));
    assert_eq!(
        list["rules"][1]["clients"],
        serde_json::json!([{ "client": "127.0.0.9", "refused": 4, "error": 0 }])
    );

    let reset = gateway
        .admin(Method::DELETE, "/v1/clients/general/127.0.0.9", Some(TOKEN))
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    assert_eq!(json(&reset)["reset"], true);
    let reply = get_from(gateway.addr, client, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "the whole budget is back");
    assert_eq!(reply.number("x-ratelimit-remaining"), 2);

    // Mistakes are named, and never spend anything.
    let unknown = gateway
        .admin(Method::GET, "/v1/clients/nope/127.0.0.9", Some(TOKEN))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.text().contains("nope"), "{}", unknown.text());
    let bad = gateway
        .admin(Method::GET, "/v1/clients/general/not-an-ip", Some(TOKEN))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad_top = gateway.admin(Method::GET, "/v1/limited?top=0", Some(TOKEN)).await;
    assert_eq!(bad_top.status, StatusCode::BAD_REQUEST);
    let post = gateway
        .admin(Method::POST, "/v1/clients/general/127.0.0.9", Some(TOKEN))
        .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn admin_operations_need_the_token_and_without_one_do_not_exist() {
    let backend = Backend::start().await;
    let with = Gateway::start_with_admin(&backend.url(), &[("ADMIN_TOKEN", TOKEN)]).await;
    for (method, path) in [
        (Method::GET, "/v1/clients/general/127.0.0.1"),
        (Method::DELETE, "/v1/clients/general/127.0.0.1"),
        (Method::GET, "/v1/limited"),
    ] {
        for token in [
            None,
            Some("wrong-token-of-enough-length"),
            Some("admin-token-for-the-test"),
        ] {
            let reply = with.admin(method.clone(), path, token).await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {token:?}"
            );
            assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        }
    }
    // The probes and the scrape stay open.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(
            with.admin(Method::GET, path, None).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    let without = Gateway::start_with_admin(&backend.url(), &[]).await;
    for token in [None, Some(TOKEN)] {
        let reply = without
            .admin(Method::GET, "/v1/clients/general/127.0.0.1", token)
            .await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "without ADMIN_TOKEN there is none"
        );
        let reply = without.admin(Method::DELETE, "/v1/limited", token).await;
        assert_ne!(reply.status, StatusCode::OK);
    }
    with.stop().await;
    without.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn admin_operations_on_redis_read_without_writing_and_reset_for_every_replica() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("KEY_BY", "header:X-API-Key"),
        ("KEY_HASH_SECRET", "shared-secret-for-the-test"),
        ("MAX_TOKENS", "3"),
        ("REFILL_RATE", "0.001"),
        ("ADMIN_TOKEN", TOKEN),
    ];
    let a = Gateway::start_with_admin(&backend.url(), &vars).await;
    let b = Gateway::start_with_admin(&backend.url(), &vars).await;
    let from = "127.0.0.1".parse().unwrap();
    let key = [("x-api-key", "tenant-7")];
    // Never seen: the whole budget, and reading it writes nothing.
    let fresh = inspect(&b, "general", "key:tenant-7").await;
    assert_eq!(fresh["remaining"], 3, "{fresh}");
    assert_eq!(redis.cli(&["DBSIZE"]).trim(), "0", "an inspection creates no key");
    for _ in 0..3 {
        assert_eq!(get_from(a.addr, from, "/", &key).await.status, StatusCode::OK);
    }
    // Refused by the other replica, which remembers the denial.
    for _ in 0..2 {
        assert_eq!(
            get_from(b.addr, from, "/", &key).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    let stored = redis.cli(&["KEYS", "*"]);
    let stored_key = stored.trim();
    assert!(stored_key.contains("{general:key:"), "{stored}");
    let value = redis.cli(&["GET", stored_key]);
    for gateway in [&a, &b] {
        let seen = inspect(gateway, "general", "key:tenant-7").await;
        assert_eq!(
            (seen["remaining"].as_u64(), seen["limited"].as_bool()),
            (Some(0), Some(true))
        );
        assert!(seen["client"].as_str().unwrap().starts_with("key:"), "{seen}");
        assert_ne!(seen["client"], "key:tenant-7", "the raw value never comes back");
    }
    assert_eq!(
        redis.cli(&["GET", stored_key]),
        value,
        "an inspection changes nothing"
    );
    assert_eq!(redis.cli(&["KEYS", "*"]), stored);
    // The replica that refused lists the client.
    let list = json(&b.admin(Method::GET, "/v1/limited", Some(TOKEN)).await);
    assert_eq!(list["rules"][1]["clients"][0]["refused"], 2, "{list}");
    assert_eq!(list["rules"][1]["clients"][0]["client"], fresh["client"]);

    let reset = b
        .admin(Method::DELETE, "/v1/clients/general/key:tenant-7", Some(TOKEN))
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    assert_eq!(redis.cli(&["DBSIZE"]).trim(), "0", "the key is gone");
    // Both replicas find the whole budget: 3 in all, exactly.
    let mut allowed = 0;
    for i in 0..6 {
        let gateway = if i % 2 == 0 { &b } else { &a };
        if get_from(gateway.addr, from, "/", &key).await.status == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3);
    // An address-keyed client (no header) is written as logs write it.
    assert_eq!(get_from(a.addr, from, "/", &[]).await.status, StatusCode::OK);
    assert_eq!(inspect(&a, "general", "127.0.0.1").await["remaining"], 2);
    // Redis down: the operator is told, not handed a fail mode's guess.
    drop(redis);
    let down = a
        .admin(Method::GET, "/v1/clients/general/127.0.0.1", Some(TOKEN))
        .await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{}", down.text());
    a.stop().await;
    b.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn a_reset_on_one_replica_reaches_the_denial_cache_of_another_within_a_second() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("MAX_TOKENS", "2"),
        // The next token in 1000 s: a denial another replica would remember that long.
        ("REFILL_RATE", "0.001"),
        ("ADMIN_TOKEN", TOKEN),
    ];
    let a = Gateway::start_with_admin(&backend.url(), &vars).await;
    let b = Gateway::start_with_admin(&backend.url(), &vars).await;
    for _ in 0..2 {
        assert_eq!(get(b.addr, "/").await.status, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(get(b.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let metrics = b.admin_get("/metrics").await;
    assert!(
        !metrics.text().contains("tollgate_cached_denials_total 0\n"),
        "b answers from its denial cache: {}",
        metrics.text()
    );
    let reset = a
        .admin(Method::DELETE, "/v1/clients/general/127.0.0.1", Some(TOKEN))
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    // b asks Redis again within RECHECK_AFTER (1 s), and finds the whole budget.
    let mut answered = Vec::new();
    for _ in 0..40 {
        let status = get(b.addr, "/").await.status;
        answered.push(status.as_u16());
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answered.last(),
        Some(&200),
        "b still refuses after 4 s: {answered:?}"
    );
    assert!(
        answered.len() <= 20,
        "b took {} tries: {answered:?}",
        answered.len()
    );
    a.stop().await;
    b.stop().await;
    backend.stop().await;
}

/// Poll `PUBSUB NUMSUB tollgate:resets`, for up to 10 s, until `subscribers` replicas listen
/// for resets (asynchronously: the replicas subscribe on this test's runtime).
async fn until_subscribed(redis: &RedisServer, subscribers: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = redis.cli(&["PUBSUB", "NUMSUB", "tollgate:resets"]);
        if reply.lines().nth(1).map(str::trim) == Some(subscribers.to_string().as_str()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never {subscribers} subscribers: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 26, item 10: a reset announced on `tollgate:resets` reaches the other replica's
/// cached denial at once, not after its recheck a second later. Each round: b refuses a fresh
/// client (Redis asked, the denial remembered), a resets it, and b's very next request for it
/// is allowed. A round whose reset came a second or more after b's denial cannot tell the
/// announcement from the recheck, and is run again with another client.
#[tokio::test]
async fn a_reset_on_one_replica_reaches_the_denial_cache_of_another_at_once() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
        ("ADMIN_TOKEN", TOKEN),
    ];
    let a = Gateway::start_with_admin(&backend.url(), &vars).await;
    let b = Gateway::start_with_admin(&backend.url(), &vars).await;
    until_subscribed(&redis, 2).await;
    for round in 0..5u8 {
        let client = std::net::IpAddr::from([127, 0, 0, 120 + round]);
        for _ in 0..2 {
            assert_eq!(get_from(b.addr, client, "/", &[]).await.status, StatusCode::OK);
        }
        let refused = std::time::Instant::now();
        let denied = get_from(b.addr, client, "/", &[]).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(denied.number("retry-after") > 900, "a long retry");
        let reset = a
            .admin(
                Method::DELETE,
                &format!("/v1/clients/general/{client}"),
                Some(TOKEN),
            )
            .await;
        assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
        let reply = get_from(b.addr, client, "/", &[]).await;
        if refused.elapsed() >= Duration::from_secs(1) {
            continue;
        }
        assert_eq!(reply.status, StatusCode::OK, "b forgot the denial at once");
        assert_eq!(reply.number("x-ratelimit-remaining"), 1, "the whole budget");
        a.stop().await;
        b.stop().await;
        backend.stop().await;
        return;
    }
    panic!("every round took a second or more: the machine is too slow to tell");
}

/// The subscription down (killed by Redis, and not made again for a minute): a reset still
/// reaches the other replica within a second, when its cached denial asks Redis again.
#[tokio::test]
async fn with_the_reset_subscription_down_a_reset_still_arrives_within_a_second() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
        ("ADMIN_TOKEN", TOKEN),
        // Subscribed again only a minute after the subscription is lost.
        ("REDIS_PROBE_INTERVAL_MS", "60000"),
    ];
    let a = Gateway::start_with_admin(&backend.url(), &vars).await;
    let b = Gateway::start_with_admin(&backend.url(), &vars).await;
    until_subscribed(&redis, 2).await;
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    until_subscribed(&redis, 0).await;
    for _ in 0..2 {
        assert_eq!(get(b.addr, "/").await.status, StatusCode::OK);
    }
    assert_eq!(get(b.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
    let reset = a
        .admin(Method::DELETE, "/v1/clients/general/127.0.0.1", Some(TOKEN))
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    let reset_at = std::time::Instant::now();
    loop {
        let reply = get(b.addr, "/").await;
        if reply.status == StatusCode::OK {
            assert_eq!(reply.number("x-ratelimit-remaining"), 1);
            break;
        }
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            reset_at.elapsed() < Duration::from_secs(10),
            "b never asked Redis again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.stop().await;
    b.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn the_most_refused_list_stays_bounded_under_a_flood_of_distinct_keys() {
    // A bucket of one that refills in a day: a key's first request is allowed, the rest are
    // refused.
    let gateway = Gateway::start_decide_with_admin(&[
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.00001"),
        ("ADMIN_TOKEN", TOKEN),
    ])
    .await;
    let stream = tokio::net::TcpStream::connect(gateway.decide.unwrap())
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    const FLOOD: usize = 10_000;
    let started = std::time::Instant::now();
    let mut ask = async |key: &str| {
        let body = format!(r#"{{"rule": "general", "key": "{key}"}}"#);
        let request = Request::post("/v1/check")
            .header("host", "gateway.test")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let reply = sender.send_request(request).await.unwrap();
        assert_eq!(reply.status(), StatusCode::OK);
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        answer["allowed"].as_bool().unwrap()
    };
    assert!(ask("heavy").await);
    for n in 0..FLOOD {
        // One heavy hitter in every ten refusals, among distinct keys refused once each.
        if n % 10 == 0 {
            assert!(!ask("heavy").await);
        } else {
            let key = format!("flood-{n}");
            assert!(ask(&key).await);
            assert!(!ask(&key).await);
        }
    }
    let elapsed = started.elapsed();
    let list = gateway
        .admin(Method::GET, "/v1/limited?top=1000", Some(TOKEN))
        .await;
    assert_eq!(list.status, StatusCode::OK);
    let list = json(&list);
    assert_eq!(list["rules"][1]["rule"], "general");
    let clients = list["rules"][1]["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 64, "at its capacity, not {FLOOD} entries");
    let heavy = &clients[0];
    let refused = heavy["refused"].as_u64().unwrap();
    let error = heavy["error"].as_u64().unwrap();
    assert!(heavy["client"].as_str().unwrap().starts_with("key:"), "{heavy}");
    assert!(refused >= (FLOOD / 10) as u64, "never below the truth: {heavy}");
    assert!(
        refused - error <= (FLOOD / 10) as u64,
        "the error covers the excess: {heavy}"
    );
    assert!(error <= (FLOOD / 64) as u64, "the error is within N/k: {heavy}");
    let reset = gateway
        .admin(Method::GET, "/v1/clients/general/key:heavy", Some(TOKEN))
        .await;
    assert_eq!(
        json(&reset)["remaining"],
        0,
        "spent by its first request, not by refusals"
    );
    eprintln!("{FLOOD} refusals in {elapsed:?}; heavy hitter {heavy}");
    gateway.stop().await;
}

#[tokio::test]
async fn every_algorithm_reads_alike_in_memory_and_in_redis() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    for algorithm in crate::redis::EXACT_25 {
        for store in [None, Some(url.as_str())] {
            let prefix = format!("peek-{}:", algorithm[0].1);
            let mut vars: Vec<(&str, &str)> = algorithm.to_vec();
            vars.push(("ADMIN_TOKEN", TOKEN));
            vars.push(("KEY_PREFIX", &prefix));
            if let Some(url) = store {
                vars.push(("REDIS_URL", url));
            }
            let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;
            let from = "127.0.0.5".parse().unwrap();
            // A whole budget has nothing to wait for (it showed the rest of a window).
            let whole = inspect(&gateway, "general", "127.0.0.5").await;
            assert_eq!(
                (whole["remaining"].as_u64(), whole["reset_after_ms"].as_u64()),
                (Some(25), Some(0)),
                "{algorithm:?} on {store:?}: {whole}"
            );
            assert_eq!(whole["limits"][0]["reset_after_ms"], 0, "{whole}");
            for _ in 0..7 {
                assert_eq!(
                    get_from(gateway.addr, from, "/", &[]).await.status,
                    StatusCode::OK
                );
            }
            for _ in 0..3 {
                let seen = inspect(&gateway, "general", "127.0.0.5").await;
                assert_eq!(seen["remaining"], 18, "{algorithm:?} on {store:?}: {seen}");
                assert_eq!(seen["limit"], 25);
            }
            let reply = get_from(gateway.addr, from, "/", &[]).await;
            assert_eq!(
                reply.number("x-ratelimit-remaining"),
                17,
                "{algorithm:?} on {store:?}"
            );
            gateway.stop().await;
        }
    }
    backend.stop().await;
}

#[tokio::test]
async fn admin_operations_reach_each_clients_master_on_a_redis_cluster() {
    let cluster = crate::support::RedisCluster::start();
    let backend = Backend::start().await;
    let seeds = cluster.seeds();
    let vars = [
        ("REDIS_CLUSTER_NODES", seeds.as_str()),
        ("REDIS_TIMEOUT_MS", "5000"),
        ("MAX_TOKENS", "3"),
        ("REFILL_RATE", "0.001"),
        ("ADMIN_TOKEN", TOKEN),
    ];
    let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;
    // Several clients, so their keys land on different masters.
    for n in 2..=6 {
        let client = format!("127.0.0.{n}");
        let from = client.parse().unwrap();
        for _ in 0..3 {
            assert_eq!(
                get_from(gateway.addr, from, "/", &[]).await.status,
                StatusCode::OK
            );
        }
        assert_eq!(
            get_from(gateway.addr, from, "/", &[]).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            inspect(&gateway, "general", &client).await["remaining"],
            0,
            "{client}"
        );
        let path = format!("/v1/clients/general/{client}");
        let reset = gateway.admin(Method::DELETE, &path, Some(TOKEN)).await;
        assert_eq!(reset.status, StatusCode::OK, "{client}: {}", reset.text());
        assert_eq!(
            inspect(&gateway, "general", &client).await["remaining"],
            3,
            "{client}"
        );
        assert_eq!(
            get_from(gateway.addr, from, "/", &[]).await.status,
            StatusCode::OK
        );
    }
    assert!(
        cluster.masters_holding_keys() > 1,
        "the clients spread over masters"
    );
    gateway.stop().await;
    backend.stop().await;
}

/// The ids the admin API shows (`/v1/limited`, logs: `key:<digest>`) are ids it accepts, on
/// both stores; a reset that matched no budget says so (`404`); and a path with more after
/// the client names no client, rather than the one before it.
#[tokio::test]
async fn the_ids_shown_are_accepted_and_a_reset_of_nobody_is_not_found() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    for store in [None, Some(url.as_str())] {
        let mut vars = vec![
            ("KEY_BY", "header:X-API-Key"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.001"),
            ("ADMIN_TOKEN", TOKEN),
        ];
        if let Some(url) = store {
            vars.extend([
                ("REDIS_URL", url),
                ("KEY_HASH_SECRET", "shared-secret-for-the-test"),
            ]);
        }
        let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;
        let from = "127.0.0.1".parse().unwrap();
        let key = [("x-api-key", "tenant-9")];
        for expected in [200, 200, 429] {
            assert_eq!(get_from(gateway.addr, from, "/", &key).await.status, expected);
        }
        let list = json(&gateway.admin(Method::GET, "/v1/limited", Some(TOKEN)).await);
        let shown = list["rules"][1]["clients"][0]["client"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(shown.starts_with("key:") && shown.len() == 36, "{list}");
        let seen = inspect(&gateway, "general", &shown).await;
        assert_eq!(seen["client"], shown.as_str(), "{store:?}: {seen}");
        assert_eq!(
            (seen["remaining"].as_u64(), seen["limited"].as_bool()),
            (Some(0), Some(true)),
            "{store:?}: the id shown is the client: {seen}"
        );
        let path = format!("/v1/clients/general/{shown}");
        let reset = gateway.admin(Method::DELETE, &path, Some(TOKEN)).await;
        assert_eq!(reset.status, StatusCode::OK, "{store:?}: {}", reset.text());
        assert_eq!(json(&reset)["reset"], true);
        assert_eq!(json(&reset)["client"], shown.as_str());
        assert_eq!(get_from(gateway.addr, from, "/", &key).await.status, 200, "reset");
        // Nobody left to reset, a mistyped raw key, a digest of nobody: 404, saying so.
        for client in [
            shown.as_str(),
            "key:tenant-99",
            "key:0123456789abcdef0123456789abcdef",
            "127.0.0.77",
        ] {
            let path = if client == shown {
                // The raw value names the same budget.
                "/v1/clients/general/key:tenant-9".to_owned()
            } else {
                format!("/v1/clients/general/{client}")
            };
            if client == shown {
                let reset = gateway.admin(Method::DELETE, &path, Some(TOKEN)).await;
                assert_eq!(reset.status, StatusCode::OK, "{store:?}: {}", reset.text());
            }
            let again = gateway.admin(Method::DELETE, &path, Some(TOKEN)).await;
            assert_eq!(
                again.status,
                StatusCode::NOT_FOUND,
                "{store:?} {path}: {}",
                again.text()
            );
            assert_eq!(json(&again)["reset"], false, "{}", again.text());
            assert!(
                json(&again)["error"]
                    .as_str()
                    .unwrap()
                    .contains("nothing to reset")
            );
        }
        // Trailing segments name no client: 127.0.0.1 keeps what it spent.
        assert_eq!(get_from(gateway.addr, from, "/", &[]).await.status, 200);
        for path in [
            "/v1/clients/general/127.0.0.1/extra",
            "/v1/clients/general/127.0.0.1/",
            "/v1/clients/general/127.0.0.1%2Fextra",
            "/v1/clients/general/127.0.0.1%2F32%2Fx",
        ] {
            let reply = gateway.admin(Method::DELETE, path, Some(TOKEN)).await;
            assert!(
                matches!(reply.status, StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST),
                "{path}: {} {}",
                reply.status,
                reply.text()
            );
            assert_ne!(json_or_null(&reply)["reset"], true, "{path}");
        }
        assert_eq!(inspect(&gateway, "general", "127.0.0.1").await["remaining"], 1);
        gateway.stop().await;
    }
    backend.stop().await;
}

fn json_or_null(reply: &crate::support::Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}
