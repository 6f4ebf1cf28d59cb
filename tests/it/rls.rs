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
    let (gate, _) = tollgate::standalone_gate(config).unwrap();
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
    // tollgate's extension, refused as precisely.
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      limits: [token_bucket:20:10]\n",
    )
    .unwrap();
    let error = Config::from_vars([
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("RLS_CONFIG", file.to_str().unwrap()),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("edge.yaml:5: descriptors[0].rate_limit.unit: should not specify unit beside limits"),
        "{error}"
    );
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

/// What `script` prints, run by python3 with the client generated from `proto/` by
/// grpcio-tools (its directory the first argument) and `address` the second.
pub(crate) async fn python_client(script: &str, address: std::net::SocketAddr) -> String {
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
        .args(["-c", script])
        .arg(stubs.path())
        .arg(address.to_string())
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    printed
}

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
    let printed = python_client(PYTHON_CLIENT, address).await;
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

/// tollgate's extension of `rate_limit`: an algorithm for the unit's numbers, and limit lists.
/// The refill of a token bucket is slow (one a second at best) so no test depends on timing
/// finer than a second; the windows are days.
const EXTENDED: &str = "
domain: edge
descriptors:
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 30}
  - key: tenant
    rate_limit:
      name: tenant
      limits: [token_bucket:10:0.001, fixed_window:6:86400]
  - key: slow
    rate_limit: {algorithm: gcra, unit: day, requests_per_unit: 20}
  - key: sliding
    rate_limit: {algorithm: sliding_window, unit: day, requests_per_unit: 4}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: day, requests_per_unit: 3}
  - key: fixed
    rate_limit: {algorithm: fixed_window, unit: day, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 2}
";

fn extended_config(dir: &Path, extra: &[(&str, &str)]) -> Config {
    let file = dir.join("extended.yaml");
    std::fs::write(&file, EXTENDED).unwrap();
    let file = file.display().to_string();
    let mut vars = vec![
        ("BACKEND_URL".to_owned(), "http://127.0.0.1:9".to_owned()),
        ("RLS_CONFIG".to_owned(), file),
        ("FORWARD_RATELIMIT_HEADERS".to_owned(), "true".to_owned()),
        ("DECIDE_PORT".to_owned(), "8081".to_owned()),
    ];
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_vars(vars).unwrap()
}

/// What an answer says that does not depend on the clock: the overall code, each status's
/// code, remaining and current limit, and the budget each forwarded draft field gives (`r`).
fn timeless(response: &RateLimitResponse) -> String {
    let statuses: Vec<String> = response
        .statuses
        .iter()
        .map(|status| {
            let limit = status
                .current_limit
                .as_ref()
                .map(|limit| format!("{}/{}", limit.requests_per_unit, limit.unit));
            format!("{:?} {} {limit:?}", code(status), status.limit_remaining)
        })
        .collect();
    let budgets: Vec<String> = response
        .request_headers_to_add
        .iter()
        .map(|header| {
            header
                .value
                .split(", ")
                .map(|member| member.split(";t=").next().unwrap_or(member))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    format!("{:?} {statuses:?} {budgets:?}", code_of(response))
}

/// The extended configuration's service twice: on the memory store, and on `redis`.
fn in_memory_and_in_redis(redis: &RedisServer) -> (RateLimitService, RateLimitService) {
    let addr = redis.addr();
    let dir = tempfile::tempdir().unwrap();
    let memory = service(&extended_config(dir.path(), &[]));
    let shared = service(&extended_config(
        dir.path(),
        &[
            ("REDIS_ADDR", addr.as_str()),
            ("KEY_HASH_SECRET", "0123456789abcdef0123"),
            ("REDIS_TIMEOUT_MS", "5000"),
            ("FAIL_MODE", "closed"),
        ],
    ));
    (memory, shared)
}

/// The same requests through the memory store and through Redis: the same answers, limit by
/// limit (each descriptor of several costs, one over the budget of some).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_and_list_answers_alike_in_memory_and_in_redis() {
    let redis = RedisServer::start();
    let (memory, shared) = in_memory_and_in_redis(&redis);
    let (mut asked, mut allowed) = (0, 0);
    for round in 0..4u64 {
        for key in ["slow", "tenant", "sliding", "log", "fixed", "plain"] {
            for hits in [1, 2, 5] {
                let mut one = request("edge", &[&[(key, "client")]]);
                one.descriptors[0].hits_addend = Some(hits + round);
                let (in_memory, in_redis) = (
                    memory.check(&one).await.unwrap(),
                    shared.check(&one).await.unwrap(),
                );
                assert_eq!(
                    timeless(&in_memory),
                    timeless(&in_redis),
                    "{key} x{}",
                    hits + round
                );
                asked += 1;
                allowed += usize::from(code_of(&in_memory) == Code::Ok);
            }
        }
    }
    // Of costs 1, 2, 5, then 2, 3, 6, ... each: slow 6 (20 in all), tenant 3 (the daily 6 is
    // nearer), sliding 2, log 2, fixed 1 and plain 1.
    assert_eq!((asked, allowed), (72, 15));
    // Every limit of the list has its own key, under the rule's name (a fixed window's
    // script keeps `:w`, the newest window it counted in, beside its count).
    let keys = redis.cli(&["--scan", "--pattern", "*rls/edge/tenant*"]);
    assert_eq!(
        keys.lines().filter(|key| !key.ends_with(":w")).count(),
        2,
        "{keys}"
    );
}

/// A refusal is remembered on Redis's side of the gateway (the denial cache) for the request it
/// refused, not for a costlier one: that one has longer to wait, and is told so, as the memory
/// store tells it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costlier_request_after_a_refusal_is_told_its_own_retry_time_in_memory_and_in_redis() {
    let redis = RedisServer::start();
    let (memory, shared) = in_memory_and_in_redis(&redis);
    let retry_after = |response: &RateLimitResponse| {
        response
            .response_headers_to_add
            .iter()
            .find(|header| header.key == "Retry-After")
            .map(|header| header.value.clone())
    };
    // The bucket: 30, one back every 2 s. 29 spent, then costs of 4, 10 and 4 again: 3, 9 and
    // 3 tokens short.
    for (hits, code, retry) in [
        (29, Code::Ok, None),
        (4, Code::OverLimit, Some("6")),
        (10, Code::OverLimit, Some("18")),
        (4, Code::OverLimit, Some("6")),
        (10, Code::OverLimit, Some("18")),
    ] {
        let mut one = request("edge", &[&[("bucket", "client")]]);
        one.hits_addend = hits;
        for (store, service) in [("memory", &memory), ("redis", &shared)] {
            let response = service.check(&one).await.unwrap();
            assert_eq!(
                (code_of(&response), retry_after(&response).as_deref()),
                (code, retry),
                "{store}: a cost of {hits}"
            );
        }
    }
}

/// The real binary, a client generated from the protos: a token bucket's burst and then its
/// steady refill (one every 2 s, not a window's worth at once), and a list refused by its
/// second limit with the first's budget unspent.
const PYTHON_EXTENDED: &str = r#"
import sys, time, grpc, json
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
Code, Unit = rls_pb2.RateLimitResponse.Code, rls_pb2.RateLimitResponse.RateLimit.Unit
def ask(key, hits=0):
    d = ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value="c")])
    r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[d], hits_addend=hits))
    s = r.statuses[0]
    return r, "%s %d %d %s" % (Code.Name(s.code), s.limit_remaining, s.current_limit.requests_per_unit,
                               Unit.Name(s.current_limit.unit))
burst = [ask("bucket") for _ in range(30)]
print(burst[0][1]); print(burst[29][1])
refused, said = ask("bucket")
print(said, json.loads(refused.raw_body)["retry_after"], refused.statuses[0].duration_until_reset.seconds >= 57)
time.sleep(2.3)
print(ask("bucket")[1]); print(ask("bucket")[1])
print(ask("tenant", 5)[1])
print(ask("tenant", 5)[1])
allowed, said = ask("tenant", 1)
print(said, ";".join(h.key + "=" + h.value for h in allowed.request_headers_to_add))
"#;

async fn algorithms_through_the_binary(store: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("extended.yaml");
    std::fs::write(&file, EXTENDED).unwrap();
    let file = file.display().to_string();
    let [decide] = crate::support::free_ports();
    let decide_port = decide.to_string();
    let mut vars = vec![
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("RLS_CONFIG", file.as_str()),
        ("DECIDE_PORT", decide_port.as_str()),
        ("FORWARD_RATELIMIT_HEADERS", "true"),
    ];
    vars.extend_from_slice(store);
    let tollgate = crate::binary::Running::start(&vars);
    let address: std::net::SocketAddr = format!("127.0.0.1:{decide}").parse().unwrap();
    crate::support::redis::wait_for(
        || std::net::TcpStream::connect(address).is_ok(),
        "the decide port to listen",
    );
    let printed = python_client(PYTHON_EXTENDED, address).await;
    let tenant = "rls/edge/tenant";
    assert_eq!(
        printed.lines().take(7).collect::<Vec<_>>(),
        [
            // A burst of 30, a token bucket's capacity, in the unit nearest its refill time.
            "OK 29 30 MINUTE",
            "OK 0 30 MINUTE",
            // Refused: retry when the next token is in (2 s), full again in a minute.
            "OVER_LIMIT 0 30 MINUTE 2 True",
            // 2 s later: one token, not a window's worth.
            "OK 0 30 MINUTE",
            "OVER_LIMIT 0 30 MINUTE",
            // The list: the fixed window (6 a day) is nearest its end.
            "OK 1 6 DAY",
            // Refused by the daily window with the bucket (10, 10000 s to fill: HOUR) able to.
            "OVER_LIMIT 0 6 DAY",
        ]
    );
    // The refusal spent nothing in the bucket: 10 - 5 - 1 left, as the draft fields say.
    let last = printed.lines().nth(7).unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "OK 0 6 DAY RateLimit-Policy=\"{tenant}.1\";q=10;w=10000, \"{tenant}.2\";q=6;w=86400;\
             RateLimit=\"{tenant}.1\";r=4;t="
        )),
        "{last}"
    );
    assert!(last.contains(&format!(", \"{tenant}.2\";r=0;t=")), "{last}");
    tollgate.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithms_and_lists_through_the_binary_in_memory() {
    algorithms_through_the_binary(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithms_and_lists_through_the_binary_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    algorithms_through_the_binary(&[
        ("REDIS_ADDR", addr.as_str()),
        ("KEY_HASH_SECRET", "0123456789abcdef0123"),
        ("REDIS_TIMEOUT_MS", "5000"),
        ("FAIL_MODE", "closed"),
    ])
    .await;
}

/// envoyproxy/ratelimit's own keys, in two files of one domain (merged, as its
/// `MERGE_DOMAIN_CONFIG` merges them): wildcards in the middle and several of them, a
/// wildcard whose values share one budget (an explicit value beside it keeps its own),
/// quota mode, metadata; and per request, a descriptor's own `limit`.
const ENVOY_KEYS: [&str; 2] = [
    "
domain: edge
descriptors:
  - key: path
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: path
    value: /api/special/v1
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: multi
    value: foo*bar*baz
    value_to_metric: true
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1}
",
    "
domain: edge
descriptors:
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata:
      plan: {name: gold, weight: 2}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
",
];

const PYTHON_ENVOY_KEYS: &str = r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.type.v3 import ratelimit_unit_pb2
from google.protobuf import json_format
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
Code = rls_pb2.RateLimitResponse.Code
def descriptor(entries, limit=None):
    d = ratelimit_pb2.RateLimitDescriptor(entries=[
        ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    if limit:
        d.limit.requests_per_unit, d.limit.unit = limit
    return d
def ask(*descriptors):
    r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=list(descriptors)))
    statuses = " ".join("%s/%d/%d" % (Code.Name(s.code), s.limit_remaining, s.current_limit.requests_per_unit)
                        for s in r.statuses)
    retry = [h.value for h in r.response_headers_to_add if h.key == "Retry-After"]
    return "%s %s retry=%s" % (Code.Name(r.overall_code), statuses, retry[0] if retry else "-"), r
for value in ["/api/a/v1", "/api/b/v1", "/api/c/v1", "/api/special/v1", "/apiv1", "/api/a/v2"]:
    print(value, ask(descriptor([("path", value)]))[0])
for value in ["foo1bar2baz", "foo1bar2baz", "fooXbarYbaz", "foobaz"]:
    print(value, ask(descriptor([("multi", value)]))[0])
said, r = ask(descriptor([("quota", "a")]), descriptor([("quota2", "a")]))
print("quota", said, json_format.MessageToJson(r.dynamic_metadata, sort_keys=True, indent=None))
said, r = ask(descriptor([("quota", "b")]), descriptor([("quota2", "a")]))
print("quota", said, json_format.MessageToJson(r.dynamic_metadata, sort_keys=True, indent=None))
said, r = ask(descriptor([("quota", "a")]), descriptor([("quota2", "a")]))
print("quota", r.HasField("dynamic_metadata"), said)
day = ratelimit_unit_pb2.RateLimitUnit.Value("DAY")
for n in range(3):
    print("override", ask(descriptor([("path", "/api/special/v1")], (2, day)))[0])
hour = ratelimit_unit_pb2.RateLimitUnit.Value("HOUR")
print("override", ask(descriptor([("path", "/api/special/v1")], (2, hour)))[0])
print("override", ask(descriptor([("unknown", "x")], (1, day)))[0])
try:
    ask(descriptor([("path", "/x")], (1, 0)))
except grpc.RpcError as e:
    print(e.code().name, e.details())
"#;

async fn envoy_keys_through_the_binary(store: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in ["a.yaml", "b.yaml"].iter().zip(ENVOY_KEYS) {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let directory = dir.path().display().to_string();
    let [decide] = crate::support::free_ports();
    let decide_port = decide.to_string();
    let mut vars = vec![
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("RLS_CONFIG", directory.as_str()),
        ("RLS_MERGE_DOMAIN_CONFIG", "true"),
        ("DECIDE_PORT", decide_port.as_str()),
    ];
    vars.extend_from_slice(store);
    let tollgate = crate::binary::Running::start(&vars);
    let address: std::net::SocketAddr = format!("127.0.0.1:{decide}").parse().unwrap();
    crate::support::redis::wait_for(
        || std::net::TcpStream::connect(address).is_ok(),
        "the decide port to listen",
    );
    let printed = python_client(PYTHON_ENVOY_KEYS, address).await;
    let lines: Vec<&str> = printed.lines().collect();
    let retry = |line: &str| {
        line.rsplit_once("retry=")
            .and_then(|(_, secs)| secs.parse::<u64>().ok())
            .is_some_and(|secs| (1..=86_400).contains(&secs))
    };
    // One budget for every value /api*v1 matches; the explicit value its own.
    assert_eq!(lines[0], "/api/a/v1 OK OK/1/2 retry=-");
    assert_eq!(lines[1], "/api/b/v1 OK OK/0/2 retry=-");
    assert!(
        lines[2].starts_with("/api/c/v1 OVER_LIMIT OVER_LIMIT/0/2 retry="),
        "{}",
        lines[2]
    );
    assert!(retry(lines[2]), "Retry-After in whole seconds: {}", lines[2]);
    assert_eq!(lines[3], "/api/special/v1 OK OK/4/5 retry=-");
    // `*` matches nothing too, and a value must end as the pattern does.
    assert!(
        lines[4].starts_with("/apiv1 OVER_LIMIT OVER_LIMIT/0/2"),
        "{}",
        lines[4]
    );
    assert_eq!(lines[5], "/api/a/v2 OK OK/0/0 retry=-");
    // Several wildcards, each value its own budget (no share_threshold).
    assert_eq!(lines[6], "foo1bar2baz OK OK/0/1 retry=-");
    assert!(
        lines[7].starts_with("foo1bar2baz OVER_LIMIT OVER_LIMIT/0/1"),
        "{}",
        lines[7]
    );
    assert_eq!(lines[8], "fooXbarYbaz OK OK/0/1 retry=-");
    assert_eq!(lines[9], "foobaz OK OK/0/0 retry=-");
    // Quota mode: over only when every quota descriptor is; the metadata of those within.
    assert_eq!(
        lines[10],
        "quota OK OK/0/1 OK/0/1 retry=- {\"descriptors\": [{\"entries\": [\"quota=a\"]}, {\"entries\": [\"quota2=a\"]}], \"domain\": \"edge\", \"metadata\": {\"plan\": {\"name\": \"gold\", \"weight\": 2.0}}}"
    );
    assert_eq!(
        lines[11],
        "quota OK OK/0/1 OVER_LIMIT/0/1 retry=- {\"descriptors\": [{\"entries\": [\"quota=b\"]}, {\"entries\": [\"quota2=a\"]}], \"domain\": \"edge\", \"metadata\": {\"plan\": {\"name\": \"gold\", \"weight\": 2.0}}}"
    );
    assert!(
        lines[12].starts_with("quota False OVER_LIMIT OVER_LIMIT/0/1 OVER_LIMIT/0/1 retry="),
        "{}",
        lines[12]
    );
    assert!(retry(lines[12]), "{}", lines[12]);
    // A descriptor's own limit wins over the configured one (5 a day), even where nothing is
    // configured; a unit that is none is refused.
    assert_eq!(lines[13], "override OK OK/1/2 retry=-");
    assert_eq!(lines[14], "override OK OK/0/2 retry=-");
    assert!(
        lines[15].starts_with("override OVER_LIMIT OVER_LIMIT/0/2 retry="),
        "{}",
        lines[15]
    );
    // Another unit, another budget.
    assert_eq!(lines[16], "override OK OK/1/2 retry=-");
    assert_eq!(lines[17], "override OK OK/0/1 retry=-");
    assert_eq!(
        lines[18],
        "INVALID_ARGUMENT descriptor 0: limit.unit 0 is not a unit: expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
    );
    assert_eq!(lines.len(), 19, "{printed}");
    tollgate.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_keys_through_the_binary_in_memory() {
    envoy_keys_through_the_binary(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_keys_through_the_binary_in_redis() {
    let redis = RedisServer::start();
    let addr = redis.addr();
    envoy_keys_through_the_binary(&[
        ("REDIS_ADDR", addr.as_str()),
        ("KEY_HASH_SECRET", "0123456789abcdef0123"),
        ("REDIS_TIMEOUT_MS", "5000"),
    ])
    .await;
}

/// What each descriptor `key=c` of `keys` is answered, one ask each, in order:
/// `KEY CODE REMAINING LIMIT`.
fn python_asking(keys: &[&str]) -> String {
    let keys = keys
        .iter()
        .map(|key| format!("{key:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
for key in [{keys}]:
    d = ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value="c")])
    s = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[d])).statuses[0]
    print(key, rls_pb2.RateLimitResponse.Code.Name(s.code), s.limit_remaining, s.current_limit.requests_per_unit)
"#
    )
}

/// Until `tollgate_config_reloads_total{result="RESULT"}` is at least `count`.
async fn reloads(tollgate: &crate::binary::Running, result: &str, count: u64) {
    crate::reload::await_reloads(tollgate, result, count).await;
}

/// `RLS_CONFIG` reloads like `RULES_FILE`: on SIGHUP (`RULES_RELOAD_INTERVAL_MS=0`) and when a
/// file changes; a bad file swaps nothing; a descriptor whose rule is unchanged keeps its
/// budget, a changed one starts afresh; a file added to the directory is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_config_reloads_on_sighup_and_on_change_and_a_bad_file_swaps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    let one = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: kept\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    write(one);
    let directory = dir.path().display().to_string();
    for interval in ["0", "100"] {
        write(one);
        let _ = std::fs::remove_file(dir.path().join("other.yaml"));
        let [decide] = crate::support::free_ports();
        let decide_port = decide.to_string();
        let tollgate = crate::binary::Running::start(&[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("RLS_CONFIG", directory.as_str()),
            ("DECIDE_PORT", decide_port.as_str()),
            ("RULES_RELOAD_INTERVAL_MS", interval),
        ]);
        let address: std::net::SocketAddr = format!("127.0.0.1:{decide}").parse().unwrap();
        crate::support::redis::wait_for(
            || std::net::TcpStream::connect(address).is_ok(),
            "the decide port to listen",
        );
        let reload = || {
            if interval == "0" {
                tollgate.hangup();
            }
        };
        let asked = python_client(&python_asking(&["a", "a", "kept", "b"]), address).await;
        assert_eq!(
            asked, "a OK 0 1\na OVER_LIMIT 0 1\nkept OK 0 1\nb OK 0 0\n",
            "{interval}"
        );
        // a's limit changed, b added, kept as it was.
        write(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: kept\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
        );
        reload();
        reloads(&tollgate, "ok", 1).await;
        let asked = python_client(&python_asking(&["a", "kept", "b", "b"]), address).await;
        assert_eq!(
            asked, "a OK 2 3\nkept OVER_LIMIT 0 1\nb OK 0 1\nb OVER_LIMIT 0 1\n",
            "{interval}"
        );
        // A bad file: refused, the descriptors in force stay.
        write("domain: edge\ndescriptors:\n  - key: a\n    rate_limt: {unit: day, requests_per_unit: 3}\n");
        reload();
        reloads(&tollgate, "error", 1).await;
        let asked = python_client(&python_asking(&["a", "b"]), address).await;
        assert_eq!(asked, "a OK 1 3\nb OVER_LIMIT 0 1\n", "{interval}");
        let log = tollgate.log();
        assert!(log.contains("RLS_CONFIG") && log.contains("rate_limt"), "{log}");
        // Mended, and a second file of another domain added to the directory: both read.
        write(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: c\n    rate_limit: {unit: day, requests_per_unit: 5}\n",
        );
        std::fs::write(dir.path().join("other.yaml"), "domain: other\n").unwrap();
        reload();
        reloads(&tollgate, "ok", 2).await;
        let asked = python_client(&python_asking(&["a", "b", "c"]), address).await;
        assert_eq!(asked, "a OK 0 3\nb OK 0 0\nc OK 4 5\n", "{interval}");
        tollgate.terminate().await;
    }
}

/// `detailed_metric` and `value_to_metric` (a limit with neither counts per rule only).
const PER_DESCRIPTOR: &str = "
domain: edge
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 1}
";

const PYTHON_PER_DESCRIPTOR: &str = r#"
import sys, grpc
sys.path.insert(0, sys.argv[1])
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[2]))
def ask(*entries):
    d = ratelimit_pb2.RateLimitDescriptor(entries=[
        ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[d]))
    return rls_pb2.RateLimitResponse.Code.Name(r.overall_code)
said = [ask(("route", "api"), ("user", "u1")), ask(("route", "api"), ("user", "u2")),
        ask(("route", "api"), ("user", "u1")), ask(("route", "web"), ("user", "u1")),
        ask(("client", "a")), ask(("client", "a")), ask(("client", "x" * 100)),
        ask(("client", 'b"c\nd')), ask(("plain", "p"))]
print(" ".join(said))
# 5 descriptors so far: 995 more are kept apart, the last 5 folded into (other).
print(sum(ask(("client", "n%d" % i)) == "OK" for i in range(1000)))
"#;

/// Through the binary, with the client generated from the protos: a limit with
/// `value_to_metric` or `detailed_metric` counts each descriptor it decides in
/// `tollgate_rls_descriptor_total` under envoyproxy/ratelimit's stat key (a long value cut, a
/// quote and a newline escaped), at most 1000 descriptors apart and the rest in `(other)`; a
/// limit with neither is in no series of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_descriptor_metrics_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, PER_DESCRIPTOR).unwrap();
    let file = file.display().to_string();
    let [decide] = crate::support::free_ports();
    let decide_port = decide.to_string();
    let tollgate = crate::binary::Running::start(&[
        ("BACKEND_URL", "http://127.0.0.1:9"),
        ("RLS_CONFIG", file.as_str()),
        ("DECIDE_PORT", decide_port.as_str()),
    ]);
    let address: std::net::SocketAddr = format!("127.0.0.1:{decide}").parse().unwrap();
    crate::support::redis::wait_for(
        || std::net::TcpStream::connect(address).is_ok(),
        "the decide port to listen",
    );
    let printed = python_client(PYTHON_PER_DESCRIPTOR, address).await;
    assert_eq!(
        printed, "OK OK OVER_LIMIT OK OK OVER_LIMIT OK OK OK\n1000\n",
        "each value its own budget"
    );
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], tollgate.admin_port));
    let scraped = crate::support::get(admin, "/metrics").await;
    let text = scraped.text();
    let family = "tollgate_rls_descriptor_total{";
    let series: Vec<&str> = text.lines().filter(|line| line.starts_with(family)).collect();
    let sample = |descriptor: &str, decision: &str| {
        let name = format!("{family}domain=\"edge\",descriptor=\"{descriptor}\",decision=\"{decision}\"}} ");
        series
            .iter()
            .find_map(|line| line.strip_prefix(&name)?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics ({} series)", series.len()))
    };
    assert_eq!(sample("edge.route_api.user", "allowed"), 2);
    assert_eq!(sample("edge.route_api.user", "limited"), 1);
    assert_eq!(sample("edge.route_web.user", "allowed"), 1);
    assert_eq!(sample("edge.client_a", "allowed"), 1);
    assert_eq!(sample("edge.client_a", "limited"), 1);
    assert_eq!(sample(&format!("edge.client_{}", "x".repeat(64)), "allowed"), 1);
    assert_eq!(sample(r#"edge.client_b\"c_d"#, "allowed"), 1);
    assert_eq!(sample("edge.client_n994", "allowed"), 1);
    assert_eq!(sample("(other)", "allowed"), 5);
    assert!(
        !series.iter().any(|line| line.contains("plain")),
        "a limit without either key"
    );
    let descriptors: std::collections::HashSet<&str> = series
        .iter()
        .filter_map(|line| line.split("descriptor=\"").nth(1)?.split("\",decision").next())
        .collect();
    assert_eq!(descriptors.len(), 1001, "1000 apart and (other)");
    // The decisions are the rules' too.
    assert!(text.contains("tollgate_requests_total{rule=\"rls/edge/client\",decision=\"allowed\"} 1003"));
    tollgate.terminate().await;
}
