//! The floor for `scripts/bench_decide.sh`: what answering a decision costs when the answer is
//! a constant, so that what tollgate's decision endpoints spend above it is theirs alone.
//!
//! hyper-util's `auto` server (HTTP/1.1 and h2c with prior knowledge on one port, as tollgate's
//! `DECIDE_PORT` listener), on the runtime `#[tokio::main]` builds (one worker when the process
//! is pinned to one core, as tollgate's is in the bench). Every request is answered at once:
//!
//! - `/v1/check`: the request body is read whole first (tollgate cannot decide before it has
//!   it), then `200` with a constant JSON body of the size of tollgate's answer with every
//!   request allowed, and the same `Content-Type`;
//! - any other path (`/v1/forward-auth` in the bench): `200` with an empty body.
//!
//! Deliberately missing: parsing anything (headers, JSON), the rule table, the limiter, the
//! rate-limit headers, metrics, logs, timeouts and connection limits. Not a thing to deploy.
//!
//! Environment: `PORT` (default 8083).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// tollgate's answer to `{"rule":"general","key":"tenant-1"}` with a budget of a billion tokens,
/// byte for byte as it was when this floor was written (its numbers move; its size barely).
const CHECK_ANSWER: &[u8] = br#"{"allowed":true,"rule":"general","limit":1000000000,"remaining":999999999,"reset_after_ms":0,"retry_after_s":null,"outcome":"allowed"}"#;

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() != "/v1/check" {
        return Ok(Response::new(Full::new(Bytes::new())));
    }
    if request.into_body().collect().await.is_err() {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(response);
    }
    let mut response = Response::new(Full::new(Bytes::from_static(CHECK_ANSWER)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|port| port.parse().ok())
        .unwrap_or(8083);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "decision floor (HTTP/1.1 and h2c) listening on http://{}",
        listener.local_addr()?
    );
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            // Connection errors (a client resetting, say) are the client's business here.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}
