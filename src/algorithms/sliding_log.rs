//! Sliding log: the exact rolling window, at most `limit` requests in any `window_ms`-long
//! stretch of time.
//!
//! Each allowed request logs its time once per unit of cost; an entry at `t` counts while
//! `now < t + window`. Denied requests are not logged (a client hammering a closed door does not
//! keep it closed). Exact where the sliding window counter estimates, at the price of memory
//! per client growing with the limit: hence [`MAX_LOG_LIMIT`].
//!
//! Entries are appended at `now`, clamped to at least the newest entry, so the log is always
//! sorted oldest first. Then one entry decides: the request fits exactly when the log's first
//! `len + cost - limit` entries have expired, and the last of them expiring is when to retry.
//! Expired entries are popped from the front, each once, only when a request is allowed, which
//! places `now` at the back: popping them on a denial would be visible to a later request
//! whose clock had stepped back.
//!
//! `scripts/sliding_log.lua` is the same function, line for line, on a Redis list of decimal
//! timestamps. A list rather than a sorted set because sorted-set members are unique: two
//! requests in the same microsecond, or one costing more than 1, would collapse into one
//! member. Appending in non-decreasing order keeps the list sorted, so expiry is O(1) pops
//! from the head and a refund is one `LREM` from the tail.

use std::collections::VecDeque;
use std::fmt;
use std::iter;
use std::sync::LazyLock;
use std::time::Duration;

use super::sliding_window::{parse_limit_and_window, window_parameters};
use super::{Algorithm, Corrupt, DEBT_LIMITS, LuaScript, ParameterError, StateReader, US_PER_MS, put_u32, put_u64};
use crate::algorithms::LimitDecision;

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/sliding_log.lua"))));

/// Largest `LIMIT` accepted: a client's log holds up to `LIMIT` timestamps, in memory or in
/// Redis, so this bounds what one client can cost.
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Parameters of one sliding log rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    /// Requests allowed in any window-long stretch of time.
    pub limit: u64,
    /// Window length in milliseconds.
    pub window_ms: u64,
}

/// What is remembered of one client: the times of its allowed requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    /// Microseconds since the Unix epoch, oldest first, one entry per unit of cost.
    pub log: VecDeque<u64>,
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    const NAME: &'static str = "sliding_log";
    window_parameters!();

    const KEY_SUFFIX: &'static str = "sl";
    // Room for `cost` opens when the entry that frees it leaves the log, at its own timestamp
    // plus the window.
    const EXACT_RETRY: bool = true;
    const FILE_TAG: u8 = 4;
    const EXAMPLES: &'static [SlidingLog] = &[SlidingLog {
        limit: 3,
        window_ms: 10_000,
    }];

    fn script() -> &'static LuaScript {
        &SCRIPT
    }

    /// The log's length (`u32`), then its times.
    fn save_state(&self, state: &SlidingLogState, out: &mut Vec<u8>) -> bool {
        // A log never holds more than its rule's bounded debt (DEBT_LIMITS times its limit, at
        // most MAX_LOG_LIMIT).
        put_u32(out, state.log.len() as u32);
        for at in &state.log {
            put_u64(out, *at);
        }
        true
    }

    fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<SlidingLogState, Corrupt> {
        let len = input.u32()? as usize;
        // Bounded before the allocation: by the rule's bounded debt and by the bytes left.
        if len as u64 > DEBT_LIMITS.saturating_mul(self.limit) || len > input.left() / 8 {
            return Err("a sliding log longer than its bounded debt or than the file");
        }
        let mut log = VecDeque::with_capacity(len);
        for _ in 0..len {
            let at = input.u64()?;
            if at > saved_at || log.back().is_some_and(|&last| last > at) {
                return Err("a sliding log out of order or later than its save");
            }
            log.push_back(at);
        }
        Ok(SlidingLogState { log })
    }

    fn from_parameters(limit: &str, window: &str) -> Result<Self, ParameterError> {
        let (limit, window_ms) = parse_limit_and_window(limit, window)?;
        if limit > MAX_LOG_LIMIT {
            return Err(ParameterError::Invalid {
                index: 0,
                expected: format!(
                    "a whole number from 1 to {MAX_LOG_LIMIT}: the sliding log keeps one timestamp per \
                     request, so memory per client grows with the limit"
                ),
            });
        }
        Ok(SlidingLog { limit, window_ms })
    }

    fn check(&self, state: &mut SlidingLogState, now_us: u64, cost: u64) -> LimitDecision {
        let window = self.window_ms * US_PER_MS;
        let log = &mut state.log;
        // A clock that stepped back must not log a request before an older one (the log stays
        // sorted) nor bring expired entries back to life.
        let at_us = log.back().map_or(now_us, |&newest| newest.max(now_us));
        // Durations are from the caller's clock, so retrying after them lands where promised.
        // The budget is entirely back when the newest entry expires (now, if it has).
        let reset_us = log
            .back()
            .map_or(0, |&newest| (newest + window).saturating_sub(now_us));
        let denied = |retry_after_us: u64| LimitDecision {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            retry_after: Duration::from_micros(retry_after_us),
            reset_after: Duration::from_micros(reset_us),
            at_us,
        };
        if cost > self.limit {
            // Never allowed; the honest bound to report is a full reset.
            return denied(reset_us);
        }
        // Oldest first: the request fits once the first `len + cost - limit` entries have
        // expired, and is held back by the last of them until it does.
        let excess = (log.len() as u64 + cost).saturating_sub(self.limit);
        if let Some(&blocker) = excess.checked_sub(1).and_then(|i| log.get(i as usize))
            && at_us < blocker + window
        {
            return denied(blocker + window - now_us);
        }

        while log.front().is_some_and(|&oldest| oldest + window <= at_us) {
            log.pop_front();
        }
        log.extend(iter::repeat_n(at_us, cost as usize));
        LimitDecision {
            allowed: true,
            limit: self.limit,
            remaining: self.limit - log.len() as u64,
            retry_after: Duration::ZERO,
            // A look of cost 0 logs nothing: the budget is back when the newest entry expires.
            reset_after: Duration::from_micros(if cost == 0 {
                reset_us
            } else {
                at_us + window - now_us
            }),
            at_us,
        }
    }

    /// Takes back up to `cost` entries logged at `at_us`, newest first; entries that have
    /// expired since are gone already. So are those that had expired by `at_us` and were
    /// dropped then: a clock that later steps back behind `at_us` does not count them again.
    fn refund(&self, state: &mut SlidingLogState, at_us: u64, cost: u64) {
        let log = &mut state.log;
        let end = log.partition_point(|&t| t <= at_us);
        // No more entries share one time than the debt bound leaves (clamped as the script
        // clamps it).
        let cost = cost.min(DEBT_LIMITS * self.limit);
        let start = log
            .partition_point(|&t| t < at_us)
            .max(end.saturating_sub(cost as usize));
        log.drain(start..end);
    }

    /// Logged past the limit if need be; no more than a window's limit at once (more, all
    /// expiring together, would hold requests back no longer), and the log keeps at most twice
    /// the limit (the debt bound: the oldest entries, which expire first, go), so it stays
    /// bounded however many costs are reported.
    fn charge(&self, state: &mut SlidingLogState, now_us: u64, cost: u64) {
        let window = self.window_ms * US_PER_MS;
        let log = &mut state.log;
        let at_us = log.back().map_or(now_us, |&newest| newest.max(now_us));
        while log.front().is_some_and(|&oldest| oldest + window <= at_us) {
            log.pop_front();
        }
        log.extend(iter::repeat_n(at_us, cost.min(self.limit) as usize));
        let excess = log.len().saturating_sub((DEBT_LIMITS * self.limit) as usize);
        log.drain(..excess);
    }

    /// When the newest entry leaves the window (an empty log is idle already).
    fn idle_at(&self, state: &SlidingLogState) -> u64 {
        state
            .log
            .back()
            .map_or(0, |&newest| newest + self.window_ms * US_PER_MS)
    }
}

impl fmt::Display for SlidingLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests per {} s (exact rolling window)",
            self.limit,
            self.window_ms as f64 / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000;

    /// 3 requests per 10 s.
    fn log3() -> SlidingLog {
        SlidingLog {
            limit: 3,
            window_ms: 10_000,
        }
    }

    #[test]
    fn a_charge_logs_past_the_limit_but_never_more_than_a_window_of_entries() {
        let sl = log3();
        let mut state = SlidingLogState::default();
        sl.charge(&mut state, 100 * SECOND, 1_000_000);
        assert_eq!(state.log.len(), 3, "bounded by the limit");
        let refused = sl.check(&mut state, 105 * SECOND, 1);
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(5),
            "until they expire together"
        );
        assert!(sl.check(&mut state, 110 * SECOND, 1).allowed);
    }

    fn logged(times: &[u64]) -> SlidingLogState {
        SlidingLogState {
            log: times.iter().copied().collect(),
        }
    }

    #[test]
    fn each_request_counts_for_exactly_one_window() {
        let sl = log3();
        let mut state = SlidingLogState::default();
        for (t, expected_remaining) in [(100, 2), (101, 1), (102, 0)] {
            let d = sl.check(&mut state, t * SECOND, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            assert_eq!(d.reset_after, Duration::from_secs(10));
            assert_eq!(d.at_us, t * SECOND);
        }
        let d = sl.check(&mut state, 103 * SECOND, 1);
        assert!(!d.allowed);
        // The entry of 100 s frees a place at 110 s; all are gone at 112 s.
        assert_eq!(d.retry_after, Duration::from_secs(7));
        assert_eq!(d.reset_after, Duration::from_secs(9));
        assert!(!sl.check(&mut state, 110 * SECOND - 1, 1).allowed);
        let d = sl.check(&mut state, 110 * SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(state, logged(&[101 * SECOND, 102 * SECOND, 110 * SECOND]));
        let d = sl.check(&mut state, 110 * SECOND + 1, 1);
        assert_eq!(d.retry_after, Duration::from_micros(SECOND - 1));
    }

    #[test]
    fn a_cost_logs_one_entry_per_unit() {
        let sl = log3();
        let mut state = SlidingLogState::default();
        assert_eq!(sl.check(&mut state, 100 * SECOND, 2).remaining, 1);
        assert_eq!(sl.check(&mut state, 104 * SECOND, 1).remaining, 0);
        // Two places are needed: the second entry of 100 s frees the second one at 110 s.
        let d = sl.check(&mut state, 105 * SECOND, 2);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(5));
        assert_eq!(d.reset_after, Duration::from_secs(9));
        let d = sl.check(&mut state, 110 * SECOND, 2);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(state, logged(&[104 * SECOND, 110 * SECOND, 110 * SECOND]));
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed() {
        let sl = log3();
        let mut state = SlidingLogState::default();
        let d = sl.check(&mut state, 100 * SECOND, 4);
        assert!(!d.allowed);
        assert_eq!((d.retry_after, d.reset_after), (Duration::ZERO, Duration::ZERO));
        let mut state = logged(&[100 * SECOND]);
        let d = sl.check(&mut state, 105 * SECOND, 4);
        assert!(!d.allowed);
        assert_eq!(
            (d.retry_after, d.reset_after),
            (Duration::from_secs(5), Duration::from_secs(5))
        );
        assert_eq!(state, logged(&[100 * SECOND]));
    }

    #[test]
    fn a_clock_that_steps_back_counts_at_the_newest_entry() {
        let sl = log3();
        let mut state = logged(&[100 * SECOND, 105 * SECOND]);
        let d = sl.check(&mut state, 103 * SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.at_us, 105 * SECOND);
        assert_eq!(d.reset_after, Duration::from_secs(12));
        let d = sl.check(&mut state, 103 * SECOND, 1);
        assert!(!d.allowed);
        assert_eq!(d.at_us, 105 * SECOND);
        assert_eq!(d.retry_after, Duration::from_secs(7));
    }

    #[test]
    fn a_denial_does_not_forget_entries_a_stepped_back_clock_still_counts() {
        let sl = SlidingLog {
            limit: 2,
            window_ms: 10_000,
        };
        let mut state = logged(&[100 * SECOND, 104 * SECOND]);
        // At 112 s the entry of 100 s has expired, but two places are needed.
        let d = sl.check(&mut state, 112 * SECOND, 2);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(2));
        assert_eq!(state, logged(&[100 * SECOND, 104 * SECOND]));
        // Back at 108 s, it counts again.
        let d = sl.check(&mut state, 108 * SECOND, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(2));
    }

    #[test]
    fn refunds_take_back_only_what_is_still_logged() {
        let sl = log3();
        let mut state = SlidingLogState::default();
        let first = sl.check(&mut state, 100 * SECOND, 2).at_us;
        let second = sl.check(&mut state, 104 * SECOND, 1).at_us;
        sl.refund(&mut state, first, 1);
        assert_eq!(state, logged(&[100 * SECOND, 104 * SECOND]), "one of two entries");
        sl.refund(&mut state, second, 5);
        assert_eq!(state, logged(&[100 * SECOND]), "never more than was logged");
        // Two requests in one microsecond: refunding one leaves the other.
        let at = sl.check(&mut state, 105 * SECOND, 1).at_us;
        sl.check(&mut state, 105 * SECOND, 1);
        sl.refund(&mut state, at, 1);
        assert_eq!(state, logged(&[100 * SECOND, 105 * SECOND]));
        // Expired and dropped by a later request: nothing left to give back.
        sl.check(&mut state, 111 * SECOND, 1);
        sl.refund(&mut state, first, 2);
        assert_eq!(state, logged(&[105 * SECOND, 111 * SECOND]));
    }

    #[test]
    fn idle_once_the_newest_entry_expires() {
        let sl = log3();
        let state = logged(&[90 * SECOND, 100 * SECOND]);
        assert!(!sl.is_idle(&state, 110 * SECOND - 1));
        assert!(sl.is_idle(&state, 110 * SECOND));
        assert!(sl.is_idle(&SlidingLogState::default(), 0));
    }

    #[test]
    fn parameters_and_display() {
        let sl = SlidingLog::from_parameters("100", "60").unwrap();
        assert_eq!(
            sl,
            SlidingLog {
                limit: 100,
                window_ms: 60_000
            }
        );
        assert_eq!(sl.to_string(), "100 requests per 60 s (exact rolling window)");
        assert!(SlidingLog::from_parameters("10000", "1").is_ok());
        let Err(ParameterError::Invalid { index: 0, expected }) = SlidingLog::from_parameters("10001", "1")
        else {
            panic!("a limit above MAX_LOG_LIMIT must be refused");
        };
        assert!(
            expected.contains("10000") && expected.contains("memory"),
            "{expected}"
        );
    }

    proptest! {
        /// Never more than `limit` in any window-long stretch; remaining never above the limit;
        /// a denial changes nothing; retry_after is exact to the microsecond; a refund right
        /// after an allowed request makes the same request decide the same again.
        #[test]
        fn never_more_than_the_budget(
            limit in 1u64..20,
            window_ms in 1u64..5_000,
            steps in proptest::collection::vec((-2_000_000i64..4_000_000, 1u64..4, any::<bool>()), 1..300),
        ) {
            let sl = SlidingLog { limit, window_ms };
            let window = window_ms * US_PER_MS;
            let mut now = 1_000_000_000_000u64;
            let mut state = SlidingLogState::default();
            // (at_us, cost) of every allowed request not refunded.
            let mut allowed = Vec::<(u64, u64)>::new();
            // A refund forgets what the refunded request dropped (see `refund`), so the
            // budget holds for a clock that steps back no further than the last refund.
            let mut refunded_at = 0;
            for (dt, cost, refund) in steps {
                now = now.saturating_add_signed(dt).max(refunded_at);
                let before = state.clone();
                let d = sl.check(&mut state, now, cost);
                prop_assert!(d.remaining <= limit);
                prop_assert!(state.log.len() as u64 <= limit);
                prop_assert!(state.log.iter().is_sorted());
                if d.allowed {
                    let mut undone = state.clone();
                    sl.refund(&mut undone, d.at_us, cost);
                    prop_assert_eq!(sl.check(&mut undone, now, cost), d);
                    allowed.push((d.at_us, cost));
                    let in_window: u64 =
                        allowed.iter().filter(|(at, _)| at + window > d.at_us).map(|(_, c)| c).sum();
                    prop_assert!(in_window <= limit);
                    if refund {
                        sl.refund(&mut state, d.at_us, cost);
                        allowed.pop();
                        refunded_at = d.at_us;
                    }
                } else {
                    prop_assert_eq!(&state, &before);
                    prop_assert_eq!(d.remaining, 0);
                    if cost <= limit {
                        prop_assert!(d.retry_after > Duration::ZERO);
                        let at = now + d.retry_after.as_micros() as u64;
                        prop_assert!(sl.check(&mut state.clone(), at, cost).allowed);
                        prop_assert!(!sl.check(&mut state.clone(), at - 1, cost).allowed);
                    }
                }
            }
        }
    }
}
