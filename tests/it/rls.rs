//! Envoy's rate limit service: descriptors matched and counted through the real gate, in
//! memory and against a real `redis-server` (three gateways sharing one Redis enforce one
//! exact limit), and over the wire with a client Python's grpcio-tools generates from
//! `proto/`.

use std::path::Path;
use std::sync::Arc;

use tollgate::Config;
use tollgate::testing::RateLimitService;
use tollgate::testing::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate::testing::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate::testing::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate::testing::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::support::RedisServer;

/// Units of a day: no test runs across a window's end but one started within seconds of
/// midnight UTC.
const DESCRIPTORS: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: day, requests_per_unit: 1, name: vip}
  - key: path
    value: /api/*
    rate_limit: {unit: day, requests_per_unit: 2, name: api}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: plan
    value: gold
    rate_limit:
      unit: day
      requests_per_unit: 100
      name: gold
      replaces:
        - name: api
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: shared
    rate_limit: {unit: day, requests_per_unit: 25}
";

fn config(dir: &Path, extra: &[(&str, &str)]) -> Config {
    let file = dir.join("edge.yaml");
    std::fs::write(&file, DESCRIPTORS).unwrap();
    let file = file.display().to_string();
    let mut vars = vec![
        ("BACKEND_URL".to_owned(), "http://127.0.0.1:9".to_owned()),
        ("RLS_CONFIG".to_owned(), file),
    ];
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_vars(vars).unwrap()
}

fn service(config: &Config) -> RateLimitService {
    let (gate, _) = tollgate::testing::standalone_gate(config).unwrap();
    tollgate::testing::rls_service(config, gate)
        .unwrap()
        .expect("RLS_CONFIG is set")
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|entries| descriptor(entries)).collect(),
        hits_addend: 0,
    }
}

async fn ask(service: &RateLimitService, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
    service.check(&request(domain, descriptors)).await.unwrap()
}

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

/// (code, remaining) of each status.
fn answers(response: &RateLimitResponse) -> Vec<(Code, u32)> {
    response
        .statuses
        .iter()
        .map(|status| (code(status), status.limit_remaining))
        .collect()
}

fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key == name)
        .map(|header| header.value.as_str())
}

#[tokio::test]
async fn descriptors_match_the_most_specific_limit_and_count_per_value() {
    let dir = tempfile::tempdir().unwrap();
    let rls = service(&config(dir.path(), &[]));
    let client = [("remote_address", "1.2.3.4")];
    for remaining in [2, 1, 0] {
        let answer = ask(&rls, "edge", &[&client]).await;
        assert_eq!(answers(&answer), [(Code::Ok, remaining)]);
        assert_eq!(answer.overall_code, Code::Ok as i32);
    }
    let over = ask(&rls, "edge", &[&client]).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(answers(&over), [(Code::OverLimit, 0)]);
    let limit = over.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (3, 4, "")
    );
    let reset = over.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!((0..=86_400).contains(&reset.seconds), "{reset:?}");
    // Each value of a key-only descriptor is its own budget.
    assert_eq!(
        answers(&ask(&rls, "edge", &[&[("remote_address", "5.6.7.8")]]).await),
        [(Code::Ok, 2)]
    );
    // The exact value wins over the key alone.
    let vip = [("remote_address", "10.0.0.1")];
    assert_eq!(answers(&ask(&rls, "edge", &[&vip]).await), [(Code::Ok, 0)]);
    let vip_over = ask(&rls, "edge", &[&vip]).await;
    assert_eq!(answers(&vip_over), [(Code::OverLimit, 0)]);
    assert_eq!(vip_over.statuses[0].current_limit.as_ref().unwrap().name, "vip");
    // A prefix: each value counted apart.
    for (value, expected) in [
        ("/api/x", Code::Ok),
        ("/api/x", Code::Ok),
        ("/api/x", Code::OverLimit),
        ("/api/y", Code::Ok),
    ] {
        assert_eq!(
            code(&ask(&rls, "edge", &[&[("path", value)]]).await.statuses[0]),
            expected,
            "{value}"
        );
    }
    // No match, an unknown domain: OK without a limit.
    for (domain, entries) in [
        ("edge", [("path", "/other")]),
        ("elsewhere", [("remote_address", "1.2.3.4")]),
    ] {
        let free = ask(&rls, domain, &[&entries]).await;
        assert_eq!(answers(&free), [(Code::Ok, 0)]);
        assert_eq!(free.statuses[0].current_limit, None);
        assert!(free.response_headers_to_add.is_empty());
    }
}

#[tokio::test]
async fn unlimited_shadow_replaces_and_several_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let rls = service(&config(dir.path(), &[]));
    // Unlimited: never counted.
    for _ in 0..5 {
        let free = ask(&rls, "edge", &[&[("path", "/free")]]).await;
        assert_eq!(answers(&free), [(Code::Ok, u32::MAX)]);
        assert_eq!(free.statuses[0].current_limit, None);
    }
    // Shadow: counted (the second has none left), answered OK.
    let shadowed = [("shadowed", "a")];
    assert_eq!(answers(&ask(&rls, "edge", &[&shadowed]).await), [(Code::Ok, 0)]);
    let second = ask(&rls, "edge", &[&shadowed]).await;
    assert_eq!(answers(&second), [(Code::Ok, 0)]);
    assert_eq!(second.overall_code, Code::Ok as i32);
    // Spend /api/z's budget, then ask with plan=gold beside it: gold replaces api.
    let api = [("path", "/api/z")];
    ask(&rls, "edge", &[&api]).await;
    ask(&rls, "edge", &[&api]).await;
    assert_eq!(
        ask(&rls, "edge", &[&api]).await.overall_code,
        Code::OverLimit as i32
    );
    let replaced = ask(&rls, "edge", &[&api, &[("plan", "gold")]]).await;
    assert_eq!(replaced.overall_code, Code::Ok as i32);
    assert_eq!(answers(&replaced), [(Code::Ok, 0), (Code::Ok, 99)]);
    assert_eq!(replaced.statuses[0].current_limit, None);
    // Every descriptor is enforced: one over makes the whole answer OVER_LIMIT, and the
    // headers are that one's.
    let vip = [("remote_address", "10.0.0.1")];
    ask(&rls, "edge", &[&vip]).await;
    let both = ask(&rls, "edge", &[&[("remote_address", "9.9.9.9")], &vip]).await;
    assert_eq!(answers(&both), [(Code::Ok, 2), (Code::OverLimit, 0)]);
    assert_eq!(both.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&both, "RateLimit-Limit"), Some("1"));
    assert_eq!(header(&both, "RateLimit-Remaining"), Some("0"));
    let reset: u64 = header(&both, "RateLimit-Reset").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&reset), "{reset}");
    // Without one over: the one nearest its limit.
    let near = ask(
        &rls,
        "edge",
        &[&[("remote_address", "8.8.8.8")], &[("plan", "gold")]],
    )
    .await;
    assert_eq!(header(&near, "RateLimit-Limit"), Some("3"));
    assert_eq!(header(&near, "RateLimit-Remaining"), Some("2"));
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_zero_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let rls = service(&config(dir.path(), &[]));
    let mut costly = request("edge", &[&[("remote_address", "7.7.7.7")]]);
    costly.hits_addend = 2;
    assert_eq!(answers(&rls.check(&costly).await.unwrap()), [(Code::Ok, 1)]);
    // Over: counting nothing.
    assert_eq!(
        answers(&rls.check(&costly).await.unwrap()),
        [(Code::OverLimit, 0)]
    );
    // The descriptor's own hits_addend wins over the request's; 0 is 1.
    costly.descriptors[0].hits_addend = Some(0);
    assert_eq!(answers(&rls.check(&costly).await.unwrap()), [(Code::Ok, 0)]);
}

#[tokio::test]
async fn bad_requests_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let rls = service(&config(dir.path(), &[]));
    let cases = [
        request("", &[&[("remote_address", "1.2.3.4")]]),
        request("edge", &[]),
        request("edge", &[&[("", "1.2.3.4")]]),
    ];
    for bad in cases {
        let status = rls.check(&bad).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad:?}");
    }
    let many: Vec<&[(&str, &str)]> = vec![&[("remote_address", "1")]; 65];
    assert_eq!(
        rls.check(&request("edge", &many)).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_sharing_one_redis_enforce_one_exact_limit() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let addr = redis.addr();
    // A loaded machine must not turn into fail-open answers: a generous deadline, and a
    // refusal for whatever still cannot be decided.
    let vars = [
        ("REDIS_ADDR", addr.as_str()),
        ("KEY_HASH_SECRET", "0123456789abcdef0123"),
        ("REDIS_TIMEOUT_MS", "5000"),
        ("FAIL_MODE", "closed"),
    ];
    let gateways: Vec<Arc<RateLimitService>> = (0..3)
        .map(|_| Arc::new(service(&config(dir.path(), &vars))))
        .collect();
    let mut tasks = Vec::new();
    for n in 0..300 {
        let rls = gateways[n % 3].clone();
        tasks.push(tokio::spawn(async move {
            ask(&rls, "edge", &[&[("shared", "one-client")]])
                .await
                .overall_code
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        if task.await.unwrap() == Code::Ok as i32 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 25);
    // In Redis, under the rule's name.
    let keys = redis.cli(&["--scan", "--pattern", "*rls/edge/shared*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
}

#[test]
fn redis_without_a_key_hash_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, DESCRIPTORS).unwrap();
    let error = Config::from_vars([
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("REDIS_ADDR", "127.0.0.1:6379"),
        ("RLS_CONFIG", file.to_str().unwrap()),
    ])
    .unwrap_err();
    assert!(error.to_string().contains("KEY_HASH_SECRET"), "{error}");
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limt: {}\n",
    )
    .unwrap();
    let error = Config::from_vars([
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("RLS_CONFIG", file.to_str().unwrap()),
    ])
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("RLS_CONFIG: "), "{error}");
    assert!(error.contains("edge.yaml:4: descriptors[0]"), "{error}");
    assert!(error.contains("did you mean \"rate_limit\"?"), "{error}");
}

/// A Python client generated from `proto/` by grpcio-tools at test time: what Envoy (or any
/// user of its API) sends, over a real HTTP/2 connection.
const PYTHON_CLIENT: &str = r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
channel = grpc.insecure_channel(sys.argv[2])
stub = rls_pb2_grpc.RateLimitServiceStub(channel)
def ask(domain, *descriptors):
    return stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=domain, descriptors=[
        ratelimit_pb2.RateLimitDescriptor(entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d]) for d in descriptors]))
for _ in range(3):
    r = ask("edge", [("remote_address", "4.4.4.4")])
    print(rls_pb2.RateLimitResponse.Code.Name(r.overall_code), r.statuses[0].limit_remaining,
          r.statuses[0].current_limit.requests_per_unit,
          rls_pb2.RateLimitResponse.RateLimit.Unit.Name(r.statuses[0].current_limit.unit),
          ",".join("%s=%s" % (h.key, h.value) for h in r.response_headers_to_add if h.key != "RateLimit-Reset"))
r = ask("edge", [("remote_address", "4.4.4.4")])
print(rls_pb2.RateLimitResponse.Code.Name(r.overall_code), rls_pb2.RateLimitResponse.Code.Name(r.statuses[0].code))
try:
    ask("")
except grpc.RpcError as e:
    print(e.code().name)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_the_protos_is_answered_on_the_decide_port() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, DESCRIPTORS).unwrap();
    let file = file.display().to_string();
    // The decision listener as deployed: a decision service alone, HTTP/1.1, h2c and gRPC on
    // one port.
    let gateway = crate::support::Gateway::start_decide(None, &[("RLS_CONFIG", &file)]).await;
    let address = gateway.decide.unwrap();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let stubs = tempfile::tempdir().unwrap();
    let generated = tokio::process::Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto)
        .arg(format!("--python_out={}", stubs.path().display()))
        .arg(format!("--grpc_python_out={}", stubs.path().display()))
        .args([
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "envoy/type/v3/ratelimit_unit.proto",
            "envoy/config/core/v3/base.proto",
        ])
        .output()
        .await
        .expect("python3 runs (scripts/test.sh installs grpcio-tools)");
    assert!(
        generated.status.success(),
        "grpc_tools.protoc: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let run = tokio::process::Command::new("python3")
        .args(["-c", PYTHON_CLIENT])
        .arg(stubs.path())
        .arg(address.to_string())
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [
            "OK 2 3 DAY RateLimit-Limit=3,RateLimit-Remaining=2",
            "OK 1 3 DAY RateLimit-Limit=3,RateLimit-Remaining=1",
            "OK 0 3 DAY RateLimit-Limit=3,RateLimit-Remaining=0",
            "OVER_LIMIT OVER_LIMIT",
            "INVALID_ARGUMENT",
        ]
    );
    // The same port still answers the HTTP doors.
    let check = crate::support::request(
        address,
        [127, 0, 0, 1].into(),
        http::Method::POST,
        "/v1/check",
        &[],
        bytes::Bytes::from_static(br#"{"rule":"general","key":"k"}"#),
    )
    .await;
    assert_eq!(check.status, http::StatusCode::OK, "{}", check.text());
    gateway.stop().await;
}

#[tokio::test]
async fn an_over_limit_answer_carries_the_refusal_and_an_ok_one_the_budget_for_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let shaped = [
        ("DECIDE_PORT", "8081"),
        ("DENY_FORMAT", "problem"),
        ("FORWARD_RATELIMIT_HEADERS", "true"),
    ];
    let shaped_service = service(&config(dir.path(), &shaped));
    let api: &[(&str, &str)] = &[("path", "/api/items")];
    let added = |response: &RateLimitResponse, name: &str| {
        response
            .request_headers_to_add
            .iter()
            .find(|header| header.key == name)
            .map(|header| header.value.clone())
    };
    let mut policy_name = String::new();
    for remaining in [1, 0] {
        let allowed = ask(&shaped_service, "edge", &[api]).await;
        assert_eq!(code_of(&allowed), Code::Ok);
        assert!(allowed.raw_body.is_empty());
        // The draft fields of the api limit (2 a day), for Envoy to set on the forwarded request.
        let policy = added(&allowed, "RateLimit-Policy").expect("RateLimit-Policy to add");
        assert!(policy.ends_with(";q=2;w=86400"), "{policy}");
        policy_name = policy.split('"').nth(1).unwrap().to_owned();
        let rate_limit = added(&allowed, "RateLimit").expect("RateLimit to add");
        assert!(
            rate_limit.starts_with(&format!("\"{policy_name}\";r={remaining};t=")),
            "{rate_limit}"
        );
    }
    let refused = ask(&shaped_service, "edge", &[api]).await;
    assert_eq!(code_of(&refused), Code::OverLimit);
    assert!(refused.request_headers_to_add.is_empty());
    assert_eq!(header(&refused, "content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_slice(&refused.raw_body).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!([policy_name]));
    let reset: u64 = header(&refused, "RateLimit-Reset").unwrap().parse().unwrap();
    assert_eq!(body["retry-after"], reset.max(1));

    // Unshaped (DENY_FORMAT's default): the JSON body, and nothing for the backend.
    let dir = tempfile::tempdir().unwrap();
    let service = service(&config(dir.path(), &[("DECIDE_PORT", "8081")]));
    for _ in 0..2 {
        assert!(
            ask(&service, "edge", &[api])
                .await
                .request_headers_to_add
                .is_empty()
        );
    }
    let refused = ask(&service, "edge", &[api]).await;
    assert_eq!(header(&refused, "content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&refused.raw_body).unwrap();
    assert_eq!(body["error"], "rate limit exceeded");
}

fn code_of(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}
