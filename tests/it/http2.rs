//! HTTP/2 floods, written frame by frame as an attacker would, each with a bounded answer:
//! the connection is ended (`GOAWAY` with `ENHANCE_YOUR_CALM`, or dropped once its socket has
//! taken nothing for `SEND_TIMEOUT_MS`) or the excess is refused, the
//! backend sees nothing it should not, and other clients are served meanwhile. These hold
//! hyper's and h2's defences (on by default, never turned off by tollgate) to what a
//! deployment relies on, so a change of settings or versions that drops one fails here.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use http::StatusCode;

use crate::support::{Backend, Gateway, get, get_from};

/// The client connection preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// `SETTINGS_MAX_CONCURRENT_STREAMS` and `SETTINGS_MAX_HEADER_LIST_SIZE`.
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
const MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 section 7).
const REFUSED_STREAM: u32 = 0x7;
const CANCEL: u32 = 0x8;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = Vec::with_capacity(9 + payload.len());
    frame.extend_from_slice(&length[1..]);
    frame.push(kind);
    frame.push(flags);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An HPACK block for `GET path` on `localhost`: `:method GET` and `:scheme http` from the
/// static table, `:path` and `:authority` as literals that are not indexed.
fn get_block(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86];
    for (name_index, value) in [(0x04, path), (0x01, "localhost")] {
        block.push(name_index);
        block.push(u8::try_from(value.len()).expect("a short value"));
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// The client connection preface, its `SETTINGS` with `SETTINGS_INITIAL_WINDOW_SIZE` at
/// `window`, and `GET path` on stream 1.
fn opening(window: u32, path: &str) -> Vec<u8> {
    let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut settings = vec![0, 4];
    settings.extend_from_slice(&window.to_be_bytes());
    opening.extend(frame(SETTINGS, 0, 0, &settings));
    opening.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block(path)));
    opening
}

/// One frame from the gateway.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The frames the gateway sent until it closed the connection or `quiet` passed with
/// nothing more.
struct Seen {
    frames: Vec<Frame>,
    closed: bool,
}

impl Seen {
    /// The error code of the gateway's `GOAWAY`, if it sent one.
    fn goaway(&self) -> Option<u32> {
        self.frames
            .iter()
            .find(|frame| frame.kind == GOAWAY)
            .map(|frame| u32::from_be_bytes(frame.payload[4..8].try_into().unwrap()))
    }

    /// Frames of `kind` on request streams.
    fn on_streams(&self, kind: u8) -> impl Iterator<Item = &Frame> {
        self.frames
            .iter()
            .filter(move |frame| frame.kind == kind && frame.stream != 0)
    }

    /// The value of `setting` in the gateway's first `SETTINGS`.
    fn setting(&self, setting: u16) -> Option<u32> {
        let settings = self.frames.iter().find(|frame| frame.kind == SETTINGS)?;
        settings.payload.chunks_exact(6).find_map(|entry| {
            (u16::from_be_bytes([entry[0], entry[1]]) == setting)
                .then(|| u32::from_be_bytes(entry[2..6].try_into().unwrap()))
        })
    }
}

/// Read the gateway's frames until it closes the connection, or until `quiet` passes with
/// nothing more.
async fn read_frames(stream: &mut (impl AsyncRead + Unpin), quiet: Duration) -> Seen {
    let mut buffer = Vec::new();
    let mut frames = Vec::new();
    let mut chunk = [0u8; 16384];
    let closed = loop {
        match tokio::time::timeout(quiet, stream.read(&mut chunk)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => buffer.extend_from_slice(&chunk[..n]),
        }
        while buffer.len() >= 9 {
            let length = usize::from(buffer[0]) << 16 | usize::from(buffer[1]) << 8 | usize::from(buffer[2]);
            if buffer.len() < 9 + length {
                break;
            }
            frames.push(Frame {
                kind: buffer[3],
                flags: buffer[4],
                stream: u32::from_be_bytes(buffer[5..9].try_into().unwrap()) & 0x7fff_ffff,
                payload: buffer[9..9 + length].to_vec(),
            });
            buffer.drain(..9 + length);
        }
    };
    Seen { frames, closed }
}

/// Another client, on a connection of its own, is answered `200`.
async fn assert_others_are_served(gateway: &Gateway) {
    let reply = get(gateway.addr, "/").await;
    assert_eq!(reply.status, StatusCode::OK, "others are served");
}

/// A gateway with a budget no test here spends, so every refusal seen is HTTP/2's.
async fn gateway(backend: &Backend) -> Gateway {
    Gateway::start(&backend.url(), &[("MAX_TOKENS", "100000")]).await
}

/// Rapid reset (CVE-2023-44487): streams opened and cancelled at once cost the client nothing
/// and would cost the server a request each. After 20 cancelled before they were taken up,
/// the connection is ended; the backend sees none of them.
#[tokio::test]
async fn a_rapid_reset_flood_ends_the_connection_before_the_backend_sees_it() {
    let backend = Backend::start().await;
    let gateway = gateway(&backend).await;
    let mut attacker = TcpStream::connect(gateway.addr).await.unwrap();
    let mut flood = PREFACE.to_vec();
    for n in 0..2_000u32 {
        let stream = 2 * n + 1;
        flood.extend(frame(HEADERS, END_STREAM | END_HEADERS, stream, &get_block("/")));
        flood.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    // The gateway may close before all of it is written.
    let _ = attacker.write_all(&flood).await;
    let seen = read_frames(&mut attacker, Duration::from_secs(5)).await;
    assert_eq!(seen.goaway(), Some(ENHANCE_YOUR_CALM));
    assert!(seen.closed, "the connection is ended");
    assert!(
        backend.seen().len() <= 20,
        "{} of 2,000 cancelled requests reached the backend",
        backend.seen().len()
    );
    assert_others_are_served(&gateway).await;
}

/// A header block that never ends (`CONTINUATION` frames without `END_HEADERS`,
/// CVE-2024-27316 and kin): the gateway stops reading it at a bounded size and ends the
/// connection, rather than buffering it for a request that never comes.
#[tokio::test]
async fn a_header_block_that_never_ends_is_cut_off() {
    let backend = Backend::start().await;
    let gateway = gateway(&backend).await;
    let mut attacker = TcpStream::connect(gateway.addr).await.unwrap();
    attacker.write_all(PREFACE).await.unwrap();
    attacker
        .write_all(&frame(HEADERS, END_STREAM, 1, &get_block("/")))
        .await
        .unwrap();
    // A 4 KiB `x-pad` header per frame (a literal, its length 4096 as HPACK writes it), 16 MiB
    // in all: a thousand times the header list size the gateway advertises.
    let mut field = vec![0x00, 5];
    field.extend_from_slice(b"x-pad");
    field.extend_from_slice(&[0x7f, 0x81, 0x1f]);
    field.extend(std::iter::repeat_n(b'a', 4096));
    let continuation = frame(CONTINUATION, 0, 1, &field);
    let mut written = 0;
    for _ in 0..4_096 {
        if attacker.write_all(&continuation).await.is_err() {
            break;
        }
        written += continuation.len();
    }
    let seen = read_frames(&mut attacker, Duration::from_secs(5)).await;
    assert_eq!(seen.goaway(), Some(ENHANCE_YOUR_CALM), "{written} bytes written");
    assert!(seen.closed, "the connection is ended");
    assert!(backend.seen().is_empty(), "a request reached the backend");
    assert_others_are_served(&gateway).await;
}

/// More streams at once than the gateway advertises: the excess is refused
/// (`REFUSED_STREAM`, which a client may retry) and never reaches the backend; the streams
/// within the limit are answered.
#[tokio::test]
async fn streams_past_the_advertised_limit_are_refused_before_the_backend() {
    streams_past_the_limit_are_refused(&[], 200).await;
}

/// `H2_MAX_CONCURRENT_STREAMS` sets the streams one connection may have open at once.
#[tokio::test]
async fn the_streams_per_connection_are_as_configured() {
    streams_past_the_limit_are_refused(&[("H2_MAX_CONCURRENT_STREAMS", "50")], 50).await;
}

/// 400 streams opened at once on one connection: the gateway advertises `expected` in its
/// `SETTINGS`, answers that many and resets the rest (`REFUSED_STREAM`) before the backend.
async fn streams_past_the_limit_are_refused(vars: &[(&str, &str)], expected: u32) {
    let backend = Backend::start().await;
    let vars: Vec<_> = [("MAX_TOKENS", "100000")].iter().chain(vars).copied().collect();
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let mut burst = PREFACE.to_vec();
    for n in 0..400u32 {
        burst.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            2 * n + 1,
            &get_block("/slow/500"),
        ));
    }
    client.write_all(&burst).await.unwrap();
    let seen = read_frames(&mut client, Duration::from_secs(3)).await;
    // What docs/operations.md promises a deployment.
    let limit = seen
        .setting(MAX_CONCURRENT_STREAMS)
        .expect("the gateway advertises SETTINGS_MAX_CONCURRENT_STREAMS");
    assert_eq!(limit, expected);
    assert_eq!(seen.setting(MAX_HEADER_LIST_SIZE), Some(16 * 1024));
    let refused: Vec<u32> = seen
        .on_streams(RST_STREAM)
        .map(|frame| u32::from_be_bytes(frame.payload[..4].try_into().unwrap()))
        .collect();
    assert_eq!(refused.len() as u32, 400 - limit, "the excess is reset");
    assert!(refused.iter().all(|&code| code == REFUSED_STREAM), "{refused:?}");
    assert_eq!(
        seen.on_streams(HEADERS).count() as u32,
        limit,
        "the rest are answered"
    );
    assert_eq!(
        backend.seen().len() as u32,
        limit,
        "only those reached the backend"
    );
    assert!(!seen.closed, "the connection stays open");
}

/// Whether a new HTTP/1 client is answered within a second (not refused at once, as past
/// `MAX_CONNECTIONS`).
async fn served(addr: std::net::SocketAddr) -> bool {
    let answered = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(1), answered)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Slow read over HTTP/2: a client that opens every flow-control window, asks for a large
/// response and stops reading the socket is dropped after `SEND_TIMEOUT_MS` (its place under
/// `MAX_CONNECTIONS=1` comes back), as over HTTP/1; when `new_streams`, it opens a stream every
/// 100 ms meanwhile, which does not start the clock again.
async fn stalled_client_is_dropped(new_streams: bool) {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("SEND_TIMEOUT_MS", "1000"), ("MAX_CONNECTIONS", "1")],
    )
    .await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    // Every stream's window at its largest, and the connection's opened as far.
    let mut frames = opening(0x7fff_ffff, "/bytes/268435456");
    let increment = 0x7fff_ffff - 65_535u32;
    frames.extend(frame(WINDOW_UPDATE, 0, 0, &increment.to_be_bytes()));
    client.write_all(&frames).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !served(gateway.addr).await,
        "the stalled client holds MAX_CONNECTIONS=1"
    );
    let started = std::time::Instant::now();
    let mut stream = 3;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stalled client was never dropped"
        );
        if new_streams {
            // Fails once the gateway has reset the connection.
            let request = frame(
                HEADERS,
                END_STREAM | END_HEADERS,
                stream,
                &get_block("/status/204"),
            );
            let _ = client.write_all(&request).await;
            stream += 2;
        }
        if served(gateway.addr).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = read_frames(&mut client, Duration::from_secs(5)).await;
    assert!(seen.closed, "the connection is still open");
    let body: usize = seen.on_streams(DATA).map(|frame| frame.payload.len()).sum();
    assert!(body < 268_435_456, "the whole response arrived");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_after_the_send_timeout() {
    stalled_client_is_dropped(false).await;
}

#[tokio::test]
async fn a_client_that_stops_reading_cannot_hold_off_the_send_timeout_with_new_streams() {
    stalled_client_is_dropped(true).await;
}

/// A request whose header block puts one 4,000-byte header into the HPACK dynamic table and
/// then refers to it `references` times (one byte each), as one `HEADERS` and its
/// `CONTINUATION`s on stream 1.
fn hpack_bomb(references: usize) -> Vec<u8> {
    let mut block = get_block("/");
    // A literal with incremental indexing, new name `x-bomb`; 4,000 as HPACK writes it.
    block.extend_from_slice(&[0x40, 6]);
    block.extend_from_slice(b"x-bomb");
    block.extend_from_slice(&[0x7f, 0xa1, 0x1e]);
    block.extend(std::iter::repeat_n(b'b', 4000));
    // Index 62: the first entry of the dynamic table, the header above.
    block.extend(std::iter::repeat_n(0xbe, references));
    let chunks: Vec<&[u8]> = block.chunks(16_000).collect();
    let mut frames = Vec::new();
    for (n, chunk) in chunks.iter().enumerate() {
        let end = if n + 1 == chunks.len() { END_HEADERS } else { 0 };
        let (kind, flags) = match n {
            0 => (HEADERS, END_STREAM | end),
            _ => (CONTINUATION, end),
        };
        frames.extend(frame(kind, flags, 1, chunk));
    }
    frames
}

/// HPACK: a few KB on the wire that decode to many MB (one big header, referred to 2,000
/// times: 8 MB) end the connection with `ENHANCE_YOUR_CALM`; a header list just past the
/// advertised 16 KiB (4 references: 20 KB) is answered on its stream (`431`) and the
/// connection goes on. Neither reaches the backend.
#[tokio::test]
async fn header_lists_past_the_limit_never_reach_the_backend_and_an_hpack_bomb_ends_the_connection() {
    let backend = Backend::start().await;
    let gateway = gateway(&backend).await;

    let mut bomb = TcpStream::connect(gateway.addr).await.unwrap();
    bomb.write_all(PREFACE).await.unwrap();
    bomb.write_all(&hpack_bomb(2_000)).await.unwrap();
    let seen = read_frames(&mut bomb, Duration::from_secs(5)).await;
    assert_eq!(seen.goaway(), Some(ENHANCE_YOUR_CALM));
    assert!(seen.closed, "the connection is ended");

    let mut oversized = TcpStream::connect(gateway.addr).await.unwrap();
    oversized.write_all(PREFACE).await.unwrap();
    oversized.write_all(&hpack_bomb(4)).await.unwrap();
    let seen = read_frames(&mut oversized, Duration::from_secs(1)).await;
    assert_eq!(seen.on_streams(HEADERS).count(), 1, "the request is answered");
    assert_eq!(seen.goaway(), None);
    assert!(!seen.closed, "the connection goes on");

    assert!(backend.seen().is_empty(), "a request reached the backend");
    assert_others_are_served(&gateway).await;
}

/// A client that reads its connection but keeps one stream's flow-control window shut (every
/// stream's, here: `SETTINGS_INITIAL_WINDOW_SIZE` 0): that stream is given up after
/// `SEND_TIMEOUT_MS` (reset), and its place among the requests in flight (`MAX_CONNECTIONS=1`)
/// comes back, while the connection stays open. The socket never stalls, so only the
/// stream's own clock can see it.
#[tokio::test]
async fn a_stream_whose_window_stays_shut_is_reset_after_the_send_timeout() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[("SEND_TIMEOUT_MS", "1000"), ("MAX_CONNECTIONS", "1")],
    )
    .await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client.write_all(&opening(0, "/bytes/1048576")).await.unwrap();
    let before = read_frames(&mut client, Duration::from_millis(300)).await;
    assert_eq!(
        before.on_streams(HEADERS).count(),
        1,
        "the response's head is sent"
    );
    assert_eq!(before.on_streams(DATA).count(), 0, "no window, no body");
    // Its place is held: a second request on the connection is answered 503, not forwarded.
    client
        .write_all(&frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            3,
            &get_block("/status/204"),
        ))
        .await
        .unwrap();
    // The client keeps reading; the stream is reset once its clock runs out.
    let started = std::time::Instant::now();
    let (mut reset, mut refused) = (false, false);
    while !reset && started.elapsed() < Duration::from_secs(5) {
        let seen = read_frames(&mut client, Duration::from_millis(200)).await;
        assert!(!seen.closed, "the connection stays open");
        reset = seen.on_streams(RST_STREAM).any(|frame| frame.stream == 1);
        // Stream 3's answer: its head (a 503, never `:status 200` or `204` of the static
        // table) gets through the shut window; its body cannot.
        refused |= seen
            .on_streams(HEADERS)
            .any(|frame| frame.stream == 3 && !matches!(frame.payload[0], 0x88 | 0x89));
    }
    assert!(reset, "stream 1 was never reset");
    assert!(refused, "stream 3 was not answered while stream 1 held the place");
    client
        .write_all(&frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            5,
            &get_block("/status/204"),
        ))
        .await
        .unwrap();
    let after = read_frames(&mut client, Duration::from_millis(500)).await;
    let answer = after
        .on_streams(HEADERS)
        .find(|frame| frame.stream == 5)
        .expect("stream 5 is answered");
    assert_eq!(answer.payload[0], 0x89, "`:status 204` from HPACK's static table");
    let seen: Vec<String> = backend.seen().into_iter().map(|seen| seen.uri).collect();
    assert_eq!(
        seen,
        ["/bytes/1048576", "/status/204"],
        "stream 3 was not forwarded"
    );
    // Counted: stream 1, and stream 3, whose 503 has a body that cannot pass the shut window
    // either (given up a little later). The connection itself never was.
    let started = std::time::Instant::now();
    loop {
        let metrics = gateway.admin_get("/metrics").await;
        let metrics = metrics.text();
        assert!(
            metrics.contains("tollgate_client_connections_unread_total 0\n"),
            "{metrics}"
        );
        if metrics.contains("tollgate_client_streams_unread_total 2\n") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client that reads a large HTTP/2 response slowly but steadily (128 KiB/s, with the
/// default 64 KiB windows, opening them again every 16 KiB it reads) gets all of it, though
/// it takes eight send timeouts: the stream's clock restarts every 16 KiB taken. (Handed whole,
/// the backend's chunks of up to about 400 KiB would each have had to be taken within one
/// timeout, and the stream was reset.)
#[tokio::test]
async fn a_stream_read_slowly_but_steadily_is_not_reset() {
    const SIZE: usize = 512 * 1024;
    const RATE: f64 = 128.0 * 1024.0;
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("SEND_TIMEOUT_MS", "500")]).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let mut opening = PREFACE.to_vec();
    opening.extend(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &get_block(&format!("/bytes/{SIZE}")),
    ));
    client.write_all(&opening).await.unwrap();
    let started = std::time::Instant::now();
    let (mut buffer, mut chunk) = (Vec::new(), [0u8; 4096]);
    let (mut body, mut taken, mut unacknowledged) = (0, 0, 0);
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{body} of {SIZE} bytes in 30 s"
        );
        // Never ahead of the rate.
        if taken as f64 > started.elapsed().as_secs_f64() * RATE + 4096.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let n = match tokio::time::timeout(Duration::from_millis(50), client.read(&mut chunk)).await {
            Err(_) => continue,
            Ok(Ok(0) | Err(_)) => panic!("the connection ended after {body} body bytes"),
            Ok(Ok(n)) => n,
        };
        taken += n;
        buffer.extend_from_slice(&chunk[..n]);
        let mut ended = false;
        while buffer.len() >= 9 {
            let length = usize::from(buffer[0]) << 16 | usize::from(buffer[1]) << 8 | usize::from(buffer[2]);
            if buffer.len() < 9 + length {
                break;
            }
            let (kind, flags) = (buffer[3], buffer[4]);
            let stream = u32::from_be_bytes(buffer[5..9].try_into().unwrap()) & 0x7fff_ffff;
            assert!(
                kind != RST_STREAM && kind != GOAWAY,
                "reset after {body} body bytes"
            );
            if kind == DATA && stream == 1 {
                body += length;
                unacknowledged += length;
                ended = flags & END_STREAM != 0;
            }
            // SETTINGS and PING are acknowledged, as a client does.
            if (kind == SETTINGS || kind == PING) && flags & ACK == 0 {
                let ack = if kind == PING {
                    buffer[9..9 + length].to_vec()
                } else {
                    Vec::new()
                };
                client.write_all(&frame(kind, ACK, 0, &ack)).await.unwrap();
            }
            buffer.drain(..9 + length);
        }
        if ended {
            break;
        }
        if unacknowledged >= 16 * 1024 {
            let increment = u32::try_from(unacknowledged).unwrap().to_be_bytes();
            let mut updates = frame(WINDOW_UPDATE, 0, 1, &increment);
            updates.extend(frame(WINDOW_UPDATE, 0, 0, &increment));
            client.write_all(&updates).await.unwrap();
            unacknowledged = 0;
        }
    }
    assert_eq!(body, SIZE);
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "taken faster than meant"
    );
}

/// A window opened a byte at a time (`SETTINGS_INITIAL_WINDOW_SIZE` 1, then a one-byte
/// `WINDOW_UPDATE` every 100 ms) counts as shut: the body's 16 KiB piece is never taken within
/// `SEND_TIMEOUT_MS`, and the stream is reset.
#[tokio::test]
async fn a_window_opened_a_byte_at_a_time_counts_as_shut() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[("SEND_TIMEOUT_MS", "1000")]).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client.write_all(&opening(1, "/bytes/1048576")).await.unwrap();
    let started = std::time::Instant::now();
    let (mut body, mut reset) = (0, false);
    while !reset {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reset ({body} bytes sent)"
        );
        let trickle = frame(WINDOW_UPDATE, 0, 1, &1u32.to_be_bytes());
        client.write_all(&trickle).await.unwrap();
        let seen = read_frames(&mut client, Duration::from_millis(100)).await;
        assert!(!seen.closed, "the connection stays open");
        body += seen
            .on_streams(DATA)
            .map(|frame| frame.payload.len())
            .sum::<usize>();
        reset = seen.on_streams(RST_STREAM).any(|frame| frame.stream == 1);
    }
    assert!(body < 1024, "{body} bytes sent a byte at a time");
}

/// A flood of `flood` frames (each one the gateway must answer) from a client that reads
/// nothing: h2 keeps one answer waiting at most and reads no further frame until its bounded
/// write buffer has taken it, so once the client's socket takes nothing more (and the buffer
/// is full) the gateway stops reading too, and after
/// `SEND_TIMEOUT_MS` the connection is dropped; its place under `MAX_CONNECTIONS=1` comes back.
async fn control_flood_from_a_client_that_does_not_read(flood: Vec<u8>) {
    let backend = Backend::start().await;
    let gateway = Gateway::start(
        &backend.url(),
        &[("SEND_TIMEOUT_MS", "1000"), ("MAX_CONNECTIONS", "1")],
    )
    .await;
    // A small receive buffer, so the gateway's answers fill it after a few thousand frames.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let client = socket.connect(gateway.addr).await.unwrap();
    let (_unread, mut writer) = client.into_split();
    let burst = flood.repeat(1024);
    let flooding = tokio::spawn(async move {
        writer.write_all(PREFACE).await?;
        // 256 MiB: far more than the buffers on both sides hold.
        for _ in 0..(256 << 20) / burst.len() {
            writer.write_all(&burst).await?;
        }
        Ok::<(), std::io::Error>(())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !served(gateway.addr).await,
        "the flooding client holds MAX_CONNECTIONS=1"
    );
    let started = std::time::Instant::now();
    while !served(gateway.addr).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the flooding client was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let flooded = tokio::time::timeout(Duration::from_secs(5), flooding)
        .await
        .expect("the flood's writes are still blocked after the drop")
        .unwrap();
    assert!(flooded.is_err(), "the gateway read the whole flood");
}

/// PING flood (CVE-2019-9512): every `PING` asks for a `PING` back.
#[tokio::test]
async fn a_ping_flood_from_a_client_that_does_not_read_is_dropped() {
    control_flood_from_a_client_that_does_not_read(frame(PING, 0, 0, &[0; 8])).await;
}

/// SETTINGS flood (CVE-2019-9515): every `SETTINGS` asks for an acknowledgement.
#[tokio::test]
async fn a_settings_flood_from_a_client_that_does_not_read_is_dropped() {
    control_flood_from_a_client_that_does_not_read(frame(SETTINGS, 0, 0, &[])).await;
}

/// A client that reads its answers gets one per `PING`, and the connection goes on serving
/// requests; the flood is the client's own cost, not multiplied by the gateway.
#[tokio::test]
async fn every_ping_is_answered_once_and_the_connection_serves_on() {
    let backend = Backend::start().await;
    let gateway = gateway(&backend).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let mut flood = PREFACE.to_vec();
    for n in 0..10_000u64 {
        flood.extend(frame(PING, 0, 0, &n.to_be_bytes()));
    }
    flood.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block("/")));
    let (mut reader, mut writer) = client.split();
    let (written, seen) = tokio::join!(
        writer.write_all(&flood),
        read_frames(&mut reader, Duration::from_secs(2))
    );
    written.unwrap();
    let pongs: Vec<u64> = seen
        .frames
        .iter()
        .filter(|frame| frame.kind == PING && frame.flags & ACK != 0)
        .map(|frame| u64::from_be_bytes(frame.payload[..8].try_into().unwrap()))
        .collect();
    assert_eq!(
        pongs,
        (0..10_000).collect::<Vec<_>>(),
        "one answer per PING, in order"
    );
    assert!(
        seen.frames
            .iter()
            .any(|frame| frame.kind == HEADERS && frame.stream == 1),
        "the request after the flood is answered"
    );
    assert!(!seen.closed && seen.goaway().is_none(), "the connection goes on");
    assert_others_are_served(&gateway).await;
}

/// An HTTP/2 connection (prior knowledge) from `from` that reads no response body:
/// `SETTINGS_INITIAL_WINDOW_SIZE` 0, so every stream's window stays shut and no `DATA` can
/// reach it, refusals' bodies included.
async fn unread_connection(
    addr: std::net::SocketAddr,
    from: std::net::IpAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    (sender, tokio::spawn(async move { drop(connection.await) }))
}

/// One address opens `connections` HTTP/2 connections that read nothing and sends
/// `streams` `GET path` on each at once: the answers' heads, every response kept (its body
/// unread: the stream stays open, its answer waiting for a window that never opens), with
/// the connections' drivers.
async fn unread_streams(
    addr: std::net::SocketAddr,
    connections: usize,
    streams: usize,
    path: &'static str,
) -> (Vec<StatusCode>, Vec<impl Sized>) {
    let mut held = Vec::new();
    let mut requests = Vec::new();
    for _ in 0..connections {
        let (sender, driver) = unread_connection(addr, [127, 0, 0, 1].into()).await;
        for _ in 0..streams {
            let mut sender = sender.clone();
            requests.push(tokio::spawn(async move {
                let request = http::Request::get(format!("http://gateway.test{path}"))
                    .body(http_body_util::Empty::new())
                    .unwrap();
                sender.send_request(request).await.unwrap()
            }));
        }
        held.push((sender, driver));
    }
    let mut statuses = Vec::new();
    let mut responses = Vec::new();
    for request in requests {
        let response = tokio::time::timeout(Duration::from_secs(20), request)
            .await
            .expect("every stream is answered")
            .unwrap();
        statuses.push(response.status());
        responses.push(response);
    }
    (statuses, vec![(held, responses)])
}

fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|&&seen| seen == status).count()
}

/// Wait until `tollgate_requests_in_flight` is `expected`, at most a few seconds.
async fn assert_in_flight(gateway: &Gateway, expected: f64) {
    let started = std::time::Instant::now();
    loop {
        let in_flight = gateway.metric("tollgate_requests_in_flight").await;
        if in_flight == expected {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "tollgate_requests_in_flight is {in_flight}, not {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One address, 3 HTTP/2 connections x 150 streams with `SETTINGS_INITIAL_WINDOW_SIZE` 0, over
/// its budget: the gateway's own answers (`429`) are handed over whole and their bodies can
/// never be sent, but they hold no place among the requests in flight (`MAX_CONNECTIONS`
/// 400) while they wait for the window: the place is for the work done for a request, and it
/// is done. So none of the 450 is refused `503`, the gauge falls back to 0 though every
/// stream is still open, and another client is served.
#[tokio::test]
async fn refusals_a_client_does_not_read_hold_no_place_in_flight() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_CONNECTIONS", "400"),
            ("MAX_TOKENS", "10"),
            ("REFILL_RATE", "0.001"),
        ],
    )
    .await;
    let (statuses, held) = unread_streams(gateway.addr, 3, 150, "/").await;
    assert_eq!(
        (
            count(&statuses, StatusCode::OK),
            count(&statuses, StatusCode::TOO_MANY_REQUESTS)
        ),
        (10, 440),
        "the budget decides every one, none is refused 503"
    );
    assert_in_flight(&gateway, 0.0).await;
    let other = get_from(gateway.addr, [127, 0, 0, 2].into(), "/", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "another client is served");
    assert_eq!(backend.seen().len(), 11);
    drop(held);
}

/// One address, 3 HTTP/2 connections x 150 streams (windows 0) to a slow backend: it holds at
/// most its share of the requests in flight (`MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`, unset: three
/// quarters of `MAX_CONNECTIONS` 400, so 300); the rest are answered `503` at once and never
/// reach the backend, the gauge stays at 300, and another client is served meanwhile.
#[tokio::test]
async fn one_address_holds_at_most_its_share_of_the_requests_in_flight() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[("MAX_CONNECTIONS", "400"), ("MAX_TOKENS", "100000")],
    )
    .await;
    let greedy = tokio::spawn(unread_streams(gateway.addr, 3, 150, "/slow/6000"));
    // The 503s come at once; the 300 forwarded wait for their backend.
    let started = std::time::Instant::now();
    while backend.seen().len() < 300 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} forwarded",
            backend.seen().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_in_flight(&gateway, 300.0).await;
    let other = get_from(gateway.addr, [127, 0, 0, 2].into(), "/", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "another client is served");
    assert_eq!(gateway.metric("tollgate_requests_in_flight").await, 300.0);
    let (statuses, held) = greedy.await.unwrap();
    assert_eq!(
        (
            count(&statuses, StatusCode::OK),
            count(&statuses, StatusCode::SERVICE_UNAVAILABLE)
        ),
        (300, 150)
    );
    assert_eq!(backend.seen().len(), 301, "the 503s never reached the backend");
    drop(held);
}

/// A peer in `TRUSTED_PROXIES` carries every client: its requests in flight are not capped
/// per client, only by `MAX_CONNECTIONS` (40 here, a share of 30 otherwise).
#[tokio::test]
async fn a_trusted_proxy_s_requests_in_flight_are_not_capped_per_client() {
    let backend = Backend::start().await;
    let gateway = Gateway::start_with_admin(
        &backend.url(),
        &[
            ("MAX_CONNECTIONS", "40"),
            ("MAX_TOKENS", "100000"),
            ("TRUSTED_PROXIES", "127.0.0.1/32"),
        ],
    )
    .await;
    let proxy = tokio::spawn(unread_streams(gateway.addr, 1, 40, "/slow/2000"));
    let started = std::time::Instant::now();
    while backend.seen().len() < 40 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} forwarded",
            backend.seen().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_in_flight(&gateway, 40.0).await;
    let (statuses, held) = proxy.await.unwrap();
    assert_eq!(count(&statuses, StatusCode::OK), 40, "{statuses:?}");
    drop(held);
}
