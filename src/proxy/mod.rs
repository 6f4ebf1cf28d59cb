//! The reverse proxy, a caller of the gate: strict checks, then admit ([`Gate::admit`]), act
//! (forward the request, or answer with the gate's shared refusal), settle (the
//! [`Admission`](crate::gate::Admission), consumed, leaves its concurrency places to the
//! response body). Each phase of a request's way is one function of [`Proxy`]: `respond` (the
//! phases in order), `forward` (the backend: `backend_request`, the pool, `switch`), `log`
//! (after the answer).
//!
//! - [`strict`]: request heads HTTP/1.1 does not allow (`CONNECT`, two `Host`s, ...), refused
//!   first; the host a request is for.
//! - [`headers`]: hop-by-hop stripping, `X-Forwarded-*`, `X-Real-IP` and `Forwarded`.
//! - [`backend`]: the backend's connections, kept alive and reused.
//! - [`tls`]: TLS to an `https` backend (`BACKEND_CA_FILE`, `BACKEND_TLS_SERVER_NAME`).
//! - [`body`]: the client's request body, watched so a body that breaks off is the client's
//!   fault (400, 408), not the backend's.
//! - [`response`]: the gateway's own answers that are no admission's (400, 429 for tunnels,
//!   502, 503, 504); refusals, the `503` of an unavailable store and the rate-limit headers are
//!   the gate's ([`crate::gate::answer`]), shared with the other doors.
//! - [`upgrades`]: the protocols that may be upgraded to (`UPGRADE_PROTOCOLS`), and the tunnel
//!   after a `101`.
//!
//! What is counted is what is forwarded: the path the rules matched is the path the backend
//! gets (byte for byte, or with its dot segments resolved), and a request that could be read
//! two ways is refused before any budget is touched.
//!
//! Bodies stream both ways: the client's request body is handed to the backend as it arrives,
//! the backend's response body to the client, and nothing is buffered. `BACKEND_TIMEOUT_MS`
//! counts from the end of the request body; before that, a client that pauses mid-body is
//! bounded by `BODY_IDLE_TIMEOUT_MS` and a backend that stops reading it by
//! `BACKEND_TIMEOUT_MS`.

pub(crate) mod backend;
pub(crate) mod body;
pub(crate) mod cors;
pub mod headers;
pub(crate) mod request_id;
pub(crate) mod response;
pub(crate) mod strict;
pub(crate) mod tls;
pub(crate) mod upgrades;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use crate::algorithms::Cost;
use crate::gate::{self, Admission, Answers, Gate, Refuse, Refused, Settled, TunnelSlot};
use crate::limit_headers::{self, HeaderStyle};
use crate::metrics::{BodyBytes, Metrics, RuleSeries};
use crate::outcome::{BackendFailure, Outcome};
use crate::refusal::Refusals;
use crate::server::{Answered, Arrival, Door, Peer};
use crate::telemetry::throttle::LogThrottle;
use crate::telemetry::trace::RequestSpan;
use backend::{BackendBody, BackendError, BackendPool};
use body::{BodyState, ClientBody, MinRate, Progress};
use cors::Cors;
use headers::{HeadScan, MethodOverride, UnderscoreHeaders};
use request_id::{RequestIds, X_REQUEST_ID};
use upgrades::UpgradeProtocols;

/// The proxy's settings: where allowed requests go, and how they are forwarded and answered.
#[derive(Debug, Clone)]
pub(crate) struct ProxySettings {
    /// `BACKEND_URL`.
    pub backend: Backend,
    /// `RATE_LIMIT_HEADERS`: which rate-limit headers responses carry.
    pub headers: HeaderStyle,
    /// `DENY_STATUS` and `DENY_FORMAT`: the status and body of a rate-limit refusal.
    pub refusals: Refusals,
    /// `FORWARD_RATELIMIT_HEADERS`: an allowed request reaches the backend with the draft
    /// `RateLimit` and `RateLimit-Policy` fields its client is told, the client's own removed.
    pub forward_headers: bool,
    /// `RESPONSE_COST_HEADER`: the backend's header saying what a request really cost.
    pub response_cost_header: Option<HeaderName>,
    /// `ACCESS_LOG`: which requests get an `info` line.
    pub access_log: AccessLog,
    /// `BACKEND_TIMEOUT_MS`: how long to wait for the backend's response headers once the
    /// request body has been sent, and for the backend to connect or to read more of a body
    /// (504 after). Counted from the end of the body, so a long upload is not a slow backend.
    pub backend_timeout: Duration,
    /// `BACKEND_IDLE_TIMEOUT_MS`: idle pooled backend connections are closed after this; keep
    /// it below the backend's own keep-alive timeout so we never reuse a closing connection.
    pub backend_idle_timeout: Duration,
    /// `BODY_IDLE_TIMEOUT_MS`: a client that sends no request body data for this long in the
    /// middle of its body is answered 408 and cut off (slow-upload protection).
    pub body_idle_timeout: Duration,
    /// `BODY_MIN_RATE` and `BODY_MIN_RATE_WINDOW_MS`: a request body must bring at least this
    /// many bytes per second, counted over windows of time spent waiting for the client, or
    /// it is answered 408 and cut off (a trickle that dodges `BODY_IDLE_TIMEOUT_MS`); `None`
    /// (`BODY_MIN_RATE=0`) checks no rate.
    pub body_min_rate: Option<MinRate>,
    /// `UPGRADE_IDLE_TIMEOUT_MS`: an upgraded connection (a WebSocket tunnel) in which no byte
    /// has moved either way for this long is closed, so abandoned tunnels cannot hold
    /// connections forever; `None` (`0`) never closes one.
    pub upgrade_idle_timeout: Option<Duration>,
    /// `UPGRADE_PROTOCOLS`: the `Upgrade` protocols forwarded (default `websocket`); any
    /// other token is removed, so an upgrade the gateway cannot meter (`h2c`) never reaches
    /// the backend.
    pub upgrade_protocols: UpgradeProtocols,
    /// `UNDERSCORE_HEADERS`: what becomes of request headers with `_` in their names, which
    /// CGI-style backends read as the `-` spelling (`X_API_Key` is `X-API-Key` to them).
    pub underscore_headers: UnderscoreHeaders,
    /// `METHOD_OVERRIDE`: whether the method-override headers are metered (forwarded, and a
    /// request matches routes of the method they name too) or removed before the decision.
    pub method_override: MethodOverride,
    /// `CORS_ALLOW_ORIGINS`: CORS headers on the gateway's own answers (`429`, `503`, ...), so
    /// a browser application can read a refusal; `None` (unset or empty): none.
    pub cors: Option<Cors>,
}

/// Where allowed requests go (`BACKEND_URL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backend {
    /// `http`, or `https` (then `tls` is set).
    pub scheme: http::uri::Scheme,
    /// Host and port of the backend.
    pub authority: http::uri::Authority,
    /// Path prefix of `BACKEND_URL` without its trailing slash (often empty); request paths
    /// are appended to it.
    pub base_path: String,
    /// For `https`: how the backend's certificate is checked.
    pub tls: Option<tls::BackendTls>,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

/// Which requests get an `info` line (`ACCESS_LOG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessLog {
    /// None (denials are still counted in the metrics).
    Off,
    /// Refused requests (429, 503) only, rate-limited under a flood (the default).
    Denied,
    /// Every request, never rate-limited: the operator asked for all of them.
    All,
}

impl AccessLog {
    /// Parse `off`, `denied` or `all`.
    pub(crate) fn parse(value: &str) -> Option<AccessLog> {
        match value {
            "off" => Some(AccessLog::Off),
            "denied" => Some(AccessLog::Denied),
            "all" => Some(AccessLog::All),
            _ => None,
        }
    }

    /// Whether a request that ended as `outcome` gets an `info` line. A shadow rule exists to
    /// be watched: its would-be denials are logged whatever `ACCESS_LOG` says.
    pub(crate) fn logs(self, outcome: Outcome) -> bool {
        match self {
            AccessLog::All => true,
            AccessLog::Denied => outcome == Outcome::Shadow || !outcome.forwards(),
            AccessLog::Off => outcome == Outcome::Shadow,
        }
    }

    /// The value as written in `ACCESS_LOG`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AccessLog::Off => "off",
            AccessLog::Denied => "denied",
            AccessLog::All => "all",
        }
    }
}

/// What became of the exchange, as the metrics name it: the stage that failed says most, and
/// an exchange's I/O cause or hyper's own reading of it says the rest.
fn failure_of(error: &BackendError) -> BackendFailure {
    match error {
        BackendError::Resolve(_) => BackendFailure::Dns,
        BackendError::UnaskedSwitch => BackendFailure::Other,
        BackendError::TimedOut => BackendFailure::Timeout,
        BackendError::Tls(_) => BackendFailure::Tls,
        BackendError::Connect(io) => failure_of_io(io).unwrap_or(BackendFailure::Other),
        BackendError::Exchange(hyper) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(hyper);
            while let Some(current) = source {
                if let Some(io) = current.downcast_ref::<std::io::Error>()
                    && let Some(failure) = failure_of_io(io)
                {
                    return failure;
                }
                source = current.source();
            }
            match hyper.is_incomplete_message() || hyper.is_closed() || hyper.is_canceled() {
                true => BackendFailure::Reset,
                false => BackendFailure::Other,
            }
        }
    }
}

/// The failure an I/O error's kind names, if it names one.
fn failure_of_io(io: &std::io::Error) -> Option<BackendFailure> {
    use std::io::ErrorKind;
    match io.kind() {
        ErrorKind::ConnectionRefused => Some(BackendFailure::Refused),
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => Some(BackendFailure::Reset),
        ErrorKind::TimedOut => Some(BackendFailure::Timeout),
        _ => None,
    }
}

/// Body of every response the gateway sends.
pub(crate) type ResponseBody = BoxBody<Bytes, hyper::Error>;

/// Why a request could not be proxied; the origin decides the status code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// The backend refused, reset or broke the connection (502).
    #[error("backend unreachable: {0}")]
    Upstream(#[source] BackendError),
    /// The backend sent no response headers within `BACKEND_TIMEOUT_MS` (504).
    #[error("backend sent no response within {0:?}")]
    UpstreamTimeout(Duration),
    /// The request cannot be turned into a backend request (400).
    #[error("request cannot be forwarded: {0}")]
    Downstream(String),
    /// The client's request body was malformed or cut short (400).
    #[error("the request body could not be read (malformed, or cut short by the client)")]
    BodyUnreadable,
    /// The client paused mid-body for longer than `BODY_IDLE_TIMEOUT_MS` (408).
    #[error("the client sent no request body data for {0:?}")]
    BodyIdle(Duration),
    /// The client's request body came slower than `BODY_MIN_RATE` (408).
    #[error("the request body came slower than {0}")]
    BodyTooSlow(MinRate),
}

impl ProxyError {
    /// Whether the client, not the backend, is to blame.
    fn is_downstream(&self) -> bool {
        matches!(
            self,
            ProxyError::Downstream(_)
                | ProxyError::BodyUnreadable
                | ProxyError::BodyIdle(_)
                | ProxyError::BodyTooSlow(_)
        )
    }
}

/// Everything a request needs, shared by all connections.
pub(crate) struct Proxy {
    /// The backend's kept-alive HTTP/1.1 connections.
    pool: BackendPool,
    /// `BACKEND_URL`.
    backend: Backend,
    /// Classification and decision, shared with every other door.
    gate: Arc<Gate>,
    /// `RATE_LIMIT_HEADERS`, `DENY_STATUS`, `DENY_FORMAT` and `FORWARD_RATELIMIT_HEADERS`: the
    /// answers every door shares.
    answers: Answers,
    /// `RESPONSE_COST_HEADER`.
    response_cost_header: Option<HeaderName>,
    /// `BACKEND_TIMEOUT_MS`.
    backend_timeout: Duration,
    /// `BODY_IDLE_TIMEOUT_MS`.
    body_idle_timeout: Duration,
    /// `BODY_MIN_RATE` over `BODY_MIN_RATE_WINDOW_MS`.
    body_min_rate: Option<MinRate>,
    /// `UPGRADE_IDLE_TIMEOUT_MS`.
    upgrade_idle_timeout: Option<Duration>,
    /// Counts what became of requests.
    metrics: Arc<Metrics>,
    /// `ACCESS_LOG`.
    access_log: AccessLog,
    /// Makes `X-Request-Id`s.
    request_ids: RequestIds,
    /// Bounds the lines about refused requests.
    denial_log: LogThrottle,
    /// Paces the warning for requests refused past the cap of requests in flight.
    overload_log: LogThrottle,
    /// Bounds the warnings about backend failures.
    failure_log: LogThrottle,
    /// `UPGRADE_PROTOCOLS`: the protocols an `Upgrade` may name on its way to the backend.
    upgrade_protocols: upgrades::UpgradeProtocols,
    /// `UNDERSCORE_HEADERS`.
    underscore_headers: headers::UnderscoreHeaders,
    /// `METHOD_OVERRIDE`.
    method_override: MethodOverride,
    /// `CORS_ALLOW_ORIGINS`: CORS headers on the gateway's own answers; `None`: off.
    cors: Option<cors::Cors>,
}

/// Who wrote a response: the gateway's own answers get the CORS headers, the backend's pass
/// as they came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnsweredBy {
    /// A refusal, an error, anything the gateway made itself.
    Gateway,
    /// The backend's response, streamed through.
    Backend,
}

/// What a log line about a request shows of it, copied before the request moves on to the
/// backend (and only when a line will be written).
struct RequestSummary {
    method: http::Method,
    /// The path as sent (without the query, which may hold secrets).
    path: String,
    /// The TCP peer: with a header key, the `client` field is a digest, and this says where
    /// the requests come from.
    peer: SocketAddr,
    /// The host asked for, at most [`LOGGED_HEADER_MAX`] characters.
    host: String,
    /// `User-Agent`, at most [`LOGGED_HEADER_MAX`] characters.
    user_agent: String,
}

/// The most characters of a client-chosen header a log line shows.
const LOGGED_HEADER_MAX: usize = 128;

impl RequestSummary {
    fn of<B>(request: &Request<B>, peer: SocketAddr) -> RequestSummary {
        let host = request
            .uri()
            .authority()
            .map(|authority| authority.as_str().as_bytes())
            .or_else(|| request.headers().get(header::HOST).map(HeaderValue::as_bytes));
        RequestSummary {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            peer,
            host: loggable(host),
            user_agent: loggable(
                request
                    .headers()
                    .get(header::USER_AGENT)
                    .map(HeaderValue::as_bytes),
            ),
        }
    }
}

/// A client-chosen value as a log field: visible ASCII (anything else as `?`), cut to
/// [`LOGGED_HEADER_MAX`] characters with a `...` mark, `-` when absent.
fn loggable(value: Option<&[u8]>) -> String {
    let Some(value) = value else {
        return "-".to_owned();
    };
    let mut text: String = value
        .iter()
        .take(LOGGED_HEADER_MAX)
        .map(|&byte| match byte {
            b' '..=b'~' => char::from(byte),
            _ => '?',
        })
        .collect();
    if value.len() > LOGGED_HEADER_MAX {
        text.push_str("...");
    }
    text
}

/// How an allowed request goes to the backend, from its admission.
struct Forwarding<'a> {
    /// The connection it came on.
    connection: Peer,
    /// What the gate admitted: the client, the path to send, the budget to tell.
    admission: &'a Admission,
    /// The client's place under `MAX_UPGRADES_PER_CLIENT`, for the tunnel if the backend
    /// switches.
    tunnel: Option<TunnelSlot>,
    /// It asks for an upgrade (read once, before the gate took a tunnel's place for it).
    upgrade: bool,
    /// What `handle`'s one pass over the header names found.
    scan: HeadScan,
}

/// What the log lines (and the trace) of one request need to know, wherever they are
/// written.
struct RequestContext<'a> {
    /// `X-Request-Id`.
    id: &'a HeaderValue,
    /// Its server span, when traces are on.
    span: Option<&'a RequestSpan>,
}

impl RequestContext<'_> {
    /// The request id as text, for log fields (always visible ASCII).
    fn id(&self) -> &str {
        self.id.to_str().unwrap_or("-")
    }
}

/// A proxied request's answer and what follows it: who wrote it, what its admission still
/// holds, where its bytes are counted.
struct Proxied {
    response: Response<ResponseBody>,
    by: AnsweredBy,
    settled: Settled,
    bytes: Option<Counter>,
}

/// The reverse proxy as the listener's door.
impl Door for Proxy {
    type Body = ResponseBody;

    /// Answer one request, arrived as `arrival` says.
    async fn handle(&self, request: Request<Incoming>, arrival: Arrival) -> Answered<ResponseBody> {
        // The access log's start, read only when a line about this request can be written at
        // all (every line is at info or debug): under RUST_LOG=warn a request reads the clock
        // once less.
        let started = (tracing::enabled!(tracing::Level::INFO) || tracing::enabled!(tracing::Level::DEBUG))
            .then(Instant::now);
        // One pass over the header names, read by the request id and the request filter's
        // checks (and the hop-by-hop and claim filters of `backend_request`): each skips its own
        // pass or lookup when the names it looks for are not there.
        let scan = HeadScan::of(request.headers());
        let id = if scan.request_id {
            self.request_ids.for_request(request.headers())
        } else {
            self.request_ids.generate()
        };
        let origin = self
            .cors
            .as_ref()
            .and_then(|cors| cors.origin_of(request.headers()));
        // Traces off: `None`, and nothing read for them.
        let span = self
            .gate
            .traces()
            .map(|traces| traces.request_span(&request, arrival.connection.address.ip(), scan.traceparent));
        let context = RequestContext {
            id: &id,
            span: span.as_ref(),
        };
        let proxied = match self.respond(request, arrival, &context, scan, started).await {
            Ok(proxied) => proxied,
            // Answered before any rule was found: counted without one.
            Err(response) => {
                self.metrics.response(None, response.status().as_u16());
                Proxied {
                    response,
                    by: AnsweredBy::Gateway,
                    settled: Settled::none(),
                    bytes: None,
                }
            }
        };
        let Proxied {
            mut response,
            by,
            settled,
            bytes,
        } = proxied;
        if let (Some(cors), Some(origin), AnsweredBy::Gateway) = (&self.cors, origin, by) {
            cors.apply(response.headers_mut(), origin);
        }
        response.headers_mut().insert(X_REQUEST_ID, id);
        if let Some(span) = span {
            span.end(response.status().as_u16());
        }
        Answered {
            response,
            settled,
            bytes,
        }
    }
}

impl Proxy {
    /// Build the proxy of `config`, deciding through `gate` and counting into `metrics`;
    /// `tls` is the TLS client of an `https` backend (see [`tls::TlsConnector::new`]).
    pub(crate) fn new(
        config: &ProxySettings,
        gate: Arc<Gate>,
        metrics: Arc<Metrics>,
        tls: Option<tls::TlsConnector>,
    ) -> Self {
        Proxy {
            pool: BackendPool::new(
                &config.backend.authority,
                tls,
                config.backend_timeout,
                config.backend_idle_timeout,
                metrics.backend_connections(),
            ),
            backend: config.backend.clone(),
            gate,
            answers: Answers::new(config.headers, config.refusals.clone(), config.forward_headers),
            response_cost_header: config.response_cost_header.clone(),
            backend_timeout: config.backend_timeout,
            body_idle_timeout: config.body_idle_timeout,
            body_min_rate: config.body_min_rate,
            upgrade_idle_timeout: config.upgrade_idle_timeout,
            metrics,
            access_log: config.access_log,
            request_ids: RequestIds::new(),
            denial_log: LogThrottle::new(),
            overload_log: LogThrottle::new(),
            failure_log: LogThrottle::new(),
            upgrade_protocols: config.upgrade_protocols.clone(),
            underscore_headers: config.underscore_headers,
            method_override: config.method_override,
            cors: config.cors.clone(),
        }
    }

    /// A request's way, phase by phase: the strict checks, then admit (the gate), act (the
    /// backend, or the gateway's own answer), settle, with the rate-limit headers and the log
    /// line. `Err`: answered before the gate admitted it (no rule to count the response by).
    async fn respond(
        &self,
        mut request: Request<Incoming>,
        arrival: Arrival,
        context: &RequestContext<'_>,
        scan: HeadScan,
        started: Option<Instant>,
    ) -> Result<Proxied, Response<ResponseBody>> {
        let peer = arrival.connection.address;
        let id = context.id;
        self.request_filter(&mut request, &arrival, context, &scan)?;
        // Only a request that carried an `Upgrade` line can ask for one.
        let upgrade = scan.upgrade && upgrades::is_upgrade(&request);
        // Admitted at once where nothing is to be waited for (the memory store): no future of
        // the gate's is made, or moved, on the way (docs/benchmarks.md, part 27). The store
        // that answers over the network is awaited here, not in a function of its own: a
        // future nested in the request's costs instructions on every request (part 17).
        let mut admission = match self.gate.admit_now(&gate::Head::of(&request, peer.ip(), upgrade)) {
            Ok(Ok(admission)) => admission,
            Ok(Err(pending)) => self.gate.admit_pending(pending).await,
            Err(refused) => return Err(self.refused(refused, &request, peer, context)),
        };
        if let Some(span) = context.span {
            span.admitted(admission.traced());
        }
        let outcome = admission.outcome();
        // Captured only when a line about this request will be written (the request moves on
        // to the backend): not for the allowed requests of the default ACCESS_LOG=denied, nor
        // for the refusals it would log at info when the log level is above info.
        // Boxed: it is held while the backend answers, and the request's future (moved by
        // value several times) would otherwise carry its room on every request.
        let logged = ((self.access_log.logs(outcome) && tracing::enabled!(tracing::Level::INFO))
            || tracing::enabled!(tracing::Level::DEBUG))
        .then(|| Box::new(RequestSummary::of(&request, peer)));
        let refusal = self
            .answers
            .refusal(&admission, request.headers(), Refuse::Client);
        let forwarded = refusal.is_none();
        let (mut response, by, bytes) = match refusal {
            None => {
                // The backend gets the request id too, so its logs and ours can be joined.
                request.headers_mut().insert(X_REQUEST_ID, id.clone());
                // And the trace, this span its parent.
                if let Some(span) = context.span {
                    span.inject(request.headers_mut());
                }
                // Taken first: the rest of `to` borrows the admission.
                let tunnel = admission.take_tunnel();
                let to = Forwarding {
                    connection: arrival.connection,
                    admission: &admission,
                    tunnel,
                    upgrade,
                    scan,
                };
                // Boxed: the backend exchange's state is most of a request's future, and hyper
                // moves the request's future by value several times before polling it; boxed,
                // it moves a pointer (docs/benchmarks.md part 9).
                Box::pin(self.forward(request, to, context)).await
            }
            Some(refusal) => (
                refusal.map(|body| Full::new(body).map_err(|never| match never {}).boxed()),
                AnsweredBy::Gateway,
                None,
            ),
        };
        let reported = self.reported_cost(response.headers_mut());
        if forwarded {
            self.answers.set_headers(&admission, response.headers_mut());
        }
        if let Some(summary) = logged {
            self.log(context, &admission, &response, &summary, started);
        }
        self.metrics
            .response(admission.series().map(Arc::as_ref), response.status().as_u16());
        let settled = admission.settle(response.status().as_u16(), reported).await;
        Ok(Proxied {
            response,
            by,
            settled,
            bytes,
        })
    }

    /// What is refused before the gate is asked, and what is taken off first: a request past
    /// the cap of requests in flight (`503`), a head HTTP/1.1 does not allow, an upgrade to a
    /// protocol the gateway cannot meter (removed), an underscore spelling of a key header,
    /// a method override under `METHOD_OVERRIDE=strip` (removed). `scan`: the head's names,
    /// read once by `handle`. `Err`: the answer.
    // The answer goes up by `?` as `respond`'s own `Err`, the same type: boxed, every such
    // refusal would pay an allocation.
    #[allow(clippy::result_large_err)]
    fn request_filter(
        &self,
        request: &mut Request<Incoming>,
        arrival: &Arrival,
        context: &RequestContext<'_>,
        scan: &HeadScan,
    ) -> Result<(), Response<ResponseBody>> {
        let peer = arrival.connection.address;
        if let Some(overload) = arrival.overloaded {
            if let Some(suppressed) = self.overload_log.admit() {
                if suppressed > 0 {
                    tracing::warn!(suppressed, "{suppressed} similar lines suppressed");
                }
                tracing::warn!(
                    request_id = context.id(),
                    %peer,
                    "{} requests already in flight: answered 503",
                    overload.variable()
                );
            }
            return Err(response::overloaded());
        }
        if let Err(violation) = strict::check(
            request.method(),
            request.uri(),
            request.version(),
            request.headers(),
            arrival.content_length_dropped,
            scan,
        ) {
            return Err(refuse_violation(violation, request, peer, context));
        }
        // An upgrade to a protocol the gateway cannot meter (h2c) would make this one counted
        // request a tunnel of uncounted ones: such tokens never reach the backend.
        if scan.upgrade {
            self.upgrade_protocols.filter(request.headers_mut());
        }
        // `X_API_Key` beside `X-API-Key`: a CGI-style backend reads one of the two, the rules
        // the other.
        if scan.underscore
            && self.underscore_headers == headers::UnderscoreHeaders::Forward
            && let Some(name) =
                headers::underscore_alias(request.headers(), self.gate.current().key_headers())
        {
            let reason = format!("the {name} header is also sent spelled with '_'");
            return Err(refuse(&reason, request.uri().path(), peer, context));
        }
        // Under `strip`, the backend reads the method the gate decides on, and no other.
        if scan.method_override {
            self.method_override.apply(request.headers_mut());
        }
        Ok(())
    }

    /// The `400` or `429` of a request the gate refused before deciding anything.
    fn refused(
        &self,
        refused: Refused,
        request: &Request<Incoming>,
        peer: SocketAddr,
        context: &RequestContext<'_>,
    ) -> Response<ResponseBody> {
        match refused {
            Refused::Ambiguous(reason) | Refused::Headers(reason) => {
                refuse(&reason, request.uri().path(), peer, context)
            }
            Refused::Tunnels(limit) => response::too_many_upgrades(limit),
        }
    }

    /// The lines about one request: shadow denials always, refusals under `ACCESS_LOG=denied`
    /// (rate-limited), everything under `ACCESS_LOG=all`, and a debug line per request.
    fn log(
        &self,
        context: &RequestContext<'_>,
        admission: &Admission,
        response: &Response<ResponseBody>,
        summary: &RequestSummary,
        started: Option<Instant>,
    ) {
        let outcome = admission.outcome();
        let RequestSummary {
            method,
            path,
            peer,
            host,
            user_agent,
        } = summary;
        let status = response.status().as_u16();
        let latency_us = started.map_or(0, |started| started.elapsed().as_micros() as u64);
        let retry_after_s = admission
            .decision()
            .filter(|decision| !decision.allowed)
            .map(|decision| limit_headers::retry_after_secs(decision.retry_after));
        let suppressed = match self.access_log {
            AccessLog::All => Some(0),
            _ if self.access_log.logs(outcome) => self.denial_log.admit(),
            _ => None,
        };
        match suppressed {
            Some(suppressed) => {
                if suppressed > 0 {
                    tracing::info!(suppressed, "{suppressed} similar lines suppressed");
                }
                let message = match outcome {
                    Outcome::Shadow => "shadow rule would have refused this request; forwarded",
                    _ if !outcome.forwards() => "request refused",
                    _ => "request",
                };
                tracing::info!(
                    request_id = context.id(),
                    %method,
                    path,
                    client = %admission.key(),
                    %peer,
                    host,
                    user_agent,
                    rule = %admission.rule().name,
                    decision = outcome.as_str(),
                    status,
                    retry_after_s,
                    latency_us,
                    "{message}"
                );
            }
            None => tracing::debug!(
                request_id = context.id(),
                %method,
                path,
                client = %admission.key(),
                %peer,
                host,
                user_agent,
                rule = %admission.rule().name,
                decision = outcome.as_str(),
                status,
                latency_us,
                "request"
            ),
        }
    }

    /// The cost the backend reported in `RESPONSE_COST_HEADER`, the header taken out of what
    /// the client gets: a whole number of at most 2^50 ([`Cost::MAX`]) in one field, else
    /// ignored and counted in `tollgate_response_cost_invalid_total`. What the charge makes of
    /// a large one is bounded by the algorithms (at most one capacity of debt).
    fn reported_cost(&self, headers: &mut HeaderMap) -> Option<Cost> {
        reported_cost(self.response_cost_header.as_ref(), headers, &self.metrics)
    }

    /// Send an allowed request to the backend and stream its answer back: the response, who
    /// wrote it, and where its bytes are counted. The backend's latency and timeout count
    /// from the decision's end.
    ///
    /// One future for the whole exchange: the backend's request made in place
    /// ([`Proxy::backend_request`]), the pool's future awaited here (or, for a request with a
    /// body, [`Proxy::response_after_body`]'s), the answer checked in place
    /// ([`Proxy::switch`]). Each `async fn` between here and the pool was one more copy of
    /// the state below it on every request (docs/benchmarks.md, part 27).
    async fn forward(
        &self,
        request: Request<Incoming>,
        to: Forwarding<'_>,
        context: &RequestContext<'_>,
    ) -> (Response<ResponseBody>, AnsweredBy, Option<Counter>) {
        let sent = to.admission.decided();
        // An intermediary answers in its own HTTP version (RFC 9110 section 6.2): an HTTP/1.0
        // backend must not downgrade an HTTP/1.1 client, nor close its keep-alive connection.
        let version = request.version();
        let series = to.admission.series();
        let bytes = series.and_then(|series| series.body_bytes());
        let result = match self.backend_request(request, &to, bytes) {
            Ok((request, client_upgrade, None)) => {
                // No body to wait for (most requests): the backend has BACKEND_TIMEOUT_MS from
                // `sent`, and the pool keeps that deadline on the connection's own timer.
                let exchange = self
                    .pool
                    .send(request, sent, Some(sent + self.backend_timeout))
                    .await;
                self.answered(exchange, None)
                    .and_then(|response| self.switch(response, client_upgrade, to.tunnel))
            }
            Ok((request, client_upgrade, Some(progress))) => self
                .response_after_body(request, &progress, sent)
                .await
                .and_then(|response| self.switch(response, client_upgrade, to.tunnel)),
            Err(error) => Err(error),
        };
        match result {
            Ok(mut response) => {
                if let Some(series) = series {
                    series.backend_response(response.status().as_u16(), sent.elapsed());
                }
                *response.version_mut() = version;
                let counted = bytes.map(|bytes| bytes.response.clone());
                (response, AnsweredBy::Backend, counted)
            }
            Err(error) => {
                self.backend_failed(&error, series.map(Arc::as_ref), context);
                let mut response = response::from_error(&error);
                if error.is_downstream() && version < Version::HTTP_2 {
                    // The request's framing is broken or unread: this connection is done.
                    close_connection(&mut response);
                }
                (response, AnsweredBy::Gateway, None)
            }
        }
    }

    /// Count and (rate-limited) log a request the backend did not answer, naming the backend
    /// and the cause.
    fn backend_failed(&self, error: &ProxyError, series: Option<&RuleSeries>, context: &RequestContext<'_>) {
        let failure = match error {
            ProxyError::Upstream(error) => failure_of(error),
            ProxyError::UpstreamTimeout(_) => BackendFailure::Timeout,
            ProxyError::Downstream(_) => {
                tracing::debug!(request_id = context.id(), %error, "request cannot be forwarded");
                return;
            }
            // The client's doing: no warning, no backend error counted.
            ProxyError::BodyUnreadable | ProxyError::BodyIdle(_) | ProxyError::BodyTooSlow(_) => {
                tracing::debug!(request_id = context.id(), %error, "the client's request body broke off");
                return;
            }
        };
        if let Some(series) = series {
            series.backend_error(failure);
        }
        if let Some(suppressed) = self.failure_log.admit() {
            if suppressed > 0 {
                tracing::warn!(suppressed, "{suppressed} similar lines suppressed");
            }
            tracing::warn!(
                request_id = context.id(),
                backend = %self.backend.authority,
                cause = failure.as_str(),
                %error,
                "backend request failed"
            );
        }
    }

    /// The request the backend gets, made of the client's in place: hop-by-hop headers and
    /// unbelieved claims removed, the forwarding headers and the budget told, `Host`, the
    /// target and the version set, the body watched. Also the client's side of an upgrade it
    /// asks for, and the body's progress when it has one to wait for.
    #[allow(clippy::type_complexity)]
    fn backend_request(
        &self,
        mut request: Request<Incoming>,
        to: &Forwarding<'_>,
        bytes: Option<&BodyBytes>,
    ) -> Result<(Request<ClientBody>, Option<OnUpgrade>, Option<Arc<Progress>>), ProxyError> {
        let Forwarding {
            connection,
            admission,
            upgrade,
            scan,
            ..
        } = to;
        let (connection, upgrade) = (*connection, *upgrade);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let (mut parts, body) = request.into_parts();
        // An absolute-form target or HTTP/2's :authority names the host; else Host does.
        let host = strict::target_host(&parts.uri, &parts.headers);
        // `host` is the request's own (one, `strict::check` saw to it) `Host` line, still in
        // place unless the hop-by-hop filter runs (a `Connection: host` names it).
        let mut host_in_place = parts.uri.authority().is_none() && host.is_some();
        if upgrade || scan.hop_by_hop {
            headers::strip_hop_by_hop(&mut parts.headers, upgrade);
            host_in_place = false;
        }
        // An IPv4 client on a dual-stack listener is ::ffff:a.b.c.d; the backend sees a.b.c.d.
        let peer = connection.address.ip().to_canonical();
        // Read by the gate while it found the client.
        let peer_is_trusted = admission.peer_trusted();
        if scan.underscore || (scan.client_claim && !peer_is_trusted) {
            headers::remove_unbelieved(&mut parts.headers, peer_is_trusted, self.underscore_headers);
        }
        let hop = headers::Hop {
            peer,
            peer_is_trusted,
            client: admission.client().unwrap_or(peer),
            host: host.as_ref(),
            tls: connection.tls,
        };
        headers::set_forwarded_scanned(&mut parts.headers, &hop, scan.forwarded_for);
        // The budget as the client is told it, never as the client wrote it.
        self.answers.set_forwarded(admission, &mut parts.headers);
        // A request that names no host (HTTP/1.0 allows it) gets the backend's, as the
        // backend's own clients would send. An https backend always gets its own: the name
        // its certificate and SNI are for (the client's is in X-Forwarded-Host).
        match (host, self.pool.is_tls()) {
            // The same value in the same place: the insert would change nothing.
            (Some(_), false) if host_in_place => {}
            (Some(host), false) => {
                parts.headers.insert(header::HOST, host);
            }
            _ => {
                parts.headers.insert(header::HOST, self.pool.host().clone());
            }
        }
        parts.uri = self.backend_uri(&parts.uri, admission.rewritten())?;
        // The backend speaks HTTP/1.1 whatever the client spoke, but for an HTTP/2 client's
        // request to an https backend that chooses h2 (the pool decides).
        parts.version = match parts.version {
            Version::HTTP_2 => Version::HTTP_2,
            _ => Version::HTTP_11,
        };

        let body = ClientBody::new(
            body,
            self.body_idle_timeout,
            self.body_min_rate,
            bytes.map(|bytes| &bytes.request),
        );
        let progress = body.progress();
        Ok((Request::from_parts(parts, body), client_upgrade, progress))
    }

    /// The backend's `response`, checked: a `101` opens the tunnel the client asked for (with
    /// its place under `MAX_UPGRADES_PER_CLIENT`, `tunnel_slot`), or is refused when it was
    /// not asked for; hop-by-hop headers removed.
    fn switch(
        &self,
        mut response: Response<BackendBody>,
        client_upgrade: Option<OnUpgrade>,
        tunnel_slot: Option<TunnelSlot>,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        let switching = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
        // RFC 9110 section 7.8: a server switches only to a protocol the client asked for.
        // One not in UPGRADE_PROTOCOLS (or no upgrade asked for at all) opens no tunnel.
        if switching && !(client_upgrade.is_some() && self.upgrade_protocols.accepts(response.headers())) {
            return Err(ProxyError::Upstream(BackendError::UnaskedSwitch));
        }
        match client_upgrade {
            Some(client_upgrade) if switching => {
                let backend_upgrade = hyper::upgrade::on(&mut response);
                let upgrade_idle_timeout = self.upgrade_idle_timeout;
                tokio::spawn(async move {
                    // The client's place under MAX_UPGRADES_PER_CLIENT, until the tunnel closes.
                    let _tunnel_slot = tunnel_slot;
                    let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                        Ok(pair) => pair,
                        Err(error) => return tracing::debug!(%error, "upgrade failed"),
                    };
                    let (client, backend) = (TokioIo::new(client), TokioIo::new(backend));
                    if let Err(error) = upgrades::tunnel(client, backend, upgrade_idle_timeout).await {
                        tracing::debug!(%error, "upgraded connection ended");
                    }
                });
                headers::strip_hop_by_hop(response.headers_mut(), true);
            }
            _ => headers::strip_hop_by_hop(response.headers_mut(), false),
        }
        Ok(response.map(BodyExt::boxed))
    }

    /// Wait for the backend's response headers to a request with a body. While the body
    /// streams, a client that pauses longer than `BODY_IDLE_TIMEOUT_MS` is cut off (408; the
    /// body times itself out too, for the time after the response has come) and a backend that
    /// reads none of it for `BACKEND_TIMEOUT_MS` is given up on (504); once the body has
    /// ended, the backend has `BACKEND_TIMEOUT_MS` to answer, counted from when it ended. A
    /// failure of the client's body is the client's (400).
    async fn response_after_body(
        &self,
        request: Request<ClientBody>,
        progress: &Progress,
        sent: Instant,
    ) -> Result<Response<BackendBody>, ProxyError> {
        // The deadline is kept here, from the body's end: none for the pool.
        let exchange = self.pool.send(request, sent, None);
        let mut exchange = std::pin::pin!(exchange);
        // When the body ended: the backend's BACKEND_TIMEOUT_MS counts from there.
        let waiting_since = loop {
            let (since, waiting_for_client) = progress.activity();
            let stall = match waiting_for_client {
                true => self.body_idle_timeout,
                false => self.backend_timeout,
            };
            tokio::select! {
                // An early answer (the backend need not read the whole body first).
                result = &mut exchange => return self.answered(result, Some(progress)),
                state = progress.finished() => match self.body_failure(state) {
                    Some(error) => return Err(error),
                    None => break Instant::now(),
                },
                () = tokio::time::sleep_until(since + stall) => {
                    if progress.activity() == (since, waiting_for_client) {
                        return Err(match waiting_for_client {
                            true => ProxyError::BodyIdle(self.body_idle_timeout),
                            false => ProxyError::UpstreamTimeout(self.backend_timeout),
                        });
                    }
                }
            }
        };
        match tokio::time::timeout_at(waiting_since + self.backend_timeout, exchange).await {
            Ok(result) => self.answered(result, Some(progress)),
            Err(_) => Err(ProxyError::UpstreamTimeout(self.backend_timeout)),
        }
    }

    /// The backend's answer, or whose failure it was: hyper reports a client body that
    /// broke off as a failed request, and only the body's own record tells them apart.
    fn answered(
        &self,
        result: Result<Response<BackendBody>, BackendError>,
        progress: Option<&Progress>,
    ) -> Result<Response<BackendBody>, ProxyError> {
        result.map_err(|error| {
            progress
                .and_then(|progress| self.body_failure(progress.state()))
                .unwrap_or_else(|| match &error {
                    // Not connected within BACKEND_TIMEOUT_MS: a timeout (504), as when it
                    // connects and then does not answer, whichever deadline fired first.
                    BackendError::Connect(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                        ProxyError::UpstreamTimeout(self.backend_timeout)
                    }
                    BackendError::TimedOut => ProxyError::UpstreamTimeout(self.backend_timeout),
                    _ => ProxyError::Upstream(error),
                })
        })
    }

    /// The error for a request body that ended in `state`, if it failed.
    fn body_failure(&self, state: BodyState) -> Option<ProxyError> {
        match state {
            BodyState::Streaming | BodyState::Ended => None,
            BodyState::Unreadable => Some(ProxyError::BodyUnreadable),
            BodyState::Idle => Some(ProxyError::BodyIdle(self.body_idle_timeout)),
            BodyState::TooSlow => self.body_min_rate.map(ProxyError::BodyTooSlow),
        }
    }

    /// The target the backend gets, in origin form (RFC 9112 section 3.2.1): `BACKEND_URL`'s
    /// path prefix, then the request's path (or its `rewritten` form) and query.
    fn backend_uri(&self, uri: &Uri, rewritten: Option<&str>) -> Result<Uri, ProxyError> {
        if let (Some(original), None) = (uri.path_and_query(), rewritten) {
            // `OPTIONS *` asks about the server, not a resource: no prefix in front.
            if self.backend.base_path.is_empty() || original.as_str() == "*" {
                // The common case: a cheap clone of the parsed original. Unless it is empty:
                // an absolute-form target without a path (`http://x#frag`) parses to an empty
                // path, which `http` writes as an empty request target (`GET  HTTP/1.1`).
                let forwarded = Uri::from(original.clone());
                if !forwarded.path().is_empty() {
                    return Ok(forwarded);
                }
            }
        }
        let path = rewritten.unwrap_or_else(|| uri.path());
        let query = uri.query().map_or_else(String::new, |query| format!("?{query}"));
        let path_and_query: PathAndQuery = format!("{}{path}{query}", self.backend.base_path)
            .parse()
            .map_err(|e: http::uri::InvalidUri| ProxyError::Downstream(e.to_string()))?;
        Ok(Uri::from(path_and_query))
    }
}

/// The cost reported in the header `name` (`RESPONSE_COST_HEADER`) of a response's `headers`,
/// the header taken out: see [`Proxy::reported_cost`]; the layer reads its app's alike.
pub(crate) fn reported_cost(
    name: Option<&HeaderName>,
    headers: &mut HeaderMap,
    metrics: &Metrics,
) -> Option<Cost> {
    let name = name?;
    let mut values = match headers.entry(name) {
        http::header::Entry::Occupied(entry) => entry.remove_entry_mult().1,
        http::header::Entry::Vacant(_) => return None,
    };
    let cost = match (values.next(), values.next()) {
        (Some(value), None) => std::str::from_utf8(value.as_bytes())
            .ok()
            .map(str::trim)
            .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .and_then(|cost| Cost::new(cost).ok()),
        _ => None,
    };
    if cost.is_none() {
        metrics.response_cost_invalid();
    }
    cost
}

/// Refuse a request that cannot be read one way only, before any budget is touched. Logged at
/// debug: it is the client's mistake (or probe), not the gateway's.
fn refuse(
    reason: &str,
    raw_path: &str,
    peer: SocketAddr,
    context: &RequestContext<'_>,
) -> Response<ResponseBody> {
    tracing::debug!(request_id = context.id(), %peer, path = raw_path, reason, "refused an ambiguous request");
    response::bad_request(reason)
}

/// Refuse a request head HTTP/1.1 does not allow (see [`strict`]), before any budget is
/// touched, and close an HTTP/1 connection. Logged at debug: the client's mistake (or probe).
fn refuse_violation(
    violation: strict::Violation,
    request: &Request<Incoming>,
    peer: SocketAddr,
    context: &RequestContext<'_>,
) -> Response<ResponseBody> {
    tracing::debug!(
        request_id = context.id(),
        %peer,
        method = %request.method(),
        reason = %violation,
        "refused a request HTTP/1.1 does not allow"
    );
    let mut response = response::refused(violation.status(), &violation.to_string());
    if violation == strict::Violation::Connect {
        response
            .headers_mut()
            .insert(header::ALLOW, strict::ALLOW.clone());
    }
    if request.version() < Version::HTTP_2 {
        close_connection(&mut response);
    }
    response
}

/// Ask hyper to close the HTTP/1 connection after this response (it honours the header).
fn close_connection(response: &mut Response<ResponseBody>) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}
