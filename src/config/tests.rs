use super::*;

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut all = vec![("BACKEND_URL", "http://127.0.0.1:8000")];
    all.extend_from_slice(vars);
    Config::from_vars(all)
}

fn error(vars: &[(&str, &str)]) -> String {
    parse(vars).expect_err("should be rejected").to_string()
}

#[test]
fn defaults_match_the_go_service() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(
        config.general.policy,
        Policy::TokenBucket(TokenBucket {
            capacity: 10,
            interval_us: 1_000_000
        })
    );
    assert_eq!(
        config.auth.policy,
        Policy::TokenBucket(TokenBucket {
            capacity: 5,
            interval_us: 100_000_000
        })
    );
    assert_eq!(config.auth_paths.to_string(), "/login,/signup,/reset-password");
    assert!(config.trusted_proxies.is_empty());
    assert_eq!(config.max_keys.get(), 100_000);
    assert_eq!(config.log_format, LogFormat::Text);
    assert_eq!(config.backend_timeout, Duration::from_secs(30));
    assert_eq!(config.store, StoreConfig::Memory);
    assert_eq!(config.backend.base_path, "");
}

#[test]
fn sliding_window_reads_only_its_own_variables() {
    let config = parse(&[
        ("ALGORITHM", "sliding_window"),
        ("LIMIT", "100"),
        ("WINDOW_SIZE", "0.5"),
        ("AUTH_LIMIT", "3"),
        ("MAX_TOKENS", "not read"),
    ])
    .unwrap();
    assert_eq!(
        config.general.policy,
        Policy::SlidingWindow(SlidingWindow {
            limit: 100,
            window_ms: 500
        })
    );
    assert_eq!(
        config.auth.policy,
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
    assert_eq!(config.auth_paths.to_string(), "/a,/b/*");
    let proxies: Vec<String> = config.trusted_proxies.iter().map(ToString::to_string).collect();
    assert_eq!(proxies, ["10.0.0.0/8", "192.168.1.7/32", "::1/128"]);
    assert_eq!(config.listen.port(), 8080);
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
        (&[("BACKEND_URL", "https://x")], "BACKEND_URL=\"https://x\""),
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
        (&[("MAX_KEYS", "0")], "MAX_KEYS=\"0\""),
        (&[("LOG_FORMAT", "xml")], "LOG_FORMAT=\"xml\""),
        (&[("BACKEND_TIMEOUT_MS", "1s")], "BACKEND_TIMEOUT_MS=\"1s\""),
        (&[("REDIS_ADDR", "nohost")], "REDIS_ADDR=\"nohost\""),
        (
            &[("REDIS_ADDR", "h:1"), ("FAIL_MODE", "maybe")],
            "FAIL_MODE=\"maybe\"",
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
    let StoreConfig::Redis(redis) = &config.store else {
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
    let StoreConfig::Redis(redis) = config.store else {
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
    assert_eq!(redis.guard.fail_mode, FailMode::Closed);
    assert!(error(&[("REDIS_ADDR", "a:1"), ("REDIS_URL", "redis://b")]).contains("only one of"));
    let config = parse(&[("REDIS_URL", "rediss://:pw@cache.internal:6380/1")]).unwrap();
    let StoreConfig::Redis(redis) = config.store else {
        panic!("redis store expected")
    };
    assert_eq!(redis.target.redacted(), "rediss://:***@cache.internal:6380/1");
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
    assert_eq!(config.backend.authority.as_str(), "api.internal:9000");
    assert_eq!(config.backend.base_path, "/v1");
}

#[test]
fn check_config_output_shows_the_rules() {
    let shown = parse(&[]).unwrap().to_string();
    assert!(
        shown.contains("general rule:     token_bucket: 10 tokens, refill 1/s"),
        "{shown}"
    );
    assert!(
        shown.contains("auth rule:        token_bucket: 5 tokens, refill 0.01/s"),
        "{shown}"
    );
}

#[test]
fn fail_mode_local_is_accepted() {
    let config = parse(&[("REDIS_ADDR", "db:6379"), ("FAIL_MODE", "local")]).unwrap();
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("redis store expected")
    };
    assert_eq!(redis.guard.fail_mode, FailMode::Local);
    assert!(config.to_string().contains("fail local"));
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
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("redis store expected")
    };
    assert_eq!(redis.target, RedisTarget::Single("rediss://cache:6380".into()));
    let config = parse(&[("REDIS_CLUSTER_NODES", "a:1"), ("REDIS_TLS", "true")]).unwrap();
    assert!(config.to_string().contains("cluster a:1 (TLS)"), "{config}");
    assert!(error(&[("REDIS_ADDR", "a:1"), ("REDIS_TLS", "yes")]).starts_with("REDIS_TLS=\"yes\""));
    assert!(error(&[("REDIS_URL", "redis://a:1"), ("REDIS_TLS", "true")]).contains("REDIS_TLS goes with"));
}
