//! The HTTP face of the gateway: identify the client, pick the rule, ask the limiter, then
//! forward the request or answer it ourselves.
//!
//! - [`identity`]: the client key (peer IP, or `X-Forwarded-For` from trusted proxies).
//! - [`route`]: which rule a path falls under.
//! - [`headers`]: hop-by-hop stripping and `X-Forwarded-*`.
//! - [`response`]: the gateway's own answers (429, 502, 503, 504) and rate-limit headers.
//!
//! Bodies stream both ways: the client's request body is handed to the backend as it arrives,
//! the backend's response body to the client, and nothing is buffered.

pub mod headers;
pub mod identity;
pub mod response;
pub mod route;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version, header};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;

use crate::config::{Backend, Config};
use crate::limit::{Limiter, Rule, Verdict};
use identity::ClientIdentity;
use route::AuthPaths;

/// Body of every response the gateway sends.
pub type ResponseBody = BoxBody<Bytes, hyper::Error>;

/// Why a request could not be proxied; the origin decides the status code.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The backend refused, reset or broke the connection (502).
    #[error("backend unreachable: {0}")]
    Upstream(#[source] hyper_util::client::legacy::Error),
    /// The backend sent no response headers within `BACKEND_TIMEOUT_MS` (504).
    #[error("backend sent no response within {0:?}")]
    UpstreamTimeout(Duration),
    /// The request cannot be turned into a backend request (400).
    #[error("request cannot be forwarded: {0}")]
    Downstream(String),
}

/// Everything a request needs, shared by all connections.
pub struct Proxy {
    /// Pooled HTTP/1.1 client to the backend.
    client: Client<HttpConnector, Incoming>,
    /// `BACKEND_URL`.
    backend: Backend,
    /// Memory or Redis.
    limiter: Limiter,
    /// Rule for paths outside `AUTH_PATHS`.
    general: Rule,
    /// Rule for `AUTH_PATHS`.
    auth: Rule,
    /// `AUTH_PATHS`.
    auth_paths: AuthPaths,
    /// `TRUSTED_PROXIES`.
    identity: ClientIdentity,
    /// `BACKEND_TIMEOUT_MS`.
    backend_timeout: Duration,
}

impl Proxy {
    /// Build the proxy for `config`, deciding with `limiter`.
    pub fn new(config: &Config, limiter: Limiter) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.backend_timeout));
        let client = Client::builder(TokioExecutor::new())
            // Without a timer the idle timeout is silently ignored.
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.backend_idle_timeout)
            .build(connector);
        Proxy {
            client,
            backend: config.backend.clone(),
            limiter,
            general: config.general,
            auth: config.auth,
            auth_paths: config.auth_paths.clone(),
            identity: ClientIdentity::new(config.trusted_proxies.clone()),
            backend_timeout: config.backend_timeout,
        }
    }

    /// Answer one request from `peer`.
    pub async fn handle(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<ResponseBody> {
        let started = Instant::now();
        let client = self.identity.client(peer.ip(), request.headers());
        let rule = if self.auth_paths.matches(request.uri().path()) {
            &self.auth
        } else {
            &self.general
        };
        // Captured only when the per-request line will be written: the request moves on.
        let logged = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| (request.method().clone(), request.uri().path().to_owned()));

        let verdict = self.limiter.check(rule, client, 1).await;
        let (mut response, outcome) = match &verdict {
            Verdict::Decided(decision) if decision.allowed => {
                (self.forward(request, peer.ip()).await, "allowed")
            }
            Verdict::DecidedLocally(decision) if decision.allowed => {
                (self.forward(request, peer.ip()).await, "allowed_locally")
            }
            Verdict::Decided(decision) => (response::too_many_requests(decision), "denied"),
            Verdict::DecidedLocally(decision) => (response::too_many_requests(decision), "denied_locally"),
            Verdict::FailOpen => (self.forward(request, peer.ip()).await, "fail_open"),
            Verdict::FailClosed => (response::store_unavailable(), "fail_closed"),
        };
        if let Some(decision) = verdict.decision() {
            response::set_rate_limit_headers(response.headers_mut(), decision);
        }
        if let Some((method, path)) = logged {
            tracing::debug!(
                %method,
                path,
                %client,
                rule = rule.name.as_str(),
                decision = outcome,
                status = response.status().as_u16(),
                latency_us = started.elapsed().as_micros() as u64,
                "request"
            );
        }
        response
    }

    /// Send an allowed request to the backend and stream its answer back.
    async fn forward(&self, request: Request<Incoming>, peer: IpAddr) -> Response<ResponseBody> {
        match self.try_forward(request, peer).await {
            Ok(response) => response,
            Err(error) => {
                tracing::warn!(%error, "proxying failed");
                response::from_error(&error)
            }
        }
    }

    async fn try_forward(
        &self,
        mut request: Request<Incoming>,
        peer: IpAddr,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        let upgrade = request.version() == Version::HTTP_11 && headers::is_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));

        let (mut parts, body) = request.into_parts();
        let host = parts.headers.get(header::HOST).cloned().or_else(|| {
            // HTTP/2 carries the host in :authority; HTTP/1.1 to the backend needs Host.
            parts
                .uri
                .authority()
                .and_then(|authority| authority.as_str().parse().ok())
        });
        headers::strip_hop_by_hop(&mut parts.headers, upgrade);
        // An IPv4 client on a dual-stack listener is ::ffff:a.b.c.d; the backend sees a.b.c.d.
        let peer = peer.to_canonical();
        headers::set_forwarded(
            &mut parts.headers,
            peer,
            self.identity.is_trusted(peer),
            host.as_ref(),
        );
        if let Some(host) = host {
            parts.headers.insert(header::HOST, host);
        }
        parts.uri = self.backend_uri(&parts.uri)?;
        // The backend speaks HTTP/1.1 whatever the client spoke.
        parts.version = Version::HTTP_11;

        let sent = self.client.request(Request::from_parts(parts, body));
        let mut response = match tokio::time::timeout(self.backend_timeout, sent).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(ProxyError::Upstream(error)),
            Err(_) => return Err(ProxyError::UpstreamTimeout(self.backend_timeout)),
        };

        let switching = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
        match client_upgrade {
            Some(client_upgrade) if switching => {
                let backend_upgrade = hyper::upgrade::on(&mut response);
                tokio::spawn(async move {
                    let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                        Ok(pair) => pair,
                        Err(error) => return tracing::debug!(%error, "upgrade failed"),
                    };
                    let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
                    if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
                        tracing::debug!(%error, "upgraded connection ended");
                    }
                });
                headers::strip_hop_by_hop(response.headers_mut(), true);
            }
            _ => headers::strip_hop_by_hop(response.headers_mut(), false),
        }
        Ok(response.map(BodyExt::boxed))
    }

    /// `BACKEND_URL`'s scheme and host, its path prefix, then the request's path and query.
    fn backend_uri(&self, uri: &Uri) -> Result<Uri, ProxyError> {
        let path_and_query = match uri.path_and_query() {
            // The common case: a cheap clone of the parsed original.
            Some(original) if self.backend.base_path.is_empty() => original.clone(),
            original => {
                let original = original.map_or("/", PathAndQuery::as_str);
                format!("{}{original}", self.backend.base_path)
                    .parse()
                    .map_err(|e: http::uri::InvalidUri| ProxyError::Downstream(e.to_string()))?
            }
        };
        Uri::builder()
            .scheme(self.backend.scheme.clone())
            .authority(self.backend.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| ProxyError::Downstream(e.to_string()))
    }
}
