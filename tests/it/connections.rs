//! Client connections: silent and idle ones are closed (`HEADER_READ_TIMEOUT_MS` from accept,
//! `IDLE_TIMEOUT_MS` with nothing in flight), busy ones never are unless their socket takes
//! nothing (`SEND_TIMEOUT_MS`), `MAX_CONNECTIONS` refuses
//! what is past it at once, `MAX_CONNECTIONS_PER_CLIENT` keeps one address from taking every
//! place, and `MAX_UPGRADES_PER_CLIENT` bounds one client's tunnels.
//!
//! Every wait is bounded; nothing asserts how fast, only what happens.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::support::{Backend, Gateway, get};

/// Short clocks, so the tests see them run out.
const QUICK: &[(&str, &str)] = &[("HEADER_READ_TIMEOUT_MS", "300"), ("IDLE_TIMEOUT_MS", "300")];

/// How long any one thing may take before the test fails: far longer than any timeout set.
const BOUND: Duration = Duration::from_secs(5);

/// Read (and discard) until the gateway closes the connection: true when it did (end of
/// stream or reset) within [`BOUND`].
async fn closed_by_gateway(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(BOUND, async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .is_ok()
}

/// An HTTP/1.1 connection from a hyper client, its driver running in a task that ends when
/// the connection does.
async fn http1_connection(addr: SocketAddr) -> (http1::SendRequest<Empty<Bytes>>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    (sender, tokio::spawn(async move { drop(connection.await) }))
}

/// The same over HTTP/2 (prior knowledge).
async fn http2_connection(addr: SocketAddr) -> (http2::SendRequest<Empty<Bytes>>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    (sender, tokio::spawn(async move { drop(connection.await) }))
}

fn get_request(path: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://gateway.test{path}"))
        .header("host", "gateway.test")
        .body(Empty::new())
        .unwrap()
}

/// `GET path` on an HTTP/1.1 connection, body read: the status.
async fn get_on(sender: &mut http1::SendRequest<Empty<Bytes>>, path: &str) -> StatusCode {
    let response = sender.send_request(get_request(path)).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// `GET /` on a fresh connection, `None` if the connection is refused or closed.
async fn try_get(addr: SocketAddr) -> Option<StatusCode> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    let response = sender.send_request(get_request("/")).await.ok()?;
    Some(response.status())
}

/// Poll `attempt` until it gives `Some`, for at most [`BOUND`].
async fn eventually<T, F: Future<Output = Option<T>>>(mut attempt: impl FnMut() -> F, what: &str) -> T {
    tokio::time::timeout(BOUND, async {
        loop {
            if let Some(value) = attempt().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    let mut silent = TcpStream::connect(gateway.addr).await.unwrap();
    assert!(
        closed_by_gateway(&mut silent).await,
        "a silent connection stays open"
    );
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_connection_stalled_inside_the_http2_preface_is_closed() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    let mut stalled = TcpStream::connect(gateway.addr).await.unwrap();
    // 16 of the preface's 24 bytes.
    stalled.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(
        closed_by_gateway(&mut stalled).await,
        "a half preface holds the connection"
    );
}

#[tokio::test]
async fn an_http2_connection_that_never_sends_a_request_is_closed() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    let mut quiet = TcpStream::connect(gateway.addr).await.unwrap();
    // The whole preface and an empty SETTINGS frame, then nothing.
    quiet
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_by_gateway(&mut quiet).await,
        "an HTTP/2 connection with no request stays open"
    );
}

#[tokio::test]
async fn an_idle_http1_keep_alive_connection_is_closed_after_its_requests() {
    let backend = Backend::start().await;
    // A long header clock: the idle clock alone closes the connection.
    let gateway = Gateway::start(
        &backend.url(),
        &[("HEADER_READ_TIMEOUT_MS", "60000"), ("IDLE_TIMEOUT_MS", "300")],
    )
    .await;
    let (mut sender, connection) = http1_connection(gateway.addr).await;
    // Kept alive between requests...
    assert_eq!(get_on(&mut sender, "/one").await, StatusCode::OK);
    assert_eq!(get_on(&mut sender, "/two").await, StatusCode::OK);
    // ...and closed once idle, though the client would keep it.
    assert!(
        tokio::time::timeout(BOUND, connection).await.is_ok(),
        "an idle keep-alive connection stays open"
    );
    drop(sender);
}

#[tokio::test]
async fn an_http1_keep_alive_connection_may_idle_longer_than_the_header_read_timeout() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("HEADER_READ_TIMEOUT_MS", "300"), ("IDLE_TIMEOUT_MS", "60000")],
    )
    .await;
    let (mut sender, connection) = http1_connection(gateway.addr).await;
    assert_eq!(get_on(&mut sender, "/one").await, StatusCode::OK);
    // Idle for several header read timeouts: it is the idle timeout that applies.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!connection.is_finished(), "closed before IDLE_TIMEOUT_MS");
    assert_eq!(get_on(&mut sender, "/two").await, StatusCode::OK);
}

#[tokio::test]
async fn a_later_http1_request_head_sent_slowly_is_cut() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("HEADER_READ_TIMEOUT_MS", "300"), ("IDLE_TIMEOUT_MS", "60000")],
    )
    .await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"GET /one HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    assert!(response.starts_with(b"HTTP/1.1 200"));
    // The next head, a few bytes at a time, never finished: slowloris after a real request.
    let trickle = async {
        for chunk in [
            &b"GET /two HT"[..],
            b"TP/1.1\r\n",
            b"Host: ga",
            b"teway.test\r\n",
            b"X-A: 1\r\n",
        ] {
            if stream.write_all(chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), trickle).await;
    assert!(
        closed_by_gateway(&mut stream).await,
        "a trickled head holds the connection"
    );
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_its_request() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    let (mut sender, connection) = http2_connection(gateway.addr).await;
    let response = sender.send_request(get_request("/h2")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    // GOAWAY (and close): the client's connection ends though it still holds a sender.
    assert!(
        tokio::time::timeout(BOUND, connection).await.is_ok(),
        "an idle HTTP/2 connection stays open"
    );
    drop(sender);
}

#[tokio::test]
async fn a_slow_request_in_flight_is_not_cut() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    // The backend takes many idle timeouts (and more than the header read timeout, and the
    // grace a closing connection gets).
    assert_eq!(get(gateway.addr, "/slow/2000").await.status, StatusCode::OK);
    let (mut sender, _connection) = http2_connection(gateway.addr).await;
    let response = sender.send_request(get_request("/slow/2000")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_streamed_response_longer_than_the_idle_timeout_is_not_cut() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), QUICK).await;
    let stream = TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    // The backend echoes the request body as it arrives: a response that streams for as long
    // as the client keeps sending, here many idle timeouts.
    let (chunks, receiver) = tokio::sync::mpsc::channel::<Bytes>(1);
    let body = StreamBody::new(futures_util::stream::unfold(
        receiver,
        |mut receiver| async move {
            let chunk = receiver.recv().await?;
            Some((Ok::<_, std::convert::Infallible>(Frame::data(chunk)), receiver))
        },
    ));
    let request = Request::post("/echo")
        .header("host", "gateway.test")
        .body(body)
        .unwrap();
    chunks.send(Bytes::from_static(b"tick 0;")).await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut response = response.into_body();
    let mut echoed = String::new();
    for tick in 0..=20 {
        if tick > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            chunks.send(Bytes::from(format!("tick {tick};"))).await.unwrap();
        }
        while !echoed.ends_with(&format!("tick {tick};")) {
            let frame = tokio::time::timeout(BOUND, response.frame())
                .await
                .expect("the echo stalled")
                .expect("the response ended early")
                .expect("the response was cut");
            let data = frame.into_data().unwrap_or_default();
            echoed.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
    drop(chunks);
    let rest = response.collect().await.expect("the response was cut").to_bytes();
    assert!(rest.is_empty());
    let expected: String = (0..=20).map(|tick| format!("tick {tick};")).collect();
    assert_eq!(echoed, expected);
}

/// A connection to the gateway with a small receive buffer (so a response that is not read
/// fills it soon), that has sent `GET path`.
async fn asked_for(addr: SocketAddr, path: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Read until the connection ends or [`BOUND`] passes with nothing read: the bytes read, and
/// whether it ended. `pause` between reads makes a slow reader.
async fn read_all(stream: &mut TcpStream, pause: Duration) -> (usize, bool) {
    let mut buffer = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match tokio::time::timeout(BOUND, stream.read(&mut buffer)).await {
            Err(_) => return (total, false),
            Ok(Ok(0) | Err(_)) => return (total, true),
            Ok(Ok(n)) => total += n,
        }
        tokio::time::sleep(pause).await;
    }
}

/// Slow read: a client that asks for a large response and reads none of it is dropped after
/// `SEND_TIMEOUT_MS`, long before the idle timeout would apply (it never does while a request
/// is in flight), and its place under `MAX_CONNECTIONS` comes back.
#[tokio::test]
async fn a_client_that_reads_none_of_its_response_is_dropped_after_the_send_timeout() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[("SEND_TIMEOUT_MS", "1000"), ("MAX_CONNECTIONS", "1")],
    )
    .await;
    const SIZE: usize = 256 * 1024 * 1024;
    let mut stalled = asked_for(gateway.addr, &format!("/bytes/{SIZE}")).await;
    // Its place is taken while it holds it (a second connection is refused at once)...
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(try_get(gateway.addr).await, None, "MAX_CONNECTIONS=1 is held");
    // ...and given back once the gateway has dropped it.
    let status = eventually(|| try_get(gateway.addr), "the stalled connection's place").await;
    assert_eq!(status, StatusCode::OK);
    let (read, ended) = read_all(&mut stalled, Duration::ZERO).await;
    assert!(ended, "the connection was not ended");
    assert!(read < SIZE, "the whole response arrived: {read} bytes");
    let metrics = gateway.admin_get("/metrics").await;
    let metrics = metrics.text();
    assert!(
        metrics.contains("tollgate_client_connections_unread_total 1\n"),
        "{metrics}"
    );
}

/// A client that reads its response steadily but slower than the gateway could send it is
/// not cut, however long the response takes: only a socket that takes nothing at all for
/// `SEND_TIMEOUT_MS` is. (The kernel lets a write through again once about a third of the
/// socket's send buffer has drained, over 1 MiB on loopback, so the reader here takes 6 MB/s,
/// a fifth of a timeout per MiB; a much slower one on loopback could go a whole timeout
/// without a write getting in.)
#[tokio::test]
async fn a_client_that_reads_its_response_steadily_is_not_cut() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("SEND_TIMEOUT_MS", "1000")]).await;
    const SIZE: usize = 16 * 1024 * 1024;
    let mut reader = asked_for(gateway.addr, &format!("/bytes/{SIZE}")).await;
    let started = Instant::now();
    // At most 64 KiB (its receive buffer) every 10 ms: about 2.7 s for the whole.
    let mut buffer = vec![0u8; 64 * 1024];
    let mut response = Vec::new();
    loop {
        let n = tokio::time::timeout(BOUND, reader.read(&mut buffer))
            .await
            .expect("the response stalled")
            .unwrap();
        assert!(n > 0, "cut after {} bytes", response.len());
        response.extend_from_slice(&buffer[..n]);
        let head = response.windows(4).position(|w| w == b"\r\n\r\n");
        if head.is_some_and(|at| response.len() - at - 4 == SIZE) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        started.elapsed() > Duration::from_millis(1000),
        "the response took less than one send timeout: nothing was tested"
    );
}

#[tokio::test]
async fn past_max_connections_a_new_connection_is_closed_at_once() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_CONNECTIONS", "3")]).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let (mut sender, connection) = http1_connection(gateway.addr).await;
        // Served, so accepted and counted.
        assert_eq!(get_on(&mut sender, "/").await, StatusCode::OK);
        open.push((sender, connection));
    }
    let mut fourth = TcpStream::connect(gateway.addr).await.unwrap();
    // A request is sent, but no answer comes: the connection is closed.
    let _ = fourth
        .write_all(b"GET / HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        .await;
    assert!(
        closed_by_gateway(&mut fourth).await,
        "the connection past the cap was kept"
    );
    for (sender, _) in &mut open {
        assert_eq!(get_on(sender, "/").await, StatusCode::OK, "the three stay open");
    }
    // Closing one makes room for one.
    let (sender, connection) = open.pop().unwrap();
    drop(sender);
    connection.abort();
    let status = eventually(|| try_get(gateway.addr), "a slot to free up").await;
    assert_eq!(status, StatusCode::OK);
    drop(open);
}

/// An HTTP/1.1 connection from `from` that has been served once (so it was accepted and
/// counted), or `None` when the gateway closed it instead.
async fn served_from(
    addr: SocketAddr,
    from: IpAddr,
) -> Option<(http1::SendRequest<Empty<Bytes>>, JoinHandle<()>)> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.ok()?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    let connection = tokio::spawn(async move { drop(connection.await) });
    let response = tokio::time::timeout(BOUND, sender.send_request(get_request("/")))
        .await
        .expect("neither served nor closed")
        .ok()?;
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.ok()?;
    Some((sender, connection))
}

/// The value of the metric line starting with `series`.
async fn metric(gateway: &Gateway, series: &str) -> String {
    let metrics = gateway.admin_get("/metrics").await;
    let text = metrics.text();
    text.lines()
        .find_map(|line| line.strip_prefix(series))
        .unwrap_or_else(|| panic!("no {series} in {text}"))
        .trim()
        .to_owned()
}

const REFUSED_PER_CLIENT: &str =
    "tollgate_client_connections_refused_total{limit=\"max_connections_per_client\"}";

/// With `MAX_CONNECTIONS_PER_CLIENT` unset, one address may take three quarters of the places
/// and no more: the rest stay for other clients.
#[tokio::test]
async fn one_address_cannot_take_every_place_while_another_is_served() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(&backend.url(), &[("MAX_CONNECTIONS", "4")]).await;
    let greedy: IpAddr = [127, 0, 0, 1].into();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(served_from(gateway.addr, greedy).await.expect("three of four"));
    }
    assert!(
        served_from(gateway.addr, greedy).await.is_none(),
        "one address took the last place"
    );
    assert_eq!(metric(&gateway, REFUSED_PER_CLIENT).await, "1");
    // Another address gets the place kept for others...
    let other = served_from(gateway.addr, [127, 0, 0, 2].into())
        .await
        .expect("another client is served");
    // ...and the connections held go on being served.
    for (sender, _) in &mut held {
        assert_eq!(get_on(sender, "/").await, StatusCode::OK);
    }
    // One closed: its place comes back to its address.
    let (sender, connection) = held.pop().unwrap();
    drop(sender);
    connection.abort();
    let again = eventually(|| served_from(gateway.addr, greedy), "a place to come back").await;
    drop((held, other, again));
}

/// A load balancer in `TRUSTED_PROXIES` carries every client: it is not capped per client.
#[tokio::test]
async fn a_trusted_proxy_is_not_capped_per_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_CONNECTIONS", "8"),
            ("MAX_CONNECTIONS_PER_CLIENT", "2"),
            ("TRUSTED_PROXIES", "127.0.0.3"),
        ],
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(
            served_from(gateway.addr, [127, 0, 0, 3].into())
                .await
                .expect("a trusted proxy's connection"),
        );
    }
    assert_eq!(metric(&gateway, REFUSED_PER_CLIENT).await, "0");
    // MAX_CONNECTIONS still applies to it.
    assert!(served_from(gateway.addr, [127, 0, 0, 3].into()).await.is_none());
    assert_eq!(
        metric(
            &gateway,
            "tollgate_client_connections_refused_total{limit=\"max_connections\"}"
        )
        .await,
        "1"
    );
    drop(held);
}

/// An upgraded connection keeps its place under `MAX_CONNECTIONS_PER_CLIENT` until the tunnel
/// closes, as under `MAX_CONNECTIONS`.
#[tokio::test]
async fn a_tunnel_keeps_its_place_under_the_per_client_cap() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("MAX_CONNECTIONS", "8"), ("MAX_CONNECTIONS_PER_CLIENT", "1")],
    )
    .await;
    let client: IpAddr = [127, 0, 0, 4].into();
    let tunnel = open_tunnel(gateway.addr, client).await.expect("a tunnel");
    assert!(
        served_from(gateway.addr, client).await.is_none(),
        "a tunnel's place was given away"
    );
    drop(tunnel);
    let again = eventually(|| served_from(gateway.addr, client), "the tunnel's place").await;
    drop(again);
}

/// Open a tunnel to the backend's `/ws` echo from `from`: the stream after a `101` that echoes,
/// or the response's status line and body.
async fn open_tunnel(addr: SocketAddr, from: IpAddr) -> Result<TcpStream, (String, String)> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let head = crate::support::read_head(&mut stream).await;
    let status_line = head.lines().next().unwrap_or_default().to_owned();
    if status_line.starts_with("http/1.1 101") {
        stream.write_all(b"ping").await.unwrap();
        let mut echoed = [0u8; 4];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"ping");
        return Ok(stream);
    }
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    Err((status_line, String::from_utf8(body).unwrap()))
}

#[tokio::test]
async fn one_client_holds_at_most_max_upgrades_per_client_tunnels() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_UPGRADES_PER_CLIENT", "2")]).await;
    let client: IpAddr = [127, 0, 0, 1].into();
    let first = open_tunnel(gateway.addr, client).await.expect("first tunnel");
    let mut second = open_tunnel(gateway.addr, client).await.expect("second tunnel");
    let (status, body) = open_tunnel(gateway.addr, client)
        .await
        .expect_err("a third tunnel from the same client");
    assert_eq!(status, "http/1.1 429 too many requests");
    assert_eq!(body, r#"{"error":"too many upgraded connections","limit":2}"#);
    // Another client is counted apart.
    let other = open_tunnel(gateway.addr, [127, 0, 0, 2].into())
        .await
        .expect("another client's tunnel");
    // Closing a tunnel gives its slot back.
    drop(first);
    let third = eventually(
        || async { open_tunnel(gateway.addr, client).await.ok() },
        "the closed tunnel's slot",
    )
    .await;
    second.write_all(b"pong").await.unwrap();
    let mut echoed = [0u8; 4];
    second.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"pong", "the tunnels still open carry on");
    drop((other, third));
}

#[tokio::test]
async fn http2_streams_in_flight_are_capped_at_max_connections_across_connections() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_CONNECTIONS", "3")]).await;
    let (h2, h2_connection) = http2_connection(gateway.addr).await;
    // Five slow requests at once on one connection: three places, so two are refused at once.
    let requests: Vec<_> = (0..5)
        .map(|_| {
            let mut h2 = h2.clone();
            tokio::spawn(async move {
                let response = h2.send_request(get_request("/slow/1500")).await.unwrap();
                let status = response.status();
                let retry_after = response.headers().get("retry-after").cloned();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, retry_after, body)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    let served = answers
        .iter()
        .filter(|(status, ..)| *status == StatusCode::OK)
        .count();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, ..)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert_eq!((served, refused.len()), (3, 2), "{answers:?}");
    for (_, retry_after, body) in refused {
        assert_eq!(retry_after.as_ref().unwrap(), "1");
        assert_eq!(
            body.as_ref(),
            br#"{"error":"overloaded","reason":"too many requests in flight","retry_after":1}"#
        );
    }
    // The places come back when the responses end: a request on a new connection is served.
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    drop(h2);
    h2_connection.abort();
}

#[tokio::test]
async fn a_quiet_tunnel_is_closed_after_the_upgrade_idle_timeout_and_frees_its_place() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("UPGRADE_IDLE_TIMEOUT_MS", "1000"),
            ("MAX_UPGRADES_PER_CLIENT", "1"),
        ],
    )
    .await;
    let client: IpAddr = [127, 0, 0, 1].into();
    let mut tunnel = open_tunnel(gateway.addr, client).await.expect("a tunnel");
    // Bytes every 200 ms keep it open well past the timeout (with 800 ms to spare for a slow
    // machine).
    let mut echoed = [0u8; 4];
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        tunnel.write_all(b"ping").await.unwrap();
        tunnel.read_exact(&mut echoed).await.unwrap();
    }
    // Then quiet: the gateway closes it, and the client's one tunnel slot comes back.
    let quiet = Instant::now();
    assert!(closed_by_gateway(&mut tunnel).await, "a quiet tunnel stays open");
    // Not before it was quiet for the timeout (less the echo's trip back to us).
    assert!(
        quiet.elapsed() >= Duration::from_millis(900),
        "{:?}",
        quiet.elapsed()
    );
    let again = eventually(
        || async { open_tunnel(gateway.addr, client).await.ok() },
        "the closed tunnel's slot",
    )
    .await;
    drop(again);
}

#[tokio::test]
async fn an_upgraded_connection_keeps_its_place_under_max_connections() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_CONNECTIONS", "1")]).await;
    let tunnel = open_tunnel(gateway.addr, [127, 0, 0, 1].into())
        .await
        .expect("a tunnel");
    // The HTTP connection has become a tunnel; its socket still counts.
    let mut second = TcpStream::connect(gateway.addr).await.unwrap();
    assert!(
        closed_by_gateway(&mut second).await,
        "a tunnel's place was given away"
    );
    drop(tunnel);
    let status = eventually(|| try_get(gateway.addr), "the tunnel's slot").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn idle_connections_do_not_hold_up_the_drain() {
    let backend = Backend::start().await;
    // A drain that waited for idle connections would take the whole shutdown timeout.
    let gateway = Gateway::start(&backend.url(), &[("SHUTDOWN_TIMEOUT_MS", "60000")]).await;
    let (mut h1, h1_connection) = http1_connection(gateway.addr).await;
    assert_eq!(get_on(&mut h1, "/").await, StatusCode::OK);
    let (mut h2, h2_connection) = http2_connection(gateway.addr).await;
    let response = h2.send_request(get_request("/")).await.unwrap();
    response.into_body().collect().await.unwrap();
    let mut silent = TcpStream::connect(gateway.addr).await.unwrap();
    assert!(
        tokio::time::timeout(BOUND, gateway.stop()).await.is_ok(),
        "the drain waited for idle connections"
    );
    assert!(tokio::time::timeout(BOUND, h1_connection).await.is_ok());
    assert!(tokio::time::timeout(BOUND, h2_connection).await.is_ok());
    assert!(closed_by_gateway(&mut silent).await);
    drop((h1, h2));
}
