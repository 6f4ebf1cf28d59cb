//! The real `tollgate` binary: configuration errors, `--check-config`, `.env`, and SIGTERM.

use std::process::{Command, Output};
use std::time::Duration;

use http::StatusCode;

use crate::support::{Backend, free_ports, get, redis::wait_for};

pub(crate) const BINARY: &str = env!("CARGO_BIN_EXE_tollgate");

/// Run the binary with exactly `vars` in its environment, in an empty directory.
fn run(vars: &[(&str, &str)], args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(BINARY)
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .current_dir(dir.path())
        .output()
        .unwrap()
}

/// Two decision services on one Redis digest `/v1/check`'s named keys with the same secret or
/// not at all: without `KEY_HASH_SECRET` each would draw its own, and hold a budget of its own
/// for one client (issue 26, item 11: 20 allowed of 10). Checked with `--check-config`, so a
/// configuration wrongly accepted exits 0 instead of serving forever.
#[test]
fn a_decision_service_with_redis_refuses_to_start_without_a_shared_key_secret() {
    let decide = [("DECIDE_PORT", "9181"), ("REDIS_ADDR", "127.0.0.1:9")];
    let output = run(&decide, &["--check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("KEY_HASH_SECRET is required") && stderr.contains("DECIDE_PORT"),
        "{stderr}"
    );
    let mut with_secret = decide.to_vec();
    with_secret.push(("KEY_HASH_SECRET", "shared-secret-for-the-test"));
    let output = run(&with_secret, &["--check-config"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn each_bad_setting_exits_non_zero_naming_the_variable() {
    let backend = ("BACKEND_URL", "http://127.0.0.1:9");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "BACKEND_URL"),
        (&[("BACKEND_URL", "localhost:8000")], "BACKEND_URL"),
        (&[backend, ("ALGORITHM", "leaky_bucket")], "ALGORITHM"),
        (&[backend, ("MAX_TOKENS", "lots")], "MAX_TOKENS"),
        (&[backend, ("MAX_TOKENS", "0")], "MAX_TOKENS"),
        (&[backend, ("REFILL_RATE", "-1")], "REFILL_RATE"),
        (&[backend, ("AUTH_REFILL_RATE", "0")], "AUTH_REFILL_RATE"),
        (
            &[backend, ("ALGORITHM", "sliding_window"), ("WINDOW_SIZE", "-5")],
            "WINDOW_SIZE",
        ),
        (
            &[backend, ("ALGORITHM", "sliding_window"), ("LIMIT", "0")],
            "LIMIT",
        ),
        (&[backend, ("TRUSTED_PROXIES", "10.0.0.0/99")], "TRUSTED_PROXIES"),
        (&[backend, ("PORT", "http")], "PORT"),
        // Malformed though this configuration does not read it.
        (&[backend, ("AUTH_LIMIT", "five")], "AUTH_LIMIT"),
        // Silently accepted once: each defeats the limit or can never take effect.
        (&[backend, ("TRUSTED_PROXIES", "0.0.0.0/0")], "TRUSTED_PROXIES"),
        (&[backend, ("EXEMPT", "::/0")], "EXEMPT"),
        (&[backend, ("KEY_BY", "header:X-Forwarded-For")], "KEY_BY"),
        (&[backend, ("AUTH_PATHS", "/*")], "AUTH_PATHS"),
        (
            &[backend, ("ROUTES", "/api/*=gcra:5:1;/api/x=gcra:1:1")],
            "ROUTES",
        ),
        (&[("BACKEND_URL", "http://127.0.0.1:70000")], "BACKEND_URL"),
        (
            &[backend, ("REDIS_SENTINELS", "127.0.0.1:26379")],
            "REDIS_SENTINEL_MASTER",
        ),
        (
            &[
                backend,
                ("REDIS_SENTINELS", "127.0.0.1:26379"),
                ("REDIS_SENTINEL_MASTER", "m"),
                ("REDIS_ADDR", "127.0.0.1:6379"),
            ],
            "REDIS_SENTINELS",
        ),
        (
            &[
                backend,
                ("FAIL_MODE", "sideways"),
                ("REDIS_ADDR", "127.0.0.1:6379"),
            ],
            "FAIL_MODE",
        ),
    ];
    for (vars, variable) in cases {
        let output = run(vars, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{vars:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(variable),
            "{vars:?}: {stderr} should name {variable}"
        );
    }
}

#[test]
fn a_redis_password_is_never_printed() {
    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("REDIS_URL", "postgres://admin:hunter2@db"),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("REDIS_URL") && !stderr.contains("hunter2"),
        "{stderr}"
    );

    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("REDIS_URL", "redis://:hunter2@db:6379"),
        ],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        stdout.contains("redis://:***@db:6379") && !stdout.contains("hunter2"),
        "{stdout}"
    );

    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("REDIS_SENTINELS", "s1:26379,s2:26379"),
            ("REDIS_SENTINEL_MASTER", "mymaster"),
            ("REDIS_PASSWORD", "hunter2"),
            ("REDIS_SENTINEL_PASSWORD", "hunter3"),
        ],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        stdout.contains("sentinel master mymaster via s1:26379,s2:26379") && !stdout.contains("hunter"),
        "{stdout}"
    );
}

#[test]
fn check_config_prints_the_effective_rules() {
    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("AUTH_PATHS", "/login,/api/auth/*"),
        ],
        &["--check-config"],
    );
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("general rule:     token_bucket: 10 tokens, refill 1/s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("auth paths:       /login,/api/auth/*"),
        "{stdout}"
    );
}

#[test]
fn check_config_prints_the_whole_table_in_evaluation_order() {
    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            (
                "ROUTES",
                "/api/export/*=gcra:5:0.1,cost=2;/search=sliding_log:100:60,method=GET,key=header:X-API-Key,name=search,shadow",
            ),
            ("AUTH_PATHS", "/login"),
            ("AUTH_ALGORITHM", "fixed_window"),
            ("COSTS", "/api/export/all=5"),
            ("EXEMPT", "10.0.0.0/8,key:batch-job-key"),
            ("SKIP_PATHS", "/healthz"),
        ],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let expected = [
        "rules, first match wins:",
        "   1. /api/export/* -> /api/export/*: token_bucket: 5 tokens, refill 0.1/s \
         (one token every 10000 ms) (key ip, cost 2, enforce)",
        "   2. /search GET|HEAD -> search: sliding_log: 100 requests per 60 s (exact rolling window) \
         (key header:x-api-key, cost 1, shadow)",
        "   3. /login -> auth: fixed_window: 5 requests per 60 s (key ip, cost 1, enforce)",
        "   4. every other path -> general: token_bucket: 10 tokens",
        "costs:            /api/export/all=5",
        "skip paths:       /healthz",
        "exempt:           10.0.0.0/8, header:x-api-key=***",
    ];
    let mut rest = stdout.as_ref();
    for line in expected {
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} missing or out of order in\n{stdout}"));
        rest = &rest[at + line.len()..];
    }
    assert!(!stdout.contains("batch-job-key"), "exempt keys are never shown");
}

#[tokio::test]
async fn a_shadow_denial_is_logged_at_info_and_forwarded() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("MAX_TOKENS", "1"),
        ("SHADOW_MODE", "true"),
    ]);
    assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    let log = tollgate.log();
    assert_eq!(log.matches("shadow rule would have refused").count(), 1, "{log}");
    assert!(
        log.contains("rule=general") && log.contains("client=127.0.0.1"),
        "{log}"
    );
    tollgate.terminate().await;
}

#[test]
fn a_dot_env_file_is_read_and_the_environment_wins() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "BACKEND_URL=http://127.0.0.1:9\nMAX_TOKENS=42\nLIMIT=7\n",
    )
    .unwrap();
    let output = Command::new(BINARY)
        .arg("--check-config")
        .env_clear()
        .env("LIMIT", "8")
        .env("ALGORITHM", "sliding_window")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Valid, with one warning: .env's MAX_TOKENS is not read by a sliding window.
    assert_eq!(
        output.status.code(),
        Some(3),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("warning: MAX_TOKENS is set but not used"),
        "{stdout}"
    );
    assert!(stdout.contains("sliding_window: 8 requests per 60 s"), "{stdout}");
}

/// The binary serving on a free loopback port with `vars` (and nothing else) in its environment.
pub(crate) struct Running {
    pub(crate) child: std::process::Child,
    pub(crate) addr: std::net::SocketAddr,
    /// Its admin listener's port.
    pub(crate) admin_port: u16,
    /// Where its stdout (the log) goes.
    log: tempfile::NamedTempFile,
}

impl Running {
    pub(crate) fn start(vars: &[(&str, &str)]) -> Running {
        Running::start_in(std::path::Path::new("."), vars)
    }

    /// Send it SIGHUP.
    pub(crate) fn hangup(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(sent.success(), "kill -HUP {pid}");
    }

    /// [`Running::start`] as a decision service: no `BACKEND_URL`, the decision endpoints on
    /// `addr` (`DECIDE_PORT`, which may be `PORT` when nothing is proxied).
    pub(crate) fn start_decide(vars: &[(&str, &str)]) -> Running {
        Running::spawn(std::path::Path::new("."), vars, true)
    }

    /// [`Running::start`] with `dir` as the working directory (where `.env` is read).
    pub(crate) fn start_in(dir: &std::path::Path, vars: &[(&str, &str)]) -> Running {
        Running::spawn(dir, vars, false)
    }

    fn spawn(dir: &std::path::Path, vars: &[(&str, &str)], decide: bool) -> Running {
        let [port, admin_port] = free_ports();
        let log = tempfile::NamedTempFile::new().unwrap();
        // Another build may be put under the same tests (see tests/it/bypass.rs).
        let binary = std::env::var("TOLLGATE_UNDER_TEST").unwrap_or_else(|_| BINARY.to_owned());
        let child = Command::new(binary)
            .current_dir(dir)
            .env_clear()
            .env("BIND", "127.0.0.1")
            .env("PORT", port.to_string())
            // Tests run in parallel: each instance needs an admin port of its own.
            .env("ADMIN_PORT", admin_port.to_string())
            .envs(decide.then(|| ("DECIDE_PORT", port.to_string())))
            .envs(vars.iter().copied())
            .stdout(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_for(
            || std::net::TcpStream::connect(addr).is_ok(),
            "tollgate to listen",
        );
        Running {
            child,
            addr,
            admin_port,
            log,
        }
    }

    /// What it has logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    /// SIGTERM, then wait for the exit without blocking the runtime.
    pub(crate) async fn terminate(self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::task::spawn_blocking(move || {
            let mut this = self;
            this.child.wait().unwrap()
        })
        .await
        .unwrap()
    }
}

/// A test that fails does not leave its gateway running.
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    let addr = tollgate.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/700").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let exit = tokio::spawn(tollgate.terminate());
    assert_eq!(
        in_flight.await.unwrap().status,
        StatusCode::OK,
        "the in-flight request completes"
    );
    assert_eq!(exit.await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn sighup_is_logged_and_ignored_and_sigterm_still_drains() {
    let backend = Backend::start().await;
    let mut tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    let addr = tollgate.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/700").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tollgate.hangup();
    let said = "SIGHUP received: nothing to reload without RULES_FILE";
    for _ in 0..250 {
        if tollgate.log().contains(said) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = tollgate.log();
    assert_eq!(log.matches(said).count(), 1, "one line: {log}");
    assert!(
        tollgate.child.try_wait().unwrap().is_none(),
        "still running: {log}"
    );
    assert_eq!(get(addr, "/").await.status, StatusCode::OK, "still serving");
    assert_eq!(
        in_flight.await.unwrap().status,
        StatusCode::OK,
        "nothing was dropped"
    );
    // SIGTERM still drains: a request in flight completes and the exit is clean.
    let in_flight = tokio::spawn(async move { get(addr, "/slow/500").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let exit = tokio::spawn(tollgate.terminate());
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    assert_eq!(exit.await.unwrap().code(), Some(0));
}

/// The binary in front of `backend`, with a budget of 2 in `redis` over TLS, trusting its
/// private CA, and `vars` besides.
fn over_tls(redis: &crate::support::RedisServer, backend: &Backend, vars: &[(&str, &str)]) -> Running {
    let cert = redis.cert_file().display().to_string();
    let url = format!("rediss://localhost:{}", redis.port);
    let mut all = vec![
        ("BACKEND_URL", backend.url()),
        ("REDIS_URL", url),
        // rustls reads the trusted roots from the system store, or from SSL_CERT_FILE.
        ("SSL_CERT_FILE", cert),
        ("MAX_TOKENS", "2".to_owned()),
    ];
    all.extend(vars.iter().map(|(name, value)| (*name, (*value).to_owned())));
    let all: Vec<(&str, &str)> = all.iter().map(|(name, value)| (*name, value.as_str())).collect();
    Running::start(&all)
}

/// The binary in front of `backend`, with `cluster` over TLS, trusting its private CA, and
/// `vars` besides.
fn over_tls_cluster(
    cluster: &crate::support::RedisCluster,
    backend: &Backend,
    vars: &[(&str, &str)],
) -> Running {
    let (url, seeds) = (backend.url(), cluster.seeds());
    let cert = cluster.cert_file().display().to_string();
    let mut all = vec![
        ("BACKEND_URL", url.as_str()),
        ("REDIS_CLUSTER_NODES", seeds.as_str()),
        ("REDIS_TLS", "true"),
        ("SSL_CERT_FILE", cert.as_str()),
    ];
    all.extend_from_slice(vars);
    Running::start(&all)
}

/// The real binary on `cluster` (partial coverage allowed, so a master down fails only its
/// own slots) over TLS, failing closed, its breakers opening after 3 failures and probing
/// every 100 ms, 3 requests per client; returned once it knows the three masters, each with
/// its breaker.
async fn closed_over_tls_cluster(cluster: &crate::support::RedisCluster, backend: &Backend) -> Running {
    cluster.allow_partial_coverage();
    let tollgate = over_tls_cluster(
        cluster,
        backend,
        &[
            ("FAIL_MODE", "closed"),
            ("REDIS_TIMEOUT_MS", "1000"),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            ("MAX_TOKENS", "3"),
            ("REFILL_RATE", "0.0001"),
        ],
    );
    until_metrics_say(&tollgate, "tollgate_redis_masters 3").await;
    tollgate
}

/// Until `tollgate`'s `/metrics` has the line `text` (15 s at most).
pub(crate) async fn until_metrics_say(tollgate: &Running, text: &str) {
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], tollgate.admin_port));
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !get(admin, "/metrics")
        .await
        .text()
        .lines()
        .any(|line| line == text)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the metrics never said {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn redis_over_tls_with_a_private_ca() {
    let redis = crate::support::RedisServer::start_tls();
    let backend = Backend::start().await;
    let tollgate = over_tls(
        &redis,
        &backend,
        &[("REDIS_TIMEOUT_MS", "2000"), ("REFILL_RATE", "0.01")],
    );
    let addr = tollgate.addr;
    let replies = [get(addr, "/").await, get(addr, "/").await, get(addr, "/").await];
    tollgate.terminate().await;
    assert_eq!(
        replies[0].header("x-ratelimit-remaining"),
        Some("1"),
        "decided by redis over TLS"
    );
    assert_eq!(replies[2].status, StatusCode::TOO_MANY_REQUESTS);
    let key = crate::support::redis::key_of(
        &[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.01")],
        "general",
        "127.0.0.1",
    );
    assert_eq!(redis.cli(&["--scan"]).trim(), key);
}

/// The faults of `faults.rs`, over TLS: a Redis killed gives the fail mode, at once once the
/// breaker is open (a failed TLS handshake is a connection error like any other), and the
/// same Redis restarted is used again without a restart of tollgate, its TLS session new.
#[tokio::test]
async fn a_tls_redis_killed_and_restarted_is_ridden_out() {
    let mut redis = crate::support::RedisServer::start_tls();
    let backend = Backend::start().await;
    let tollgate = over_tls(
        &redis,
        &backend,
        &[
            ("REDIS_TIMEOUT_MS", "1000"),
            ("REDIS_PROBE_INTERVAL_MS", "100"),
            ("FAIL_MODE", "closed"),
            ("REFILL_RATE", "0.0001"),
        ],
    );
    let addr = tollgate.addr;
    let first = get(addr, "/").await;
    assert_eq!(
        first.header("x-ratelimit-remaining"),
        Some("1"),
        "decided over TLS"
    );

    redis.kill();
    for _ in 0..5 {
        assert_eq!(get(addr, "/").await.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    // Back, empty: decided again (a fresh budget) within a few probe intervals.
    redis.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let decided = loop {
        let reply = get(addr, "/").await;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            break reply;
        }
        assert!(std::time::Instant::now() < deadline, "never decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tollgate.terminate().await;
    assert_eq!(decided.status, StatusCode::OK);
    assert_eq!(
        decided.header("x-ratelimit-remaining"),
        Some("1"),
        "an empty Redis"
    );
}

/// A TLS Redis frozen mid-run (it accepts connections, completes no handshake and answers
/// nothing): each request waits one `REDIS_TIMEOUT_MS` at most, reconnecting included, until
/// the breaker opens; then none waits; thawed, it decides again, on the same data. With TLS, a
/// reconnect to a frozen server is a handshake that never ends, which the timeout bounds too.
#[tokio::test]
async fn a_frozen_tls_redis_costs_at_most_one_timeout_per_request_until_the_breaker_opens() {
    let redis = crate::support::RedisServer::start_tls();
    let backend = Backend::start().await;
    let tollgate = over_tls(
        &redis,
        &backend,
        &[
            ("REDIS_TIMEOUT_MS", "300"),
            ("REDIS_BREAKER_THRESHOLD", "3"),
            ("REDIS_PROBE_INTERVAL_MS", "200"),
            ("REFILL_RATE", "0.0001"),
            ("MAX_TOKENS", "100"),
        ],
    );
    let addr = tollgate.addr;
    assert_eq!(
        get(addr, "/").await.header("x-ratelimit-remaining"),
        Some("99"),
        "decided over TLS"
    );

    redis.freeze();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let reply = get(addr, "/").await;
        let waited = started.elapsed();
        assert_eq!(reply.status, StatusCode::OK, "fail open");
        assert!(reply.header("x-ratelimit-remaining").is_none());
        assert!(
            waited < Duration::from_millis(2_000),
            "waited {waited:?}, far above the 300 ms timeout"
        );
    }
    // The breaker is open: 20 requests take less than a third of 20 timeouts.
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(get(addr, "/").await.status, StatusCode::OK);
    }
    let twenty = started.elapsed();

    redis.thaw();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let decided = loop {
        let reply = get(addr, "/").await;
        if let Some(remaining) = reply.header("x-ratelimit-remaining") {
            break remaining.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "never decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tollgate.terminate().await;
    assert!(twenty < Duration::from_millis(2_000), "took {twenty:?}");
    // Its data kept: 98 left after this decision. The calls of the three requests that timed
    // out had been written to the frozen server's socket and ran when it thawed, past their
    // deadline: they counted nothing.
    assert_eq!(decided, "98", "left of 100");
}

#[tokio::test]
async fn a_second_signal_cuts_the_drain_short() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    let addr = tollgate.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/5000").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = tollgate.child.id().to_string();
    let term = || Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(term().success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let exit = tollgate.terminate().await;
    assert_eq!(
        exit.code(),
        Some(130),
        "the second SIGTERM exits without waiting 5 s"
    );
    in_flight.abort();
}

#[tokio::test]
async fn redis_cluster_over_tls() {
    let cluster = crate::support::RedisCluster::start_tls();
    let backend = Backend::start().await;
    let tollgate = over_tls_cluster(
        &cluster,
        &backend,
        &[
            ("REDIS_TIMEOUT_MS", "5000"),
            ("MAX_TOKENS", "25"),
            ("REFILL_RATE", "0.0001"),
        ],
    );
    let addr = tollgate.addr;
    let mut allowed = Vec::new();
    for n in 2..=4 {
        let client: std::net::IpAddr = format!("127.0.0.{n}").parse().unwrap();
        let replies =
            futures_util::future::join_all((0..40).map(|_| crate::support::get_from(addr, client, "/", &[])))
                .await;
        assert!(
            replies
                .iter()
                .all(|r| r.headers.contains_key("x-ratelimit-remaining")),
            "decided"
        );
        allowed.push(replies.iter().filter(|r| r.status == StatusCode::OK).count());
    }
    tollgate.terminate().await;
    assert_eq!(allowed, [25, 25, 25]);
    let holding = cluster.masters_holding_keys();
    assert!(holding >= 2, "keys landed on {holding} of 3 masters");
}

/// A TLS cluster's master killed: its slots get the fail mode at once, every other slot stays
/// exact, and once it is back (its `nodes.conf` kept) its slots are exact again, over new TLS
/// sessions, without a restart of tollgate.
#[tokio::test]
async fn a_killed_tls_cluster_master_fails_only_its_slots_and_is_used_again_after_restart() {
    use crate::faults::{clients_by_master, exact_budget, exact_budget_once_decided};
    let mut cluster = crate::support::RedisCluster::start_tls();
    let backend = Backend::start().await;
    let tollgate = closed_over_tls_cluster(&cluster, &backend).await;
    let addr = tollgate.addr;
    let (victim, dead, live) = clients_by_master(&cluster);
    exact_budget(addr, live[0], 3, "before").await;

    cluster.nodes[victim].kill();
    for _ in 0..5 {
        let reply = crate::support::get_from(addr, dead[0], "/", &[]).await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "on the dead master"
        );
    }
    exact_budget(addr, live[1], 3, "beside a dead master").await;

    cluster.nodes[victim].restart();
    cluster.wait_until_ok();
    exact_budget_once_decided(addr, dead[1], 3, StatusCode::SERVICE_UNAVAILABLE).await;
    exact_budget(addr, live[2], 3, "after the restart").await;
    tollgate.terminate().await;
}

/// A TLS cluster's master killed and its replica promoted: the failed-over slots get the fail
/// mode until the gateway follows the new slot map, then exact budgets on the promoted
/// replica, over a TLS session to a node it had not used for them, with no restart.
#[tokio::test]
async fn a_failed_over_tls_cluster_master_is_followed_to_its_promoted_replica() {
    use crate::faults::{clients_by_master, exact_budget, exact_budget_once_decided};
    let mut cluster = crate::support::RedisCluster::start_tls_with_replicas();
    let backend = Backend::start().await;
    let tollgate = closed_over_tls_cluster(&cluster, &backend).await;
    let addr = tollgate.addr;
    let (victim, dead, live) = clients_by_master(&cluster);
    let key = |client: &std::net::IpAddr| format!("tollgate:{{general:{client}}}:tb");
    exact_budget(addr, live[0], 3, "before").await;

    cluster.nodes[victim].kill();
    let reply = crate::support::get_from(addr, dead[0], "/", &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "on the dead master"
    );
    exact_budget(addr, live[1], 3, "beside a dead master").await;
    // Until every node names the replica as the owner (see the plain-TCP test in faults.rs).
    let promoted = std::time::Instant::now() + Duration::from_secs(15);
    while cluster
        .agreed_owner_of(&key(&dead[0]))
        .is_none_or(|owner| owner == victim)
    {
        assert!(
            std::time::Instant::now() < promoted,
            "the replica was not promoted in every node's view"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exact_budget_once_decided(addr, dead[1], 3, StatusCode::SERVICE_UNAVAILABLE).await;
    for client in &dead[2..4] {
        exact_budget(addr, *client, 3, "on the promoted replica").await;
    }
    exact_budget(addr, live[2], 3, "after the failover").await;
    until_metrics_say(&tollgate, "tollgate_breaker_open 0").await;
    until_metrics_say(&tollgate, "tollgate_redis_masters 3").await;
    tollgate.terminate().await;
}

/// `tollgate healthcheck` with `ADMIN_PORT=port` (and BIND as the server had it).
fn healthcheck(port: u16) -> Output {
    run(
        &[("BIND", "127.0.0.1"), ("ADMIN_PORT", &port.to_string())],
        &["healthcheck"],
    )
}

#[tokio::test]
async fn healthcheck_passes_against_a_live_admin_port_and_fails_against_a_dead_one() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    let admin_port = tollgate.admin_port;
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", admin_port)).is_ok(),
        "the admin listener",
    );
    let live = tokio::task::spawn_blocking(move || healthcheck(admin_port))
        .await
        .unwrap();
    assert_eq!(
        live.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    assert_eq!(tollgate.terminate().await.code(), Some(0));
    let dead = tokio::task::spawn_blocking(move || healthcheck(admin_port))
        .await
        .unwrap();
    assert_eq!(dead.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&dead.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{admin_port}")), "{stderr}");
}

#[tokio::test]
async fn a_denial_is_one_json_line_with_its_request_id() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.01"),
        ("LOG_FORMAT", "json"),
    ]);
    let from = "127.0.0.1".parse().unwrap();
    crate::support::get_from(tollgate.addr, from, "/", &[]).await;
    let denied = crate::support::get_from(tollgate.addr, from, "/a?b", &[("x-request-id", "req-7f3a")]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("x-request-id"), Some("req-7f3a"));
    let log = tollgate.log();
    let lines: Vec<&str> = log.lines().collect();
    // The startup line is one line, its settings fields of their own.
    assert!(
        lines[0].contains(r#""message":"tollgate ready""#) && lines[0].contains(r#""listen":"#),
        "{log}"
    );
    let denial = lines
        .iter()
        .find(|line| line.contains("request refused"))
        .unwrap_or_else(|| panic!("no denial line in\n{log}"));
    for field in [
        r#""level":"INFO""#,
        r#""request_id":"req-7f3a""#,
        r#""rule":"general""#,
        r#""client":"127.0.0.1""#,
        r#""retry_after_s":100"#,
        r#""status":429"#,
    ] {
        assert!(denial.contains(field), "{field} missing from {denial}");
    }
    tollgate.terminate().await;
}

/// A keep-alive connection from `from` that has been served once, or `None` when tollgate
/// closed it instead.
async fn served_from(
    addr: std::net::SocketAddr,
    from: std::net::IpAddr,
) -> Option<hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(connection);
    let request = http::Request::get("/")
        .header("host", "gateway.test")
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .expect("neither served nor closed")
        .ok()?;
    assert_eq!(response.status(), StatusCode::OK);
    Some(sender)
}

#[tokio::test]
async fn one_address_is_capped_per_client_and_named_in_the_log() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("MAX_CONNECTIONS_PER_CLIENT", "2"),
    ]);
    // Not 127.0.0.1, which the start-up probe connected from.
    let greedy = "127.0.0.5".parse().unwrap();
    let first = served_from(tollgate.addr, greedy).await.expect("first");
    let second = served_from(tollgate.addr, greedy).await.expect("second");
    assert!(
        served_from(tollgate.addr, greedy).await.is_none(),
        "a third from the same address"
    );
    let other = served_from(tollgate.addr, "127.0.0.6".parse().unwrap())
        .await
        .expect("another address is served");
    until_metrics_say(
        &tollgate,
        r#"tollgate_client_connections_refused_total{limit="max_connections_per_client"} 1"#,
    )
    .await;
    let log = tollgate.log();
    assert!(
        log.lines().next().is_some_and(
            |ready| ready.contains("tollgate ready") && ready.contains("max_connections_per_client=2")
        ),
        "{log}"
    );
    let refusal = log
        .lines()
        .find(|line| line.contains("MAX_CONNECTIONS_PER_CLIENT reached"))
        .unwrap_or_else(|| panic!("no refusal line in\n{log}"));
    assert!(
        refusal.contains("WARN") && refusal.contains("client=127.0.0.5") && refusal.contains("refused=1"),
        "{refusal}"
    );
    drop((first, second, other));
    tollgate.terminate().await;
}

#[test]
fn check_config_warns_about_a_misspelt_variable() {
    let output = run(
        &[("BACKEND_URL", "http://127.0.0.1:9"), ("MAX_TOKEN", "4711")],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Valid, but not clean: a pipeline's check fails on it (serving would start).
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0], "configuration ok, with 1 warning (exit status 3)",
        "{stdout}"
    );
    assert_eq!(
        lines[1], "warning: MAX_TOKEN is not a tollgate variable; did you mean MAX_TOKENS?",
        "{stdout}"
    );
    assert!(!stdout.contains("4711"), "values are never shown: {stdout}");
    assert!(
        stdout.contains("general rule:     token_bucket: 10 tokens"),
        "the misspelt value is not used: {stdout}"
    );
}

#[tokio::test]
async fn a_warning_is_logged_once_at_startup() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url()), ("REDIS_TIMEOUT_MS", "100")]);
    let log = tollgate.log();
    let warning = "REDIS_TIMEOUT_MS is set but not used: the store is in memory";
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    assert!(
        log.lines()
            .any(|line| line.contains("WARN") && line.contains(warning)),
        "{log}"
    );
    tollgate.terminate().await;
}

/// Run the binary like [`run`], failing the test if it is still running after 10 s (it was
/// expected to refuse to start, and is serving instead).
fn run_expecting_exit(vars: &[(&str, &str)], args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let [port, admin_port] = free_ports();
    let mut child = Command::new(BINARY)
        .args(args)
        .env_clear()
        .env("BIND", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("ADMIN_PORT", admin_port.to_string())
        .envs(vars.iter().copied())
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("tollgate {args:?} with {vars:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn an_invalid_rust_log_exits_2_naming_it() {
    // `warning` parses as a filter for a target called `warning`: it would silence everything.
    for (value, says) in [
        ("info,foo=loud", r#"RUST_LOG="info,foo=loud" is invalid"#),
        ("warning", "did you mean warn?"),
    ] {
        for args in [&[][..], &["--check-config"]] {
            let output = run_expecting_exit(
                &[("BACKEND_URL", "http://127.0.0.1:9"), ("RUST_LOG", value)],
                args,
            );
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
            assert!(
                stderr.contains("RUST_LOG") && stderr.contains(says),
                "{args:?}: {stderr}"
            );
            assert!(output.stdout.is_empty(), "nothing served or logged");
        }
    }
}

#[test]
fn a_bad_dot_env_line_is_named_without_its_content() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "BACKEND_URL=http://127.0.0.1:9\n# the Redis password\nREDIS_PASSWORD=hunter2 hunter3\nPORT=8081\n",
    )
    .unwrap();
    for args in [&[][..], &["--check-config"]] {
        let output = Command::new(BINARY)
            .args(args)
            .env_clear()
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(".env line 3 "), "{stderr}");
        assert!(!stderr.contains("hunter"), "{stderr}");
        assert!(!stderr.contains("REDIS_PASSWORD"), "{stderr}");
    }
}

#[test]
fn version_flags_print_the_version() {
    for flag in ["--version", "-V"] {
        let output = run(&[], &[flag]);
        assert!(output.status.success());
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("tollgate {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn help_lists_every_flag_and_subcommand_and_where_variables_are_documented() {
    for flag in ["--help", "-h"] {
        let output = run(&[], &[flag]);
        assert!(output.status.success());
        let stdout = String::from_utf8_lossy(&output.stdout);
        for mentioned in [
            "--check-config",
            "healthcheck",
            "--version",
            "-V",
            "--help",
            "-h",
            ".env.example",
            "docs/operations.md",
        ] {
            assert!(stdout.contains(mentioned), "{mentioned} missing from\n{stdout}");
        }
    }
    let output = run(&[], &["--check-config", "extra"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--help"));
}

/// A misspelt Redis variable still starts (Kubernetes injects look-alikes), but the warning
/// and the ready line say which store runs, so `REDIS_ADRR` does not quietly run on memory;
/// `--check-config` fails on it with its own status, and a clean one still exits 0.
#[tokio::test]
async fn a_misspelt_redis_variable_starts_on_the_store_the_ready_line_names() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("REDIS_ADRR", "redis://127.0.0.1:6379"),
    ]);
    assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    let log = tollgate.log();
    assert!(
        log.lines()
            .any(|line| line.contains("WARN") && line.contains("REDIS_ADRR is not a tollgate variable")),
        "{log}"
    );
    let ready = log
        .lines()
        .find(|line| line.contains("tollgate ready"))
        .unwrap_or_else(|| panic!("no ready line in\n{log}"));
    assert!(ready.contains("store=memory (this process's own"), "{ready}");
    tollgate.terminate().await;

    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("REDIS_ADRR", "redis://x:6379"),
        ],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("store:            memory"), "{stdout}");
    let clean = run(&[("BACKEND_URL", "http://127.0.0.1:9")], &["--check-config"]);
    assert_eq!(clean.status.code(), Some(0));
    // A Redis store is named with its kind and address, never its password.
    let output = run(
        &[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("REDIS_URL", "redis://:hunter2@db:6379"),
        ],
        &["--check-config"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("store:            redis single redis://:***@db:6379"),
        "{stdout}"
    );
}
