//! The admin listener (metrics, health, readiness), request ids, and what the gateway owes an
//! HTTP/1.1 client in front of an HTTP/1.0 backend.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{Backend, Gateway, RedisServer, get, get_from, request};

/// The samples of a Prometheus text exposition: `name{labels}` -> value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
            (series.to_owned(), value.parse().expect("a numeric value"))
        })
        .collect()
}

async fn scrape(gateway: &Gateway) -> HashMap<String, f64> {
    let reply = gateway.admin_get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.header("content-type").unwrap().starts_with("text/plain"));
    samples(reply.text())
}

#[tokio::test]
async fn metrics_move_as_traffic_flows_and_never_name_a_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.01"),
            ("SKIP_PATHS", "/healthz"),
        ],
    )
    .await;
    let before = scrape(&gateway).await;
    let allowed = r#"tollgate_requests_total{rule="general",decision="allowed"}"#;
    let limited = r#"tollgate_requests_total{rule="general",decision="limited"}"#;
    assert_eq!(before[allowed], 0.0, "every series exists from the start");
    for _ in 0..3 {
        get_from(gateway.addr, "127.0.0.9".parse().unwrap(), "/", &[]).await;
    }
    get(gateway.addr, "/status/503").await;
    get(gateway.addr, "/healthz").await;
    let after = scrape(&gateway).await;
    assert_eq!(after[allowed], 3.0);
    assert_eq!(after[limited], 1.0);
    assert_eq!(
        after[r#"tollgate_requests_total{rule="general",decision="exempt"}"#],
        1.0
    );
    assert_eq!(
        after[r#"tollgate_backend_responses_total{rule="general",class="2xx"}"#],
        3.0
    );
    assert_eq!(
        after[r#"tollgate_backend_responses_total{rule="general",class="5xx"}"#],
        1.0
    );
    assert_eq!(
        after[r#"tollgate_decision_duration_seconds_count{rule="general"}"#],
        4.0
    );
    assert_eq!(
        after[r#"tollgate_backend_duration_seconds_count{rule="general"}"#],
        4.0
    );
    // Status codes as sent, the gateway's own 429 among them; none for a code never sent.
    let code = |code: &str| {
        after
            .get(&format!(
                r#"tollgate_responses_total{{rule="general",code="{code}"}}"#
            ))
            .copied()
    };
    assert_eq!(code("200"), Some(3.0));
    assert_eq!(code("429"), Some(1.0));
    assert_eq!(code("503"), Some(1.0));
    assert_eq!(code("404"), None);
    assert_eq!(after["tollgate_memory_clients"], 2.0);
    assert_eq!(after["tollgate_breaker_open"], 0.0);
    assert_eq!(after[r#"tollgate_build_info{version="0.1.0"}"#], 1.0);
    let text = gateway.admin_get("/metrics").await.text().to_owned();
    assert!(
        !text.contains("127.0.0"),
        "no client address in any label:\n{text}"
    );
    // The admin port shadows nothing: /metrics on the proxy port goes to the backend.
    get(gateway.addr, "/metrics").await;
    assert_eq!(backend.last().uri, "/metrics");
}

#[tokio::test]
async fn body_bytes_are_counted_as_forwarded_both_ways() {
    let backend = Backend::start().await;
    let gateway =
        Gateway::start_with_admin(&backend.url(), &[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.01")]).await;
    let from = "127.0.0.1".parse().unwrap();
    let upload = Bytes::from(vec![b'x'; 1000]);
    let echoed = request(gateway.addr, from, Method::POST, "/", &[], upload.clone()).await;
    assert_eq!(echoed.body, upload);
    assert_eq!(get(gateway.addr, "/bytes/5000").await.body.len(), 5000);
    // Refused: nothing is forwarded, and the gateway's own body is not the backend's.
    let refused = request(gateway.addr, from, Method::POST, "/", &[], upload).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let after = scrape(&gateway).await;
    assert_eq!(
        after[r#"tollgate_request_body_bytes_total{rule="general"}"#],
        1000.0
    );
    assert_eq!(
        after[r#"tollgate_response_body_bytes_total{rule="general"}"#],
        6000.0
    );
    assert_eq!(after[r#"tollgate_request_body_bytes_total{rule="auth"}"#], 0.0);
}

#[tokio::test]
async fn open_connections_and_requests_in_flight_are_gauges() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[("MAX_CONNECTIONS", "50")]).await;
    let addr = gateway.addr;
    let slow = tokio::spawn(async move { get(addr, "/slow/1500").await });
    // Until the slow request is in flight (scrapes are not: they are the admin listener's).
    let mut during = scrape(&gateway).await;
    for _ in 0..100 {
        if during["tollgate_requests_in_flight"] == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        during = scrape(&gateway).await;
    }
    assert_eq!(during["tollgate_requests_in_flight"], 1.0);
    assert_eq!(during["tollgate_client_connections_open"], 1.0);
    assert_eq!(during["tollgate_client_connections_max"], 50.0);
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    let mut after = scrape(&gateway).await;
    for _ in 0..100 {
        if after["tollgate_client_connections_open"] == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = scrape(&gateway).await;
    }
    assert_eq!(after["tollgate_requests_in_flight"], 0.0);
    assert_eq!(after["tollgate_client_connections_open"], 0.0);
}

/// Run `program args` with `input` on its standard input: its status and what it printed.
async fn run(program: &str, args: &[&str], input: &str) -> (bool, String) {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{program} must be installed (scripts/test.sh installs it): {error}"));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let printed =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), printed)
}

/// Each family as Python's prometheus_client reads `text`, one `name type has_help` a line,
/// with its strict OpenMetrics parser or its Prometheus text parser.
async fn python_families(text: &str, open_metrics: bool) -> String {
    let module = match open_metrics {
        true => "prometheus_client.openmetrics.parser",
        false => "prometheus_client.parser",
    };
    let script = format!(
        "import sys\nfrom {module} import text_string_to_metric_families as parse\n\
         for f in parse(sys.stdin.read()): print(f.name, f.type, bool(f.documentation))"
    );
    let (ok, printed) = run("python3", &["-c", &script], text).await;
    assert!(
        ok,
        "prometheus_client ({module}) refused the exposition: {printed}\n{text}"
    );
    printed
}

/// Traffic enough for every kind of series: allowed, refused, a backend status, a body.
async fn some_traffic(gateway: &Gateway) {
    let from = "127.0.0.1".parse().unwrap();
    request(
        gateway.addr,
        from,
        Method::POST,
        "/",
        &[],
        Bytes::from_static(b"hello"),
    )
    .await;
    get(gateway.addr, "/status/418").await;
    get(gateway.addr, "/").await;
}

#[tokio::test]
async fn the_prometheus_text_format_passes_promtool_and_is_typed() {
    let backend = Backend::start().await;
    let gateway =
        Gateway::start_with_admin(&backend.url(), &[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.01")]).await;
    some_traffic(&gateway).await;
    let admin = gateway.admin.unwrap();
    let from = "127.0.0.1".parse().unwrap();
    for accept in [None, Some("text/plain;version=0.0.4"), Some("*/*")] {
        let headers: Vec<(&str, &str)> = accept.iter().map(|accept| ("accept", *accept)).collect();
        let reply = get_from(admin, from, "/metrics", &headers).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8"),
            "Accept: {accept:?}"
        );
        assert!(!reply.text().contains("# EOF"));
        // promtool's linter: help on every family, counters named `_total`, and the rest.
        let (ok, printed) = run("promtool", &["check", "metrics"], reply.text()).await;
        assert!(
            ok && printed.trim().is_empty(),
            "promtool check metrics: {printed}\n{}",
            reply.text()
        );
    }
    let text = gateway.admin_get("/metrics").await.text().to_owned();
    let families = python_families(&text, false).await;
    for line in families.lines() {
        assert!(
            !line.contains(" unknown ") && line.ends_with(" True"),
            "{line}\n{families}"
        );
    }
    assert!(families.contains("tollgate_requests counter True"), "{families}");
    assert!(families.contains("tollgate_responses counter True"), "{families}");
    assert!(
        families.contains("tollgate_decision_duration_seconds histogram True"),
        "{families}"
    );
}

#[tokio::test]
async fn openmetrics_is_served_to_who_asks_for_it_and_parses_as_openmetrics() {
    let backend = Backend::start().await;
    let gateway =
        Gateway::start_with_admin(&backend.url(), &[("MAX_TOKENS", "2"), ("REFILL_RATE", "0.01")]).await;
    some_traffic(&gateway).await;
    // What Prometheus 2.x sends.
    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                  text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let reply = get_from(
        gateway.admin.unwrap(),
        "127.0.0.1".parse().unwrap(),
        "/metrics",
        &[("accept", accept)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert_eq!(reply.header("vary"), Some("accept"));
    let text = reply.text();
    assert!(text.ends_with("\n# EOF\n"), "{text}");
    // Python's OpenMetrics parser is strict (a counter family named with its `_total`, as
    // the Prometheus format has it, is a clash there).
    let families = python_families(text, true).await;
    assert!(families.contains("tollgate_requests counter True"), "{families}");
    assert!(families.contains("tollgate_responses counter True"), "{families}");
    // And Prometheus's own OpenMetrics parser, as promtool's backfill runs it (which wants a
    // timestamp on every sample).
    let stamped: String = text
        .lines()
        .map(|line| match line.starts_with('#') {
            true => format!("{line}\n"),
            false => format!("{line} 1700000000\n"),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("metrics.om");
    std::fs::write(&input, stamped).unwrap();
    let blocks = dir.path().join("blocks");
    let (ok, printed) = run(
        "promtool",
        &[
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            input.to_str().unwrap(),
            blocks.to_str().unwrap(),
        ],
        "",
    )
    .await;
    assert!(ok, "promtool's OpenMetrics parser: {printed}");
}

#[tokio::test]
async fn backend_failures_are_counted_by_cause() {
    let closed = format!("http://127.0.0.1:{}", crate::support::free_port());
    let gateway = Gateway::start_with_admin(&closed, &[]).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::BAD_GATEWAY);
    let after = scrape(&gateway).await;
    assert_eq!(
        after[r#"tollgate_backend_errors_total{rule="general",cause="refused"}"#],
        1.0
    );
}

#[tokio::test]
async fn readiness_follows_the_breaker_only_when_the_fail_mode_refuses() {
    let mut redis = RedisServer::start();
    let backend = Backend::start().await;
    let mut gateways = Vec::new();
    for fail_mode in ["open", "closed"] {
        let vars = [
            ("REDIS_ADDR", redis.addr()),
            ("FAIL_MODE", fail_mode.into()),
            ("REDIS_TIMEOUT_MS", "100".into()),
            ("REDIS_PROBE_INTERVAL_MS", "100".into()),
        ];
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        gateways.push(Gateway::start_with_admin(&backend.url(), &vars).await);
    }
    for gateway in &gateways {
        let ready = gateway.admin_get("/readyz").await;
        assert_eq!(ready.status, StatusCode::OK);
        assert!(
            ready.text().contains(r#""store":"redis","breaker":"closed""#),
            "{}",
            ready.text()
        );
    }
    redis.kill();
    for gateway in &gateways {
        // Enough failures to open the breaker.
        for _ in 0..3 {
            get(gateway.addr, "/").await;
        }
    }
    let open = gateways[0].admin_get("/readyz").await;
    assert_eq!(
        open.status,
        StatusCode::OK,
        "fail open still forwards: {}",
        open.text()
    );
    assert!(open.text().contains(r#""breaker":"open""#), "{}", open.text());
    let closed = gateways[1].admin_get("/readyz").await;
    assert_eq!(
        closed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        closed.text()
    );
    assert_eq!(scrape(&gateways[1]).await["tollgate_breaker_open"], 1.0);
    let errors = scrape(&gateways[0]).await;
    assert!(
        errors[r#"tollgate_redis_errors_total{kind="connection"}"#]
            + errors[r#"tollgate_redis_errors_total{kind="timeout"}"#]
            >= 3.0
    );
    assert_eq!(gateways[0].admin_get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn request_ids_are_kept_or_made_and_reach_both_sides() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "1"), ("REFILL_RATE", "0.01")]).await;
    let given = get_from(
        gateway.addr,
        "127.0.0.1".parse().unwrap(),
        "/",
        &[("x-request-id", "trace-42")],
    )
    .await;
    assert_eq!(given.header("x-request-id"), Some("trace-42"));
    assert_eq!(backend.last().headers["x-request-id"], "trace-42");
    // A denial, never forwarded, still says which request it was; a bad id is replaced.
    let long = "x".repeat(129);
    let denied = get_from(
        gateway.addr,
        "127.0.0.1".parse().unwrap(),
        "/",
        &[("x-request-id", &long)],
    )
    .await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    let made = denied.header("x-request-id").unwrap();
    assert_eq!(made.len(), 32);
    assert!(made.bytes().all(|b| b.is_ascii_hexdigit()));
    let other = get_from(gateway.addr, "127.0.0.2".parse().unwrap(), "/", &[]).await;
    assert_ne!(other.header("x-request-id"), Some(made));
    assert_eq!(
        backend.last().headers["x-request-id"],
        other.header("x-request-id").unwrap()
    );
}

/// A backend that answers every request in HTTP/1.0 and closes.
async fn http10_backend() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let mut read = Vec::new();
                while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_http10_backend_does_not_downgrade_the_client() {
    let gateway = Gateway::start(&http10_backend().await, &[]).await;
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    for _ in 0..3 {
        let request = Request::get("/")
            .header("host", "gateway.test")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.version(), Version::HTTP_11);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !connection.is_finished(),
        "the client's keep-alive connection stays open"
    );
}

#[tokio::test]
async fn a_flood_of_admin_connections_is_capped_and_does_not_keep_probes_out() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[]).await;
    let admin = gateway.admin.unwrap();
    let max = tollgate::testing::MAX_ADMIN_CONNECTIONS;
    // Connections that send nothing, up to the cap: each would be held until its header
    // timeout.
    let mut held = std::collections::VecDeque::new();
    for _ in 0..max {
        held.push_back(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    // A probe, and the flood going on around it (the closed one reconnecting), many times over.
    for round in 0..3 * max {
        let probe = gateway.admin_get("/healthz").await;
        assert_eq!(probe.status, StatusCode::OK, "round {round}");
        // The oldest silent connection gave its place up: closed, not left to the timeout.
        let mut oldest = held.pop_front().unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), oldest.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "round {round}: the oldest connection is closed: {read:?}"
        );
        held.push_back(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    // Proxied traffic is untouched.
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
}

/// Whether something listens on `ip:port`, asked until `expected` or for about 5 s.
async fn listening(ip: &str, port: u16, expected: bool) -> bool {
    for _ in 0..500 {
        if tokio::net::TcpStream::connect((ip, port)).await.is_ok() == expected {
            return expected;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    !expected
}

#[tokio::test]
async fn the_admin_listener_is_on_loopback_unless_admin_bind_says_otherwise() {
    use std::process::{Command, Stdio};
    const BINARY: &str = env!("CARGO_BIN_EXE_tollgate");
    let backend = Backend::start().await;
    // 127.0.0.2 is this host too, but a socket bound to 127.0.0.1 does not answer there: it
    // stands for "any other address" without depending on the machine's network.
    for admin_bind in [None, Some("0.0.0.0")] {
        let [port, admin_port] = crate::support::free_ports();
        let admin_vars: Vec<(&str, &str)> = admin_bind.iter().map(|bind| ("ADMIN_BIND", *bind)).collect();
        let mut tollgate = Command::new(BINARY)
            .env_clear()
            .env("BACKEND_URL", backend.url())
            .env("BIND", "0.0.0.0")
            .env("PORT", port.to_string())
            .env("ADMIN_PORT", admin_port.to_string())
            .envs(admin_vars.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            listening("127.0.0.1", admin_port, true).await,
            "ADMIN_BIND={admin_bind:?}"
        );
        // Both listeners are bound before either serves: the proxy takes every address.
        assert!(listening("127.0.0.2", port, true).await);
        let elsewhere = tokio::net::TcpStream::connect(("127.0.0.2", admin_port))
            .await
            .is_ok();
        assert_eq!(elsewhere, admin_bind.is_some(), "ADMIN_BIND={admin_bind:?}");
        // The container's HEALTHCHECK, with the same environment, finds it either way.
        let probe = Command::new(BINARY)
            .env_clear()
            .env("ADMIN_PORT", admin_port.to_string())
            .envs(admin_vars.iter().copied())
            .arg("healthcheck")
            .output()
            .unwrap();
        assert!(
            probe.status.success(),
            "ADMIN_BIND={admin_bind:?}: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        tollgate.kill().unwrap();
        tollgate.wait().unwrap();
    }
}
