//! Costs the backend reports (`RESPONSE_COST_HEADER`) through the real binary, on both stores:
//! the difference from the cost charged up front is charged (into debt, refusing what follows
//! until it is paid back) or refunded, under every limit of the rule, and the header never
//! reaches the client; a malformed one is ignored and counted.

use http::StatusCode;

use crate::support::{Backend, Gateway, RedisServer, get, get_from};

async fn costs_on(store: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let mut vars = vec![
        ("RESPONSE_COST_HEADER", "X-Tokens-Used"),
        // 100 tokens refilling 10/s, and 1000 a day.
        ("LIMITS", "token_bucket:100:10+fixed_window:1000:86400"),
        ("RATE_LIMIT_HEADERS", "both"),
    ];
    vars.extend_from_slice(store);
    let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;

    // Charged 1 up front, 40 reported: 39 more charged to both limits.
    let reply = get(gateway.addr, "/cost/40").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.header("x-tokens-used").is_none(),
        "the backend's report is not the client's"
    );
    let next = get(gateway.addr, "/").await;
    let policies = next.header("ratelimit").unwrap().to_owned();
    assert!(
        policies.contains(r#""general.2";r=959;"#),
        "1 + 39 + 1 spent: {policies}"
    );
    // Reported 0: the up-front cost given back (only the next request spends).
    get(gateway.addr, "/cost/0").await;
    let after = get(gateway.addr, "/").await;
    assert!(
        after
            .header("ratelimit")
            .unwrap()
            .contains(r#""general.2";r=958;"#),
        "given back: {:?}",
        after.headers
    );

    // Into debt: 250 reported on a bucket of 100 (the day's quota has room): refused until it
    // has refilled, for about 15 s (250 - 100 + what was left, at 10/s).
    get(gateway.addr, "/cost/250").await;
    let refused = get(gateway.addr, "/").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.number("retry-after") >= 10,
        "in debt: {:?}",
        refused.headers
    );

    // Malformed, negative or repeated (from another client, not in debt): ignored, counted,
    // and still not the client's; only the up-front cost is spent.
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    for path in ["/cost/many", "/cost/-5", "/cost/3/4"] {
        let reply = get_from(gateway.addr, other, path, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert!(reply.header("x-tokens-used").is_none(), "{path}");
    }
    let spent = get_from(gateway.addr, other, "/", &[]).await;
    assert!(
        spent
            .header("ratelimit")
            .unwrap()
            .contains(r#""general.2";r=996;"#),
        "{:?}",
        spent.headers
    );
    assert_eq!(gateway.metric("tollgate_response_cost_invalid_total").await, 3.0);
}

#[tokio::test]
async fn reported_costs_in_memory() {
    costs_on(&[]).await;
}

#[tokio::test]
async fn reported_costs_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    costs_on(&[("REDIS_ADDR", addr.as_str()), ("REDIS_TIMEOUT_MS", "5000")]).await;
}
