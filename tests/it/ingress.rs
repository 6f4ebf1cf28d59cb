//! `/v1/forward-auth` behind the real proxies that call it: nginx (`auth_request`, with the
//! refusal mapped back to `429` and `Retry-After`), Caddy (`forward_auth`) and Traefik
//! (`ForwardAuth`), each in front of a recording backend, with the configurations
//! `docs/operations.md` shows, and with tollgate stopped: as each proxy comes, and with the
//! docs' fail-open and fail-closed recipes. Each client is a source address of its own on
//! loopback.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;

use crate::support::{Backend, Gateway, Reply, free_port, get_from};

/// The decision service the proxies ask: two requests per client, then refused for long.
async fn decision_service() -> Gateway {
    decision_service_with(&[]).await
}

/// The same, with `extra` settings.
async fn decision_service_with(extra: &[(&str, &str)]) -> Gateway {
    let mut vars = vec![
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
    ];
    vars.extend_from_slice(extra);
    Gateway::start_decide(None, &vars).await
}

/// A proxy process, killed when dropped.
struct Proxy {
    child: Child,
    addr: SocketAddr,
    /// Its configuration and logs.
    dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    fn start(mut command: Command, addr: SocketAddr, dir: tempfile::TempDir) -> Proxy {
        let log = std::fs::File::create(dir.path().join("output.log")).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {command:?}: {error} (scripts/test.sh installs it)")
            });
        Proxy { child, addr, dir }
    }

    /// What it printed, for a failed assertion.
    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("output.log")).unwrap_or_default()
    }

    /// Wait until it routes to the backend (Traefik loads its routes after it listens).
    async fn ready(&self, from: IpAddr) {
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                let reply = get_from(self.addr, from, "/ready", &[]).await;
                if reply.status != StatusCode::NOT_FOUND && reply.status != StatusCode::BAD_GATEWAY {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{:?} never served; it said:\n{}", self.child.id(), self.output());
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn nginx(decide: SocketAddr, backend: &Backend) -> Proxy {
    nginx_calling(decide, backend, "/v1/forward-auth?status=403")
}

/// What a proxy does when tollgate cannot be asked (stopped, unreachable, too slow).
#[derive(Clone, Copy, Debug)]
enum Unreachable {
    /// The proxy's own answer: nginx `500`, Caddy `502`, Traefik `500`.
    AsIs,
    /// docs/operations.md's fail-open recipe: forwarded as if allowed.
    Open,
    /// docs/operations.md's fail-closed recipe: `503` with `Retry-After`.
    Closed,
}

/// nginx asking `target` (the forward-auth path and query) of the decision service.
fn nginx_calling(decide: SocketAddr, backend: &Backend, target: &str) -> Proxy {
    nginx_failing(decide, backend, target, Unreachable::AsIs)
}

/// [`nginx_calling`], doing `unreachable` when tollgate cannot be asked.
fn nginx_failing(decide: SocketAddr, backend: &Backend, target: &str, unreachable: Unreachable) -> Proxy {
    let port = free_port();
    let site = nginx_site(port, decide, &backend.url(), target, unreachable);
    nginx_serving(port, &site, false)
}

/// nginx serving `sites` (`server` blocks, the first of them listening on `port`); with `test_only`, what
/// `nginx -t` says of it instead, the process already exited.
fn nginx_serving(port: u16, sites: &str, test_only: bool) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let config = format!(
        r#"daemon off;
master_process off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
{sites}
}}
"#,
    );
    let file = write(dir.path(), "nginx.conf", &config);
    let mut command = Command::new("nginx");
    command.args([
        "-e",
        &format!("{root}/error.log"),
        "-p",
        &root.to_string(),
        "-c",
        &file,
    ]);
    if test_only {
        command.arg("-t");
    }
    Proxy::start(command, SocketAddr::from(([127, 0, 0, 1], port)), dir)
}

/// The `server` block of docs/operations.md's nginx setup, on `port`, asking `target`; with
/// `unreachable`, its fail-open or fail-closed recipe added.
fn nginx_site(
    port: u16,
    decide: SocketAddr,
    backend: &str,
    target: &str,
    unreachable: Unreachable,
) -> String {
    let (catch, down) = match unreachable {
        Unreachable::AsIs => ("", String::new()),
        Unreachable::Open => (
            NGINX_CATCH,
            format!(
                r#"
        location @tollgate_down {{
            # Fail open: forwarded as if tollgate had allowed it.
            proxy_pass {backend};
        }}"#
            ),
        ),
        Unreachable::Closed => (
            NGINX_CATCH,
            r#"
        location @tollgate_down {
            # Fail closed: refused until tollgate answers again.
            add_header Retry-After 5 always;
            default_type application/json;
            return 503 '{"error":"rate limiter unavailable"}';
        }"#
            .to_owned(),
        ),
    };
    let timeouts = match unreachable {
        Unreachable::AsIs => "",
        _ => NGINX_TIMEOUTS,
    };
    format!(
        r#"    server {{
        listen 127.0.0.1:{port};

        location / {{
            auth_request /_tollgate;
            # The decision's numbers, onto the answer the client gets.
            auth_request_set $tollgate_limit $upstream_http_x_ratelimit_limit;
            auth_request_set $tollgate_remaining $upstream_http_x_ratelimit_remaining;
            auth_request_set $tollgate_retry_after $upstream_http_retry_after;
            add_header X-RateLimit-Limit $tollgate_limit always;
            add_header X-RateLimit-Remaining $tollgate_remaining always;
            # auth_request takes only 2xx, 401 and 403: tollgate answers 403 (?status=403),
            # mapped back to 429 here.
            error_page 403 = @tollgate_limited;{catch}
            proxy_pass {backend};
        }}

        location = /_tollgate {{
            internal;
            proxy_pass http://{decide}{target};
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Forwarded-Host $host;
            # The edge proxy: the client is the peer, whatever it wrote itself.
            proxy_set_header X-Forwarded-For $remote_addr;{timeouts}
        }}

        location @tollgate_limited {{
            add_header Retry-After $tollgate_retry_after always;
            add_header X-RateLimit-Limit $tollgate_limit always;
            add_header X-RateLimit-Remaining $tollgate_remaining always;
            default_type application/json;
            return 429 '{{"error":"rate limit exceeded"}}';
        }}{down}
    }}"#
    )
}

/// The fail-open and fail-closed recipes' line in `location /`, as docs/operations.md shows it.
const NGINX_CATCH: &str = r#"
            # tollgate unreachable: auth_request answers 500 (the backend's own 5xx are passed
            # through, not caught: proxy_intercept_errors is off).
            error_page 500 = @tollgate_down;"#;

/// The recipes' timeouts in `location = /_tollgate`: a tollgate that hangs is unreachable too.
const NGINX_TIMEOUTS: &str = r#"
            proxy_connect_timeout 1s;
            proxy_read_timeout 5s;"#;

fn caddy(decide: SocketAddr, backend: &Backend) -> Proxy {
    caddy_failing(decide, backend, Unreachable::AsIs)
}

/// docs/operations.md's Caddy setup, doing `unreachable` when tollgate cannot be asked.
fn caddy_failing(decide: SocketAddr, backend: &Backend, unreachable: Unreachable) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let backend = backend.url().trim_start_matches("http://").to_owned();
    let down = match unreachable {
        Unreachable::AsIs => String::new(),
        Unreachable::Open => format!(
            r#"
    # tollgate unreachable: forward_auth fails with 502. Fail open, for that failure only
    # (the backend's own failure is not sent twice).
    handle_errors 502 {{
        @tollgate_down expression `{{http.reverse_proxy.upstream.hostport}} == "{decide}"`
        reverse_proxy @tollgate_down {backend}
    }}"#
        ),
        Unreachable::Closed => format!(
            r#"
    # tollgate unreachable: forward_auth fails with 502. Fail closed with 503.
    handle_errors 502 {{
        @tollgate_down expression `{{http.reverse_proxy.upstream.hostport}} == "{decide}"`
        header @tollgate_down Retry-After 5
        respond @tollgate_down `{{"error":"rate limiter unavailable"}}` 503
    }}"#
        ),
    };
    let config = format!(
        r#"{{
    admin off
    auto_https off
    persist_config off
}}

:{port} {{
    bind 127.0.0.1
    forward_auth {decide} {{
        uri /v1/forward-auth
        copy_headers X-RateLimit-Limit X-RateLimit-Remaining
    }}
    reverse_proxy {backend}{down}
}}
"#
    );
    let file = write(dir.path(), "Caddyfile", &config);
    let mut command = Command::new("caddy");
    command
        .args(["run", "--adapter", "caddyfile", "--config", &file])
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .env("HOME", dir.path());
    Proxy::start(command, SocketAddr::from(([127, 0, 0, 1], port)), dir)
}

fn traefik(decide: SocketAddr, backend: &Backend) -> Proxy {
    traefik_copying(decide, backend, "[X-RateLimit-Limit, X-RateLimit-Remaining]")
}

/// Traefik copying `headers` (a YAML list) from the decision onto the forwarded request.
fn traefik_copying(decide: SocketAddr, backend: &Backend, headers: &str) -> Proxy {
    let routes = format!(
        r#"http:
  routers:
    app:
      rule: "PathPrefix(`/`)"
      entryPoints: [web]
      middlewares: [tollgate]
      service: app
  middlewares:
    tollgate:
      forwardAuth:
        address: "http://{decide}/v1/forward-auth"
        authResponseHeaders: {headers}
  services:
    app:
      loadBalancer:
        servers:
          - url: "{backend}"
"#,
        backend = backend.url()
    );
    traefik_serving(&routes, "")
}

/// docs/operations.md's Traefik fail-open setup: ForwardAuth asks Traefik itself (entrypoint
/// `tollgate`), where a `failover` service sends the question to tollgate while its health
/// check (`/healthz` on the admin port, `admin`) and its passive check find it up, and to
/// `ping@internal` (`200` to any method and path: allowed) otherwise; the `retry` sends the
/// question that found tollgate gone once more, to the fallback.
fn traefik_failing_open(decide: SocketAddr, admin: SocketAddr, backend: &Backend) -> Proxy {
    let ask = free_port();
    let routes = format!(
        r#"http:
  routers:
    app:
      rule: "PathPrefix(`/`)"
      entryPoints: [web]
      middlewares: [tollgate]
      service: app
    tollgate:
      rule: "PathPrefix(`/`)"
      entryPoints: [tollgate]
      middlewares: [ask-again]
      service: tollgate-or-allow
  middlewares:
    tollgate:
      forwardAuth:
        address: "http://127.0.0.1:{ask}/v1/forward-auth"
        authResponseHeaders: [X-RateLimit-Limit, X-RateLimit-Remaining]
    ask-again:
      retry:
        attempts: 2
  services:
    app:
      loadBalancer:
        servers:
          - url: "{backend}"
    tollgate-or-allow:
      failover:
        service: tollgate
        fallback: ping@internal
    tollgate:
      loadBalancer:
        servers:
          - url: "http://{decide}"
        healthCheck:
          port: {admin_port}
          path: /healthz
          interval: 1s
          timeout: 500ms
        passiveHealthCheck:
          maxFailedAttempts: 1
          failureWindow: 10s
"#,
        backend = backend.url(),
        admin_port = admin.port(),
    );
    let entrypoint = format!(
        r#"  tollgate:
    address: "127.0.0.1:{ask}"
    forwardedHeaders:
      trustedIPs: ["127.0.0.1/32"]
ping:
  manualRouting: true
"#
    );
    traefik_serving(&routes, &entrypoint)
}

/// Traefik serving `routes` (its file provider's dynamic configuration) on entrypoint `web`,
/// with `more` appended to the static configuration's `entryPoints` (more of them, then more
/// top-level sections).
fn traefik_serving(routes: &str, more: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let routes = write(dir.path(), "routes.yml", routes);
    let config = format!(
        r#"entryPoints:
  web:
    address: "127.0.0.1:{port}"
{more}providers:
  file:
    filename: "{routes}"
log:
  level: WARN
global:
  checkNewVersion: false
  sendAnonymousUsage: false
"#
    );
    let file = write(dir.path(), "traefik.yml", &config);
    let mut command = Command::new("traefik");
    command
        .arg(format!("--configFile={file}"))
        .env("HOME", dir.path());
    Proxy::start(command, SocketAddr::from(([127, 0, 0, 1], port)), dir)
}

/// Two requests of one client pass to the backend, the third is refused with `429` and
/// `Retry-After` (and never reaches it); another client still passes.
async fn limits_each_client(proxy: &Proxy, backend: &Backend, copies_headers_to_the_client: bool) {
    let (first, second): (IpAddr, IpAddr) = ([127, 0, 0, 2].into(), [127, 0, 0, 3].into());
    let before = backend.seen().len();
    let send = |from| async move { get_from(proxy.addr, from, "/api/items?page=1", &[]).await };
    for remaining in ["1", "0"] {
        let reply: Reply = send(first).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{}\n{}",
            reply.text(),
            proxy.output()
        );
        if copies_headers_to_the_client {
            assert_eq!(reply.header("x-ratelimit-remaining"), Some(remaining));
        }
    }
    assert_eq!(backend.seen().len(), before + 2);
    let refused = send(first).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text()
    );
    assert!(refused.number("retry-after") >= 1);
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        backend.seen().len(),
        before + 2,
        "a refused request never reaches the backend"
    );
    // A client's own X-Forwarded-For chooses nothing: the proxy in front writes the address.
    let spoofed = get_from(proxy.addr, first, "/api", &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(spoofed.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(second).await.status, StatusCode::OK);
}

#[tokio::test]
async fn nginx_auth_request_limits_through_forward_auth() {
    let backend = Backend::start().await;
    let gateway = decision_service().await;
    let proxy = nginx(gateway.decide.unwrap(), &backend);
    // The readiness request is a client of its own.
    proxy.ready([127, 0, 0, 9].into()).await;
    limits_each_client(&proxy, &backend, true).await;
    gateway.stop().await;
}

#[tokio::test]
async fn caddy_forward_auth_limits_through_forward_auth() {
    let backend = Backend::start().await;
    let gateway = decision_service().await;
    let proxy = caddy(gateway.decide.unwrap(), &backend);
    proxy.ready([127, 0, 0, 9].into()).await;
    // Caddy copies the headers onto the request to the backend, not the client's answer.
    limits_each_client(&proxy, &backend, false).await;
    assert!(backend.last().headers.get("x-ratelimit-remaining").is_some());
    gateway.stop().await;
}

#[tokio::test]
async fn traefik_forward_auth_limits_through_forward_auth() {
    let backend = Backend::start().await;
    let gateway = decision_service().await;
    let proxy = traefik(gateway.decide.unwrap(), &backend);
    proxy.ready([127, 0, 0, 9].into()).await;
    limits_each_client(&proxy, &backend, false).await;
    assert!(backend.last().headers.get("x-ratelimit-remaining").is_some());
    gateway.stop().await;
}

#[tokio::test]
async fn nginx_auth_request_works_with_deny_status_403_alone() {
    // DENY_STATUS=403 instead of ?status=403 on the URL: the setup above, unchanged otherwise.
    let backend = Backend::start().await;
    let gateway = decision_service_with(&[("DENY_STATUS", "403")]).await;
    let proxy = nginx_calling(gateway.decide.unwrap(), &backend, "/v1/forward-auth");
    proxy.ready([127, 0, 0, 9].into()).await;
    limits_each_client(&proxy, &backend, true).await;
    gateway.stop().await;
}

#[tokio::test]
async fn traefik_forwards_the_budget_to_the_backend_and_the_problem_body_to_the_client() {
    let backend = Backend::start().await;
    let gateway =
        decision_service_with(&[("FORWARD_RATELIMIT_HEADERS", "true"), ("DENY_FORMAT", "problem")]).await;
    let proxy = traefik_copying(gateway.decide.unwrap(), &backend, "[RateLimit, RateLimit-Policy]");
    proxy.ready([127, 0, 0, 9].into()).await;
    let client: IpAddr = [127, 0, 0, 4].into();
    let forged = [
        ("ratelimit", r#""general";r=1000;t=1"#),
        ("ratelimit-policy", r#""general";q=1000;w=1"#),
    ];
    for remaining in [1, 0] {
        let reply = get_from(proxy.addr, client, "/api/items", &forged).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{}\n{}",
            reply.text(),
            proxy.output()
        );
        // Traefik sets the decision's fields on the request, the client's own replaced.
        let seen = backend.last().headers;
        let rate_limit: Vec<_> = seen.get_all("ratelimit").iter().collect();
        assert_eq!(rate_limit.len(), 1, "{seen:?}");
        let rate_limit = rate_limit[0].to_str().unwrap();
        assert!(
            rate_limit.starts_with(&format!(r#""general";r={remaining};t="#)),
            "{rate_limit}"
        );
        assert_eq!(seen["ratelimit-policy"], r#""general";q=2;w=2000"#);
    }
    // Traefik passes a refusal on as it came: status, Retry-After, problem body and type.
    let refused = get_from(proxy.addr, client, "/api/items", &[("accept", "*/*")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["retry-after"], refused.number("retry-after"));
    gateway.stop().await;
}

/// A request written byte by byte from `from` to `to`: its status line.
async fn raw_status_line_from(to: SocketAddr, from: IpAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await.unwrap();
    line.trim_end().to_owned()
}

/// nginx as Debian ships it (`proxy_params`: `X-Forwarded-For $proxy_add_x_forwarded_for`,
/// the client's own header with its address appended), in front of tollgate's proxy and in
/// front of a backend it asks forward-auth for with the same header; the proxy's own address
/// exempt, as the docs' examples exempt the internal network. A client's `X-Forwarded-For:
/// \xff` leaves it the client nginx appended, on both doors: an earlier version gave up on the
/// line and took nginx for the client, every request allowed past an exhausted budget.
#[tokio::test]
async fn a_byte_in_the_clients_forwarded_for_never_makes_nginx_the_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_decide(
        Some(&backend.url()),
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("EXEMPT", "127.0.0.1"),
            ("MAX_TOKENS", "2"),
            ("REFILL_RATE", "0.001"),
        ],
    )
    .await;
    let (front, auth) = (free_port(), free_port());
    let sites = format!(
        r#"    server {{
        listen 127.0.0.1:{front};
        location / {{
            # Debian's /etc/nginx/proxy_params.
            proxy_set_header Host $host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_pass http://{proxy};
        }}
    }}
    server {{
        listen 127.0.0.1:{auth};
        location / {{
            auth_request /_tollgate;
            error_page 403 = @tollgate_limited;
            proxy_pass {backend};
        }}
        location = /_tollgate {{
            internal;
            proxy_pass http://{decide}/v1/forward-auth?status=403;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
        location @tollgate_limited {{
            return 429;
        }}
    }}"#,
        proxy = gateway.addr,
        decide = gateway.decide.unwrap(),
        backend = backend.url(),
    );
    let nginx = nginx_serving(front, &sites, false);
    nginx.ready([127, 0, 0, 9].into()).await;
    let forged =
        b"GET /api HTTP/1.1\r\nHost: app.example\r\nX-Forwarded-For: \xff\r\nConnection: close\r\n\r\n";
    for (port, client) in [(front, [127, 0, 0, 2]), (auth, [127, 0, 0, 3])] {
        let (to, client) = (SocketAddr::from(([127, 0, 0, 1], port)), IpAddr::from(client));
        for _ in 0..2 {
            let reply = get_from(to, client, "/api", &[]).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{}\n{}",
                reply.text(),
                nginx.output()
            );
        }
        assert_eq!(
            get_from(to, client, "/api", &[]).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        for _ in 0..20 {
            let status = raw_status_line_from(to, client, forged).await;
            assert!(
                status.starts_with("HTTP/1.1 429"),
                "port {port}: {status}\n{}",
                nginx.output()
            );
        }
    }
    gateway.stop().await;
}

/// With tollgate stopped, each proxy as it comes (nginx `500`, Caddy `502`, Traefik `500`), and
/// docs/operations.md's fail-open recipe (forwarded to the backend, nothing else changed: a
/// refusal while tollgate runs is still a refusal) and fail-closed one (`503`, `Retry-After`).
async fn when_tollgate_stops(
    start: impl Fn(&Gateway, &Backend, Unreachable) -> Proxy,
    unreachable: Unreachable,
    as_is: StatusCode,
) {
    let backend = Backend::start().await;
    let gateway = Gateway::start_decide_with_admin(&[
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("MAX_TOKENS", "2"),
        ("REFILL_RATE", "0.001"),
    ])
    .await;
    let decide = gateway.decide.unwrap();
    let proxy = start(&gateway, &backend, unreachable);
    proxy.ready([127, 0, 0, 9].into()).await;
    // While tollgate runs, the recipe changes nothing.
    limits_each_client(&proxy, &backend, false).await;
    gateway.stop().await;
    assert!(
        tokio::net::TcpStream::connect(decide).await.is_err(),
        "tollgate is stopped"
    );
    let client: IpAddr = [127, 0, 0, 5].into();
    for method in [http::Method::GET, http::Method::POST] {
        let before = backend.seen().len();
        let reply = crate::support::request(
            proxy.addr,
            client,
            method.clone(),
            "/api/items",
            &[],
            bytes::Bytes::from_static(b"order=1"),
        )
        .await;
        let reached = backend.seen().len() - before;
        match unreachable {
            Unreachable::AsIs => {
                assert_eq!(
                    reply.status,
                    as_is,
                    "{method}: {}\n{}",
                    reply.text(),
                    proxy.output()
                );
                assert_eq!(reached, 0);
            }
            Unreachable::Open => {
                assert_eq!(
                    reply.status,
                    StatusCode::OK,
                    "{method}: {}\n{}",
                    reply.text(),
                    proxy.output()
                );
                assert_eq!(reached, 1, "{method}: forwarded once");
                let seen = backend.last();
                assert_eq!(seen.uri, "/api/items");
                if method == http::Method::POST {
                    assert_eq!(seen.headers["content-length"], "7", "{method}: the body too");
                }
            }
            Unreachable::Closed => {
                assert_eq!(
                    reply.status,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{method}: {}\n{}",
                    reply.text(),
                    proxy.output()
                );
                assert_eq!(reply.header("retry-after"), Some("5"));
                assert_eq!(reached, 0);
            }
        }
    }
    // The backend's own failure is not retried by the fail-open recipe.
    if let Unreachable::Open = unreachable {
        backend.stop().await;
        let reply = get_from(proxy.addr, client, "/api/items", &[]).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    }
}

#[tokio::test]
async fn nginx_with_tollgate_stopped_answers_500_fails_open_or_closed_as_configured() {
    let nginx = |gateway: &Gateway, backend: &Backend, unreachable| {
        nginx_failing(
            gateway.decide.unwrap(),
            backend,
            "/v1/forward-auth?status=403",
            unreachable,
        )
    };
    for unreachable in [Unreachable::AsIs, Unreachable::Open, Unreachable::Closed] {
        when_tollgate_stops(nginx, unreachable, StatusCode::INTERNAL_SERVER_ERROR).await;
    }
}

#[tokio::test]
async fn caddy_with_tollgate_stopped_answers_502_fails_open_or_closed_as_configured() {
    for unreachable in [Unreachable::AsIs, Unreachable::Open, Unreachable::Closed] {
        let caddy = |gateway: &Gateway, backend: &Backend, unreachable| {
            caddy_failing(gateway.decide.unwrap(), backend, unreachable)
        };
        when_tollgate_stops(caddy, unreachable, StatusCode::BAD_GATEWAY).await;
    }
}

/// Traefik's ForwardAuth has no failure handler: with tollgate stopped every request is `500`
/// (docs/operations.md says so, and what to do instead).
#[tokio::test]
async fn traefik_with_tollgate_stopped_answers_500() {
    let traefik = |gateway: &Gateway, backend: &Backend, _| traefik(gateway.decide.unwrap(), backend);
    when_tollgate_stops(traefik, Unreachable::AsIs, StatusCode::INTERNAL_SERVER_ERROR).await;
}

/// docs/operations.md's Traefik fail-open recipe (ForwardAuth asking Traefik itself, a
/// `failover` service falling back to `ping@internal`): while tollgate runs a refusal is still
/// `429`; from the first request after it stops, `GET` and `POST` reach the backend unchanged.
#[tokio::test]
async fn traefik_fails_open_through_a_failover_service_with_tollgate_stopped() {
    let traefik = |gateway: &Gateway, backend: &Backend, _| {
        traefik_failing_open(gateway.decide.unwrap(), gateway.admin.unwrap(), backend)
    };
    when_tollgate_stops(traefik, Unreachable::Open, StatusCode::INTERNAL_SERVER_ERROR).await;
}

/// Every nginx block in README.md and docs/operations.md is marked a fragment on its first
/// line, or is a whole `server` block that passes `nginx -t` and works: behind it a client is
/// refused `429` with `Retry-After`, never `500` (the README's short block once named an
/// `@tollgate_limited` that only the long one had, so every refusal was a `500`).
#[tokio::test]
async fn every_nginx_block_in_the_docs_is_a_fragment_or_works() {
    let mut complete = 0;
    for file in ["README.md", "docs/operations.md"] {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        for block in text.split("```nginx\n").skip(1) {
            let block = block.split("```").next().unwrap();
            // The README's blocks are indented as list items.
            let indent = block
                .lines()
                .next()
                .map_or(0, |line| line.len() - line.trim_start().len());
            let block: String = block
                .lines()
                .map(|line| line.get(indent..).unwrap_or(line.trim_start()))
                .collect::<Vec<_>>()
                .join("\n");
            if block.starts_with("# fragment") {
                continue;
            }
            complete += 1;
            let backend = Backend::start().await;
            let gateway = decision_service().await;
            let port = free_port();
            let site = block
                .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
                .replace("http://app:8000", &backend.url())
                .replace("tollgate:8081", &gateway.decide.unwrap().to_string());
            let mut checked = nginx_serving(free_port(), &site, true);
            let status = checked.child.wait().unwrap();
            assert!(
                status.success(),
                "{file}: nginx -t fails on\n{site}\n{}",
                checked.output()
            );
            let proxy = nginx_serving(port, &site, false);
            proxy.ready([127, 0, 0, 9].into()).await;
            limits_each_client(&proxy, &backend, false).await;
            gateway.stop().await;
        }
    }
    assert_eq!(complete, 2, "README's block and docs/operations.md's");
}
