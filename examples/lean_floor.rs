//! The leanest floor for `scripts/bench.sh`: a plain HTTP/1.1 server and client with a keyed
//! limiter, and nothing else at all.
//!
//! `examples/bare_proxy.rs` is "hyper + a rate limiter" as most people would write it, with
//! hyper-util's pooled legacy client, a URI rebuilt per request and an `X-Forwarded-For` line
//! appended. This one strips even that, so that what hyper's own HTTP/1.1 machinery costs is
//! the whole of its cost: hyper's `http1` server connection, and for each client connection one
//! backend connection of hyper's `http1` client (a client's requests on one HTTP/1.1 connection
//! come one at a time, so one backend connection serves them all and no pool is needed). Each
//! request's peer address is looked up in a `Mutex<HashMap<IpAddr, Bucket>>` token bucket;
//! over budget, `429` with an empty body; otherwise the request goes to the backend exactly as
//! it came (same target, same headers: the backend sees the client's `Host`), and the
//! response comes back exactly as the backend sent it. No header is read or written beyond
//! what hyper does itself.
//!
//! Not a thing to deploy: no timeouts, no limits, no forwarding headers, no path handling.
//!
//! With `FLOOR_HEADERS=tollgate` it also writes the headers tollgate writes by default, and
//! nothing else of tollgate's: to the backend `X-Forwarded-For`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host`, `X-Real-IP`, `Forwarded` and `X-Request-Id`; to the client
//! `X-RateLimit-Limit`, `-Remaining`, `-Reset` and `X-Request-Id`. Each value is put together on
//! the stack and copied once into its `HeaderValue`, each name a constant: what those headers
//! cost any hyper proxy, measured against the floor (docs/benchmarks.md, part 39).
//!
//! Environment: `PORT` (default 8082), `BACKEND_URL` (`http://host:port`, default
//! `http://127.0.0.1:8000`), `MAX_TOKENS` and `REFILL_RATE` (default 10 and 1),
//! `FLOOR_HEADERS` (`none`, the default, or `tollgate`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Body = Either<Incoming, Empty<Bytes>>;

/// One client's token bucket.
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The limiter, shared by every connection.
struct Limiter {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
    burst: f64,
    refill_per_second: f64,
}

impl Limiter {
    /// Take one token from `key`'s bucket if it has one: the tokens left, or `None`.
    fn allow(&self, key: IpAddr) -> Option<f64> {
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.refill_per_second).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Some(bucket.tokens)
        } else {
            None
        }
    }
}

/// The backend connection of one client connection, opened at its first allowed request and
/// opened again if the backend closes it.
struct Upstream {
    backend: SocketAddr,
    sender: tokio::sync::Mutex<Option<client::SendRequest<Incoming>>>,
}

impl Upstream {
    async fn send(&self, request: Request<Incoming>) -> Result<Response<Incoming>, String> {
        let mut sender = self.sender.lock().await;
        if sender.as_ref().is_none_or(|sender| sender.is_closed()) {
            let stream = TcpStream::connect(self.backend)
                .await
                .map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (new, connection) = client::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            *sender = Some(new);
        }
        let Some(sender) = sender.as_mut() else {
            return Err("no backend connection".into());
        };
        sender.ready().await.map_err(|e| e.to_string())?;
        sender.send_request(request).await.map_err(|e| e.to_string())
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = code;
    response
}

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = var("PORT", "8082").parse()?;
    let backend_url = var("BACKEND_URL", "http://127.0.0.1:8000");
    let backend: SocketAddr = backend_url
        .strip_prefix("http://")
        .ok_or("BACKEND_URL must be http://host:port")?
        .trim_end_matches('/')
        .parse()?;
    let limiter = Arc::new(Limiter {
        buckets: Mutex::new(HashMap::new()),
        burst: var("MAX_TOKENS", "10").parse()?,
        refill_per_second: var("REFILL_RATE", "1").parse()?,
    });
    let with_headers = match var("FLOOR_HEADERS", "none").as_str() {
        "none" => false,
        "tollgate" => true,
        other => return Err(format!("FLOOR_HEADERS must be none or tollgate, not {other:?}").into()),
    };
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let limiter = limiter.clone();
        let upstream = Arc::new(Upstream {
            backend,
            sender: tokio::sync::Mutex::new(None),
        });
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (limiter, upstream) = (limiter.clone(), upstream.clone());
                async move {
                    let Some(left) = limiter.allow(peer.ip()) else {
                        return Ok::<_, hyper::Error>(status(StatusCode::TOO_MANY_REQUESTS));
                    };
                    if !with_headers {
                        return Ok(match upstream.send(request).await {
                            Ok(response) => response.map(Either::Left),
                            Err(_) => status(StatusCode::BAD_GATEWAY),
                        });
                    }
                    let mut request = request;
                    let id = headers::request_id();
                    headers::forwarding(&mut request, peer.ip(), &id);
                    Ok(match upstream.send(request).await {
                        Ok(response) => {
                            let mut response = response.map(Either::Left);
                            headers::rate_limit(response.headers_mut(), &limiter, left, id);
                            response
                        }
                        Err(_) => status(StatusCode::BAD_GATEWAY),
                    })
                }
            });
            let _ = server::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `FLOOR_HEADERS=tollgate`: the headers tollgate writes by default, each value put together
/// in a stack buffer without `core::fmt` (an address formatted by `Display` three times costs
/// more than all the inserts) and copied once into its `HeaderValue`.
mod headers {
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};

    use hyper::HeaderMap;
    use hyper::Request;
    use hyper::header::{FORWARDED, HOST, HeaderName, HeaderValue};

    static FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    static FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
    static FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
    static REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
    static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    static LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
    static REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
    static RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

    /// A value put together from parts, on the stack.
    struct Buffer {
        bytes: [u8; 256],
        len: usize,
    }

    impl Buffer {
        fn new() -> Self {
            Buffer {
                bytes: [0; 256],
                len: 0,
            }
        }

        fn push(&mut self, part: &[u8]) -> &mut Self {
            let end = (self.len + part.len()).min(self.bytes.len());
            self.bytes[self.len..end].copy_from_slice(&part[..end - self.len]);
            self.len = end;
            self
        }

        fn push_decimal(&mut self, mut n: u64) -> &mut Self {
            let mut digits = [0_u8; 20];
            let mut at = digits.len();
            loop {
                at -= 1;
                digits[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            self.push(&digits[at..])
        }

        fn push_address(&mut self, ip: IpAddr) -> &mut Self {
            match ip {
                IpAddr::V4(ip) => {
                    for (i, octet) in ip.octets().into_iter().enumerate() {
                        if i > 0 {
                            self.push(b".");
                        }
                        self.push_decimal(u64::from(octet));
                    }
                    self
                }
                IpAddr::V6(ip) => {
                    let text = ip.to_string();
                    self.push(text.as_bytes())
                }
            }
        }

        fn value(&self) -> HeaderValue {
            HeaderValue::from_bytes(&self.bytes[..self.len]).unwrap_or_else(|_| HeaderValue::from_static("-"))
        }
    }

    /// 32 hex digits, unique in this process.
    pub fn request_id() -> HeaderValue {
        static NEXT: AtomicU64 = AtomicU64::new(0x0a1c_b48d_3729_cbf7);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let halves = [n, n.rotate_left(29)];
        let mut digits = [0_u8; 32];
        for (i, digit) in digits.iter_mut().enumerate() {
            let nibble = (halves[i / 16] >> (60 - 4 * (i % 16))) & 0xf;
            *digit = HEX[nibble as usize];
        }
        HeaderValue::from_bytes(&digits).unwrap_or_else(|_| HeaderValue::from_static("-"))
    }

    /// The forwarding headers and the request id, to the backend.
    pub fn forwarding<B>(request: &mut Request<B>, ip: IpAddr, id: &HeaderValue) {
        let mut text = Buffer::new();
        text.push_address(ip);
        let address = text.value();
        let mut forwarded = Buffer::new();
        forwarded.push(b"for=");
        if ip.is_ipv6() {
            forwarded.push(b"\"[").push(&text.bytes[..text.len]).push(b"]\"");
        } else {
            forwarded.push(&text.bytes[..text.len]);
        }
        forwarded.push(b";proto=http");
        let host = request.headers().get(HOST).cloned();
        if let Some(host) = &host {
            // Quoted: a host's `:` is not a token character (RFC 7239).
            forwarded.push(b";host=\"").push(host.as_bytes()).push(b"\"");
        }
        let headers = request.headers_mut();
        headers.insert(&FORWARDED_FOR, address.clone());
        headers.insert(&FORWARDED_PROTO, HeaderValue::from_static("http"));
        if let Some(host) = host {
            headers.insert(&FORWARDED_HOST, host);
        }
        headers.insert(&REAL_IP, address);
        headers.insert(FORWARDED, forwarded.value());
        headers.insert(&REQUEST_ID, id.clone());
    }

    /// The rate-limit headers (the bucket's size, the whole tokens left, when it is full
    /// again in Unix seconds) and the request id, to the client.
    pub fn rate_limit(headers: &mut HeaderMap, limiter: &super::Limiter, left: f64, id: HeaderValue) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |now| now.as_secs());
        let to_full = ((limiter.burst - left) / limiter.refill_per_second).ceil() as u64;
        headers.insert(&LIMIT, HeaderValue::from(limiter.burst as u64));
        headers.insert(&REMAINING, HeaderValue::from(left as u64));
        headers.insert(&RESET, HeaderValue::from(now.saturating_add(to_full)));
        headers.insert(&REQUEST_ID, id);
    }
}
