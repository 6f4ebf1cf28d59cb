//! Traces (`OTEL_EXPORTER_OTLP_ENDPOINT`): spans received by a real OTLP receiver (the
//! OpenTelemetry project's messages behind HTTP and gRPC, `support::otlp`), for allowed and
//! refused requests, with the HTTP semantic conventions' attributes and tollgate's own, the
//! client's `traceparent` as the parent and tollgate's span sent on to the backend, a Redis
//! call's child span, the samplers, a decision door's span, a collector that is down, and a
//! bad variable refused at startup. With traces off, the client's `traceparent` reaches the
//! backend untouched.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::support::otlp::{Collector, Otlp, attribute};
use crate::support::{Backend, Gateway, RedisServer, get, get_from, request};

/// OTLP's `SPAN_KIND_SERVER` and `SPAN_KIND_CLIENT`.
const SERVER: u64 = 2;
const CLIENT: u64 = 3;

/// A client's trace context, sampled.
const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(flags: &str) -> String {
    format!("00-{PARENT_TRACE}-{PARENT_SPAN}-{flags}")
}

/// `collector`'s variables and `more`, as the gateway takes them.
fn vars<'a>(collector: &'a [(&'static str, String)], more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all: Vec<(&str, &str)> = collector
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    all.extend_from_slice(more);
    all
}

fn kind(span: &Value) -> u64 {
    span["kind"].as_u64().unwrap()
}

fn status_code(span: &Value) -> i64 {
    attribute(span, "http.response.status_code").as_i64().unwrap_or(0)
}

/// A gateway of one request's budget sending spans to `protocol`'s receiver: the allowed
/// request's and the refused one's, with their attributes, and the allowed one's context
/// reaching the backend.
async fn allowed_and_refused_requests_are_server_spans(protocol: Otlp) {
    let collector = Collector::start(protocol);
    let backend = Backend::start().await;
    let otel = collector.vars();
    let all = vars(
        &otel,
        &[
            ("MAX_TOKENS", "1"),
            ("REFILL_RATE", "0.001"),
            ("OTEL_SERVICE_NAME", "edge"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test%20one"),
        ],
    );
    let gateway = Gateway::start(&backend.url(), &all).await;
    assert_eq!(get(gateway.addr, "/items?page=2").await.status, StatusCode::OK);
    assert_eq!(
        get(gateway.addr, "/items").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    let spans = collector.wait_for(2, |span| kind(span) == SERVER).await;
    assert_eq!(spans.len(), 2, "one span per request: {spans:#?}");
    let allowed = spans.iter().find(|span| status_code(span) == 200).unwrap();
    let refused = spans.iter().find(|span| status_code(span) == 429).unwrap();
    for span in [allowed, refused] {
        assert_eq!(span["service"], "edge");
        assert_eq!(span["resource"]["deployment.environment"], "test one");
        assert_eq!(span["scope"], "tollgate");
        assert_eq!(span["name"], "GET");
        assert_eq!(span["parent_span_id"], "", "no traceparent: a root span");
        assert_eq!(attribute(span, "http.request.method"), "GET");
        assert_eq!(attribute(span, "url.path"), "/items");
        assert_eq!(attribute(span, "server.address"), "gateway.test");
        assert_eq!(attribute(span, "client.address"), "127.0.0.1");
        assert_eq!(attribute(span, "tollgate.rule"), "general");
        assert_eq!(attribute(span, "tollgate.limit"), 1);
        assert_eq!(span["status"], 0, "a 2xx or 4xx leaves the status unset");
        assert!(span["end_ns"].as_u64() >= span["start_ns"].as_u64());
    }
    assert_eq!(attribute(allowed, "tollgate.decision"), "allowed");
    assert_eq!(attribute(refused, "tollgate.decision"), "limited");
    assert_eq!(attribute(refused, "tollgate.remaining"), 0);
    assert_ne!(allowed["trace_id"], refused["trace_id"]);

    // The backend got the allowed request with tollgate's span as its parent.
    let seen = backend.last();
    let sent = seen.headers.get("traceparent").unwrap().to_str().unwrap();
    let expected = format!(
        "00-{}-{}-01",
        allowed["trace_id"].as_str().unwrap(),
        allowed["span_id"].as_str().unwrap()
    );
    assert_eq!(sent, expected);
    gateway.stop().await;
}

#[tokio::test]
async fn allowed_and_refused_requests_are_server_spans_over_http() {
    allowed_and_refused_requests_are_server_spans(Otlp::Http).await;
}

#[tokio::test]
async fn allowed_and_refused_requests_are_server_spans_over_grpc() {
    allowed_and_refused_requests_are_server_spans(Otlp::Grpc).await;
}

#[tokio::test]
async fn the_clients_traceparent_is_the_parent_and_the_backend_gets_tollgates_span() {
    let collector = Collector::start(Otlp::Http);
    let backend = Backend::start().await;
    let otel = collector.vars();
    let gateway = Gateway::start(
        &backend.url(),
        &vars(&otel, &[("ROUTES", "/api/*=token_bucket:5:1")]),
    )
    .await;
    let parent = traceparent("01");
    let reply = get_from(
        gateway.addr,
        IpAddr::from([127, 0, 0, 1]),
        "/api/users",
        &[("traceparent", &parent), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let [span] = <[Value; 1]>::try_from(collector.wait_for(1, |span| kind(span) == SERVER).await).unwrap();
    assert_eq!(span["trace_id"], PARENT_TRACE, "the client's trace goes on");
    assert_eq!(span["parent_span_id"], PARENT_SPAN);
    assert_eq!(span["trace_state"], "vendor=abc");
    assert_eq!(span["name"], "GET /api/*", "named by the route once it is known");
    assert_eq!(attribute(&span, "http.route"), "/api/*");
    assert_eq!(attribute(&span, "tollgate.rule"), "/api/*");
    let seen = backend.last();
    let header = |name: &str| seen.headers.get(name).unwrap().to_str().unwrap().to_owned();
    assert_eq!(
        header("traceparent"),
        format!("00-{PARENT_TRACE}-{}-01", span["span_id"].as_str().unwrap()),
        "the backend's parent is tollgate's span, in the client's trace"
    );
    assert_ne!(span["span_id"], PARENT_SPAN);
    assert_eq!(header("tracestate"), "vendor=abc");
}

#[tokio::test]
async fn with_traces_off_the_clients_traceparent_reaches_the_backend_untouched() {
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &[]).await;
    let parent = traceparent("01");
    let headers = [("traceparent", parent.as_str()), ("tracestate", "vendor=abc")];
    let reply = get_from(gateway.addr, IpAddr::from([127, 0, 0, 1]), "/", &headers).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = backend.last();
    assert_eq!(seen.headers.get("traceparent").unwrap(), parent.as_str());
    assert_eq!(seen.headers.get("tracestate").unwrap(), "vendor=abc");
    // Without one, none is made up.
    get(gateway.addr, "/").await;
    assert!(backend.last().headers.get("traceparent").is_none());
}

#[tokio::test]
async fn a_redis_decision_is_a_child_span() {
    let redis = RedisServer::start();
    let collector = Collector::start(Otlp::Http);
    let backend = Backend::start().await;
    let otel = collector.vars();
    let address = redis.addr();
    let gateway = Gateway::start(&backend.url(), &vars(&otel, &[("REDIS_ADDR", &address)])).await;
    assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    let server = collector.wait_for(1, |span| kind(span) == SERVER).await.remove(0);
    let client = collector.wait_for(1, |span| kind(span) == CLIENT).await.remove(0);
    assert_eq!(client["name"], "redis decide");
    assert_eq!(client["trace_id"], server["trace_id"]);
    assert_eq!(client["parent_span_id"], server["span_id"]);
    assert_eq!(attribute(&client, "db.system.name"), "redis");
    let (start, end) = (
        client["start_ns"].as_u64().unwrap(),
        client["end_ns"].as_u64().unwrap(),
    );
    assert!(start <= end, "{client:#?}");
    assert!(
        server["start_ns"].as_u64().unwrap() <= start && end <= server["end_ns"].as_u64().unwrap(),
        "within the request's span: {server:#?} {client:#?}"
    );
}

#[tokio::test]
async fn samplers_decide_which_requests_are_recorded() {
    let collector = Collector::start(Otlp::Http);
    let backend = Backend::start().await;
    let otel = collector.vars();
    // Nothing recorded, but the trace still goes on to the backend (not sampled).
    let off = Gateway::start(
        &backend.url(),
        &vars(&otel, &[("OTEL_TRACES_SAMPLER", "always_off")]),
    )
    .await;
    for _ in 0..5 {
        assert_eq!(get(off.addr, "/off").await.status, StatusCode::OK);
    }
    let sent = backend
        .last()
        .headers
        .get("traceparent")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(sent.starts_with("00-") && sent.ends_with("-00"), "{sent}");
    // A ratio of 0 under the parent-based sampler: roots are not recorded, a sampled
    // client's trace is.
    let ratio = [
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ];
    let parented = Gateway::start(&backend.url(), &vars(&otel, &ratio)).await;
    let parent = traceparent("01");
    for _ in 0..5 {
        assert_eq!(get(parented.addr, "/root").await.status, StatusCode::OK);
    }
    let reply = get_from(
        parented.addr,
        IpAddr::from([127, 0, 0, 1]),
        "/sampled",
        &[("traceparent", &parent)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // A ratio of 1: every request.
    let all = [
        ("OTEL_TRACES_SAMPLER", "traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "1"),
    ];
    let every = Gateway::start(&backend.url(), &vars(&otel, &all)).await;
    for _ in 0..3 {
        assert_eq!(get(every.addr, "/every").await.status, StatusCode::OK);
    }
    collector
        .wait_for(3, |span| attribute(span, "url.path") == "/every")
        .await;
    collector
        .wait_for(1, |span| attribute(span, "url.path") == "/sampled")
        .await;
    // Spans of one gateway leave in order: by now the others' would have come.
    off.stop().await;
    parented.stop().await;
    let paths: Vec<Value> = collector
        .spans()
        .iter()
        .map(|span| attribute(span, "url.path").clone())
        .collect();
    assert!(!paths.contains(&Value::from("/off")), "{paths:?}");
    assert!(!paths.contains(&Value::from("/root")), "{paths:?}");
    assert_eq!(paths.iter().filter(|path| *path == "/sampled").count(), 1);
}

#[tokio::test]
async fn with_the_collector_down_requests_are_served_and_the_dropped_spans_counted() {
    let mut collector = Collector::start(Otlp::Http);
    let backend = Backend::start().await;
    let otel = collector.vars();
    collector.stop();
    let gateway = Gateway::start_with_admin(&backend.url(), &vars(&otel, &[("MAX_TOKENS", "100")])).await;
    for _ in 0..20 {
        assert_eq!(get(gateway.addr, "/").await.status, StatusCode::OK);
    }
    let dropped = r#"tollgate_trace_spans_dropped_total{reason="export_failed"}"#;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gateway.metric(dropped).await < 20.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped spans were not counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(gateway.metric(dropped).await, 20.0);
    assert_eq!(gateway.metric("tollgate_trace_spans_exported_total").await, 0.0);
    assert_eq!(
        gateway
            .metric(r#"tollgate_trace_spans_dropped_total{reason="queue_full"}"#)
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_decision_doors_call_is_a_span_of_its_own() {
    let collector = Collector::start(Otlp::Grpc);
    let otel = collector.vars();
    let limits = [
        ("MAX_TOKENS", "1"),
        ("REFILL_RATE", "0.001"),
        ("TRUSTED_PROXIES", "127.0.0.1"),
    ];
    let gateway = Gateway::start_decide(None, &vars(&otel, &limits)).await;
    let body = r#"{"method": "GET", "path": "/items", "client_ip": "203.0.113.7"}"#;
    for _ in 0..2 {
        let reply = request(
            gateway.decide.unwrap(),
            IpAddr::from([127, 0, 0, 1]),
            Method::POST,
            "/v1/check",
            &[
                ("content-type", "application/json"),
                ("traceparent", &traceparent("01")),
            ],
            Bytes::copy_from_slice(body.as_bytes()),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let spans = collector.wait_for(2, |span| kind(span) == SERVER).await;
    for span in &spans {
        assert_eq!(span["name"], "POST /v1/check");
        assert_eq!(attribute(span, "http.route"), "/v1/check");
        assert_eq!(attribute(span, "tollgate.door"), "check");
        assert_eq!(attribute(span, "tollgate.rule"), "general");
        assert_eq!(span["parent_span_id"], PARENT_SPAN);
    }
    let decisions: Vec<&Value> = spans
        .iter()
        .map(|span| attribute(span, "tollgate.decision"))
        .collect();
    assert_eq!(decisions, ["allowed", "limited"]);
}

#[test]
fn a_bad_variable_is_refused_at_startup_naming_it() {
    for (name, value) in [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .env_clear()
            .env("BACKEND_URL", "http://127.0.0.1:1")
            .env(name, value)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{name}={value:?} is invalid")),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn the_tower_layer_makes_the_same_spans_and_the_app_gets_the_context() {
    use axum::Router;
    use tollgate::layer::RateLimitLayer;

    let collector = Collector::start(Otlp::Http);
    let otel = collector.vars();
    let layer = otel
        .iter()
        .fold(RateLimitLayer::builder(), |builder, (name, value)| {
            builder.var(name, value.clone())
        })
        .var("MAX_TOKENS", "1")
        .var("REFILL_RATE", "0.001")
        .build()
        .unwrap();
    // The app answers with the traceparent it was given.
    let app = Router::new().fallback(|headers: http::HeaderMap| async move {
        headers
            .get("traceparent")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default()
    });
    let app = Router::new().fallback_service(layer.wrap(app));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    let allowed = get(addr, "/hello").await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(get(addr, "/hello").await.status, StatusCode::TOO_MANY_REQUESTS);
    let spans = collector.wait_for(2, |span| kind(span) == SERVER).await;
    let span = spans.iter().find(|span| status_code(span) == 200).unwrap();
    assert_eq!(attribute(span, "tollgate.decision"), "allowed");
    assert_eq!(attribute(span, "url.path"), "/hello");
    let refused = spans.iter().find(|span| status_code(span) == 429).unwrap();
    assert_eq!(attribute(refused, "tollgate.decision"), "limited");
    assert_eq!(
        allowed.text(),
        format!(
            "00-{}-{}-01",
            span["trace_id"].as_str().unwrap(),
            span["span_id"].as_str().unwrap()
        ),
        "the app's parent is the layer's span"
    );
    server.abort();
}

/// Envoy's rate limit service on the decision listener (gRPC): one server span per
/// `ShouldRateLimit` call, named by its method, with the rule, decision and numbers of the
/// descriptor the answer follows, from a client generated from the protos.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_rate_limit_call_is_a_span_with_its_decision() {
    let collector = Collector::start(Otlp::Http);
    let otel = collector.vars();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .unwrap();
    let file = file.display().to_string();
    let gateway = Gateway::start_decide(None, &vars(&otel, &[("RLS_CONFIG", &file)])).await;
    let script = r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
for _ in range(3):
    r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[
        ratelimit_pb2.RateLimitDescriptor(entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value="4.4.4.4")])]))
    print(rls_pb2.RateLimitResponse.Code.Name(r.overall_code))
"#;
    let printed = crate::rls::python_client(script, gateway.decide.unwrap()).await;
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["OK", "OK", "OVER_LIMIT"]);
    let mut spans = collector.wait_for(3, |span| kind(span) == SERVER).await;
    spans.sort_by_key(|span| span["start_time_unix_nano"].as_u64().unwrap_or(0));
    let route = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    for span in &spans {
        assert_eq!(span["name"], format!("POST {route}").as_str());
        assert_eq!(attribute(span, "http.route"), route);
        assert_eq!(attribute(span, "tollgate.door"), "rls");
        assert_eq!(attribute(span, "tollgate.limit"), 2);
        assert!(
            attribute(span, "tollgate.rule")
                .as_str()
                .is_some_and(|rule| !rule.is_empty()),
            "{span}"
        );
    }
    let decisions: Vec<&Value> = spans
        .iter()
        .map(|span| attribute(span, "tollgate.decision"))
        .collect();
    assert_eq!(decisions, ["allowed", "allowed", "limited"]);
    let remaining: Vec<&Value> = spans
        .iter()
        .map(|span| attribute(span, "tollgate.remaining"))
        .collect();
    assert_eq!(remaining, [1, 0, 0]);
    gateway.stop().await;
}
