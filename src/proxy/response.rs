//! Responses the gateway writes itself (400, 405, 408, 429, 501, 502, 503, 504). The
//! rate-limit headers it adds to every decided response are [`crate::limit_headers`]'s.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::{ProxyError, ResponseBody};
use crate::limit::{Decision, Rule};
use crate::limit_headers::{integer_value, retry_after_secs};
use crate::refusal::{Refusals, Violated};

/// A rate-limit refusal: `DENY_STATUS` (`429 Too Many Requests` by default) with
/// `Retry-After` and a body saying the same, in the format the client's `Accept` (its request's
/// `headers`) prefers of ours, else `DENY_FORMAT` (see [`crate::refusal`]); `rule` decided it.
pub(crate) fn too_many_requests(
    refusals: &Refusals,
    headers: &HeaderMap,
    rule: &Rule,
    decision: &Decision,
) -> Response<ResponseBody> {
    let retry_after = retry_after_secs(decision.retry_after);
    let format = refusals.negotiate(headers);
    // Without `format!` or serde_json: this is every refused request's answer.
    let body = refusals.body(
        format,
        refusals.status(),
        Violated::of(rule, decision),
        retry_after,
    );
    let mut response = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *response.status_mut() = refusals.status();
    refusals.set_headers(response.headers_mut(), format);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, integer_value(retry_after));
    response
}

/// `DENY_STATUS` for a client a `deny` override refuses: the refusal's body without a retry
/// time, and no `Retry-After` (no wait would lift it).
pub(crate) fn denied(refusals: &Refusals, headers: &HeaderMap, rule: &Rule) -> Response<ResponseBody> {
    let format = refusals.negotiate(headers);
    let body = refusals.denial(format, refusals.status(), Violated::rule(&rule.name));
    let mut response = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *response.status_mut() = refusals.status();
    refusals.set_headers(response.headers_mut(), format);
    response
}

/// `503` for `FAIL_MODE=closed` while the store cannot decide.
pub(crate) fn store_unavailable() -> Response<ResponseBody> {
    let mut response = json(
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":"rate limiter unavailable","retry_after":1}"#.to_owned(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `503` for a request past the cap of requests in flight (`MAX_CONNECTIONS`).
pub(crate) fn overloaded() -> Response<ResponseBody> {
    let mut response = json(
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":"overloaded","reason":"too many requests in flight","retry_after":1}"#.to_owned(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `400` for a request the gateway will not read two ways (an ambiguous path or identity);
/// `reason` says what, in a few words.
pub(crate) fn bad_request(reason: &str) -> Response<ResponseBody> {
    refused(StatusCode::BAD_REQUEST, reason)
}

/// A refusal with `status`: `{"error":"<status text>","reason":"<reason>"}`.
pub(crate) fn refused(status: StatusCode, reason: &str) -> Response<ResponseBody> {
    let error = status.canonical_reason().unwrap_or("error").to_ascii_lowercase();
    let reason = reason.replace(['"', '\\'], "'");
    json(status, format!(r#"{{"error":"{error}","reason":"{reason}"}}"#))
}

/// 502 or 504 for the backend's failures, 400 or 408 for the client's, by where the failure
/// came from.
pub(crate) fn from_error(error: &ProxyError) -> Response<ResponseBody> {
    let (status, message) = match error {
        ProxyError::Upstream(_) => (StatusCode::BAD_GATEWAY, "bad gateway"),
        ProxyError::UpstreamTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, "gateway timeout"),
        ProxyError::Downstream(_) => (StatusCode::BAD_REQUEST, "bad request"),
        ProxyError::BodyUnreadable => {
            return refused(StatusCode::BAD_REQUEST, "the request body could not be read");
        }
        ProxyError::BodyIdle(_) => {
            return refused(StatusCode::REQUEST_TIMEOUT, "the request body stalled");
        }
        ProxyError::BodyTooSlow(_) => {
            return refused(StatusCode::REQUEST_TIMEOUT, "the request body is too slow");
        }
    };
    json(status, format!(r#"{{"error":"{message}"}}"#))
}

/// `429` for an upgrade past `MAX_UPGRADES_PER_CLIENT`. No `Retry-After`: a slot comes back
/// when one of the client's own tunnels closes, not at a time the gateway can tell.
pub(crate) fn too_many_upgrades(limit: u32) -> Response<ResponseBody> {
    json(
        StatusCode::TOO_MANY_REQUESTS,
        format!(r#"{{"error":"too many upgraded connections","limit":{limit}}}"#),
    )
}

fn json(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::limit::LimitDecision;
    use crate::limit_headers::set_rate_limit_headers;

    #[test]
    fn a_429_says_when_to_come_back() {
        let decision = Decision::one(LimitDecision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after: Duration::from_millis(99_500),
            reset_after: Duration::from_secs(500),
            at_us: 0,
        });
        let rule = general_rule();
        let mut response = too_many_requests(&Refusals::default(), &HeaderMap::new(), &rule, &decision);
        set_rate_limit_headers(response.headers_mut(), &decision);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "100");
        let body = futures_util::FutureExt::now_or_never(response.body_mut().collect())
            .unwrap()
            .unwrap()
            .to_bytes();
        assert_eq!(body, r#"{"error":"rate limit exceeded","retry_after":100}"#);
        assert_eq!(response.headers()["x-ratelimit-limit"], "5");
        assert_eq!(response.headers()["x-ratelimit-remaining"], "0");
        let reset: u64 = response.headers()["x-ratelimit-reset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!((now + 500..=now + 501).contains(&reset));
        assert_eq!(response.headers()["content-type"], "application/json");
    }

    fn general_rule() -> Rule {
        let policy = crate::limit::Policy::TokenBucket(crate::limit::algorithm::TokenBucket {
            capacity: 5,
            interval_us: 1_000_000,
        });
        Rule::new(0, "general", policy)
    }

    fn refusal(refusals: &Refusals, accept: Option<&str>) -> (Response<ResponseBody>, String) {
        let decision = Decision::one(LimitDecision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after: Duration::from_secs(3),
            reset_after: Duration::from_secs(5),
            at_us: 0,
        });
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        }
        let mut response = too_many_requests(refusals, &headers, &general_rule(), &decision);
        let body = futures_util::FutureExt::now_or_never(response.body_mut().collect())
            .unwrap()
            .unwrap()
            .to_bytes();
        (response, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn a_refusal_has_the_configured_status_and_the_negotiated_body() {
        use crate::refusal::DenyFormat;
        let refusals = Refusals::new(StatusCode::SERVICE_UNAVAILABLE, DenyFormat::Text, true);
        let (response, body) = refusal(&refusals, None);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "3");
        assert_eq!(response.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(
            body,
            "rate limit exceeded (policy \"general\"); retry after 3 s\n"
        );

        let (response, body) = refusal(&refusals, Some("application/problem+json"));
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["status"], 503);
        assert_eq!(problem["retry-after"], 3);
        assert!(response.headers().get("cache-control").is_none());

        let (response, body) = refusal(&refusals, Some("*/*"));
        assert_eq!(response.headers()["content-type"], "text/plain; charset=utf-8");
        assert!(body.starts_with("rate limit exceeded"));

        let cacheable = Refusals::new(StatusCode::NOT_FOUND, DenyFormat::Json, true);
        let (response, body) = refusal(&cacheable, Some("application/json"));
        assert_eq!(response.status(), 404);
        assert_eq!(response.headers()["cache-control"], "no-store");
        assert_eq!(body, r#"{"error":"rate limit exceeded","retry_after":3}"#);
    }
}
