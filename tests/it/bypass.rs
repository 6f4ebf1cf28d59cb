//! What is counted is what is forwarded, again: the ways around the limit an outside test found
//! (a target two readers split differently, an h2c tunnel, a key flood that evicts a refused
//! client, encoded delimiters and a second spelling of the key header), each through the real
//! binary, against the readers backends use. `TOLLGATE_UNDER_TEST=path` runs them against
//! another build (an older release, to see each fail before its fix).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::binary::Running;
use crate::support::{Backend, free_port, read_head, redis::wait_for};

/// `tests/it/support/url_readers.py`: a backend that answers each request with how
/// `urlsplit`, `urljoin` and a decode-first reader read its target.
struct UrlReaders {
    child: Child,
    port: u16,
}

impl UrlReaders {
    fn start() -> UrlReaders {
        let port = free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/url_readers.py");
        let child = Command::new("python3")
            .args([script, &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 runs (scripts/test.sh checks it is installed)");
        wait_for(
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "the URL-readers backend to listen",
        );
        UrlReaders { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for UrlReaders {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response read off a raw connection: its status and body.
struct Raw {
    status: u16,
    body: String,
}

/// Send `request` (which asks for `Connection: close`) on a fresh connection and read the
/// whole answer.
async fn raw(addr: SocketAddr, request: &str) -> Raw {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    Raw {
        status,
        body: body.to_owned(),
    }
}

/// `GET target` from 127.0.0.1, with `extra` header lines (each ending in `\r\n`).
async fn get(addr: SocketAddr, target: &str, extra: &str) -> Raw {
    raw(
        addr,
        &format!("GET {target} HTTP/1.1\r\nHost: gateway.test\r\n{extra}Connection: close\r\n\r\n"),
    )
    .await
}

/// The readings of url_readers.py that name a path, normalised the way a router would
/// compare them (case and a trailing slash ignored).
fn paths_read(body: &str) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    for key in ["urlsplit", "urljoin", "decoded"] {
        let field = format!("\"{key}\": \"");
        let start = body.find(&field).unwrap_or_else(|| panic!("no {key} in {body}")) + field.len();
        let value = &body[start..start + body[start..].find('"').unwrap()];
        let normalised = value.to_ascii_lowercase();
        let normalised = normalised.trim_end_matches('/');
        paths.push((key.to_owned(), normalised.to_owned()));
    }
    paths
}

/// Targets that name `/login` to some reader while a gateway counting path segments reads
/// another path: an empty first segment (an authority to a URL-reference reader), an encoded
/// slash that decodes into one, encoded `?` and `#`.
const TWO_WAY_TARGETS: &[&str] = &[
    "//evil/login",
    "///evil/login",
    "//evil/login?x=1",
    "//evil:80/login",
    "//user@evil/login",
    "/%2Fevil/login",
    "/%2fevil/login",
    "//%2Fevil/login",
    "/login%3f",
    "/login%3F",
    "/login%3Fx=1",
    "/login%23",
    "/login%23frag",
    "/LOGIN%3f",
    "//login",
    "/x/..//evil/login",
];

#[tokio::test]
async fn no_reader_is_served_login_past_an_exhausted_auth_budget() {
    let readers = UrlReaders::start();
    let tollgate = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        ("AUTH_PATHS", "/login"),
        ("AUTH_MAX_TOKENS", "1"),
        ("AUTH_REFILL_RATE", "0.001"),
    ]);
    assert_eq!(get(tollgate.addr, "/login", "").await.status, 200);
    assert_eq!(get(tollgate.addr, "/login", "").await.status, 429);
    for target in TWO_WAY_TARGETS {
        let answer = get(tollgate.addr, target, "").await;
        match answer.status {
            // Refused as ambiguous, or counted as /login.
            400 | 429 => {}
            200 => {
                for (reader, path) in paths_read(&answer.body) {
                    assert_ne!(
                        path, "/login",
                        "{target:?}: {reader} read /login: {}",
                        answer.body
                    );
                }
            }
            status => panic!("{target:?}: {status}"),
        }
    }

    // HTTP/2's :path is the same target.
    let stream = TcpStream::connect(tollgate.addr).await.unwrap();
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    for target in TWO_WAY_TARGETS {
        let request = Request::get(format!("http://gateway.test{target}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        match status {
            StatusCode::BAD_REQUEST | StatusCode::TOO_MANY_REQUESTS => {}
            StatusCode::OK => {
                for (reader, path) in paths_read(&body) {
                    assert_ne!(path, "/login", "h2 {target:?}: {reader} read /login: {body}");
                }
            }
            status => panic!("h2 {target:?}: {status}"),
        }
    }
}

#[tokio::test]
async fn an_empty_first_segment_is_forwarded_merged_and_encoded_delimiters_are_refused() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    assert_eq!(get(tollgate.addr, "//evil/login?q=1", "").await.status, 200);
    assert_eq!(backend.last().uri, "/evil/login?q=1");
    assert_eq!(get(tollgate.addr, "///a;x/B", "").await.status, 200);
    assert_eq!(backend.last().uri, "/a;x/B");
    for target in ["/login%3f", "/login%3Fx=1", "/login%23", "/%2Fevil/login"] {
        let answer = get(tollgate.addr, target, "").await;
        assert_eq!(answer.status, 400, "{target:?}");
        assert!(answer.body.contains("ambiguous"), "{target:?}: {}", answer.body);
    }
    assert_eq!(backend.seen().len(), 2, "nothing refused reached the backend");
}

#[tokio::test]
async fn an_absolute_form_target_without_a_path_is_forwarded_as_slash() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    for target in ["http://x#frag", "http://x", "http://x?q=1#frag"] {
        assert_eq!(get(tollgate.addr, target, "").await.status, 200, "{target}");
    }
    let seen: Vec<String> = backend.seen().into_iter().map(|seen| seen.uri).collect();
    assert_eq!(seen, ["/", "/", "/?q=1"]);
}

#[tokio::test]
async fn an_h2c_upgrade_never_reaches_the_backend() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url())]);
    let h2c =
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n";
    // On a path the backend would switch on, too.
    for target in ["/login", "/ws"] {
        let answer = get(tollgate.addr, target, h2c).await;
        assert_eq!(answer.status, 200, "{target}: answered as plain HTTP/1.1");
        let seen = backend.last();
        assert!(
            !seen.headers.contains_key("upgrade") && !seen.headers.contains_key("http2-settings"),
            "{target}: {:?}",
            seen.headers
        );
    }
    // A mixed offer goes on with the protocol that is allowed.
    let mut stream = TcpStream::connect(tollgate.addr).await.unwrap();
    stream
        .write_all(b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert_eq!(backend.last().headers["upgrade"], "websocket");
}

#[tokio::test]
async fn a_backend_that_switches_unasked_opens_no_tunnel() {
    // A backend that answers every request with a switch to h2c.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read_exact(&mut byte).await.is_ok() {
                    head.push(byte[0]);
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
                    )
                    .await;
                let _ = stream.read(&mut byte).await;
            });
        }
    });
    let tollgate = Running::start(&[("BACKEND_URL", &format!("http://{addr}"))]);
    assert_eq!(get(tollgate.addr, "/", "").await.status, 502, "asked for nothing");
    let websocket = "Connection: Upgrade\r\nUpgrade: websocket\r\n";
    assert_eq!(
        get(tollgate.addr, "/", websocket).await.status,
        502,
        "asked for another protocol"
    );
}

#[test]
fn h2c_cannot_be_allowed() {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .env_clear()
        .envs([
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("UPGRADE_PROTOCOLS", "websocket,h2c"),
        ])
        .arg("--check-config")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("UPGRADE_PROTOCOLS") && stderr.contains("h2c"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_second_spelling_of_the_key_header_is_not_forwarded_and_a_list_is_refused() {
    let backend = Backend::start().await;
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url()), ("KEY_BY", "header:X-API-Key")]);
    let answer = get(
        tollgate.addr,
        "/",
        "X-API-Key: mine\r\nX_API_Key: someone-else\r\nX_Custom: 1\r\n",
    )
    .await;
    assert_eq!(answer.status, 200);
    let seen = backend.last();
    assert_eq!(seen.headers["x-api-key"], "mine");
    assert!(!seen.headers.contains_key("x_api_key") && !seen.headers.contains_key("x_custom"));
    for list in [
        "X-API-Key: a, b\r\n",
        "X-API-Key: a,b\r\n",
        "X-API-Key: a\r\nX-API-Key: b\r\n",
    ] {
        let answer = get(tollgate.addr, "/", list).await;
        assert_eq!(answer.status, 400, "{list:?}");
        assert!(
            answer.body.contains("X-API-Key") || answer.body.contains("x-api-key"),
            "{}",
            answer.body
        );
    }

    let forwarding = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("KEY_BY", "header:X-API-Key"),
        ("UNDERSCORE_HEADERS", "forward"),
    ]);
    let before = backend.seen().len();
    let answer = get(
        forwarding.addr,
        "/",
        "X-API-Key: mine\r\nX_API_Key: someone-else\r\n",
    )
    .await;
    assert_eq!(answer.status, 400, "the backend could read either");
    assert_eq!(backend.seen().len(), before);
    let answer = get(
        forwarding.addr,
        "/",
        "X_Custom: 1\r\nX_Forwarded_For: 6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\n",
    )
    .await;
    assert_eq!(answer.status, 200);
    let seen = backend.last();
    assert_eq!(seen.headers["x_custom"], "1", "other underscore names go through");
    assert!(!seen.headers.contains_key("x_forwarded_for") && !seen.headers.contains_key("x_real_ip"));
}

#[tokio::test]
async fn client_claims_are_believed_from_trusted_proxies_only() {
    let backend = Backend::start().await;
    let claims = "X-Forwarded-Port: 1\r\nX-Forwarded-Prefix: /admin\r\nTrue-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nX-Client-IP: 6.6.6.6\r\n";
    let names = [
        "x-forwarded-port",
        "x-forwarded-prefix",
        "true-client-ip",
        "cf-connecting-ip",
        "x-client-ip",
    ];
    let untrusted = Running::start(&[("BACKEND_URL", &backend.url())]);
    assert_eq!(get(untrusted.addr, "/", claims).await.status, 200);
    let seen = backend.last();
    for name in names {
        assert!(!seen.headers.contains_key(name), "{name} from an untrusted peer");
    }
    let trusted = Running::start(&[("BACKEND_URL", &backend.url()), ("TRUSTED_PROXIES", "127.0.0.1")]);
    assert_eq!(get(trusted.addr, "/", claims).await.status, 200);
    let seen = backend.last();
    for name in names {
        assert!(seen.headers.contains_key(name), "{name} from a trusted proxy");
    }
}

/// How a flood's identities and the victims are told apart, per key mode.
#[derive(Clone, Copy, Debug)]
enum KeyMode {
    /// `KEY_BY=ip`: addresses from `X-Forwarded-For` (the gateway trusts 127.0.0.1).
    Ip,
    /// `KEY_BY=header:X-API-Key`.
    Header,
    /// `KEY_BY=ip+header:X-API-Key`: one address, fresh keys.
    IpAndHeader,
}

impl KeyMode {
    fn key_by(self) -> &'static str {
        match self {
            KeyMode::Ip => "ip",
            KeyMode::Header => "header:X-API-Key",
            KeyMode::IpAndHeader => "ip+header:X-API-Key",
        }
    }

    /// The header lines that make identity `n` (a victim is `n = 0`).
    fn identity(self, n: u32) -> Vec<(String, String)> {
        let ip = format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        let key = format!("key-{n}");
        match self {
            KeyMode::Ip => vec![("x-forwarded-for".into(), ip)],
            KeyMode::Header => vec![("x-api-key".into(), key)],
            KeyMode::IpAndHeader => vec![
                ("x-forwarded-for".into(), "10.0.0.1".into()),
                ("x-api-key".into(), key),
            ],
        }
    }
}

/// Keep-alive requests on one connection, one at a time.
struct Client {
    sender: http1::SendRequest<Empty<Bytes>>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        Client { sender }
    }

    async fn status(&mut self, path: &str, headers: &[(String, String)]) -> u16 {
        let mut request = Request::get(path).header("host", "gateway.test");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        self.sender.ready().await.unwrap();
        let response = self
            .sender
            .send_request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        response.into_body().collect().await.unwrap();
        status
    }
}

const MAX_KEYS: u32 = 16;

#[tokio::test]
async fn key_floods_of_10x_and_100x_max_keys_free_no_refused_client_in_any_key_mode() {
    let backend = Backend::start().await;
    for mode in [KeyMode::Ip, KeyMode::Header, KeyMode::IpAndHeader] {
        let tollgate = Running::start(&[
            ("BACKEND_URL", &backend.url()),
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_KEYS", &MAX_KEYS.to_string()),
            ("KEY_BY", mode.key_by()),
            ("AUTH_KEY_BY", mode.key_by()),
            ("AUTH_PATHS", "/login"),
            ("MAX_TOKENS", "3"),
            ("REFILL_RATE", "0.001"),
            ("AUTH_MAX_TOKENS", "2"),
            ("AUTH_REFILL_RATE", "0.001"),
        ]);
        let mut client = Client::connect(tollgate.addr).await;
        let victim = mode.identity(0);
        // The victim is refused on both rules.
        for expected in [200, 200, 429] {
            assert_eq!(client.status("/login", &victim).await, expected, "{mode:?}");
        }
        for expected in [200, 200, 200, 429] {
            assert_eq!(client.status("/api", &victim).await, expected, "{mode:?}");
        }
        let mut fresh = 1;
        for factor in [10, 100] {
            // Fresh identities, each sent twice, on the general rule and on the auth rule.
            for path in ["/api", "/login"] {
                for _ in 0..factor * MAX_KEYS {
                    let identity = mode.identity(fresh);
                    fresh += 1;
                    assert_eq!(client.status(path, &identity).await, 200, "{mode:?} {path}");
                    assert_eq!(client.status(path, &identity).await, 200, "{mode:?} {path}");
                }
                assert_eq!(
                    client.status("/login", &victim).await,
                    429,
                    "{mode:?}: a flood of {factor}x MAX_KEYS on {path} freed the auth victim"
                );
                assert_eq!(
                    client.status("/api", &victim).await,
                    429,
                    "{mode:?}: a flood of {factor}x MAX_KEYS on {path} freed the general victim"
                );
            }
        }
        tollgate.terminate().await;
    }
}

/// `method target` from 127.0.0.1, with `extra` header lines (each ending in `\r\n`).
async fn send(addr: SocketAddr, method: &str, target: &str, extra: &str) -> Raw {
    raw(
        addr,
        &format!(
            "{method} {target} HTTP/1.1\r\nHost: gateway.test\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}

/// A field of url_readers.py's readings, from the body (or, for a HEAD, `X-Readings`).
fn reading(body: &str, key: &str) -> String {
    let field = format!("\"{key}\": ");
    let start = body.find(&field).unwrap_or_else(|| panic!("no {key} in {body}")) + field.len();
    let end = match &body[start..start + 1] {
        "[" => start + body[start..].find(']').unwrap() + 1,
        _ => start + 1 + body[start + 1..].find('"').unwrap() + 1,
    };
    body[start..end].to_owned()
}

#[tokio::test]
async fn no_reader_runs_a_routes_method_past_its_exhausted_budget() {
    let readers = UrlReaders::start();
    let tollgate = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        (
            "ROUTES",
            "/search=fixed_window:1:3600,method=GET,name=search;/items/*=fixed_window:1:3600,method=DELETE,name=delete",
        ),
    ]);
    assert_eq!(send(tollgate.addr, "GET", "/search", "").await.status, 200);
    assert_eq!(send(tollgate.addr, "DELETE", "/items/1", "").await.status, 200);
    // Each of these is GET /search (or DELETE /items/1) to some backend: Werkzeug and Rack
    // upper-case the method and run a GET route for HEAD; Symfony, Rails and Express honour
    // the override headers.
    for (method, target, extra, read_as) in [
        ("GET", "/search", "", "GET"),
        ("get", "/search", "", "GET"),
        ("Get", "/search.json", "", "GET"),
        ("HEAD", "/search", "", "GET"),
        ("POST", "/search", "X-HTTP-Method-Override: GET\r\n", "GET"),
        ("POST", "/search", "X-HTTP-Method-Override: get\r\n", "GET"),
        ("POST", "/search", "X-HTTP-Method: GET\r\n", "GET"),
        ("PUT", "/search", "X-Method-Override: GET\r\n", "GET"),
        ("POST", "/search", "X-HTTP-Method-Override: PATCH, GET\r\n", "GET"),
        ("POST", "/search?_method=GET", "", "GET"),
        ("POST", "/search?a=1&_method=%67et", "", "GET"),
        ("POST", "/items/1", "X-HTTP-Method-Override: DELETE\r\n", "DELETE"),
        ("POST", "/items/1", "X-HTTP-Method-Override: delete\r\n", "DELETE"),
        ("delete", "/items/1", "", "DELETE"),
    ] {
        let answer = send(tollgate.addr, method, target, extra).await;
        match answer.status {
            400 | 429 => {}
            200 => {
                // A HEAD's answer has no body: the GET route ran.
                let methods = match answer.body.as_str() {
                    "" => r#"["GET", "HEAD"]"#.to_owned(),
                    body => reading(body, "methods"),
                };
                assert!(
                    !methods.contains(&format!("\"{read_as}\"")),
                    "{method} {target} {extra:?}: read as {methods}"
                );
            }
            status => panic!("{method} {target} {extra:?}: {status}"),
        }
    }
    // A method no route of the path lists is the general rule's, forwarded as sent.
    let other = send(
        tollgate.addr,
        "POST",
        "/items/1",
        "X-HTTP-Method-Override: PATCH\r\n",
    )
    .await;
    assert_eq!(other.status, 200);
    assert_eq!(reading(&other.body, "methods"), r#"["PATCH", "POST"]"#);

    // METHOD_OVERRIDE=strip: the headers never reach the backend, and the request is the
    // method it was sent as, to the gateway and the backend alike.
    let stripping = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        ("ROUTES", "/items/*=fixed_window:1:3600,method=DELETE,name=delete"),
        ("METHOD_OVERRIDE", "strip"),
    ]);
    assert_eq!(send(stripping.addr, "DELETE", "/items/1", "").await.status, 200);
    assert_eq!(send(stripping.addr, "DELETE", "/items/1", "").await.status, 429);
    for extra in [
        "X-HTTP-Method-Override: DELETE\r\n",
        "X-HTTP-Method: DELETE\r\nX-Method-Override: DELETE\r\n",
    ] {
        let answer = send(stripping.addr, "POST", "/items/1", extra).await;
        assert_eq!(answer.status, 200, "{extra:?}");
        assert_eq!(reading(&answer.body, "methods"), r#"["POST"]"#, "{extra:?}");
    }

    // An underscore spelling, which Rack and PHP read as the header, never reaches the
    // backend, even with UNDERSCORE_HEADERS=forward.
    let forwarding = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        ("ROUTES", "/items/*=fixed_window:1:3600,method=DELETE,name=delete"),
        ("UNDERSCORE_HEADERS", "forward"),
    ]);
    assert_eq!(send(forwarding.addr, "DELETE", "/items/1", "").await.status, 200);
    let answer = send(
        forwarding.addr,
        "POST",
        "/items/1",
        "X_HTTP_Method_Override: DELETE\r\n",
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(reading(&answer.body, "methods"), r#"["POST"]"#);
}

#[tokio::test]
async fn no_reader_runs_a_script_past_its_exhausted_budget() {
    let readers = UrlReaders::start();
    let tollgate = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        ("AUTH_PATHS", "/wp-login.php,/cgi-bin/login"),
        ("AUTH_MAX_TOKENS", "1"),
        ("AUTH_REFILL_RATE", "0.001"),
    ]);
    assert_eq!(send(tollgate.addr, "POST", "/wp-login.php", "").await.status, 200);
    // PHP (and CGI) runs each of these as /wp-login.php, with the rest as PATH_INFO.
    for target in [
        "/wp-login.php",
        "/wp-login.php/x",
        "/wp-login.php/x.php",
        "/wp-login.php/",
        "/WP-LOGIN.PHP/x",
        "/wp-login.php;x/y",
        "/wp-login.php%2Fx",
        "/x/../wp-login.php/x",
        "/cgi-bin/login.cgi/x",
        "/cgi-bin/login.pl/x",
    ] {
        let answer = send(tollgate.addr, "POST", target, "").await;
        match answer.status {
            400 | 429 => {}
            200 => {
                let script = reading(&answer.body, "script");
                assert!(
                    script != "\"/wp-login.php\"" && !script.starts_with("\"/cgi-bin/login."),
                    "{target:?}: ran {script}"
                );
            }
            status => panic!("{target:?}: {status}"),
        }
    }
    // Not a script of the rule: its own budget, forwarded byte for byte.
    let other = send(tollgate.addr, "POST", "/wp-login.phps/x", "").await;
    assert_eq!(other.status, 200);
    assert_eq!(reading(&other.body, "raw"), "\"/wp-login.phps/x\"");
    // Counted as the script, forwarded as sent.
    let fresh = Running::start(&[
        ("BACKEND_URL", &readers.url()),
        ("AUTH_PATHS", "/wp-login.php"),
        ("AUTH_MAX_TOKENS", "1"),
        ("AUTH_REFILL_RATE", "0.001"),
    ]);
    let answer = send(fresh.addr, "POST", "/wp-login.php/x", "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(reading(&answer.body, "raw"), "\"/wp-login.php/x\"");
    assert_eq!(send(fresh.addr, "POST", "/wp-login.php", "").await.status, 429);
}
