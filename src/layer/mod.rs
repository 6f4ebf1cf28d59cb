//! The gate as a tower layer (feature `layer`): tollgate's decision in front of any tower
//! [`Service`] of [`http::Request`]s, in the app's own process (axum, tonic, hyper).
//!
//! The layer is a door like the proxy: it admits a request through the same gate (its
//! path read once and refused as the gateway refuses it, the client's address from the
//! connection with the same `TRUSTED_PROXIES` walk of `X-Forwarded-For`, the rule table,
//! keys, algorithms, overrides, tiers, costs, delays, the store and its fail mode, the
//! denial cache), answers a refusal as the gateway does (the same status, body and
//! `Retry-After`), and otherwise calls the app; after the app's answer it settles (a
//! `count=failures` success refunded, `RESPONSE_COST_HEADER`'s cost charged) and adds the
//! rate-limit headers. A request's concurrency places are held by its response body until
//! the last frame has been sent.
//!
//! Built two ways: from the binary's own variables ([`RateLimitLayer::from_env`]) or in code
//! ([`Builder`]); both go through the same parsing as the binary, so a setting means the same
//! and an error names the same variable. docs/embedding.md shows it in axum and in tonic.
//!
//! What stays the app's: its listener, TLS, connection limits and timeouts, request bodies
//! (the gateway's `BODY_*` settings), upgrades (`MAX_UPGRADES_PER_CLIENT`), CORS preflights.

mod body;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use tower_service::Service;

pub use body::{BoxError, LayerBody};

use crate::config::{Config, ConfigError};
use crate::gate::{self, Answers, Gate, Refuse, Refused};
use crate::metrics::{Format, Metrics};
use crate::outcome::Outcome;
use crate::proxy::{ProxySettings, response};
use crate::telemetry::throttle::LogThrottle;
use crate::telemetry::trace::{RequestSpan, TRACEPARENT};

/// The backend the configuration's parser is given when the app sets none: the layer's
/// backend is the service it wraps, and this address is never connected to.
const NO_BACKEND: &str = "http://embedded.invalid";

/// Where the layer finds a request's TCP peer: a function of the request's extensions (the
/// connection's address, put there by the server). See [`Builder::peer_addr`].
pub type PeerAddrFn = fn(&http::Extensions) -> Option<SocketAddr>;

/// The client's TCP address, for a server that is not axum's: put it in each request's
/// extensions (a hyper `service_fn` that knows its connection's peer, a tonic interceptor), or
/// name another type with [`Builder::peer_addr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Why a layer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// A variable (or the rules file) is not valid: the error names it.
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    /// The store could not be set up (a Redis target the client refuses), or `STATE_FILE`.
    #[error("{0}")]
    Start(#[from] crate::ServeError),
    /// Built outside a Tokio runtime: the layer's store and upkeep run on the one it is built in.
    #[error(
        "the rate limit layer must be built inside a Tokio runtime (in `#[tokio::main]`, or within \
         `Runtime::enter`): its store and upkeep run there"
    )]
    NoRuntime,
}

/// The default [`PeerAddrFn`]: axum's `ConnectInfo<SocketAddr>` (with the `axum` feature),
/// else a [`PeerAddr`].
fn default_peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(address)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*address);
    }
    extensions.get::<PeerAddr>().map(|peer| peer.0)
}

/// A [`RateLimitLayer`] set up in code: variables by name (the binary's, [`Builder::var`]) or
/// through the typed setters, then [`Builder::build`]. Every setting is parsed as the binary
/// parses its environment, so a wrong one is the same error naming the same variable.
///
/// ```no_run
/// # async fn run() -> Result<(), tollgate::layer::LayerError> {
/// use tollgate::layer::RateLimitLayer;
/// let layer = RateLimitLayer::builder()
///     .limits("token_bucket:100:10")
///     .routes("/search=fixed_window:10:60,method=GET")
///     .redis("redis://127.0.0.1:6379")
///     .fail_mode(tollgate::rules::FailMode::Open)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    /// The variables, as the binary reads them (a later one wins).
    vars: Vec<(String, String)>,
    /// Where the TCP peer is found.
    peer: PeerAddrFn,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

impl Builder {
    /// Every setting at its default (`.env.example`): the general rule and the auth rule, in
    /// memory.
    pub fn new() -> Builder {
        Builder {
            vars: Vec::new(),
            peer: default_peer_addr,
        }
    }

    /// The process environment's variables, as the binary reads them (a variable that is not
    /// UTF-8 is an error when it is one of ours, and ignored otherwise).
    pub fn from_env() -> Result<Builder, LayerError> {
        let mut builder = Builder::new();
        for (name, value) in std::env::vars_os() {
            let Ok(name) = name.into_string() else {
                continue;
            };
            match value.into_string() {
                Ok(value) => builder.vars.push((name, value)),
                Err(_) => {
                    if let Some(var) = crate::variables::ALL.iter().find(|known| known.name == name) {
                        return Err(ConfigError::InvalidSecret {
                            var: var.name,
                            expected: "valid UTF-8 text".into(),
                        }
                        .into());
                    }
                }
            }
        }
        Ok(builder)
    }

    /// Set the variable `name` (any of `.env.example`'s) to `value`.
    pub fn var(mut self, name: &str, value: impl Into<String>) -> Builder {
        self.vars.push((name.to_owned(), value.into()));
        self
    }

    /// `ROUTES`: rules of their own, `PATTERN=LIMITS[,option]...` joined by `;`.
    pub fn routes(self, routes: &str) -> Builder {
        self.var(crate::variables::ROUTES.name, routes)
    }

    /// `LIMITS`: the general rule's limits, `ALGORITHM:A:B` joined by `+`.
    pub fn limits(self, limits: &str) -> Builder {
        self.var(crate::variables::LIMITS.name, limits)
    }

    /// `AUTH_PATHS` and `AUTH_LIMITS`: the stricter rule of the login paths.
    pub fn auth(self, paths: &str, limits: &str) -> Builder {
        self.var(crate::variables::AUTH_PATHS.name, paths)
            .var(crate::variables::AUTH_LIMITS.name, limits)
    }

    /// `RULES_FILE`: the rule table from a TOML file, reloaded when it changes (every
    /// `RULES_RELOAD_INTERVAL_MS`; SIGHUP is the app's).
    pub fn rules_file(self, path: &str) -> Builder {
        self.var(crate::variables::RULES_FILE.name, path)
    }

    /// `KEY_BY`: what the general rule keys budgets by (`ip`, `header:X-API-Key`, ...).
    pub fn key_by(self, key_by: &str) -> Builder {
        self.var(crate::variables::KEY_BY.name, key_by)
    }

    /// `REDIS_URL`: budgets in one Redis, shared with every gateway and app on it.
    pub fn redis(self, url: &str) -> Builder {
        self.var(crate::variables::REDIS_URL.name, url)
    }

    /// `REDIS_CLUSTER_NODES`: budgets in a Redis Cluster (seed nodes, `host:port,...`).
    pub fn redis_cluster(self, nodes: &str) -> Builder {
        self.var(crate::variables::REDIS_CLUSTER_NODES.name, nodes)
    }

    /// `REDIS_SENTINELS` and `REDIS_SENTINEL_MASTER`: the master Sentinels name.
    pub fn redis_sentinels(self, sentinels: &str, master: &str) -> Builder {
        self.var(crate::variables::REDIS_SENTINELS.name, sentinels)
            .var(crate::variables::REDIS_SENTINEL_MASTER.name, master)
    }

    /// `FAIL_MODE`: what a request gets while the store cannot decide.
    pub fn fail_mode(self, mode: crate::rules::FailMode) -> Builder {
        self.var(crate::variables::FAIL_MODE.name, mode.as_str())
    }

    /// `RATE_LIMIT_HEADERS`: `legacy`, `draft`, `both` or `none`.
    pub fn headers(self, style: &str) -> Builder {
        self.var(crate::variables::RATE_LIMIT_HEADERS.name, style)
    }

    /// `TRUSTED_PROXIES`: the peers whose `X-Forwarded-For` is believed.
    pub fn trusted_proxies(self, networks: &str) -> Builder {
        self.var(crate::variables::TRUSTED_PROXIES.name, networks)
    }

    /// `RESPONSE_COST_HEADER`: the app's response header saying what a request really cost
    /// (taken out of what the client gets).
    pub fn response_cost_header(self, name: &str) -> Builder {
        self.var(crate::variables::RESPONSE_COST_HEADER.name, name)
    }

    /// Where the client's TCP address is found in a request's extensions. The default reads
    /// axum's `ConnectInfo<SocketAddr>` (feature `axum`) and [`PeerAddr`]; tonic's server puts
    /// a `TcpConnectInfo` there:
    /// `|extensions| extensions.get::<TcpConnectInfo>()?.remote_addr()`.
    pub fn peer_addr(mut self, peer: PeerAddrFn) -> Builder {
        self.peer = peer;
        self
    }

    /// The layer: its store (Redis connected lazily: this does not wait for it), its metrics,
    /// and its upkeep (idle clients purged, `RULES_FILE` reloaded), spawned on the current Tokio
    /// runtime and stopped when the last clone of the layer is dropped. Call it inside a
    /// Tokio runtime.
    pub fn build(self) -> Result<RateLimitLayer, LayerError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LayerError::NoRuntime);
        }
        let mut vars = self.vars;
        let backend = crate::variables::BACKEND_URL.name;
        if vars.iter().any(|(name, _)| name == backend) {
            tracing::warn!(
                "BACKEND_URL is set but the layer does not proxy: the service it wraps is its backend"
            );
        } else {
            vars.push((backend.to_owned(), NO_BACKEND.to_owned()));
        }
        let config = Config::from_vars(vars)?;
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        if config.state_file().is_some() {
            tracing::warn!(
                "STATE_FILE is the binary's: the layer neither restores nor saves budgets (use Redis to keep them)"
            );
        }
        RateLimitLayer::of_config(&config, self.peer)
    }
}

/// The gate as a tower [`Layer`](tower_layer::Layer): wraps a service in a [`RateLimit`].
/// Cheap to clone (one `Arc`); every clone shares one gate, store and metrics.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.gate.current().rules().len())
            .finish_non_exhaustive()
    }
}

/// What every request through the layer reads.
struct Shared {
    /// The one door to policy.
    gate: Arc<Gate>,
    /// The gate's registry, for the app to serve.
    metrics: Arc<Metrics>,
    /// Every door's answers: refusals, rate-limit headers, the budget told to the app.
    answers: Answers,
    /// The proxy's settings the layer reads besides: `RESPONSE_COST_HEADER`,
    /// `METHOD_OVERRIDE`, `UNDERSCORE_HEADERS`, `CORS_ALLOW_ORIGINS`.
    settings: ProxySettings,
    /// Where the TCP peer is found.
    peer: PeerAddrFn,
    /// A missing peer address is logged once in a while, not per request.
    missing_peer_log: LogThrottle,
    /// The idle purge and the reloads, stopped with the last clone.
    upkeep: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for task in &self.upkeep {
            task.abort();
        }
    }
}

impl RateLimitLayer {
    /// A [`Builder`] with every setting at its default.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The layer of the binary's own variables (`ROUTES`, `REDIS_URL`, `RULES_FILE`, ...: every
    /// one in `.env.example`, read from the process environment; `.env` is the app's to load).
    /// Call it inside a Tokio runtime.
    pub fn from_env() -> Result<RateLimitLayer, LayerError> {
        Builder::from_env()?.build()
    }

    /// The layer of a parsed configuration (one with a `BACKEND_URL`, which it ignores).
    fn of_config(config: &Config, peer: PeerAddrFn) -> Result<RateLimitLayer, LayerError> {
        let Some(settings) = config.proxy.clone() else {
            return Err(ConfigError::Missing {
                var: crate::variables::BACKEND_URL.name,
                expected: "the layer's answers are the proxy's settings",
            }
            .into());
        };
        let (gate, metrics) = crate::app::standalone_gate(config)?;
        let mut upkeep = vec![tokio::spawn(crate::app::purge_idle(gate.clone()))];
        if config.reloads_rules() {
            upkeep.push(tokio::spawn(crate::app::watch_rules(
                Arc::new(config.clone()),
                None,
                gate.clone(),
                metrics.clone(),
                None,
                None,
            )));
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                gate,
                metrics,
                answers: Answers::new(
                    settings.headers,
                    settings.refusals.clone(),
                    settings.forward_headers,
                ),
                settings,
                peer,
                missing_peer_log: LogThrottle::new(),
                upkeep,
            }),
        })
    }

    /// `inner` behind the gate: what [`Layer::layer`](tower_layer::Layer::layer) makes, for an
    /// app without `tower` in its own dependencies. Wrap a whole axum `Router` (rather than
    /// `Router::layer`, which routes first): then the router routes the path the rules
    /// matched (dot segments resolved), and a request no route serves is decided too;
    /// `Router::new().fallback_service(layer.wrap(router))` serves it with `axum::serve`.
    pub fn wrap<S>(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }

    /// The gate the layer admits through, for a door of the app's own beside the layer (a
    /// framework that is not tower's, a WebSocket's messages): [`Gate::admit`], then
    /// [`Answers::refusal`](crate::Answers::refusal) or the app's work, then
    /// [`Admission::settle`](crate::Admission::settle).
    pub fn gate(&self) -> &Gate {
        &self.shared.gate
    }

    /// How the gateway answers (refusals, rate-limit headers), for such a door.
    pub fn answers(&self) -> &Answers {
        &self.shared.answers
    }

    /// The gate's metrics in the Prometheus text format (`OpenMetrics`: OpenMetrics 1.0.0),
    /// for the app to serve where it likes (`GET /metrics` on an admin port).
    pub fn encode_metrics(&self, openmetrics: bool) -> Result<String, std::fmt::Error> {
        let format = match openmetrics {
            true => Format::OpenMetrics,
            false => Format::Prometheus,
        };
        self.shared.metrics.encode(format)
    }
}

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        self.wrap(inner)
    }
}

/// A service behind the gate: see the [module](self).
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<LayerBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The one made ready is the one called (tower's rule); its clone waits for the next.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        let shared = self.shared.clone();
        Box::pin(async move { shared.respond(inner, request).await })
    }
}

impl Shared {
    /// A request's way: admit, act (call the app, or answer for it), settle.
    async fn respond<S, ReqBody, ResBody>(
        &self,
        inner: S,
        request: Request<ReqBody>,
    ) -> Result<Response<LayerBody<ResBody>>, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let Some(peer) = (self.peer)(request.extensions()) else {
            return Ok(self.missing_peer());
        };
        let Some(traces) = self.gate.traces() else {
            return self.admit_and_act(inner, request, peer, None).await;
        };
        let traceparent = request.headers().contains_key(&TRACEPARENT);
        let span = traces.request_span(&request, peer.ip(), traceparent);
        let response = self.admit_and_act(inner, request, peer, Some(&span)).await;
        // An app's error is no response: the server answers it as a failure.
        span.end(
            response
                .as_ref()
                .map_or(500, |response| response.status().as_u16()),
        );
        response
    }

    /// [`Shared::respond`]'s way past the client's address, with its `span` when traces are
    /// on.
    async fn admit_and_act<S, ReqBody, ResBody>(
        &self,
        mut inner: S,
        mut request: Request<ReqBody>,
        peer: std::net::SocketAddr,
        span: Option<&RequestSpan>,
    ) -> Result<Response<LayerBody<ResBody>>, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let origin = self
            .settings
            .cors
            .as_ref()
            .and_then(|cors| cors.origin_of(request.headers()));
        let gate_answer = |mut answer: Response<body::GateBody>| {
            if let (Some(cors), Some(origin)) = (&self.settings.cors, origin.clone()) {
                cors.apply(answer.headers_mut(), origin);
            }
            answer.map(LayerBody::gate)
        };
        // As the proxy: a header spelt with `_` beside one that keys budgets is refused, and
        // under `METHOD_OVERRIDE=strip` the app reads the method the gate decides on.
        if self.settings.underscore_headers == crate::proxy::headers::UnderscoreHeaders::Forward
            && let Some(name) =
                crate::proxy::headers::underscore_alias(request.headers(), self.gate.current().key_headers())
        {
            let reason = format!("the {name} header is also sent spelled with '_'");
            return Ok(gate_answer(response::bad_request(&reason)));
        }
        self.settings.method_override.apply(request.headers_mut());
        // Upgrades are the app's server's (MAX_UPGRADES_PER_CLIENT is the gateway's).
        let head = gate::Head::of(&request, peer.ip(), false);
        // Admit.
        let admission = match self.gate.admit(&head).await {
            Ok(admission) => admission,
            Err(Refused::Ambiguous(reason) | Refused::Headers(reason)) => {
                tracing::debug!(%peer, path = request.uri().path(), reason, "refused an ambiguous request");
                self.metrics.response(None, StatusCode::BAD_REQUEST.as_u16());
                return Ok(gate_answer(response::bad_request(&reason)));
            }
            Err(Refused::Tunnels(limit)) => return Ok(gate_answer(response::too_many_upgrades(limit))),
        };
        if let Some(span) = span {
            span.admitted(admission.traced());
        }
        // Act: the app, or the gate's own answer (with its rate-limit headers).
        let refusal = self
            .answers
            .refusal(&admission, request.headers(), Refuse::Client);
        let forwarded = refusal.is_none();
        let mut response = match refusal {
            None => {
                // The app reads the path the rules matched (dot segments resolved, slashes
                // merged), and under FORWARD_RATELIMIT_HEADERS the budget its client is told.
                if let Some(uri) = admission
                    .rewritten()
                    .and_then(|rewritten| rewritten_uri(request.uri(), rewritten))
                {
                    *request.uri_mut() = uri;
                }
                self.answers.set_forwarded(&admission, request.headers_mut());
                if let Some(span) = span {
                    span.inject(request.headers_mut());
                }
                // An error drops the admission unsettled: its places go back.
                inner.call(request).await?.map(LayerBody::app)
            }
            Some(refusal) => {
                gate_answer(refusal.map(|body| Full::new(body).map_err(|never| match never {}).boxed()))
            }
        };
        // Settle.
        let reported = crate::proxy::reported_cost(
            self.settings.response_cost_header.as_ref(),
            response.headers_mut(),
            &self.metrics,
        );
        if forwarded {
            self.answers.set_headers(&admission, response.headers_mut());
        }
        if admission.outcome() == Outcome::Shadow {
            tracing::info!(client = %admission.key(), rule = %admission.rule().name, "shadow rule would have refused this request; forwarded");
        }
        self.metrics
            .response(admission.series().map(Arc::as_ref), response.status().as_u16());
        let settled = admission.settle(response.status().as_u16(), reported).await;
        Ok(response.map(|body| body.holding(settled)))
    }

    /// `500`, and a line saying how to give the layer the client's address.
    fn missing_peer<B>(&self) -> Response<LayerBody<B>> {
        if let Some(suppressed) = self.missing_peer_log.admit() {
            tracing::error!(
                suppressed,
                "tollgate layer: the request carries no client address, so it cannot be rate limited \
                 (answered 500). Serve an axum app with `into_make_service_with_connect_info::<SocketAddr>()` \
                 (tollgate's `axum` feature reads its ConnectInfo), or put a `tollgate::layer::PeerAddr` in \
                 each request's extensions, or name where it is with `Builder::peer_addr`"
            );
        }
        self.metrics
            .response(None, StatusCode::INTERNAL_SERVER_ERROR.as_u16());
        response::refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the rate limiter cannot tell the client's address",
        )
        .map(LayerBody::gate)
    }
}

/// `uri` with the path `rewritten` (its query kept); `None` if that is no URI (it is one: the
/// canonical path is built from the request's own).
fn rewritten_uri(uri: &Uri, rewritten: &str) -> Option<Uri> {
    let path_and_query = match uri.query() {
        Some(query) => format!("{rewritten}?{query}"),
        None => rewritten.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}
