//! The rate-limit headers every door writes on a decided answer: the proxy on the backend's
//! response or its own `429`, the decision endpoints on theirs.
//!
//! `RATE_LIMIT_HEADERS` picks the headers ([`HeaderStyle`]):
//! - `legacy`: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix
//!   seconds at which the budget is entirely back, as GitHub's API uses them);
//! - `draft`: `RateLimit-Policy` and `RateLimit` of the IETF draft (see [`draft`]);
//! - `both`, or `none` (nothing about the limits is revealed; a 429 still has `Retry-After`).
//!
//! Ours replace any the backend sent. `Retry-After` is whole seconds, rounded up, at least 1
//! (RFC 9110 section 10.2.3).

pub(crate) mod draft;

use std::cell::RefCell;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::algorithms::Decision;
use crate::header_arena;
use crate::rules::Rule;

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
            set_draft(headers, rule, decision);
        }
    }
}

/// Set the draft's `RateLimit-Policy` and `RateLimit` for `decision` under `rule` (every limit
/// of it, see [`draft`]), replacing any there: on a response as `RATE_LIMIT_HEADERS=draft` asks, or on the request forwarded to
/// the backend (`FORWARD_RATELIMIT_HEADERS`), the same values either way.
pub(crate) fn set_draft(headers: &mut HeaderMap, rule: &Rule, decision: &Decision) {
    if let [policy] = &*rule.limits {
        let t = if decision.allowed {
            ceil_secs(decision.reset_after)
        } else {
            retry_after_secs(decision.retry_after)
        };
        let window = ceil_secs(policy.window());
        draft::set(headers, &rule.name, decision.limit, window, decision.remaining, t);
        return;
    }
    // Each limit: the same `t` as one limit's, by its own part (a limit that refused says
    // its retry time; one that allowed, when it is entirely back).
    let names: Vec<String> = (0..rule.limits.len())
        .map(|i| crate::rules::table::limit_name(&rule.name, i))
        .collect();
    let policies: Vec<draft::Policy<'_>> = rule
        .limits
        .iter()
        .zip(decision.parts())
        .zip(&names)
        .map(|((policy, part), name)| draft::Policy {
            name,
            quota: policy.limit(),
            window_secs: ceil_secs(policy.window()),
            remaining: part.remaining,
            reset_secs: if part.allowed {
                ceil_secs(part.reset_after())
            } else {
                retry_after_secs(part.retry_after())
            },
        })
        .collect();
    draft::set_all(headers, &policies);
}

// Constants, not statics: inserted by value, each is a few stores rather than a call to clone
// a static's name (see `gate::identity::X_FORWARDED_FOR_NAME`).
/// `X-RateLimit-Limit`.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Set the three rate-limit headers, replacing the backend's.
pub(crate) fn set_rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    let reset_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(decision.reset_after);
    let (limit, reset) = LAST_VALUES.with(|last| {
        let mut last = last.borrow_mut();
        (
            last.limit.value(decision.limit),
            last.reset.value(ceil_secs(reset_at)),
        )
    });
    headers.insert(X_RATELIMIT_LIMIT, limit);
    headers.insert(X_RATELIMIT_REMAINING, integer_value(decision.remaining));
    headers.insert(X_RATELIMIT_RESET, reset);
}

/// The last `X-RateLimit-Limit` and `X-RateLimit-Reset` values a thread wrote: a rule's limit
/// is the same on each of its answers, and the reset second of a budget that is mostly there
/// is the same for a second of them, so most answers clone the last value (a counter
/// increment) instead of writing the digits again. The remaining budget changes every time.
#[derive(Default)]
struct LastValues {
    limit: LastValue,
    reset: LastValue,
}

/// One integer's last header value.
#[derive(Default)]
struct LastValue(Option<(u64, HeaderValue)>);

impl LastValue {
    /// `n` as a header value: the last one if it was for `n`.
    fn value(&mut self, n: u64) -> HeaderValue {
        match &self.0 {
            Some((last, value)) if *last == n => value.clone(),
            _ => {
                let value = integer_value(n);
                self.0 = Some((n, value.clone()));
                value
            }
        }
    }
}

thread_local! {
    static LAST_VALUES: RefCell<LastValues> = RefCell::new(LastValues::default());
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

/// `n` as a header value: for a small `n` a copy of one made at startup, else cut from the
/// thread's header buffer ([`crate::header_arena`]), with no allocation of its own
/// (`HeaderValue::from(u64)` makes two: a 20-byte buffer, then, as its length is not its
/// capacity, a shared header for it).
pub(crate) fn integer_value(n: u64) -> HeaderValue {
    if let Some(value) = usize::try_from(n).ok().and_then(|n| SMALL_VALUES.get(n)) {
        return value.clone();
    }
    let mut digits = itoa::Buffer::new();
    // Digits are always a valid header value; `n` is the (never taken) way round.
    header_arena::copy(digits.format(n).as_bytes()).unwrap_or_else(|| HeaderValue::from(n))
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after).max(1)
}

fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
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
    fn the_last_value_is_reused_only_for_the_same_number() {
        let mut last = LastValue::default();
        for n in [5_000_000, 5_000_000, 5_000_001, 7, 5_000_001, u64::MAX, u64::MAX] {
            assert_eq!(last.value(n), n.to_string().as_str());
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }
}
