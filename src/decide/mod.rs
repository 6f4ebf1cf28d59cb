//! The decision endpoints on `DECIDE_PORT`: tollgate's rules, keys, stores and fail modes for
//! teams that already run an ingress and cannot put a second proxy in front of it. Each is a
//! caller of the [`Gate`], as the proxy is, so a rule means the same thing whichever door a
//! request came in by; none forwards anything.
//!
//! - [`forward_auth`]: `/v1/forward-auth`, for Traefik `ForwardAuth`, Caddy `forward_auth` and
//!   nginx `auth_request`: the original request read from the headers those proxies send;
//! - [`check`]: `POST /v1/check`, the JSON decision API (behind `DECIDE_TOKEN` when set);
//! - Envoy's rate limit service over gRPC (`content-type: application/grpc`) on the same port.
//!
//! The listener is the proxy's [`crate::server::Server`] with this door: HTTP/1.1 and h2c on
//! one port, the same connection limits and clocks.

pub mod check;
pub mod forward_auth;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use subtle::ConstantTimeEq;

use crate::decision_log::Decided;
use crate::gate::{Answers, Gate};
use crate::limit_headers::HeaderStyle;
use crate::proxy::AccessLog;
use crate::refusal::Refusals;
use crate::rules::KeyHasher;
use crate::rules::key::Digest;
use crate::server::{Answered, Arrival, Door};
use crate::telemetry::throttle::LogThrottle;
use crate::telemetry::trace::{RequestSpan, TRACEPARENT};

/// The body of every answer on `DECIDE_PORT`.
pub(crate) type DecideBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// What the decision listener is built from.
#[derive(Debug, Clone)]
pub struct DecideSettings {
    /// `BIND` and `DECIDE_PORT`.
    pub listen: SocketAddr,
    /// `DECIDE_TOKEN`: the bearer token `/v1/check` requires; `None`: none.
    pub token: Option<Token>,
    /// `RATE_LIMIT_HEADERS`: which rate-limit headers the answers carry, as the proxy's do.
    pub headers: HeaderStyle,
    /// `DENY_STATUS` and `DENY_FORMAT`: a forward-auth refusal's status (unless `?status=`
    /// names one) and body, as the proxy's.
    pub(crate) refusals: Refusals,
    /// `FORWARD_RATELIMIT_HEADERS`: a forward-auth `200` carries the draft `RateLimit` and
    /// `RateLimit-Policy` fields whatever `RATE_LIMIT_HEADERS` says, for the calling proxy to
    /// copy onto the request it forwards.
    pub(crate) forward_headers: bool,
    /// `BODY_IDLE_TIMEOUT_MS`: how long a `/v1/check` body may take to arrive whole.
    pub body_timeout: Duration,
    /// `ACCESS_LOG`: which decisions get an `info` line, as the proxy's requests do.
    pub(crate) access_log: AccessLog,
}

/// A bearer token, kept as its digest under a key of this process's own, so that comparing
/// one presented takes the same time whatever it shares with the real one, its length
/// included. Never printed.
#[derive(Clone)]
pub struct Token {
    hasher: KeyHasher,
    digest: Digest,
}

impl Token {
    /// The token `secret`, or `None` when the operating system has no randomness to give.
    pub fn new(secret: &str) -> Option<Token> {
        let hasher = KeyHasher::random().ok()?;
        let digest = hasher.digest(secret.as_bytes());
        Some(Token { hasher, digest })
    }

    /// Whether `authorization` (a request's `Authorization` header) is `Bearer <the token>`,
    /// the scheme in any case (RFC 9110, section 11.1), the token compared in constant time.
    pub fn authorizes(&self, authorization: Option<&http::HeaderValue>) -> bool {
        let Some(value) = authorization.map(http::HeaderValue::as_bytes) else {
            return false;
        };
        match value.split_at_checked(7) {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => self.matches(token),
            _ => false,
        }
    }

    /// Whether `presented` is the token, in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let presented = self.hasher.digest(presented);
        presented.to_bytes().ct_eq(&self.digest.to_bytes()).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

/// The decision endpoints, as the decision listener's door.
pub struct Decide {
    /// Decides every request, as it does the proxy's.
    gate: Arc<Gate>,
    /// `RATE_LIMIT_HEADERS`, `DENY_STATUS`, `DENY_FORMAT`, `FORWARD_RATELIMIT_HEADERS`: the
    /// answers every door shares.
    answers: Answers,
    /// `DECIDE_TOKEN`, `RATE_LIMIT_HEADERS`, the body clock.
    settings: DecideSettings,
    /// Paces the warning about calls from peers outside `TRUSTED_PROXIES`, which a
    /// misconfigured ingress repeats on every request.
    untrusted_log: LogThrottle,
    /// Paces the refusals' lines under `ACCESS_LOG=denied`, as the proxy's are paced.
    denial_log: LogThrottle,
    /// Envoy's rate limit service (`RLS_CONFIG`), for `application/grpc` requests.
    rls: Option<crate::rls::Server>,
}

impl Decide {
    /// The line about one decision, as the proxy writes one per request: refusals at `info`
    /// under `ACCESS_LOG=denied` (paced, with how many were suppressed), every decision under
    /// `all`, a shadow rule's would-be refusals whatever it says; the rest at `debug`. Nothing
    /// is formatted for a line no one reads.
    pub(crate) fn log(&self, decided: &Decided<'_>) {
        crate::decision_log::log(self.settings.access_log, &self.denial_log, decided);
    }
}

/// The paths served, for the `404`'s body.
const PATHS: &str = "/v1/forward-auth, /v1/check";

impl Decide {
    /// The doors of `settings`, deciding with `gate`.
    pub fn new(settings: DecideSettings, gate: Arc<Gate>) -> Decide {
        Decide {
            gate,
            answers: Answers::new(
                settings.headers,
                settings.refusals.clone(),
                settings.forward_headers,
            ),
            settings,
            untrusted_log: LogThrottle::new(),
            denial_log: LogThrottle::new(),
            rls: None,
        }
    }

    /// These doors with Envoy's rate limit service beside them, answering `application/grpc`.
    pub fn with_rls(mut self, rls: crate::rls::Server) -> Decide {
        self.rls = Some(rls);
        self
    }

    /// A gRPC call to the rate limit service: tonic's server answers it (a gRPC error for a
    /// method it does not serve), its body boxed as the other doors'.
    async fn grpc(&self, rls: &crate::rls::Server, request: Request<Incoming>) -> Response<DecideBody> {
        use tonic::codegen::Service;
        let mut server = rls.clone();
        // Always ready: it holds no connection of its own.
        let Ok(()) =
            std::future::poll_fn(|cx| Service::<Request<Incoming>>::poll_ready(&mut server, cx)).await;
        let Ok(response) = server.call(request).await;
        response.map(|body| {
            body.map_err(|status| Box::new(status) as Box<dyn std::error::Error + Send + Sync>)
                .boxed_unsync()
        })
    }
}

impl Door for Decide {
    type Body = DecideBody;

    async fn handle(&self, request: Request<Incoming>, arrival: Arrival) -> Answered<DecideBody> {
        // Traces off: `None`, and nothing read for them.
        let span = self.gate.traces().map(|traces| {
            let traceparent = request.headers().contains_key(&TRACEPARENT);
            traces.request_span(&request, arrival.connection.address.ip(), traceparent)
        });
        // Nothing follows an answer here: no request is carried out behind this door.
        let response = self.answer(request, arrival, span.as_ref()).await;
        if let Some(span) = span {
            span.end(response.status().as_u16());
        }
        Answered::plain(response)
    }
}

impl Decide {
    /// Route one request to its endpoint, telling its `span` (traces on) which.
    async fn answer(
        &self,
        request: Request<Incoming>,
        arrival: Arrival,
        span: Option<&RequestSpan>,
    ) -> Response<DecideBody> {
        if let Some(overload) = arrival.overloaded {
            let reason = format!("too many requests in flight ({})", overload.variable());
            return error(StatusCode::SERVICE_UNAVAILABLE, &reason, None);
        }
        if let Some(rls) = &self.rls
            && request
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
        {
            let mut request = request;
            if let Some(span) = span {
                let route = crate::rls::ROUTE;
                span.door("rls", (request.uri().path() == route).then_some(route));
                // For the service to tell it the descriptor's decision.
                request.extensions_mut().insert(span.clone());
            }
            return self.grpc(rls, request).await;
        }
        match request.uri().path() {
            forward_auth::PATH => {
                if let Some(span) = span {
                    span.door("forward-auth", Some(forward_auth::PATH));
                }
                forward_auth::answer(self, &request, arrival.connection.address, span).await
            }
            check::PATH => {
                if let Some(span) = span {
                    span.door("check", Some(check::PATH));
                }
                if request.method() != Method::POST {
                    let mut response = error(StatusCode::METHOD_NOT_ALLOWED, "use POST", None);
                    response
                        .headers_mut()
                        .insert(header::ALLOW, HeaderValue::from_static("POST"));
                    return response;
                }
                check::answer(self, request, arrival.connection.address, span).await
            }
            _ => error(
                StatusCode::NOT_FOUND,
                &format!("not found: the decision endpoints are {PATHS}"),
                None,
            ),
        }
    }
}

/// A JSON body with `status`.
fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<DecideBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `{"error": reason, "field": field}`, with `status`.
fn error(status: StatusCode, reason: &str, field: Option<&str>) -> Response<DecideBody> {
    let body = match field {
        Some(field) => serde_json::json!({ "error": reason, "field": field }),
        None => serde_json::json!({ "error": reason }),
    };
    json(status, body.to_string())
}

fn full(body: impl Into<Bytes>) -> DecideBody {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}
