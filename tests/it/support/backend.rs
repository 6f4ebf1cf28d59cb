//! A backend that records what reached it.
//!
//! - `/status/NNN` answers with that status and no body;
//! - `/slow/MS` answers 200 after MS milliseconds;
//! - every other path echoes the request body back (streaming) with status 200, and sends an
//!   `X-RateLimit-Limit: 999` of its own, which the gateway must replace.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// What the backend saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub uri: String,
    pub headers: HeaderMap,
}

pub struct Backend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    pub async fn start() -> Backend {
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
                let service = service_fn(move |request| answer(request, recorder.clone()));
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Backend { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The last request seen.
    pub fn last(&self) -> Seen {
        self.seen().pop().expect("the backend saw no request")
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    mut request: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<BoxBody<Bytes, hyper::Error>>, Infallible> {
    seen.lock().unwrap().push(Seen {
        uri: request.uri().to_string(),
        headers: request.headers().clone(),
    });
    let path = request.uri().path().to_owned();
    let empty = || Empty::new().map_err(|never| match never {}).boxed();
    if let Some(code) = path.strip_prefix("/status/") {
        let mut response = Response::new(empty());
        *response.status_mut() = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap();
        return Ok(response);
    }
    if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        return Ok(Response::new(empty()));
    }
    if path == "/ws" {
        // An upgrade to a toy protocol: after the 101, echo bytes back.
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            }
        });
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        response
            .headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        response.headers_mut().insert("upgrade", "echo".parse().unwrap());
        return Ok(response);
    }
    let mut response = Response::new(request.into_body().boxed());
    response
        .headers_mut()
        .insert("x-ratelimit-limit", "999".parse().unwrap());
    Ok(response)
}
