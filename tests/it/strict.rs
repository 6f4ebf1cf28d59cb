//! Hostile and broken clients: strict HTTP/1.1, request bodies that break off, identity
//! headers the backend can trust, and a path prefix that cannot be escaped. Most requests here
//! are written byte by byte, since a client library would refuse to send them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::support::{Backend, Gateway, get_from, raw_status_line};

/// What came back on a raw connection: the response head (names lower-cased), the bytes after
/// it, and whether the gateway closed the connection.
struct Exchange {
    status_line: String,
    headers: HashMap<String, String>,
    body: String,
    closed: bool,
}

/// Read one response from `stream` (its body by `Content-Length`, or to the close), then
/// wait up to 500 ms for the gateway to close the connection.
async fn read_response(stream: &mut TcpStream) -> Exchange {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let mut closed = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    let head_end = loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => panic!(
                "closed before a response head: {:?}",
                String::from_utf8_lossy(&received)
            ),
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
            Err(_) => panic!("no response head within 5 s"),
        }
    };
    let head = String::from_utf8(received[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap().to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut body = received[head_end + 4..].to_vec();
    let length: Option<usize> = headers.get("content-length").map(|v| v.parse().unwrap());
    loop {
        if length.is_some_and(|length| body.len() >= length) {
            break;
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => body.extend_from_slice(&buffer[..n]),
            Err(_) => break,
        }
    }
    if !closed {
        closed = matches!(
            tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buffer)).await,
            Ok(Ok(0)) | Ok(Err(_))
        );
    }
    Exchange {
        status_line,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        closed,
    }
}

/// Send `request` on a fresh connection and read the response.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Exchange {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The gateway may answer and close before it has read everything; that is its right.
    let _ = stream.write_all(request).await;
    read_response(&mut stream).await
}

/// `tollgate_backend_errors_total`, summed over rules and causes.
async fn backend_errors(gateway: &Gateway) -> f64 {
    let reply = gateway.admin_get("/metrics").await;
    reply
        .text()
        .lines()
        .filter(|line| line.starts_with("tollgate_backend_errors_total{"))
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

/// What [`CollectingBackend`] saw of one request.
#[derive(Debug, Clone)]
struct Collected {
    uri: String,
    headers: HeaderMap,
    /// `None` when the body broke off.
    body: Option<Bytes>,
}

/// A backend that reads each request body whole before it answers (200, with the body's
/// length), after the `x-delay-ms` the request asks for: unlike the echo backend, it does not
/// answer before the upload has ended.
struct CollectingBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Collected>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CollectingBackend {
    async fn start() -> CollectingBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let recorder = recorder.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let recorder = recorder.clone();
                    async move {
                        let uri = request.uri().to_string();
                        let (parts, body) = request.into_parts();
                        let body = body.collect().await.ok().map(|body| body.to_bytes());
                        let length = body.as_ref().map_or(0, Bytes::len);
                        let delay = parts
                            .headers
                            .get("x-delay-ms")
                            .map_or(0, |value| value.to_str().unwrap().parse().unwrap());
                        recorder.lock().unwrap().push(Collected {
                            uri,
                            headers: parts.headers,
                            body,
                        });
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            length.to_string(),
                        ))))
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CollectingBackend { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Collected> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for CollectingBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// --- strict HTTP/1.1 ---------------------------------------------------------------------------

#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused_and_the_connection_closed() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    // Content-Length says 4 bytes: a server that believed it would read `4b\r\n` as the body
    // and the rest as a second request. hyper would read the chunks and drop the
    // Content-Length (RFC 9112 section 6.1 allows that); tollgate refuses, as Envoy and nginx.
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: gateway.test\r\nX-Pad: 0123456789abcdefghij\r\n\r\n";
    let size = format!("{:x}", smuggled.len());
    assert_eq!(
        size.len() + 2,
        4,
        "the chunk-size line is what Content-Length covers"
    );
    let body = format!("{size}\r\n{smuggled}\r\n0\r\n\r\n");
    for framing in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 4",
        "content-length: 4\r\ntransfer-encoding: chunked",
        // hyper does not read a Content-Length after Transfer-Encoding at all.
        "Transfer-Encoding: chunked\r\nContent-Length: abc",
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\nContent-Length: 5",
    ] {
        let request = format!("POST /upload HTTP/1.1\r\nHost: gateway.test\r\n{framing}\r\n\r\n{body}");
        let reply = exchange(gateway.addr, request.as_bytes()).await;
        assert_eq!(reply.status_line, "HTTP/1.1 400 Bad Request", "{framing}");
        assert_eq!(reply.headers["connection"], "close", "{framing}");
        assert!(reply.closed, "{framing}: the connection is closed");
        assert_eq!(
            reply.body,
            r#"{"error":"bad request","reason":"the request has both Content-Length and Transfer-Encoding"}"#
        );
    }
    assert!(backend.seen().is_empty(), "nothing was forwarded");

    // On a keep-alive connection, after a request and a chunked upload whose body holds the
    // same shape of head as text: those two are answered, the third request is refused.
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"GET /first HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream).await.status_line, "HTTP/1.1 200 OK");
    let lookalike = "POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
    let upload = format!(
        "POST /upload HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{lookalike}\r\n0\r\n\r\n",
        lookalike.len()
    );
    stream.write_all(upload.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await.status_line, "HTTP/1.1 200 OK");
    let both = format!(
        "POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
    );
    stream.write_all(both.as_bytes()).await.unwrap();
    let refused = read_response(&mut stream).await;
    assert_eq!(refused.status_line, "HTTP/1.1 400 Bad Request");
    assert!(refused.closed);
    let seen: Vec<String> = backend.seen().into_iter().map(|seen| seen.uri).collect();
    assert_eq!(seen, ["/first", "/upload"]);
    assert_eq!(
        backend.seen()[1].body.as_deref(),
        Some(lookalike.as_bytes()),
        "the upload's body reached the backend whole"
    );
    assert!(!backend.seen()[1].headers.contains_key("content-length"));
}

#[tokio::test]
async fn two_host_headers_are_refused_and_the_connection_closed() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let reply = exchange(
        gateway.addr,
        b"GET / HTTP/1.1\r\nHost: gateway.test\r\nHost: admin.internal\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(reply.headers["connection"], "close");
    assert!(reply.closed);
    assert_eq!(
        reply.body,
        r#"{"error":"bad request","reason":"the request has more than one Host header"}"#
    );
    assert!(
        !reply.headers.contains_key("x-ratelimit-remaining"),
        "refused before any budget is touched"
    );
    assert!(backend.seen().is_empty());
}

#[tokio::test]
async fn a_missing_or_invalid_host_is_refused_in_http_1_1_only() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    for request in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a.example/evil\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: user@a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \"a.example\"\r\n\r\n",
    ] {
        assert_eq!(
            raw_status_line(gateway.addr, request).await,
            "HTTP/1.1 400 Bad Request",
            "{}",
            String::from_utf8_lossy(request)
        );
    }
    assert!(backend.seen().is_empty());
    // HTTP/1.0 needs no Host.
    assert_eq!(
        raw_status_line(gateway.addr, b"GET /old HTTP/1.0\r\n\r\n").await,
        "HTTP/1.0 200 OK"
    );
    assert_eq!(backend.last().uri, "/old");
}

#[tokio::test]
async fn connect_is_405_and_never_reaches_the_backend() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let reply = exchange(
        gateway.addr,
        b"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status_line, "HTTP/1.1 405 Method Not Allowed");
    assert!(reply.headers["allow"].contains("GET"));
    assert!(!reply.headers["allow"].contains("CONNECT"));
    assert_eq!(reply.headers["connection"], "close");
    assert!(reply.closed, "tunnel bytes the client sent next are never read");
    assert!(backend.seen().is_empty());
}

#[tokio::test]
async fn asterisk_form_is_forwarded_with_options_only() {
    let backend = Backend::start().await;
    // With a path prefix too: `*` names the server, and no prefix goes in front of it.
    let gateway = Gateway::start(&format!("{}/public", backend.url()), &[]).await;
    assert_eq!(
        raw_status_line(gateway.addr, b"OPTIONS * HTTP/1.1\r\nHost: gateway.test\r\n\r\n").await,
        "HTTP/1.1 200 OK"
    );
    assert_eq!(backend.last().uri, "*");
    for method in ["GET", "POST", "DELETE"] {
        let request = format!("{method} * HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
        assert_eq!(
            raw_status_line(gateway.addr, request.as_bytes()).await,
            "HTTP/1.1 400 Bad Request",
            "{method}"
        );
    }
    assert_eq!(backend.seen().len(), 1);
}

#[tokio::test]
async fn an_absolute_form_target_names_the_host_the_backend_gets() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let reply = exchange(
        gateway.addr,
        b"GET http://other.example/x?y=1 HTTP/1.1\r\nHost: gateway.test\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status_line, "HTTP/1.1 200 OK");
    let seen = backend.last();
    assert_eq!(seen.uri, "/x?y=1");
    assert_eq!(seen.headers["host"], "other.example");
    assert_eq!(seen.headers["x-forwarded-host"], "other.example");
    assert_eq!(
        seen.headers["forwarded"],
        "for=127.0.0.1;proto=http;host=other.example"
    );
    // User information and other schemes are refused.
    for target in ["http://user:pw@other.example/x", "ftp://other.example/x"] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
        assert_eq!(
            raw_status_line(gateway.addr, request.as_bytes()).await,
            "HTTP/1.1 400 Bad Request",
            "{target}"
        );
    }
    assert_eq!(backend.seen().len(), 1);
}

#[tokio::test]
async fn transfer_codings_other_than_chunked_are_not_implemented() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let reply = exchange(
        gateway.addr,
        b"POST / HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status_line, "HTTP/1.1 501 Not Implemented");
    assert!(reply.closed);
    // hyper itself refuses a coding that does not end in chunked.
    assert_eq!(
        raw_status_line(
            gateway.addr,
            b"POST / HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: gzip\r\n\r\n"
        )
        .await,
        "HTTP/1.1 400 Bad Request"
    );
    assert!(backend.seen().is_empty());
}

// --- a broken client body is the client's fault ------------------------------------------------

#[tokio::test]
async fn a_malformed_chunked_body_is_400_not_a_backend_failure() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[]).await;
    for (what, body) in [
        ("a chunk size that is not hex", "zz\r\nhello\r\n0\r\n\r\n"),
        ("chunk data longer than declared", "3\r\nhelloworld\r\n0\r\n\r\n"),
    ] {
        let request = format!(
            "POST /upload HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
        );
        let reply = exchange(gateway.addr, request.as_bytes()).await;
        assert_eq!(reply.status_line, "HTTP/1.1 400 Bad Request", "{what}");
        assert_eq!(
            reply.body, r#"{"error":"bad request","reason":"the request body could not be read"}"#,
            "{what}"
        );
        assert!(reply.closed, "{what}");
    }
    assert_eq!(backend_errors(&gateway).await, 0.0, "the backend is not blamed");
    assert!(
        backend.seen().iter().all(|seen| seen.body.is_none()),
        "the backend never took a broken body for a whole one"
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_body_is_not_a_backend_failure() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[]).await;
    let head = b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 100\r\n\r\n0123456789";
    // Half-closed: the client sends no more but still reads the answer.
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    stream.shutdown().await.unwrap();
    let reply = read_response(&mut stream).await;
    assert_eq!(reply.status_line, "HTTP/1.1 400 Bad Request");
    // Gone altogether.
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend_errors(&gateway).await, 0.0, "no 502, no warning");
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|seen| seen.body.is_none()),
        "never taken as whole"
    );
}

#[tokio::test]
async fn an_upload_that_stalls_longer_than_the_body_idle_timeout_is_cut() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[("BODY_IDLE_TIMEOUT_MS", "300")]).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let started = Instant::now();
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 10\r\n\r\n01234")
        .await
        .unwrap();
    let reply = read_response(&mut stream).await;
    let waited = started.elapsed();
    assert_eq!(reply.status_line, "HTTP/1.1 408 Request Timeout");
    assert_eq!(reply.headers["connection"], "close");
    assert!(reply.closed);
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(2_000),
        "cut after {waited:?}"
    );
    assert_eq!(backend_errors(&gateway).await, 0.0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(backend.seen().iter().all(|seen| seen.body.is_none()));
}

/// `BODY_MIN_RATE` at 1000 B/s over 1 s windows, with a pause bound that never runs out here:
/// only the rate can cut a body.
const MIN_RATE: &[(&str, &str)] = &[
    ("BODY_MIN_RATE", "1000"),
    ("BODY_MIN_RATE_WINDOW_MS", "1000"),
    ("BODY_IDLE_TIMEOUT_MS", "60000"),
];

/// Slow body: a byte every 50 ms (20 B/s, each pause far inside `BODY_IDLE_TIMEOUT_MS`) would
/// hold its connection and a backend connection for as long as it likes; under the minimum
/// rate it is answered 408 and the backend's request is abandoned (the backend never gets a
/// whole body).
#[tokio::test]
async fn an_upload_that_trickles_below_the_minimum_rate_is_cut() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), MIN_RATE).await;
    let stream = TcpStream::connect(gateway.addr).await.unwrap();
    let (reader, mut writer) = stream.into_split();
    writer
        .write_all(b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    let trickle = async {
        while writer.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            () = trickle => {}
            readable = reader.readable() => readable.unwrap(),
        }
    })
    .await
    .expect("an answer within 5 s");
    let mut stream = reader.reunite(writer).unwrap();
    let reply = read_response(&mut stream).await;
    assert_eq!(reply.status_line, "HTTP/1.1 408 Request Timeout");
    assert_eq!(
        reply.body,
        r#"{"error":"request timeout","reason":"the request body is too slow"}"#
    );
    assert_eq!(reply.headers["connection"], "close");
    assert!(reply.closed);
    assert_eq!(backend_errors(&gateway).await, 0.0, "the client's doing");
    // The backend's request was given up: its body broke off.
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.seen().is_empty() {
        assert!(Instant::now() < deadline, "the backend never saw the request end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].body.is_none(),
        "the backend took a cut body for a whole one"
    );
}

/// A body that comes slowly but steadily, above the minimum rate, passes however many windows
/// it takes: 500 bytes every 100 ms (five times the rate) for 2 s, two windows.
#[tokio::test]
async fn a_slow_but_steady_upload_above_the_minimum_rate_passes() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start(&backend.url(), MIN_RATE).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let chunk = format!("1f4\r\n{}\r\n", "x".repeat(500));
    for _ in 0..20 {
        stream.write_all(chunk.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let reply = read_response(&mut stream).await;
    assert_eq!(reply.status_line, "HTTP/1.1 200 OK");
    assert_eq!(reply.body, "10000", "the backend got it whole");
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "shorter than two windows: nothing was tested"
    );
}

#[tokio::test]
async fn a_stall_after_the_backend_has_answered_closes_the_connection() {
    // The echo backend answers at once and streams the body back as it comes: the response
    // has started when the client stalls, so the stall can only close the connection.
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[("BODY_IDLE_TIMEOUT_MS", "300")]).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 10\r\n\r\n01234")
        .await
        .unwrap();
    let started = Instant::now();
    let reply = read_response(&mut stream).await;
    assert_eq!(reply.status_line, "HTTP/1.1 200 OK");
    assert!(reply.closed);
    assert!(reply.body.len() < 10, "never the whole body: {:?}", reply.body);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert_eq!(backend_errors(&gateway).await, 0.0);
}

#[tokio::test]
async fn the_backend_timeout_counts_from_the_end_of_the_body() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("BACKEND_TIMEOUT_MS", "300"), ("BODY_IDLE_TIMEOUT_MS", "1000")],
    )
    .await;
    // A steady upload of 8 chunks 100 ms apart: 700 ms in all, more than BACKEND_TIMEOUT_MS.
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    for _ in 0..8 {
        stream.write_all(b"5\r\nhello\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let reply = read_response(&mut stream).await;
    assert!(started.elapsed() > Duration::from_millis(700));
    assert_eq!(reply.status_line, "HTTP/1.1 200 OK");
    assert_eq!(reply.body, "40");
    // After the body, the backend has BACKEND_TIMEOUT_MS to answer, and no more.
    let reply = exchange(
        gateway.addr,
        b"POST /upload HTTP/1.1\r\nHost: gateway.test\r\nX-Delay-Ms: 1000\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await;
    assert_eq!(reply.status_line, "HTTP/1.1 504 Gateway Timeout");
}

#[tokio::test]
async fn a_backend_that_stops_reading_an_upload_is_a_504() {
    // Accepts, never reads: once the socket buffers are full the upload cannot move, and that
    // is the backend holding it up, not the client.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let gateway = Gateway::start_with_admin(
        &format!("http://{backend}"),
        &[("BACKEND_TIMEOUT_MS", "300"), ("BODY_IDLE_TIMEOUT_MS", "10000")],
    )
    .await;
    let stream = TcpStream::connect(gateway.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let size = 256 * 1024 * 1024;
    let upload = tokio::spawn(async move {
        let head = format!("POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: {size}\r\n\r\n");
        writer.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..size / chunk.len() {
            writer.write_all(&chunk).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), reader.read(&mut byte))
                .await
                .expect("an answer within 5 s")
                .unwrap(),
            1
        );
        head.push(byte[0]);
    }
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "HTTP/1.1 504 Gateway Timeout\r\n"
    );
    upload.abort();
    hold.abort();
    assert_eq!(
        backend_errors(&gateway).await,
        1.0,
        "the backend's failure, counted"
    );
}

// --- identity headers ----------------------------------------------------------------------------

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn x_real_ip_is_the_client_address_the_rules_used() {
    let backend = Backend::start().await;
    let spoofed = [("x-real-ip", "1.2.3.4"), ("x-forwarded-for", "198.51.100.1")];
    let gateway = Gateway::start(&backend.url(), &[]).await;
    get_from(gateway.addr, ip("127.0.0.2"), "/", &spoofed).await;
    let seen = backend.last().headers;
    assert_eq!(seen["x-real-ip"], "127.0.0.2");
    assert_eq!(seen.get_all("x-real-ip").iter().count(), 1);

    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("TRUSTED_PROXIES", "127.0.0.2/32"),
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.01"),
        ],
    )
    .await;
    let reply = get_from(gateway.addr, ip("127.0.0.2"), "/", &spoofed).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(backend.last().headers["x-real-ip"], "198.51.100.1");
    // The budget spent was that client's: X-Real-IP is the key the rules used.
    let again = [("x-forwarded-for", "198.51.100.1")];
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.2"), "/", &again).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn forwarded_from_an_untrusted_peer_is_replaced_from_a_trusted_one_appended() {
    let backend = Backend::start().await;
    let spoofed = [("forwarded", "for=1.2.3.4;proto=https;host=admin.internal")];
    let gateway = Gateway::start(&backend.url(), &[("TRUSTED_PROXIES", "127.0.0.3/32")]).await;

    get_from(gateway.addr, ip("127.0.0.2"), "/", &spoofed).await;
    let seen = backend.last().headers;
    assert_eq!(seen.get_all("forwarded").iter().count(), 1);
    assert_eq!(seen["forwarded"], "for=127.0.0.2;proto=http;host=gateway.test");

    get_from(gateway.addr, ip("127.0.0.3"), "/", &spoofed).await;
    assert_eq!(
        backend.last().headers["forwarded"],
        "for=1.2.3.4;proto=https;host=admin.internal, for=127.0.0.3;proto=http;host=gateway.test"
    );
}

// --- the BACKEND_URL path prefix --------------------------------------------------------------

#[tokio::test]
async fn the_backend_path_prefix_cannot_be_escaped() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&format!("{}/public", backend.url()), &[]).await;
    // More spellings than rules::paths_are_forwarded_as_counted tries: each is forwarded
    // inside the prefix or refused, never forwarded with a dot segment.
    for sent in [
        "/%2E%2E/admin",
        "/.%2e/admin",
        "/%2e%2e/%2e%2e/admin",
        "/..%2Fadmin",
        "/%2e%2e%2fadmin",
        "/..%5cadmin",
        "/..;/admin",
        "/x/%2e%2e;/..;/admin",
    ] {
        let request = format!("GET {sent} HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
        let status = raw_status_line(gateway.addr, request.as_bytes()).await;
        match status.as_str() {
            "HTTP/1.1 200 OK" => assert_eq!(backend.last().uri, "/public/admin", "{sent}"),
            "HTTP/1.1 400 Bad Request" => {}
            other => panic!("{sent}: {other}"),
        }
    }
    for seen in backend.seen() {
        assert!(seen.uri.starts_with("/public/"), "{}", seen.uri);
        assert!(!seen.uri.contains(".."), "{}", seen.uri);
    }
}

/// An upgrade the backend does not take (it answers `200`, not `101`) leaves an HTTP/1
/// connection, and a later request on it with both `Content-Length` and `Transfer-Encoding` is
/// refused like any other: following the client's bytes does not stop at the `Upgrade` header.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused_after_an_upgrade_not_taken() {
    let backend = CollectingBackend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(
            b"GET /plain HTTP/1.1\r\nHost: gateway.test\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        )
        .await
        .unwrap();
    let answered = read_response(&mut stream).await;
    assert_eq!(answered.status_line, "HTTP/1.1 200 OK");
    assert!(!answered.closed, "the connection goes on as HTTP/1");
    let both = "POST /upload HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    stream.write_all(both.as_bytes()).await.unwrap();
    let refused = read_response(&mut stream).await;
    assert_eq!(refused.status_line, "HTTP/1.1 400 Bad Request");
    assert!(refused.closed);
    let seen: Vec<String> = backend.seen().into_iter().map(|seen| seen.uri).collect();
    assert_eq!(seen, ["/plain"], "the request with both was not forwarded");
}
