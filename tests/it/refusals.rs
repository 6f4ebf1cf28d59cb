//! Refusals people can shape (`DENY_STATUS`, `DENY_FORMAT` and the client's `Accept`) and the
//! budget the backend is told (`FORWARD_RATELIMIT_HEADERS`), through the real binary and the
//! gateway in process, on the proxy and the decision endpoints, in memory and on Redis.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::binary::Running;
use crate::support::{Backend, Gateway, RedisServer, Reply, free_port, get_from, request};

const CLIENT: [u8; 4] = [127, 0, 0, 1];

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// One token, never refilled within a test: the second request is refused.
const ONE: &[(&str, &str)] = &[("MAX_TOKENS", "1"), ("REFILL_RATE", "0.001")];

async fn get(to: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    get_from(to, IpAddr::from(CLIENT), path, headers).await
}

fn problem(reply: &Reply) -> Value {
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    serde_json::from_slice(&reply.body).unwrap_or_else(|_| panic!("not JSON: {}", reply.text()))
}

/// Each format of a refusal, as the client's `Accept` picks it, with `status` throughout and
/// the body's seconds those of `Retry-After`.
fn assert_each_format(refusals: &[(Option<&str>, Reply)], status: StatusCode, default: &str) {
    for (accept, reply) in refusals {
        assert_eq!(reply.status, status, "{accept:?}: {}", reply.text());
        let retry_after = reply.number("retry-after");
        assert!(retry_after >= 1);
        assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"));
        let format = match accept.map(|accept| accept.split(',').next().unwrap_or_default()) {
            Some("application/problem+json") => "problem",
            Some("text/plain") => "text",
            Some("application/json") => "json",
            _ => default,
        };
        match format {
            "problem" => {
                let body = problem(reply);
                assert_eq!(body["type"], QUOTA_EXCEEDED);
                assert_eq!(
                    body["title"],
                    "Request cannot be satisfied as assigned quota has been exceeded"
                );
                assert_eq!(body["status"], status.as_u16());
                assert_eq!(body["violated-policies"], serde_json::json!(["general"]));
                assert_eq!(body["retry-after"], retry_after);
            }
            "text" => {
                assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"));
                assert_eq!(
                    reply.text(),
                    format!("rate limit exceeded (policy \"general\"); retry after {retry_after} s\n")
                );
            }
            _ => {
                assert_eq!(reply.header("content-type"), Some("application/json"));
                assert_eq!(
                    reply.text(),
                    format!(r#"{{"error":"rate limit exceeded","retry_after":{retry_after}}}"#)
                );
            }
        }
    }
}

const ACCEPTS: [Option<&str>; 6] = [
    None,
    Some("*/*"),
    Some("application/problem+json"),
    Some("text/plain"),
    Some("application/json"),
    Some("application/problem+json, application/json;q=0.9, */*;q=0.1"),
];

/// The proxy's refusals in every format, one client per `Accept` (each spends its one token).
async fn proxy_refusals(addr: std::net::SocketAddr) -> Vec<(Option<&'static str>, Reply)> {
    let mut refusals = Vec::new();
    for (client, accept) in ACCEPTS.into_iter().enumerate() {
        let from = IpAddr::from([127, 0, 1, client as u8 + 1]);
        let headers: Vec<(&str, &str)> = accept.map(|accept| ("accept", accept)).into_iter().collect();
        let allowed = get_from(addr, from, "/items", &headers).await;
        assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.text());
        refusals.push((accept, get_from(addr, from, "/items", &headers).await));
    }
    refusals
}

#[tokio::test]
async fn the_binary_refuses_with_deny_status_in_the_format_asked_for() {
    let backend = Backend::start().await;
    let url = backend.url();
    let mut vars = vec![
        ("BACKEND_URL", url.as_str()),
        ("DENY_STATUS", "503"),
        ("DENY_FORMAT", "problem"),
    ];
    vars.extend_from_slice(ONE);
    let tollgate = Running::start(&vars);
    let refusals = proxy_refusals(tollgate.addr).await;
    assert_each_format(&refusals, StatusCode::SERVICE_UNAVAILABLE, "problem");
    // The defaults are today's answer: 429 and the JSON body.
    tollgate.terminate().await;
    let mut vars = vec![("BACKEND_URL", url.as_str())];
    vars.extend_from_slice(ONE);
    let tollgate = Running::start(&vars);
    let refusals = proxy_refusals(tollgate.addr).await;
    assert_each_format(&refusals, StatusCode::TOO_MANY_REQUESTS, "json");
    tollgate.terminate().await;
    backend.stop().await;
}

#[tokio::test]
async fn redis_refusals_are_shaped_alike() {
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let url = redis.url();
    let mut vars = vec![
        ("REDIS_URL", url.as_str()),
        ("REDIS_TIMEOUT_MS", "2000"),
        ("DENY_STATUS", "403"),
        ("DENY_FORMAT", "text"),
    ];
    vars.extend_from_slice(ONE);
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let refusals = proxy_refusals(gateway.addr).await;
    assert_each_format(&refusals, StatusCode::FORBIDDEN, "text");
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn a_cacheable_deny_status_is_never_stored_and_none_names_no_rule() {
    let backend = Backend::start().await;
    let mut vars = vec![
        ("DENY_STATUS", "404"),
        ("DENY_FORMAT", "problem"),
        ("RATE_LIMIT_HEADERS", "none"),
    ];
    vars.extend_from_slice(ONE);
    let gateway = Gateway::start(&backend.url(), &vars).await;
    assert_eq!(get(gateway.addr, "/a", &[]).await.status, StatusCode::OK);
    let refused = get(gateway.addr, "/a", &[]).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    // A 404 is heuristically cacheable (RFC 9110 section 15.1): a cache in front must not
    // answer other clients with this one's refusal.
    assert_eq!(refused.header("cache-control"), Some("no-store"));
    let body = problem(&refused);
    assert_eq!(body["status"], 404);
    assert!(body.get("violated-policies").is_none(), "{body}");
    assert!(refused.header("x-ratelimit-limit").is_none());
    assert_eq!(body["retry-after"], refused.number("retry-after"));
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn a_bad_deny_setting_stops_the_binary_naming_it() {
    for (name, value, says) in [
        ("DENY_STATUS", "200", "a success"),
        ("DENY_STATUS", "302", "a redirection"),
        ("DENY_STATUS", "401", "WWW-Authenticate"),
        ("DENY_STATUS", "502", "backend"),
        ("DENY_STATUS", "too-many", "from 400 to 599"),
        ("DENY_FORMAT", "xml", "json, problem or text"),
        ("FORWARD_RATELIMIT_HEADERS", "yes", "true or false"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--check-config")
            .env_clear()
            .env("BACKEND_URL", "http://127.0.0.1:9")
            .env(name, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("{name}={value:?}")) && stderr.contains(says),
            "{name}={value}: {stderr}"
        );
    }
}

/// A forward-auth call for the original request `uri` of `client`, with `extra` headers.
async fn forward_auth(
    decide: std::net::SocketAddr,
    query: &str,
    client: &str,
    extra: &[(&str, &str)],
) -> Reply {
    let mut headers = vec![
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/items"),
        ("x-forwarded-for", client),
    ];
    headers.extend_from_slice(extra);
    let path = format!("/v1/forward-auth{query}");
    request(
        decide,
        IpAddr::from(CLIENT),
        Method::GET,
        &path,
        &headers,
        Bytes::new(),
    )
    .await
}

#[tokio::test]
async fn forward_auth_refuses_as_configured_and_keeps_nginx_working() {
    // nginx's auth_request passes on 401 and 403 only: DENY_STATUS=403 is the setting for it.
    let backend = Backend::start().await;
    let url = backend.url();
    let decide_port = free_port().to_string();
    let mut vars = vec![
        ("BACKEND_URL", url.as_str()),
        ("DECIDE_PORT", decide_port.as_str()),
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("DENY_STATUS", "403"),
    ];
    vars.extend_from_slice(ONE);
    let tollgate = Running::start(&vars);
    let decide = std::net::SocketAddr::new(tollgate.addr.ip(), decide_port.parse().unwrap());
    crate::support::redis::wait_for(
        || std::net::TcpStream::connect(decide).is_ok(),
        "the decision endpoints to listen",
    );
    assert_eq!(
        forward_auth(decide, "", "203.0.113.1", &[]).await.status,
        StatusCode::OK
    );
    // The default body is the constant of old, with DENY_STATUS.
    let refused = forward_auth(decide, "", "203.0.113.1", &[]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.text(), r#"{"error":"rate limit exceeded"}"#);
    assert!(refused.number("retry-after") >= 1);
    // The original request's Accept (Traefik and Caddy pass the body on to the client).
    let refused = forward_auth(
        decide,
        "",
        "203.0.113.1",
        &[("accept", "application/problem+json")],
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let body = problem(&refused);
    assert_eq!(body["status"], 403);
    assert_eq!(body["violated-policies"], serde_json::json!(["general"]));
    assert_eq!(body["retry-after"], refused.number("retry-after"));
    let refused = forward_auth(decide, "", "203.0.113.1", &[("accept", "text/plain")]).await;
    assert_eq!(refused.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(
        refused
            .text()
            .starts_with("rate limit exceeded (policy \"general\")")
    );
    // ?status= still names the status for one proxy, and the problem body says it.
    let refused = forward_auth(
        decide,
        "?status=429",
        "203.0.113.1",
        &[("accept", "application/problem+json")],
    )
    .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(problem(&refused)["status"], 429);
    tollgate.terminate().await;
    backend.stop().await;
}

#[tokio::test]
async fn the_json_decision_api_answers_as_before_whatever_the_refusals_look_like() {
    let mut vars = vec![("DENY_STATUS", "503"), ("DENY_FORMAT", "text")];
    vars.extend_from_slice(ONE);
    let gateway = Gateway::start_decide(None, &vars).await;
    let ask = || {
        request(
            gateway.decide.unwrap(),
            IpAddr::from(CLIENT),
            Method::POST,
            "/v1/check",
            &[("content-type", "application/json"), ("accept", "text/plain")],
            Bytes::from_static(br#"{"rule":"general","key":"user-1"}"#),
        )
    };
    assert_eq!(ask().await.status, StatusCode::OK);
    let refused = ask().await;
    // The decision, not the refusal: 200 and JSON, for the caller to act on.
    assert_eq!(refused.status, StatusCode::OK);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    let answer: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(answer["allowed"], false);
    assert!(answer["retry_after_s"].as_u64().unwrap() >= 1);
    gateway.stop().await;
}

/// The draft fields as `reply` carries them.
fn draft_fields(headers: &http::HeaderMap) -> (Option<String>, Option<String>) {
    let field = |name: &str| {
        let mut values = headers.get_all(name).iter();
        let first = values.next().map(|value| value.to_str().unwrap().to_owned());
        assert!(values.next().is_none(), "one {name} field");
        first
    };
    (field("ratelimit-policy"), field("ratelimit"))
}

const FORGED: &[(&str, &str)] = &[
    ("ratelimit", r#""general";r=1000000;t=1"#),
    ("ratelimit-policy", r#""general";q=1000000;w=1"#),
];

async fn the_backend_sees_the_budget_the_client_is_told(store: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let mut vars = vec![
        ("FORWARD_RATELIMIT_HEADERS", "true"),
        ("RATE_LIMIT_HEADERS", "draft"),
        ("MAX_TOKENS", "3"),
        ("REFILL_RATE", "0.001"),
        ("SKIP_PATHS", "/health"),
    ];
    vars.extend_from_slice(store);
    let gateway = Gateway::start(&backend.url(), &vars).await;
    for remaining in [2, 1, 0] {
        // A client's own fields never reach the backend: ours replace them.
        let reply = get(gateway.addr, "/items", FORGED).await;
        assert_eq!(reply.status, StatusCode::OK);
        let told = draft_fields(&reply.headers);
        let seen = draft_fields(&backend.last().headers);
        assert_eq!(seen, told, "the backend is told what the client is");
        assert_eq!(seen.0.as_deref(), Some(r#""general";q=3;w=3000"#));
        let rate_limit = seen.1.unwrap();
        assert!(
            rate_limit.starts_with(&format!(r#""general";r={remaining};t="#)),
            "{rate_limit}"
        );
    }
    let forwarded = backend.seen().len();
    assert_eq!(
        get(gateway.addr, "/items", FORGED).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(backend.seen().len(), forwarded, "a refusal is not forwarded");
    // A skipped path has no decision to tell: the client's fields are removed all the same.
    assert_eq!(get(gateway.addr, "/health", FORGED).await.status, StatusCode::OK);
    assert_eq!(draft_fields(&backend.last().headers), (None, None));
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn the_backend_sees_the_budget_in_memory() {
    the_backend_sees_the_budget_the_client_is_told(&[]).await;
}

#[tokio::test]
async fn the_backend_sees_the_budget_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    // A loaded machine must not turn a decision into FAIL_MODE=open's none.
    let store = [("REDIS_URL", url.as_str()), ("REDIS_TIMEOUT_MS", "2000")];
    the_backend_sees_the_budget_the_client_is_told(&store).await;
}

#[tokio::test]
async fn the_backend_is_told_in_the_draft_whatever_the_client_is_told() {
    let backend = Backend::start().await;
    let mut vars = vec![("FORWARD_RATELIMIT_HEADERS", "true")];
    vars.extend_from_slice(ONE);
    // The legacy X-RateLimit-* fields for the client (the default), the draft's for the backend.
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let reply = get(gateway.addr, "/items", FORGED).await;
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(draft_fields(&reply.headers), (None, None));
    let seen = draft_fields(&backend.last().headers);
    assert_eq!(seen.0.as_deref(), Some(r#""general";q=1;w=1000"#));
    assert!(seen.1.unwrap().starts_with(r#""general";r=0;t="#));
    gateway.stop().await;

    // Off (the default), the gateway claims nothing: the client's fields pass as any header.
    let gateway = Gateway::start(&backend.url(), ONE).await;
    assert_eq!(get(gateway.addr, "/items", FORGED).await.status, StatusCode::OK);
    let seen = draft_fields(&backend.last().headers);
    assert_eq!(seen.1.as_deref(), Some(FORGED[0].1));
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn forward_auth_gives_the_calling_proxy_the_fields_to_forward() {
    let mut vars = vec![
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("FORWARD_RATELIMIT_HEADERS", "true"),
    ];
    vars.extend_from_slice(&[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.001")]);
    let gateway = Gateway::start_decide(None, &vars).await;
    let decide = gateway.decide.unwrap();
    let allowed = forward_auth(decide, "", "203.0.113.5", FORGED).await;
    assert_eq!(allowed.status, StatusCode::OK);
    // RATE_LIMIT_HEADERS=legacy for the client, and the draft's fields for the proxy to copy
    // onto the request it forwards (Traefik's authResponseHeaders, nginx's auth_request_set).
    assert_eq!(allowed.header("x-ratelimit-remaining"), Some("1"));
    let (policy, rate_limit) = draft_fields(&allowed.headers);
    assert_eq!(policy.as_deref(), Some(r#""general";q=2;w=2000"#));
    assert!(rate_limit.unwrap().starts_with(r#""general";r=1;t="#));
    gateway.stop().await;
}
