//! Responses the gateway writes itself (400, 405, 408, 429, 501, 502, 503, 504), and the rate-limit headers it adds to every decided
//! response.
//!
//! `RATE_LIMIT_HEADERS` picks the headers ([`HeaderStyle`]):
//! - `legacy`: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix
//!   seconds at which the budget is entirely back, as GitHub's API uses them);
//! - `draft`: `RateLimit-Policy` and `RateLimit` of the IETF draft (see [`super::draft_headers`]);
//! - `both`, or `none` (nothing about the limits is revealed; a 429 still has `Retry-After`).
//!
//! Ours replace any the backend sent. `Retry-After` is whole seconds, rounded up, at least 1
//! (RFC 9110 section 10.2.3).

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::{ProxyError, ResponseBody, draft_headers};
use crate::limit::{Decision, Rule};

/// Which rate-limit headers responses carry (`RATE_LIMIT_HEADERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `X-RateLimit-*` (the default).
    Legacy,
    /// `RateLimit-Policy` and `RateLimit`.
    Draft,
    /// Both sets.
    Both,
    /// None: nothing about the limits is revealed (a 429 still carries `Retry-After`).
    None,
}

impl HeaderStyle {
    /// Parse `legacy`, `draft`, `both` or `none`.
    pub fn parse(value: &str) -> Option<HeaderStyle> {
        match value {
            "legacy" => Some(HeaderStyle::Legacy),
            "draft" => Some(HeaderStyle::Draft),
            "both" => Some(HeaderStyle::Both),
            "none" => Some(HeaderStyle::None),
            _ => None,
        }
    }

    /// The value as written in `RATE_LIMIT_HEADERS`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderStyle::Legacy => "legacy",
            HeaderStyle::Draft => "draft",
            HeaderStyle::Both => "both",
            HeaderStyle::None => "none",
        }
    }

    /// Set this style's headers for `decision` under `rule`, replacing the backend's.
    ///
    /// For the draft, `t` is the time the client can use no more than `r`: on a denial that
    /// is exactly `Retry-After` (so `Retry-After` is never earlier than `t`, as section 6 of
    /// the draft asks); on an allowed request it is the time until the budget is entirely
    /// back, which tells the client no more than it may use (the budget can come back in
    /// parts sooner, never later).
    pub fn set(self, headers: &mut HeaderMap, rule: &Rule, decision: &Decision) {
        if matches!(self, HeaderStyle::Legacy | HeaderStyle::Both) {
            set_rate_limit_headers(headers, decision);
        }
        if matches!(self, HeaderStyle::Draft | HeaderStyle::Both) {
            let t = if decision.allowed {
                ceil_secs(decision.reset_after)
            } else {
                retry_after_secs(decision.retry_after)
            };
            let window = ceil_secs(rule.policy.window());
            draft_headers::set(headers, &rule.name, decision.limit, window, decision.remaining, t);
        }
    }
}

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// `429 Too Many Requests` with `Retry-After` and a JSON body saying the same.
pub fn too_many_requests(decision: &Decision) -> Response<ResponseBody> {
    const START: &str = r#"{"error":"rate limit exceeded","retry_after":"#;
    let retry_after = retry_after_secs(decision.retry_after);
    // Without `format!`: this is every refused request's answer.
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(retry_after);
    let mut body = String::with_capacity(START.len() + digits.len() + 1);
    body.push_str(START);
    body.push_str(digits);
    body.push('}');
    let mut response = json(StatusCode::TOO_MANY_REQUESTS, body);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, integer_value(retry_after));
    response
}

/// `503` for `FAIL_MODE=closed` while the store cannot decide.
pub fn store_unavailable() -> Response<ResponseBody> {
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
pub fn overloaded() -> Response<ResponseBody> {
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
pub fn bad_request(reason: &str) -> Response<ResponseBody> {
    refused(StatusCode::BAD_REQUEST, reason)
}

/// A refusal with `status`: `{"error":"<status text>","reason":"<reason>"}`.
pub fn refused(status: StatusCode, reason: &str) -> Response<ResponseBody> {
    let error = status.canonical_reason().unwrap_or("error").to_ascii_lowercase();
    let reason = reason.replace(['"', '\\'], "'");
    json(status, format!(r#"{{"error":"{error}","reason":"{reason}"}}"#))
}

/// 502 or 504 for the backend's failures, 400 or 408 for the client's, by where the failure
/// came from.
pub fn from_error(error: &ProxyError) -> Response<ResponseBody> {
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

/// Set the three rate-limit headers, replacing the backend's.
pub fn set_rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    let reset_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(decision.reset_after);
    headers.insert(&X_RATELIMIT_LIMIT, integer_value(decision.limit));
    headers.insert(&X_RATELIMIT_REMAINING, integer_value(decision.remaining));
    headers.insert(&X_RATELIMIT_RESET, integer_value(ceil_secs(reset_at)));
}

/// How many integers, from 0, [`integer_value`] keeps made.
const SMALL_INTEGERS: usize = 1024;

/// The header values of 0 to [`SMALL_INTEGERS`] - 1, made once, at their first use, over one
/// leaked string of their digits (2,986 bytes): a clone of a static value allocates nothing
/// and shares no counter between threads. Limits, remaining budgets and `Retry-After`
/// seconds are mostly small, and a refusal's remaining budget is always 0.
static SMALL_VALUES: LazyLock<Box<[HeaderValue]>> = LazyLock::new(|| {
    let mut digits = String::new();
    let ends: Vec<usize> = (0..SMALL_INTEGERS)
        .map(|n| {
            digits.push_str(itoa::Buffer::new().format(n));
            digits.len()
        })
        .collect();
    let digits: &'static str = Box::leak(digits.into_boxed_str());
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let value = HeaderValue::from_static(&digits[start..end]);
            start = end;
            value
        })
        .collect()
});

/// `n` as a header value: for a small `n` a copy of one made at startup, else in one
/// allocation (`HeaderValue::from(u64)` makes two: a 20-byte buffer, then, as its length is
/// not its capacity, a shared header for it).
pub fn integer_value(n: u64) -> HeaderValue {
    if let Some(value) = usize::try_from(n).ok().and_then(|n| SMALL_VALUES.get(n)) {
        return value.clone();
    }
    let mut digits = itoa::Buffer::new();
    // Digits are always a valid header value; `n` is the (never taken) way round.
    HeaderValue::from_str(digits.format(n)).unwrap_or_else(|_| HeaderValue::from(n))
}

/// Whole seconds, rounded up, at least 1.
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after).max(1)
}

/// `429` for an upgrade past `MAX_UPGRADES_PER_CLIENT`. No `Retry-After`: a slot comes back
/// when one of the client's own tunnels closes, not at a time the gateway can tell.
pub fn too_many_upgrades(limit: u32) -> Response<ResponseBody> {
    json(
        StatusCode::TOO_MANY_REQUESTS,
        format!(r#"{{"error":"too many upgraded connections","limit":{limit}}}"#),
    )
}

fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
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
    use super::*;

    #[test]
    fn integers_are_written_as_display_writes_them() {
        let small = SMALL_INTEGERS as u64;
        for n in (0..small + 10).chain([99_999, 1_000_000, u64::MAX]) {
            assert_eq!(integer_value(n), n.to_string().as_str());
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }

    #[test]
    fn a_429_says_when_to_come_back() {
        let decision = Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after: Duration::from_millis(99_500),
            reset_after: Duration::from_secs(500),
            at_us: 0,
        };
        let mut response = too_many_requests(&decision);
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
    }
}
