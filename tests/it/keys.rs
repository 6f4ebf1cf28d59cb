//! Key sources (`KEY_BY`, a route's `key=`): `cookie:NAME`, `query:NAME`, `host`, `path`, and
//! several joined by `+`, over real sockets on every door, each scenario run on the memory
//! store and on a real Redis and demanded to decide identically; and through the real binary.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::binary::Running;
use crate::support::{Backend, Gateway, RedisServer, Reply, get_from, request};

const SECRET: &str = "a shared secret of the replicas";

/// Where budgets are kept.
#[derive(Clone, Copy, Debug)]
enum Store {
    Memory,
    Redis,
}

/// `vars` for `store` (with Redis, `redis`'s address and the shared secret).
fn with_store<'a>(
    store: Store,
    redis: &'a Option<RedisServer>,
    vars: &[(&'a str, &'a str)],
) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    if let (Store::Redis, Some(redis)) = (store, redis) {
        all.push(("REDIS_ADDR".into(), redis.addr()));
        all.push(("KEY_HASH_SECRET".into(), SECRET.into()));
    }
    all
}

fn borrowed(vars: &[(String, String)]) -> Vec<(&str, &str)> {
    vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A Redis for `store`, or none.
fn redis_for(store: Store) -> Option<RedisServer> {
    matches!(store, Store::Redis).then(RedisServer::start)
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// What a client saw: the status and the budget left (`None` without rate-limit headers).
fn seen(reply: &Reply) -> (u16, Option<u64>) {
    let remaining = reply
        .header("x-ratelimit-remaining")
        .map(|value| value.parse().unwrap());
    (reply.status.as_u16(), remaining)
}

/// Run `scenario` on both stores: each must see `expected`, so memory and Redis agree.
macro_rules! on_both_stores {
    ($scenario:ident, $expected:expr) => {
        for store in [Store::Memory, Store::Redis] {
            let seen = $scenario(store).await;
            assert_eq!(seen, $expected, "{store:?}");
        }
    };
}

const BUDGET: &[(&str, &str)] = &[
    ("MAX_TOKENS", "2"),
    ("REFILL_RATE", "0.001"),
    ("TRUSTED_PROXIES", "127.0.0.1"),
];

async fn query_tenants(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "query:tenant"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for target in [
        "/?tenant=acme",
        "/api?a=1&tenant=acme",
        // The same tenant spelled another way: the same budget, spent.
        "/?tenant=%61cm%65",
        // Another tenant: a budget of its own.
        "/?tenant=globex",
        // Named twice: refused, as backends read either (nothing spent).
        "/?tenant=globex&tenant=acme",
        "/?tenant=globex;tenant=acme",
        "/?tenant=globex",
        // A tenant spelled with '+': a space, as forms encode it.
        "/?tenant=a+b",
        "/?tenant=a%20b",
        // No tenant, or an empty one: the address's budget.
        "/",
        "/?tenant=",
        "/?tenants=acme",
    ] {
        seen_all.push(seen(&get_from(gateway.addr, ip("127.0.0.1"), target, &[]).await));
    }
    if let Some(redis) = &redis {
        let keys = redis.cli(&["--scan"]);
        assert!(!keys.contains("acme") && !keys.contains("globex"), "{keys}");
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn query_keys_give_each_tenant_a_budget_whatever_its_spelling() {
    on_both_stores!(
        query_tenants,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (400, None),
            (400, None),
            (200, Some(0)),
            (200, Some(1)),
            (200, Some(0)),
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
        ]
    );
}

/// A query parameter a key is read from, named twice (split at `&` or `;`, as Rack, older
/// Python and many other readers split pairs): refused with `400` on every door, as a repeated
/// key header is. An earlier version keyed `?tenant=R;tenant=A` whole, a fresh budget for
/// each `R`, while a backend splitting at `;` served tenant `A`.
#[tokio::test]
async fn a_key_parameter_named_twice_is_refused_on_every_door() {
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "query:tenant"));
    let gateway = Gateway::start_decide(Some(&backend.url()), &vars).await;
    let addr = gateway.addr;
    let proxy =
        |target: &'static str| async move { seen(&get_from(addr, ip("127.0.0.1"), target, &[]).await) };
    assert_eq!(proxy("/?tenant=A").await, (200, Some(1)));
    assert_eq!(proxy("/?tenant=A").await, (200, Some(0)));
    assert_eq!(proxy("/?tenant=A").await, (429, Some(0)));
    for target in [
        "/?tenant=R1;tenant=A",
        "/?tenant=A&tenant=R2",
        "/?tenant=R3&x=1;tenant=A",
        "/?ten%61nt=R4&tenant=A",
    ] {
        assert_eq!(proxy(target).await, (400, None), "{target}");
    }
    let refused = forward_auth(&gateway, "/api?tenant=R5;tenant=A", "app.example", &[]).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text());
    assert!(refused.text().contains("tenant"), "{}", refused.text());
    let refused = request(
        gateway.decide.unwrap(),
        ip("127.0.0.1"),
        Method::POST,
        "/v1/check",
        &[("content-type", "application/json")],
        Bytes::from_static(br#"{"path": "/api?tenant=R6;tenant=A", "client_ip": "203.0.113.7"}"#),
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text());
    let error: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(error["field"], "path", "{error}");
    assert_eq!(backend.seen().len(), 2);
    gateway.stop().await;
}

async fn cookie_sessions(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "cookie:session"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    let cases: &[&[(&str, &str)]] = &[
        &[("cookie", "theme=dark; session=s1")],
        // Two lines (as HTTP/2 sends them, and HTTP/1.1 clients may): one cookie-string.
        &[("cookie", "theme=dark"), ("cookie", "session=s1")],
        // Quoted or escaped, the same session.
        &[("cookie", "session=\"%731\"")],
        &[("cookie", "session=s2; session=s1")],
        // Only a prefix of the name, or none: the address.
        &[("cookie", "sessionid=s1")],
        &[],
        &[("cookie", "session=")],
    ];
    for headers in cases {
        seen_all.push(seen(&get_from(gateway.addr, ip("127.0.0.1"), "/", headers).await));
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn cookie_keys_read_every_cookie_line_and_one_spelling_of_a_value() {
    on_both_stores!(
        cookie_sessions,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
        ]
    );
}

async fn paths_per_client(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "ip+path"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for (from, target) in [
        ("127.0.0.1", "/a"),
        ("127.0.0.1", "/a?x=1"),
        // The canonical path: every spelling of /a is /a.
        ("127.0.0.1", "//a"),
        ("127.0.0.1", "/b/../a"),
        ("127.0.0.1", "/b"),
        // Another client, the same path: a budget of its own.
        ("127.0.0.2", "/a"),
    ] {
        seen_all.push(seen(&get_from(gateway.addr, ip(from), target, &[]).await));
    }
    if let Some(redis) = &redis {
        let keys = redis.cli(&["--scan"]);
        assert_eq!(keys.lines().count(), 3, "{keys}");
        assert!(
            keys.lines()
                .all(|key| key.starts_with("tollgate:{general:127.0.0.") && key.contains("+key:")),
            "{keys}"
        );
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn ip_and_path_give_each_client_a_budget_per_canonical_path() {
    on_both_stores!(
        paths_per_client,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (200, Some(1)),
        ]
    );
}

async fn resources_per_client(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("ROUTES", "/api/*=token_bucket:2:0.001,key=ip+path,name=api"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for target in [
        "/api/search",
        "/api/search.json",
        // What rule matching ignores, keying ignores: a format or any other extension (Rails
        // routes each to /api/search), and what follows a script (PHP's PATH_INFO).
        "/api/search.a1",
        "/api/search.a2",
        "/API/Search.XML",
        "/api/search.php/x",
        "/api/search.php/y",
        // Another resource: a budget of its own.
        "/api/searches",
    ] {
        seen_all.push(seen(&get_from(gateway.addr, ip("127.0.0.1"), target, &[]).await));
    }
    let forwarded: Vec<String> = backend.seen().iter().map(|seen| seen.uri.clone()).collect();
    assert_eq!(
        forwarded,
        ["/api/search", "/api/search.json", "/api/searches"],
        "forwarded as sent"
    );
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn ip_and_path_give_one_budget_to_a_resource_whatever_its_extension_or_path_info() {
    on_both_stores!(
        resources_per_client,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
        ]
    );
}

async fn missing_sources(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let vars = [
        ("MAX_TOKENS", "3"),
        ("REFILL_RATE", "0.001"),
        ("KEY_BY", "header:X-API-Key+query:tenant"),
    ];
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let key = [("x-api-key", "k1")];
    let mut seen_all = Vec::new();
    for (target, headers) in [
        ("/?tenant=acme", &key[..]),
        // Another tenant of the same key: another budget.
        ("/?tenant=globex", &key[..]),
        ("/?tenant=acme", &key[..]),
        // Without one source or the other, or both: the address alone, one budget for the three,
        // never a budget of the source the request has.
        ("/", &key[..]),
        ("/?tenant=acme", &[][..]),
        ("/", &[][..]),
        ("/", &key[..]),
    ] {
        seen_all.push(seen(
            &get_from(gateway.addr, ip("127.0.0.1"), target, headers).await,
        ));
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn a_request_missing_any_source_is_keyed_by_its_address_alone() {
    on_both_stores!(
        missing_sources,
        vec![
            (200, Some(2)),
            (200, Some(2)),
            (200, Some(1)),
            (200, Some(2)),
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
        ]
    );
}

async fn hosts(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "ip+host"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for host in [
        "a.example",
        "A.Example:80",
        "a.example.",
        "b.example",
        "a.example:8080",
    ] {
        let reply = get_from(gateway.addr, ip("127.0.0.1"), "/", &[("host", host)]).await;
        seen_all.push(seen(&reply));
    }
    // An absolute-form target names the host itself (RFC 9112 section 3.2.2).
    let reply = get_from(
        gateway.addr,
        ip("127.0.0.1"),
        "http://B.example/",
        &[("host", "b.example")],
    )
    .await;
    seen_all.push(seen(&reply));
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn host_keys_are_one_per_host_whatever_its_case_and_default_port() {
    on_both_stores!(
        hosts,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (200, Some(1)),
            (200, Some(0)),
        ]
    );
}

/// A forward-auth call for the original request `uri` of 203.0.113.7, on `host`.
async fn forward_auth(gateway: &Gateway, uri: &str, host: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", uri),
        ("x-forwarded-host", host),
        ("x-forwarded-for", "203.0.113.7"),
    ];
    headers.extend_from_slice(extra);
    request(
        gateway.decide.unwrap(),
        ip("127.0.0.1"),
        Method::GET,
        "/v1/forward-auth",
        &headers,
        Bytes::new(),
    )
    .await
}

async fn forward_auth_sources(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "query:tenant+host"));
    let gateway = Gateway::start_decide(None, &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for (uri, host) in [
        ("/api?tenant=acme", "app.example"),
        ("/api?tenant=%61cme", "APP.example:443"),
        ("/api?tenant=acme", "app.example"),
        ("/api?tenant=acme", "other.example"),
        ("/api?tenant=globex", "app.example"),
        // No query: the address's.
        ("/api", "app.example"),
    ] {
        seen_all.push(seen(&forward_auth(&gateway, uri, host, &[]).await));
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn forward_auth_reads_the_query_and_host_of_the_original_request() {
    on_both_stores!(
        forward_auth_sources,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (200, Some(1)),
            (200, Some(1)),
        ]
    );
}

#[tokio::test]
async fn forward_auth_reads_cookies_and_refuses_two_forwarded_hosts() {
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "cookie:session"));
    let gateway = Gateway::start_decide(None, &vars).await;
    let cookie = [("cookie", "session=s1")];
    let statuses = [
        forward_auth(&gateway, "/", "app.example", &cookie).await.status,
        forward_auth(&gateway, "/", "app.example", &cookie).await.status,
        forward_auth(&gateway, "/", "app.example", &cookie).await.status,
        forward_auth(&gateway, "/", "app.example", &[("cookie", "session=s2")])
            .await
            .status,
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 200, 429, 200]);
    let twice = forward_auth(&gateway, "/", "a.example", &[("x-forwarded-host", "b.example")]).await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{}", twice.text());
    assert!(twice.text().contains("X-Forwarded-Host"), "{}", twice.text());
    gateway.stop().await;
}

/// `POST /v1/check` with `body`.
async fn check(gateway: &Gateway, body: &str) -> Value {
    let reply = request(
        gateway.decide.unwrap(),
        ip("127.0.0.1"),
        Method::POST,
        "/v1/check",
        &[("content-type", "application/json")],
        Bytes::copy_from_slice(body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    serde_json::from_slice(&reply.body).unwrap()
}

async fn check_sources(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "query:tenant"));
    vars.push((
        "ROUTES",
        "/site=fixed_window:1:60,key=ip+host+cookie:id,name=site",
    ));
    let gateway = Gateway::start_decide(None, &borrowed(&with_store(store, &redis, &vars))).await;
    let mut seen_all = Vec::new();
    for body in [
        r#"{"path": "/api?tenant=acme", "client_ip": "203.0.113.7"}"#,
        // A named key under a rule keyed by one source: that source's value, the same budget.
        r#"{"rule": "general", "key": "acme"}"#,
        r#"{"path": "/api?tenant=%61cme", "client_ip": "198.51.100.1"}"#,
        r#"{"path": "/api?tenant=globex", "client_ip": "203.0.113.7"}"#,
        r#"{"path": "/site", "client_ip": "203.0.113.7", "headers": {"host": "a.example", "cookie": "id=1"}}"#,
        r#"{"path": "/site", "client_ip": "203.0.113.7", "headers": {"host": "A.example", "cookie": "id=1"}}"#,
        r#"{"path": "/site", "client_ip": "203.0.113.7", "headers": {"host": "a.example", "cookie": "id=2"}}"#,
    ] {
        let answer = check(&gateway, body).await;
        let status = if answer["allowed"] == true { 200 } else { 429 };
        seen_all.push((status, answer["remaining"].as_u64()));
    }
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn check_reads_the_query_of_its_path_and_host_and_cookies_of_its_headers() {
    on_both_stores!(
        check_sources,
        vec![
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(0)),
        ]
    );
}

#[tokio::test]
async fn the_admin_names_single_source_clients_by_value_and_composite_ones_by_digest() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.001"),
            ("KEY_BY", "query:tenant"),
            (
                "ROUTES",
                "/both=token_bucket:2:0.001,key=ip+header:X-API-Key+query:tenant,name=both",
            ),
            ("ADMIN_TOKEN", "an admin token of sixteen"),
        ],
    )
    .await;
    let token = Some("an admin token of sixteen");
    for _ in 0..2 {
        get_from(gateway.addr, ip("127.0.0.1"), "/?tenant=acme", &[]).await;
    }
    let inspect = gateway
        .admin(Method::GET, "/v1/clients/general/key:acme", token)
        .await;
    assert_eq!(inspect.status, StatusCode::OK, "{}", inspect.text());
    let answer: Value = serde_json::from_slice(&inspect.body).unwrap();
    assert_eq!(answer["remaining"], 0, "{answer}");
    let reset = gateway
        .admin(Method::DELETE, "/v1/clients/general/key:acme", token)
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.text());
    let again = get_from(gateway.addr, ip("127.0.0.1"), "/?tenant=acme", &[]).await;
    assert_eq!(seen(&again), (200, Some(1)));

    // Several sources: the digest, as /v1/limited prints it.
    let both = |tenant: &'static str| async move {
        get_from(
            gateway.addr,
            ip("127.0.0.1"),
            &format!("/both?tenant={tenant}"),
            &[("x-api-key", "k1")],
        )
        .await
    };
    for _ in 0..3 {
        both("acme").await;
    }
    let limited = gateway.admin(Method::GET, "/v1/limited", token).await;
    let limited: Value = serde_json::from_slice(&limited.body).unwrap();
    let rule = limited["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["rule"] == "both")
        .unwrap();
    let client = rule["clients"][0]["client"].as_str().unwrap().to_owned();
    assert!(client.starts_with("127.0.0.1+key:"), "{client}");
    let inspect = gateway
        .admin(Method::GET, &format!("/v1/clients/both/{client}"), token)
        .await;
    assert_eq!(inspect.status, StatusCode::OK, "{}", inspect.text());
    let answer: Value = serde_json::from_slice(&inspect.body).unwrap();
    assert_eq!(answer["remaining"], 0, "{answer}");
    // Raw values cannot name a digest of several.
    let raw = gateway
        .admin(Method::GET, "/v1/clients/both/127.0.0.1+key:acme", token)
        .await;
    assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{}", raw.text());
    assert!(raw.text().contains("several sources"), "{}", raw.text());
    gateway.stop().await;
}

#[tokio::test]
async fn exempt_keys_name_the_value_of_a_rules_one_source() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.001"),
            ("KEY_BY", "cookie:session"),
            ("EXEMPT", "key:batch-job"),
        ],
    )
    .await;
    for _ in 0..3 {
        let reply = get_from(
            gateway.addr,
            ip("127.0.0.1"),
            "/",
            &[("cookie", "session=batch-job")],
        )
        .await;
        assert_eq!(seen(&reply), (200, None));
    }
    gateway.stop().await;
}

/// `EXEMPT` names a key's source: `query:tenant=acme` exempts that tenant, not `Host: acme` on
/// a route keyed `ip+host`, which any client sets. `key:acme`, which named no source, is
/// refused where rules are keyed by several, naming the spellings; an earlier version
/// exempted the value in every source.
#[tokio::test]
async fn exempt_keys_name_their_source() {
    let backend = Backend::start().await;
    let vars = [
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.001"),
        ("KEY_BY", "query:tenant"),
        ("ROUTES", "/site=token_bucket:1:0.001,key=ip+host,name=site"),
    ];
    let mut exempting = vars.to_vec();
    exempting.push(("EXEMPT", "query:tenant=acme"));
    let gateway = Gateway::start(&backend.url(), &exempting).await;
    let addr = gateway.addr;
    let send = |target: &'static str, host: &'static str| async move {
        seen(&get_from(addr, ip("127.0.0.1"), target, &[("host", host)]).await)
    };
    for _ in 0..3 {
        assert_eq!(send("/?tenant=acme", "a.example").await, (200, None));
    }
    assert_eq!(send("/?tenant=globex", "a.example").await, (200, Some(0)));
    assert_eq!(send("/site", "acme").await, (200, Some(0)));
    for _ in 0..3 {
        assert_eq!(send("/site", "acme").await, (429, Some(0)));
    }
    gateway.stop().await;
    let mut ambiguous = vars.to_vec();
    ambiguous.extend([("BACKEND_URL", "http://127.0.0.1:1"), ("EXEMPT", "key:acme")]);
    let error = tollgate::Config::from_vars(ambiguous.iter().copied())
        .expect_err("key:VALUE with two sources is refused")
        .to_string();
    assert!(
        error.starts_with("EXEMPT")
            && error.contains("ambiguous")
            && error.contains("query:tenant=VALUE")
            && error.contains("host=VALUE"),
        "{error}"
    );
    assert!(!error.contains("acme"), "the value is never shown: {error}");
}

/// The real binary on `store`: keyed by `ip+path+query:tenant`, one request sequence.
async fn binary(store: Store) -> Vec<(u16, Option<u64>)> {
    let redis = redis_for(store);
    let backend = Backend::start().await;
    let url = backend.url();
    let mut vars = vec![("BACKEND_URL", url.as_str())];
    vars.extend_from_slice(&[
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.001"),
        ("KEY_BY", "ip+path+query:tenant"),
    ]);
    let vars = with_store(store, &redis, &vars);
    let tollgate = Running::start(&borrowed(&vars));
    let mut seen_all = Vec::new();
    for target in [
        "/a?tenant=t1",
        "/a?tenant=t1",
        "/a?tenant=t2",
        "/b?tenant=t1",
        "/a",
        "/b",
    ] {
        seen_all.push(seen(&get_from(tollgate.addr, ip("127.0.0.1"), target, &[]).await));
    }
    assert!(tollgate.terminate().await.success());
    seen_all
}

#[tokio::test]
async fn the_binary_keys_by_several_sources_on_both_stores() {
    on_both_stores!(
        binary,
        vec![
            (200, Some(0)),
            (429, Some(0)),
            (200, Some(0)),
            (200, Some(0)),
            (200, Some(0)),
            (429, Some(0)),
        ]
    );
}

#[tokio::test]
async fn header_keys_in_redis_are_the_digest_of_the_value_alone() {
    // Budgets kept by earlier versions stay where they were: the key text of a `header:NAME`
    // rule is the keyed digest of the bare value, under the same secret.
    let redis = RedisServer::start();
    let backend = Backend::start().await;
    let addr = redis.addr();
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("REDIS_ADDR", addr.as_str()),
            ("KEY_BY", "header:X-API-Key"),
            ("KEY_HASH_SECRET", SECRET),
        ],
    )
    .await;
    get_from(
        gateway.addr,
        ip("127.0.0.1"),
        "/",
        &[("x-api-key", "sk_live_4242")],
    )
    .await;
    let digest = tollgate::rules::KeyHasher::from_secret(SECRET).digest(b"sk_live_4242");
    let keys = redis.cli(&["--scan"]);
    assert!(
        keys.trim()
            .starts_with(&format!("tollgate:{{general:key:{digest}}}:tb:")),
        "{keys}"
    );
    gateway.stop().await;
}

async fn over_http2(store: Store) -> Vec<(u16, Option<u64>)> {
    use http_body_util::Empty;
    use hyper::client::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let redis = redis_for(store);
    let backend = Backend::start().await;
    let mut vars = BUDGET.to_vec();
    vars.push(("KEY_BY", "ip+host+cookie:session"));
    let gateway = Gateway::start(&backend.url(), &borrowed(&with_store(store, &redis, &vars))).await;
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut seen_all = Vec::new();
    // :authority names the host; the cookie-string comes split into fields (RFC 9113 8.2.3).
    for (authority, cookies) in [
        ("app.example", &["session=s1"][..]),
        ("APP.example:80", &["theme=dark", "session=s1"][..]),
        ("other.example", &["session=s1"][..]),
    ] {
        let mut request = http::Request::get(format!("http://{authority}/"));
        for cookie in cookies {
            request = request.header("cookie", *cookie);
        }
        let response = sender
            .send_request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let remaining = response
            .headers()
            .get("x-ratelimit-remaining")
            .map(|value| value.to_str().unwrap().parse().unwrap());
        seen_all.push((response.status().as_u16(), remaining));
    }
    // The same client over HTTP/1.1, its Host the same host: the same budget.
    let reply = get_from(
        gateway.addr,
        ip("127.0.0.1"),
        "/",
        &[("host", "app.example"), ("cookie", "session=s1")],
    )
    .await;
    seen_all.push(seen(&reply));
    gateway.stop().await;
    seen_all
}

#[tokio::test]
async fn http2_requests_are_keyed_by_their_authority_and_split_cookies() {
    on_both_stores!(
        over_http2,
        vec![(200, Some(1)), (200, Some(0)), (200, Some(1)), (429, Some(0))]
    );
}
