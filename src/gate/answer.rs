//! From an [`Admission`] to its answer, one mapping for every door: the refusal (`DENY_STATUS`
//! with a body in the client's format, see [`crate::refusal`]; `Retry-After`), the `503` of
//! a store that could not decide under `FAIL_MODE=closed`, the answer to a `deny` override,
//! the rate-limit headers (`RATE_LIMIT_HEADERS`, see [`crate::limit_headers`]) and the draft
//! fields a forwarded request carries (`FORWARD_RATELIMIT_HEADERS`). The proxy, forward-auth,
//! `/v1/check` (whose JSON body carries the same numbers) and Envoy's door (whose gRPC answer
//! carries the same header list and body) all answer through it, so one state reads the same
//! whichever door asked. `http` types only: what a door's server makes of them is its own.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::Admission;
use crate::algorithms::Decision;
use crate::limit_headers::{self, HeaderStyle, integer_value, retry_after_secs};
use crate::outcome::Outcome;
use crate::refusal::{DenyFormat, Refusals, Violated};
use crate::rules::{Mode, Rule};

/// The body of the `503` a store that could not decide is answered with (`FAIL_MODE=closed`).
const STORE_UNAVAILABLE: &[u8] = br#"{"error":"rate limiter unavailable","retry_after":1}"#;

/// How every door's answers are shaped: made once from the configuration, shared by the doors.
#[derive(Debug, Clone)]
pub struct Answers {
    /// `RATE_LIMIT_HEADERS`.
    headers: HeaderStyle,
    /// `DENY_STATUS` and `DENY_FORMAT`.
    refusals: Refusals,
    /// `FORWARD_RATELIMIT_HEADERS`: the request forwarded carries the draft `RateLimit` and
    /// `RateLimit-Policy` fields its client is told, the client's own removed.
    forward_headers: bool,
}

impl Default for Answers {
    fn default() -> Answers {
        Answers::new(HeaderStyle::Legacy, Refusals::default(), false)
    }
}

/// Who a refusal is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// The client itself (the proxy, Envoy's door, a service's layer): `DENY_STATUS`; a JSON
    /// body says when to retry.
    Client,
    /// A proxy that asked before forwarding (forward-auth): the status it asked for
    /// (`DENY_STATUS`, or `?status=`); a JSON body is the constant
    /// `{"error":"rate limit exceeded"}` (a flood of refusals is the case to make cheap, and
    /// `Retry-After` says the rest); a store that could not decide is `503`, or the `401` or
    /// `403` asked for (nginx's `auth_request` passes only those on).
    CallingProxy(StatusCode),
}

impl Answers {
    /// Answers with the headers of `headers`, refusals shaped by `refusals`, and the budget
    /// told to the backend when `forward_headers`.
    pub(crate) fn new(headers: HeaderStyle, refusals: Refusals, forward_headers: bool) -> Answers {
        Answers {
            headers,
            refusals,
            forward_headers,
        }
    }

    /// The gateway's own answer to `admission` when it does not go ahead (`None` when it
    /// does), for a client whose request carried `request` headers (its `Accept`), written for
    /// `to`; with the rate-limit headers ([`Answers::set_headers`]).
    pub fn refusal(&self, admission: &Admission, request: &HeaderMap, to: Refuse) -> Option<Response<Bytes>> {
        if admission.forwards() {
            return None;
        }
        let mut response = self.refusal_of(
            admission.rule(),
            admission.decision(),
            admission.outcome(),
            request,
            to,
        );
        self.set_headers(admission, response.headers_mut());
        Some(response)
    }

    /// The refusal of a request that `outcome` under `rule` (with the store's `decision`, if
    /// one was made) does not let through: see [`Answers::refusal`], without the rate-limit
    /// headers (for a door whose answer lists its own, Envoy's).
    pub(crate) fn refusal_of(
        &self,
        rule: &Rule,
        decision: Option<&Decision>,
        outcome: Outcome,
        request: &HeaderMap,
        to: Refuse,
    ) -> Response<Bytes> {
        let status = match to {
            Refuse::Client => self.refusals.status(),
            Refuse::CallingProxy(status) => status,
        };
        if outcome == Outcome::FailClosed {
            let status = match (to, status) {
                (Refuse::CallingProxy(_), StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => status,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut response = Response::new(Bytes::from_static(STORE_UNAVAILABLE));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, DenyFormat::Json.content_type());
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
        let format = self.refusals.negotiate(request);
        let constant = matches!(to, Refuse::CallingProxy(_)) && format == DenyFormat::Json;
        let (body, retry_after) = match decision {
            Some(decision) => {
                let retry_after = retry_after_secs(decision.retry_after);
                let policies = Violated::of(rule, decision);
                let body = match constant {
                    true => self.refusals.denial(format, status, policies),
                    false => self.refusals.body(format, status, policies, retry_after),
                };
                (body, Some(retry_after))
            }
            // A `deny` override: no wait would lift it, so no retry time.
            None => (
                self.refusals.denial(format, status, Violated::rule(&rule.name)),
                None,
            ),
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        self.refusals.set_headers(response.headers_mut(), format);
        if let Some(retry_after) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, integer_value(retry_after));
        }
        response
    }

    /// The rate-limit headers of `admission`'s enforced decision (`RATE_LIMIT_HEADERS`),
    /// replacing any there (the backend's). A shadow rule is invisible to clients, and a
    /// request not decided has nothing to tell. They tell the decision as it was made: a
    /// refund shows on the next response.
    pub fn set_headers(&self, admission: &Admission, headers: &mut HeaderMap) {
        if admission.mode() == Mode::Enforce
            && let Some(decision) = admission.decision()
        {
            self.headers.set(headers, admission.rule(), decision);
        }
    }

    /// What the request forwarded (to the backend, or by the calling proxy) is told of its
    /// client's budget under `FORWARD_RATELIMIT_HEADERS`: the draft fields of the enforced
    /// decision that let it through, the client's own replaced; with no decision to tell
    /// (exempt, shadowed, the store unavailable) the client's fields are removed, so the
    /// backend never reads a budget the client wrote. Without the setting, nothing changes.
    pub fn set_forwarded(&self, admission: &Admission, headers: &mut HeaderMap) {
        if !self.forward_headers {
            return;
        }
        match admission.decision() {
            Some(decision) if admission.mode() == Mode::Enforce => {
                limit_headers::set_draft(headers, admission.rule(), decision)
            }
            _ => limit_headers::draft::remove(headers),
        }
    }

    /// The draft fields of `decision` under `rule` for the request forwarded, as
    /// [`Answers::set_forwarded`] sets them, for a door that names its own rule (Envoy's);
    /// nothing without `FORWARD_RATELIMIT_HEADERS`.
    pub(crate) fn set_forwarded_of(&self, rule: &Rule, decision: &Decision, headers: &mut HeaderMap) {
        if self.forward_headers {
            limit_headers::set_draft(headers, rule, decision);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::algorithms::LimitDecision;
    use crate::limit_headers::set_rate_limit_headers;

    fn refused(retry_after: Duration, reset_after: Duration) -> Decision {
        Decision::one(LimitDecision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after,
            reset_after,
            at_us: 0,
        })
    }

    fn general_rule() -> Rule {
        let policy = crate::algorithms::Policy::TokenBucket(crate::algorithms::TokenBucket {
            capacity: 5,
            interval_us: 1_000_000,
        });
        Rule::new(0, "general", policy)
    }

    /// Moved from the proxy's own refusal, which this mapping replaced: its assertions kept.
    #[test]
    fn a_429_says_when_to_come_back() {
        let decision = refused(Duration::from_millis(99_500), Duration::from_secs(500));
        let rule = general_rule();
        let mut response = Answers::default().refusal_of(
            &rule,
            Some(&decision),
            Outcome::Limited,
            &HeaderMap::new(),
            Refuse::Client,
        );
        set_rate_limit_headers(response.headers_mut(), &decision);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "100");
        assert_eq!(
            response.body(),
            r#"{"error":"rate limit exceeded","retry_after":100}"#
        );
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

    fn refusal(refusals: &Refusals, accept: Option<&str>) -> (Response<Bytes>, String) {
        let decision = refused(Duration::from_secs(3), Duration::from_secs(5));
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        }
        let answers = Answers::new(HeaderStyle::Legacy, refusals.clone(), false);
        let response = answers.refusal_of(
            &general_rule(),
            Some(&decision),
            Outcome::Limited,
            &headers,
            Refuse::Client,
        );
        let body = String::from_utf8(response.body().to_vec()).unwrap();
        (response, body)
    }

    /// Moved from the proxy's own refusal, which this mapping replaced: its assertions kept.
    #[test]
    fn a_refusal_has_the_configured_status_and_the_negotiated_body() {
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

    #[test]
    fn a_calling_proxy_gets_its_status_a_constant_json_body_and_the_same_retry_after() {
        let decision = refused(Duration::from_millis(2_500), Duration::from_secs(5));
        let answers = Answers::default();
        let for_client = answers.refusal_of(
            &general_rule(),
            Some(&decision),
            Outcome::Limited,
            &HeaderMap::new(),
            Refuse::Client,
        );
        let for_proxy = answers.refusal_of(
            &general_rule(),
            Some(&decision),
            Outcome::Limited,
            &HeaderMap::new(),
            Refuse::CallingProxy(StatusCode::FORBIDDEN),
        );
        assert_eq!(for_proxy.status(), 403);
        assert_eq!(for_proxy.body(), r#"{"error":"rate limit exceeded"}"#);
        assert_eq!(for_client.headers()["retry-after"], "3");
        assert_eq!(for_proxy.headers()["retry-after"], "3");
        // A store that could not decide: 503 for the client, the 403 nginx passes on.
        for (to, status) in [
            (Refuse::Client, 503),
            (Refuse::CallingProxy(StatusCode::FORBIDDEN), 403),
            (Refuse::CallingProxy(StatusCode::TOO_MANY_REQUESTS), 503),
        ] {
            let unavailable =
                answers.refusal_of(&general_rule(), None, Outcome::FailClosed, &HeaderMap::new(), to);
            assert_eq!(unavailable.status(), status, "{to:?}");
            assert_eq!(unavailable.headers()["retry-after"], "1");
            assert_eq!(unavailable.body(), STORE_UNAVAILABLE);
        }
    }
}
