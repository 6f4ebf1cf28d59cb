//! What a new operator hit, through the real binary: refusals a browser application can read
//! (CORS on the gateway's own answers), and denial lines that say where header-keyed requests
//! come from.

use crate::binary::Running;
use crate::support::{Backend, get_from};

#[tokio::test]
async fn the_gateways_own_answers_carry_cors_headers_and_the_backends_pass_untouched() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.01"),
        ("CORS_ALLOW_ORIGINS", "https://app.example.com"),
    ]);
    let from = "127.0.0.1".parse().unwrap();
    let app = [("origin", "https://app.example.com")];
    let allowed = get_from(tollgate.addr, from, "/", &app).await;
    assert_eq!(allowed.status, 200);
    assert_eq!(
        allowed.header("access-control-allow-origin"),
        None,
        "the backend's answer"
    );
    let refused = get_from(tollgate.addr, from, "/", &app).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(refused.header("vary"), Some("origin"));
    let exposed = refused.header("access-control-expose-headers").unwrap();
    for name in ["retry-after", "x-ratelimit-remaining", "ratelimit"] {
        assert!(exposed.contains(name), "{name} not exposed: {exposed}");
    }
    // An origin not listed gets nothing; a listed one gets them on every answer of the
    // gateway's own, a bad request's too.
    let foreign = get_from(tollgate.addr, from, "/", &[("origin", "https://evil.example")]).await;
    assert_eq!(foreign.status, 429);
    assert_eq!(foreign.header("access-control-allow-origin"), None);
    let bad = get_from(tollgate.addr, from, "/login%00", &app).await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
}

#[tokio::test]
async fn a_header_keyed_denial_line_names_the_peer_host_and_user_agent() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.01"),
        ("KEY_BY", "header:X-API-Key"),
        ("LOG_FORMAT", "json"),
    ]);
    let from = "127.0.0.3".parse().unwrap();
    let long_agent = format!("curl/8.0 {}", "x".repeat(200));
    let headers = [("x-api-key", "secret-key-1"), ("user-agent", long_agent.as_str())];
    assert_eq!(get_from(tollgate.addr, from, "/", &headers).await.status, 200);
    assert_eq!(
        get_from(tollgate.addr, from, "/a?token=hunter2", &headers)
            .await
            .status,
        429
    );
    let log = tollgate.log();
    let denial = log
        .lines()
        .find(|line| line.contains("request refused"))
        .unwrap_or_else(|| panic!("no denial line in\n{log}"));
    assert!(denial.contains(r#""client":"key:"#), "{denial}");
    assert!(denial.contains(r#""peer":"127.0.0.3:"#), "{denial}");
    assert!(denial.contains(r#""host":"gateway.test""#), "{denial}");
    let agent = format!(r#""user_agent":"curl/8.0 {}...""#, "x".repeat(119));
    assert!(denial.contains(&agent), "bounded at 128 characters: {denial}");
    assert!(denial.contains(r#""path":"/a""#), "{denial}");
    assert!(!log.contains("secret-key-1") && !log.contains("hunter2"), "{log}");
}
