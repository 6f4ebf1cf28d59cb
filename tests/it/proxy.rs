//! The gateway in memory mode, end to end: limits, identity, rules and forwarding.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{Backend, Gateway, get, get_from, raw_status_line, request};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

#[tokio::test]
async fn a_burst_passes_then_gets_429_with_headers() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "3"), ("REFILL_RATE", "0.01")]).await;
    for remaining in [2, 1, 0] {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.number("x-ratelimit-limit"),
            3,
            "the backend's own value is replaced"
        );
        assert_eq!(reply.headers.get_all("x-ratelimit-limit").iter().count(), 1);
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining);
        // Full again (3 - remaining) * 100 s from now.
        let reset = reply.number("x-ratelimit-reset");
        let expected = unix_now() + (3 - remaining) * 100;
        assert!(
            reset.abs_diff(expected) <= 1,
            "reset {reset}, expected about {expected}"
        );
    }
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 100);
    assert_eq!(denied.number("x-ratelimit-remaining"), 0);
    assert_eq!(denied.number("x-ratelimit-limit"), 3);
    assert_eq!(denied.header("content-type"), Some("application/json"));
    assert_eq!(
        denied.text(),
        r#"{"error":"rate limit exceeded","retry_after":100}"#
    );
    assert_eq!(backend.seen().len(), 3, "denied requests never reach the backend");
}

#[tokio::test]
async fn tokens_refill_as_time_passes() {
    let backend = Backend::start().await;
    // One token every 500 ms.
    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "1"), ("REFILL_RATE", "2")]).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn sliding_window_counts_requests_per_window() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("ALGORITHM", "sliding_window"),
            ("LIMIT", "4"),
            ("WINDOW_SIZE", "3600"),
        ],
    )
    .await;
    for remaining in [3, 2, 1, 0] {
        let reply = get(gateway.addr, "/").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.number("x-ratelimit-limit"), 4);
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining);
    }
    let denied = get(gateway.addr, "/").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    // Windows are aligned to the Unix epoch (as in Redis). The next window must start, and
    // then the four requests, weighted by the overlap, must shrink to three: a quarter in.
    let now = unix_now();
    let allowed_at = (now / 3600 + 1) * 3600 + 900;
    assert!(
        denied.number("retry-after").abs_diff(allowed_at - now) <= 1,
        "retry after {}, expected about {}",
        denied.number("retry-after"),
        allowed_at - now
    );
}

#[tokio::test]
async fn auth_paths_share_one_budget_apart_from_the_general_one() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("AUTH_MAX_TOKENS", "2"), ("MAX_TOKENS", "10")]).await;
    assert_eq!(get(gateway.addr, "/login").await.status, StatusCode::OK);
    let reply = get(gateway.addr, "/signup").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.number("x-ratelimit-limit"), 2);
    assert_eq!(reply.number("x-ratelimit-remaining"), 0);
    // Every spelling of an auth path is the auth budget, which is now spent.
    for path in [
        "/login?user=a",
        "/Login",
        "/login/",
        "//login",
        "/a/../reset-password",
        "/sign%75p",
    ] {
        let reply = get(gateway.addr, path).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
    // The general budget is untouched.
    let reply = get(gateway.addr, "/login-help").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.number("x-ratelimit-limit"), 10);
    assert_eq!(reply.number("x-ratelimit-remaining"), 9);
}

#[tokio::test]
async fn clients_are_told_apart_by_peer_address() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "1"), ("REFILL_RATE", "0.01")]).await;
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.2"), "/", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.2"), "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.3"), "/", &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_changes_nothing() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("MAX_TOKENS", "1"), ("REFILL_RATE", "0.01")]).await;
    let peer = ip("127.0.0.2");
    let first = get_from(gateway.addr, peer, "/", &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        backend.last().headers["x-forwarded-for"],
        "198.51.100.1, 127.0.0.2"
    );
    let spoofed = get_from(gateway.addr, peer, "/", &[("x-forwarded-for", "198.51.100.2")]).await;
    assert_eq!(
        spoofed.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a header must not buy a new budget"
    );
}

#[tokio::test]
async fn forwarded_for_from_a_trusted_proxy_is_the_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.01"),
            ("TRUSTED_PROXIES", "127.0.0.2/32"),
        ],
    )
    .await;
    let proxy = ip("127.0.0.2");
    let via = |client: &'static str| [("x-forwarded-for", client)];
    assert_eq!(
        get_from(gateway.addr, proxy, "/", &via("198.51.100.1"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(gateway.addr, proxy, "/", &via("198.51.100.2"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(gateway.addr, proxy, "/", &via("198.51.100.1"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The client forged the leftmost entry; the proxy appended the real one.
    assert_eq!(
        get_from(gateway.addr, proxy, "/", &via("198.51.100.2, 198.51.100.3"))
            .await
            .status,
        StatusCode::OK
    );
    // An untrusted peer sending the same header is still only itself.
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.3"), "/", &via("198.51.100.4"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.3"), "/", &via("198.51.100.5"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// From a trusted proxy, an `X-Forwarded-For` element that is not an address, where the
/// client's address should be, is refused (`400`), never read as the proxy itself (which
/// operators commonly exempt, as here); one left of the client's address (the client's own
/// bytes, the proxy's appended after them) changes nothing. An earlier version gave up on a
/// line holding a byte that is not text and took the proxy for the client: exempt.
#[tokio::test]
async fn a_malformed_forwarded_for_element_never_makes_the_trusted_proxy_the_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.001"),
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("EXEMPT", "127.0.0.1"),
        ],
    )
    .await;
    // From 127.0.0.1, the trusted (and exempt) proxy, with these X-Forwarded-For lines.
    let via = |lines: &[&[u8]]| {
        let mut request = b"GET /api HTTP/1.1\r\nHost: gateway.test\r\n".to_vec();
        for line in lines {
            request.extend_from_slice(b"X-Forwarded-For: ");
            request.extend_from_slice(line);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"Connection: close\r\n\r\n");
        request
    };
    let addr = gateway.addr;
    let status = |lines: &[&[u8]]| {
        let request = via(lines);
        async move { raw_status_line(addr, &request).await }
    };
    assert_eq!(status(&[b"203.0.113.7"]).await, "HTTP/1.1 200 OK");
    let limited = "HTTP/1.1 429 Too Many Requests";
    assert_eq!(status(&[b"203.0.113.7"]).await, limited);
    // The client's own header, the proxy's address for it appended: still the client.
    let appended: [&[&[u8]]; 5] = [
        &[b"\xff, 203.0.113.7"],
        &[b"bogus, 203.0.113.7"],
        &[b"unknown,203.0.113.7"],
        &[b"\xff", b"203.0.113.7"],
        &[b"\x80\xfe 1.2.3.4, , 203.0.113.7, 127.0.0.1"],
    ];
    for lines in appended {
        for _ in 0..3 {
            assert_eq!(status(lines).await, limited, "{lines:?}");
        }
    }
    // Nothing but garbage where the client should be: refused, not the proxy's exemption.
    let unreadable: [&[&[u8]]; 5] = [
        &[b"\xff"],
        &[b"203.0.113.7, \xff"],
        &[b"unknown"],
        &[b"203.0.113.7, 127.0.0.1, bogus"],
        &[b"203.0.113.7", b"\xff, 127.0.0.1"],
    ];
    for lines in unreadable {
        assert_eq!(status(lines).await, "HTTP/1.1 400 Bad Request", "{lines:?}");
    }
    assert_eq!(backend.seen().len(), 1, "only the first request was forwarded");
}

#[tokio::test]
async fn a_one_mib_body_arrives_intact_both_ways() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let body: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let reply = request(
        gateway.addr,
        ip("127.0.0.1"),
        Method::POST,
        "/upload",
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body.len(), body.len());
    assert!(reply.body == body, "the echoed body differs");
}

#[tokio::test]
async fn paths_queries_and_backend_statuses_pass_through() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let reply = get(gateway.addr, "/search?q=a%20b&page=2").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(backend.last().uri, "/search?q=a%20b&page=2");
    assert_eq!(
        get(gateway.addr, "/status/404").await.status,
        StatusCode::NOT_FOUND
    );
    let no_content = get(gateway.addr, "/status/204").await;
    assert_eq!(no_content.status, StatusCode::NO_CONTENT);
    assert!(no_content.body.is_empty());
    assert!(no_content.headers.contains_key("x-ratelimit-remaining"));
}

#[tokio::test]
async fn backend_path_prefix_is_prepended() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&format!("{}/v1/", backend.url()), &[]).await;
    get(gateway.addr, "/users?id=7").await;
    assert_eq!(backend.last().uri, "/v1/users?id=7");
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_and_forwarding_headers_set() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let headers = [
        ("connection", "x-hop-secret"),
        ("x-hop-secret", "do not forward"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("x-end-to-end", "kept"),
    ];
    let reply = get_from(gateway.addr, ip("127.0.0.1"), "/", &headers).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = backend.last().headers;
    assert!(!seen.contains_key("x-hop-secret"));
    assert!(!seen.contains_key("keep-alive"));
    assert!(!seen.contains_key("te"));
    assert_eq!(seen["x-end-to-end"], "kept");
    assert_eq!(seen["host"], "gateway.test");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "gateway.test");
}

#[tokio::test]
async fn backend_down_is_502_and_a_slow_backend_is_504() {
    let closed = format!("http://127.0.0.1:{}", crate::support::free_port());
    let gateway = Gateway::start(&closed, &[]).await;
    let reply = get(gateway.addr, "/").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reply.text(), r#"{"error":"bad gateway"}"#);
    assert!(
        reply.headers.contains_key("x-ratelimit-limit"),
        "the request was still counted"
    );

    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("BACKEND_TIMEOUT_MS", "200")]).await;
    let reply = get(gateway.addr, "/slow/3000").await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(reply.text(), r#"{"error":"gateway timeout"}"#);
}

#[tokio::test]
async fn max_keys_holds_under_a_flood_of_identities() {
    let backend = Backend::start().await;
    let max_keys = 50;
    let gateway = Gateway::start(
        &backend.url(),
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.01"),
            ("MAX_KEYS", "50"),
            ("TRUSTED_PROXIES", "127.0.0.1/32"),
        ],
    )
    .await;
    let victim = [("x-forwarded-for", "203.0.113.1")];
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.1"), "/", &victim).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.1"), "/", &victim).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // 10x MAX_KEYS invented clients, each allowed once (a fresh client starts full).
    for n in 0..10 * max_keys {
        let fake = format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255);
        let reply = get_from(gateway.addr, ip("127.0.0.1"), "/", &[("x-forwarded-for", &fake)]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    // The store stayed bounded, and the one client it refused was not what made room: each
    // invented client was allowed, so they were forgotten first (an earlier version forgot
    // the victim and handed it a fresh budget).
    assert_eq!(
        get_from(gateway.addr, ip("127.0.0.1"), "/", &victim).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn http2_cleartext_is_served_on_the_same_port() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("http://gateway.test/h2?x=1")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.headers()["x-ratelimit-remaining"], "9");
    response.into_body().collect().await.unwrap();
    let seen = backend.last();
    assert_eq!(seen.uri, "/h2?x=1");
    assert_eq!(seen.headers["host"], "gateway.test");
}

#[tokio::test]
async fn upgrades_are_tunnelled() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let head = crate::support::read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 9"), "{head}");
    stream.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let addr = gateway.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/500").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    gateway.stop().await;
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn oversized_and_malformed_requests_are_refused_cleanly() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let mut huge = b"GET / HTTP/1.1\r\nHost: gateway.test\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1024 * 1024));
    huge.extend(b"\r\n\r\n");
    assert_eq!(
        raw_status_line(gateway.addr, &huge).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let garbage = b"GET / HTTP/1.1\r\nHost: gateway.test\r\nBad Header\r\n\r\n";
    assert_eq!(
        raw_status_line(gateway.addr, garbage).await,
        "HTTP/1.1 400 Bad Request"
    );
    assert!(backend.seen().is_empty(), "nothing malformed reaches the backend");
    assert_eq!(
        get(gateway.addr, "/").await.status,
        StatusCode::OK,
        "and the gateway carries on"
    );
}
