//! What a rate-limit refusal looks like, the same on every door that writes one (the proxy,
//! `/v1/forward-auth`): its status (`DENY_STATUS`, default `429`) and its body, in the format
//! `DENY_FORMAT` names (default `json`) unless the client's `Accept` asks for another of ours
//! ([`accept`]).
//!
//! - `json`: `{"error":"rate limit exceeded","retry_after":N}` (the proxy's answer since its
//!   first release; `/v1/forward-auth` keeps its constant `{"error":"rate limit exceeded"}`);
//! - `problem`: RFC 9457 `application/problem+json` of the problem type the IETF draft
//!   "RateLimit header fields for HTTP" defines for it, `quota-exceeded` (draft-11 section
//!   5.1), with its `violated-policies` member (the rule's name) and, as an extension member of
//!   ours, `retry-after` (whole seconds, as the `Retry-After` field):
//!   `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request
//!   cannot be satisfied as assigned quota has been exceeded","status":429,
//!   "violated-policies":["general"],"retry-after":3}`;
//! - `text`: `rate limit exceeded (policy "general"); retry after 3 s` and a newline.
//!
//! With `RATE_LIMIT_HEADERS=none` nothing about the limits is revealed: no body names the rule.
//!
//! A body is written without serde_json: the start of a problem body is made once at startup,
//! and what changes per refusal (the status, the rule's name, the seconds) is pushed onto it. A refusal whose status caches may store without being told (404, 410, 414, 501:
//! "heuristically cacheable", RFC 9110 section 15.1) carries `Cache-Control: no-store`, so a
//! cache in front never answers other clients with one client's refusal. No refusal is
//! stored by a cache, then, so none needs `Vary: Accept` for its negotiated body.

pub(crate) mod accept;

use bytes::Bytes;

use crate::algorithms::{Decision, MAX_LIMITS};
use crate::rules::Rule;
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderValue};

/// The problem type of a refusal (draft-ietf-httpapi-ratelimit-headers, section 5.1).
pub(crate) const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Its title, as the draft's example gives it.
pub(crate) const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// The body of a refusal (`DENY_FORMAT`, or what the client's `Accept` prefers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenyFormat {
    /// `application/json`, the default.
    Json,
    /// `application/problem+json` (RFC 9457), of the draft's `quota-exceeded` type.
    Problem,
    /// `text/plain; charset=utf-8`.
    Text,
}

impl DenyFormat {
    /// Every format, in the order a tie between equally acceptable ones is broken after the
    /// configured one.
    pub(crate) const ALL: [DenyFormat; 3] = [DenyFormat::Json, DenyFormat::Problem, DenyFormat::Text];

    /// Parse `json`, `problem` or `text`.
    pub(crate) fn parse(value: &str) -> Option<DenyFormat> {
        match value {
            "json" => Some(DenyFormat::Json),
            "problem" => Some(DenyFormat::Problem),
            "text" => Some(DenyFormat::Text),
            _ => None,
        }
    }

    /// The value as written in `DENY_FORMAT`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DenyFormat::Json => "json",
            DenyFormat::Problem => "problem",
            DenyFormat::Text => "text",
        }
    }

    /// The `Content-Type` of its body: a constant, checked when compiled rather than at each
    /// refusal as `HeaderValue::from_static` does when called.
    pub(crate) fn content_type(self) -> HeaderValue {
        const JSON: HeaderValue = HeaderValue::from_static("application/json");
        const PROBLEM: HeaderValue = HeaderValue::from_static("application/problem+json");
        const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
        match self {
            DenyFormat::Json => JSON,
            DenyFormat::Problem => PROBLEM,
            DenyFormat::Text => TEXT,
        }
    }
}

/// `DENY_STATUS`: a client or server error status that says "not now" and nothing else.
///
/// Refused, each with its reason: 1xx, 2xx and 3xx (not an error: the client, and any cache on
/// the way, would take the request as done or moved), anything outside 100-599; 401, 405,
/// 407 and 426, which must carry a header the gateway cannot fill (a challenge, `Allow`,
/// `Upgrade`); 408 and 421, which clients retry at once on a new connection (the opposite of
/// backing off); 416, the answer to a `Range`; 502 and 504, which tollgate answers when the
/// backend fails, so a refusal would read as an outage in the logs, metrics and alerts.
pub(crate) fn parse_status(value: &str) -> Result<StatusCode, String> {
    const EXPECTED: &str =
        "a client or server error status from 400 to 599, such as 429 (the default), 403 or 503";
    let Some(code) = value
        .parse::<u16>()
        .ok()
        .filter(|code| (100..=999).contains(code))
    else {
        return Err(EXPECTED.to_owned());
    };
    let reason = match code {
        100..=199 => format!("{code} is informational, not an answer"),
        200..=299 => format!(
            "{code} is a success: the client, and any cache on the way, would take the request as done"
        ),
        300..=399 => format!("{code} is a redirection: the client would look for the resource elsewhere"),
        600..=999 => format!("{code} is outside the 100-599 HTTP defines (RFC 9110 section 15)"),
        401 => "401 must carry a WWW-Authenticate challenge the gateway cannot make (RFC 9110 \
                section 15.5.2); 403 refuses without one"
            .to_owned(),
        405 => {
            "405 must carry Allow and says the method is never accepted (RFC 9110 section 15.5.6)".to_owned()
        }
        407 => "407 must carry a Proxy-Authenticate challenge (RFC 9110 section 15.5.8)".to_owned(),
        408 => "clients retry a 408 at once, on a new connection (RFC 9110 section 15.5.9)".to_owned(),
        416 => "416 answers a Range request (RFC 9110 section 15.5.17)".to_owned(),
        421 => "clients retry a 421 at once, on another connection (RFC 9110 section 15.5.20)".to_owned(),
        426 => "426 must carry Upgrade (RFC 9110 section 15.5.22)".to_owned(),
        502 | 504 => format!(
            "tollgate answers {code} when the backend fails: a refusal would read as a backend outage in \
             the logs, metrics and alerts"
        ),
        _ => return StatusCode::from_u16(code).map_err(|_| EXPECTED.to_owned()),
    };
    Err(format!("{EXPECTED}; {reason}"))
}

/// The shape of every rate-limit refusal, made once at startup and shared by the doors.
#[derive(Debug, Clone)]
pub(crate) struct Refusals {
    /// `DENY_STATUS`.
    status: StatusCode,
    /// `DENY_FORMAT`: the body when the client's `Accept` prefers none of ours to another.
    format: DenyFormat,
    /// Whether a body names the rule (not with `RATE_LIMIT_HEADERS=none`).
    names_policy: bool,
    /// Whether caches may store `status` without being told (RFC 9110 section 15.1): then
    /// every refusal says `Cache-Control: no-store`.
    no_store: bool,
    /// `{"type":…,"title":…,"status":`: the start of every problem body.
    problem_start: Box<str>,
}

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals::new(StatusCode::TOO_MANY_REQUESTS, DenyFormat::Json, true)
    }
}

impl Refusals {
    /// Refusals with `status` (see [`parse_status`]) in `format` unless the client asks for
    /// another; `names_policy`: whether a body may name the rule.
    pub(crate) fn new(status: StatusCode, format: DenyFormat, names_policy: bool) -> Refusals {
        let problem_start =
            format!(r#"{{"type":"{QUOTA_EXCEEDED}","title":"{QUOTA_EXCEEDED_TITLE}","status":"#)
                .into_boxed_str();
        Refusals {
            status,
            format,
            names_policy,
            no_store: matches!(status.as_u16(), 404 | 410 | 414 | 501),
            problem_start,
        }
    }

    /// `DENY_STATUS`.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// `DENY_FORMAT`.
    pub(crate) fn format(&self) -> DenyFormat {
        self.format
    }

    /// The format for a client whose request carried `headers` (its `Accept`, see [`accept`]).
    pub(crate) fn negotiate(&self, headers: &HeaderMap) -> DenyFormat {
        accept::choose(headers.get_all(header::ACCEPT).iter(), self.format)
    }

    /// The body of a refusal in `format` with `status` (the door's, which may differ from
    /// `DENY_STATUS`), of the `policies` that refused, `retry_after` whole seconds from now.
    pub(crate) fn body(
        &self,
        format: DenyFormat,
        status: StatusCode,
        policies: Violated<'_>,
        retry_after: u64,
    ) -> Bytes {
        self.write(format, status, policies, Some(retry_after))
    }

    /// The body of a refusal no wait would lift (a `deny` override): as [`Refusals::body`],
    /// without a retry time.
    pub(crate) fn denial(&self, format: DenyFormat, status: StatusCode, policies: Violated<'_>) -> Bytes {
        self.write(format, status, policies, None)
    }

    fn write(
        &self,
        format: DenyFormat,
        status: StatusCode,
        policies: Violated<'_>,
        retry_after: Option<u64>,
    ) -> Bytes {
        let mut digits = itoa::Buffer::new();
        let seconds = retry_after.map(|retry_after| digits.format(retry_after));
        let mut body;
        match format {
            DenyFormat::Json => {
                const START: &str = r#"{"error":"rate limit exceeded""#;
                body = String::with_capacity(START.len() + 24);
                body.push_str(START);
                if let Some(seconds) = seconds {
                    body.push_str(r#","retry_after":"#);
                    body.push_str(seconds);
                }
                body.push('}');
            }
            DenyFormat::Problem => {
                body = String::with_capacity(self.problem_start.len() + policies.len() + 48);
                body.push_str(&self.problem_start);
                body.push_str(status.as_str());
                body.push(',');
                if self.names_policy {
                    body.push_str(r#""violated-policies":["#);
                    policies.each(|i, policy| {
                        if i > 0 {
                            body.push(',');
                        }
                        push_json_string(&mut body, policy);
                    });
                    body.push_str("],");
                }
                match seconds {
                    Some(seconds) => {
                        body.push_str(r#""retry-after":"#);
                        body.push_str(seconds);
                        body.push('}');
                    }
                    // The members end with a comma: replace it.
                    None => {
                        body.pop();
                        body.push('}');
                    }
                }
            }
            DenyFormat::Text => {
                body = String::with_capacity(policies.len() + 48);
                body.push_str("rate limit exceeded");
                if self.names_policy {
                    body.push_str(" (policy ");
                    policies.each(|i, policy| {
                        if i > 0 {
                            body.push_str(", ");
                        }
                        body.push('"');
                        body.push_str(policy);
                        body.push('"');
                    });
                    body.push(')');
                }
                if let Some(seconds) = seconds {
                    body.push_str("; retry after ");
                    body.push_str(seconds);
                    body.push_str(" s");
                }
                body.push('\n');
            }
        }
        Bytes::from(body)
    }

    /// The headers of a refusal in `format` beyond `Retry-After` and the rate-limit fields:
    /// its `Content-Type`, and `Cache-Control: no-store` when caches could store it unasked.
    pub(crate) fn set_headers(&self, headers: &mut HeaderMap, format: DenyFormat) {
        headers.insert(header::CONTENT_TYPE, format.content_type());
        const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
        if self.no_store {
            headers.insert(header::CACHE_CONTROL, NO_STORE);
        }
    }
}

/// The policies a refusal names: those that refused, named as the draft headers name them
/// (the rule's name for a rule of one limit; `RULE.N` for the N-th of a rule of several).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Violated<'a> {
    /// The rule's name.
    rule: &'a str,
    /// A rule of several limits: which refused, a bit each by position; `None` for a rule of
    /// one limit.
    refusing: Option<u8>,
}

impl<'a> Violated<'a> {
    /// The rule `rule` of one limit (or a door that knows no more than the rule).
    pub(crate) fn rule(rule: &'a str) -> Violated<'a> {
        Violated { rule, refusing: None }
    }

    /// The limits of `rule` that refused `decision`.
    pub(crate) fn of(rule: &'a Rule, decision: &Decision) -> Violated<'a> {
        if rule.limits.len() == 1 {
            return Violated::rule(&rule.name);
        }
        let refusing = decision
            .parts()
            .iter()
            .enumerate()
            .filter(|(_, part)| !part.allowed)
            .fold(0u8, |bits, (i, _)| bits | (1 << i));
        Violated {
            rule: &rule.name,
            refusing: Some(refusing),
        }
    }

    /// About how long the names are, for a body's capacity.
    fn len(&self) -> usize {
        match self.refusing {
            None => self.rule.len(),
            Some(bits) => bits.count_ones() as usize * (self.rule.len() + 4),
        }
    }

    /// Hand each name to `write`, with its place among them.
    fn each(&self, mut write: impl FnMut(usize, &str)) {
        match self.refusing {
            None => write(0, self.rule),
            Some(bits) => {
                for (n, i) in (0..MAX_LIMITS).filter(|i| bits & (1 << i) != 0).enumerate() {
                    write(n, &crate::rules::table::limit_name(self.rule, i));
                }
            }
        }
    }
}

/// `text` as a JSON string (RFC 8259 section 7): quoted, `"` and `\` escaped, control
/// characters as `\u00XX`.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let byte = u32::from(c) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[byte >> 4]));
                out.push(char::from(HEX[byte & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(refusals: &Refusals, format: DenyFormat, policy: &str, retry_after: u64) -> String {
        let bytes = refusals.body(format, refusals.status(), Violated::rule(policy), retry_after);
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn the_json_body_is_the_proxys_answer_of_old() {
        let refusals = Refusals::default();
        assert_eq!(
            body(&refusals, DenyFormat::Json, "general", 100),
            r#"{"error":"rate limit exceeded","retry_after":100}"#
        );
        assert_eq!(DenyFormat::Json.content_type(), "application/json");
    }

    #[test]
    fn the_problem_body_is_the_drafts_quota_exceeded_type() {
        let refusals = Refusals::new(StatusCode::TOO_MANY_REQUESTS, DenyFormat::Problem, true);
        let text = body(&refusals, DenyFormat::Problem, "general", 3);
        assert_eq!(
            text,
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":["general"],"retry-after":3}"#
        );
        // Valid JSON, members as RFC 9457 and the draft name them.
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["type"], QUOTA_EXCEEDED);
        assert_eq!(value["status"], 429);
        assert_eq!(value["violated-policies"], serde_json::json!(["general"]));
        assert_eq!(value["retry-after"], 3);
        assert_eq!(DenyFormat::Problem.content_type(), "application/problem+json");
    }

    #[test]
    fn the_problem_body_carries_the_status_it_is_sent_with() {
        let refusals = Refusals::new(StatusCode::SERVICE_UNAVAILABLE, DenyFormat::Problem, true);
        let value: serde_json::Value =
            serde_json::from_str(&body(&refusals, DenyFormat::Problem, "auth", 60)).unwrap();
        assert_eq!(value["status"], 503);
        // A door that refuses with another status (forward-auth's ?status=403) says that one.
        let other = refusals.body(
            DenyFormat::Problem,
            StatusCode::FORBIDDEN,
            Violated::rule("auth"),
            60,
        );
        let value: serde_json::Value = serde_json::from_slice(&other).unwrap();
        assert_eq!(value["status"], 403);
        assert_eq!(value["violated-policies"], serde_json::json!(["auth"]));
    }

    #[test]
    fn policy_names_are_escaped_in_json_and_left_out_under_none() {
        let refusals = Refusals::new(StatusCode::TOO_MANY_REQUESTS, DenyFormat::Problem, true);
        for name in [r#"a "b" \c"#, "tab\there", "/api/export/*", "caf\u{e9}", "\u{1}"] {
            let text = body(&refusals, DenyFormat::Problem, name, 1);
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["violated-policies"][0], name, "{text}");
        }
        let hidden = Refusals::new(StatusCode::TOO_MANY_REQUESTS, DenyFormat::Problem, false);
        let text = body(&hidden, DenyFormat::Problem, "secret-rule", 1);
        assert!(
            !text.contains("secret-rule") && !text.contains("violated-policies"),
            "{text}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["retry-after"], 1);
        assert!(!body(&hidden, DenyFormat::Text, "secret-rule", 1).contains("secret-rule"));
    }

    #[test]
    fn the_text_body_says_the_same_in_words() {
        let refusals = Refusals::new(StatusCode::TOO_MANY_REQUESTS, DenyFormat::Text, true);
        assert_eq!(
            body(&refusals, DenyFormat::Text, "general", 7),
            "rate limit exceeded (policy \"general\"); retry after 7 s\n"
        );
        assert_eq!(DenyFormat::Text.content_type(), "text/plain; charset=utf-8");
    }

    #[test]
    fn heuristically_cacheable_statuses_are_marked_no_store() {
        for (code, no_store) in [(429, false), (503, false), (403, false), (404, true), (410, true)] {
            let refusals = Refusals::new(StatusCode::from_u16(code).unwrap(), DenyFormat::Json, true);
            let mut headers = HeaderMap::new();
            refusals.set_headers(&mut headers, DenyFormat::Json);
            assert_eq!(headers.get(header::CACHE_CONTROL).is_some(), no_store, "{code}");
        }
    }

    #[test]
    fn deny_status_takes_client_and_server_errors_that_mean_not_now() {
        for code in [
            "429", "403", "503", "400", "404", "418", "420", "500", "599", "499",
        ] {
            assert_eq!(
                parse_status(code).map(|s| s.as_str().to_owned()),
                Ok(code.to_owned())
            );
        }
        for (value, says) in [
            ("200", "a success"),
            ("204", "a success"),
            ("101", "informational"),
            ("302", "a redirection"),
            ("600", "outside the 100-599"),
            ("401", "WWW-Authenticate"),
            ("405", "Allow"),
            ("407", "Proxy-Authenticate"),
            ("408", "at once"),
            ("416", "Range"),
            ("421", "another connection"),
            ("426", "Upgrade"),
            ("502", "backend outage"),
            ("504", "backend outage"),
            ("abc", "from 400 to 599"),
            ("", "from 400 to 599"),
            ("4290", "from 400 to 599"),
            ("-429", "from 400 to 599"),
        ] {
            let error = parse_status(value).unwrap_err();
            assert!(error.contains(says), "{value}: {error}");
            assert!(error.contains("from 400 to 599"), "{value}: {error}");
        }
    }

    #[test]
    fn formats_parse_as_written() {
        for format in DenyFormat::ALL {
            assert_eq!(DenyFormat::parse(format.as_str()), Some(format));
        }
        assert_eq!(DenyFormat::parse("problem+json"), None);
        assert_eq!(DenyFormat::parse("JSON"), None);
    }
}
