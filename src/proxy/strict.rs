//! Request heads that HTTP/1.1 does not allow, or that two servers could read two ways,
//! refused before anything else happens (as Envoy does by default).
//!
//! hyper already refuses, with `400` and a closed connection, what its parser cannot frame:
//! differing `Content-Length`s, a `Transfer-Encoding` whose last coding is not `chunked`, or any
//! `Transfer-Encoding` in HTTP/1.0. The rest is checked here:
//!
//! - Both `Content-Length` and `Transfer-Encoding`: `400`, as Envoy and nginx answer (RFC 9112
//!   section 6.1 allows it, and calls it a likely smuggling attempt). hyper drops the
//!   `Content-Length` before the request gets here, so the server follows the client's bytes
//!   to find such heads and marks the request with the `content_length_dropped` argument of [`check`] (see
//!   `server::framing`).
//! - `CONNECT` asks the gateway to open a tunnel to any host: `405` (RFC 9110 section 9.3.6).
//! - The request-target `*` is only for `OPTIONS` (RFC 9112 section 3.2.4): `400` with any
//!   other method.
//! - An HTTP/1.1 request without `Host`, with more than one `Host` line, or with a `Host` that is
//!   not a `host[:port]`: `400` (RFC 9112 section 3.2). Two `Host`s are the classic way to make
//!   the gateway and the backend route one request to two sites.
//! - An absolute-form target (`GET http://host/path`) with user information or a scheme other
//!   than `http` and `https`: `400` (RFC 9110 section 4.2.4). Its authority, not `Host`, is the
//!   host the request is for (RFC 9112 section 3.2.2): see [`target_host`].
//! - A `Transfer-Encoding` other than a single `chunked` (`gzip, chunked`): `501` (RFC 9112
//!   section 6.1). hyper decodes the chunks only, and the gateway does not re-encode the rest, so
//!   forwarding it would hand the backend a body in a coding nobody declared.
//!
//! Each check reads a header or two in place: nothing is allocated for a request that passes.
//! Every refusal closes an HTTP/1 connection, since a client that sends these cannot be
//! trusted to frame the next request the way the gateway reads it.

use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Scheme, Uri};
use http::{Method, StatusCode, Version};

use super::headers::HeadScan;

/// What is wrong with a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Violation {
    /// `CONNECT` is never forwarded.
    #[error("CONNECT is not forwarded")]
    Connect,
    /// The request-target `*` with a method other than `OPTIONS`.
    #[error("the request-target '*' is only allowed with OPTIONS")]
    AsteriskForm,
    /// An HTTP/1.1 request without `Host`.
    #[error("an HTTP/1.1 request needs a Host header")]
    MissingHost,
    /// More than one `Host` line.
    #[error("the request has more than one Host header")]
    DuplicateHost,
    /// A `Host` that is not `host[:port]`.
    #[error("the Host header is not a valid host[:port]")]
    InvalidHost,
    /// An absolute-form target with `user@` in its authority.
    #[error("the request-target has user information")]
    Userinfo,
    /// An absolute-form target with a scheme other than `http` or `https`.
    #[error("the request-target's scheme is not http or https")]
    Scheme,
    /// A transfer coding other than `chunked`.
    #[error("only the chunked transfer coding is supported")]
    TransferCoding,
    /// Both `Content-Length` and `Transfer-Encoding`.
    #[error("the request has both Content-Length and Transfer-Encoding")]
    ContentLengthWithTransferEncoding,
}

impl Violation {
    /// The status the refusal is sent with.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Violation::Connect => StatusCode::METHOD_NOT_ALLOWED,
            Violation::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The methods a `405` names in `Allow`: every method is forwarded but `CONNECT`.
pub(crate) static ALLOW: HeaderValue =
    HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH");

/// Check a request head; see the module docs for what is refused and why.
/// `scan`: the head's names, read once for this and the proxy's filters (`Transfer-Encoding`
/// is looked up only if the scan saw one).
/// `content_length_dropped`: the server saw a `Content-Length` in the client's bytes that
/// hyper dropped because a `Transfer-Encoding` came with it.
pub(crate) fn check(
    method: &Method,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
    content_length_dropped: bool,
    scan: &HeadScan,
) -> Result<(), Violation> {
    if content_length_dropped && scan.transfer_encoding {
        return Err(Violation::ContentLengthWithTransferEncoding);
    }
    if method == Method::CONNECT {
        return Err(Violation::Connect);
    }
    if uri.path() == "*" && method != Method::OPTIONS {
        return Err(Violation::AsteriskForm);
    }
    if let Some(authority) = uri.authority() {
        if authority.as_str().contains('@') {
            return Err(Violation::Userinfo);
        }
        if let Some(scheme) = uri.scheme()
            && *scheme != Scheme::HTTP
            && *scheme != Scheme::HTTPS
        {
            return Err(Violation::Scheme);
        }
    }
    if scan.transfer_encoding {
        let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter();
        match (codings.next(), codings.next()) {
            (None, _) => {}
            (Some(coding), None) if coding.as_bytes().eq_ignore_ascii_case(b"chunked") => {}
            _ => return Err(Violation::TransferCoding),
        }
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (_, Some(_)) => Err(Violation::DuplicateHost),
        // HTTP/2 names the host in :authority; HTTP/1.0 may name none.
        (None, None) if version == Version::HTTP_11 => Err(Violation::MissingHost),
        (Some(host), None) if !is_host(host.as_bytes()) => Err(Violation::InvalidHost),
        _ => Ok(()),
    }
}

/// The host a request is for, as the backend's `Host`: the target's authority when it has one
/// (an absolute-form target, RFC 9112 section 3.2.2, or HTTP/2's `:authority`, RFC 9113
/// section 8.3.1), else the `Host` header.
pub(crate) fn target_host(uri: &Uri, headers: &HeaderMap) -> Option<HeaderValue> {
    match uri.authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => headers.get(header::HOST).cloned(),
    }
}

/// `uri-host [ ":" port ]` by its characters (RFC 3986 section 3.2.2: an IP literal, an IPv4
/// address or a registered name, each written with these): no `@`, `/`, `?`, `#`, quote,
/// backslash, space or control byte. Empty is allowed (RFC 9110 section 7.2).
fn is_host(value: &[u8]) -> bool {
    value.iter().all(|&byte| HOST_BYTES[usize::from(byte)])
}

/// The bytes [`is_host`] allows, by value: one load a byte where a search of the punctuation
/// list cost a scan for each `.` and `:` of every request's `Host`.
static HOST_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        allowed[byte] = b.is_ascii_alphanumeric();
        byte += 1;
    }
    let punctuation = b"-._~!$&'()*+,;=:[]%";
    let mut i = 0;
    while i < punctuation.len() {
        allowed[punctuation[i] as usize] = true;
        i += 1;
    }
    allowed
};

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str, version: Version, headers: &[(&str, &str)]) -> Result<(), Violation> {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let uri: Uri = target.parse().unwrap();
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        check(&method, &uri, version, &map, false, &HeadScan::of(&map))
    }

    const HOST: (&str, &str) = ("host", "example.com");

    #[test]
    fn ordinary_requests_pass() {
        assert_eq!(head("GET", "/", Version::HTTP_11, &[HOST]), Ok(()));
        assert_eq!(head("OPTIONS", "*", Version::HTTP_11, &[HOST]), Ok(()));
        assert_eq!(head("GET", "/", Version::HTTP_10, &[]), Ok(()));
        assert_eq!(head("GET", "http://a.example/x", Version::HTTP_2, &[]), Ok(()));
        assert_eq!(
            head(
                "POST",
                "/",
                Version::HTTP_11,
                &[HOST, ("transfer-encoding", "Chunked")]
            ),
            Ok(())
        );
        for host in ["example.com:8080", "[2001:db8::1]:443", "192.0.2.1", ""] {
            assert_eq!(
                head("GET", "/", Version::HTTP_11, &[("host", host)]),
                Ok(()),
                "{host}"
            );
        }
    }

    #[test]
    fn a_dropped_content_length_is_refused_when_the_encoding_is_there() {
        let uri: Uri = "/".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("a"));
        let checked = |headers: &HeaderMap, dropped: bool| {
            check(
                &Method::POST,
                &uri,
                Version::HTTP_11,
                headers,
                dropped,
                &HeadScan::of(headers),
            )
        };
        // The mark alone is not enough: both readings must agree.
        assert_eq!(checked(&headers, true), Ok(()));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        assert_eq!(checked(&headers, false), Ok(()));
        let refused = checked(&headers, true);
        assert_eq!(refused, Err(Violation::ContentLengthWithTransferEncoding));
        assert_eq!(refused.unwrap_err().status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn what_is_refused_and_with_which_status() {
        let cases = [
            (
                head("CONNECT", "example.com:443", Version::HTTP_11, &[HOST]),
                Violation::Connect,
            ),
            (
                head("GET", "*", Version::HTTP_11, &[HOST]),
                Violation::AsteriskForm,
            ),
            (head("GET", "/", Version::HTTP_11, &[]), Violation::MissingHost),
            (
                head("GET", "/", Version::HTTP_11, &[HOST, HOST]),
                Violation::DuplicateHost,
            ),
            (
                head("GET", "/", Version::HTTP_2, &[HOST, ("host", "b")]),
                Violation::DuplicateHost,
            ),
            (
                head("GET", "/", Version::HTTP_11, &[("host", "a b")]),
                Violation::InvalidHost,
            ),
            (
                head("GET", "/", Version::HTTP_11, &[("host", "a/b")]),
                Violation::InvalidHost,
            ),
            (
                head("GET", "/", Version::HTTP_11, &[("host", "u@a")]),
                Violation::InvalidHost,
            ),
            (
                head("GET", "http://u:p@a.example/", Version::HTTP_11, &[HOST]),
                Violation::Userinfo,
            ),
            (
                head("GET", "ftp://a.example/", Version::HTTP_11, &[HOST]),
                Violation::Scheme,
            ),
            (
                head(
                    "POST",
                    "/",
                    Version::HTTP_11,
                    &[HOST, ("transfer-encoding", "gzip, chunked")],
                ),
                Violation::TransferCoding,
            ),
            (
                head(
                    "POST",
                    "/",
                    Version::HTTP_11,
                    &[
                        HOST,
                        ("transfer-encoding", "chunked"),
                        ("transfer-encoding", "chunked"),
                    ],
                ),
                Violation::TransferCoding,
            ),
        ];
        for (result, violation) in cases {
            assert_eq!(result, Err(violation));
        }
        assert_eq!(Violation::Connect.status(), 405);
        assert_eq!(Violation::TransferCoding.status(), 501);
        assert_eq!(Violation::DuplicateHost.status(), 400);
    }

    #[test]
    fn host_bytes_are_the_rfc_3986_host_characters() {
        for byte in 0..=255u8 {
            let allowed = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&byte);
            assert_eq!(is_host(&[byte]), allowed, "byte {byte:#04x}");
        }
        assert!(is_host(b"[2001:db8::1]:8080"));
        assert!(!is_host(b"a b"));
    }

    #[test]
    fn the_target_authority_wins_over_host() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("gateway.test"));
        let absolute: Uri = "http://other.example:8080/x".parse().unwrap();
        assert_eq!(target_host(&absolute, &headers).unwrap(), "other.example:8080");
        let origin: Uri = "/x".parse().unwrap();
        assert_eq!(target_host(&origin, &headers).unwrap(), "gateway.test");
        assert_eq!(target_host(&origin, &HeaderMap::new()), None);
    }
}
