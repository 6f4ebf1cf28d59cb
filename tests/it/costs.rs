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

// --- Hostile costs (issue 26): numbers no budget holds, at every door ---------------------

/// The costs every door is driven with beside a rule's own capacity and capacity + 1: what
/// an attacker types where a cost goes.
const HOSTILE: [u64; 6] = [
    1 << 31,
    u32::MAX as u64,
    1 << 53,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// A backend reporting costs no budget holds (`X-Tokens-Used: 18446744073709`, the issue's,
/// and 2^50 - 1, the largest still read as a cost) charges a bounded debt: the client is
/// refused for at most about two refills, then decided again; every other client is decided
/// all along, and no breaker opens.
async fn hostile_reports_on(store: &[(&str, &str)], redis: bool) {
    let backend = Backend::start().await;
    let mut vars = vec![
        ("RESPONSE_COST_HEADER", "X-Tokens-Used"),
        // 10 tokens refilling 10/s, and 1000 in any second.
        ("LIMITS", "token_bucket:10:10+sliding_window:1000:1"),
    ];
    vars.extend_from_slice(store);
    let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    for (n, reported) in ["18446744073709", "1125899906842623"].into_iter().enumerate() {
        let client: std::net::IpAddr = format!("127.0.1.{n}").parse().unwrap();
        let reply = get_from(gateway.addr, client, &format!("/cost/{reported}"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{reported}");
        for _ in 0..3 {
            let refused = get_from(gateway.addr, client, "/", &[]).await;
            assert_eq!(
                refused.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{reported}: in debt, decided ({:?})",
                refused.headers
            );
            assert!(
                refused.number("retry-after") <= 2,
                "{reported}: a bounded debt: {:?}",
                refused.headers
            );
        }
        let decided = get_from(gateway.addr, other, "/", &[]).await;
        assert_eq!(decided.status, StatusCode::OK);
        assert!(decided.header("x-ratelimit-remaining").is_some(), "decided");
        // Paid back within two refills of the bucket (and the window's weight gone).
        tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
        let again = get_from(gateway.addr, client, "/", &[]).await;
        assert_eq!(again.status, StatusCode::OK, "{reported}: {:?}", again.headers);
        assert!(again.header("x-ratelimit-remaining").is_some(), "decided");
    }
    if redis {
        assert_eq!(gateway.metric("tollgate_breaker_open").await, 0.0);
        for kind in ["timeout", "connection", "script", "reply"] {
            let series = format!(r#"tollgate_redis_errors_total{{kind="{kind}"}}"#);
            assert_eq!(gateway.metric(&series).await, 0.0, "{kind}");
        }
    }
    assert_eq!(gateway.metric("tollgate_response_cost_invalid_total").await, 0.0);
}

#[tokio::test]
async fn hostile_reported_costs_are_a_bounded_debt_in_memory() {
    hostile_reports_on(&[], false).await;
}

#[tokio::test]
async fn hostile_reported_costs_are_a_bounded_debt_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    hostile_reports_on(
        &[
            ("REDIS_ADDR", addr.as_str()),
            ("REDIS_TIMEOUT_MS", "5000"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            ("REDIS_PROBE_INTERVAL_MS", "60000"),
        ],
        true,
    )
    .await;
}

/// `/v1/check` with a cost no budget holds: `400` naming `cost`, nothing spent; another
/// client is decided as ever.
async fn hostile_checks_on(store: &[(&str, &str)], redis: bool) {
    let mut vars = vec![("LIMITS", "token_bucket:3:0.001+sliding_log:5:3600")];
    vars.extend_from_slice(store);
    let gateway = crate::support::Gateway::start_decide_with_admin(&vars).await;
    let address = gateway.decide.unwrap();
    let check = |body: String| async move {
        crate::support::request(
            address,
            [127, 0, 0, 1].into(),
            http::Method::POST,
            "/v1/check",
            &[("content-type", "application/json")],
            bytes::Bytes::from(body),
        )
        .await
    };
    let mut costs: Vec<String> = HOSTILE.iter().map(u64::to_string).collect();
    costs.extend(["0", "4", "18446744073709551616", "-1", "1.5", "1e30", "\"2\""].map(str::to_owned));
    for cost in &costs {
        let reply = check(format!(r#"{{"rule":"general","key":"hostile","cost":{cost}}}"#)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{cost}: {}", reply.text());
        assert!(
            reply.text().contains(r#""field":"cost""#),
            "{cost}: {}",
            reply.text()
        );
    }
    // The capacity itself goes through once, and nothing was spent before it.
    let whole = check(r#"{"rule":"general","key":"hostile","cost":3}"#.into()).await;
    assert!(whole.text().contains(r#""allowed":true"#), "{}", whole.text());
    for remaining in [2, 1, 0] {
        let reply = check(r#"{"rule":"general","key":"other"}"#.into()).await;
        assert!(
            reply.text().contains(&format!(
                r#""allowed":true,"rule":"general","limit":3,"remaining":{remaining}"#
            )),
            "{}",
            reply.text()
        );
    }
    if redis {
        assert_eq!(gateway.metric("tollgate_breaker_open").await, 0.0);
    }
    gateway.stop().await;
}

#[tokio::test]
async fn hostile_check_costs_are_bad_requests_in_memory() {
    hostile_checks_on(&[], false).await;
}

#[tokio::test]
async fn hostile_check_costs_are_bad_requests_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    hostile_checks_on(
        &[
            ("REDIS_ADDR", addr.as_str()),
            ("REDIS_TIMEOUT_MS", "5000"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            // A decision service on Redis digests named keys with the fleet's shared secret.
            ("KEY_HASH_SECRET", "shared-secret-for-the-test"),
        ],
        true,
    )
    .await;
}

/// Every algorithm alone and in a list, for Envoy's descriptors.
const HOSTILE_DESCRIPTORS: &str = "
domain: edge
descriptors:
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: day, requests_per_unit: 3}
  - key: sliding
    rate_limit: {algorithm: sliding_window, unit: day, requests_per_unit: 3}
  - key: fixed
    rate_limit: {algorithm: fixed_window, unit: day, requests_per_unit: 3}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: day, requests_per_unit: 3}
  - key: list
    rate_limit: {limits: [token_bucket:3:0.001, sliding_window:3:86400, fixed_window:3:86400, sliding_log:3:86400, concurrent:3]}
";

/// Envoy's `ShouldRateLimit` over the wire (a client generated from the protos): for each
/// limit, a client sending hostile `hits_addend`s (the descriptor's UInt64Value, and the
/// request's uint32) is over the limit at once and spends nothing; capacity + 1 is over,
/// the capacity passes; and another client of the same limit gets its exact budget of 3 (a
/// breaker opened by the first would have answered OK for ever with `FAIL_MODE=open`).
const PYTHON_HOSTILE: &str = r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from google.protobuf import wrappers_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
Code = rls_pb2.RateLimitResponse.Code
def ask(key, value, hits=None, request_hits=0):
    d = ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)])
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[d], hits_addend=request_hits))
    return Code.Name(r.statuses[0].code)
for key in ["bucket", "sliding", "fixed", "log", "list"]:
    said = []
    for hits in [4, 1 << 31, (1 << 32) - 1, 1 << 53, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]:
        said.append(ask(key, "hostile", hits))
    for hits in [1 << 31, (1 << 32) - 1]:
        said.append(ask(key, "hostile", None, hits))
    said.append(ask(key, "hostile", 3))
    said.append(ask(key, "hostile", 1))
    print(key, " ".join(said))
    print(key, " ".join(ask(key, "other") for _ in range(4)))
"#;

async fn hostile_hits_on(store: &[(&str, &str)], redis: bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostile.yaml");
    std::fs::write(&file, HOSTILE_DESCRIPTORS).unwrap();
    let file = file.display().to_string();
    let mut vars = vec![("RLS_CONFIG", file.as_str())];
    vars.extend_from_slice(store);
    let gateway = crate::support::Gateway::start_decide_with_admin(&vars).await;
    let printed = crate::rls::python_client(PYTHON_HOSTILE, gateway.decide.unwrap()).await;
    let over = "OVER_LIMIT";
    let mut expected = Vec::new();
    for key in ["bucket", "sliding", "fixed", "log", "list"] {
        expected.push(format!("{key} {} OK OVER_LIMIT", [over; 9].join(" ")));
        expected.push(format!("{key} OK OK OK OVER_LIMIT"));
    }
    assert_eq!(printed.lines().collect::<Vec<_>>(), expected);
    if redis {
        assert_eq!(gateway.metric("tollgate_breaker_open").await, 0.0);
        for kind in ["timeout", "connection", "script", "reply"] {
            let series = format!(r#"tollgate_redis_errors_total{{kind="{kind}"}}"#);
            assert_eq!(gateway.metric(&series).await, 0.0, "{kind}");
        }
    }
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_hits_addends_are_over_the_limit_in_memory() {
    hostile_hits_on(&[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_hits_addends_are_over_the_limit_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    hostile_hits_on(
        &[
            ("REDIS_ADDR", addr.as_str()),
            ("KEY_HASH_SECRET", "0123456789abcdef0123"),
            ("REDIS_TIMEOUT_MS", "5000"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            ("REDIS_PROBE_INTERVAL_MS", "60000"),
        ],
        true,
    )
    .await;
}
