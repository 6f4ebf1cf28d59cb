//! The decision endpoints on `DECIDE_PORT`: `/v1/forward-auth` and `POST /v1/check`, called
//! over real sockets as an ingress or a service would, in memory and against a real Redis.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::support::{Backend, Gateway, RedisServer, Reply, raw_status_line, request};

const PROXY: [u8; 4] = [127, 0, 0, 1];

/// A forward-auth call from `from` for the original request `uri` of `client`.
async fn forward_auth(gateway: &Gateway, from: [u8; 4], query: &str, uri: &str, client: &str) -> Reply {
    let path = format!("/v1/forward-auth{query}");
    let headers = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", uri),
        ("x-forwarded-host", "app.example"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-for", client),
    ];
    request(
        gateway.decide.unwrap(),
        IpAddr::from(from),
        Method::GET,
        &path,
        &headers,
        Bytes::new(),
    )
    .await
}

/// `POST /v1/check` with `body` (and `headers`).
async fn check(gateway: &Gateway, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request(
        gateway.decide.unwrap(),
        IpAddr::from(PROXY),
        Method::POST,
        "/v1/check",
        &all,
        Bytes::copy_from_slice(body.as_bytes()),
    )
    .await
}

fn json(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|_| panic!("not JSON: {}", reply.text()))
}

const LIMITS: &[(&str, &str)] = &[
    ("TRUSTED_PROXIES", "127.0.0.1"),
    ("MAX_TOKENS", "2"),
    ("REFILL_RATE", "0.001"),
    ("AUTH_MAX_TOKENS", "1"),
    ("AUTH_REFILL_RATE", "0.001"),
];

#[tokio::test]
async fn forward_auth_limits_each_forwarded_client_and_says_how() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    for remaining in ["1", "0"] {
        let reply = forward_auth(&gateway, PROXY, "", "/api/items?page=2", "203.0.113.7").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.header("x-ratelimit-limit"), Some("2"));
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(remaining));
    }
    let refused = forward_auth(&gateway, PROXY, "", "/api/items", "203.0.113.7").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.number("retry-after") >= 1);
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    // nginx's auth_request takes only 2xx, 401 and 403.
    let for_nginx = forward_auth(&gateway, PROXY, "?status=403", "/api/items", "203.0.113.7").await;
    assert_eq!(for_nginx.status, StatusCode::FORBIDDEN);
    assert!(for_nginx.number("retry-after") >= 1);
    // Another client, another budget: keyed by the forwarded address, not the proxy's.
    let other = forward_auth(&gateway, PROXY, "", "/api/items", "203.0.113.8").await;
    assert_eq!(other.status, StatusCode::OK);
    gateway.stop().await;
}

#[tokio::test]
async fn forward_auth_reads_the_path_as_the_proxy_does() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    assert_eq!(
        forward_auth(&gateway, PROXY, "", "/login", "203.0.113.7")
            .await
            .status,
        StatusCode::OK
    );
    // The same auth budget, however the path is spelt.
    for spelling in ["//login", "/static/../login", "/./login"] {
        let reply = forward_auth(&gateway, PROXY, "", spelling, "203.0.113.7").await;
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{spelling}: {}",
            reply.text()
        );
    }
    // A path backends could read two ways is refused before any budget is touched.
    for ambiguous in ["/a%3F/login", "/%2F/login", "/login#x"] {
        let reply = forward_auth(&gateway, PROXY, "", ambiguous, "203.0.113.9").await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{ambiguous}: {}",
            reply.text()
        );
    }
    gateway.stop().await;
}

#[tokio::test]
async fn forward_auth_refuses_peers_it_does_not_trust_and_requests_it_cannot_read() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    let untrusted = forward_auth(&gateway, [127, 0, 0, 2], "", "/api", "203.0.113.7").await;
    assert_eq!(untrusted.status, StatusCode::FORBIDDEN);
    assert!(
        untrusted.text().contains("TRUSTED_PROXIES"),
        "{}",
        untrusted.text()
    );
    let to = gateway.decide.unwrap();
    let from = IpAddr::from(PROXY);
    let no_target = request(
        to,
        from,
        Method::GET,
        "/v1/forward-auth",
        &[("x-forwarded-for", "203.0.113.7")],
        Bytes::new(),
    )
    .await;
    assert_eq!(no_target.status, StatusCode::BAD_REQUEST);
    assert!(
        no_target.text().contains("X-Forwarded-Uri"),
        "{}",
        no_target.text()
    );
    let no_client = request(
        to,
        from,
        Method::GET,
        "/v1/forward-auth",
        &[("x-forwarded-uri", "/api")],
        Bytes::new(),
    )
    .await;
    assert_eq!(no_client.status, StatusCode::BAD_REQUEST);
    assert!(
        no_client.text().contains("X-Forwarded-For"),
        "{}",
        no_client.text()
    );
    let bad_status = forward_auth(&gateway, PROXY, "?status=200", "/api", "203.0.113.7").await;
    assert_eq!(bad_status.status, StatusCode::BAD_REQUEST);
    let unknown = request(to, from, Method::GET, "/v2/other", &[], Bytes::new()).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    gateway.stop().await;
}

#[tokio::test]
async fn forward_auth_refuses_an_underscore_spelling_of_a_key_header() {
    let mut vars = LIMITS.to_vec();
    vars.push(("KEY_BY", "header:x-api-key"));
    let gateway = Gateway::start_decide(None, &vars).await;
    let to = gateway.decide.unwrap();
    let headers = [
        ("x-forwarded-uri", "/api"),
        ("x-forwarded-for", "203.0.113.7"),
        ("x_api_key", "other"),
    ];
    let reply = request(
        to,
        IpAddr::from(PROXY),
        Method::GET,
        "/v1/forward-auth",
        &headers,
        Bytes::new(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    gateway.stop().await;
}

/// From the calling proxy, an `X-Forwarded-For` element that is not an address where the
/// client's should be is refused (`400`), on forward-auth and `/v1/check` alike, never read as
/// the proxy (exempt here, as the docs' examples exempt the internal network); the client's
/// own garbage left of its address changes nothing. An earlier version took the proxy for
/// the client: every request allowed past an exhausted budget.
#[tokio::test]
async fn a_malformed_forwarded_for_never_makes_the_calling_proxy_the_client() {
    let mut vars = LIMITS.to_vec();
    vars.push(("EXEMPT", "127.0.0.1"));
    let gateway = Gateway::start_decide(None, &vars).await;
    for _ in 0..2 {
        let allowed = forward_auth(&gateway, PROXY, "", "/api", "203.0.113.7").await;
        assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.text());
    }
    let limited = forward_auth(&gateway, PROXY, "", "/api", "203.0.113.7").await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let call = |forwarded_for: &[u8]| {
        let mut request =
            b"GET /v1/forward-auth HTTP/1.1\r\nHost: tollgate\r\nX-Forwarded-Uri: /api\r\nX-Forwarded-For: "
                .to_vec();
        request.extend_from_slice(forwarded_for);
        request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let to = gateway.decide.unwrap();
        async move { raw_status_line(to, &request).await }
    };
    for _ in 0..5 {
        assert_eq!(call(b"\xff, 203.0.113.7").await, "HTTP/1.1 429 Too Many Requests");
    }
    for unreadable in [
        &b"\xff"[..],
        b"203.0.113.7, \xff",
        b"unknown",
        b"203.0.113.7, bogus",
    ] {
        assert_eq!(
            call(unreadable).await,
            "HTTP/1.1 400 Bad Request",
            "{unreadable:?}"
        );
    }
    // /v1/check, whose client_ip is the proxy's: its X-Forwarded-For walked the same way.
    let describe = |forwarded_for: &str| {
        serde_json::json!({
            "path": "/api",
            "client_ip": "127.0.0.1",
            "headers": { "x-forwarded-for": forwarded_for },
        })
        .to_string()
    };
    let appended = json(&check(&gateway, &[], &describe("\u{ff}, 203.0.113.7")).await);
    assert_eq!(
        (appended["allowed"].as_bool(), appended["outcome"].as_str()),
        (Some(false), Some("limited")),
        "{appended}"
    );
    for unreadable in ["\u{ff}", "203.0.113.7, unknown"] {
        let reply = check(&gateway, &[], &describe(unreadable)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
        let error = json(&reply);
        assert_eq!(error["field"], "headers", "{error}");
        assert!(
            error["error"].as_str().unwrap().contains("X-Forwarded-For"),
            "{error}"
        );
    }
    gateway.stop().await;
}

/// `/v1/check`'s `headers` naming one header twice to some backend (`x_api_key` beside
/// `x-api-key`, two cases of one name, one name twice in the JSON) or an underscore spelling
/// of a key header: `400` naming the field, as forward-auth refuses them. An earlier version
/// read one copy (the JSON's last) and answered.
#[tokio::test]
async fn check_refuses_a_header_sent_twice_in_any_spelling() {
    let mut vars = LIMITS.to_vec();
    vars.push(("KEY_BY", "header:X-API-Key"));
    let gateway = Gateway::start_decide(None, &vars).await;
    let describe =
        |headers: &str| format!(r#"{{"path": "/api", "client_ip": "203.0.113.7", "headers": {headers}}}"#);
    let victim = describe(r#"{"x-api-key": "victim"}"#);
    for allowed in [true, true, false] {
        assert_eq!(json(&check(&gateway, &[], &victim).await)["allowed"], allowed);
    }
    for headers in [
        r#"{"x_api_key": "fresh-1", "x-api-key": "victim"}"#,
        r#"{"x-api-key": "victim", "X_API_KEY": "fresh-2"}"#,
        r#"{"X-API-Key": "fresh-3", "x-api-key": "victim"}"#,
        r#"{"x-api-key": "fresh-4", "x-api-key": "victim"}"#,
        r#"{"x_api_key": "victim"}"#,
    ] {
        let reply = check(&gateway, &[], &describe(headers)).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{headers}: {}",
            reply.text()
        );
        assert_eq!(json(&reply)["field"], "headers", "{headers}");
    }
    gateway.stop().await;
}

#[tokio::test]
async fn every_door_reads_a_method_as_the_loosest_backend_does() {
    let mut vars = LIMITS.to_vec();
    vars.push((
        "ROUTES",
        "/items/*=fixed_window:1:3600,method=DELETE,name=delete;/wp-login.php=fixed_window:1:3600,name=wp",
    ));
    let gateway = Gateway::start_decide(None, &vars).await;
    let to = gateway.decide.unwrap();
    let forward_auth =
        |method: &'static str, uri: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut headers = vec![
                ("x-forwarded-method", method),
                ("x-forwarded-uri", uri),
                ("x-forwarded-for", "203.0.113.7"),
            ];
            headers.extend(extra);
            async move {
                request(
                    to,
                    IpAddr::from(PROXY),
                    Method::GET,
                    "/v1/forward-auth",
                    &headers,
                    Bytes::new(),
                )
                .await
            }
        };
    let ratelimit = |reply: &Reply| reply.header("x-ratelimit-limit").map(str::to_owned);
    // The DELETE route's one request, then every other reading of DELETE is refused by it.
    let first = forward_auth("DELETE", "/items/1", None).await;
    assert_eq!(
        (first.status, ratelimit(&first).as_deref()),
        (StatusCode::OK, Some("1"))
    );
    let reply = forward_auth("delete", "/items/1", None).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // A POST that asks to be read as DELETE picks another route than a POST does: which one
    // the backend runs is its own choice, so neither budget is spent.
    for extra in [("x-http-method-override", "DELETE"), ("x-http-method", "delete")] {
        let reply = forward_auth("POST", "/items/1", Some(extra)).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{extra:?}: {}",
            reply.text()
        );
    }
    // A backend reads the underscore spelling as the header: refused, as for a key header.
    let alias = forward_auth("POST", "/items/1", Some(("x_http_method_override", "DELETE"))).await;
    assert_eq!(alias.status, StatusCode::BAD_REQUEST, "{}", alias.text());
    // PATH_INFO: /wp-login.php/x is the script /wp-login.php.
    assert_eq!(
        forward_auth("POST", "/wp-login.php", None).await.status,
        StatusCode::OK
    );
    let path_info = forward_auth("POST", "/wp-login.php/x", None).await;
    assert_eq!(path_info.status, StatusCode::TOO_MANY_REQUESTS);

    // /v1/check classifies alike.
    let upper = r#"{"method": "DELETE", "path": "/items/2", "client_ip": "203.0.113.8"}"#;
    let first = json(&check(&gateway, &[], upper).await);
    assert_eq!(
        (first["rule"].as_str(), first["allowed"].as_bool()),
        (Some("delete"), Some(true))
    );
    let described = r#"{"method": "post", "path": "/items/2", "client_ip": "203.0.113.8", "headers": {"x-http-method-override": "delete"}}"#;
    let overridden = check(&gateway, &[], described).await;
    assert_eq!(
        overridden.status,
        StatusCode::BAD_REQUEST,
        "{}",
        overridden.text()
    );
    let lower = r#"{"method": "delete", "path": "/items/2", "client_ip": "203.0.113.8"}"#;
    let second = json(&check(&gateway, &[], lower).await);
    assert_eq!(
        (second["rule"].as_str(), second["allowed"].as_bool()),
        (Some("delete"), Some(false))
    );
    let script = r#"{"method": "POST", "path": "/wp-login.php/y", "client_ip": "203.0.113.8"}"#;
    assert_eq!(json(&check(&gateway, &[], script).await)["rule"], "wp");
    gateway.stop().await;
}

#[tokio::test]
async fn check_answers_a_named_client_whether_allowed_or_not() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    let body = r#"{"rule": "general", "key": "user-7"}"#;
    let first = check(&gateway, &[], body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let answer = json(&first);
    assert_eq!(answer["allowed"], true);
    assert_eq!(answer["rule"], "general");
    assert_eq!(answer["limit"], 2);
    assert_eq!(answer["remaining"], 1);
    assert_eq!(answer["retry_after_s"], Value::Null);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    let spent = json(
        &check(
            &gateway,
            &[],
            r#"{"rule": "general", "key": "user-7", "cost": 1}"#,
        )
        .await,
    );
    assert_eq!(spent["remaining"], 0);
    let refused = check(&gateway, &[], body).await;
    assert_eq!(refused.status, StatusCode::OK);
    let answer = json(&refused);
    assert_eq!(answer["allowed"], false);
    assert_eq!(answer["outcome"], "limited");
    assert!(answer["retry_after_s"].as_u64().unwrap() >= 1);
    assert!(answer["reset_after_ms"].as_u64().unwrap() > 0);
    // Another key, another budget.
    assert_eq!(
        json(&check(&gateway, &[], r#"{"rule": "general", "key": "user-8"}"#).await)["allowed"],
        true
    );
    gateway.stop().await;
}

#[tokio::test]
async fn check_classifies_a_described_request_as_the_proxy_would() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    let login = r#"{"method": "POST", "path": "/login", "client_ip": "203.0.113.7"}"#;
    let first = json(&check(&gateway, &[], login).await);
    assert_eq!(
        (first["rule"].as_str(), first["allowed"].as_bool()),
        (Some("auth"), Some(true))
    );
    let again = r#"{"method": "POST", "path": "//login?next=/", "client_ip": "203.0.113.7", "headers": {"user-agent": "x"}}"#;
    let second = json(&check(&gateway, &[], again).await);
    assert_eq!(
        (second["rule"].as_str(), second["allowed"].as_bool()),
        (Some("auth"), Some(false))
    );
    gateway.stop().await;
}

#[tokio::test]
async fn check_names_the_field_of_a_bad_body() {
    let gateway = Gateway::start_decide(None, LIMITS).await;
    let big = format!(r#"{{"rule": "general", "key": "{}"}}"#, "k".repeat(70_000));
    for (body, field, says) in [
        (
            r#"{"rule": "generl", "key": "a"}"#,
            Some("rule"),
            "did you mean \"general\"",
        ),
        (r#"{"rule": "general"}"#, Some("key"), "key is required"),
        (
            r#"{"rule": "general", "key": "a", "cost": 3}"#,
            Some("cost"),
            "out of range",
        ),
        (
            r#"{"rule": "general", "key": "a", "cost": 0}"#,
            Some("cost"),
            "out of range",
        ),
        (
            r#"{"rule": "general", "key": "a", "kost": 1}"#,
            Some("kost"),
            "unknown field `kost`",
        ),
        (
            r#"{"rule": "general", "key": "a", "cost": "two"}"#,
            Some("cost"),
            "invalid type",
        ),
        (
            r#"{"rule": "general", "key": "a", "path": "/x"}"#,
            None,
            "not both",
        ),
        (
            r#"{"path": "/x", "client_ip": "nope"}"#,
            Some("client_ip"),
            "IP address",
        ),
        (
            r#"{"path": "x", "client_ip": "203.0.113.7"}"#,
            Some("path"),
            "starts with /",
        ),
        (
            r#"{"path": "/a%3F/x", "client_ip": "203.0.113.7"}"#,
            Some("path"),
            "",
        ),
        ("not json", Some("body"), "not a JSON question"),
        ("{}", None, "empty question"),
        (big.as_str(), Some("body"), "larger than"),
    ] {
        let reply = check(&gateway, &[], body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body:.80}: {}",
            reply.text()
        );
        let error = json(&reply);
        assert_eq!(error["field"].as_str(), field, "{body:.80}: {error}");
        assert!(
            error["error"].as_str().unwrap().contains(says),
            "{body:.80}: {error}"
        );
    }
    let to = gateway.decide.unwrap();
    let get = request(
        to,
        IpAddr::from(PROXY),
        Method::GET,
        "/v1/check",
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(get.header("allow"), Some("POST"));
    gateway.stop().await;
}

#[tokio::test]
async fn check_requires_the_token_when_one_is_set() {
    let token = "0123456789abcdef0123456789abcdef";
    let mut vars = LIMITS.to_vec();
    vars.push(("DECIDE_TOKEN", token));
    let gateway = Gateway::start_decide(None, &vars).await;
    let body = r#"{"rule": "general", "key": "user-7"}"#;
    let bearer = format!("Bearer {token}");
    let wrong = format!("Bearer {}x", &token[..31]);
    for (headers, status) in [
        (vec![], StatusCode::UNAUTHORIZED),
        (vec![("authorization", wrong.as_str())], StatusCode::UNAUTHORIZED),
        (vec![("authorization", token)], StatusCode::UNAUTHORIZED),
        (vec![("authorization", bearer.as_str())], StatusCode::OK),
    ] {
        let reply = check(&gateway, &headers, body).await;
        assert_eq!(reply.status, status, "{headers:?}: {}", reply.text());
    }
    gateway.stop().await;
}

#[tokio::test]
async fn the_proxy_and_the_decision_endpoints_share_one_budget() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_decide(
        Some(&backend.url()),
        &[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.001")],
    )
    .await;
    let described = r#"{"path": "/api", "client_ip": "127.0.0.1"}"#;
    assert_eq!(json(&check(&gateway, &[], described).await)["remaining"], 1);
    assert_eq!(
        crate::support::get(gateway.addr, "/api").await.status,
        StatusCode::OK
    );
    assert_eq!(
        crate::support::get(gateway.addr, "/api").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    gateway.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn decision_services_sharing_a_redis_enforce_one_exact_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("MAX_TOKENS", "4"),
        ("REFILL_RATE", "0.001"),
        ("KEY_HASH_SECRET", "shared-secret-for-the-test"),
    ];
    let (a, b) = (
        Gateway::start_decide(None, &vars).await,
        Gateway::start_decide(None, &vars).await,
    );
    let body = r#"{"rule": "general", "key": "tenant-1"}"#;
    let mut allowed = 0;
    for i in 0..10 {
        let gateway = if i % 2 == 0 { &a } else { &b };
        if json(&check(gateway, &[], body).await)["allowed"] == true {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 4);
    a.stop().await;
    b.stop().await;
}

/// A decision service (no `BACKEND_URL`) logs its refusals at `info` as the proxy does, with
/// the client as `/v1/limited` names it, on every door; `ACCESS_LOG=all` every decision, and
/// `off` none. (Refusals were logged at `debug` only, and `ACCESS_LOG` was ignored.)
#[tokio::test]
async fn the_decision_service_logs_refusals_and_honours_access_log() {
    use crate::binary::Running;
    for access_log in ["denied", "all", "off"] {
        let tollgate = Running::start_decide(&[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.001"),
            ("ACCESS_LOG", access_log),
        ]);
        let headers = [
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/orders"),
            ("x-forwarded-host", "app.example"),
            ("x-forwarded-for", "203.0.113.9"),
        ];
        for expected in [200, 429] {
            let reply = request(
                tollgate.addr,
                IpAddr::from(PROXY),
                Method::GET,
                "/v1/forward-auth",
                &headers,
                Bytes::new(),
            )
            .await;
            assert_eq!(reply.status, expected, "{}", reply.text());
        }
        for allowed in [true, false] {
            let reply = request(
                tollgate.addr,
                IpAddr::from(PROXY),
                Method::POST,
                "/v1/check",
                &[("content-type", "application/json")],
                Bytes::from_static(br#"{"rule": "general", "key": "tenant-3"}"#),
            )
            .await;
            assert_eq!(json(&reply)["allowed"], allowed, "{}", reply.text());
        }
        let mut log = tollgate.log();
        for _ in 0..100 {
            if access_log == "off" || log.matches("door=\"check\"").count() >= 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            log = tollgate.log();
        }
        let refused: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("request refused"))
            .collect();
        let allowed = log
            .lines()
            .filter(|line| line.contains(" request ") || line.ends_with(" request"))
            .filter(|line| line.contains("decision=\"allowed\""))
            .count();
        match access_log {
            "off" => assert!(refused.is_empty() && allowed == 0, "{log}"),
            _ => {
                assert_eq!(refused.len(), 2, "{log}");
                let auth = refused
                    .iter()
                    .find(|line| line.contains("door=\"forward-auth\""))
                    .unwrap_or_else(|| panic!("{log}"));
                assert!(
                    auth.contains("INFO")
                        && auth.contains("client=203.0.113.9")
                        && auth.contains("path=\"/orders\"")
                        && auth.contains("rule=\"general\"")
                        && auth.contains("decision=\"limited\"")
                        && auth.contains("status=429"),
                    "{auth}"
                );
                let check = refused
                    .iter()
                    .find(|line| line.contains("door=\"check\""))
                    .unwrap();
                assert!(
                    check.contains("client=key:") && check.contains("retry_after_s="),
                    "{check}"
                );
                assert_eq!(allowed, if access_log == "all" { 2 } else { 0 }, "{log}");
            }
        }
        tollgate.terminate().await;
    }
}

/// One state, one answer: a client through the proxy, one through forward-auth and one named to
/// `/v1/check`, each sending the same three requests under the same rule, are told the same
/// budget in the same headers (both sets) and the same `Retry-After`: every door answers an
/// admission through the gate's one mapping.
#[tokio::test]
async fn every_door_tells_one_state_with_the_same_headers() {
    let backend = Backend::start().await;
    let vars = [
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.01"),
        ("RATE_LIMIT_HEADERS", "both"),
    ];
    let gateway = Gateway::start_decide(Some(&backend.url()), &vars).await;
    const TOLD: [&str; 5] = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "ratelimit-policy",
        "ratelimit",
        "retry-after",
    ];
    let told = |reply: &Reply| TOLD.map(|name| reply.header(name).map(str::to_owned));
    let mut proxied = Vec::new();
    let mut authorised = Vec::new();
    let mut checked = Vec::new();
    for _ in 0..3 {
        proxied.push(
            request(
                gateway.addr,
                IpAddr::from([127, 0, 0, 2]),
                Method::GET,
                "/api/items",
                &[],
                Bytes::new(),
            )
            .await,
        );
        authorised.push(forward_auth(&gateway, PROXY, "", "/api/items", "203.0.113.70").await);
        checked.push(check(&gateway, &[], r#"{"rule":"general","key":"one-state"}"#).await);
    }
    let statuses = |replies: &[Reply]| replies.iter().map(|reply| reply.status).collect::<Vec<_>>();
    let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses(&proxied), [ok, ok, limited]);
    assert_eq!(statuses(&authorised), [ok, ok, limited]);
    // The decision, not the refusal: 200, and `allowed` says it.
    assert_eq!(statuses(&checked), [ok, ok, ok]);
    let allowed: Vec<Value> = checked
        .iter()
        .map(|reply| json(reply)["allowed"].clone())
        .collect();
    assert_eq!(allowed, [true, true, false]);
    for (i, proxied) in proxied.iter().enumerate() {
        let expected = told(proxied);
        assert!(expected[..4].iter().all(Option::is_some), "{expected:?}");
        assert_eq!(told(&authorised[i]), expected, "forward-auth, request {i}");
        // The JSON answer's numbers are the headers' too.
        assert_eq!(told(&checked[i])[..4], expected[..4], "/v1/check, request {i}");
        assert_eq!(
            json(&checked[i])["remaining"].as_u64().map(|n| n.to_string()),
            expected[1],
            "/v1/check's body, request {i}"
        );
    }
    let retry_after = proxied[2].number("retry-after");
    assert!((99..=100).contains(&retry_after), "{retry_after}");
    assert_eq!(json(&checked[2])["retry_after_s"], retry_after);
    backend.stop().await;
}
