//! The floor for `scripts/bench.sh`: what "hyper + a rate limiter" costs with nothing else.
//!
//! A minimal reverse proxy built from the crates tollgate uses: hyper's HTTP/1.1 server (or,
//! with `BARE_H2=1`, its HTTP/2 server speaking h2c with prior knowledge), hyper-util's pooled
//! legacy client, and a keyed token bucket in a `Mutex<HashMap<IpAddr, Bucket>>`. Each request
//! is checked against its client's bucket, answered `429` with an empty body when over budget,
//! and otherwise forwarded to the backend with an `X-Forwarded-For` line appended (what nginx's
//! `proxy_add_x_forwarded_for` does in the bench), the response streamed back as it arrives.
//!
//! Deliberately missing, so that every microsecond tollgate spends above this is visible: rule
//! matching, path canonicalisation, hop-by-hop header handling, rate-limit response headers,
//! request ids, metrics, timeouts, connection limits, graceful shutdown, upgrades and any
//! bound on the number of clients held. Not a thing to deploy.
//!
//! The limiter is a plain mutex and hash map rather than the `governor` crate, so the floor
//! adds no dependency to tollgate's build; one uncontended lock and one SipHash lookup per
//! request cost well under a microsecond, which is noise next to the tens of microseconds of
//! HTTP and TCP work per request.
//!
//! Environment: `PORT` (default 8081), `BACKEND_URL` (default `http://127.0.0.1:8000`),
//! `MAX_TOKENS` and `REFILL_RATE` (the bucket: burst and tokens per second, default 10 and 1),
//! `BARE_H2=1` (serve h2c instead of HTTP/1.1), `BARE_KEY_BY_XFF=1` (key by the last address
//! in `X-Forwarded-For`, like tollgate with `TRUSTED_PROXIES` set to the load generator).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

type Body = Either<Incoming, Empty<Bytes>>;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// One client's token bucket.
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Everything a request needs, shared by all connections.
struct Floor {
    client: Client<HttpConnector, Incoming>,
    /// `http://host:port` of the backend, to which each request's path and query are appended.
    backend: String,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
    burst: f64,
    refill_per_second: f64,
    key_by_xff: bool,
}

impl Floor {
    /// Take one token from `key`'s bucket if it has one.
    fn allow(&self, key: IpAddr) -> bool {
        let now = Instant::now();
        // A poisoned lock only means another request panicked mid-update; the numbers are fine.
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

    async fn handle(&self, mut request: Request<Incoming>, peer: IpAddr) -> Response<Body> {
        let key = if self.key_by_xff {
            request
                .headers()
                .get(X_FORWARDED_FOR)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.rsplit(',').next())
                .and_then(|last| last.trim().parse().ok())
                .unwrap_or(peer)
        } else {
            peer
        };
        if !self.allow(key) {
            return status(StatusCode::TOO_MANY_REQUESTS);
        }
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = format!("{}{path}", self.backend).parse::<Uri>() else {
            return status(StatusCode::BAD_REQUEST);
        };
        *request.uri_mut() = uri;
        // The backend speaks HTTP/1.1, whatever the client spoke.
        *request.version_mut() = Version::HTTP_11;
        if let Ok(value) = HeaderValue::from_str(&peer.to_string()) {
            request.headers_mut().append(X_FORWARDED_FOR, value);
        }
        match self.client.request(request).await {
            Ok(response) => response.map(Either::Left),
            Err(_) => status(StatusCode::BAD_GATEWAY),
        }
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = code;
    response
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = env_or("PORT", 8081);
    let h2 = std::env::var("BARE_H2").is_ok_and(|v| v == "1");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let floor = Arc::new(Floor {
        client: Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(connector),
        backend: env_or("BACKEND_URL", "http://127.0.0.1:8000".to_owned())
            .trim_end_matches('/')
            .to_owned(),
        buckets: Mutex::new(HashMap::new()),
        burst: env_or("MAX_TOKENS", 10.0),
        refill_per_second: env_or("REFILL_RATE", 1.0),
        key_by_xff: std::env::var("BARE_KEY_BY_XFF").is_ok_and(|v| v == "1"),
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "bare proxy ({}) listening on http://{} -> {}",
        if h2 { "h2c" } else { "HTTP/1.1" },
        listener.local_addr()?,
        floor.backend
    );
    loop {
        let (stream, peer): (_, SocketAddr) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let floor = floor.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let floor = floor.clone();
                async move { Ok::<_, Infallible>(floor.handle(request, peer.ip()).await) }
            });
            let io = TokioIo::new(stream);
            // Connection errors (a client resetting, say) are the client's business here.
            let _ = if h2 {
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
            };
        });
    }
}
