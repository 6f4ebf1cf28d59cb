//! The rule table over real HTTP: per-route rules, costs, exemptions, skip paths, shadow mode,
//! failures-only counting, header keys, IPv6 grouping, the draft headers, and auth paths that
//! cannot be walked around.

use std::net::IpAddr;

use futures_util::future::join_all;
use http::StatusCode;

use crate::support::{Backend, Gateway, RedisServer, Reply, get, get_from, raw_status_line};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `GET path` from 127.0.0.1 with `headers`.
async fn get_with(gateway: &Gateway, path: &str, headers: &[(&str, &str)]) -> Reply {
    get_from(gateway.addr, ip("127.0.0.1"), path, headers).await
}

/// Whether the gateway added rate-limit headers (the test backend sends an
/// `X-RateLimit-Limit: 999` of its own, which is not the gateway's to remove).
fn has_rate_limit_headers(reply: &Reply) -> bool {
    [
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
    ]
    .iter()
    .any(|name| reply.headers.contains_key(*name))
        || reply
            .header("x-ratelimit-limit")
            .is_some_and(|limit| limit != "999")
}

#[tokio::test]
async fn routes_have_their_own_budgets_in_order() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            (
                "ROUTES",
                "/api/export/*=token_bucket:2:0.01;/search=fixed_window:3:1000000,method=GET,name=search",
            ),
            ("MAX_TOKENS", "10"),
        ],
    )
    .await;
    for remaining in [1, 0] {
        let reply = get(gateway.addr, "/api/export/report.csv").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.number("x-ratelimit-limit"), 2);
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining);
    }
    assert_eq!(
        get(gateway.addr, "/API/Export/other").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "any spelling of the route shares its budget"
    );
    let search = get(gateway.addr, "/search?q=x").await;
    assert_eq!(search.number("x-ratelimit-limit"), 3);
    assert_eq!(search.number("x-ratelimit-remaining"), 2);
    // The general budget is untouched by both routes.
    let other = get(gateway.addr, "/").await;
    assert_eq!(other.number("x-ratelimit-limit"), 10);
    assert_eq!(other.number("x-ratelimit-remaining"), 9);
}

#[tokio::test]
async fn costs_spend_more_of_the_budget() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "5"),
            ("REFILL_RATE", "0.01"),
            ("COSTS", "/heavy=3"),
        ],
    )
    .await;
    assert_eq!(
        get(gateway.addr, "/heavy").await.number("x-ratelimit-remaining"),
        2
    );
    let denied = get(gateway.addr, "/heavy").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 100, "one more token takes 100 s");
    assert_eq!(
        get(gateway.addr, "/light").await.number("x-ratelimit-remaining"),
        1
    );
}

#[tokio::test]
async fn exempt_clients_and_skip_paths_are_never_limited_nor_told_about_limits() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.01"),
            ("EXEMPT", "127.0.0.2,10.0.0.0/8"),
            ("SKIP_PATHS", "/healthz,/static/*"),
        ],
    )
    .await;
    for _ in 0..5 {
        let reply = get_from(gateway.addr, ip("127.0.0.2"), "/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!has_rate_limit_headers(&reply), "{:?}", reply.headers);
        for path in ["/healthz", "/static/app.js"] {
            let reply = get(gateway.addr, path).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert!(!has_rate_limit_headers(&reply), "{:?}", reply.headers);
        }
    }
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn shadow_mode_decides_and_counts_but_never_refuses() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.01"),
            ("ROUTES", "/new=fixed_window:1:1000000,shadow"),
        ],
    )
    .await;
    for _ in 0..4 {
        let reply = get(gateway.addr, "/new").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(
            !has_rate_limit_headers(&reply),
            "a shadow rule is invisible to clients"
        );
    }
    assert_eq!(backend.seen().len(), 4);
    // Other rules still enforce.
    get(gateway.addr, "/").await;
    get(gateway.addr, "/").await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::TOO_MANY_REQUESTS);

    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "1"), ("SHADOW_MODE", "true")]).await;
    for _ in 0..3 {
        assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
        assert_eq!(get(gateway.addr, "/login").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn failures_only_counting_refunds_successes() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("AUTH_PATHS", "/status/*"),
            ("AUTH_MAX_TOKENS", "2"),
            ("AUTH_COUNT", "failures"),
        ],
    )
    .await;
    for _ in 0..5 {
        let reply = get(gateway.addr, "/status/200").await;
        assert_eq!(reply.status, StatusCode::OK);
        // Each is decided with the whole budget there: the success before it was refunded.
        assert_eq!(
            reply.number("x-ratelimit-remaining"),
            1,
            "a success costs nothing"
        );
    }
    assert_eq!(
        get(gateway.addr, "/status/401")
            .await
            .number("x-ratelimit-remaining"),
        1
    );
    assert_eq!(
        get(gateway.addr, "/status/401")
            .await
            .number("x-ratelimit-remaining"),
        0
    );
    assert_eq!(
        get(gateway.addr, "/status/401").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(gateway.addr, "/status/200").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a spent budget refuses everyone, success or not"
    );
}

/// Three replicas on one Redis, failures and successes racing: the refunds are atomic, so
/// exactly the budget of failures ever gets through, however they interleave.
#[tokio::test]
async fn failures_only_counting_is_exact_across_replicas() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let vars = [
        ("REDIS_ADDR", redis.addr()),
        ("REDIS_TIMEOUT_MS", "5000".into()),
        ("AUTH_PATHS", "/status/*".into()),
        ("AUTH_ALGORITHM", "fixed_window".into()),
        ("AUTH_LIMIT", "25".into()),
        ("AUTH_WINDOW_SIZE", "10000000".into()),
        ("AUTH_COUNT", "failures".into()),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(Gateway::start(&backend.url(), &vars).await);
    }
    let replies = join_all((0..200).map(|i| {
        let path = if i % 2 == 0 { "/status/401" } else { "/status/200" };
        get(gateways[i % 3].addr, path)
    }))
    .await;
    let failed = replies
        .iter()
        .filter(|r| r.status == StatusCode::UNAUTHORIZED)
        .count();
    assert!(failed <= 25, "{failed} failures got through a budget of 25");
    // Whatever got through, the budget left is exactly 25 minus the failures.
    let mut more = 0;
    while get(gateways[more % 3].addr, "/status/401").await.status == StatusCode::UNAUTHORIZED {
        more += 1;
    }
    assert_eq!(failed + more, 25);
}

#[tokio::test]
async fn header_keys_give_each_api_key_its_own_budget() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.01"),
            ("KEY_BY", "header:X-API-Key"),
            ("EXEMPT", "key:internal-batch"),
            ("AUTH_MAX_TOKENS", "1"),
            ("SKIP_PATHS", "/healthz"),
        ],
    )
    .await;
    let key = |value: &'static str| [("x-api-key", value)];
    for _ in 0..2 {
        assert_eq!(
            get_with(&gateway, "/", &key("alice")).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        get_with(&gateway, "/", &key("alice")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Same address, another key: another budget; no key: the address's own budget.
    assert_eq!(get_with(&gateway, "/", &key("bob")).await.status, StatusCode::OK);
    assert_eq!(
        get_with(&gateway, "/", &[]).await.number("x-ratelimit-remaining"),
        1
    );
    // An exempt key is never limited.
    for _ in 0..4 {
        let reply = get_with(&gateway, "/", &key("internal-batch")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!has_rate_limit_headers(&reply), "{:?}", reply.headers);
    }
    // The auth rule stays keyed by address: rotating keys buys no new login attempts.
    assert_eq!(
        get_with(&gateway, "/login", &key("k1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&gateway, "/login", &key("k2")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A skipped path is never refused over its headers.
    let reply = get_with(&gateway, "/healthz", &[("x-api-key", "a"), ("x-api-key", "b")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    // Two values of the key header cannot be read one way only.
    let reply = get_with(&gateway, "/", &[("x-api-key", "carol"), ("x-api-key", "alice")]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn header_keys_never_reach_redis_raw_and_replicas_agree() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let vars = [
        ("REDIS_ADDR", redis.addr()),
        ("KEY_BY", "header:X-API-Key".into()),
        ("KEY_HASH_SECRET", "a shared secret of the replicas".into()),
        ("MAX_TOKENS", "3".into()),
        ("REFILL_RATE", "0.01".into()),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let first = Gateway::start(&backend.url(), &vars).await;
    let second = Gateway::start(&backend.url(), &vars).await;
    let key = [("x-api-key", "sk_live_4242")];
    let from = |gateway: &Gateway| get_from(gateway.addr, ip("127.0.0.1"), "/", &key);
    assert_eq!(from(&first).await.number("x-ratelimit-remaining"), 2);
    assert_eq!(
        from(&second).await.number("x-ratelimit-remaining"),
        1,
        "one budget on both"
    );
    let keys = redis.cli(&["--scan"]);
    assert!(!keys.contains("sk_live"), "{keys}");
    assert!(keys.trim().starts_with("tollgate:{general:key:"), "{keys}");
}

#[tokio::test]
async fn ipv6_clients_share_a_budget_per_slash_64() {
    let backend = Backend::start().await;
    let via = |client: &'static str| [("x-forwarded-for", client)];
    for (prefix, shared) in [("64", true), ("128", false)] {
        let gateway = Gateway::start(
            &backend.url(),
            &[
                ("MAX_TOKENS", "1"),
                ("REFILL_RATE", "0.01"),
                ("TRUSTED_PROXIES", "127.0.0.1"),
                ("IPV6_PREFIX", prefix),
            ],
        )
        .await;
        assert_eq!(
            get_with(&gateway, "/", &via("2001:db8:0:7::1")).await.status,
            StatusCode::OK
        );
        let neighbour = get_with(&gateway, "/", &via("2001:db8:0:7::2")).await.status;
        let expected = if shared {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            StatusCode::OK
        };
        assert_eq!(neighbour, expected, "IPV6_PREFIX={prefix}");
        // Another /64, and an IPv4-mapped address, are other clients.
        assert_eq!(
            get_with(&gateway, "/", &via("2001:db8:0:8::1")).await.status,
            StatusCode::OK
        );
        assert_eq!(
            get_with(&gateway, "/", &via("::ffff:192.0.2.1")).await.status,
            StatusCode::OK
        );
        assert_eq!(
            get_with(&gateway, "/", &via("192.0.2.1")).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "a mapped address is its IPv4 address"
        );
    }
}

#[tokio::test]
async fn draft_headers_follow_the_ietf_syntax() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("ALGORITHM", "fixed_window"),
            ("LIMIT", "2"),
            ("WINDOW_SIZE", "10000000"),
            ("RATE_LIMIT_HEADERS", "draft"),
        ],
    )
    .await;
    let reply = get(gateway.addr, "/").await;
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""general";q=2;w=10000000"#)
    );
    let rate_limit = reply.header("ratelimit").unwrap();
    assert!(rate_limit.starts_with(r#""general";r=1;t="#), "{rate_limit}");
    assert!(!reply.headers.contains_key("x-ratelimit-remaining"));
    get(gateway.addr, "/").await;
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    let t: u64 = denied
        .header("ratelimit")
        .unwrap()
        .rsplit("t=")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        denied.number("retry-after") >= t,
        "Retry-After is never earlier than t"
    );

    let gateway = Gateway::start(
        &backend.url(),
        &[("MAX_TOKENS", "1"), ("RATE_LIMIT_HEADERS", "none")],
    )
    .await;
    assert!(!has_rate_limit_headers(&get(gateway.addr, "/").await));
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!has_rate_limit_headers(&denied));
    assert_eq!(
        denied.number("retry-after"),
        1,
        "a 429 still says when to come back"
    );

    let gateway = Gateway::start(&backend.url(), &[("RATE_LIMIT_HEADERS", "both")]).await;
    let reply = get(gateway.addr, "/").await;
    assert!(reply.headers.contains_key("ratelimit") && reply.headers.contains_key("x-ratelimit-remaining"));
}

/// With `/login` spent, every spelling a backend might read as `/login` is counted against it
/// or refused outright; none reaches the backend.
#[tokio::test]
async fn auth_paths_cannot_be_walked_around() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("AUTH_MAX_TOKENS", "1"), ("AUTH_REFILL_RATE", "0.01")],
    )
    .await;
    assert_eq!(get(gateway.addr, "/login").await.status, StatusCode::OK);
    let spellings = [
        "/login;jsessionid=x",
        "/;x=1/login",
        "/login/..;/login",
        "/login.json",
        "/LOGIN;a=b",
        "/login%00",
        "/login%0a",
        "/login%20",
        "/login%5c",
        "/login\\",
        "/%256cogin",
        "/login%252f",
        "/Login",
        "//login",
        "/login/",
        "/./login",
        "/x/../login",
        "/log%69n",
        "/login%2F",
        "/login.",
        "/%2e/login",
        "/x/%2e%2e/login",
    ];
    for spelling in spellings {
        let request = format!("GET {spelling} HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n");
        let status = raw_status_line(gateway.addr, request.as_bytes()).await;
        assert!(
            status == "HTTP/1.1 429 Too Many Requests" || status == "HTTP/1.1 400 Bad Request",
            "{spelling:?} got {status:?}"
        );
    }
    assert_eq!(
        backend.seen().len(),
        1,
        "only the first /login reached the backend"
    );
}

#[tokio::test]
async fn paths_are_forwarded_as_counted() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&format!("{}/public", backend.url()), &[]).await;
    // Ordinary paths and queries go byte for byte.
    get(gateway.addr, "/api/items;v=2?q=a%20b&x=%2F").await;
    assert_eq!(backend.last().uri, "/public/api/items;v=2?q=a%20b&x=%2F");
    get(gateway.addr, "/caf%C3%A9/~me").await;
    assert_eq!(backend.last().uri, "/public/caf%C3%A9/~me");
    // Dot segments are resolved before the prefix is put in front: no escaping it.
    for (sent, forwarded) in [
        ("/../admin", "/public/admin"),
        ("/%2e%2e/admin?x=1", "/public/admin?x=1"),
        ("/a/b/../../admin/", "/public/admin/"),
        ("/x/..;/admin", "/public/admin"),
    ] {
        let request = format!("GET {sent} HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n");
        assert_eq!(
            raw_status_line(gateway.addr, request.as_bytes()).await,
            "HTTP/1.1 200 OK",
            "{sent}"
        );
        assert_eq!(backend.last().uri, forwarded, "{sent}");
    }
    let seen = backend.seen().len();
    let request = b"GET /..%2fadmin HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n";
    assert_eq!(
        raw_status_line(gateway.addr, request).await,
        "HTTP/1.1 400 Bad Request"
    );
    assert_eq!(backend.seen().len(), seen);
}
