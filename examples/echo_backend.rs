//! A tiny backend for trying tollgate out (`scripts/demo.sh` runs it behind the gateway).
//!
//! Listens on `127.0.0.1:$PORT` (default 8000), HTTP/1.1, and answers:
//! - `POST` and `PUT`: 200, the request body streamed back as it arrives;
//! - `/status/NNN`: status NNN (200-599), with the JSON below unless the status allows no body;
//! - anything else: 200, `{"method":..,"path":..,"client":..}`, where `client` is the
//!   `X-Forwarded-For` header the gateway sent, or `null`.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, hyper::Error>;

async fn answer(request: Request<Incoming>) -> Result<Response<Body>, hyper::http::Error> {
    let response = Response::builder();
    if matches!(*request.method(), Method::POST | Method::PUT) {
        let response = match request.headers().get(CONTENT_TYPE) {
            Some(content_type) => response.header(CONTENT_TYPE, content_type),
            None => response,
        };
        return response.body(request.into_body().boxed());
    }
    let status = match request.uri().path().strip_prefix("/status/") {
        None => StatusCode::OK,
        Some(code) => code
            .parse::<u16>()
            .ok()
            .filter(|code| (200..600).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
            .unwrap_or(StatusCode::BAD_REQUEST),
    };
    let response = response.status(status).header(CONTENT_TYPE, "application/json");
    if matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED) {
        return response.body(Empty::new().map_err(|never| match never {}).boxed());
    }
    let client = request
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok());
    let json = format!(
        r#"{{"method":{},"path":{},"client":{}}}"#,
        quote(request.method().as_str()),
        quote(request.uri().path()),
        client.map_or_else(|| "null".to_owned(), quote),
    );
    response.body(
        Full::new(Bytes::from(json))
            .map_err(|never| match never {})
            .boxed(),
    )
}

/// A JSON string literal (`{:?}` would escape the Rust way, not the JSON way).
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => out.extend(['\\', c]),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out + "\""
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!("echo backend listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer));
            if let Err(error) = connection.await {
                eprintln!("echo backend: {error}");
            }
        });
    }
}
