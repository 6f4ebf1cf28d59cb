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
//! Environment: `PORT` (default 8082), `BACKEND_URL` (`http://host:port`, default
//! `http://127.0.0.1:8000`), `MAX_TOKENS` and `REFILL_RATE` (default 10 and 1).

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
    /// Take one token from `key`'s bucket if it has one.
    fn allow(&self, key: IpAddr) -> bool {
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
            true
        } else {
            false
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
                    if !limiter.allow(peer.ip()) {
                        return Ok::<_, hyper::Error>(status(StatusCode::TOO_MANY_REQUESTS));
                    }
                    Ok(match upstream.send(request).await {
                        Ok(response) => response.map(Either::Left),
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
