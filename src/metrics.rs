//! The Prometheus registry and the typed metrics the gateway exports on the admin listener's
//! `/metrics`, in either exposition format ([`Format`]).
//!
//! Labels never carry a client key or address: they are a rule name (bounded by the rule
//! table), a decision, a status class or code, or an error kind, so cardinality is fixed by
//! the configuration. The one exception, `tollgate_rls_descriptor_total`
//! ([`DescriptorCounts`]), which an `RLS_CONFIG` limit asks for with `detailed_metric` or
//! `value_to_metric`, carries values an Envoy client sent, and bounds its series. Per-request
//! counters are created up front for every (rule, label) pair and kept in arrays indexed by
//! rule id, so counting a request is one atomic add, and every series
//! is visible (at zero) from the first scrape. Status codes are the exception: a rule's row of
//! 500 counters (100-599, and one for the rest) is made on its first response, and only the
//! codes seen are exported. What the stores know (clients held, evictions, Redis errors, the
//! breaker) and what the server holds open (connections, requests in flight) is read from them
//! at scrape time by collectors, so nothing on the request path updates a gauge but the
//! requests waiting under a delay (`tollgate_delayed_requests`), set as places in the delay
//! queue are taken and given back, off the path of every request not delayed.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use arc_swap::ArcSwap;
use std::time::Duration;

use http::HeaderValue;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};

use crate::telemetry::trace::TraceCounters;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::outcome::{BackendFailure, Outcome, Rejection};
use crate::rules::RuleTable;
use crate::stores::Limiter;
use crate::stores::guard::RedisErrorKind;
use crate::stores::state_file::SaveStats;

#[cfg(feature = "testing")]
/// Every metric name exported (as scraped in the Prometheus text format, with `_total` on
/// counters), for the dashboard and alerting examples to be checked against.
pub const METRIC_NAMES: &[&str] = &[
    "tollgate_requests_total",
    "tollgate_responses_total",
    "tollgate_backend_responses_total",
    "tollgate_backend_errors_total",
    "tollgate_backend_connections_total",
    "tollgate_request_body_bytes_total",
    "tollgate_response_body_bytes_total",
    "tollgate_client_connections_open",
    "tollgate_client_connections_max",
    "tollgate_requests_in_flight",
    "tollgate_client_connections_unread_total",
    "tollgate_client_connections_refused_total",
    "tollgate_client_streams_unread_total",
    "tollgate_client_connections_rejected_total",
    "tollgate_decision_duration_seconds",
    "tollgate_backend_duration_seconds",
    "tollgate_redis_errors_total",
    "tollgate_breaker_open",
    "tollgate_redis_masters",
    "tollgate_memory_clients",
    "tollgate_memory_evictions_total",
    "tollgate_cached_denials_total",
    "tollgate_build_info",
    "tollgate_config_reloads_total",
    "tollgate_config_hash",
    "tollgate_tier_header_untrusted_total",
    "tollgate_response_cost_invalid_total",
    "tollgate_state_saves_total",
    "tollgate_state_save_duration_seconds",
    "tollgate_state_file_bytes",
    "tollgate_delay_seconds",
    "tollgate_delayed_requests",
    "tollgate_delay_queue_full_total",
    "tollgate_rls_descriptor_total",
    "tollgate_trace_spans_exported_total",
    "tollgate_trace_spans_dropped_total",
];

/// The traces' counters, registered.
fn register_trace_counters(registry: &mut Registry) -> TraceCounters {
    let exported = Counter::default();
    registry.register(
        "trace_spans_exported",
        "Trace spans sent to the OTLP collector (OTEL_EXPORTER_OTLP_ENDPOINT)",
        exported.clone(),
    );
    let dropped = Family::<ReasonLabels, Counter>::default();
    registry.register(
            "trace_spans_dropped",
            "Trace spans dropped, never sent: the export queue was full (queue_full) or the collector did not take their batch (export_failed)",
            dropped.clone(),
        );
    let reason = |reason| dropped.get_or_create(&ReasonLabels { reason }).clone();
    TraceCounters {
        exported,
        dropped_queue_full: reason("queue_full"),
        dropped_export_failed: reason("export_failed"),
    }
}

/// What the delay queue (`gate::delay`) counts into: the requests waiting, and those refused for a full queue.
#[derive(Debug, Clone, Default)]
pub struct DelayMetrics {
    /// `tollgate_delayed_requests`: places held now.
    pub waiting: Gauge,
    /// `tollgate_delay_queue_full_total{queue="client"}`.
    pub client_full: Counter,
    /// `tollgate_delay_queue_full_total{queue="overall"}`.
    pub overall_full: Counter,
}

/// The `rule` label of responses to requests refused before any rule was found for them
/// (malformed, or past the cap of requests in flight): no rule name can be this, as a name is
/// a path (starting with `/`) or made of `a-z`, `0-9`, `_` and `-`.
pub(crate) const NO_RULE: &str = "(none)";

/// Status classes of backend responses, as labelled.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Counters in a rule's row of status codes: 100 to 599, then one for the codes above 599
/// that hyper lets a backend send (up to 999), labelled `other`.
const STATUS_CODES: usize = 501;

/// The exposition formats `/metrics` serves, chosen by the scraper's `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4: what Prometheus reads when it asks for nothing else,
    /// and what `promtool check metrics` and most scrapers other than Prometheus read.
    Prometheus,
    /// OpenMetrics 1.0.0 text, ending in `# EOF`: what Prometheus asks for first.
    OpenMetrics,
}

impl Format {
    /// The format a scraper sending `accept` prefers: OpenMetrics when it names
    /// `application/openmetrics-text` with a weight of at least that of any range the
    /// Prometheus format matches (`text/plain`, `text/*`, `*/*`), else the Prometheus format.
    /// Prometheus itself sends `application/openmetrics-text;version=1.0.0,...;q=0.75,
    /// text/plain;version=0.0.4;q=0.5,*/*;q=0.1`.
    pub fn negotiate(accept: Option<&HeaderValue>) -> Format {
        let Some(accept) = accept.and_then(|value| value.to_str().ok()) else {
            return Format::Prometheus;
        };
        let (mut open_metrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media_type = parts.next().unwrap_or("").trim();
            // RFC 9110 section 12.4.2: a weight is 0 to 1 with up to three decimals; a range
            // with a weight that is not one is ignored rather than guessed at.
            let weight = parts
                .filter_map(|parameter| parameter.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, q)| {
                    q.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q))
                });
            let Some(weight) = weight else { continue };
            if media_type.eq_ignore_ascii_case("application/openmetrics-text") {
                open_metrics = open_metrics.max(weight);
            } else if ["text/plain", "text/*", "*/*"]
                .iter()
                .any(|matched| media_type.eq_ignore_ascii_case(matched))
            {
                text = text.max(weight);
            }
        }
        if open_metrics > 0.0 && open_metrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// What the server holds open, read at scrape time: the gauges of open client connections
/// and of requests in flight cost the request path nothing, as the server counts both anyway
/// for its caps.
#[derive(Debug, Clone)]
pub struct Load {
    /// Client connections open (tunnels included), under `MAX_CONNECTIONS`.
    pub connections: Arc<dyn Occupancy>,
    /// Requests in flight across all connections, under the same cap.
    pub requests: Arc<dyn Occupancy>,
}

/// Places held under a cap, read at scrape time: what the server's connection and request
/// slots are to the metrics (the trait keeps the metrics from depending on the server).
pub trait Occupancy: fmt::Debug + Send + Sync {
    /// Places held now.
    fn open(&self) -> usize;
    /// The cap.
    fn max(&self) -> usize;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    rule: String,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    rule: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DescriptorLabels {
    domain: String,
    descriptor: String,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    rule: String,
    cause: &'static str,
}

/// The body-byte counters of one rule, for the proxy to count frames into.
#[derive(Debug)]
pub struct BodyBytes {
    /// `tollgate_request_body_bytes_total`: request body bytes forwarded to the backend.
    pub request: Counter,
    /// `tollgate_response_body_bytes_total`: backend response body bytes passed to clients.
    pub response: Counter,
}

/// The metrics the request path updates, and the registry that exports them.
pub struct Metrics {
    registry: Registry,
    /// `tollgate_trace_spans_exported_total`, `tollgate_trace_spans_dropped_total`.
    traces: TraceCounters,
    /// The per-rule families, from which each rule table's [`TableSeries`] is taken: a rule
    /// of the same name gets the same series in every table, so its counts carry on across
    /// reloads.
    families: Families,
    /// `tollgate_responses_total`, by rule name then status code.
    responses: Arc<StatusCodes>,
    /// The store the current rule table decides with, read at scrape time.
    limiter: Arc<ArcSwap<Limiter>>,
    /// `tollgate_backend_connections_total`: connections opened to the backend.
    backend_connections: Counter,
    /// `tollgate_client_connections_unread_total`: client connections dropped for taking none
    /// of a response for `SEND_TIMEOUT_MS`.
    client_connections_unread: Counter,
    /// `tollgate_client_streams_unread_total`: HTTP/2 streams reset for taking none of their
    /// response for `SEND_TIMEOUT_MS` while their connection took other frames.
    client_streams_unread: Counter,
    /// `tollgate_client_connections_rejected_total`: connections closed before HTTP (a bad
    /// PROXY header, a failed TLS handshake), by [`Rejection`] index.
    client_connections_rejected: [Counter; Rejection::ALL.len()],
    /// `tollgate_client_connections_refused_total`, by the cap that refused them.
    client_connections_refused: ConnectionsRefused,
    /// `tollgate_config_reloads_total`, by result (`ok`, `error`).
    config_reloads: [Counter; 2],
    /// `tollgate_config_hash`: the loaded rule table's digest (a gauge, so a dashboard sees
    /// which replicas run which table).
    config_hash: Gauge,
    /// `tollgate_tier_header_untrusted_total`: requests naming a tier (`TIER_HEADER`) from a
    /// peer not in `TRUSTED_PROXIES`, whose header was ignored.
    tier_header_untrusted: Counter,
    /// `tollgate_response_cost_invalid_total`: backend responses whose
    /// `RESPONSE_COST_HEADER` was malformed, negative or repeated, and ignored.
    response_cost_invalid: Counter,
    /// What `STATE_FILE`'s saves did (all zero without one), read at scrape time.
    state_saves: Arc<SaveStats>,
    /// The delay queue's gauge and counters, handed to the gate.
    delays: DelayMetrics,
    /// `tollgate_rls_descriptor_total`, for the RLS door.
    descriptors: Arc<DescriptorCounts>,
}

/// The families of the per-rule series.
struct Families {
    requests: Family<DecisionLabels, Counter>,
    backend_responses: Family<ClassLabels, Counter>,
    errors: Family<CauseLabels, Counter>,
    request_bytes: Family<RuleLabels, Counter>,
    response_bytes: Family<RuleLabels, Counter>,
    decision_seconds: Family<RuleLabels, Histogram, fn() -> Histogram>,
    backend_seconds: Family<RuleLabels, Histogram, fn() -> Histogram>,
    delay_seconds: Family<RuleLabels, Histogram, fn() -> Histogram>,
}

/// One rule's series, what the request path counts into: each an atomic add.
#[derive(Debug)]
pub struct RuleSeries {
    /// `tollgate_requests_total`, by [`Outcome`] index.
    requests: [Counter; Outcome::ALL.len()],
    /// The rule's row of `tollgate_responses_total`.
    responses: Arc<StatusRow>,
    /// `tollgate_decision_duration_seconds`.
    decision_seconds: Histogram,
    /// `tollgate_delay_seconds`: how long delayed requests waited.
    delay_seconds: Histogram,
    /// The backend's series; `None` for a rule no request is forwarded under (an Envoy
    /// descriptor's, decided for a door that forwards nothing).
    forwarded: Option<ForwardedSeries>,
}

/// The series of a rule's forwarded requests.
#[derive(Debug)]
struct ForwardedSeries {
    /// `tollgate_backend_responses_total`, by status class.
    backend_responses: [Counter; STATUS_CLASSES.len()],
    /// `tollgate_backend_errors_total`, by [`BackendFailure`] index.
    backend_errors: [Counter; BackendFailure::ALL.len()],
    /// The body-byte counters.
    body_bytes: BodyBytes,
    /// `tollgate_backend_duration_seconds`: from sending to the backend's response headers.
    backend_seconds: Histogram,
}

/// The series of one rule table's rules, by rule id.
#[derive(Debug, Clone)]
pub struct TableSeries {
    rules: Arc<[Arc<RuleSeries>]>,
}

impl TableSeries {
    /// Rule `id`'s series (`None` for an id not in the table).
    pub fn rule(&self, id: u16) -> Option<&Arc<RuleSeries>> {
        self.rules.get(usize::from(id))
    }
}

impl RuleSeries {
    /// One request under this rule ended as `outcome`.
    pub fn request(&self, outcome: Outcome) {
        self.requests[outcome as usize].inc();
    }

    /// A decision under this rule took `elapsed`.
    pub fn decision(&self, elapsed: Duration) {
        self.decision_seconds.observe(elapsed.as_secs_f64());
    }

    /// A request under this rule waited `waited` under its delay before its last decision.
    pub fn delayed(&self, waited: Duration) {
        self.delay_seconds.observe(waited.as_secs_f64());
    }

    /// The backend answered a request under this rule with `status` after `elapsed`.
    pub fn backend_response(&self, status: u16, elapsed: Duration) {
        let Some(forwarded) = &self.forwarded else {
            return;
        };
        forwarded.backend_seconds.observe(elapsed.as_secs_f64());
        let class = usize::from(status / 100).saturating_sub(1);
        if let Some(counter) = forwarded.backend_responses.get(class) {
            counter.inc();
        }
    }

    /// The backend did not answer a request under this rule.
    pub fn backend_error(&self, failure: BackendFailure) {
        if let Some(forwarded) = &self.forwarded {
            forwarded.backend_errors[failure as usize].inc();
        }
    }

    /// The body-byte counters, for the request and response bodies of a forwarded request to
    /// count their frames into.
    pub fn body_bytes(&self) -> Option<&BodyBytes> {
        self.forwarded.as_ref().map(|forwarded| &forwarded.body_bytes)
    }
}

/// `tollgate_client_connections_refused_total`: connections closed at accept, by the cap
/// that refused them (`limit="max_connections"` or `limit="max_connections_per_client"`).
#[derive(Debug, Clone, Default)]
pub struct ConnectionsRefused {
    /// Past `MAX_CONNECTIONS`.
    pub max_connections: Counter,
    /// Past `MAX_CONNECTIONS_PER_CLIENT`.
    pub per_client: Counter,
}

/// 5 µs to about 164 ms: a memory decision takes a few microseconds, a Redis one 100-500 µs,
/// and a timeout is at `REDIS_TIMEOUT_MS` (50 ms unless set).
fn decision_histogram() -> Histogram {
    Histogram::new(exponential_buckets(5e-6, 2.0, 16))
}

/// 1 ms to about 65 s.
fn backend_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-3, 2.0, 17))
}

/// 1 ms to about 65 s: a delay is at most 60 s.
fn delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-3, 2.0, 17))
}

impl Families {
    /// The per-rule families, registered, and `tollgate_responses_total`'s rows (exported
    /// by a collector of their own, as only the codes seen are).
    fn register(registry: &mut Registry) -> (Families, Arc<StatusCodes>) {
        let requests = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by rule and what became of them",
            requests.clone(),
        );
        let responses = Arc::new(StatusCodes::default());
        registry.register_collector(Box::new(ResponseCollector(responses.clone())));
        let backend_responses = Family::<ClassLabels, Counter>::default();
        registry.register(
            "backend_responses",
            "Backend responses by rule and status class",
            backend_responses.clone(),
        );
        let errors = Family::<CauseLabels, Counter>::default();
        registry.register(
            "backend_errors",
            "Requests the backend did not answer (the gateway answered 502 or 504), by cause",
            errors.clone(),
        );
        let request_bytes = Family::<RuleLabels, Counter>::default();
        registry.register(
            "request_body_bytes",
            "Request body bytes forwarded to the backend, by rule",
            request_bytes.clone(),
        );
        let response_bytes = Family::<RuleLabels, Counter>::default();
        registry.register(
            "response_body_bytes",
            "Backend response body bytes passed to clients, by rule (upgraded tunnels not included)",
            response_bytes.clone(),
        );
        let families = Families {
            requests,
            backend_responses,
            errors,
            request_bytes,
            response_bytes,
            decision_seconds: Self::histograms(registry, DECISION_SECONDS, decision_histogram),
            backend_seconds: Self::histograms(registry, BACKEND_SECONDS, backend_histogram),
            delay_seconds: Self::histograms(registry, DELAY_SECONDS, delay_histogram),
        };
        (families, responses)
    }

    /// A family of histograms by rule, registered under `(name, help)`, each made by `make`.
    fn histograms(
        registry: &mut Registry,
        (name, help): (&str, &str),
        make: fn() -> Histogram,
    ) -> Family<RuleLabels, Histogram, fn() -> Histogram> {
        let family = Family::<RuleLabels, Histogram, fn() -> Histogram>::new_with_constructor(make);
        registry.register(name, help, family.clone());
        family
    }
}

/// `tollgate_decision_duration_seconds`'s name and help.
const DECISION_SECONDS: (&str, &str) = (
    "decision_duration_seconds",
    "Time to decide a request (a Redis round trip in Redis mode), by rule",
);

/// `tollgate_backend_duration_seconds`'s name and help.
const BACKEND_SECONDS: (&str, &str) = (
    "backend_duration_seconds",
    "Time from forwarding a request to the backend's response headers, by rule",
);

/// `tollgate_delay_seconds`' name and help.
const DELAY_SECONDS: (&str, &str) = (
    "delay_seconds",
    "Time requests refused within their rule's delay waited before their last decision (allowed, or refused again), by rule",
);

impl DelayMetrics {
    /// `tollgate_delayed_requests` and `tollgate_delay_queue_full_total`, registered.
    fn register(registry: &mut Registry) -> DelayMetrics {
        let waiting = Gauge::default();
        registry.register(
            "delayed_requests",
            "Requests waiting under a rule's delay now (at most DELAY_QUEUE)",
            waiting.clone(),
        );
        let delay_full = Family::<QueueLabels, Counter>::default();
        registry.register(
            "delay_queue_full",
            "Requests refused at once though within their rule's delay, the delay queue being full: the client's (DELAY_QUEUE_PER_CLIENT) or the overall one (DELAY_QUEUE)",
            delay_full.clone(),
        );
        // One statement each: the family's lock guard lives to the end of its statement.
        let client_full = delay_full.get_or_create(&QueueLabels { queue: "client" }).clone();
        let overall_full = delay_full
            .get_or_create(&QueueLabels { queue: "overall" })
            .clone();
        DelayMetrics {
            waiting,
            client_full,
            overall_full,
        }
    }
}

/// The counters of connections, the backend's and the clients', registered by
/// [`ConnectionCounters::register`] and kept as fields of [`Metrics`].
struct ConnectionCounters {
    backend_connections: Counter,
    unread: Counter,
    streams_unread: Counter,
    refused: ConnectionsRefused,
    rejected: [Counter; Rejection::ALL.len()],
}

impl ConnectionCounters {
    /// The connection counters, registered, with the collector of what the server holds open
    /// (`load`, read at scrape time) among them.
    fn register(registry: &mut Registry, load: Load) -> ConnectionCounters {
        let backend_connections = Counter::default();
        registry.register(
            "backend_connections",
            "Connections opened to the backend (kept alive and reused: far fewer than requests)",
            backend_connections.clone(),
        );
        let unread = Counter::default();
        registry.register(
            "client_connections_unread",
            "Client connections dropped for taking none of a response for SEND_TIMEOUT_MS (slow read)",
            unread.clone(),
        );
        let streams_unread = Counter::default();
        registry.register(
            "client_streams_unread",
            "HTTP/2 streams reset for taking none of their response for SEND_TIMEOUT_MS (a window kept shut)",
            streams_unread.clone(),
        );
        registry.register_collector(Box::new(LoadCollector(load)));
        ConnectionCounters {
            backend_connections,
            unread,
            streams_unread,
            refused: Self::refused(registry),
            rejected: Self::rejected(registry),
        }
    }

    /// `tollgate_client_connections_refused_total`, by the cap that refused them.
    fn refused(registry: &mut Registry) -> ConnectionsRefused {
        let refused = Family::<LimitLabels, Counter>::default();
        registry.register(
            "client_connections_refused",
            "Client connections closed at accept, by the cap they were past (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT)",
            refused.clone(),
        );
        // One statement each: the family's lock guard lives to the end of its statement.
        let max_connections = refused
            .get_or_create(&LimitLabels {
                limit: "max_connections",
            })
            .clone();
        let per_client = refused
            .get_or_create(&LimitLabels {
                limit: "max_connections_per_client",
            })
            .clone();
        ConnectionsRefused {
            max_connections,
            per_client,
        }
    }

    /// `tollgate_client_connections_rejected_total`, by [`Rejection`] index.
    fn rejected(registry: &mut Registry) -> [Counter; Rejection::ALL.len()] {
        let rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "client_connections_rejected",
            "Client connections closed before HTTP: PROXY header missing, malformed or from an untrusted peer, TLS handshake failed or too slow",
            rejected.clone(),
        );
        Rejection::ALL.map(|reason| {
            rejected
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .clone()
        })
    }
}

/// The counters of the configuration in force and of what it ignored, registered by
/// [`ConfigCounters::register`] and kept as fields of [`Metrics`].
struct ConfigCounters {
    reloads: [Counter; 2],
    hash: Gauge,
    tier_header_untrusted: Counter,
    response_cost_invalid: Counter,
}

impl ConfigCounters {
    fn register(registry: &mut Registry) -> ConfigCounters {
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Reloads of the rule table (RULES_FILE, on SIGHUP or a change of the file), by result",
            reloads.clone(),
        );
        let reloads = ["ok", "error"].map(|result| reloads.get_or_create(&ResultLabels { result }).clone());
        let hash = Gauge::default();
        registry.register(
            "config_hash",
            "A digest of the rule table in force (32 bits): replicas with the same value enforce the same rules",
            hash.clone(),
        );
        let tier_header_untrusted = Counter::default();
        registry.register(
            "tier_header_untrusted",
            "Requests naming a tier in TIER_HEADER from a peer not in TRUSTED_PROXIES: the header was ignored",
            tier_header_untrusted.clone(),
        );
        let response_cost_invalid = Counter::default();
        registry.register(
            "response_cost_invalid",
            "Backend responses whose RESPONSE_COST_HEADER was malformed, negative or repeated: ignored",
            response_cost_invalid.clone(),
        );
        ConfigCounters {
            reloads,
            hash,
            tier_header_untrusted,
            response_cost_invalid,
        }
    }
}

impl Metrics {
    /// Register every metric, reading store state from `limiter` (and from each limiter
    /// [`Metrics::set_limiter`] hands over later) and what the server holds open from `load`
    /// at scrape time. Each rule table's series come from [`Metrics::series`].
    pub fn new(limiter: Limiter, load: Load) -> Metrics {
        // Registered in the order they are exported.
        let mut registry = Registry::with_prefix("tollgate");
        let (families, responses) = Families::register(&mut registry);
        let delays = DelayMetrics::register(&mut registry);
        let connections = ConnectionCounters::register(&mut registry, load);
        let limiter = Arc::new(ArcSwap::from_pointee(limiter));
        registry.register_collector(Box::new(StoreCollector {
            limiter: limiter.clone(),
        }));
        let config = ConfigCounters::register(&mut registry);
        let state_saves = Arc::<SaveStats>::default();
        registry.register_collector(Box::new(StateFileCollector(state_saves.clone())));
        let descriptors = Arc::new(DescriptorCounts::new(MAX_DESCRIPTOR_SERIES));
        registry.register(
            "rls_descriptor",
            "Envoy RLS descriptors decided under a limit with detailed_metric or value_to_metric, by domain, descriptor (its metric key, as envoyproxy/ratelimit builds it; (other) past the cap) and decision",
            descriptors.family.clone(),
        );
        let traces = register_trace_counters(&mut registry);
        Metrics {
            traces,
            families,
            delays,
            responses,
            limiter,
            registry,
            backend_connections: connections.backend_connections,
            client_connections_unread: connections.unread,
            client_streams_unread: connections.streams_unread,
            client_connections_refused: connections.refused,
            state_saves,
            client_connections_rejected: connections.rejected,
            config_reloads: config.reloads,
            config_hash: config.hash,
            tier_header_untrusted: config.tier_header_untrusted,
            response_cost_invalid: config.response_cost_invalid,
            descriptors,
        }
    }

    /// The traces' counters, for the export queue to count into.
    pub(crate) fn traces(&self) -> TraceCounters {
        self.traces.clone()
    }

    /// `tollgate_rls_descriptor_total`, for the RLS door to count decided descriptors into.
    pub fn descriptors(&self) -> Arc<DescriptorCounts> {
        self.descriptors.clone()
    }

    /// The series of `table`'s rules, by rule id: a rule named as one of an earlier table's
    /// counts on into the same series.
    pub fn series(&self, table: &RuleTable) -> TableSeries {
        let families = &self.families;
        let forwarded = table.classified().len();
        let rules = table
            .rules()
            .iter()
            .enumerate()
            .map(|(id, rule)| {
                let name = label_value(&rule.name);
                let labelled = RuleLabels { rule: name.clone() };
                // One statement each: a family's lock guard lives to the end of its statement.
                let requests = Outcome::ALL.map(|outcome| {
                    let labels = DecisionLabels {
                        rule: name.clone(),
                        decision: outcome.as_str(),
                    };
                    families.requests.get_or_create(&labels).clone()
                });
                let decision_seconds = families.decision_seconds.get_or_create(&labelled).clone();
                let delay_seconds = families.delay_seconds.get_or_create(&labelled).clone();
                // The backend's series for the rules requests are forwarded under.
                let forwarded = (id < forwarded).then(|| ForwardedSeries {
                    backend_responses: STATUS_CLASSES.map(|class| {
                        let labels = ClassLabels {
                            rule: name.clone(),
                            class,
                        };
                        families.backend_responses.get_or_create(&labels).clone()
                    }),
                    backend_errors: BackendFailure::ALL.map(|failure| {
                        let labels = CauseLabels {
                            rule: name.clone(),
                            cause: failure.as_str(),
                        };
                        families.errors.get_or_create(&labels).clone()
                    }),
                    body_bytes: BodyBytes {
                        request: families.request_bytes.get_or_create(&labelled).clone(),
                        response: families.response_bytes.get_or_create(&labelled).clone(),
                    },
                    backend_seconds: families.backend_seconds.get_or_create(&labelled).clone(),
                });
                Arc::new(RuleSeries {
                    requests,
                    responses: self.responses.row(&name),
                    decision_seconds,
                    delay_seconds,
                    forwarded,
                })
            })
            .collect();
        TableSeries { rules }
    }

    /// Stop exporting the series of the rules called `names`, which a reload removed: the
    /// series of the rule names any table has had would otherwise grow without bound. A
    /// request still in flight under the old table counts into counters no longer exported;
    /// a name that comes back starts from zero, which Prometheus reads as a counter reset.
    pub fn retire(&self, names: &[String]) {
        let families = &self.families;
        for name in names {
            let rule = label_value(name);
            for outcome in Outcome::ALL {
                families.requests.remove(&DecisionLabels {
                    rule: rule.clone(),
                    decision: outcome.as_str(),
                });
            }
            for class in STATUS_CLASSES {
                families.backend_responses.remove(&ClassLabels {
                    rule: rule.clone(),
                    class,
                });
            }
            for failure in BackendFailure::ALL {
                families.errors.remove(&CauseLabels {
                    rule: rule.clone(),
                    cause: failure.as_str(),
                });
            }
            let labelled = RuleLabels { rule: rule.clone() };
            families.request_bytes.remove(&labelled);
            families.response_bytes.remove(&labelled);
            families.decision_seconds.remove(&labelled);
            families.delay_seconds.remove(&labelled);
            families.backend_seconds.remove(&labelled);
            self.responses
                .rows
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|(label, _)| *label != rule);
        }
    }

    /// What the gate's delay queue counts into (`tollgate_delayed_requests`,
    /// `tollgate_delay_queue_full_total`).
    pub fn delays(&self) -> DelayMetrics {
        self.delays.clone()
    }

    /// From now on, the store's state is read from `limiter` (a reloaded table's).
    pub fn set_limiter(&self, limiter: Limiter) {
        self.limiter.store(Arc::new(limiter));
    }

    /// A backend's `RESPONSE_COST_HEADER` could not be read: it was ignored.
    pub fn response_cost_invalid(&self) {
        self.response_cost_invalid.inc();
    }

    /// A request named a tier from a peer not trusted to: the header was ignored.
    pub fn tier_header_untrusted(&self) {
        self.tier_header_untrusted.inc();
    }

    /// A reload of the rule table succeeded (`ok`), or failed and changed nothing (`!ok`).
    pub fn config_reload(&self, ok: bool) {
        self.config_reloads[usize::from(!ok)].inc();
    }

    /// The rule table in force has this digest.
    pub fn set_config_hash(&self, hash: u32) {
        self.config_hash.set(i64::from(hash));
    }

    /// `tollgate_client_connections_rejected_total`, by [`Rejection`] index.
    pub fn client_connections_rejected(&self) -> [Counter; Rejection::ALL.len()] {
        self.client_connections_rejected.clone()
    }

    /// The gateway answered a request under the rule of `series` (`None`: refused before one
    /// was found) with `status`, its own or the backend's.
    pub fn response(&self, series: Option<&RuleSeries>, status: u16) {
        match series {
            Some(series) => series.responses.count(status),
            None => self.responses.no_rule.count(status),
        }
    }

    /// The counter of connections opened to the backend, for the pool to count into.
    pub fn backend_connections(&self) -> Counter {
        self.backend_connections.clone()
    }

    /// The counter of client connections dropped by `SEND_TIMEOUT_MS`, for the server.
    pub fn client_connections_unread(&self) -> Counter {
        self.client_connections_unread.clone()
    }

    /// The counters of connections refused at accept, for the accept loop.
    pub fn client_connections_refused(&self) -> ConnectionsRefused {
        self.client_connections_refused.clone()
    }

    /// The counter of HTTP/2 streams given up by `SEND_TIMEOUT_MS`, for the server.
    pub fn client_streams_unread(&self) -> Counter {
        self.client_streams_unread.clone()
    }

    /// What `STATE_FILE`'s saves did, for the saver to count into.
    pub fn state_saves(&self) -> Arc<SaveStats> {
        self.state_saves.clone()
    }

    /// The exposition in `format`, for `/metrics`.
    pub fn encode(&self, format: Format) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(match format {
            Format::OpenMetrics => text,
            Format::Prometheus => to_prometheus_text(&text),
        })
    }
}

/// Most descriptors (pairs of `domain` and `descriptor` labels) `tollgate_rls_descriptor_total`
/// keeps apart: a descriptor's label may hold what a client sent (`detailed_metric`,
/// `value_to_metric`), so the series are bounded; the descriptors past it are counted under
/// [`OTHER_DESCRIPTOR`] of their domain.
pub(crate) const MAX_DESCRIPTOR_SERIES: usize = 1_000;

/// The `descriptor` label of the descriptors past [`MAX_DESCRIPTOR_SERIES`]: no metric key can
/// be it, as each starts with its domain and a `.`.
pub(crate) const OTHER_DESCRIPTOR: &str = "(other)";

/// `tollgate_rls_descriptor_total{domain, descriptor, decision}`: each descriptor's row of
/// counters, one per decision, each made on the decision's first count. Only what a limit
/// with `detailed_metric` or `value_to_metric` decides counts here, so a configuration
/// without them never takes its lock.
pub struct DescriptorCounts {
    /// The exported family.
    family: Family<DescriptorLabels, Counter>,
    /// Each domain's descriptors' rows (the domain is one of `RLS_CONFIG`'s), and how many
    /// rows there are besides the domains' [`OTHER_DESCRIPTOR`] ones.
    rows: RwLock<DescriptorRows>,
    /// The cap on rows ([`MAX_DESCRIPTOR_SERIES`]).
    max: usize,
}

/// The rows of [`DescriptorCounts`].
#[derive(Default)]
struct DescriptorRows {
    /// By domain, then by descriptor (its metric key, unescaped).
    by_domain: HashMap<String, HashMap<String, DescriptorRow>>,
    /// Rows held, besides the [`OTHER_DESCRIPTOR`] ones.
    held: usize,
}

/// One descriptor's counters, by [`Outcome`] index.
struct DescriptorRow {
    /// Its `domain` label (escaped).
    domain: String,
    /// Its `descriptor` label (escaped).
    descriptor: String,
    /// Made on each decision's first count.
    counters: [OnceLock<Counter>; Outcome::ALL.len()],
}

impl fmt::Debug for DescriptorCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DescriptorCounts")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl DescriptorCounts {
    /// Counts keeping at most `max` descriptors apart.
    fn new(max: usize) -> DescriptorCounts {
        DescriptorCounts {
            family: Family::default(),
            rows: RwLock::default(),
            max,
        }
    }

    /// One descriptor of `domain`, whose metric key is `descriptor`, was decided as `outcome`.
    pub fn count(&self, domain: &str, descriptor: &str, outcome: Outcome) {
        {
            let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(row) = rows.by_domain.get(domain).and_then(|rows| rows.get(descriptor)) {
                row.count(&self.family, outcome);
                return;
            }
        }
        let mut rows = self.rows.write().unwrap_or_else(PoisonError::into_inner);
        let DescriptorRows { by_domain, held } = &mut *rows;
        let domain_rows = by_domain.entry(domain.to_owned()).or_default();
        // Another request may have made it meanwhile.
        let kept = domain_rows.contains_key(descriptor) || *held < self.max;
        let label = if kept { descriptor } else { OTHER_DESCRIPTOR };
        if !domain_rows.contains_key(label) {
            if kept {
                *held += 1;
            }
            let row = DescriptorRow {
                domain: label_value(domain),
                descriptor: label_value(label),
                counters: Default::default(),
            };
            domain_rows.insert(label.to_owned(), row);
        }
        if let Some(row) = domain_rows.get(label) {
            row.count(&self.family, outcome);
        }
    }
}

impl DescriptorRow {
    fn count(&self, family: &Family<DescriptorLabels, Counter>, outcome: Outcome) {
        self.counters[outcome as usize]
            .get_or_init(|| {
                let labels = DescriptorLabels {
                    domain: self.domain.clone(),
                    descriptor: self.descriptor.clone(),
                    decision: outcome.as_str(),
                };
                family.get_or_create_owned(&labels)
            })
            .inc();
    }
}

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition written by
/// `prometheus_client` for this registry. The two differ, for what is registered here
/// (counters, gauges and histograms without units or exemplars; a test holds the registry to
/// that), in two places only: a counter family is named with its `_total` in `# HELP` and `#
/// TYPE` (OpenMetrics names the family without it, so a 0.0.4 reader finds the samples
/// untyped and without help), and there is no `# EOF`.
fn to_prometheus_text(open_metrics: &str) -> String {
    let mut text = String::with_capacity(open_metrics.len() + 512);
    // `prometheus_client` writes HELP before TYPE; the name it is written under depends on
    // the type, so it waits for it.
    let mut help = None;
    for line in open_metrics.lines() {
        if let Some(named) = line.strip_prefix("# HELP ") {
            help = Some(named.split_once(' ').map_or("", |(_, help)| help));
        } else if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (name, kind) = typed.rsplit_once(' ').unwrap_or((typed, "untyped"));
            let suffix = if kind == "counter" { "_total" } else { "" };
            if let Some(help) = help.take() {
                let _ = writeln!(text, "# HELP {name}{suffix} {help}");
            }
            let _ = writeln!(text, "# TYPE {name}{suffix} {kind}");
        } else if line != "# EOF" {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// A label value as the exposition formats write it: `prometheus_client` writes values as
/// given, and a rule named after a path may hold a `"`.
fn label_value(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// `tollgate_responses_total`: responses by rule and status code. A row per rule name and one
/// for [`NO_RULE`], each row's counters made on its first response (a rule that is never
/// matched costs nothing), each counter an atomic add.
#[derive(Default)]
struct StatusCodes {
    /// The rows of every rule name any table has had, with their labels.
    rows: Mutex<Vec<(String, Arc<StatusRow>)>>,
    /// The row of requests refused before a rule was found.
    no_rule: StatusRow,
}

/// One rule's counters of status codes, made on its first response.
#[derive(Debug, Default)]
struct StatusRow(OnceLock<Box<[AtomicU64; STATUS_CODES]>>);

impl StatusCodes {
    /// The row of the rule labelled `label`, made if it is new.
    fn row(&self, label: &str) -> Arc<StatusRow> {
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, row)) = rows.iter().find(|(held, _)| held == label) {
            return row.clone();
        }
        let row = Arc::new(StatusRow::default());
        rows.push((label.to_owned(), row.clone()));
        row
    }
}

impl StatusRow {
    fn count(&self, status: u16) {
        let counters = self
            .0
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        let code = match status {
            100..=599 => usize::from(status - 100),
            _ => STATUS_CODES - 1,
        };
        counters[code].fetch_add(1, Ordering::Relaxed);
    }
}

struct ResponseCollector(Arc<StatusCodes>);

impl fmt::Debug for ResponseCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseCollector")
    }
}

impl Collector for ResponseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "responses",
            "Responses sent to clients by rule and status code, the gateway's own (429, 502, ...) \
             and the backend's; only codes sent appear; rule (none) for requests refused \
             before a rule was found",
            None,
            MetricType::Counter,
        )?;
        let rows = self.0.rows.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let no_rule = (NO_RULE.to_owned(), &self.0.no_rule);
        for (label, row) in rows
            .iter()
            .map(|(label, row)| (label.clone(), &**row))
            .chain([no_rule])
        {
            let Some(counters) = row.0.get() else { continue };
            for (index, counter) in counters.iter().enumerate() {
                let count = counter.load(Ordering::Relaxed);
                if count == 0 {
                    continue;
                }
                let code = match index {
                    _ if index == STATUS_CODES - 1 => "other".to_owned(),
                    _ => (index + 100).to_string(),
                };
                let labels = [("rule", label.as_str()), ("code", code.as_str())];
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Reads what the server holds open at scrape time.
struct LoadCollector(Load);

impl fmt::Debug for LoadCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LoadCollector")
    }
}

impl Collector for LoadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Load {
            connections,
            requests,
        } = &self.0;
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "client_connections_open",
            "Client connections open (upgraded tunnels included)",
            count(connections.open()),
        )?;
        gauge(
            &mut encoder,
            "client_connections_max",
            "MAX_CONNECTIONS: client connections past it are refused, and requests in flight past \
             it answered 503",
            count(connections.max()),
        )?;
        gauge(
            &mut encoder,
            "requests_in_flight",
            "Requests being answered, from their head to the end of their response body",
            count(requests.open()),
        )
    }
}

/// Reads what the stores know at scrape time.
#[derive(Clone)]
struct StoreCollector {
    limiter: Arc<ArcSwap<Limiter>>,
}

impl fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats = self.limiter.load().stats();
        gauge(
            &mut encoder,
            "memory_clients",
            "Client budgets held in this replica's memory store (or FAIL_MODE=local's)",
            stats.clients as i64,
        )?;
        counter(
            &mut encoder,
            "memory_evictions",
            "Client budgets forgotten to stay within MAX_KEYS",
            stats.evictions,
        )?;
        counter(
            &mut encoder,
            "cached_denials",
            "Requests refused from the denial cache in Redis mode, without a Redis call",
            stats.cached_denials,
        )?;
        gauge(
            &mut encoder,
            "breaker_open",
            "Redis circuit breakers open (their requests get the fail mode): 0 or 1 for one \
             Redis, up to one per master on a cluster",
            stats.breakers.map_or(0, |breakers| breakers.open as i64),
        )?;
        gauge(
            &mut encoder,
            "redis_masters",
            "Redis Cluster masters in the gateway's slot map, each with its own breaker (0 for \
             one Redis, or before the cluster first answers CLUSTER SLOTS)",
            stats.masters as i64,
        )?;
        let mut family = encoder.encode_descriptor(
            "redis_errors",
            "Failed Redis calls by kind",
            None,
            MetricType::Counter,
        )?;
        for kind in RedisErrorKind::ALL {
            let count = stats.errors(kind);
            let labels = [("kind", kind.as_str())];
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        let mut build = encoder.encode_descriptor(
            "build_info",
            "Always 1; the version is the label",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(build.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)
    }
}

/// Reads what `STATE_FILE`'s saves did at scrape time.
#[derive(Debug)]
struct StateFileCollector(Arc<SaveStats>);

impl Collector for StateFileCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats = &self.0;
        let mut saves = encoder.encode_descriptor(
            "state_saves",
            "Saves of the memory store to STATE_FILE (periodic and on shutdown), by result",
            None,
            MetricType::Counter,
        )?;
        for (result, count) in [("ok", &stats.ok), ("error", &stats.failed)] {
            ConstCounter::new(count.load(Ordering::Relaxed))
                .encode(saves.encode_family(&[("result", result)])?)?;
        }
        let seconds = ConstGauge::new(stats.last_duration_us.load(Ordering::Relaxed) as f64 / 1e6);
        seconds.encode(encoder.encode_descriptor(
            "state_save_duration_seconds",
            "How long the last good save of STATE_FILE took (0 before the first)",
            None,
            seconds.metric_type(),
        )?)?;
        gauge(
            &mut encoder,
            "state_file_bytes",
            "The size of STATE_FILE as last saved (0 before the first save)",
            i64::try_from(stats.last_bytes.load(Ordering::Relaxed)).unwrap_or(i64::MAX),
        )
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> Result<(), fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> Result<(), fmt::Error> {
    let counter = ConstCounter::new(value);
    counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)
}

#[cfg(test)]
mod tests;
