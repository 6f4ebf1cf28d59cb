//! Per-client overrides (`OVERRIDES_FILE`) and tiers (`TIERS`, `TIER_HEADER`) through the real
//! binary, on both stores: the most specific override wins, `unlimited` and `deny` do what
//! they say, a tier is believed from a trusted proxy only, budgets under one set of limits are
//! never another's, and an edited overrides file is reloaded while serving.

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use http::StatusCode;

use crate::support::{Backend, Gateway, RedisServer, Reply, get_from};

/// A file of its own, rewritten by renaming a new one over it.
struct File(tempfile::NamedTempFile);

impl File {
    fn new(text: &str) -> File {
        let file = File(tempfile::Builder::new().suffix(".overrides").tempfile().unwrap());
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        let next = self.0.path().with_extension("next");
        let mut file = std::fs::File::create(&next).unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file.sync_all().unwrap();
        std::fs::rename(&next, self.0.path()).unwrap();
    }

    fn path(&self) -> &str {
        self.0.path().to_str().unwrap()
    }
}

const OVERRIDES: &str = "
# rule    client             what
general   key:sk_live_abc    token_bucket:5:0.001
general   127.0.0.0/8        token_bucket:3:0.001   # the loopback network
general   127.0.0.5          deny
general   127.0.0.6          unlimited
";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

async fn from(gateway: &Gateway, address: &str, headers: &[(&str, &str)]) -> Reply {
    get_from(gateway.addr, ip(address), "/", headers).await
}

/// How many of `n` requests pass, and the `X-RateLimit-Limit` of the first.
async fn passed(
    gateway: &Gateway,
    address: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> (usize, Option<u64>) {
    let mut limit = None;
    let mut passed = 0;
    for _ in 0..n {
        let reply = from(gateway, address, headers).await;
        limit = limit.or_else(|| {
            reply
                .header("x-ratelimit-limit")
                .map(|value| value.parse().unwrap())
        });
        passed += usize::from(reply.status == StatusCode::OK);
    }
    (passed, limit)
}

async fn overrides_on(store: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let file = File::new(OVERRIDES);
    let mut vars = vec![
        ("OVERRIDES_FILE", file.path()),
        ("KEY_BY", "header:X-API-Key"),
        ("KEY_HASH_SECRET", "a secret of at least sixteen bytes"),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
    ];
    vars.extend_from_slice(store);
    let gateway = Gateway::start(&backend.url(), &vars).await;
    // The API key's own override, before its address's network.
    let key = [("x-api-key", "sk_live_abc")];
    assert_eq!(passed(&gateway, "127.0.0.9", &key, 7).await, (5, Some(5)));
    // Another key from the network: the network's.
    let other = [("x-api-key", "sk_live_other")];
    assert_eq!(passed(&gateway, "127.0.0.9", &other, 5).await, (3, Some(3)));
    // The most specific network wins: deny, at once and for good, with no Retry-After.
    let denied = from(&gateway, "127.0.0.5", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.header("retry-after").is_none(), "no wait would lift it");
    assert!(denied.header("x-ratelimit-remaining").is_none());
    assert_eq!(denied.text(), r#"{"error":"rate limit exceeded"}"#);
    // Unlimited: never counted, never told about limits.
    for _ in 0..10 {
        let reply = from(&gateway, "127.0.0.6", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.header("x-ratelimit-remaining").is_none());
    }
}

#[tokio::test]
async fn overrides_in_memory() {
    overrides_on(&[]).await;
}

#[tokio::test]
async fn overrides_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    overrides_on(&[("REDIS_ADDR", addr.as_str()), ("REDIS_TIMEOUT_MS", "5000")]).await;
}

async fn tiers_on(store: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let mut vars = vec![
        (
            "TIERS",
            "free=token_bucket:1:0.001;pro=token_bucket:4:0.001+fixed_window:100:86400",
        ),
        ("TIER_HEADER", "X-Plan"),
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
        ("AUTH_MAX_TOKENS", "1"),
    ];
    vars.extend_from_slice(store);
    let gateway = Gateway::start_with_admin(&backend.url(), &vars).await;
    let client = [("x-forwarded-for", "203.0.113.7")];
    let pro = [("x-forwarded-for", "203.0.113.7"), ("x-plan", "pro")];
    let free = [("x-forwarded-for", "203.0.113.7"), ("x-plan", "free")];
    // From the trusted proxy the tier is believed; each set of limits is its own budget.
    assert_eq!(passed(&gateway, "127.0.0.1", &pro, 6).await, (4, Some(4)));
    assert_eq!(passed(&gateway, "127.0.0.1", &free, 3).await, (1, Some(1)));
    assert_eq!(
        passed(&gateway, "127.0.0.1", &client, 3).await,
        (2, Some(2)),
        "the rule's own budget, untouched by the tiers'"
    );
    let unknown = [("x-forwarded-for", "198.51.100.1"), ("x-plan", "enterprise")];
    assert_eq!(
        passed(&gateway, "127.0.0.1", &unknown, 3).await,
        (2, Some(2)),
        "an unknown tier"
    );
    // The auth rule keeps its own limits whatever the plan.
    let login = get_from(gateway.addr, ip("127.0.0.1"), "/login", &pro).await;
    assert_eq!(login.number("x-ratelimit-limit"), 1);
    // From anywhere else the header is ignored, and counted.
    let direct = [("x-plan", "pro")];
    assert_eq!(passed(&gateway, "127.0.0.3", &direct, 3).await, (2, Some(2)));
    assert_eq!(gateway.metric("tollgate_tier_header_untrusted_total").await, 3.0);
    let pro = gateway
        .metric(r#"tollgate_requests_total{rule="general@pro",decision="allowed"}"#)
        .await;
    assert_eq!(pro, 4.0, "a variant's own series");
}

#[tokio::test]
async fn tiers_in_memory() {
    tiers_on(&[]).await;
}

#[tokio::test]
async fn tiers_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    tiers_on(&[("REDIS_ADDR", addr.as_str()), ("REDIS_TIMEOUT_MS", "5000")]).await;
}

/// An authentication layer that appends `TIER_HEADER` rather than replacing it leaves the
/// client's own copy first: a tier named twice from a trusted proxy (two lines, or one merged
/// list) is refused with `400` on the proxy and forward-auth alike, as a repeated key header
/// is. An earlier version believed the first line: the client chose its plan.
#[tokio::test]
async fn a_tier_named_twice_by_a_trusted_proxy_is_refused() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_decide(
        Some(&backend.url()),
        &[
            ("TIERS", "free=token_bucket:1:0.001;pro=token_bucket:4:0.001"),
            ("TIER_HEADER", "X-Plan"),
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.001"),
        ],
    )
    .await;
    let free = [("x-forwarded-for", "203.0.113.7"), ("x-plan", "free")];
    assert_eq!(passed(&gateway, "127.0.0.1", &free, 2).await, (1, Some(1)));
    let appended = [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-plan", "pro"),
        ("x-plan", "free"),
    ];
    let merged = [("x-forwarded-for", "203.0.113.7"), ("x-plan", "pro, free")];
    for headers in [&appended[..], &merged] {
        for _ in 0..3 {
            let reply = from(&gateway, "127.0.0.1", headers).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
            assert!(reply.text().contains("x-plan"), "{}", reply.text());
        }
        let mut asked = vec![("x-forwarded-uri", "/api")];
        asked.extend_from_slice(headers);
        let reply = crate::support::request(
            gateway.decide.unwrap(),
            ip("127.0.0.1"),
            http::Method::GET,
            "/v1/forward-auth",
            &asked,
            bytes::Bytes::new(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    }
    // From a peer whose tier is never believed, the header is ignored as before.
    let direct = [("x-plan", "pro"), ("x-plan", "free")];
    assert_eq!(passed(&gateway, "127.0.0.3", &direct, 3).await, (2, Some(2)));
    assert_eq!(backend.seen().len(), 3);
    gateway.stop().await;
}

/// An edited overrides file is put in force while serving, through the rules' reload.
#[tokio::test]
async fn an_edited_overrides_file_is_reloaded() {
    let backend = Backend::start().await;
    let file = File::new("general 127.0.0.7 token_bucket:1:0.001\n");
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("OVERRIDES_FILE", file.path()),
            ("RULES_RELOAD_INTERVAL_MS", "50"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.001"),
        ],
    )
    .await;
    assert_eq!(passed(&gateway, "127.0.0.7", &[], 2).await, (1, Some(1)));
    file.write("general 127.0.0.7 unlimited\n");
    let mut unlimited = false;
    for _ in 0..200 {
        let reply = from(&gateway, "127.0.0.7", &[]).await;
        if reply.status == StatusCode::OK && reply.header("x-ratelimit-remaining").is_none() {
            unlimited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(unlimited, "the edit was never put in force");
    // A broken edit is refused; the overrides in force stay.
    file.write("general 127.0.0.7\n");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reply = from(&gateway, "127.0.0.7", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.header("x-ratelimit-remaining").is_none());
}
