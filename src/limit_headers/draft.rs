//! The IETF `RateLimit-Policy` and `RateLimit` header fields, sent with `RATE_LIMIT_HEADERS=draft`.
//!
//! Written to [draft-ietf-httpapi-ratelimit-headers-11][draft] (23 May 2026), a work in progress
//! whose syntax has changed between revisions. The current revision is -12 (20 November 2026),
//! whose text could not be read to compare when this was last checked; these fields stay -11's
//! until it is. The same fields go on forwarded requests with `FORWARD_RATELIMIT_HEADERS`. Both fields are Structured Field Lists (RFC 9651)
//! of Items whose value is the policy name as an sf-string. A rule of one limit is one Item per
//! field, named as the rule; a rule of several limits lists each, in the order written, named
//! `RULE.1`, `RULE.2`, ...:
//!
//! ```text
//! RateLimit-Policy: "general";q=100;w=60
//! RateLimit: "general";r=42;t=3
//!
//! RateLimit-Policy: "api.1";q=20;w=2, "api.2";q=10000;w=86400
//! RateLimit: "api.1";r=19;t=1, "api.2";r=9999;t=86400
//! ```
//!
//! - `q` is the quota and `w` the window in seconds (draft section 3.1). `w` MUST be non-zero
//!   but is optional, so a zero window is left out rather than sent.
//! - `r` is the available quota and `t` the "effective window": the seconds within which the
//!   client can use no more than `r` (section 4.1.2). Revision -10 called `t` "the number of
//!   seconds until additional quota ... is made available"; neither revision means the time until
//!   the whole quota is back.
//!
//! A value that cannot be serialized (a name outside printable ASCII, an integer above the
//! 15 digits Structured Fields allow) fails per RFC 9651, and that field is not sent.
//!
//! [draft]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/11/

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// `RateLimit-Policy`: the quota policy, `"name";q=…;w=…`.
pub(crate) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the current service limit under that policy, `"name";r=…;t=…`.
pub(crate) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Largest sf-integer (RFC 9651 section 3.3.1): 15 decimal digits.
const MAX_INTEGER: u64 = 999_999_999_999_999;

/// Remove both fields: a client's own on a request forwarded with `FORWARD_RATELIMIT_HEADERS`
/// that has no decision of ours to carry (an exempt client, a skipped path), so the backend
/// never reads a budget the client wrote.
pub(crate) fn remove(headers: &mut HeaderMap) {
    headers.remove(&RATELIMIT_POLICY);
    headers.remove(&RATELIMIT);
}

/// Set both fields for one policy, replacing any the backend sent.
///
/// `name` is the policy name (the rule's name), `quota` is `q`, `window_secs` is `w`, `remaining`
/// is `r` and `reset_secs` is `t` (whole seconds, already rounded up by the caller). The backend's
/// fields are removed even when ours cannot be serialized: a backend policy next to tollgate's
/// numbers would describe a limit that is not the one enforced.
pub(crate) fn set(
    headers: &mut HeaderMap,
    name: &str,
    quota: u64,
    window_secs: u64,
    remaining: u64,
    reset_secs: u64,
) {
    remove(headers);
    let (policy, rate_limit) = fields(name, quota, window_secs, remaining, reset_secs);
    if let Some(value) = policy {
        headers.insert(&RATELIMIT_POLICY, value);
    }
    if let Some(value) = rate_limit {
        headers.insert(&RATELIMIT, value);
    }
}

/// The values of `RateLimit-Policy` and `RateLimit` for one policy (see [`set`]), each `None`
/// when it cannot be serialized.
pub(crate) fn fields(
    name: &str,
    quota: u64,
    window_secs: u64,
    remaining: u64,
    reset_secs: u64,
) -> (Option<HeaderValue>, Option<HeaderValue>) {
    let policy = Policy {
        name,
        quota,
        window_secs,
        remaining,
        reset_secs,
    };
    (
        policy
            .quota_item()
            .and_then(|value| HeaderValue::from_str(&value).ok()),
        policy
            .service_item()
            .and_then(|value| HeaderValue::from_str(&value).ok()),
    )
}

/// One policy of a rule of several limits, as the fields list it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy<'a> {
    /// Its name: unique among the policies of one response.
    pub name: &'a str,
    /// `q`.
    pub quota: u64,
    /// `w`, in whole seconds (0: left out).
    pub window_secs: u64,
    /// `r`.
    pub remaining: u64,
    /// `t`, in whole seconds.
    pub reset_secs: u64,
}

impl Policy<'_> {
    /// Its member of `RateLimit-Policy`.
    fn quota_item(&self) -> Option<String> {
        match self.window_secs {
            // `w` MUST be non-zero (draft section 3.1.3) but is OPTIONAL: leave it out.
            0 => item(self.name, &[("q", self.quota)]),
            window => item(self.name, &[("q", self.quota), ("w", window)]),
        }
    }

    /// Its member of `RateLimit`.
    fn service_item(&self) -> Option<String> {
        item(self.name, &[("r", self.remaining), ("t", self.reset_secs)])
    }
}

/// Set both fields for several policies (a rule of several limits), one List member each in
/// the given order, replacing any the backend sent. A field with a member that cannot be
/// serialized is not sent (RFC 9651 fails the whole List).
pub(crate) fn set_all(headers: &mut HeaderMap, policies: &[Policy<'_>]) {
    remove(headers);
    let list = |member: fn(&Policy<'_>) -> Option<String>| {
        let members: Option<Vec<String>> = policies.iter().map(member).collect();
        members.and_then(|members| HeaderValue::from_str(&members.join(", ")).ok())
    };
    if let Some(value) = list(|policy| policy.quota_item()) {
        headers.insert(&RATELIMIT_POLICY, value);
    }
    if let Some(value) = list(|policy| policy.service_item()) {
        headers.insert(&RATELIMIT, value);
    }
}

/// One List member: the name as an sf-string, then `;key=integer` parameters.
fn item(name: &str, params: &[(&str, u64)]) -> Option<String> {
    let mut value = sf_string(name)?;
    for &(key, number) in params {
        if number > MAX_INTEGER {
            return None;
        }
        value.push(';');
        value.push_str(key);
        value.push('=');
        value.push_str(itoa::Buffer::new().format(number));
    }
    Some(value)
}

/// RFC 9651 section 3.3.3: printable ASCII (0x20-0x7E) in double quotes, with `"` and `\`
/// backslash-escaped. Anything else fails serialization; `HeaderValue` alone would let tabs and
/// non-ASCII bytes through.
fn sf_string(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if !(c == ' ' || c.is_ascii_graphic()) {
            return None;
        }
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines `set` produces, in the draft's spelling: `RateLimit-Policy` first, then `RateLimit`.
    fn lines(name: &str, [q, w, r, t]: [u64; 4]) -> Vec<String> {
        let mut headers = HeaderMap::new();
        set(&mut headers, name, q, w, r, t);
        [(&RATELIMIT_POLICY, "RateLimit-Policy"), (&RATELIMIT, "RateLimit")]
            .into_iter()
            .flat_map(|(field, label)| {
                headers
                    .get_all(field)
                    .iter()
                    .map(move |value| format!("{label}: {}", value.to_str().unwrap_or("<opaque>")))
            })
            .collect()
    }

    #[test]
    fn draft_examples_with_both_fields() {
        // (name, [q, w, r, t], then both lines verbatim from draft-11)
        #[rustfmt::skip]
        let examples = [
            // Appendix B.1.3, first and second response.
            ("basic", [100, 60, 60, 58], r#"RateLimit-Policy: "basic";q=100;w=60"#,
                                         r#"RateLimit: "basic";r=60;t=58"#),
            ("basic", [100, 60, 20, 56], r#"RateLimit-Policy: "basic";q=100;w=60"#,
                                         r#"RateLimit: "basic";r=20;t=56"#),
            // B.2.1 (the draft lists RateLimit first).
            ("fixedwindow", [100, 60, 99, 50], r#"RateLimit-Policy: "fixedwindow";q=100;w=60"#,
                                               r#"RateLimit: "fixedwindow";r=99;t=50"#),
            // B.2.2.
            ("dynamic", [100, 60, 9, 50], r#"RateLimit-Policy: "dynamic";q=100;w=60"#,
                                          r#"RateLimit: "dynamic";r=9;t=50"#),
            // B.2.3, a 429.
            ("dynamic", [15, 20, 0, 20], r#"RateLimit-Policy: "dynamic";q=15;w=20"#,
                                         r#"RateLimit: "dynamic";r=0;t=20"#),
            // B.3, a 429 that also carries `Retry-After: 20`.
            ("dynamic", [100, 60, 15, 40], r#"RateLimit-Policy: "dynamic";q=100;w=60"#,
                                           r#"RateLimit: "dynamic";r=15;t=40"#),
            // Section 8.5.
            ("somepolicy", [10000, 1000, 10000, 10], r#"RateLimit-Policy: "somepolicy";q=10000;w=1000"#,
                                                     r#"RateLimit: "somepolicy";r=10000;t=10"#),
            // Sections 3.2 and 4.2, in separate examples there.
            ("default", [100, 10, 50, 30], r#"RateLimit-Policy: "default";q=100;w=10"#,
                                           r#"RateLimit: "default";r=50;t=30"#),
        ];
        for (name, numbers, policy, rate_limit) in examples {
            assert_eq!(lines(name, numbers), [policy, rate_limit]);
        }
    }

    #[test]
    fn draft_examples_of_rate_limit_alone() {
        // (name, r, t, the line verbatim from draft-11); these examples give no `q` or `w`.
        #[rustfmt::skip]
        let examples = [
            ("default", 1, 7, r#"RateLimit: "default";r=1;t=7"#),                    // section 7
            ("problemPolicy", 0, 10, r#"RateLimit: "problemPolicy";r=0;t=10"#),      // section 6, a 301
            ("daily", 1, 86400, r#"RateLimit: "daily";r=1;t=86400"#),                // section 8.5
            ("default", 0, 50, r#"RateLimit: "default";r=0;t=50"#),                  // B.1.1
            ("default", 0, 48, r#"RateLimit: "default";r=0;t=48"#),                  // B.1.1
            ("dayLimit", 100, 36000, r#"RateLimit: "dayLimit";r=100;t=36000"#),      // B.1.2
            ("default", 0, 5, r#"RateLimit: "default";r=0;t=5"#),                    // B.1.4, 429
            ("day", 100, 36000, r#"RateLimit: "day";r=100;t=36000"#),                // B.3.1
        ];
        for (name, r, t, rate_limit) in examples {
            assert_eq!(lines(name, [1, 1, r, t])[1], rate_limit);
        }
    }

    #[test]
    fn names_are_quoted_and_escaped() {
        assert_eq!(
            lines("/api/export/*", [10, 60, 9, 6]),
            [
                r#"RateLimit-Policy: "/api/export/*";q=10;w=60"#,
                r#"RateLimit: "/api/export/*";r=9;t=6"#
            ]
        );
        assert_eq!(
            lines(r#"a "b" \c"#, [1, 2, 0, 2]),
            [
                r#"RateLimit-Policy: "a \"b\" \\c";q=1;w=2"#,
                r#"RateLimit: "a \"b\" \\c";r=0;t=2"#
            ]
        );
    }

    #[test]
    fn unserializable_values_are_not_sent() {
        // Not printable ASCII: neither field.
        for name in ["caf\u{e9}", "tab\there", "line\nbreak"] {
            assert!(lines(name, [1, 1, 1, 1]).is_empty(), "{name:?}");
        }
        // An sf-integer has at most 15 digits: only the field holding a longer one goes.
        assert_eq!(
            lines("x", [MAX_INTEGER + 1, 60, 5, 6]),
            [r#"RateLimit: "x";r=5;t=6"#]
        );
        assert_eq!(
            lines("x", [MAX_INTEGER, 60, 5, u64::MAX]),
            [r#"RateLimit-Policy: "x";q=999999999999999;w=60"#]
        );
    }

    #[test]
    fn zero_window_is_left_out() {
        assert_eq!(lines("x", [5, 0, 5, 0])[0], r#"RateLimit-Policy: "x";q=5"#);
    }

    #[test]
    fn backend_fields_are_replaced() {
        let mut headers = HeaderMap::new();
        for (field, value) in [
            (&RATELIMIT_POLICY, r#""backend";q=1;w=1"#),
            (&RATELIMIT_POLICY, r#""other";q=2;w=2"#),
            (&RATELIMIT, r#""backend";r=0;t=1"#),
        ] {
            headers.append(field, HeaderValue::from_static(value));
        }
        set(&mut headers, "general", 100, 60, 99, 1);
        assert_eq!(headers.get_all(&RATELIMIT_POLICY).iter().count(), 1);
        assert_eq!(headers[&RATELIMIT_POLICY], r#""general";q=100;w=60"#);
        assert_eq!(headers[&RATELIMIT], r#""general";r=99;t=1"#);

        // Even when ours cannot be sent, the backend's do not survive.
        headers.append(&RATELIMIT, HeaderValue::from_static(r#""backend";r=0;t=1"#));
        set(&mut headers, "caf\u{e9}", 100, 60, 99, 1);
        assert!(headers.is_empty());
    }
}
