//! `/v1/forward-auth` (any method): a rate-limit decision for Traefik's `ForwardAuth`, Caddy's
//! `forward_auth` and nginx's `auth_request`, which ask before they forward a request and pass
//! it on only if the answer is `2xx`.
//!
//! The original request is read from the headers those proxies send: its method from
//! `X-Forwarded-Method` (nginx: `X-Original-Method`, as commonly configured; else this
//! request's own method), its target from `X-Forwarded-Uri` (nginx: `X-Original-URI`), with
//! its query (for `query:NAME` keys), its client from `X-Forwarded-For`, its host from
//! `X-Forwarded-Host` (for `host` keys; else this request's `Host`, which nginx copies). Every
//! other header (an API key, the `Cookie` lines) is the original request's, as these proxies
//! copy them. The path goes through the proxy's own canonicalisation, so a path backends could
//! read two ways is refused here as it is there. A method-override header the client sent
//! (`X-HTTP-Method-Override`, ...) is metered whatever `METHOD_OVERRIDE` says: the proxy in
//! front forwards it, and this door cannot take it away.
//!
//! The caller is the TCP peer, so the client address it forwards is believed only when the
//! peer is one of `TRUSTED_PROXIES`; a call from any other peer is refused (`403`, logged):
//! keyed by the proxy's own address, every client would share one budget.
//!
//! Every answer is the gate's shared mapping (`gate::answer`, `Refuse::CallingProxy`),
//! so one state is told here as the proxy tells it. Allowed: `200` with the rate-limit headers
//! of an enforced rule (a shadow rule is invisible, as on the proxy; the proxy in front may
//! copy them onto the request or the response); with `FORWARD_RATELIMIT_HEADERS=true` the draft `RateLimit` and
//! `RateLimit-Policy` among them whatever `RATE_LIMIT_HEADERS` says, for the proxy to set on
//! the request it forwards. Refused: `DENY_STATUS` (default `429`) with `Retry-After` and the
//! rate-limit headers, or the status `?status=` names (`401`, `403` or `429`), and a body in
//! the format the original request's `Accept` prefers, else `DENY_FORMAT` (`json` is the
//! constant `{"error":"rate limit exceeded"}`). nginx's `auth_request` takes only 2xx, 401 and
//! 403 from here and answers 500 for anything else, and never passes this body on: behind it,
//! set `DENY_STATUS=403` or call with `?status=403` (or `401`). Traefik and Caddy pass the
//! status, the body and its `Content-Type` on to the client. `FAIL_MODE=closed` with Redis
//! down answers `503`, or the `401` or `403` asked for, so nginx passes it on too, with the
//! proxy's body (`{"error":"rate limiter unavailable","retry_after":1}`) and `Retry-After: 1`.
//! A request costs what the rule table prices it at; `count=failures` has no refund here,
//! since the backend's answer is never seen.

use std::net::SocketAddr;

use http::header::HeaderName;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;

use super::{Decide, DecideBody, error, full};
use crate::gate::identity::X_FORWARDED_FOR;
use crate::gate::{Head, Refuse, Refused};
use crate::rules::table::METHOD_OVERRIDE_HEADERS;
use crate::telemetry::trace::RequestSpan;

/// Where it is served.
pub const PATH: &str = "/v1/forward-auth";

/// The body of a JSON refusal for a calling proxy ([`Refuse::CallingProxy`]), as `error` would
/// write it.
#[cfg(test)]
const LIMITED: &[u8] = br#"{"error":"rate limit exceeded"}"#;

/// `X-Forwarded-Method` (Traefik, Caddy).
pub static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
/// `X-Forwarded-Uri` (Traefik, Caddy).
pub static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
/// `X-Forwarded-Host`.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// `X-Original-Method` (nginx `auth_request`, as commonly configured).
pub static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
/// `X-Original-URI` (nginx `auth_request`, as commonly configured).
pub static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");

/// The original request, as the calling proxy describes it.
#[derive(Debug, PartialEq, Eq)]
pub struct Original {
    /// Its method.
    pub method: Method,
    /// Its target's path, as sent (canonicalised by the gate).
    pub path: String,
    /// Its target's query, as sent, if it had one.
    pub query: Option<String>,
    /// Its host, from `X-Forwarded-Host`, if sent.
    pub host: Option<String>,
}

/// Why the original request cannot be read from the headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// Neither target header was sent.
    #[error(
        "no X-Forwarded-Uri (Traefik, Caddy) or X-Original-URI (nginx) header: the original request's target is unknown"
    )]
    NoTarget,
    /// A header was sent more than once, or two spellings disagree.
    #[error("{0} was sent more than once, or disagrees with its other spelling")]
    Repeated(&'static str),
    /// The target is not a path (with a query) or `*`.
    #[error("{header} is not a request target such as /login?next=/: {problem}")]
    Target {
        /// Which header.
        header: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// The method is not a method.
    #[error("{0} is not an HTTP method")]
    Method(&'static str),
    /// `X-Forwarded-Host` is not text.
    #[error("X-Forwarded-Host is not a host name")]
    Host,
    /// No client address was forwarded.
    #[error(
        "no X-Forwarded-For header: the client's address is unknown, and keyed by the proxy's own every client would share one budget"
    )]
    NoClient,
}

/// One header of two spellings: `None` when neither is sent, the value when one is (or both
/// agree), an error when either is repeated or they differ.
fn one_of<'h>(
    headers: &'h HeaderMap,
    names: [(&'static HeaderName, &'static str); 2],
) -> Result<Option<(&'h [u8], &'static str)>, Unreadable> {
    let mut found: Option<(&[u8], &'static str)> = None;
    for (name, label) in names {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            continue;
        };
        if values.next().is_some() {
            return Err(Unreadable::Repeated(label));
        }
        match found {
            Some((earlier, _)) if earlier != value.as_bytes() => return Err(Unreadable::Repeated(label)),
            _ => found = Some((value.as_bytes(), label)),
        }
    }
    Ok(found)
}

/// Read the original request from `headers`; `own` is the method of the call itself.
pub fn original(headers: &HeaderMap, own: &Method) -> Result<Original, Unreadable> {
    let method = match one_of(
        headers,
        [
            (&X_FORWARDED_METHOD, "X-Forwarded-Method"),
            (&X_ORIGINAL_METHOD, "X-Original-Method"),
        ],
    )? {
        Some((value, label)) => Method::from_bytes(value).map_err(|_| Unreadable::Method(label))?,
        None => own.clone(),
    };
    let (target, label) = one_of(
        headers,
        [
            (&X_FORWARDED_URI, "X-Forwarded-Uri"),
            (&X_ORIGINAL_URI, "X-Original-URI"),
        ],
    )?
    .ok_or(Unreadable::NoTarget)?;
    let (path, query) = target_path(target).map_err(|problem| Unreadable::Target {
        header: label,
        problem,
    })?;
    let mut hosts = headers.get_all(&X_FORWARDED_HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(Unreadable::Repeated("X-Forwarded-Host")),
        (host, _) => match host.map(|host| host.to_str()) {
            Some(Ok(host)) => Some(host.to_owned()),
            Some(Err(_)) => return Err(Unreadable::Host),
            None => None,
        },
    };
    if headers.get(&X_FORWARDED_FOR).is_none() {
        return Err(Unreadable::NoClient);
    }
    Ok(Original {
        method,
        path,
        query,
        host,
    })
}

/// The path and query of an origin-form target (`/a/b?q`) or `*`, as the proxy would have
/// received them.
fn target_path(target: &[u8]) -> Result<(String, Option<String>), &'static str> {
    if target == b"*" {
        return Ok(("*".into(), None));
    }
    if target.first() != Some(&b'/') {
        return Err("it does not start with /");
    }
    // A fragment is never sent in a request (RFC 9110 section 4.2.5): one here was written by
    // the client, and what a backend makes of it is anybody's guess.
    if target.contains(&b'#') {
        return Err("it holds a # (fragments are never sent)");
    }
    let uri = Uri::try_from(target).map_err(|_| "it is not a valid URI path")?;
    Ok((uri.path().to_owned(), uri.query().map(str::to_owned)))
}

/// Answer one call from `peer`.
pub async fn answer(
    door: &Decide,
    request: &Request<Incoming>,
    peer: SocketAddr,
    span: Option<&RequestSpan>,
) -> Response<DecideBody> {
    let peer_ip = peer.ip().to_canonical();
    if !door.gate.trusts(peer_ip) {
        if let Some(suppressed) = door.untrusted_log.admit() {
            if suppressed > 0 {
                tracing::warn!(suppressed, "{suppressed} similar lines suppressed");
            }
            tracing::warn!(
                peer = %peer_ip,
                "forward-auth call refused: the peer is not in TRUSTED_PROXIES, so the client address it forwards cannot be believed"
            );
        }
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "forward-auth calls are answered for TRUSTED_PROXIES only, and {peer_ip} is not one: \
                 add the calling proxy's address to TRUSTED_PROXIES"
            ),
            None,
        );
    }
    let refusals = &door.settings.refusals;
    let refusal = match refusal_status(request.uri().query(), refusals.status()) {
        Ok(status) => status,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem, Some("status")),
    };
    let headers = request.headers();
    let original = match original(headers, request.method()) {
        Ok(original) => original,
        Err(unreadable) => return error(StatusCode::BAD_REQUEST, &unreadable.to_string(), None),
    };
    if let Some(name) = underscore_alias(door, headers) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!(
                "header {name} is a spelling of a key or method-override header that backends may read as it"
            ),
            None,
        );
    }
    let head = Head {
        method: &original.method,
        path: &original.path,
        query: original.query.as_deref(),
        authority: original.host.as_deref(),
        headers,
        peer: peer_ip,
        upgrade: false,
    };
    let admission = match door.gate.admit(&head).await {
        Ok(admission) => admission,
        Err(Refused::Ambiguous(reason) | Refused::Headers(reason)) => {
            return error(StatusCode::BAD_REQUEST, &reason, None);
        }
        // Not asked for (upgrade is false); a tunnel is the ingress's to hold.
        Err(Refused::Tunnels(_)) => return error(refusal, "too many upgraded connections", None),
    };
    if let Some(span) = span {
        span.decided(admission.traced());
    }
    let answers = &door.answers;
    let response = match answers.refusal(&admission, headers, Refuse::CallingProxy(refusal)) {
        Some(refused) => refused.map(full),
        None => {
            let mut response = Response::new(full(""));
            answers.set_headers(&admission, response.headers_mut());
            // For the calling proxy to copy onto the request it forwards (Traefik's
            // authResponseHeaders, nginx's auth_request_set), whatever the client is told.
            answers.set_forwarded(&admission, response.headers_mut());
            response
        }
    };
    door.log(&super::Decided {
        door: "forward-auth",
        method: Some(original.method.as_str()),
        path: Some(&original.path),
        client: admission.key(),
        address: admission.client(),
        rule: &admission.rule().name,
        outcome: admission.outcome(),
        status: response.status().as_u16(),
        retry_after_s: admission.retry_after_secs(),
    });
    // The request is the calling proxy's to carry out, out of sight.
    admission.settle_elsewhere();
    response
}

/// The status of a refusal: `deny` (`DENY_STATUS`), or what `?status=` names (`401`, `403` or
/// `429`). Other parameters are not ours and are passed over: Caddy's `forward_auth` appends
/// the original request's query to the URI it calls.
fn refusal_status(query: Option<&str>, deny: StatusCode) -> Result<StatusCode, String> {
    let mut status = deny;
    for pair in query.unwrap_or("").split('&') {
        let Some(value) = pair.strip_prefix("status=") else {
            continue;
        };
        status = match value {
            "401" => StatusCode::UNAUTHORIZED,
            "403" => StatusCode::FORBIDDEN,
            "429" => StatusCode::TOO_MANY_REQUESTS,
            _ => return Err(format!("status={value:?}: expected 401, 403 or 429")),
        };
    }
    Ok(status)
}

/// A header whose name, with `_` read as `-`, is one a rule keys by, or a method-override
/// header: CGI-style backends read it as that header, and the proxy in front forwards it
/// (nginx drops such names by default, Traefik and Caddy do not), so the budget would be the
/// real header's and the backend's key (or method) the alias's.
pub(super) fn underscore_alias(door: &Decide, headers: &HeaderMap) -> Option<String> {
    let mut aliases = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .peekable();
    aliases.peek()?;
    let generation = door.gate.current();
    aliases
        .find(|name| {
            let dashed = name.as_str().replace('_', "-");
            generation.key_headers().any(|key| key.as_str() == dashed)
                || METHOD_OVERRIDE_HEADERS
                    .iter()
                    .any(|header| header.as_str() == dashed)
        })
        .map(|name| name.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn traefik_and_caddy_headers_name_the_original_request() {
        let sent = headers(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/login?next=/"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(
            original(&sent, &Method::GET),
            Ok(Original {
                method: Method::POST,
                path: "/login".into(),
                query: Some("next=/".into()),
                host: None,
            })
        );
    }

    #[test]
    fn nginx_headers_name_it_too_and_the_method_defaults_to_the_calls_own() {
        let sent = headers(&[
            ("x-original-uri", "/api/x?tenant=a%62"),
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-host", "Example.com"),
        ]);
        assert_eq!(
            original(&sent, &Method::PUT),
            Ok(Original {
                method: Method::PUT,
                path: "/api/x".into(),
                query: Some("tenant=a%62".into()),
                host: Some("Example.com".into()),
            })
        );
    }

    #[test]
    fn a_target_that_could_be_read_two_ways_is_unreadable() {
        for (pairs, expected) in [
            (vec![("x-forwarded-for", "1.2.3.4")], Unreadable::NoTarget),
            (
                vec![
                    ("x-forwarded-uri", "/a"),
                    ("x-forwarded-uri", "/login"),
                    ("x-forwarded-for", "1.2.3.4"),
                ],
                Unreadable::Repeated("X-Forwarded-Uri"),
            ),
            (
                vec![
                    ("x-forwarded-uri", "/a"),
                    ("x-original-uri", "/login"),
                    ("x-forwarded-for", "1.2.3.4"),
                ],
                Unreadable::Repeated("X-Original-URI"),
            ),
            (
                vec![("x-forwarded-uri", "login"), ("x-forwarded-for", "1.2.3.4")],
                Unreadable::Target {
                    header: "X-Forwarded-Uri",
                    problem: "it does not start with /",
                },
            ),
            (
                vec![("x-forwarded-uri", "/a#/login"), ("x-forwarded-for", "1.2.3.4")],
                Unreadable::Target {
                    header: "X-Forwarded-Uri",
                    problem: "it holds a # (fragments are never sent)",
                },
            ),
            (vec![("x-forwarded-uri", "/login")], Unreadable::NoClient),
            (
                vec![
                    ("x-forwarded-uri", "/a"),
                    ("x-forwarded-host", "a.example"),
                    ("x-forwarded-host", "b.example"),
                    ("x-forwarded-for", "1.2.3.4"),
                ],
                Unreadable::Repeated("X-Forwarded-Host"),
            ),
            (
                vec![
                    ("x-forwarded-uri", "/a"),
                    ("x-forwarded-method", "G E T"),
                    ("x-forwarded-for", "1.2.3.4"),
                ],
                Unreadable::Method("X-Forwarded-Method"),
            ),
        ] {
            assert_eq!(
                original(&headers(&pairs), &Method::GET),
                Err(expected),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn the_constant_refusal_body_is_what_error_writes() {
        let written = serde_json::json!({ "error": "rate limit exceeded" }).to_string();
        assert_eq!(LIMITED, written.as_bytes());
    }

    #[test]
    fn the_refusal_status_is_deny_status_or_401_403_429() {
        let deny = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(refusal_status(None, deny), Ok(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(
            refusal_status(Some("status=403"), deny),
            Ok(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            refusal_status(Some("status=401"), deny),
            Ok(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            refusal_status(Some("page=2&status=403"), deny),
            Ok(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            refusal_status(Some("page=2"), deny),
            Ok(StatusCode::TOO_MANY_REQUESTS)
        );
        assert!(refusal_status(Some("status=200"), deny).is_err());
        // DENY_STATUS is the default; ?status= still names one for this proxy.
        let deny = StatusCode::FORBIDDEN;
        assert_eq!(refusal_status(None, deny), Ok(StatusCode::FORBIDDEN));
        assert_eq!(
            refusal_status(Some("status=429"), deny),
            Ok(StatusCode::TOO_MANY_REQUESTS)
        );
    }
}
