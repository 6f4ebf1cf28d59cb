//! Responses the gateway writes itself (400, 405, 408, 429 for tunnels, 501, 502, 503, 504).
//! What an admission is answered with (a rate-limit refusal, the `503` of an unavailable
//! store, the rate-limit headers) is every door's: [`crate::gate::answer`].

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::{ProxyError, ResponseBody};

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
