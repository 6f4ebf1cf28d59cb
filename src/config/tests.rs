use super::*;
use crate::algorithms::{FixedWindow, Policy, SlidingLog, SlidingWindow, TokenBucket};
use crate::proxy::headers::MethodOverride;
use crate::rules::{FailMode, KeyBy, Mode, RequestHead};
use crate::server::limits::PerClientCap;
use crate::stores::RedisTarget;
use crate::telemetry::LogFormat;
use http::uri::Scheme;
use http::{HeaderMap, Method};
use std::num::NonZeroUsize;

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut all = vec![("BACKEND_URL", "http://127.0.0.1:8000")];
    all.extend_from_slice(vars);
    Config::from_vars(all)
}

fn error(vars: &[(&str, &str)]) -> String {
    parse(vars).expect_err("should be rejected").to_string()
}

fn general(config: &Config) -> &crate::rules::Rule {
    config.gate.rules.rule("general").expect("a general rule")
}

fn auth(config: &Config) -> &crate::rules::Rule {
    config.gate.rules.rule("auth").expect("an auth rule")
}

/// The rule name, mode and cost a GET of `path` from 192.0.2.1 is classified under.
fn classify(config: &Config, method: &str, path: &str) -> (String, Mode, u64) {
    let head = RequestHead {
        method: &Method::from_bytes(method.as_bytes()).unwrap(),
        path,
        query: None,
        authority: None,
        headers: &HeaderMap::new(),
        client_ip: "192.0.2.1".parse().unwrap(),
        trusted: false,
    };
    let matched = config.gate.rules.classify(&head).unwrap();
    (matched.rule.name.to_string(), matched.mode, matched.cost)
}

#[test]
fn the_admin_listener_is_on_loopback_unless_admin_bind_says_otherwise() {
    let admin = |vars: &[(&str, &str)]| parse(vars).map(|config| config.admin.address.to_string());
    assert_eq!(admin(&[]).unwrap(), "127.0.0.1:9091");
    assert_eq!(admin(&[("BIND", "0.0.0.0")]).unwrap(), "127.0.0.1:9091");
    assert_eq!(
        admin(&[("ADMIN_BIND", "0.0.0.0"), ("ADMIN_PORT", "9100")]).unwrap(),
        "0.0.0.0:9100"
    );
    assert_eq!(admin(&[("ADMIN_BIND", "::")]).unwrap(), "[::]:9091");
    // One port on two addresses that overlap: the second bind would fail, so it is refused here.
    for vars in [
        &[("PORT", "9091")][..],
        &[("PORT", "9091"), ("BIND", "127.0.0.1")],
        &[("PORT", "9091"), ("ADMIN_BIND", "0.0.0.0"), ("BIND", "10.0.0.5")],
    ] {
        let error = admin(vars).unwrap_err().to_string();
        assert!(error.contains("ADMIN_PORT=9091 is PORT too"), "{vars:?}: {error}");
    }
    assert_eq!(
        admin(&[("PORT", "9091"), ("BIND", "10.0.0.5")]).unwrap(),
        "127.0.0.1:9091",
        "two addresses of their own may share a port number"
    );
}

#[test]
fn defaults_match_the_go_service() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.server.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(
        *general(&config).limits.first(),
        Policy::TokenBucket(TokenBucket {
            capacity: 10,
            interval_us: 1_000_000
        })
    );
    assert_eq!(
        *auth(&config).limits.first(),
        Policy::TokenBucket(TokenBucket {
            capacity: 5,
            interval_us: 100_000_000
        })
    );
    assert_eq!(
        config.gate.rules.paths_of("auth"),
        "/login,/signup,/reset-password"
    );
    assert!(config.gate.trusted_proxies.is_empty());
    assert_eq!(config.store.max_keys.get(), 100_000);
    assert_eq!(config.log.format, LogFormat::Text);
    assert_eq!(
        config.proxy.as_ref().unwrap().backend_timeout,
        Duration::from_secs(30)
    );
    assert_eq!(config.store.kind, StoreConfig::Memory);
    assert_eq!(config.proxy.as_ref().unwrap().backend.base_path, "");
}

#[test]
fn sliding_window_reads_only_its_own_variables() {
    let config = parse(&[
        ("ALGORITHM", "sliding_window"),
        ("LIMIT", "100"),
        ("WINDOW_SIZE", "0.5"),
        ("AUTH_LIMIT", "3"),
        ("MAX_TOKENS", "50"),
    ])
    .unwrap();
    assert!(!config.read.contains("MAX_TOKENS"));
    assert_eq!(
        *general(&config).limits.first(),
        Policy::SlidingWindow(SlidingWindow {
            limit: 100,
            window_ms: 500
        })
    );
    assert_eq!(
        *auth(&config).limits.first(),
        Policy::SlidingWindow(SlidingWindow {
            limit: 3,
            window_ms: 60_000
        })
    );
}

#[test]
fn lists_are_trimmed_and_empty_values_are_unset() {
    let config = parse(&[
        ("AUTH_PATHS", " /a , /b/* ,,"),
        ("TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7 ,::1"),
        ("PORT", ""),
    ])
    .unwrap();
    assert_eq!(config.gate.rules.paths_of("auth"), "/a,/b/*");
    let proxies: Vec<String> = config
        .gate
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(proxies, ["10.0.0.0/8", "192.168.1.7/32", "::1/128"]);
    assert_eq!(config.server.listen.port(), 8080);
}

#[test]
fn every_error_names_its_variable_and_value() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("ALGORITHM", "leaky")], "ALGORITHM=\"leaky\""),
        (&[("MAX_TOKENS", "ten")], "MAX_TOKENS=\"ten\""),
        (&[("MAX_TOKENS", "0")], "MAX_TOKENS=\"0\""),
        (&[("MAX_TOKENS", "-3")], "MAX_TOKENS=\"-3\""),
        (&[("REFILL_RATE", "0")], "REFILL_RATE=\"0\""),
        (&[("REFILL_RATE", "-1")], "REFILL_RATE=\"-1\""),
        (&[("REFILL_RATE", "NaN")], "REFILL_RATE=\"NaN\""),
        (&[("REFILL_RATE", "5000000")], "REFILL_RATE=\"5000000\""),
        (&[("REFILL_RATE", "1500000")], "REFILL_RATE=\"1500000\""),
        (
            &[("ALGORITHM", "sliding_window"), ("WINDOW_SIZE", "0.0005")],
            "WINDOW_SIZE=\"0.0005\"",
        ),
        (&[("AUTH_REFILL_RATE", "x")], "AUTH_REFILL_RATE=\"x\""),
        (
            &[("ALGORITHM", "sliding_window"), ("WINDOW_SIZE", "0")],
            "WINDOW_SIZE=\"0\"",
        ),
        (
            &[("ALGORITHM", "sliding_window"), ("AUTH_LIMIT", "1.5")],
            "AUTH_LIMIT=\"1.5\"",
        ),
        (&[("BACKEND_URL", "not a url")], "BACKEND_URL=\"not a url\""),
        (&[("BACKEND_URL", "ftp://x")], "BACKEND_URL=\"ftp://x\""),
        (
            &[
                ("BACKEND_URL", "https://x"),
                ("BACKEND_TLS_SERVER_NAME", "not a name"),
            ],
            "BACKEND_TLS_SERVER_NAME=\"not a name\"",
        ),
        (
            &[("BACKEND_URL", "127.0.0.1:8000")],
            "BACKEND_URL=\"127.0.0.1:8000\"",
        ),
        (&[("PORT", "70000")], "PORT=\"70000\""),
        (&[("BIND", "localhost")], "BIND=\"localhost\""),
        (
            &[("TRUSTED_PROXIES", "10.0.0.0/33")],
            "TRUSTED_PROXIES=\"10.0.0.0/33\"",
        ),
        (&[("AUTH_PATHS", "login")], "AUTH_PATHS=\"login\""),
        (&[("AUTH_ALGORITHM", "leaky")], "AUTH_ALGORITHM=\"leaky\""),
        (&[("KEY_BY", "cookie")], "KEY_BY=\"cookie\""),
        (&[("IPV6_PREFIX", "129")], "IPV6_PREFIX=\"129\""),
        (&[("SHADOW_MODE", "yes")], "SHADOW_MODE=\"yes\""),
        (&[("AUTH_COUNT", "some")], "AUTH_COUNT=\"some\""),
        (&[("RATE_LIMIT_HEADERS", "ietf")], "RATE_LIMIT_HEADERS=\"ietf\""),
        (
            &[("ALGORITHM", "sliding_log"), ("LIMIT", "10001")],
            "LIMIT=\"10001\"",
        ),
        (&[("MAX_KEYS", "0")], "MAX_KEYS=\"0\""),
        (&[("MAX_KEYS", "1000000001")], "MAX_KEYS=\"1000000001\""),
        // Room for MAX_KEYS clients in each of the two rules.
        (&[("MAX_KEYS", "600000000")], "MAX_KEYS=\"600000000\""),
        (
            &[("UPGRADE_PROTOCOLS", "websocket,h2c")],
            "UPGRADE_PROTOCOLS=\"websocket,h2c\"",
        ),
        (
            &[("UPGRADE_PROTOCOLS", "web socket")],
            "UPGRADE_PROTOCOLS=\"web socket\"",
        ),
        (&[("UNDERSCORE_HEADERS", "yes")], "UNDERSCORE_HEADERS=\"yes\""),
        (&[("LOG_FORMAT", "xml")], "LOG_FORMAT=\"xml\""),
        (&[("BACKEND_TIMEOUT_MS", "1s")], "BACKEND_TIMEOUT_MS=\"1s\""),
        (&[("REDIS_ADDR", "nohost")], "REDIS_ADDR=\"nohost\""),
        (
            &[("REDIS_ADDR", "h:1"), ("FAIL_MODE", "maybe")],
            "FAIL_MODE=\"maybe\"",
        ),
        (
            &[("REDIS_ADDR", "h:1"), ("REDIS_CALLS_IN_FLIGHT", "1025")],
            "REDIS_CALLS_IN_FLIGHT=\"1025\"",
        ),
        (
            &[("REDIS_ADDR", "h:1"), ("REDIS_TIMEOUT_MS", "0")],
            "REDIS_TIMEOUT_MS=\"0\"",
        ),
        (
            &[("REDIS_ADDR", "h:1"), ("KEY_PREFIX", "a{b}")],
            "KEY_PREFIX=\"a{b}\"",
        ),
        (&[("REDIS_CLUSTER_NODES", "a:1,b")], "REDIS_CLUSTER_NODES=\"b\""),
    ];
    for (vars, expected) in cases {
        let message = error(vars);
        assert!(
            message.starts_with(expected),
            "{vars:?}: got {message:?}, want it to start with {expected}"
        );
        assert!(
            message.contains("expected"),
            "{vars:?}: {message:?} should say what is accepted"
        );
    }
}

#[test]
fn missing_backend_is_named() {
    let message = Config::from_vars(Vec::<(String, String)>::new())
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("BACKEND_URL is required"), "{message}");
}

#[test]
fn redis_secrets_never_appear_in_errors_or_output() {
    let message = error(&[("REDIS_URL", "mysql://root:hunter2@db")]);
    assert!(message.starts_with("REDIS_URL is invalid"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");

    let config = parse(&[("REDIS_URL", "redis://:hunter2@db:6379/2")]).unwrap();
    let shown = format!("{config} {config:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("redis://:***@db:6379/2"), "{shown}");

    let config = parse(&[("REDIS_ADDR", "db:6379"), ("REDIS_PASSWORD", "p@ss word")]).unwrap();
    let StoreConfig::Redis(redis) = &config.store.kind else {
        panic!("redis store expected")
    };
    assert_eq!(
        redis.target,
        RedisTarget::Single("redis://:p%40ss%20word@db:6379".into())
    );
    assert!(!format!("{config} {config:?}").contains("p%40ss"));
}

#[test]
fn redis_settings() {
    let config = parse(&[
        ("REDIS_CLUSTER_NODES", "a:7000, b:7001"),
        ("FAIL_MODE", "closed"),
        ("KEY_PREFIX", "rl:"),
    ])
    .unwrap();
    let StoreConfig::Redis(redis) = &config.store.kind else {
        panic!("redis store expected")
    };
    assert_eq!(
        redis.target,
        RedisTarget::Cluster {
            nodes: vec!["a:7000".into(), "b:7001".into()],
            password: None,
            tls: false,
        }
    );
    assert_eq!(redis.key_prefix, "rl:");
    assert_eq!(redis.timeout, Duration::from_millis(50));
    assert_eq!(general(&config).fail_mode, FailMode::Closed);
    assert!(error(&[("REDIS_ADDR", "a:1"), ("REDIS_URL", "redis://b")]).contains("only one of"));
    let config = parse(&[("REDIS_URL", "rediss://:pw@cache.internal:6380/1")]).unwrap();
    let StoreConfig::Redis(redis) = config.store.kind else {
        panic!("redis store expected")
    };
    assert_eq!(redis.target.redacted(), "rediss://:***@cache.internal:6380/1");
}

#[test]
fn redis_sentinel_settings() {
    let config = parse(&[
        ("REDIS_SENTINELS", "s1:26379, s2:26379,s3:26379"),
        ("REDIS_SENTINEL_MASTER", "mymaster"),
        ("REDIS_PASSWORD", "hunter2"),
        ("REDIS_SENTINEL_PASSWORD", "hunter3"),
        ("REDIS_TLS", "true"),
    ])
    .unwrap();
    let StoreConfig::Redis(redis) = &config.store.kind else {
        panic!("redis store expected")
    };
    assert_eq!(
        redis.target,
        RedisTarget::Sentinel {
            sentinels: vec!["s1:26379".into(), "s2:26379".into(), "s3:26379".into()],
            master: "mymaster".into(),
            password: Some("hunter2".into()),
            sentinel_password: Some("hunter3".into()),
            tls: true,
        }
    );
    let shown = format!("{config} {config:?} {}", redis.target.redacted());
    assert!(!shown.contains("hunter"), "{shown}");
    assert!(
        shown.contains("sentinel master mymaster via s1:26379,s2:26379,s3:26379 (TLS)"),
        "{shown}"
    );

    let message = error(&[("REDIS_SENTINELS", "s1:26379")]);
    assert!(
        message.starts_with("REDIS_SENTINEL_MASTER is required"),
        "{message}"
    );
    let message = error(&[("REDIS_SENTINELS", "s1"), ("REDIS_SENTINEL_MASTER", "m")]);
    assert!(
        message.starts_with("REDIS_SENTINELS=\"s1\" is invalid"),
        "{message}"
    );
    let message = error(&[("REDIS_SENTINELS", " , "), ("REDIS_SENTINEL_MASTER", "m")]);
    assert!(message.starts_with("REDIS_SENTINELS"), "{message}");
    let message = error(&[
        ("REDIS_SENTINELS", "s1:1"),
        ("REDIS_SENTINEL_MASTER", "my master"),
    ]);
    assert!(message.starts_with("REDIS_SENTINEL_MASTER"), "{message}");
    let message = error(&[
        ("REDIS_SENTINELS", "s1:26379"),
        ("REDIS_SENTINEL_MASTER", "m"),
        ("REDIS_ADDR", "db:6379"),
    ]);
    assert!(
        message.contains("only one of") && message.contains("REDIS_SENTINELS"),
        "{message}"
    );
    let message = error(&[
        ("REDIS_SENTINELS", "s1:26379"),
        ("REDIS_SENTINEL_MASTER", "m"),
        ("REDIS_TLS", "maybe"),
    ]);
    assert!(message.starts_with("REDIS_TLS"), "{message}");
}

#[test]
fn sentinel_settings_without_sentinels_are_warned_about() {
    assert_eq!(
        warnings(&[("REDIS_ADDR", "db:6379"), ("REDIS_SENTINEL_MASTER", "mymaster")]),
        ["REDIS_SENTINEL_MASTER is set but not used: it goes with REDIS_SENTINELS"]
    );
    assert_eq!(
        warnings(&[("REDIS_SENTINEL_PASSWORD", "hunter2")]),
        ["REDIS_SENTINEL_PASSWORD is set but not used: it goes with REDIS_SENTINELS"]
    );
}

#[test]
fn numbers_that_would_lose_precision_in_lua_are_refused() {
    let message = error(&[("MAX_TOKENS", "1000000000"), ("REFILL_RATE", "0.000001")]);
    assert!(
        message.contains("MAX_TOKENS") && message.contains("REFILL_RATE"),
        "{message}"
    );
    let message = error(&[
        ("ALGORITHM", "sliding_window"),
        ("LIMIT", "1000000000000"),
        ("WINDOW_SIZE", "86400"),
    ]);
    assert!(
        message.contains("LIMIT") && message.contains("WINDOW_SIZE"),
        "{message}"
    );
}

#[test]
fn backend_path_prefix_is_kept() {
    let config = parse(&[("BACKEND_URL", "http://api.internal:9000/v1/")]).unwrap();
    assert_eq!(
        config.proxy.as_ref().unwrap().backend.authority.as_str(),
        "api.internal:9000"
    );
    assert_eq!(config.proxy.as_ref().unwrap().backend.base_path, "/v1");
}

#[test]
fn an_https_backend_names_its_server_and_its_cas() {
    let config = parse(&[("BACKEND_URL", "https://api.internal/v1")]).unwrap();
    assert_eq!(config.proxy.as_ref().unwrap().backend.scheme, Scheme::HTTPS);
    let tls = config
        .proxy
        .as_ref()
        .unwrap()
        .backend
        .tls
        .as_ref()
        .expect("TLS settings for https");
    assert_eq!(tls.server_name.to_str(), "api.internal");
    assert_eq!(tls.ca_file, None);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let config = parse(&[
        ("BACKEND_URL", "https://[::1]:8443"),
        ("BACKEND_CA_FILE", "/etc/tollgate/ca.pem"),
        ("BACKEND_TLS_SERVER_NAME", "api.example.com"),
    ])
    .unwrap();
    let tls = config.proxy.as_ref().unwrap().backend.tls.as_ref().unwrap();
    assert_eq!(tls.server_name.to_str(), "api.example.com");
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/tollgate/ca.pem"))
    );
    assert!(
        config
            .to_string()
            .contains("backend TLS:      server name api.example.com, CAs from /etc/tollgate/ca.pem")
    );

    // An IP address is a server name too (checked against the certificate's IP SANs).
    let config = parse(&[("BACKEND_URL", "https://[::1]:8443")]).unwrap();
    assert_eq!(
        config
            .proxy
            .as_ref()
            .unwrap()
            .backend
            .tls
            .clone()
            .unwrap()
            .server_name
            .to_str(),
        "::1"
    );
}

#[test]
fn tls_settings_for_an_http_backend_are_warned_about() {
    let config = parse(&[("BACKEND_CA_FILE", "/etc/tollgate/ca.pem")]).unwrap();
    assert_eq!(config.proxy.as_ref().unwrap().backend.tls, None);
    assert!(
        config
            .warnings
            .iter()
            .any(|warning| warning.to_string().contains("BACKEND_CA_FILE")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn check_config_output_shows_the_rules() {
    let shown = parse(&[
        (
            "ROUTES",
            "/api/export/*=token_bucket:5:0.1,method=GET|head;/search=fixed_window:100:60,name=search,shadow",
        ),
        ("COSTS", "/api/export/big=3"),
        ("SKIP_PATHS", "/healthz"),
        ("EXEMPT", "10.0.0.0/8"),
    ])
    .unwrap()
    .to_string();
    assert!(
        shown.contains("general rule:     token_bucket: 10 tokens, refill 1/s"),
        "{shown}"
    );
    for line in [
        "   1. /api/export/* GET|HEAD -> /api/export/*: token_bucket: 5 tokens, refill 0.1/s",
        "   2. /search -> search: fixed_window: 100 requests per 60 s (key ip, cost 1, shadow)",
        "   3. /login -> auth: token_bucket: 5 tokens",
        "   6. every other path -> general: token_bucket: 10 tokens",
        "costs:            /api/export/big=3",
        "skip paths:       /healthz",
        "exempt:           10.0.0.0/8",
    ] {
        assert!(shown.contains(line), "{line:?} missing from\n{shown}");
    }
    assert!(
        shown.contains("auth rule:        token_bucket: 5 tokens, refill 0.01/s"),
        "{shown}"
    );
}

#[test]
fn fail_mode_local_is_accepted() {
    let config = parse(&[("REDIS_ADDR", "db:6379"), ("FAIL_MODE", "local")]).unwrap();
    assert!(
        config
            .gate
            .rules
            .rules()
            .iter()
            .all(|rule| rule.fail_mode == FailMode::Local)
    );
    assert!(
        config
            .to_string()
            .contains("fail modes:       auth local, general local (when Redis cannot decide)"),
        "{config}"
    );
}

#[test]
fn each_rule_has_its_fail_mode_from_fail_mode_auth_fail_mode_or_its_route() {
    let config = parse(&[
        ("REDIS_ADDR", "db:6379"),
        ("FAIL_MODE", "open"),
        ("AUTH_FAIL_MODE", "local"),
        (
            "ROUTES",
            "/api/export/*=gcra:5:1,fail=closed,name=export;/search=gcra:5:1",
        ),
    ])
    .unwrap();
    let modes: Vec<(&str, FailMode)> = config
        .gate
        .rules
        .rules()
        .iter()
        .map(|rule| (&*rule.name, rule.fail_mode))
        .collect();
    assert_eq!(
        modes,
        [
            ("export", FailMode::Closed),
            ("/search", FailMode::Open),
            ("auth", FailMode::Local),
            ("general", FailMode::Open),
        ]
    );
    assert!(
        config.to_string().contains(
            "fail modes:       export closed, /search open, auth local, general open (when Redis cannot decide)"
        ),
        "{config}"
    );
    // AUTH_FAIL_MODE follows FAIL_MODE unless set.
    let config = parse(&[("REDIS_ADDR", "db:6379"), ("FAIL_MODE", "closed")]).unwrap();
    assert_eq!(auth(&config).fail_mode, FailMode::Closed);
    let message = error(&[("REDIS_ADDR", "db:6379"), ("AUTH_FAIL_MODE", "shut")]);
    assert!(
        message.starts_with(r#"AUTH_FAIL_MODE="shut" is invalid: expected open, closed or local"#),
        "{message}"
    );
    let message = error(&[("ROUTES", "/a=gcra:5:1,fail=shut")]);
    assert!(
        message.starts_with("ROUTES entry") && message.contains(r#"fail "shut": expected open"#),
        "{message}"
    );
    // Without Redis nothing fails: a fail mode is checked, and warned about.
    let warned = warnings(&[("ROUTES", "/a=gcra:5:1,fail=closed"), ("AUTH_FAIL_MODE", "local")]);
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(
        warned[0].starts_with("AUTH_FAIL_MODE is set but not used: the store is in memory"),
        "{warned:?}"
    );
    assert!(
        warned[1].starts_with("ROUTES entry for /a: fail=closed changes nothing"),
        "{warned:?}"
    );
    let message = error(&[("AUTH_FAIL_MODE", "shut")]);
    assert!(
        message.starts_with(r#"AUTH_FAIL_MODE="shut" is invalid"#),
        "{message}"
    );
}

#[test]
fn a_password_beside_redis_url_is_refused_not_ignored() {
    let message = error(&[("REDIS_URL", "redis://db:6379"), ("REDIS_PASSWORD", "hunter2")]);
    assert!(
        message.contains("REDIS_PASSWORD") && !message.contains("hunter2"),
        "{message}"
    );
}

#[test]
fn redis_tls_switches_addr_and_cluster_to_tls() {
    let config = parse(&[("REDIS_ADDR", "cache:6380"), ("REDIS_TLS", "true")]).unwrap();
    let StoreConfig::Redis(redis) = &config.store.kind else {
        panic!("redis store expected")
    };
    assert_eq!(redis.target, RedisTarget::Single("rediss://cache:6380".into()));
    let config = parse(&[("REDIS_CLUSTER_NODES", "a:1"), ("REDIS_TLS", "true")]).unwrap();
    assert!(config.to_string().contains("cluster a:1 (TLS)"), "{config}");
    assert!(error(&[("REDIS_ADDR", "a:1"), ("REDIS_TLS", "yes")]).starts_with("REDIS_TLS=\"yes\""));
    assert!(error(&[("REDIS_URL", "redis://a:1"), ("REDIS_TLS", "true")]).contains("REDIS_TLS goes with"));
}

#[test]
fn every_algorithm_is_accepted_for_either_rule() {
    let config = parse(&[
        ("ALGORITHM", "fixed_window"),
        ("LIMIT", "100"),
        ("WINDOW_SIZE", "1"),
        ("AUTH_ALGORITHM", "sliding_log"),
        ("AUTH_LIMIT", "3"),
    ])
    .unwrap();
    assert_eq!(
        *general(&config).limits.first(),
        Policy::FixedWindow(FixedWindow {
            limit: 100,
            window_ms: 1_000
        })
    );
    assert_eq!(
        *auth(&config).limits.first(),
        Policy::SlidingLog(SlidingLog {
            limit: 3,
            window_ms: 60_000
        })
    );
    // gcra is the token bucket, read from the same variables.
    let config = parse(&[("ALGORITHM", "gcra"), ("MAX_TOKENS", "7")]).unwrap();
    assert_eq!(general(&config).limits.first().name(), "token_bucket");
    assert_eq!(general(&config).limits.first().limit(), 7);
    // AUTH_ALGORITHM defaults to ALGORITHM.
    let config = parse(&[("ALGORITHM", "sliding_window")]).unwrap();
    assert_eq!(auth(&config).limits.first().name(), "sliding_window");
    assert!(error(&[("ALGORITHM", "sliding_log"), ("LIMIT", "20000")]).contains("10000"));
}

#[test]
fn routes_are_tried_in_order_before_auth_paths_and_the_general_rule() {
    let config = parse(&[
        (
            "ROUTES",
            "/api/export/*=token_bucket:5:0.1,cost=2;/login=fixed_window:3:60,method=POST,name=login-post;/search=sliding_log:100:60",
        ),
        ("COSTS", "/api/export/huge=5,/search=4"),
        ("SKIP_PATHS", "/healthz"),
    ])
    .unwrap();
    let cases = [
        ("GET", "/api/export/x", ("/api/export/*", Mode::Enforce, 2)),
        ("GET", "/api/export/huge", ("/api/export/*", Mode::Enforce, 5)),
        ("POST", "/login", ("login-post", Mode::Enforce, 1)),
        ("GET", "/login", ("auth", Mode::Enforce, 1)),
        ("GET", "/search", ("/search", Mode::Enforce, 4)),
        ("GET", "/other", ("general", Mode::Enforce, 1)),
        ("GET", "/healthz", ("general", Mode::Exempt, 1)),
    ];
    for (method, path, (rule, mode, cost)) in cases {
        assert_eq!(
            classify(&config, method, path),
            (rule.to_owned(), mode, cost),
            "{method} {path}"
        );
    }
}

#[test]
fn a_method_route_takes_its_method_in_any_case_and_an_override_that_picks_another_route_is_refused() {
    let config = parse(&[(
        "ROUTES",
        "/search=fixed_window:3:60,method=GET,name=search;/items/*=fixed_window:3:60,method=delete,name=delete",
    )])
    .unwrap();
    let rules = &config.gate.rules;
    let rule = |method: &str, path, overrides: &[(&str, &str)]| {
        let mut headers = HeaderMap::new();
        for (name, value) in overrides {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let head = RequestHead {
            method: &Method::from_bytes(method.as_bytes()).unwrap(),
            path,
            query: None,
            authority: None,
            headers: &headers,
            client_ip: "192.0.2.1".parse().unwrap(),
            trusted: false,
        };
        rules
            .classify(&head)
            .map_or_else(|_| "refused".to_owned(), |matched| matched.rule.name.to_string())
    };
    for (method, path, overrides, expected) in [
        ("GET", "/search", &[][..], "search"),
        ("get", "/search", &[], "search"),
        ("gEt", "/search.json", &[], "search"),
        // Flask, Rails, Express run a GET route for HEAD.
        ("HEAD", "/search", &[], "search"),
        ("POST", "/search", &[], "general"),
        ("POST", "/search", &[("x-http-method-override", "GET")], "refused"),
        ("POST", "/search", &[("x-http-method", "get")], "refused"),
        ("PUT", "/search", &[("x-method-override", " Get ")], "refused"),
        (
            "POST",
            "/search",
            &[("x-http-method-override", "PATCH, GET")],
            "refused",
        ),
        (
            "POST",
            "/search",
            &[
                ("x-http-method-override", "PATCH"),
                ("x-http-method-override", "GET"),
            ],
            "refused",
        ),
        (
            "POST",
            "/search",
            &[("x-http-method-override", "PATCH")],
            "general",
        ),
        ("DELETE", "/items/1", &[], "delete"),
        ("delete", "/items/1", &[], "delete"),
        (
            "POST",
            "/items/1",
            &[("x-http-method-override", "DELETE")],
            "refused",
        ),
        (
            "POST",
            "/items/1",
            &[("x-http-method-override", "delete")],
            "refused",
        ),
        ("POST", "/items/1", &[], "general"),
    ] {
        assert_eq!(
            rule(method, path, overrides),
            expected,
            "{method} {path} {overrides:?}"
        );
    }
    // A `_method` query parameter (Symfony, Laravel), any of them, decoded.
    for (query, expected) in [
        ("_method=GET", "refused"),
        ("a=1&_method=%67et", "refused"),
        ("_method=PATCH&_method=get", "refused"),
        ("_method=PATCH", "general"),
        ("method=GET", "general"),
    ] {
        let head = RequestHead {
            method: &Method::POST,
            path: "/search",
            query: Some(query),
            authority: None,
            headers: &HeaderMap::new(),
            client_ip: "192.0.2.1".parse().unwrap(),
            trusted: false,
        };
        let found = rules
            .classify(&head)
            .map_or_else(|_| "refused".to_owned(), |matched| matched.rule.name.to_string());
        assert_eq!(found, expected, "{query}");
    }
    // An override never chooses a more generous route: a DELETE that asks to be read as a
    // GET would otherwise spend the GET route's budget while a backend that ignores the header
    // runs the DELETE.
    let generous = parse(&[(
        "ROUTES",
        "/api/*=fixed_window:1000:60,method=GET,name=reads;/api/*=fixed_window:10:60,name=writes",
    )])
    .unwrap();
    let headers: HeaderMap = [(
        http::HeaderName::from_static("x-http-method-override"),
        http::HeaderValue::from_static("GET"),
    )]
    .into_iter()
    .collect();
    let head = RequestHead {
        method: &Method::DELETE,
        path: "/api/x",
        query: None,
        authority: None,
        headers: &headers,
        client_ip: "192.0.2.1".parse().unwrap(),
        trusted: false,
    };
    assert!(matches!(
        generous.gate.rules.classify(&head),
        Err(crate::rules::table::ClassifyError::AmbiguousMethod)
    ));
    // As `--check-config` shows it.
    assert!(config.to_string().contains("/search GET|HEAD"), "{config}");
}

#[test]
fn a_segment_naming_a_script_is_matched_and_keyed_as_the_script() {
    let config = parse(&[
        ("AUTH_PATHS", "/wp-login.php,/admin"),
        ("SKIP_PATHS", "/status.php"),
        ("COSTS", "/export.php=3"),
        ("KEY_BY", "ip+path"),
    ])
    .unwrap();
    for (path, rule, mode, cost) in [
        ("/wp-login.php", "auth", Mode::Enforce, 1),
        ("/wp-login.php/x", "auth", Mode::Enforce, 1),
        ("/wp-login.php/x/y.json", "auth", Mode::Enforce, 1),
        ("/admin.cgi/x", "auth", Mode::Enforce, 1),
        ("/admin.aspx/x", "auth", Mode::Enforce, 1),
        ("/wp-login.phpx/y", "general", Mode::Enforce, 1),
        ("/export.php/x", "general", Mode::Enforce, 3),
        ("/status.php", "general", Mode::Exempt, 1),
        // Skipped as itself only: what follows the script is the script's to route.
        ("/status.php/admin", "general", Mode::Enforce, 1),
    ] {
        assert_eq!(
            classify(&config, "POST", path),
            (rule.to_owned(), mode, cost),
            "{path}"
        );
    }
    // `path` keys the resource: extension and PATH_INFO dropped.
    let key = |path| {
        let head = RequestHead {
            method: &Method::GET,
            path,
            query: None,
            authority: None,
            headers: &HeaderMap::new(),
            client_ip: "192.0.2.1".parse().unwrap(),
            trusted: false,
        };
        config.gate.rules.classify(&head).unwrap().key
    };
    for (same, as_) in [
        ("/api/search.json", "/api/search"),
        ("/api/search.a1", "/api/search"),
        ("/x.php/a", "/x.php"),
        ("/x.php/b", "/x"),
        ("/a/b.cgi/c", "/a/b.pl/d"),
    ] {
        assert_eq!(key(same), key(as_), "{same} {as_}");
    }
    assert_ne!(key("/api/search"), key("/api/other"));
    assert_ne!(key("/a/b"), key("/a/c.php"));
}

#[test]
fn method_override_is_meter_or_strip() {
    let proxy = |vars: &[(&str, &str)]| parse(vars).unwrap().proxy.unwrap().method_override;
    assert_eq!(proxy(&[]), MethodOverride::Meter);
    assert_eq!(proxy(&[("METHOD_OVERRIDE", "strip")]), MethodOverride::Strip);
    let message = error(&[("METHOD_OVERRIDE", "forward")]);
    assert!(message.contains("METHOD_OVERRIDE"), "{message}");
}

#[test]
fn shadow_mode_and_failure_counting() {
    let config = parse(&[("SHADOW_MODE", "true"), ("AUTH_COUNT", "failures")]).unwrap();
    assert_eq!(classify(&config, "GET", "/x").1, Mode::Shadow);
    assert!(general(&config).shadow && auth(&config).shadow);
    assert_eq!(auth(&config).count, crate::rules::Count::Failures);
    assert_eq!(general(&config).count, crate::rules::Count::All);
    let config = parse(&[("ROUTES", "/a=gcra:1:1,shadow,count=failures")]).unwrap();
    let route = config.gate.rules.rule("/a").unwrap();
    assert!(route.shadow);
    assert!(!general(&config).shadow);
}

#[test]
fn bad_route_entries_stop_startup_naming_the_entry() {
    let cases: &[(&str, &str, &str)] = &[
        ("ROUTES", "/a", "expected PATTERN=ALGORITHM:A:B"),
        ("ROUTES", "/a=leaky:1:1", "unknown algorithm \"leaky\""),
        ("ROUTES", "/a=token_bucket:5", "expected ALGORITHM:A:B"),
        ("ROUTES", "/a=token_bucket:x:1", "capacity \"x\""),
        ("ROUTES", "/a=fixed_window:5:0", "window seconds \"0\""),
        ("ROUTES", "a=token_bucket:5:1", "pattern"),
        (
            "ROUTES",
            "/a=token_bucket:5:1,cost=6",
            "above the rule's capacity",
        ),
        ("ROUTES", "/a=token_bucket:5:1,colour=red", "unknown option"),
        ("ROUTES", "/a=token_bucket:5:1,name=Bad Name", "whitespace"),
        ("ROUTES", "/a=token_bucket:5:1,name=auth", "is taken"),
        (
            "ROUTES",
            "/a=token_bucket:5:1,name=x;/b=gcra:1:1,name=x",
            "is taken",
        ),
        ("ROUTES", "/a=token_bucket:5:1;/a=gcra:1:1", "can never match"),
        (
            "ROUTES",
            "/a=token_bucket:5:1,key=body:x",
            "key=body:x: \"body:x\" is not a key source",
        ),
        (
            "ROUTES",
            "/a=token_bucket:5:1,key=ip+ip",
            "key=ip+ip: ip is named twice",
        ),
        (
            "KEY_BY",
            "ip+query:a&b",
            "\"query:a&b\": \"a&b\" is not a query parameter name",
        ),
        ("KEY_BY", "cookie:a=b", "\"a=b\" is not a cookie name"),
        ("AUTH_KEY_BY", "ip+", "\"ip+\" has an empty part"),
        ("KEY_BY", "path+path", "path is named twice"),
        ("COSTS", "/heavy", "expected PATTERN=N"),
        ("COSTS", "/heavy=0", "expected PATTERN=N"),
        ("COSTS", "/heavy=11", "rule \"general\", which holds at most 10"),
        ("COSTS", "/login=6", "rule \"auth\", which holds at most 5"),
        ("EXEMPT", "10.0.0.0/33", "expected a CIDR"),
        ("EXEMPT", "key:abc", "need a rule keyed by one source besides ip"),
        ("SKIP_PATHS", "health", "start with"),
        ("AUTH_PATHS", "/login /signup", "whitespace"),
    ];
    for (var, value, problem) in cases {
        let message = error(&[(var, value)]);
        assert!(message.starts_with(var), "{var}={value}: {message}");
        assert!(
            message.contains(problem),
            "{var}={value}: {message} should say {problem:?}"
        );
    }
}

#[test]
fn header_keys_need_a_shared_secret_with_redis() {
    let config = parse(&[("KEY_BY", "header:X-API-Key")]).unwrap();
    assert_eq!(general(&config).key_by, KeyBy::parse("header:x-api-key").unwrap());
    assert_eq!(auth(&config).key_by, KeyBy::ip(), "logins stay keyed by address");
    let config = parse(&[("AUTH_KEY_BY", "ip+header:X-Device")]).unwrap();
    assert_eq!(auth(&config).key_by, KeyBy::parse("ip+header:x-device").unwrap());
    assert_eq!(general(&config).key_by, KeyBy::ip());
    let message = error(&[("KEY_BY", "header:X-API-Key"), ("REDIS_ADDR", "db:6379")]);
    assert!(message.starts_with("KEY_HASH_SECRET is required"), "{message}");
    let message = error(&[("KEY_HASH_SECRET", "short-secret")]);
    assert!(
        message.starts_with("KEY_HASH_SECRET is invalid") && !message.contains("short-secret"),
        "{message}"
    );
    parse(&[
        ("KEY_BY", "header:X-API-Key"),
        ("REDIS_ADDR", "db:6379"),
        ("KEY_HASH_SECRET", "0123456789abcdef0123"),
        ("EXEMPT", "key:internal-batch-job"),
    ])
    .unwrap();
}

#[test]
fn a_decision_service_with_redis_needs_a_shared_secret_for_its_named_keys() {
    // `{"rule","key"}` on /v1/check is digested: without a shared secret each replica would
    // draw its own key and hold a budget of its own for one client.
    for backend in [None, Some("http://127.0.0.1:8000")] {
        let mut vars: Vec<(&str, &str)> = backend.map(|url| ("BACKEND_URL", url)).into_iter().collect();
        vars.extend([("DECIDE_PORT", "9181"), ("REDIS_ADDR", "db:6379")]);
        let message = Config::from_vars(vars.iter().copied())
            .expect_err("refused without KEY_HASH_SECRET")
            .to_string();
        assert!(message.starts_with("KEY_HASH_SECRET is required"), "{message}");
        assert!(message.contains("DECIDE_PORT"), "{message}");
        vars.push(("KEY_HASH_SECRET", "0123456789abcdef0123"));
        Config::from_vars(vars.iter().copied()).unwrap();
    }
    // Alone, with memory: one process, one key.
    Config::from_vars([("DECIDE_PORT", "9181")]).unwrap();
}

#[test]
fn every_key_read_from_requests_needs_a_shared_secret_with_redis() {
    for key_by in [
        "cookie:session",
        "query:tenant",
        "host",
        "path",
        "ip+path",
        "header:a+query:b",
    ] {
        let message = error(&[("KEY_BY", key_by), ("REDIS_ADDR", "db:6379")]);
        assert!(
            message.starts_with("KEY_HASH_SECRET is required"),
            "{key_by}: {message}"
        );
        let message = error(&[
            ("ROUTES", &format!("/a=gcra:5:1,key={key_by}")),
            ("REDIS_ADDR", "db:6379"),
        ]);
        assert!(
            message.starts_with("KEY_HASH_SECRET is required"),
            "{key_by}: {message}"
        );
    }
    parse(&[("KEY_BY", "ip"), ("REDIS_ADDR", "db:6379")]).unwrap();
    let config = parse(&[
        ("KEY_BY", "ip+header:X-API-Key+query:tenant"),
        ("AUTH_KEY_BY", "cookie:session"),
        ("REDIS_ADDR", "db:6379"),
        ("KEY_HASH_SECRET", "0123456789abcdef0123"),
        ("EXEMPT", "key:batch"),
    ])
    .unwrap();
    assert_eq!(
        general(&config).key_by.to_string(),
        "ip+header:x-api-key+query:tenant"
    );
    assert_eq!(auth(&config).key_by.to_string(), "cookie:session");
    // The exempt value, as the one rule keyed by one source (the cookie) digests it; the rule
    // keyed by several is one digest of them all, which no single value names.
    let mut headers = HeaderMap::new();
    headers.insert("cookie", "session=batch".parse().unwrap());
    headers.insert("x-api-key", "batch".parse().unwrap());
    let head = |path| RequestHead {
        method: &Method::GET,
        path,
        query: Some("tenant=batch"),
        authority: None,
        headers: &headers,
        client_ip: "192.0.2.1".parse().unwrap(),
        trusted: false,
    };
    let rules = &config.gate.rules;
    assert_eq!(rules.classify(&head("/login")).unwrap().mode, Mode::Exempt);
    assert_eq!(rules.classify(&head("/")).unwrap().mode, Mode::Enforce);
    // Not for a table whose only keyed rules have several sources.
    let message = error(&[("KEY_BY", "header:a+query:b"), ("EXEMPT", "key:batch")]);
    assert!(message.contains("need a rule keyed by one source"), "{message}");
}

#[test]
fn exempt_keys_name_their_source_and_exempt_it_alone() {
    let routes = "/site=gcra:5:1,key=ip+host,name=site;/api/*=gcra:5:1,key=header:X-API-Key,name=api;\
                  /s=gcra:5:1,key=cookie:session,name=s;/p/*=gcra:5:1,key=path,name=p";
    let config = parse(&[
        ("KEY_BY", "query:tenant"),
        ("ROUTES", routes),
        (
            "EXEMPT",
            "10.0.0.0/8,query:tenant=acme,host=ACME.example:443,header:X-API-Key=abc==,\
             cookie:session=batch,path=/p/open",
        ),
    ])
    .unwrap();
    let rules = &config.gate.rules;
    let mode = |path: &str, query: Option<&str>, headers: &[(&str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let head = RequestHead {
            method: &Method::GET,
            path,
            query,
            authority: None,
            headers: &map,
            client_ip: "192.0.2.1".parse().unwrap(),
            trusted: false,
        };
        rules.classify(&head).unwrap().mode
    };
    // Each value in its own source: exempt (the host as keys read it: lower case, no port).
    assert_eq!(mode("/", Some("tenant=acme"), &[]), Mode::Exempt);
    assert_eq!(mode("/site", None, &[("host", "acme.example")]), Mode::Exempt);
    assert_eq!(mode("/api/x", None, &[("x-api-key", "abc==")]), Mode::Exempt);
    assert_eq!(mode("/s", None, &[("cookie", "session=batch")]), Mode::Exempt);
    assert_eq!(mode("/p/open", None, &[]), Mode::Exempt);
    // The same values in another source: limited as any other.
    assert_eq!(mode("/", Some("tenant=acme.example"), &[]), Mode::Enforce);
    assert_eq!(mode("/site", None, &[("host", "acme")]), Mode::Enforce);
    assert_eq!(mode("/api/x", None, &[("x-api-key", "acme")]), Mode::Enforce);
    assert_eq!(mode("/s", None, &[("cookie", "session=abc==")]), Mode::Enforce);
    assert_eq!(mode("/p/closed", None, &[]), Mode::Enforce);

    // key:VALUE names the one source rules are keyed by alone, and none where there are two.
    let config = parse(&[("KEY_BY", "ip+query:tenant"), ("EXEMPT", "key:acme")]).unwrap();
    assert_eq!(
        classify_query(&config, "tenant=acme"),
        Mode::Exempt,
        "the old spelling, one source"
    );
    for (vars, problem) in [
        (
            &[
                ("KEY_BY", "query:tenant"),
                ("ROUTES", "/s=gcra:5:1,key=ip+host"),
                ("EXEMPT", "key:acme"),
            ][..],
            "name the source: host=VALUE or query:tenant=VALUE",
        ),
        (
            &[("EXEMPT", "key:acme")],
            "an exemption names its source: header:NAME=VALUE",
        ),
        (
            &[("KEY_BY", "query:tenant"), ("EXEMPT", "header:X-API-Key=acme")],
            "no rule is keyed by header:x-api-key alone (besides ip), so it would exempt nothing: \
             the rules keyed by one source are keyed by query:tenant",
        ),
        (
            &[("EXEMPT", "host=acme")],
            "the rules keyed by one source are keyed by none",
        ),
        (
            &[("KEY_BY", "query:tenant"), ("EXEMPT", "query:tenant=")],
            "names no value",
        ),
        (
            &[("KEY_BY", "ip+host"), ("EXEMPT", "host=:443")],
            "names no value",
        ),
        (&[("KEY_BY", "ip+host"), ("EXEMPT", "key:")], "names no value"),
        (
            &[("KEY_BY", "ip+host"), ("EXEMPT", "ip+host=acme")],
            "\"ip+host\" is not one key source",
        ),
        (
            &[("KEY_BY", "host"), ("EXEMPT", "tenant=acme")],
            "\"tenant\" is not one key source",
        ),
        (
            &[("KEY_BY", "host"), ("EXEMPT", "bogus")],
            "expected a CIDR, an address, or a key's value",
        ),
        (
            &[
                ("KEY_BY", "header:Authorization"),
                ("EXEMPT", "header:Authorization=Bearer acme"),
            ],
            "EXEMPT entry \"header:Authorization=***\" is invalid: it contains whitespace",
        ),
    ] {
        let message = error(vars);
        assert!(
            message.starts_with("EXEMPT") && message.contains(problem),
            "{vars:?}: {message}"
        );
        assert!(!message.contains("acme"), "a value is never shown: {message}");
    }
}

/// The mode of `GET /?query` from 192.0.2.1.
fn classify_query(config: &Config, query: &str) -> Mode {
    let headers = HeaderMap::new();
    let head = RequestHead {
        method: &Method::GET,
        path: "/",
        query: Some(query),
        authority: None,
        headers: &headers,
        client_ip: "192.0.2.1".parse().unwrap(),
        trusted: false,
    };
    config.gate.rules.classify(&head).unwrap().mode
}

#[test]
fn key_sources_a_client_chooses_alone_are_warned_about_and_header_host_points_to_host() {
    let warned = warnings(&[("KEY_BY", "host")]);
    assert!(
        warned.len() == 1 && warned[0].starts_with("KEY_BY=host: every client shares one budget per host"),
        "{warned:?}"
    );
    let warned = warnings(&[("ROUTES", "/items/*=gcra:5:1,key=path")]);
    assert!(
        warned.len() == 1 && warned[0].contains("key=path: every client shares one budget per path"),
        "{warned:?}"
    );
    for quiet in [
        "ip+host",
        "ip+path",
        "cookie:session",
        "query:tenant",
        "header:X-API-Key+host",
    ] {
        assert!(warnings(&[("KEY_BY", quiet)]).is_empty(), "{quiet}");
    }
    // A credential-free header among sources is still warned about; a certain one refused.
    assert_eq!(warnings(&[("KEY_BY", "ip+query:t+header:User-Agent")]).len(), 1);
    for refused in [
        "header:Host",
        "query:t+header:X-Forwarded-For",
        "header:Cookie",
        "path+header:user-agent+header:host",
    ] {
        let message = error(&[("KEY_BY", refused)]);
        assert!(
            message.contains("a header that identifies a client"),
            "{refused}: {message}"
        );
    }
    let message = error(&[("KEY_BY", "header:Host")]);
    assert!(message.contains("the host source reads both"), "{message}");
}

#[test]
fn every_variable_read_is_recorded() {
    let config = parse(&[]).unwrap();
    for name in [
        "BACKEND_URL",
        "ROUTES",
        "KEY_BY",
        "MAX_TOKENS",
        "AUTH_REFILL_RATE",
        "REDIS_URL",
    ] {
        assert!(config.read.contains(name), "{name}");
    }
    // Only the chosen algorithm's numbers are read.
    assert!(!config.read.contains("WINDOW_SIZE"));
}

/// The names `.env.example` documents, as `NAME=` or `# NAME=` lines.
fn documented_variables() -> BTreeSet<&'static str> {
    include_str!("../../.env.example")
        .lines()
        .filter_map(|line| {
            let (name, _) = line.trim_start_matches("# ").split_once('=')?;
            let is_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            is_name.then_some(name)
        })
        .collect()
}

#[test]
fn env_example_documents_exactly_the_variables_tollgate_reads() {
    let documented = documented_variables();
    let known: BTreeSet<&str> = VARIABLES.iter().copied().collect();
    assert_eq!(known.len(), VARIABLES.len(), "VARIABLES has no duplicates");
    let undocumented: Vec<_> = known.difference(&documented).collect();
    assert!(undocumented.is_empty(), "not in .env.example: {undocumented:?}");
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "in .env.example but not in VARIABLES: {unknown:?}"
    );
}

#[test]
fn variables_is_every_name_the_parsers_read_plus_the_libraries_own() {
    // Between them, these make the parsers read every name they can: both parameter pairs of
    // both rules, and every Redis setting.
    let maximal: [&[(&str, &str)]; 4] = [
        &[
            ("ALGORITHM", "token_bucket"),
            ("AUTH_ALGORITHM", "sliding_window"),
            ("REDIS_ADDR", "db:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_PASSWORD", "hunter2"),
            ("KEY_HASH_SECRET", "0123456789abcdef0123"),
            ("AUTH_PATHS", "/login"),
            ("TLS_CERT_FILE", "/etc/tollgate/cert.pem"),
            ("TLS_KEY_FILE", "/etc/tollgate/key.pem"),
            ("DECIDE_PORT", "8081"),
        ],
        &[
            ("ALGORITHM", "sliding_window"),
            ("AUTH_ALGORITHM", "token_bucket"),
            ("REDIS_CLUSTER_NODES", "a:6379,b:6379"),
        ],
        &[
            ("REDIS_SENTINELS", "s1:26379"),
            ("REDIS_SENTINEL_MASTER", "mymaster"),
            ("REDIS_SENTINEL_PASSWORD", "secret"),
        ],
        &[
            ("BACKEND_URL", "https://api.internal"),
            ("BACKEND_CA_FILE", "/etc/tollgate/ca.pem"),
            ("BACKEND_TLS_SERVER_NAME", "api.example.com"),
            ("STATE_FILE", "/var/lib/tollgate/state"),
        ],
    ];
    let mut read = BTreeSet::new();
    for vars in maximal {
        read.extend(parse(vars).unwrap().read);
    }
    read.extend(["RUST_LOG", "SSL_CERT_FILE", "SSL_CERT_DIR"]);
    let known: BTreeSet<&str> = VARIABLES.iter().copied().collect();
    assert_eq!(read, known);
    for algorithm in Policy::NAMES {
        for parameter in Policy::parameters(algorithm).into_iter().flatten() {
            assert!(VARIABLES.contains(&parameter.general.name), "{parameter:?}");
            assert!(VARIABLES.contains(&parameter.auth.name), "{parameter:?}");
        }
    }
}

fn warnings(vars: &[(&str, &str)]) -> Vec<String> {
    parse(vars).unwrap().warnings
}

#[test]
fn a_misspelt_variable_is_warned_about_with_the_nearest_name() {
    assert_eq!(
        warnings(&[("MAX_TOKEN", "5")]),
        ["MAX_TOKEN is not a tollgate variable; did you mean MAX_TOKENS?"]
    );
    for (name, meant) in [
        ("MAX_TOKNES", "MAX_TOKENS"),
        ("AUTH_WINDOWSIZE", "AUTH_WINDOW_SIZE"),
        ("REDIS_ADR", "REDIS_ADDR"),
        ("BACKEND_TIMEOUT", "BACKEND_TIMEOUT_MS"),
        ("SHUTDOWN_TIMEOUT", "SHUTDOWN_TIMEOUT_MS"),
        ("LIMTS", "LIMITS"),
        ("max_tokens", "MAX_TOKENS"),
        ("TOLLGATE_PORT", "PORT"),
    ] {
        assert_eq!(
            warnings(&[(name, "5")]),
            [format!(
                "{name} is not a tollgate variable; did you mean {meant}?"
            )]
        );
    }
}

#[test]
fn a_name_with_our_prefix_but_no_close_match_points_to_env_example() {
    assert_eq!(
        warnings(&[("REDIS_HOST", "db"), ("TOLLGATE_MODE", "strict")]),
        [
            "REDIS_HOST is not a tollgate variable (see .env.example)",
            "TOLLGATE_MODE is not a tollgate variable (see .env.example)",
        ]
    );
}

/// `warnings`, one warning equal to `expected` but for its closing list of the algorithms that
/// read the variable: that list starts with `expected`'s (an algorithm added later joins its
/// end by its line in the registry alone, with no test to edit).
fn warned_alike(warnings: Vec<String>, expected: &str) {
    let [warning] = &warnings[..] else {
        panic!("one warning expected: {warnings:?}");
    };
    let (text, readers) = warning.rsplit_once(" is for ").expect("a list of readers");
    let (expected_text, expected_readers) = expected.rsplit_once(" is for ").expect("a list of readers");
    assert_eq!(text, expected_text);
    let listed = |list: &str| -> Vec<String> {
        let list = list.trim_end_matches(')');
        match list.rsplit_once(" or ") {
            Some((init, last)) => init.split(", ").chain([last]).map(str::to_owned).collect(),
            None => vec![list.to_owned()],
        }
    };
    let (readers, expected_readers) = (listed(readers), listed(expected_readers));
    assert!(readers.starts_with(&expected_readers), "{warning}");
}

#[test]
fn an_algorithm_variable_the_chosen_algorithm_does_not_read_is_warned_about() {
    warned_alike(
        warnings(&[("ALGORITHM", "token_bucket"), ("LIMIT", "100")]),
        "LIMIT is set but not used: ALGORITHM=token_bucket reads MAX_TOKENS and REFILL_RATE \
             (LIMIT is for sliding_window, fixed_window or sliding_log)",
    );
    warned_alike(
        warnings(&[("WINDOW_SIZE", "60")]),
        "WINDOW_SIZE is set but not used: ALGORITHM=token_bucket (the default) reads \
             MAX_TOKENS and REFILL_RATE (WINDOW_SIZE is for sliding_window, fixed_window or sliding_log)",
    );
    warned_alike(
        warnings(&[("ALGORITHM", "sliding_window"), ("AUTH_MAX_TOKENS", "3")]),
        "AUTH_MAX_TOKENS is set but not used: AUTH_ALGORITHM defaults to \
             ALGORITHM=sliding_window, which reads AUTH_LIMIT and AUTH_WINDOW_SIZE \
             (AUTH_MAX_TOKENS is for token_bucket)",
    );
    warned_alike(
        warnings(&[("AUTH_ALGORITHM", "gcra"), ("AUTH_LIMIT", "3")]),
        "AUTH_LIMIT is set but not used: AUTH_ALGORITHM=gcra reads AUTH_MAX_TOKENS and \
             AUTH_REFILL_RATE (AUTH_LIMIT is for sliding_window, fixed_window or sliding_log)",
    );
    // Each rule reads its own pair: a window auth rule does not make MAX_TOKENS unused.
    assert!(
        warnings(&[
            ("AUTH_ALGORITHM", "fixed_window"),
            ("MAX_TOKENS", "20"),
            ("AUTH_LIMIT", "3")
        ])
        .is_empty()
    );
}

#[test]
fn a_redis_setting_without_redis_is_warned_about() {
    assert_eq!(
        warnings(&[("REDIS_TIMEOUT_MS", "100"), ("FAIL_MODE", "closed")]),
        [
            "FAIL_MODE is set but not used: the store is in memory; Redis settings apply once \
             REDIS_ADDR, REDIS_URL, REDIS_CLUSTER_NODES or REDIS_SENTINELS is set",
            "REDIS_TIMEOUT_MS is set but not used: the store is in memory; Redis settings apply \
             once REDIS_ADDR, REDIS_URL, REDIS_CLUSTER_NODES or REDIS_SENTINELS is set",
        ]
    );
    assert!(
        warnings(&[
            ("REDIS_ADDR", "db:6379"),
            ("REDIS_TIMEOUT_MS", "100"),
            ("FAIL_MODE", "closed")
        ])
        .is_empty()
    );
}

#[test]
fn warnings_never_show_values() {
    let all = warnings(&[
        ("REDIS_PASSWROD", "hunter2"),
        ("KEY_HASH_SECRT", "hunter2hunter2hunter2"),
        ("REDIS_PASSWORD", "hunter2"),
    ]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all.iter().all(|warning| !warning.contains("hunter2")), "{all:?}");
}

#[test]
fn a_clean_configuration_has_no_warnings() {
    assert!(warnings(&[]).is_empty());
    let every_setting_in_use = [
        ("PORT", "8081"),
        ("BIND", "127.0.0.1"),
        ("ADMIN_PORT", "9092"),
        ("ADMIN_BIND", "127.0.0.1"),
        ("ACCESS_LOG", "all"),
        ("ALGORITHM", "gcra"),
        ("MAX_TOKENS", "20"),
        ("REFILL_RATE", "2"),
        ("AUTH_ALGORITHM", "sliding_window"),
        ("AUTH_LIMIT", "5"),
        ("AUTH_WINDOW_SIZE", "60"),
        ("AUTH_PATHS", "/login"),
        ("ROUTES", "/search=fixed_window:100:60"),
        ("COSTS", "/export=2"),
        ("SKIP_PATHS", "/healthz"),
        ("SHADOW_MODE", "false"),
        ("AUTH_COUNT", "failures"),
        ("KEY_BY", "ip"),
        ("IPV6_PREFIX", "56"),
        ("TRUSTED_PROXIES", "10.0.0.0/8"),
        ("MAX_KEYS", "1000"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "info"),
        ("SSL_CERT_FILE", "/etc/ca.pem"),
        ("BACKEND_TIMEOUT_MS", "1000"),
        ("REDIS_ADDR", "db:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_PASSWORD", "secret"),
        ("KEY_PREFIX", "tg:"),
        ("REDIS_TIMEOUT_MS", "100"),
        ("FAIL_MODE", "local"),
        ("REDIS_BREAKER_THRESHOLD", "5"),
        ("REDIS_PROBE_INTERVAL_MS", "1000"),
        ("REDIS_CALLS_IN_FLIGHT", "0"),
    ];
    assert_eq!(warnings(&every_setting_in_use), Vec::<String>::new());
}

#[test]
fn a_container_environment_has_no_warnings() {
    // What Docker and Kubernetes put in a pod's environment, including the variables that
    // describe Services named `redis`, `tollgate` and `admin` (which share our prefixes).
    let container = [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/home/nonroot"),
        ("HOSTNAME", "tollgate-7d9f8b6c5-x2x4z"),
        ("HOST", "0.0.0.0"),
        ("TERM", "xterm"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("PWD", "/"),
        ("SHLVL", "1"),
        ("USER", "nonroot"),
        ("TZ", "UTC"),
        ("container", "docker"),
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("SSL_CERT_DIR", "/etc/ssl/certs"),
        ("RUST_BACKTRACE", "1"),
        ("RUST_VERSION", "1.95.0"),
        ("RUSTUP_HOME", "/usr/local/rustup"),
        ("CARGO_HOME", "/usr/local/cargo"),
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("NO_PROXY", "localhost"),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_PORT", "443"),
        ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
        ("REDIS_SERVICE_HOST", "10.0.0.11"),
        ("REDIS_SERVICE_PORT", "6379"),
        ("REDIS_PORT", "tcp://10.0.0.11:6379"),
        ("REDIS_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
        ("REDIS_PORT_6379_TCP_ADDR", "10.0.0.11"),
        ("TOLLGATE_SERVICE_HOST", "10.0.0.12"),
        ("TOLLGATE_SERVICE_PORT_ADMIN", "9091"),
        ("TOLLGATE_PORT", "tcp://10.0.0.12:8080"),
        ("TOLLGATE_PORT_8080_TCP_PROTO", "tcp"),
        ("ADMIN_SERVICE_HOST", "10.0.0.13"),
    ];
    assert_eq!(warnings(&container), Vec::<String>::new());
}

#[test]
fn connection_limits_and_timeouts() {
    let defaults = parse(&[]).unwrap();
    assert_eq!(defaults.server.idle_timeout, Duration::from_secs(60));
    assert_eq!(defaults.server.send_timeout, Duration::from_secs(60));
    assert_eq!(defaults.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(
        defaults.server.max_connections, None,
        "sized from the fd limit at startup"
    );
    assert_eq!(defaults.gate.max_upgrades_per_client, None, "unlimited");
    assert_eq!(defaults.server.max_connections_per_client, PerClientCap::Default);
    assert_eq!(defaults.server.max_requests_per_client, PerClientCap::Default);
    assert_eq!(defaults.server.h2_max_concurrent_streams, 200);
    assert_eq!(
        defaults.proxy.as_ref().unwrap().upgrade_idle_timeout,
        Some(Duration::from_secs(3600))
    );
    let set = parse(&[
        ("IDLE_TIMEOUT_MS", "1500"),
        ("SEND_TIMEOUT_MS", "2500"),
        ("MAX_CONNECTIONS", "5000"),
        ("MAX_CONNECTIONS_PER_CLIENT", "40"),
        ("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT", "120"),
        ("H2_MAX_CONCURRENT_STREAMS", "50"),
        ("MAX_UPGRADES_PER_CLIENT", "0"),
        ("UPGRADE_IDLE_TIMEOUT_MS", "0"),
    ])
    .unwrap();
    assert_eq!(set.server.h2_max_concurrent_streams, 50);
    assert!(
        set.to_string().contains(
            "requests:         in flight at most as many (120 per client), 50 streams per HTTP/2 connection"
        ),
        "{set}"
    );
    assert_eq!(
        set.proxy.as_ref().unwrap().upgrade_idle_timeout,
        None,
        "0 is never"
    );
    assert_eq!(set.server.idle_timeout, Duration::from_millis(1500));
    assert_eq!(set.server.send_timeout, Duration::from_millis(2500));
    assert_eq!(set.server.max_connections.map(NonZeroUsize::get), Some(5000));
    assert_eq!(set.gate.max_upgrades_per_client, Some(0));
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    assert!(
        set.to_string()
            .contains("connections:      at most 5000 (40 per client), first request within 10000 ms, closed after 1500 ms idle or 2500 ms unread; upgrades per client: 0, tunnel idle timeout: never"),
        "{set}"
    );
    for (var, value) in [
        ("IDLE_TIMEOUT_MS", "0"),
        ("SEND_TIMEOUT_MS", "0"),
        ("SEND_TIMEOUT_MS", "1m"),
        ("MAX_CONNECTIONS", "0"),
        ("MAX_CONNECTIONS", "lots"),
        ("MAX_UPGRADES_PER_CLIENT", "-1"),
        ("MAX_CONNECTIONS_PER_CLIENT", "-1"),
        ("MAX_CONNECTIONS_PER_CLIENT", "75%"),
        ("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT", "-1"),
        ("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT", "half"),
        ("H2_MAX_CONCURRENT_STREAMS", "0"),
        ("H2_MAX_CONCURRENT_STREAMS", "2147483648"),
        ("H2_MAX_CONCURRENT_STREAMS", "many"),
        ("BODY_MIN_RATE", "-1"),
        ("BODY_MIN_RATE", "1k"),
        ("BODY_MIN_RATE_WINDOW_MS", "0"),
        ("UPGRADE_IDLE_TIMEOUT_MS", "1h"),
        // A deadline that far away would overflow the clock: more than a year is refused.
        ("UPGRADE_IDLE_TIMEOUT_MS", "18446744073709551615"),
        ("IDLE_TIMEOUT_MS", "31536000001"),
    ] {
        let message = error(&[(var, value)]);
        assert!(
            message.starts_with(&format!("{var}=\"{value}\" is invalid: expected")),
            "{message}"
        );
    }
}

#[test]
fn an_unused_variable_is_still_validated_and_only_warned_about_when_well_formed() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        // Read by the window algorithms, not by the token bucket the auth rule uses.
        (&[("AUTH_LIMIT", "five")], r#"AUTH_LIMIT="five" is invalid"#),
        (&[("WINDOW_SIZE", "-1")], r#"WINDOW_SIZE="-1" is invalid"#),
        (
            &[("ALGORITHM", "sliding_window"), ("REFILL_RATE", "fast")],
            r#"REFILL_RATE="fast" is invalid"#,
        ),
        // Read only with Redis.
        (
            &[("REDIS_TIMEOUT_MS", "soon")],
            r#"REDIS_TIMEOUT_MS="soon" is invalid"#,
        ),
        (&[("FAIL_MODE", "sideways")], r#"FAIL_MODE="sideways" is invalid"#),
        (&[("REDIS_TLS", "yes")], r#"REDIS_TLS="yes" is invalid"#),
        (&[("KEY_PREFIX", "{app}")], r#"KEY_PREFIX="{app}" is invalid"#),
        (
            &[("REDIS_BREAKER_THRESHOLD", "0")],
            r#"REDIS_BREAKER_THRESHOLD="0" is invalid"#,
        ),
        (
            &[("REDIS_CALLS_IN_FLIGHT", "lots")],
            r#"REDIS_CALLS_IN_FLIGHT="lots" is invalid"#,
        ),
    ];
    for (vars, says) in cases {
        let message = error(vars);
        assert!(message.starts_with(says), "{vars:?}: {message}");
    }
    for vars in [
        &[("AUTH_LIMIT", "5")][..],
        &[("WINDOW_SIZE", "0.5")],
        &[("REDIS_TIMEOUT_MS", "100")],
        &[("FAIL_MODE", "closed")],
        &[("REDIS_PASSWORD", "anything at all")],
    ] {
        let warnings = warnings(vars);
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(&format!("{} is set but not used", vars[0].0))),
            "{vars:?}: {warnings:?}"
        );
    }
}

#[test]
fn trusting_or_exempting_every_address_is_an_error_saying_why() {
    for network in ["0.0.0.0/0", "::/0"] {
        let message = error(&[("TRUSTED_PROXIES", &format!("10.0.0.0/8,{network}"))]);
        assert!(
            message.starts_with(&format!("TRUSTED_PROXIES entry {network:?} is invalid"))
                && message.contains("X-Forwarded-For"),
            "{message}"
        );
        let message = error(&[("EXEMPT", network)]);
        assert!(
            message.starts_with(&format!("EXEMPT entry {network:?} is invalid"))
                && message.contains("none would be limited"),
            "{message}"
        );
    }
    // Wide, but not everyone: a private network is a normal place for proxies.
    let config = parse(&[
        ("TRUSTED_PROXIES", "10.0.0.0/8,::1"),
        ("EXEMPT", "192.168.0.0/16"),
    ])
    .unwrap();
    assert_eq!(config.gate.trusted_proxies.len(), 2);
}

#[test]
fn a_key_header_any_client_rewrites_at_will_is_an_error_or_a_warning() {
    for (var, value) in [
        ("KEY_BY", "header:Host"),
        ("KEY_BY", "header:X-Forwarded-For"),
        ("KEY_BY", "ip+header:x-real-ip"),
        ("AUTH_KEY_BY", "header:Forwarded"),
        ("KEY_BY", "header:Connection"),
        ("KEY_BY", "header:X-Request-Id"),
    ] {
        let message = error(&[(var, value)]);
        assert!(
            message.starts_with(&format!(
                "{var}={value:?} is invalid: expected a header that identifies a client"
            )),
            "{message}"
        );
    }
    let message = error(&[("ROUTES", "/api/*=token_bucket:5:1,key=header:X-Forwarded-For")]);
    assert!(
        message.starts_with("ROUTES entry") && message.contains("TRUSTED_PROXIES"),
        "{message}"
    );
    let warned = warnings(&[("KEY_BY", "header:User-Agent")]);
    assert!(
        warned
            == [
                "KEY_BY=header:user-agent: it carries no credential, so a client that changes it gets a fresh budget; key by one the backend checks (an API key, Authorization)"
            ],
        "{warned:?}"
    );
    let warned = warnings(&[("ROUTES", "/a=gcra:5:1,key=ip+header:Referer")]);
    assert!(
        warned[0].starts_with("ROUTES entry for /a: key=ip+header:Referer"),
        "{warned:?}"
    );
    assert!(warnings(&[("KEY_BY", "header:X-API-Key")]).is_empty());
}

#[test]
fn an_auth_path_of_everything_is_an_error_and_of_the_root_a_warning() {
    for everything in ["/*", "/login,/*"] {
        let message = error(&[("AUTH_PATHS", everything)]);
        assert!(
            message.starts_with("AUTH_PATHS entry \"/*\" is invalid: it matches every path"),
            "{message}"
        );
    }
    let config = parse(&[("AUTH_PATHS", "/")]).unwrap();
    assert_eq!(classify(&config, "GET", "/other").0, "general");
    assert_eq!(
        config.warnings,
        ["AUTH_PATHS has \"/\": that is the root path alone (the home page), not every path"]
    );
}

#[test]
fn the_per_client_connection_cap_follows_max_connections_unless_set() {
    let line = |vars: &[(&str, &str)]| {
        let config = parse(vars).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        let text = config.to_string();
        text.lines()
            .find(|line| line.starts_with("connections:"))
            .unwrap()
            .to_owned()
    };
    assert!(line(&[]).starts_with(
        "connections:      at most as the file-descriptor limit allows (three quarters of that per client),"
    ));
    assert!(
        line(&[("MAX_CONNECTIONS", "1000")]).starts_with("connections:      at most 1000 (750 per client),")
    );
    assert!(line(&[("MAX_CONNECTIONS_PER_CLIENT", "0")]).contains("(no cap per client)"));
    // Requests in flight: the same share of the same cap, set apart.
    let requests = |vars: &[(&str, &str)]| {
        let text = parse(vars).unwrap().to_string();
        text.lines()
            .find(|line| line.starts_with("requests:"))
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        requests(&[("MAX_CONNECTIONS", "1000")]),
        "requests:         in flight at most as many (750 per client), 200 streams per HTTP/2 connection"
    );
    assert!(requests(&[]).contains("(three quarters of that per client)"));
    assert!(requests(&[("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT", "0")]).contains("(no cap per client)"));
    assert_eq!(
        parse(&[("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT", "0")])
            .unwrap()
            .server
            .max_requests_per_client,
        PerClientCap::Off
    );
    // Not below MAX_CONNECTIONS: no cap of its own.
    assert!(
        line(&[("MAX_CONNECTIONS", "10"), ("MAX_CONNECTIONS_PER_CLIENT", "10")])
            .contains("at most 10 (no cap per client)")
    );
    assert_eq!(
        parse(&[("MAX_CONNECTIONS_PER_CLIENT", "0")])
            .unwrap()
            .server
            .max_connections_per_client,
        PerClientCap::Off
    );
}

#[test]
fn a_route_an_earlier_one_covers_is_an_error_naming_both() {
    for (routes, earlier) in [
        ("/api/*=gcra:5:1;/api/export=gcra:1:1", "/api/*"),
        ("/api*=gcra:5:1;/api/v1/*=gcra:1:1", "/api*"),
        ("/*=gcra:5:1;/x=gcra:1:1", "/*"),
        // Every method of the later one is taken by the earlier one.
        (
            "/a=gcra:5:1,method=GET|POST;/a=gcra:1:1,method=GET,name=get",
            "/a",
        ),
    ] {
        let message = error(&[("ROUTES", routes)]);
        assert!(
            message.starts_with("ROUTES entry")
                && message.contains(&format!("it can never match: the earlier entry for {earlier}")),
            "{routes}: {message}"
        );
    }
    // Narrower first, or other methods left over: both can match.
    for routes in [
        "/api/export=gcra:1:1;/api/*=gcra:5:1",
        "/a=gcra:5:1,method=GET;/a=gcra:1:1,name=rest",
        "/a=gcra:5:1,method=GET;/a=gcra:1:1,method=GET|POST,name=rest",
    ] {
        parse(&[("ROUTES", routes)]).unwrap();
    }
    // AUTH_PATHS come after ROUTES: one a route covers is dead if it was asked for, and a
    // warning if it is a default.
    let message = error(&[
        ("ROUTES", "/account/*=gcra:5:1"),
        ("AUTH_PATHS", "/account/login"),
    ]);
    assert!(
        message
            .starts_with("AUTH_PATHS entry \"/account/login\" is invalid: the ROUTES entry for /account/*"),
        "{message}"
    );
    // An auth path under another is the same rule twice: harmless.
    let config = parse(&[
        ("ROUTES", "/api/*=gcra:5:1"),
        ("AUTH_PATHS", "/auth/*,/auth/login"),
    ])
    .unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let warned = warnings(&[("ROUTES", "/*=gcra:100:10,name=all")]);
    assert_eq!(warned.len(), 3, "{warned:?}");
    assert!(
        warned[0].starts_with(
            "AUTH_PATHS is unset and its default /login is shadowed: the ROUTES entry for /* (rule \"all\")"
        ),
        "{warned:?}"
    );
}

#[test]
fn a_backend_port_out_of_range_is_an_error() {
    for url in [
        "http://127.0.0.1:70000",
        "http://backend:0/",
        "http://backend:/",
        "http://[::1]:65536",
    ] {
        let message = parse(&[])
            .and(Config::from_vars([("BACKEND_URL", url)]))
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(&format!(
                "BACKEND_URL={url:?} is invalid: expected a port from 1 to 65535"
            )),
            "{message}"
        );
    }
    for url in [
        "http://127.0.0.1:65535",
        "http://[::1]:8000/api",
        "http://[::1]/",
        "http://backend",
    ] {
        Config::from_vars([("BACKEND_URL", url)]).unwrap();
    }
}

#[test]
fn a_body_minimum_rate_is_on_by_default_over_at_least_the_idle_timeout() {
    let defaults = parse(&[]).unwrap();
    let rate = defaults
        .proxy
        .as_ref()
        .unwrap()
        .body_min_rate
        .expect("on by default");
    assert_eq!(rate.bytes_per_second(), 500);
    assert_eq!(rate.window(), Duration::from_secs(30));
    assert_eq!(rate.quota(), 15_000);
    assert!(
        defaults
            .to_string()
            .contains("request bodies:   cut after 30000 ms without data, or below 500 B/s over 30000 ms"),
        "{defaults}"
    );
    // A longer idle timeout lengthens the default window with it, a shorter one does not.
    let long = parse(&[("BODY_IDLE_TIMEOUT_MS", "120000")]).unwrap();
    assert_eq!(
        long.proxy.as_ref().unwrap().body_min_rate.unwrap().window(),
        Duration::from_secs(120)
    );
    let short = parse(&[("BODY_IDLE_TIMEOUT_MS", "300")]).unwrap();
    assert_eq!(
        short.proxy.as_ref().unwrap().body_min_rate.unwrap().window(),
        Duration::from_secs(30)
    );
    let set = parse(&[("BODY_MIN_RATE", "2000"), ("BODY_MIN_RATE_WINDOW_MS", "500")]).unwrap();
    let rate = set.proxy.as_ref().unwrap().body_min_rate.unwrap();
    assert_eq!(
        (rate.bytes_per_second(), rate.window(), rate.quota()),
        (2000, Duration::from_millis(500), 1000)
    );
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    let off = parse(&[("BODY_MIN_RATE", "0"), ("BODY_MIN_RATE_WINDOW_MS", "500")]).unwrap();
    assert_eq!(off.proxy.as_ref().unwrap().body_min_rate, None);
    assert!(
        off.to_string()
            .contains("cut after 30000 ms without data, no minimum rate"),
        "{off}"
    );
    assert_eq!(
        off.warnings,
        ["BODY_MIN_RATE_WINDOW_MS is set but not used with this configuration (see .env.example)"]
    );
}

#[test]
fn the_probe_finds_the_admin_listener_like_the_server_binds_it() {
    let at = |vars: &[(&str, &str)]| {
        admin_address(&Env::new(vars.iter().copied()))
            .unwrap()
            .to_string()
    };
    assert_eq!(at(&[]), "127.0.0.1:9091");
    // BIND is the proxy's: the admin listener stays on loopback unless ADMIN_BIND moves it.
    assert_eq!(
        at(&[("BIND", "10.0.0.5"), ("ADMIN_PORT", "9100")]),
        "127.0.0.1:9100"
    );
    assert_eq!(at(&[("ADMIN_BIND", "0.0.0.0")]), "127.0.0.1:9091");
    assert_eq!(at(&[("ADMIN_BIND", "::")]), "[::1]:9091");
    assert_eq!(at(&[("ADMIN_BIND", "10.0.0.5")]), "10.0.0.5:9091");
    for vars in [
        &[][..],
        &[("ADMIN_BIND", "0.0.0.0")],
        &[("ADMIN_BIND", "10.0.0.5")],
    ] {
        let config = crate::Config::from_vars(
            vars.iter()
                .copied()
                .chain([("BACKEND_URL", "http://127.0.0.1:9")]),
        )
        .unwrap();
        let probed = admin_address(&Env::new(vars.iter().copied())).unwrap();
        let bound = config.admin.address;
        assert!(
            probed == bound
                || (bound.ip().is_unspecified()
                    && probed.ip().is_loopback()
                    && probed.port() == bound.port()),
            "the probe goes where the server binds: {probed} for {bound}"
        );
    }
    assert!(admin_address(&Env::new([("ADMIN_PORT", "x")])).is_err());
}

#[test]
fn decide_port_alone_is_a_decision_service_without_a_proxy() {
    let config = Config::from_vars([("DECIDE_PORT", "8081")]).unwrap();
    assert!(config.proxy.is_none());
    let decide = config.decide.unwrap();
    assert_eq!(decide.listen.port(), 8081);
    assert!(decide.token.is_none());
    let both = parse(&[("DECIDE_PORT", "8081")]).unwrap();
    assert!(both.proxy.is_some() && both.decide.is_some());
    let neither = Config::from_vars(Vec::<(String, String)>::new())
        .unwrap_err()
        .to_string();
    assert!(
        neither.contains("BACKEND_URL is required") && neither.contains("DECIDE_PORT"),
        "{neither}"
    );
}

#[test]
fn decide_port_and_token_mistakes_are_named() {
    assert!(error(&[("DECIDE_PORT", "0")]).contains("DECIDE_PORT"));
    assert!(error(&[("DECIDE_PORT", "http")]).contains("DECIDE_PORT"));
    assert!(error(&[("DECIDE_PORT", "8080")]).contains("is PORT too"));
    assert!(error(&[("DECIDE_PORT", "9091")]).contains("is ADMIN_PORT too"));
    let short = error(&[("DECIDE_PORT", "8081"), ("DECIDE_TOKEN", "changeme")]);
    assert!(
        short.contains("DECIDE_TOKEN") && short.contains("at least 16"),
        "{short}"
    );
    assert!(!short.contains("changeme"), "a secret is never shown: {short}");
    let token = "0123456789abcdef0123";
    let config = parse(&[("DECIDE_PORT", "8081"), ("DECIDE_TOKEN", token)]).unwrap();
    let token_kept = config.decide.unwrap().token.unwrap();
    assert!(token_kept.matches(token.as_bytes()));
    assert!(!token_kept.matches(b"0123456789abcdef012"));
    assert_eq!(format!("{token_kept:?}"), "Token(***)");
}

#[test]
fn env_example_shows_each_default_as_the_parsers_use_it() {
    let example = include_str!("../../.env.example");
    for var in crate::variables::ALL {
        let Some(default) = var.default else { continue };
        let line = format!("{}={default}", var.name);
        let shown = example
            .lines()
            .any(|written| written.trim_start_matches("# ") == line);
        // Empty defaults are written `# NAME=`.
        assert!(shown, ".env.example does not show {line}");
    }
}

#[test]
fn unset_means_the_default() {
    let config = parse(&[]).unwrap();
    let explicit: Vec<(&str, &str)> = crate::variables::ALL
        .iter()
        .filter(|var| var.name != "BACKEND_URL")
        .filter_map(|var| Some((var.name, var.default?)))
        .filter(|(_, default)| !default.is_empty())
        .collect();
    let set = parse(&explicit).unwrap();
    assert_eq!(format!("{set}"), format!("{config}"));
}

#[test]
fn admin_token_is_a_secret_of_16_characters_or_more() {
    assert!(
        parse(&[]).unwrap().admin.token.is_none(),
        "unset: no admin operations"
    );
    let short = error(&[("ADMIN_TOKEN", "changeme")]);
    assert!(
        short.contains("ADMIN_TOKEN") && short.contains("at least 16"),
        "{short}"
    );
    assert!(!short.contains("changeme"), "a secret is never shown: {short}");
    let token = "an-admin-token-of-some-length";
    let kept = parse(&[("ADMIN_TOKEN", token)]).unwrap().admin.token.unwrap();
    assert!(kept.matches(token.as_bytes()));
    assert!(!kept.matches(b"an-admin-token-of-some-lengt"));
}

#[test]
fn the_state_file_is_off_unless_set_saved_every_minute_and_refused_with_redis() {
    let state_file = |vars: &[(&str, &str)]| parse(vars).unwrap().store.state_file;
    assert_eq!(state_file(&[]), None);
    let on = state_file(&[("STATE_FILE", "/var/lib/tollgate/state")]).unwrap();
    assert_eq!(on.path, std::path::Path::new("/var/lib/tollgate/state"));
    assert_eq!(on.save_interval, Some(Duration::from_secs(60)));
    assert_eq!(
        on.to_string(),
        "/var/lib/tollgate/state (read at start; saved every 60 s and on shutdown)"
    );
    let shutdown_only = state_file(&[("STATE_FILE", "state"), ("STATE_SAVE_INTERVAL_S", "0")]).unwrap();
    assert_eq!(shutdown_only.save_interval, None);
    let shown = parse(&[("STATE_FILE", "state"), ("STATE_SAVE_INTERVAL_S", "0")])
        .unwrap()
        .to_string();
    assert!(
        shown.contains("state file:       state (read at start; saved on shutdown only)"),
        "{shown}"
    );
    assert!(parse(&[]).unwrap().to_string().contains("state file:       off"));
    for (vars, expected) in [
        (
            &[("STATE_FILE", "state"), ("STATE_SAVE_INTERVAL_S", "1m")][..],
            "STATE_SAVE_INTERVAL_S=\"1m\" is invalid",
        ),
        (
            &[("STATE_FILE", "state"), ("STATE_SAVE_INTERVAL_S", "86401")],
            "STATE_SAVE_INTERVAL_S=\"86401\" is invalid",
        ),
        (
            &[("STATE_FILE", "/var/lib/tollgate/")],
            "STATE_FILE=\"/var/lib/tollgate/\" is invalid",
        ),
        (
            &[("STATE_FILE", "state"), ("REDIS_ADDR", "db:6379")],
            "STATE_FILE saves the memory store, but a Redis variable selects Redis",
        ),
        // Checked even when not read.
        (
            &[("STATE_SAVE_INTERVAL_S", "often")],
            "STATE_SAVE_INTERVAL_S=\"often\" is invalid",
        ),
    ] {
        let error = error(vars);
        assert!(error.contains(expected), "{vars:?}: {error}");
    }
    assert_eq!(
        warnings(&[("STATE_SAVE_INTERVAL_S", "10")]),
        ["STATE_SAVE_INTERVAL_S is set but not used: it goes with STATE_FILE"]
    );
}

#[test]
fn refusals_and_the_backends_budget_are_configured_for_every_door() {
    let config = parse(&[("DECIDE_PORT", "8081")]).unwrap();
    let proxy = config.proxy.as_ref().unwrap();
    assert_eq!(proxy.refusals.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(proxy.refusals.format(), crate::refusal::DenyFormat::Json);
    assert!(!proxy.forward_headers);
    let config = parse(&[
        ("DECIDE_PORT", "8081"),
        ("DENY_STATUS", "503"),
        ("DENY_FORMAT", "problem"),
        ("FORWARD_RATELIMIT_HEADERS", "true"),
    ])
    .unwrap();
    // The proxy and the decision endpoints refuse alike.
    for (refusals, forward) in [
        (
            &config.proxy.as_ref().unwrap().refusals,
            config.proxy.as_ref().unwrap().forward_headers,
        ),
        (
            &config.decide.as_ref().unwrap().refusals,
            config.decide.as_ref().unwrap().forward_headers,
        ),
    ] {
        assert_eq!(refusals.status().as_u16(), 503);
        assert_eq!(refusals.format(), crate::refusal::DenyFormat::Problem);
        assert!(forward);
    }
    assert!(
        config
            .to_string()
            .contains("refusals:         503 problem (unless Accept prefers another of json, problem, text); RateLimit fields to the backend: yes"),
        "{config}"
    );
    for (vars, says) in [
        (&[("DENY_STATUS", "204")][..], "DENY_STATUS=\"204\" is invalid"),
        (&[("DENY_STATUS", "401")], "WWW-Authenticate"),
        (
            &[("DENY_FORMAT", "html")],
            "DENY_FORMAT=\"html\" is invalid: expected json, problem or text",
        ),
        (
            &[("FORWARD_RATELIMIT_HEADERS", "1")],
            "FORWARD_RATELIMIT_HEADERS=\"1\"",
        ),
    ] {
        let error = error(vars);
        assert!(error.contains(says), "{vars:?}: {error}");
    }
}

#[test]
fn limit_lists_join_limits_with_a_plus_wherever_a_rule_has_numbers() {
    let config = parse(&[
        ("LIMITS", "token_bucket:20:10+fixed_window:10000:86400"),
        ("AUTH_LIMITS", "sliding_log:5:60+fixed_window:20:3600"),
        (
            "ROUTES",
            "/api/*=gcra:5:1+sliding_window:100:60+fixed_window:1000:86400,name=api",
        ),
    ])
    .unwrap();
    let names =
        |rule: &crate::rules::Rule| rule.limits.iter().map(|policy| policy.name()).collect::<Vec<_>>();
    assert_eq!(names(general(&config)), ["token_bucket", "fixed_window"]);
    assert_eq!(names(auth(&config)), ["sliding_log", "fixed_window"]);
    let api = config.rule_table().rule("api").unwrap();
    assert_eq!(names(api), ["token_bucket", "sliding_window", "fixed_window"]);
    assert_eq!(api.limits.capacity(), 5, "the smallest limit");
}

#[test]
fn a_wrong_limit_list_names_the_limit_and_what_is_wrong() {
    for (vars, words) in [
        (
            &[("LIMITS", "token_bucket:20:10+fixed_window:0:86400")][..],
            &["LIMITS", "limit \"fixed_window:0:86400\"", "whole number"][..],
        ),
        (
            &[("LIMITS", "token_bucket:20:10+leaky:1:1")],
            &["LIMITS", "unknown algorithm \"leaky\""],
        ),
        (
            &[("AUTH_LIMITS", "fixed_window:5:60+fixed_window:5:60")],
            &["AUTH_LIMITS", "written twice"],
        ),
        (
            &[("ROUTES", "/a=token_bucket:1:1+")],
            &["ROUTES", "/a=token_bucket:1:1+", "expected ALGORITHM:A:B"],
        ),
        (
            &[(
                "LIMITS",
                "fixed_window:1:1+fixed_window:2:1+fixed_window:3:1+fixed_window:4:1+fixed_window:5:1+fixed_window:6:1+fixed_window:7:1",
            )],
            &["LIMITS", "7 limits, more than the 6 one rule holds"],
        ),
        (
            &[
                ("LIMITS", "token_bucket:20:10+fixed_window:10000:86400"),
                ("MAX_TOKENS", "5"),
            ],
            &["LIMITS", "MAX_TOKENS"],
        ),
        (
            &[("ROUTES", "/a=token_bucket:5:1+fixed_window:2:60,cost=3")],
            &["cost 3 is above the rule's capacity of 2"],
        ),
    ] {
        let message = error(vars);
        for word in words {
            assert!(message.contains(word), "{vars:?}: {message}");
        }
    }
}

/// An overrides file of `text`, under the system's temporary directory, named by `name`.
fn overrides_file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("tollgate-overrides-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn overrides_and_tiers_become_variants_and_show_in_check_config() {
    let path = overrides_file(
        "shown",
        "general key:sk_live_abc token_bucket:1000:100\n# a comment\n\ngeneral 10.0.0.0/8 unlimited\nauth 203.0.113.7 deny # at once\ngeneral 10.1.0.0/16 token_bucket:1000:100\n",
    );
    let config = parse(&[
        ("OVERRIDES_FILE", &path),
        ("KEY_BY", "header:X-API-Key"),
        (
            "TIERS",
            "free=token_bucket:10:1;pro=token_bucket:100:10+fixed_window:100000:86400",
        ),
        ("TIER_HEADER", "X-Plan"),
        ("TRUSTED_PROXIES", "10.0.0.1"),
    ])
    .unwrap();
    let table = &config.gate.rules;
    let names: Vec<&str> = table.variants().iter().map(|rule| &*rule.name).collect();
    assert_eq!(
        names,
        ["general@free", "general@pro", "general@token_bucket:1000:100"],
        "one variant per tier and rule (not auth), one per distinct limit list"
    );
    assert_eq!(table.overrides().entries().len(), 4);
    let shown = config.to_string();
    for words in [
        "tiers:            named by x-plan",
        "pro -> token_bucket: 100 tokens",
        "overrides:        4",
        "general key:*** (value not shown) -> general@token_bucket:1000:100",
        "auth 203.0.113.7/32 -> deny",
        "general 10.0.0.0/8 -> unlimited",
    ] {
        assert!(shown.contains(words), "{words:?} not in {shown}");
    }
    assert!(!shown.contains("sk_live_abc"), "a key's value is never shown");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_wrong_override_or_tier_names_the_file_the_line_and_what_is_wrong() {
    for (name, text, words) in [
        ("fields", "general 10.0.0.1\n", &[":1", "3 fields"][..]),
        (
            "rule",
            "\nbilling 10.0.0.1 deny\n",
            &[":2", "no rule is named \"billing\""],
        ),
        (
            "client",
            "general nobody deny\n",
            &[":1", "not an address, a CIDR or key:VALUE"],
        ),
        (
            "keyless",
            "general key:secret-value deny\n",
            &[":1", "keyed by one source", "key:***"],
        ),
        (
            "limits",
            "general 10.0.0.1 token_bucket:0:1\n",
            &[":1", "capacity"],
        ),
        (
            "twice",
            "general 10.0.0.0/8 deny\ngeneral 10.0.0.0/8 unlimited\n",
            &[":2", "line 1 already"],
        ),
        ("everyone", "general 0.0.0.0/0 deny\n", &[":1", "every client"]),
    ] {
        let path = overrides_file(name, text);
        let message = error(&[("OVERRIDES_FILE", &path)]);
        assert!(message.contains("OVERRIDES_FILE"), "{name}: {message}");
        assert!(!message.contains("secret-value"), "{name}: {message}");
        for word in words {
            assert!(message.contains(word), "{name}: {word:?} not in {message}");
        }
        std::fs::remove_file(path).unwrap();
    }
    assert!(error(&[("OVERRIDES_FILE", "/nonexistent/overrides")]).contains("cannot be read"));
    for (vars, words) in [
        (
            &[("TIERS", "pro=token_bucket:100:10")][..],
            &["TIERS", "TIER_HEADER", "go together"][..],
        ),
        (&[("TIER_HEADER", "X-Plan")], &["TIERS", "TIER_HEADER"]),
        (
            &[("TIERS", "Pro=token_bucket:100:10"), ("TIER_HEADER", "X-Plan")],
            &["TIERS", "tier name"],
        ),
        (
            &[
                ("TIERS", "pro=token_bucket:1:1;pro=token_bucket:2:1"),
                ("TIER_HEADER", "X-Plan"),
            ],
            &["named twice"],
        ),
        (
            &[("TIERS", "pro=leaky:1:1"), ("TIER_HEADER", "X-Plan")],
            &["TIERS", "unknown algorithm"],
        ),
        (
            &[("TIERS", "pro=token_bucket:1:1"), ("TIER_HEADER", "X Plan")],
            &["TIER_HEADER", "header name"],
        ),
    ] {
        let message = error(vars);
        for word in words {
            assert!(message.contains(word), "{vars:?}: {word:?} not in {message}");
        }
    }
    let warned = warnings(&[("TIERS", "pro=token_bucket:100:10"), ("TIER_HEADER", "X-Plan")]);
    assert!(
        warned
            .iter()
            .any(|line| line.contains("TRUSTED_PROXIES is empty")),
        "{warned:?}"
    );
}

#[test]
fn delays_are_read_per_rule_and_routes_inherit_the_general_one() {
    use std::time::Duration;
    let none = parse(&[]).unwrap();
    assert!(none.gate.rules.rules().iter().all(|rule| rule.delay.is_none()));
    assert_eq!(
        (none.gate.delay_bounds.overall, none.gate.delay_bounds.per_client),
        (1000, 4)
    );
    let config = parse(&[
        ("DELAY_MAX_MS", "500"),
        ("AUTH_DELAY_MAX_MS", "2000"),
        (
            "ROUTES",
            "/a=token_bucket:1:1,name=a;/b=fixed_window:5:1,name=b,delay=1500;/c=sliding_log:5:1,name=c,delay=0",
        ),
        ("DELAY_QUEUE", "50"),
        ("DELAY_QUEUE_PER_CLIENT", "2"),
    ])
    .unwrap();
    let delay = |name: &str| config.gate.rules.rule(name).unwrap().delay;
    assert_eq!(delay("general"), Some(Duration::from_millis(500)));
    assert_eq!(delay("auth"), Some(Duration::from_secs(2)));
    assert_eq!(delay("a"), Some(Duration::from_millis(500)), "inherited");
    assert_eq!(delay("b"), Some(Duration::from_millis(1500)));
    assert_eq!(delay("c"), None, "delay=0 turns it off");
    assert_eq!(
        (
            config.gate.delay_bounds.overall,
            config.gate.delay_bounds.per_client
        ),
        (50, 2)
    );
    // --check-config says so, and the table's digest tells the two tables apart.
    let text = config.to_string();
    assert!(
        text.contains("b: fixed_window: 5 requests per 1 s (key ip, cost 1, enforce, delays up to 1500 ms)"),
        "{text}"
    );
    assert!(
        text.contains("delay queue:      at most 50 requests waiting (2 per client and rule)"),
        "{text}"
    );
    assert!(!none.to_string().contains("delay queue"));
    let undelayed = parse(&[("ROUTES", "/a=token_bucket:1:1,name=a")]).unwrap();
    let delayed = parse(&[("ROUTES", "/a=token_bucket:1:1,name=a,delay=10")]).unwrap();
    assert_ne!(undelayed.gate.rules.digest(), delayed.gate.rules.digest());
    // Every algorithm today has an exact retry time, so each may be delayed.
    for algorithm in ["token_bucket", "sliding_window", "fixed_window", "sliding_log"] {
        let route = format!("/x={algorithm}:5:1,delay=100");
        assert!(parse(&[("ROUTES", &route)]).is_ok(), "{algorithm}");
    }
}

#[test]
fn a_bad_delay_is_an_error_naming_its_variable_or_entry() {
    for (vars, start) in [
        (
            &[("DELAY_MAX_MS", "60001")][..],
            r#"DELAY_MAX_MS="60001" is invalid: expected a whole number of milliseconds from 0"#,
        ),
        (
            &[("AUTH_DELAY_MAX_MS", "-1")],
            r#"AUTH_DELAY_MAX_MS="-1" is invalid"#,
        ),
        (&[("DELAY_MAX_MS", "1.5")], r#"DELAY_MAX_MS="1.5" is invalid"#),
        (
            &[("DELAY_QUEUE", "0")],
            r#"DELAY_QUEUE="0" is invalid: expected a whole number of at least 1"#,
        ),
        (
            &[("DELAY_QUEUE_PER_CLIENT", "x")],
            r#"DELAY_QUEUE_PER_CLIENT="x" is invalid"#,
        ),
    ] {
        let message = error(vars);
        assert!(message.starts_with(start), "{vars:?}: {message}");
    }
    let message = error(&[("ROUTES", "/a=token_bucket:1:1,delay=70000")]);
    assert!(
        message.starts_with(r#"ROUTES entry "/a=token_bucket:1:1,delay=70000" is invalid: delay "70000": expected a whole number of milliseconds"#),
        "{message}"
    );
    let message = error(&[("ROUTES", "/a=token_bucket:1:1,delay")]);
    assert!(message.contains("delay= or shadow"), "{message}");
}

#[test]
fn a_rules_files_delays_are_its_variables_and_a_bad_one_is_located_in_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    let path_text = path.to_str().unwrap();
    std::fs::write(
        &path,
        "[general]\ndelay = 250\n\n[auth]\ndelay = 100\n\n[[routes]]\npath = \"/a\"\nlimits = \"token_bucket:1:1\"\nname = \"a\"\ndelay = 1500\n",
    )
    .unwrap();
    let config = parse(&[("RULES_FILE", path_text)]).unwrap();
    let delay = |name: &str| config.gate.rules.rule(name).unwrap().delay;
    assert_eq!(delay("general"), Some(Duration::from_millis(250)));
    assert_eq!(delay("auth"), Some(Duration::from_millis(100)));
    assert_eq!(delay("a"), Some(Duration::from_millis(1500)));
    std::fs::write(
        &path,
        "[[routes]]\npath = \"/a\"\nlimits = \"token_bucket:1:1\"\ndelay = 60001\n",
    )
    .unwrap();
    let message = error(&[("RULES_FILE", path_text)]);
    assert!(
        message.contains(&format!("{path_text}:2: routes[0]")) && message.contains("delay \"60001\""),
        "{message}"
    );
    std::fs::write(&path, "[general]\ndelay = 60001\n").unwrap();
    let message = error(&[("RULES_FILE", path_text)]);
    assert!(
        message.contains(&format!("{path_text}:2: general.delay")) && message.contains("DELAY_MAX_MS"),
        "{message}"
    );
}

#[test]
fn a_delay_on_a_shadowed_rule_is_warned_about() {
    let warned = warnings(&[("ROUTES", "/a=token_bucket:1:1,shadow,delay=100")]);
    assert!(
        warned
            .iter()
            .any(|warning| warning.starts_with("ROUTES entry for /a: delay= changes nothing")),
        "{warned:?}"
    );
    let warned = warnings(&[("SHADOW_MODE", "true"), ("DELAY_MAX_MS", "100")]);
    assert!(
        warned
            .iter()
            .any(|warning| warning.contains("changes nothing under SHADOW_MODE=true")),
        "{warned:?}"
    );
    assert!(warnings(&[("DELAY_MAX_MS", "100")]).is_empty());
}

#[test]
fn the_response_cost_header_is_a_header_name_and_shows_in_check_config() {
    let message = error(&[("RESPONSE_COST_HEADER", "X Tokens Used")]);
    assert!(
        message.contains("RESPONSE_COST_HEADER") && message.contains("header name"),
        "{message}"
    );
    let config = parse(&[("RESPONSE_COST_HEADER", "X-Tokens-Used")]).unwrap();
    assert!(
        config.to_string().contains("reported costs:   x-tokens-used"),
        "{config}"
    );
}

#[test]
fn concurrent_is_a_limit_of_any_list_with_an_optional_lease() {
    use crate::algorithms::Concurrent;
    use crate::algorithms::concurrent::DEFAULT_LEASE_MS;
    let config = parse(&[
        ("LIMITS", "concurrent:10"),
        ("AUTH_LIMITS", "sliding_log:5:60+concurrent:2:30"),
        ("ROUTES", "/api/*=token_bucket:5:1+concurrent:3:0.5e1,name=api"),
    ])
    .unwrap();
    assert_eq!(
        general(&config).limits.first(),
        &Policy::Concurrent(Concurrent {
            places: 10,
            lease_ms: DEFAULT_LEASE_MS
        })
    );
    assert_eq!(
        auth(&config).limits[1],
        Policy::Concurrent(Concurrent {
            places: 2,
            lease_ms: 30_000
        })
    );
    let api = config.rule_table().rule("api").unwrap();
    assert_eq!(
        api.limits[1],
        Policy::Concurrent(Concurrent {
            places: 3,
            lease_ms: 5_000
        })
    );
    assert!(!api.limits[1].exact_retry());
    assert!(api.limits.first().exact_retry());
    // LIMITS of concurrency alone: the auth rule keeps ALGORITHM's default, not concurrent.
    let only = parse(&[("LIMITS", "concurrent:4")]).unwrap();
    assert_eq!(auth(&only).limits.first().name(), "token_bucket");
}

#[test]
fn a_wrong_concurrency_limit_names_the_variable_and_what_is_wrong() {
    for (vars, words) in [
        (
            &[("LIMITS", "concurrent:0")][..],
            &["LIMITS", "places \"0\"", "from 1 to 10000"][..],
        ),
        (&[("LIMITS", "concurrent:10001")], &["LIMITS", "from 1 to 10000"]),
        (
            &[("ROUTES", "/a=concurrent:2:0.5")],
            &["ROUTES", "lease seconds \"0.5\"", "from 1 to 86400"],
        ),
        (&[("LIMITS", "concurrent")], &["LIMITS", "concurrent:N"]),
        (
            &[("LIMITS", "concurrent:1:2:3")],
            &["LIMITS", "expected ALGORITHM:A:B"],
        ),
        (
            &[("ALGORITHM", "concurrent")],
            &["ALGORITHM", "LIMITS=concurrent:N"],
        ),
        (
            &[("ROUTES", "/a=concurrent:2,cost=3")],
            &["cost 3 is above the rule's capacity of 2"],
        ),
    ] {
        let message = error(vars);
        for word in words {
            assert!(message.contains(word), "{vars:?}: {message}");
        }
    }
}

/// The three sources of rules yield one specification for one rule: a `ROUTES` entry, the
/// same route in a rules file, and (where the concepts overlap: limits, shadow, cost, count,
/// fail mode, delay) an Envoy descriptor's rate limit.
#[test]
fn routes_a_rules_file_and_an_rls_limit_yield_equal_specifications() {
    use crate::config::rules_file::RulesFile;
    use crate::config::spec::{Context, RouteEntry};
    use crate::rls::config::DescriptorTable;
    use crate::rules::{Matching, RuleSpec};

    let general = RuleSpec::new(
        "general",
        Matching::Rest,
        crate::algorithms::parse_limits("token_bucket:100:10").unwrap(),
    );
    let context = Context { shared_store: true };
    let spec = |route: &RouteEntry| route.spec(&general, &context, &mut Vec::new()).unwrap();

    let from_routes =
        spec(&RouteEntry::parse("/api/*=fixed_window:5:60,name=api,shadow,method=GET").unwrap());
    let file = RulesFile::parse(
        "rules.toml",
        "[[routes]]\npath = \"/api/*\"\nlimits = [\"fixed_window:5:60\"]\nname = \"api\"\nshadow = true\nmethod = \"get\"\n",
    )
    .unwrap();
    let from_file = spec(&file.routes().unwrap()[0]);
    assert_eq!(from_routes, from_file);
    assert_eq!(&*from_routes.rule.name, "api");
    assert_eq!(
        from_routes.routes()[0].methods.as_deref(),
        Some(&[Method::GET, Method::HEAD][..])
    );

    let rls = DescriptorTable::parse([(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: path\n    value: /api\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )])
    .unwrap();
    let from_rls = rls.specs(general.rule.fail_mode, general.rule.shadow).remove(0);
    assert_eq!(from_rls.matching, Matching::Named);
    assert_eq!(&*from_rls.rule.name, "rls/edge/path=%2Fapi");
    // Beside what it is called and how it is matched, the same rule.
    let unnamed = |spec: &RuleSpec| crate::rules::Rule {
        name: "".into(),
        ..spec.rule.clone()
    };
    assert_eq!(unnamed(&from_rls), unnamed(&from_routes));

    // Compiled, the ROUTES entry and the rules file make one table.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(
        &path,
        "[[routes]]\npath = \"/api/*\"\nlimits = \"fixed_window:5:60\"\nname = \"api\"\nshadow = true\nmethod = [\"GET\"]\n",
    )
    .unwrap();
    let secret = ("KEY_HASH_SECRET", "0123456789abcdef0123");
    let by_env = parse(&[
        ("ROUTES", "/api/*=fixed_window:5:60,name=api,shadow,method=GET"),
        secret,
    ])
    .unwrap();
    let by_file = parse(&[("RULES_FILE", path.to_str().unwrap()), secret]).unwrap();
    assert!(by_env.gate.rules.decides_like(&by_file.gate.rules));
}

/// A route's attribute is parsed by one parser whichever source wrote it, so both refuse a
/// bad value in the same words; the file's error says where.
#[test]
fn a_bad_attribute_is_refused_alike_in_routes_and_the_rules_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    for (option, key) in [
        ("count=some", "count = \"some\""),
        ("fail=maybe", "fail = \"maybe\""),
        ("key=header:X-Forwarded-For", "key = \"header:X-Forwarded-For\""),
        ("name=Api", "name = \"Api\""),
        ("method=G@T", "method = \"G@T\""),
    ] {
        let by_env = error(&[("ROUTES", &format!("/a=token_bucket:5:1,{option}"))]);
        std::fs::write(
            &path,
            format!("[[routes]]\npath = \"/a\"\nlimits = \"token_bucket:5:1\"\n{key}\n"),
        )
        .unwrap();
        let by_file = error(&[("RULES_FILE", path.to_str().unwrap())]);
        let (_, problem) = by_env.split_once(" is invalid: ").unwrap();
        assert!(by_file.ends_with(problem), "{by_env} / {by_file}");
        assert!(by_file.contains(":2: routes[0]"), "{by_file}");
    }
}

/// A rules file's routes take the place of `ROUTES`: both set is an error naming both, and a
/// route's error names the file, the line and `routes[N]`, never a `ROUTES` entry.
#[test]
fn a_rules_files_routes_replace_routes_and_say_where_they_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    let path_text = path.to_str().unwrap();
    std::fs::write(
        &path,
        "[[routes]]\npath = \"/a\"\nlimits = \"token_bucket:5:1\"\n\n[[routes]]\npath = \"/a\"\nlimits = \"gcra:1:1\"\nname = \"b\"\n",
    )
    .unwrap();
    let both = error(&[("RULES_FILE", path_text), ("ROUTES", "/x=token_bucket:1:1")]);
    assert!(
        both.contains("ROUTES is set in the environment and routes[0] in RULES_FILE")
            && both.contains("line 2"),
        "{both}"
    );
    let shadowed = error(&[("RULES_FILE", path_text)]);
    assert!(
        shadowed.contains(&format!(
            "{path_text}:6: routes[1]: it can never match: the earlier entry for /a"
        )),
        "{shadowed}"
    );
    assert!(!shadowed.contains("ROUTES entry"), "{shadowed}");
}
