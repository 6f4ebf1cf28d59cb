//! `POST /v1/check`: the JSON decision API, for a service that asks before it does something
//! costly (a batch job, a queue consumer, a proxy of its own).
//!
//! The body names the client directly, `{"rule": "NAME", "key": "VALUE", "cost": N}` (the
//! key is digested as the rule's one key source would digest that value, with
//! `KEY_HASH_SECRET`), or describes a request for the rule table to classify as the proxy
//! would: `{"method": "GET", "path": "/login?tenant=a", "client_ip": "203.0.113.7",
//! "headers": {...}}` (the query and the `host`, `cookie` headers read by keys as the proxy's). The answer is `200` whether allowed or not,
//! `{"allowed", "rule", "limit", "remaining", "reset_after_ms", "retry_after_s", "outcome"}`
//! with the rate-limit headers of an enforced rule as well (the proxy's, from the gate's shared
//! mapping: a shadow rule is invisible), the body's numbers the same; a bad body gets `400` with a JSON error naming the
//! field. With `DECIDE_TOKEN` set, `Authorization: Bearer <token>` is required (`401`).
//! `DENY_STATUS` and `DENY_FORMAT` do not change this answer: it is the decision, not the
//! refusal, and the caller that acts on it writes its own.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::{Decide, DecideBody, error, json};
use crate::algorithms::Cost;
use crate::gate::{Admission, Head, Refused};
use crate::rules::Rule;
use crate::suggest::closest;
use crate::telemetry::trace::RequestSpan;

/// Where it is served.
pub const PATH: &str = "/v1/check";

/// The largest body read: a request description with its headers fits many times over.
pub const MAX_BODY: usize = 64 * 1024;

/// The longest client key: a key is a name (an API key, a user id), not a document.
pub const MAX_KEY: usize = 1024;

/// What the body may hold; which fields are set says which kind of question it is.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// Named: the rule.
    pub rule: Option<String>,
    /// Named: whose budget.
    pub key: Option<String>,
    /// Named: what it costs (default: the rule's own cost). Any JSON value, so that whatever is
    /// wrong with it (a negative, a fraction, a number past 2^64, a string) is answered
    /// naming the field.
    pub cost: Option<serde_json::Value>,
    /// Classified: the method (default `GET`).
    pub method: Option<String>,
    /// Classified: the path, with its query if any (read by `query:NAME` keys; rules match
    /// the path alone).
    pub path: Option<String>,
    /// Classified: the client's address.
    pub client_ip: Option<String>,
    /// Classified: its headers (an API key a rule keys by, `X-Forwarded-For` when
    /// `client_ip` is a trusted proxy's).
    pub headers: Option<Headers>,
}

/// The `headers` object of a described request, its members as sent: a name sent twice (in
/// JSON, in another case, or with `_` for `-`) is kept twice, for [`header_map`] to refuse
/// rather than one copy silently winning.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Headers, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Headers;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of header names and string values")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, String>()? {
                    members.push(member);
                }
                Ok(Headers(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// A body that cannot be answered: what is wrong, and with which field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBody {
    /// What is wrong, and what is accepted.
    pub reason: String,
    /// The field at fault, if one is: one of [`Question`]'s, an unknown one as the body
    /// spells it, or `body` for a body that is no JSON object.
    pub field: Option<Cow<'static, str>>,
}

impl BadBody {
    fn field(field: &'static str, reason: impl Into<String>) -> BadBody {
        BadBody {
            reason: reason.into(),
            field: Some(Cow::Borrowed(field)),
        }
    }
}

/// The answer's body.
#[derive(Debug, Serialize)]
pub struct Answer<'a> {
    /// Whether the request may go ahead.
    pub allowed: bool,
    /// The rule that decided.
    pub rule: &'a str,
    /// The rule's capacity or per-window limit; `null` when no store decided (exempt, or
    /// the store unavailable).
    pub limit: Option<u64>,
    /// Whole units left.
    pub remaining: Option<u64>,
    /// Milliseconds until the budget is entirely back.
    pub reset_after_ms: Option<u64>,
    /// When refused, whole seconds until the same request would be allowed (as
    /// `Retry-After`); `null` when allowed.
    pub retry_after_s: Option<u64>,
    /// What became of it, as the metrics and logs name it (`allowed`, `limited`, `shadow`,
    /// `exempt`, `fail_open`, `fail_closed`, ...).
    pub outcome: &'static str,
    /// A rule of several limits: each one's part, in the order written (left out for a rule
    /// of one, whose part the fields above are).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitAnswer>>,
}

/// One limit's part of an [`Answer`].
#[derive(Debug, serde::Serialize)]
pub struct LimitAnswer {
    /// Its name in the draft headers (`api.1`).
    pub name: String,
    /// Its algorithm.
    pub algorithm: &'static str,
    /// Its capacity or per-window limit.
    pub limit: u64,
    /// Whether it allowed the request.
    pub allowed: bool,
    /// Whole units left under it.
    pub remaining: u64,
    /// Milliseconds until its budget is entirely back.
    pub reset_after_ms: u64,
}

/// Parse a body into a [`Question`].
pub fn parse(body: &[u8]) -> Result<Question, BadBody> {
    serde_json::from_slice(body).map_err(|error| BadBody {
        reason: format!("the body is not a JSON question: {error}"),
        field: Some(at_fault(body, &error)),
    })
}

/// The field a body [`parse`] refused is at fault with: the unknown or repeated one serde
/// names (spelt as the body spells it), a known one of the wrong type; `body` when it is no
/// JSON object at all. Only on the error's way: a good body is parsed once.
fn at_fault(body: &[u8], error: &serde_json::Error) -> Cow<'static, str> {
    let message = error.to_string();
    for said in ["unknown field `", "duplicate field `"] {
        if let Some((name, _)) = message
            .split_once(said)
            .and_then(|(_, rest)| rest.split_once('`'))
        {
            return Cow::Owned(name.to_owned());
        }
    }
    let Ok(object) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) else {
        return Cow::Borrowed("body");
    };
    // Each known field alone: the one that fails by itself is at fault.
    for (name, value) in object {
        let Some(known) = FIELDS.iter().find(|known| **known == name) else {
            continue;
        };
        let alone = serde_json::Map::from_iter([(name, value)]);
        if serde_json::from_value::<Question>(serde_json::Value::Object(alone)).is_err() {
            return Cow::Borrowed(known);
        }
    }
    Cow::Borrowed("body")
}

/// [`Question`]'s fields, as a body spells them.
const FIELDS: &[&str] = &["rule", "key", "cost", "method", "path", "client_ip", "headers"];

/// Answer one call from `peer`.
pub async fn answer(
    door: &Decide,
    request: Request<Incoming>,
    peer: SocketAddr,
    span: Option<&RequestSpan>,
) -> Response<DecideBody> {
    if let Some(token) = &door.settings.token
        && !token.authorizes(request.headers().get(header::AUTHORIZATION))
    {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "a bearer token (DECIDE_TOKEN) is required",
            None,
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        tracing::debug!(peer = %peer.ip(), "decision API call without the right token refused");
        return response;
    }
    let body = Limited::new(request.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(door.settings.body_timeout, body).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            // 400 as for every other bad body, so a caller has one status to handle.
            return super::error(
                StatusCode::BAD_REQUEST,
                &format!("the body is larger than {MAX_BODY} bytes"),
                Some("body"),
            );
        }
        Ok(Err(_)) => return super::error(StatusCode::BAD_REQUEST, "the body broke off", None),
        Err(_) => {
            return super::error(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within BODY_IDLE_TIMEOUT_MS",
                None,
            );
        }
    };
    match decide(door, &body, span).await {
        Ok(response) => response,
        Err(bad) => super::error(StatusCode::BAD_REQUEST, &bad.reason, bad.field.as_deref()),
    }
}

/// A question, checked: what the gate is to be asked.
#[derive(Debug)]
pub enum Ask<'r> {
    /// `{"rule", "key", "cost"}`.
    Named {
        /// The rule, one of the table's.
        rule: &'r Rule,
        /// Whose budget: 1 to [`MAX_KEY`] bytes.
        key: String,
        /// 1 to the rule's capacity.
        cost: Cost,
    },
    /// `{"method", "path", "client_ip", "headers"}`.
    Classified {
        /// The method.
        method: Method,
        /// The path, without its query: starts with `/`, or is `*`.
        path: String,
        /// The query, if the path had one.
        query: Option<String>,
        /// The client's address.
        client: IpAddr,
        /// Its headers.
        headers: HeaderMap,
    },
}

/// Parse and check a body against `rules` (the gate's, in table order).
pub fn ask<'r>(body: &[u8], rules: &'r [Rule]) -> Result<Ask<'r>, BadBody> {
    let question = parse(body)?;
    let named = question.rule.is_some() || question.key.is_some() || question.cost.is_some();
    let classified = question.method.is_some()
        || question.path.is_some()
        || question.client_ip.is_some()
        || question.headers.is_some();
    match (named, classified) {
        (true, true) => Err(BadBody {
            reason: "either name the client ({\"rule\", \"key\", \"cost\"}) or describe a request \
                     ({\"method\", \"path\", \"client_ip\", \"headers\"}), not both"
                .into(),
            field: None,
        }),
        (false, false) => Err(BadBody {
            reason: "an empty question: send {\"rule\", \"key\"} or {\"path\", \"client_ip\"}".into(),
            field: None,
        }),
        (true, false) => {
            let rule = named_rule(rules, question.rule.as_deref())?;
            let key = match question.key {
                None => return Err(BadBody::field("key", "a key is required: whose budget to spend")),
                Some(key) if key.is_empty() => {
                    return Err(BadBody::field("key", "a key is required: whose budget to spend"));
                }
                Some(key) if key.len() > MAX_KEY => {
                    return Err(BadBody::field("key", format!("a key is at most {MAX_KEY} bytes")));
                }
                Some(key) => key,
            };
            let limit = rule.limits.capacity();
            let out_of_range = |cost: &dyn std::fmt::Display| {
                BadBody::field(
                    "cost",
                    format!(
                        "cost {cost} is out of range: a whole number from 1 to {limit}, the capacity \
                         of rule {:?}",
                        &*rule.name
                    ),
                )
            };
            let cost = match &question.cost {
                None => rule.cost,
                Some(serde_json::Value::Number(number)) => {
                    number.as_u64().ok_or_else(|| out_of_range(number))?
                }
                Some(other) => {
                    return Err(BadBody::field(
                        "cost",
                        format!(
                            "invalid type: cost {other} is not a number; a whole number from 1 to \
                             {limit}, the capacity of rule {:?}",
                            &*rule.name
                        ),
                    ));
                }
            };
            // A whole number of 1 to the capacity (below 2^50) is a cost; nothing else is.
            let cost = match Cost::new(cost) {
                Ok(cost) if (1..=limit).contains(&cost.get()) => cost,
                _ => return Err(out_of_range(&cost)),
            };
            Ok(Ask::Named { rule, key, cost })
        }
        (false, true) => {
            let method = match question.method.as_deref() {
                None => Method::GET,
                Some(method) => Method::from_bytes(method.as_bytes())
                    .map_err(|_| BadBody::field("method", format!("{method:?} is not an HTTP method")))?,
            };
            let path = question
                .path
                .as_deref()
                .ok_or_else(|| BadBody::field("path", "a path is required, such as /login"))?;
            let (path, query) = match path.split_once('?') {
                Some((path, query)) => (path, Some(query.to_owned())),
                None => (path, None),
            };
            if !path.starts_with('/') && path != "*" {
                return Err(BadBody::field("path", "a path starts with /"));
            }
            let client: IpAddr = question
                .client_ip
                .as_deref()
                .ok_or_else(|| BadBody::field("client_ip", "the client's address is required"))?
                .parse()
                .map_err(|_| {
                    BadBody::field("client_ip", "an IP address such as 203.0.113.7 or 2001:db8::1")
                })?;
            let headers = header_map(question.headers.unwrap_or_default())?;
            Ok(Ask::Classified {
                method,
                path: path.to_owned(),
                query,
                client,
                headers,
            })
        }
    }
}

/// Check a body and ask the gate.
async fn decide(
    door: &Decide,
    body: &[u8],
    span: Option<&RequestSpan>,
) -> Result<Response<DecideBody>, BadBody> {
    let generation = door.gate.current();
    match ask(body, generation.rules())? {
        Ask::Named { rule, key, cost } => {
            let key = generation.named_key(rule, key.as_bytes());
            let admission = door.gate.admit_named(generation.clone(), rule, key, cost).await;
            if let Some(span) = span {
                span.decided(admission.traced());
            }
            door.log(&logged(None, None, &admission));
            Ok(respond(door, admission))
        }
        Ask::Classified {
            method,
            path,
            query,
            client,
            headers,
        } => {
            if let Some(name) = super::forward_auth::underscore_alias(door, &headers) {
                return Err(BadBody::field(
                    "headers",
                    format!("header {name} is a spelling of a key header that backends may read as it"),
                ));
            }
            let head = Head {
                method: &method,
                path: &path,
                query: query.as_deref(),
                authority: None,
                headers: &headers,
                peer: client,
                upgrade: false,
            };
            let admission = door.gate.admit(&head).await.map_err(|refused| match refused {
                Refused::Ambiguous(reason) => BadBody::field("path", reason),
                Refused::Headers(reason) => BadBody::field("headers", reason),
                Refused::Tunnels(_) => BadBody::field("path", "no upgrade was asked for"),
            })?;
            if let Some(span) = span {
                span.decided(admission.traced());
            }
            door.log(&logged(Some(method.as_str()), Some(&path), &admission));
            Ok(respond(door, admission))
        }
    }
}

/// The log line's account of one answer (always `200`: `allowed` says the rest).
fn logged<'a>(
    method: Option<&'a str>,
    path: Option<&'a str>,
    admission: &'a Admission,
) -> super::Decided<'a> {
    super::Decided {
        door: "check",
        method,
        path,
        client: admission.key(),
        address: admission.client(),
        rule: &admission.rule().name,
        outcome: admission.outcome(),
        status: 200,
        retry_after_s: admission.retry_after_secs(),
    }
}

/// The rule `name`, or an error naming the closest rule.
fn named_rule<'r>(rules: &'r [Rule], name: Option<&str>) -> Result<&'r Rule, BadBody> {
    let name =
        name.ok_or_else(|| BadBody::field("rule", "a rule is required (general, auth, or a route's name)"))?;
    rules.iter().find(|rule| &*rule.name == name).ok_or_else(|| {
        let names: Vec<&str> = rules.iter().map(|rule| &*rule.name).collect();
        let closest = closest(name, names.iter().copied(), 2);
        BadBody::field(
            "rule",
            match closest {
                Some(closest) => format!("no rule {name:?}: did you mean {closest:?}?"),
                None => format!("no rule {name:?}: the rules are {}", names.join(", ")),
            },
        )
    })
}

/// The `headers` object as a header map. Two members naming one header, to some backend, are
/// refused: the same name twice, or two spellings equal but for case or `_` for `-`
/// (`x_api_key` beside `x-api-key`: CGI, WSGI and Rack read both as `HTTP_X_API_KEY`), as
/// forward-auth refuses them; which one the rules would read and which one the backend would
/// is anybody's guess.
fn header_map(headers: Headers) -> Result<HeaderMap, BadBody> {
    let mut map = HeaderMap::new();
    // By name as such a backend reads it: lower case, `_` for `-`.
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (name, value) in headers.0 {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| BadBody::field("headers", format!("{name:?} is not a header name")))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| BadBody::field("headers", format!("the value of {name:?} is not a header value")))?;
        let read_as = header.as_str().replace('_', "-");
        if let Some(earlier) = seen.get(&read_as) {
            return Err(BadBody::field(
                "headers",
                format!(
                    "{earlier:?} and {name:?} are one header to backends that ignore case and read '_' \
                     as '-' (CGI, WSGI, Rack): send it once"
                ),
            ));
        }
        seen.insert(read_as, name);
        map.append(header, value);
    }
    Ok(map)
}

/// `200` with the answer and the rate-limit headers, from the same numbers; the request asked
/// about is the caller's to carry out, out of sight, so the admission is settled elsewhere.
fn respond(door: &Decide, admission: Admission) -> Response<DecideBody> {
    let (rule, decision, outcome) = (admission.rule(), admission.decision(), admission.outcome());
    let allowed = outcome.forwards();
    let answer = Answer {
        allowed,
        rule: &rule.name,
        limit: decision.map(|decision| decision.limit),
        remaining: decision.map(|decision| decision.remaining),
        reset_after_ms: decision.map(|decision| decision.reset_after.as_millis() as u64),
        retry_after_s: admission.retry_after_secs(),
        outcome: outcome.as_str(),
        limits: decision.filter(|_| rule.limits.len() > 1).map(|decision| {
            rule.limits
                .iter()
                .zip(decision.parts())
                .enumerate()
                .map(|(i, (policy, part))| LimitAnswer {
                    name: crate::rules::table::limit_name(&rule.name, i),
                    algorithm: policy.name(),
                    limit: policy.limit(),
                    allowed: part.allowed,
                    remaining: part.remaining,
                    reset_after_ms: part.reset_after().as_millis() as u64,
                })
                .collect()
        }),
    };
    // Serializing a struct of numbers and strings cannot fail.
    let body = serde_json::to_string(&answer).unwrap_or_default();
    let mut response = json(StatusCode::OK, body);
    door.answers.set_headers(&admission, response.headers_mut());
    admission.settle_elsewhere();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_wrong_types_are_named() {
        let error = parse(br#"{"rule":"general","kee":"x"}"#).unwrap_err();
        assert!(error.reason.contains("unknown field `kee`"), "{}", error.reason);
        assert_eq!(error.field.as_deref(), Some("kee"));
        let error = parse(br#"{"rule":"general","key":"x","key":"y"}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("key"), "{}", error.reason);
        let error = parse(br#"{"rule":"general","key":["x"]}"#).unwrap_err();
        assert!(error.reason.contains("invalid type"), "{}", error.reason);
        assert_eq!(error.field.as_deref(), Some("key"));
        let error = parse(b"not json").unwrap_err();
        assert!(error.reason.contains("not a JSON question"), "{}", error.reason);
        assert_eq!(error.field.as_deref(), Some("body"));
        assert_eq!(parse(b"[1]").unwrap_err().field.as_deref(), Some("body"));
    }

    #[test]
    fn both_kinds_of_question_parse() {
        let named = parse(br#"{"rule":"auth","key":"user-7","cost":2}"#).unwrap();
        assert_eq!(
            (named.rule.as_deref(), named.key.as_deref(), named.cost),
            (Some("auth"), Some("user-7"), Some(serde_json::json!(2)))
        );
        let classified = parse(
            br#"{"method":"POST","path":"/login","client_ip":"203.0.113.7","headers":{"x-api-key":"k"}}"#,
        )
        .unwrap();
        assert_eq!(classified.path.as_deref(), Some("/login"));
        assert_eq!(classified.headers, Some(headers(&[("x-api-key", "k")])));
    }

    fn headers(members: &[(&str, &str)]) -> Headers {
        Headers(
            members
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
        )
    }

    /// Costs are hostile numbers: whatever is not a whole number from 1 to the rule's capacity
    /// (a capacity + 1, 2^31, 2^32 - 1, 2^53, 2^63 - 1, 2^63, 2^64 - 1, 2^64, a negative, a
    /// fraction, a string) is a bad request naming `cost`.
    #[test]
    fn a_cost_is_a_whole_number_up_to_the_capacity_or_a_bad_request_naming_it() {
        use crate::algorithms::Policy;
        use crate::algorithms::TokenBucket;
        let policy = Policy::TokenBucket(TokenBucket {
            capacity: 3,
            interval_us: 1_000_000,
        });
        let rules = [Rule::new(0, "general", policy)];
        let body = |cost: &str| format!(r#"{{"rule":"general","key":"k","cost":{cost}}}"#);
        for cost in [
            "0",
            "4",
            "2147483648",
            "4294967295",
            "9007199254740992",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "-1",
            "1.5",
            "1e30",
            "\"2\"",
            "[]",
        ] {
            let bad = ask(body(cost).as_bytes(), &rules).unwrap_err();
            assert_eq!(bad.field.as_deref(), Some("cost"), "{cost}: {bad:?}");
            assert!(bad.reason.contains("from 1 to 3"), "{cost}: {bad:?}");
        }
        for cost in [1, 3] {
            match ask(body(&cost.to_string()).as_bytes(), &rules) {
                Ok(Ask::Named { cost: asked, .. }) => assert_eq!(asked.get(), cost),
                other => panic!("{cost}: {other:?}"),
            }
        }
    }

    #[test]
    fn header_maps_refuse_what_is_not_a_header() {
        let bad = headers(&[("bad name", "v")]);
        assert_eq!(header_map(bad).unwrap_err().field.as_deref(), Some("headers"));
        let bad = headers(&[("x", "a\nb")]);
        assert_eq!(header_map(bad).unwrap_err().field.as_deref(), Some("headers"));
    }

    #[test]
    fn one_header_sent_twice_in_any_spelling_is_refused_naming_the_field() {
        for twice in [
            &[("x_api_key", "a"), ("x-api-key", "b")][..],
            &[("x-api-key", "a"), ("X_API_KEY", "a")],
            &[("X-API-Key", "a"), ("x-api-key", "b")],
            &[("x-api-key", "a"), ("other", "c"), ("x-api-key", "b")],
        ] {
            let error = header_map(headers(twice)).unwrap_err();
            assert_eq!(error.field.as_deref(), Some("headers"), "{twice:?}");
            assert!(error.reason.contains("send it once"), "{}", error.reason);
        }
        // A name sent twice in the JSON is kept twice, not the last copy silently.
        let question =
            parse(br#"{"path":"/","client_ip":"192.0.2.1","headers":{"x-api-key":"a","x-api-key":"b"}}"#)
                .unwrap();
        let error = header_map(question.headers.unwrap()).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("headers"));
        // Distinct headers, `_` or not, are each kept.
        let map = header_map(headers(&[("x_a", "1"), ("x-b", "2"), ("Cookie", "a=1")])).unwrap();
        assert_eq!(map.len(), 3);
    }
}
