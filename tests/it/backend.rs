//! The gateway's connections to the backend: kept alive and reused whatever the response's
//! framing, a backend that closes them is still answered, idle ones are closed, and the
//! backend's name is resolved.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::support::{Backend, Gateway, get, raw_status_line, request};

/// Whether the hand-written backend keeps a connection open after answering.
#[derive(Clone, Copy)]
enum Connections {
    KeepAlive,
    /// Closed after every response, without saying so (no `Connection: close`), as a backend
    /// whose keep-alive timeout is shorter than the gateway's idle timeout may do.
    CloseAfterEach,
    /// Closed after every response that says `Connection: close`.
    AnnounceClose,
    /// Answers at once, then reads nothing for 1.5 s: a backend that refuses an upload early
    /// and stops reading it. Then reads whatever comes, for 5 s at most.
    AnswerEarly,
}

/// A backend written over raw TCP, to count the connections the gateway opens and closes.
/// `/empty` answers 204, `/chunked` a chunked body, anything else `ok` with a length.
struct RawBackend {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed_by_gateway: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RawBackend {
    async fn start(connections: Connections) -> RawBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed_by_gateway = Arc::new(AtomicUsize::new(0));
        let (counting, closing) = (accepted.clone(), closed_by_gateway.clone());
        let task = tokio::spawn(async move {
            let mut open = JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counting.fetch_add(1, Ordering::SeqCst);
                let closing = closing.clone();
                open.spawn(async move {
                    if serve(stream, connections).await {
                        closing.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        RawBackend {
            addr,
            accepted,
            closed_by_gateway,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn closed_by_gateway(&self) -> usize {
        self.closed_by_gateway.load(Ordering::SeqCst)
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answer requests (heads only; the tests send no bodies, but for `AnswerEarly`) until the
/// gateway closes the connection (true) or the backend does.
async fn serve(mut stream: TcpStream, connections: Connections) -> bool {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        buffer.drain(..head_end);
        let mut line = head.split(' ');
        let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
        let response: &[u8] = match (method, path) {
            _ if matches!(connections, Connections::AnnounceClose) => {
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
            }
            (_, "/empty") => b"HTTP/1.1 204 No Content\r\n\r\n",
            ("HEAD", _) => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n",
            (_, "/chunked") => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            (_, "/trailers") => {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-t\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n"
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        };
        if stream.write_all(response).await.is_err() {
            return false;
        }
        match connections {
            Connections::KeepAlive => {}
            Connections::CloseAfterEach | Connections::AnnounceClose => return false,
            Connections::AnswerEarly => {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let drained = tokio::time::timeout(Duration::from_secs(5), async {
                    let mut chunk = vec![0u8; 1 << 16];
                    while let Ok(n) = stream.read(&mut chunk).await
                        && n > 0
                    {}
                });
                return drained.await.is_ok();
            }
        }
    }
}

/// Enough budget that no request here is limited.
const UNLIMITED: [(&str, &str); 1] = [("MAX_TOKENS", "1000")];

async fn send(gateway: &Gateway, method: Method, path: &str) -> (StatusCode, Bytes) {
    let reply = request(
        gateway.addr,
        [127, 0, 0, 1].into(),
        method,
        path,
        &[],
        Bytes::new(),
    )
    .await;
    (reply.status, reply.body)
}

#[tokio::test]
async fn one_backend_connection_carries_every_kind_of_response_in_turn() {
    let backend = RawBackend::start(Connections::KeepAlive).await;
    let gateway = Gateway::start_with_admin(&backend.url(), &UNLIMITED).await;
    for _ in 0..10 {
        assert_eq!(
            send(&gateway, Method::GET, "/").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            send(&gateway, Method::GET, "/empty").await,
            (StatusCode::NO_CONTENT, "".into())
        );
        assert_eq!(
            send(&gateway, Method::GET, "/chunked").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            send(&gateway, Method::GET, "/trailers").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            send(&gateway, Method::HEAD, "/").await,
            (StatusCode::OK, "".into())
        );
    }
    assert_eq!(
        backend.accepted(),
        1,
        "every request after the first reused its connection"
    );
    let metrics = gateway.admin_get("/metrics").await;
    assert!(
        metrics.text().contains("tollgate_backend_connections_total 1\n"),
        "{}",
        metrics.text()
    );
}

#[tokio::test]
async fn a_backend_that_closes_every_connection_after_answering_is_still_answered() {
    let backend = RawBackend::start(Connections::CloseAfterEach).await;
    let gateway = Gateway::start(&backend.url(), &UNLIMITED).await;
    for i in 0..30 {
        let (status, body) = send(&gateway, Method::GET, "/").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]), "request {i}");
    }
    assert_eq!(backend.accepted(), 30);
}

#[tokio::test]
async fn a_backend_that_answers_connection_close_gets_a_new_connection_each_time() {
    let backend = RawBackend::start(Connections::AnnounceClose).await;
    let gateway = Gateway::start(&backend.url(), &UNLIMITED).await;
    for i in 0..10 {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
        assert_eq!(
            reply.header("connection"),
            None,
            "the backend's close is its own, not the client's"
        );
    }
    assert_eq!(backend.accepted(), 10);
}

/// On several worker threads, a connection may be given back a moment after its response
/// ends (hyper's dispatcher runs on the other thread): the pool waits for it rather than
/// losing it, so connections stay about as many as requests in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_share_a_few_backend_connections() {
    let backend = RawBackend::start(Connections::KeepAlive).await;
    let gateway = Gateway::start(&backend.url(), &UNLIMITED).await;
    let (clients, requests) = (8, 50);
    let mut tasks = JoinSet::new();
    for _ in 0..clients {
        let to = gateway.addr;
        tasks.spawn(async move {
            for _ in 0..requests {
                assert_eq!(get(to, "/").await.status, StatusCode::OK);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let opened = backend.accepted();
    println!(
        "{opened} backend connections for {} requests from {clients} clients",
        clients * requests
    );
    assert!(
        opened <= 2 * clients,
        "{opened} backend connections for {clients} clients in flight"
    );
}

/// A backend that answers an upload early and then stops reading it leaves hyper's write to
/// it blocked, and the client's body unread, so neither's timeout runs: the pool gives the
/// exchange `BACKEND_TIMEOUT_MS` to finish and then closes the connection.
#[tokio::test]
async fn a_backend_that_answers_early_and_stops_reading_is_closed_after_the_backend_timeout() {
    let backend = RawBackend::start(Connections::AnswerEarly).await;
    let vars = [("BACKEND_TIMEOUT_MS", "300"), ("BODY_IDLE_TIMEOUT_MS", "60000")];
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: gateway.test\r\ncontent-length: 100000000\r\n\r\n")
        .await
        .unwrap();
    let (mut reader, mut writer) = client.into_split();
    // 8 MiB of the body, more than the sockets between here and the backend hold; then
    // nothing more, with the connection left open.
    let uploading = tokio::spawn(async move {
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..128 {
            if writer.write_all(&chunk).await.is_err() {
                break;
            }
        }
        writer
    });
    let mut head = [0u8; 12];
    reader.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.closed_by_gateway() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled backend connection was still open after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    uploading.abort();
}

#[tokio::test]
async fn an_idle_backend_connection_is_closed_after_the_idle_timeout() {
    let backend = RawBackend::start(Connections::KeepAlive).await;
    let gateway = Gateway::start(&backend.url(), &[("BACKEND_IDLE_TIMEOUT_MS", "200")]).await;
    assert_eq!(send(&gateway, Method::GET, "/").await.0, StatusCode::OK);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.closed_by_gateway() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle connection was still open 10 s after a 200 ms idle timeout"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(send(&gateway, Method::GET, "/").await.0, StatusCode::OK);
    assert_eq!(backend.accepted(), 2, "the closed connection was not used again");
}

/// A backend whose accept queue is full drops the gateway's SYN: not connected within
/// `BACKEND_TIMEOUT_MS` is a timeout (504), as not answering within it is.
#[tokio::test]
async fn a_backend_not_connected_within_the_backend_timeout_is_a_504() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    // Connections it never accepts, until its queue is full and a SYN goes unanswered.
    let mut queued = Vec::new();
    for _ in 0..4 {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => queued.push(stream),
            _ => break,
        }
    }
    let gateway =
        Gateway::start_with_admin(&format!("http://{addr}"), &[("BACKEND_TIMEOUT_MS", "300")]).await;
    let reply = get(gateway.addr, "/").await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.text());
    let metrics = gateway.admin_get("/metrics").await;
    assert!(
        metrics
            .text()
            .contains(r#"tollgate_backend_errors_total{rule="general",cause="timeout"} 1"#),
        "{}",
        metrics.text()
    );
    drop((listener, queued));
}

#[tokio::test]
async fn a_request_without_a_host_gets_the_backends() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let status = raw_status_line(gateway.addr, b"GET /no-host HTTP/1.0\r\n\r\n").await;
    assert!(status.starts_with("HTTP/1.0 200"), "{status}");
    let seen = backend.last();
    assert_eq!(seen.uri, "/no-host");
    assert_eq!(seen.headers["host"], backend.addr.to_string().as_str());
}

#[tokio::test]
async fn a_backend_named_by_host_name_is_resolved() {
    let backend = Backend::start().await;
    let by_name = format!("http://localhost:{}", backend.addr.port());
    let gateway = Gateway::start(&by_name, &[]).await;
    assert_eq!(get(gateway.addr, "/by-name").await.status, StatusCode::OK);
    assert_eq!(backend.last().uri, "/by-name");
    assert_eq!(
        backend.last().headers["host"],
        "gateway.test",
        "the client's Host is kept"
    );
}

#[tokio::test]
async fn a_backend_name_that_does_not_resolve_is_a_502_counted_as_dns() {
    // `.invalid` never resolves (RFC 2606).
    let gateway = Gateway::start_with_admin("http://tollgate-test.invalid", &[]).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::BAD_GATEWAY);
    let metrics = gateway.admin_get("/metrics").await;
    assert!(
        metrics
            .text()
            .contains(r#"tollgate_backend_errors_total{rule="general",cause="dns"} 1"#),
        "{}",
        metrics.text()
    );
}
