//! A backend that records what reached it.
//!
//! - `/status/NNN` answers with that status and no body;
//! - `/cost/N[/M...]` answers 200 with an `X-Tokens-Used: N` field (one per value);
//! - `/slow/MS` answers 200 after MS milliseconds;
//! - `/bytes/N` answers 200 with N bytes, made as fast as they are taken;
//! - every other path echoes the request body back (streaming) with status 200, and sends an
//!   `X-RateLimit-Limit: 999` of its own, which the gateway must replace.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

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
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    /// A backend on a chosen port, e.g. the port of one just [`stop`](Self::stop)ped: a
    /// backend restarted in place. Retries the bind for up to 5 s.
    pub async fn start_on(port: u16) -> Backend {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(listener) => return Self::serve(listener),
                // The stopped backend's listener may take a moment to close.
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("cannot bind 127.0.0.1:{port} again: {error}"),
            }
        }
    }

    fn serve(listener: TcpListener) -> Backend {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = seen.clone();
        let task = tokio::spawn(async move {
            // Owned by this task, so stopping the backend closes its open connections too,
            // as a killed process would.
            let mut connections = JoinSet::new();
            loop {
                while connections.try_join_next().is_some() {}
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let recorder = recorder.clone();
                let service = service_fn(move |request| answer(request, recorder.clone()));
                connections.spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Backend { addr, seen, task }
    }

    /// Stop as a killed process would: the port stops listening and every open connection
    /// (the gateway's pooled keep-alive ones included) is closed. Returns once they are.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
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

/// The answer to one request, as described at the top (recorded in `seen`); other backends of
/// the tests (a TLS one) serve it too.
pub async fn answer(
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
    if let Some(costs) = path.strip_prefix("/cost/") {
        // A 200 reporting what it cost: one `X-Tokens-Used` field per `/`-separated value.
        let mut response = Response::new(empty());
        for cost in costs.split('/') {
            response
                .headers_mut()
                .append("x-tokens-used", cost.parse().unwrap());
        }
        return Ok(response);
    }
    if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        return Ok(Response::new(empty()));
    }
    if let Some(size) = path.strip_prefix("/bytes/") {
        // That many bytes, in 64 KiB chunks made as fast as they are taken.
        let size: usize = size.parse().unwrap();
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = (0..size.div_ceil(chunk.len())).map(move |i| {
            let length = (size - i * chunk.len()).min(chunk.len());
            Ok::<_, hyper::Error>(Frame::data(chunk.slice(..length)))
        });
        let mut response = Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed());
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, size.into());
        return Ok(response);
    }
    if path == "/ws" && request.headers().contains_key("upgrade") {
        // An upgrade to the protocol asked for, played as a toy one: after the 101, echo
        // bytes back.
        let protocol = request
            .headers()
            .get("upgrade")
            .cloned()
            .unwrap_or_else(|| "echo".parse().unwrap());
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
        response.headers_mut().insert("upgrade", protocol);
        return Ok(response);
    }
    let mut response = Response::new(request.into_body().boxed());
    response
        .headers_mut()
        .insert("x-ratelimit-limit", "999".parse().unwrap());
    Ok(response)
}
