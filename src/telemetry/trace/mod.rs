//! Traces: one OpenTelemetry server span per request, exported over OTLP
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`; docs/operations.md, "Traces"). Off unless an endpoint is
//! set, and then nothing here exists: the doors hold `None` and the request path reads no
//! clock, makes no span and looks up no header for it.
//!
//! On, a door asks [`Traces::server_span`] for a [`RequestSpan`] when a request comes in (the
//! client's W3C `traceparent` and `tracestate` its parent, read only when the door's one pass
//! over the header names saw a `traceparent`), tells it the gate's [`Admission`]
//! ([`RequestSpan::admitted`]: rule, decision, limit, and a child span for the Redis call
//! that decided it), writes its context on a request it forwards ([`RequestSpan::inject`]),
//! and ends it with the answer's status ([`RequestSpan::end`]). The attributes are the
//! stable HTTP semantic conventions' (`http.request.method`, `url.path`, `http.route`,
//! `http.response.status_code`, `client.address`, `server.address`) and tollgate's own
//! (`tollgate.rule`, `tollgate.decision`, `tollgate.limit`, `tollgate.remaining`).
//!
//! Spans leave through [`export`]'s bounded queue: exporting never waits for or fails a
//! request, and what it drops is counted (`tollgate_trace_spans_dropped_total`).

pub(crate) mod export;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use tokio::time::Instant;

pub(crate) use export::TraceCounters;

/// `traceparent` (W3C Trace Context, section 3.2).
pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate` (W3C Trace Context, section 3.3).
pub(crate) static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// What a span says of the gate's admission of its request (`Admission::traced`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The outcome, as the logs name it (`allowed`, `limited`, ...).
    pub decision: &'static str,
    /// The decision's limit and what is left under it, when a store decided.
    pub numbers: Option<(u64, u64)>,
    /// When the store was asked and when it answered, when it was asked.
    pub store_call: Option<(Instant, Instant)>,
}

/// An [`Admitted`] kept past its admission, for a door that makes several admissions for one
/// span and tells it the one its answer follows (Envoy's descriptors: the nearest to its limit).
pub(crate) struct Noted {
    rule: String,
    decision: &'static str,
    numbers: Option<(u64, u64)>,
    store_call: Option<(Instant, Instant)>,
}

impl Noted {
    /// `admitted`, owned.
    pub(crate) fn of(admitted: Admitted<'_>) -> Self {
        Noted {
            rule: admitted.rule.to_owned(),
            decision: admitted.decision,
            numbers: admitted.numbers,
            store_call: admitted.store_call,
        }
    }

    /// What was noted, as the span reads it.
    pub(crate) fn admitted(&self) -> Admitted<'_> {
        Admitted {
            rule: &self.rule,
            decision: self.decision,
            numbers: self.numbers,
            store_call: self.store_call,
        }
    }
}

/// The traces' settings (`OTEL_*`); `None` in the configuration when no endpoint is set.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceSettings {
    /// Where spans are sent: for `http/protobuf` the whole URL (`.../v1/traces`), for `grpc`
    /// the collector's address (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with the signal's path for `http/protobuf`).
    pub endpoint: String,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub protocol: OtlpProtocol,
    /// `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else
    /// `tollgate`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, decoded, `service.name` taken out.
    pub resource: Vec<(String, String)>,
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
    pub sampler: TraceSampler,
}

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OtlpProtocol {
    /// Protobuf in an HTTP POST (`http/protobuf`, the specification's default).
    HttpProtobuf,
    /// OTLP's gRPC service (`grpc`).
    Grpc,
}

impl OtlpProtocol {
    /// The value as written in `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TraceSampler {
    /// `parentbased_*`: a request whose client sent a `traceparent` follows its sampled
    /// flag; the root sampler decides the others.
    pub parent_based: bool,
    /// The root sampler.
    pub root: RootSampler,
}

/// A sampler that decides by itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RootSampler {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio`: this fraction of trace ids, from 0 to 1.
    Ratio(f64),
}

impl TraceSampler {
    /// The SDK's sampler.
    fn sampler(self) -> Sampler {
        let root = match self.root {
            RootSampler::AlwaysOn => Sampler::AlwaysOn,
            RootSampler::AlwaysOff => Sampler::AlwaysOff,
            RootSampler::Ratio(ratio) => Sampler::TraceIdRatioBased(ratio),
        };
        match self.parent_based {
            true => Sampler::ParentBased(Box::new(root)),
            false => root,
        }
    }
}

impl std::fmt::Display for TraceSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = if self.parent_based { "parentbased_" } else { "" };
        match self.root {
            RootSampler::AlwaysOn => write!(f, "{prefix}always_on"),
            RootSampler::AlwaysOff => write!(f, "{prefix}always_off"),
            RootSampler::Ratio(ratio) => write!(f, "{prefix}traceidratio:{ratio}"),
        }
    }
}

/// The span exporter could not be built from the settings.
#[derive(Debug, thiserror::Error)]
#[error("traces: cannot export to {endpoint} ({protocol}): {reason}")]
pub(crate) struct TraceError {
    endpoint: String,
    protocol: &'static str,
    reason: String,
}

/// The tracer every door asks for spans: cheap to clone, the clones share one queue.
#[derive(Clone)]
pub(crate) struct Traces {
    inner: Arc<Inner>,
}

struct Inner {
    tracer: SdkTracer,
    /// Kept to shut the pipeline down ([`Traces::shutdown`]).
    provider: SdkTracerProvider,
    /// The queue's task, stopped (its last spans sent) by [`Traces::shutdown`].
    exporter: export::ExportTask,
    /// The store is remote (Redis): a decision is a call worth a child span of its own.
    remote_store: bool,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Traces {
    /// The tracer of `settings`, exporting from a task on the current Tokio runtime and
    /// counting into `counters`; `remote_store`: decisions are Redis calls.
    pub(crate) fn start(
        settings: &TraceSettings,
        counters: TraceCounters,
        remote_store: bool,
    ) -> Result<Traces, TraceError> {
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attributes(
                settings
                    .resource
                    .iter()
                    .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
            )
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let exporter = export::exporter(settings, &resource).map_err(|reason| TraceError {
            endpoint: settings.endpoint.clone(),
            protocol: settings.protocol.as_str(),
            reason,
        })?;
        let (processor, exporter) = export::ExportQueue::spawn(exporter, counters);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(settings.sampler.sampler())
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        Ok(Traces {
            inner: Arc::new(Inner {
                tracer,
                provider,
                exporter,
                remote_store,
            }),
        })
    }

    /// Send what is queued (waiting up to `timeout`) and stop: after the drain, so the last
    /// requests' spans leave too.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        // Stops new spans being queued; the queue's task sends what it holds and ends.
        let _ = self.inner.provider.shutdown_with_timeout(timeout);
        self.inner.exporter.finish(timeout).await;
    }

    /// The server span of `request`, come from `peer`; `traceparent`: its head has a
    /// `traceparent` line (the door's pass over the names saw one), so it has a parent.
    pub(crate) fn request_span<B>(
        &self,
        request: &http::Request<B>,
        peer: IpAddr,
        traceparent: bool,
    ) -> RequestSpan {
        let host = request
            .uri()
            .authority()
            .map(|authority| authority.as_str().as_bytes())
            .or_else(|| {
                request
                    .headers()
                    .get(http::header::HOST)
                    .map(HeaderValue::as_bytes)
            });
        self.server_span(
            request.method(),
            request.uri().path(),
            host,
            peer,
            traceparent.then(|| request.headers()),
        )
    }

    /// The server span of a request that came in: `method` and `path` as sent, to `host`
    /// (the `Host` or the target's authority), from `peer`; its parent the client's
    /// `traceparent` (and `tracestate`) in `headers` when `traceparent` says one is there
    /// (the door's pass over the header names). A door with a route of its own names it
    /// (`route`: `/v1/check`).
    pub(crate) fn server_span(
        &self,
        method: &Method,
        path: &str,
        host: Option<&[u8]>,
        peer: IpAddr,
        headers: Option<&HeaderMap>,
    ) -> RequestSpan {
        let parent = match headers {
            Some(headers) => TraceContextPropagator::new().extract(&ClientContext::of(headers)),
            None => Context::new(),
        };
        let (method_name, original) = method_attribute(method);
        let tracer = &self.inner.tracer;
        // Started bare: a span the sampler drops (most, at a low ratio) is given nothing.
        let mut span = tracer
            .span_builder(method_name)
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent);
        if span.is_recording() {
            let mut attributes = Vec::with_capacity(8);
            attributes.push(KeyValue::new("http.request.method", method_name));
            if let Some(original) = original {
                attributes.push(KeyValue::new("http.request.method_original", original));
            }
            attributes.push(KeyValue::new("url.path", path.to_owned()));
            if let Some(host) = host.and_then(|host| std::str::from_utf8(host).ok()) {
                let (address, port) = split_host(host);
                attributes.push(KeyValue::new("server.address", address.to_owned()));
                if let Some(port) = port {
                    attributes.push(KeyValue::new("server.port", i64::from(port)));
                }
            }
            let peer = peer.to_string();
            attributes.push(KeyValue::new("client.address", peer.clone()));
            attributes.push(KeyValue::new("network.peer.address", peer));
            span.set_attributes(attributes);
        }
        RequestSpan {
            context: parent.with_span(span),
            traces: self.clone(),
            method: method_name,
            started: (Instant::now(), SystemTime::now()),
        }
    }
}

/// One request's server span, from its arrival to its answer. A clone writes on the same span
/// (Envoy's door hands one to the gRPC service in the request's extensions); the span ends
/// once, by [`RequestSpan::end`].
#[derive(Clone)]
pub struct RequestSpan {
    /// The span, as the parent of what it makes and writes on.
    context: Context,
    traces: Traces,
    /// `http.request.method`, the first word of the span's name.
    method: &'static str,
    /// When it started, on the gateway's clock and on the wall clock: the admission's times
    /// (the gateway's clock) become the child span's.
    started: (Instant, SystemTime),
}

impl RequestSpan {
    /// The gate's admission of the proxied request: [`RequestSpan::decided`], and the route
    /// when the rule is one (a rule without `name=` is named by its path pattern).
    pub(crate) fn admitted(&self, admitted: Admitted<'_>) {
        let rule = admitted.rule;
        if rule.starts_with('/') && self.context.span().is_recording() {
            self.route(rule.to_owned());
        }
        self.decided(admitted);
    }

    /// The gate's admission: rule, decision and limit, and a child span for the Redis call
    /// that decided it (from the admission's times). A decision door's, whose route is its
    /// own path, not the rule's.
    pub(crate) fn decided(&self, admitted: Admitted<'_>) {
        let span = self.context.span();
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new("tollgate.rule", admitted.rule.to_owned()));
        span.set_attribute(KeyValue::new("tollgate.decision", admitted.decision));
        if let Some((limit, remaining)) = admitted.numbers {
            span.set_attribute(KeyValue::new("tollgate.limit", saturating_i64(limit)));
            span.set_attribute(KeyValue::new("tollgate.remaining", saturating_i64(remaining)));
        }
        if let Some((asked, decided)) = admitted.store_call
            && self.traces.inner.remote_store
        {
            self.store_span(asked, decided, &admitted);
        }
    }

    /// The Redis call's span, a child of this one, from `asked` to `decided`.
    fn store_span(&self, asked: Instant, decided: Instant, admitted: &Admitted<'_>) {
        let (start_instant, start_wall) = self.started;
        let wall = |at: Instant| start_wall + at.saturating_duration_since(start_instant);
        let tracer = &self.traces.inner.tracer;
        let mut attributes = vec![
            KeyValue::new("db.system.name", "redis"),
            KeyValue::new("db.operation.name", "decide"),
            KeyValue::new("tollgate.rule", admitted.rule.to_owned()),
        ];
        let answered = admitted.numbers.is_some();
        if !answered {
            // The fail mode answered: Redis did not.
            attributes.push(KeyValue::new("error.type", "unavailable"));
        }
        let child = tracer
            .span_builder("redis decide")
            .with_kind(SpanKind::Client)
            .with_start_time(wall(asked))
            .with_attributes(attributes)
            .start_with_context(tracer, &self.context);
        let child_context = Context::new().with_span(child);
        let child = child_context.span();
        if !answered {
            child.set_status(Status::error("the store could not decide"));
        }
        child.end_with_timestamp(wall(decided));
    }

    /// A door's own attributes (`tollgate.door`), and the route it serves.
    pub(crate) fn door(&self, door: &'static str, route: Option<&'static str>) {
        let span = self.context.span();
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new("tollgate.door", door));
        if let Some(route) = route {
            self.route(route.to_owned());
        }
    }

    /// `http.route`, and the span's name the semantic conventions give a server span once
    /// its route is known: `{method} {route}`.
    fn route(&self, route: String) {
        let span = self.context.span();
        span.update_name(format!("{} {route}", self.method));
        span.set_attribute(KeyValue::new("http.route", route));
    }

    /// Write this span as the parent of the request going on to the backend: `traceparent`
    /// replaced by this span's, `tracestate` by its state (the client's, carried on), or
    /// removed when that is empty.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        TraceContextPropagator::new().inject_context(&self.context, &mut ForwardedContext(headers));
    }

    /// End the span with the answer's `status` (a `5xx` is an error, a `4xx` is the
    /// client's, as the semantic conventions say for a server span).
    pub(crate) fn end(self, status: u16) {
        let span = self.context.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
            if status >= 500 {
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
                span.set_status(Status::error(""));
            }
        }
        span.end();
    }
}

/// The method as `http.request.method` names it: one of the standard methods, else `_OTHER`
/// with the method as sent beside it (`http.request.method_original`), so a client cannot
/// grow the attribute's values without bound.
fn method_attribute(method: &Method) -> (&'static str, Option<String>) {
    let known = match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => return ("_OTHER", Some(method.as_str().to_owned())),
    };
    (known, None)
}

/// `host[:port]` or `[v6]:port` into the host and the port, if any.
fn split_host(host: &str) -> (&str, Option<u16>) {
    if let Some(v6) = host.strip_prefix('[') {
        return match v6.split_once(']') {
            Some((address, rest)) => (address, rest.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((address, port)) => match port.parse() {
            Ok(port) => (address, Some(port)),
            Err(_) => (host, None),
        },
        None => (host, None),
    }
}

/// An OTLP integer is signed: a limit past `i64::MAX` is shown as that.
fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The client's trace context: its one `traceparent` (two lines are no parent: W3C Trace
/// Context 3.2, a request with several is invalid), and its `tracestate` lines joined.
struct ClientContext<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<Cow<'a, str>>,
}

impl<'a> ClientContext<'a> {
    fn of(headers: &'a HeaderMap) -> ClientContext<'a> {
        let mut parents = headers.get_all(&TRACEPARENT).iter();
        let traceparent = match (parents.next(), parents.next()) {
            (Some(one), None) => one.to_str().ok(),
            _ => None,
        };
        let mut states = headers
            .get_all(&TRACESTATE)
            .iter()
            .filter_map(|value| value.to_str().ok());
        let tracestate = match (states.next(), states.next()) {
            (None, _) => None,
            (Some(one), None) => Some(Cow::Borrowed(one)),
            (Some(first), Some(second)) => {
                let mut joined = format!("{first},{second}");
                for more in states {
                    joined.push(',');
                    joined.push_str(more);
                }
                Some(Cow::Owned(joined))
            }
        };
        ClientContext {
            traceparent,
            tracestate,
        }
    }
}

impl Extractor for ClientContext<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent,
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The forwarded request's headers, as the propagator writes them.
struct ForwardedContext<'a>(&'a mut HeaderMap);

impl Injector for ForwardedContext<'_> {
    fn set(&mut self, key: &str, value: String) {
        let name = match key {
            "traceparent" => &TRACEPARENT,
            "tracestate" => &TRACESTATE,
            _ => return,
        };
        match HeaderValue::try_from(value) {
            Ok(value) if !value.is_empty() => {
                self.0.insert(name, value);
            }
            _ => {
                self.0.remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_split_into_address_and_port() {
        assert_eq!(split_host("example.com"), ("example.com", None));
        assert_eq!(split_host("example.com:8080"), ("example.com", Some(8080)));
        assert_eq!(split_host("[::1]:443"), ("::1", Some(443)));
        assert_eq!(split_host("[::1]"), ("::1", None));
        assert_eq!(split_host("a:b"), ("a:b", None));
        assert_eq!(split_host("a:99999"), ("a:99999", None));
    }

    #[test]
    fn an_unknown_method_is_other_with_the_original_beside_it() {
        assert_eq!(method_attribute(&Method::GET), ("GET", None));
        let custom = Method::from_bytes(b"PURGE").unwrap();
        assert_eq!(method_attribute(&custom), ("_OTHER", Some("PURGE".to_owned())));
    }

    #[test]
    fn two_traceparents_are_no_parent_and_tracestates_are_joined() {
        let mut headers = HeaderMap::new();
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        headers.append(&TRACEPARENT, HeaderValue::from_static(parent));
        headers.append(&TRACESTATE, HeaderValue::from_static("a=1"));
        headers.append(&TRACESTATE, HeaderValue::from_static("b=2"));
        let context = ClientContext::of(&headers);
        assert_eq!(context.get("traceparent"), Some(parent));
        assert_eq!(context.get("tracestate"), Some("a=1,b=2"));
        headers.append(&TRACEPARENT, HeaderValue::from_static(parent));
        assert_eq!(ClientContext::of(&headers).get("traceparent"), None);
    }

    #[test]
    fn samplers_print_as_written() {
        let sampler = TraceSampler {
            parent_based: true,
            root: RootSampler::Ratio(0.25),
        };
        assert_eq!(sampler.to_string(), "parentbased_traceidratio:0.25");
    }
}
