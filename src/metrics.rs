//! The Prometheus registry and the handful of typed metrics the gateway exports on the admin
//! listener's `/metrics`.
//!
//! Labels never carry a client key or address: they are a rule name (bounded by the rule
//! table), a decision, a status class, or an error kind, so cardinality is fixed by the
//! configuration. Per-request counters are created up front for every (rule, label) pair and
//! kept in arrays indexed by rule id, so counting a request is one atomic add, and every series
//! is visible (at zero) from the first scrape. What the stores know (clients held, evictions,
//! Redis errors, the breaker) is read from them at scrape time by a collector, so nothing on
//! the request path updates a gauge.

use std::fmt;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::limit::guard::RedisErrorKind;
use crate::limit::{Limiter, RuleTable};
use crate::proxy::{BackendFailure, Outcome};
use crate::server::listener::Rejection;

/// Every metric name exported (as scraped, with `_total` on counters), for the dashboard and
/// alerting examples to be checked against.
pub const METRIC_NAMES: &[&str] = &[
    "tollgate_requests_total",
    "tollgate_backend_responses_total",
    "tollgate_backend_errors_total",
    "tollgate_backend_connections_total",
    "tollgate_client_connections_unread_total",
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
];

/// Status classes of backend responses, as labelled.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

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
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    rule: String,
    cause: &'static str,
}

/// The metrics the request path updates, and the registry that exports them.
pub struct Metrics {
    registry: Registry,
    /// `tollgate_requests_total`, by rule id then [`Outcome`] index.
    requests: Vec<[Counter; Outcome::ALL.len()]>,
    /// `tollgate_backend_responses_total`, by rule id then status class.
    backend_responses: Vec<[Counter; STATUS_CLASSES.len()]>,
    /// `tollgate_backend_errors_total`, by rule id then [`BackendFailure`] index.
    backend_errors: Vec<[Counter; BackendFailure::ALL.len()]>,
    /// `tollgate_decision_duration_seconds`: asking the store (Redis round trip included).
    decision_seconds: Histogram,
    /// `tollgate_backend_duration_seconds`: from sending to the backend's response headers.
    backend_seconds: Histogram,
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
}

impl Metrics {
    /// Register every metric for the rules of `table`, reading store state from `limiter` at
    /// scrape time.
    pub fn new(table: &RuleTable, limiter: Limiter) -> Metrics {
        let mut registry = Registry::with_prefix("tollgate");
        let requests = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by rule and what became of them",
            requests.clone(),
        );
        let responses = Family::<ClassLabels, Counter>::default();
        registry.register(
            "backend_responses",
            "Backend responses by rule and status class",
            responses.clone(),
        );
        let errors = Family::<CauseLabels, Counter>::default();
        registry.register(
            "backend_errors",
            "Requests the backend did not answer (the gateway answered 502 or 504), by cause",
            errors.clone(),
        );
        // 50 µs to about 1.6 s: a memory decision sits in the first bucket, a Redis one
        // around 100-500 µs, a timeout at REDIS_TIMEOUT_MS.
        let decision_seconds = Histogram::new(exponential_buckets(50e-6, 2.0, 16));
        registry.register(
            "decision_duration_seconds",
            "Time to decide a request (a Redis round trip in Redis mode)",
            decision_seconds.clone(),
        );
        // 1 ms to about 65 s.
        let backend_seconds = Histogram::new(exponential_buckets(1e-3, 2.0, 17));
        registry.register(
            "backend_duration_seconds",
            "Time from forwarding a request to the backend's response headers",
            backend_seconds.clone(),
        );
        let backend_connections = Counter::default();
        registry.register(
            "backend_connections",
            "Connections opened to the backend (kept alive and reused: far fewer than requests)",
            backend_connections.clone(),
        );
        let client_connections_unread = Counter::default();
        registry.register(
            "client_connections_unread",
            "Client connections dropped for taking none of a response for SEND_TIMEOUT_MS (slow read)",
            client_connections_unread.clone(),
        );
        let client_streams_unread = Counter::default();
        registry.register(
            "client_streams_unread",
            "HTTP/2 streams reset for taking none of their response for SEND_TIMEOUT_MS (a window kept shut)",
            client_streams_unread.clone(),
        );
        let client_connections_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "client_connections_rejected",
            "Client connections closed before HTTP: PROXY header missing, malformed or from an untrusted peer, TLS handshake failed or too slow",
            client_connections_rejected.clone(),
        );
        let client_connections_rejected = Rejection::ALL.map(|reason| {
            client_connections_rejected
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .clone()
        });
        registry.register_collector(Box::new(StoreCollector { limiter }));

        let rule = |id: usize| table.rules()[id].name.to_string();
        let ids = 0..table.rules().len();
        Metrics {
            requests: ids
                .clone()
                .map(|id| {
                    Outcome::ALL.map(|outcome| {
                        let labels = DecisionLabels {
                            rule: rule(id),
                            decision: outcome.as_str(),
                        };
                        requests.get_or_create(&labels).clone()
                    })
                })
                .collect(),
            backend_responses: ids
                .clone()
                .map(|id| {
                    STATUS_CLASSES.map(|class| {
                        let labels = ClassLabels {
                            rule: rule(id),
                            class,
                        };
                        responses.get_or_create(&labels).clone()
                    })
                })
                .collect(),
            backend_errors: ids
                .map(|id| {
                    BackendFailure::ALL.map(|failure| {
                        let labels = CauseLabels {
                            rule: rule(id),
                            cause: failure.as_str(),
                        };
                        errors.get_or_create(&labels).clone()
                    })
                })
                .collect(),
            registry,
            decision_seconds,
            backend_seconds,
            backend_connections,
            client_connections_unread,
            client_streams_unread,
            client_connections_rejected,
        }
    }

    /// `tollgate_client_connections_rejected_total`, by [`Rejection`] index.
    pub fn client_connections_rejected(&self) -> [Counter; Rejection::ALL.len()] {
        self.client_connections_rejected.clone()
    }

    /// One request under rule `rule_id` ended as `outcome`.
    pub fn request(&self, rule_id: u16, outcome: Outcome) {
        if let Some(counters) = self.requests.get(usize::from(rule_id)) {
            counters[outcome as usize].inc();
        }
    }

    /// The backend answered a request under rule `rule_id` with `status` after `elapsed`.
    pub fn backend_response(&self, rule_id: u16, status: u16, elapsed: Duration) {
        self.backend_seconds.observe(elapsed.as_secs_f64());
        let class = usize::from(status / 100).saturating_sub(1);
        if let Some(counter) = self
            .backend_responses
            .get(usize::from(rule_id))
            .and_then(|counters| counters.get(class))
        {
            counter.inc();
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

    /// The counter of HTTP/2 streams given up by `SEND_TIMEOUT_MS`, for the server.
    pub fn client_streams_unread(&self) -> Counter {
        self.client_streams_unread.clone()
    }

    /// The backend did not answer a request under rule `rule_id`.
    pub fn backend_error(&self, rule_id: u16, failure: BackendFailure) {
        if let Some(counters) = self.backend_errors.get(usize::from(rule_id)) {
            counters[failure as usize].inc();
        }
    }

    /// A decision took `elapsed`.
    pub fn decision(&self, elapsed: Duration) {
        self.decision_seconds.observe(elapsed.as_secs_f64());
    }

    /// The text exposition format, for `/metrics`.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Reads what the stores know at scrape time.
#[derive(Clone)]
struct StoreCollector {
    limiter: Limiter,
}

impl fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let memory = self.limiter.memory_store();
        let clients = memory.map_or(0, |store| store.len() as i64);
        let evictions = memory.map_or(0, |store| store.evictions());
        gauge(
            &mut encoder,
            "memory_clients",
            "Client budgets held in this replica's memory store (or FAIL_MODE=local's)",
            clients,
        )?;
        counter(
            &mut encoder,
            "memory_evictions",
            "Client budgets forgotten to stay within MAX_KEYS",
            evictions,
        )?;
        let guard = self.limiter.guard();
        counter(
            &mut encoder,
            "cached_denials",
            "Requests refused from the denial cache in Redis mode, without a Redis call",
            guard.map_or(0, |guard| guard.cached_denials()),
        )?;
        gauge(
            &mut encoder,
            "breaker_open",
            "Redis circuit breakers open (their requests get the fail mode): 0 or 1 for one \
             Redis, up to one per master on a cluster",
            guard.map_or(0, |guard| guard.breakers_open().0 as i64),
        )?;
        gauge(
            &mut encoder,
            "redis_masters",
            "Redis Cluster masters in the gateway's slot map, each with its own breaker (0 for \
             one Redis, or before the cluster first answers CLUSTER SLOTS)",
            guard.map_or(0, |guard| guard.masters() as i64),
        )?;
        let mut family = encoder.encode_descriptor(
            "redis_errors",
            "Failed Redis calls by kind",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for kind in RedisErrorKind::ALL {
            let count = guard.map_or(0, |guard| guard.errors(kind));
            let labels = [("kind", kind.as_str())];
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        let mut build = encoder.encode_descriptor(
            "build_info",
            "Always 1; the version is the label",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(build.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)
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
