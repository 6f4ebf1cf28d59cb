//! `CORS_ALLOW_ORIGINS`: CORS headers on the gateway's own answers (`429`, `503`, `400`, `502`,
//! ...), so a browser application sees the refusal, `Retry-After` and the rate-limit headers
//! instead of a CORS error. The backend's answers are its own business and pass untouched.
//!
//! A browser hands a cross-origin response to the page only when `Access-Control-Allow-Origin`
//! names the page's origin (or is `*`), and shows it only the headers that
//! `Access-Control-Expose-Headers` lists beyond the safelisted few (Fetch standard, "CORS
//! protocol"); `Retry-After` and the rate-limit headers are not safelisted.

use http::header::{self, HeaderMap, HeaderValue};

/// Who may read the gateway's own answers from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cors {
    /// `*`: any origin (no credentials, as the Fetch standard requires for `*`).
    AnyOrigin,
    /// These origins exactly (`scheme://host[:port]`, lower case), echoed back when the
    /// request's `Origin` is one of them, with `Vary: Origin`.
    Origins(Vec<HeaderValue>),
}

/// The headers a page may read off a refusal.
static EXPOSED: HeaderValue = HeaderValue::from_static(
    "retry-after, ratelimit, ratelimit-policy, x-ratelimit-limit, x-ratelimit-remaining, \
     x-ratelimit-reset, x-request-id",
);

impl Cors {
    /// Parse `*` or a comma-separated list of origins (`https://app.example.com`); `None` for
    /// an empty value (off).
    pub(crate) fn parse(value: &str) -> Result<Option<Cors>, String> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(None);
        }
        if value == "*" {
            return Ok(Some(Cors::AnyOrigin));
        }
        let mut origins = Vec::new();
        for origin in value
            .split(',')
            .map(str::trim)
            .filter(|origin| !origin.is_empty())
        {
            if origin == "*" {
                return Err("* stands alone: any origin, or a list of origins".into());
            }
            let Some((scheme, authority)) = origin.split_once("://") else {
                return Err(format!("{origin:?} is not an origin (scheme://host[:port])"));
            };
            let plain = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
            };
            if !matches!(scheme, "http" | "https") || !plain(authority) {
                return Err(format!(
                    "{origin:?} is not an origin: http:// or https://, a host and an optional \
                     port, no path"
                ));
            }
            let origin = origin.to_ascii_lowercase();
            let value = HeaderValue::from_str(&origin).map_err(|_| format!("{origin:?} is not an origin"))?;
            if !origins.contains(&value) {
                origins.push(value);
            }
        }
        Ok(Some(Cors::Origins(origins)))
    }

    /// The request's `Origin`, kept only when this policy could answer it (so a request
    /// without one, or with a foreign one, costs no copy).
    pub(crate) fn origin_of(&self, request: &HeaderMap) -> Option<HeaderValue> {
        let origin = request.get(header::ORIGIN)?;
        match self {
            Cors::AnyOrigin => Some(origin.clone()),
            Cors::Origins(origins) => origins
                .iter()
                .find(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
                .cloned(),
        }
    }

    /// Add the CORS headers to one of the gateway's own answers, for a request from `origin`
    /// (see [`origin_of`](Self::origin_of)).
    pub(crate) fn apply(&self, response: &mut HeaderMap, origin: HeaderValue) {
        match self {
            Cors::AnyOrigin => {
                response.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            }
            Cors::Origins(_) => {
                response.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                response.append(header::VARY, HeaderValue::from_static("origin"));
            }
        }
        response.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED.clone());
    }

    /// The setting as `--check-config` prints it.
    pub(crate) fn describe(&self) -> String {
        match self {
            Cors::AnyOrigin => "*".into(),
            Cors::Origins(origins) => origins
                .iter()
                .filter_map(|origin| origin.to_str().ok())
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        headers
    }

    #[test]
    fn listed_origins_are_echoed_and_others_get_nothing() {
        let cors = Cors::parse("https://App.example.com, http://localhost:3000")
            .unwrap()
            .unwrap();
        assert_eq!(cors.describe(), "https://app.example.com,http://localhost:3000");
        let origin = cors.origin_of(&request("https://app.example.com")).unwrap();
        let mut response = HeaderMap::new();
        cors.apply(&mut response, origin);
        assert_eq!(
            response[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example.com"
        );
        assert_eq!(response[header::VARY], "origin");
        assert!(
            response[header::ACCESS_CONTROL_EXPOSE_HEADERS]
                .to_str()
                .unwrap()
                .contains("retry-after")
        );
        assert_eq!(cors.origin_of(&request("https://evil.example")), None);
        assert_eq!(cors.origin_of(&HeaderMap::new()), None);
    }

    #[test]
    fn any_origin_answers_star() {
        let cors = Cors::parse("*").unwrap().unwrap();
        let origin = cors.origin_of(&request("https://anyone.example")).unwrap();
        let mut response = HeaderMap::new();
        cors.apply(&mut response, origin);
        assert_eq!(response[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(!response.contains_key(header::VARY));
    }

    #[test]
    fn bad_lists_are_refused_and_empty_is_off() {
        assert_eq!(Cors::parse(""), Ok(None));
        for bad in [
            "app.example.com",
            "https://a.example/path",
            "ftp://a.example",
            "*,https://a.example",
            "https://",
        ] {
            assert!(Cors::parse(bad).is_err(), "{bad}");
        }
    }
}
