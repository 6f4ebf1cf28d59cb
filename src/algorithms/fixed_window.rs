//! Fixed window counter: at most `limit` requests in each window of `window_ms`.
//!
//! Windows are aligned to the Unix epoch (window `n` is `[n * window, (n + 1) * window)`), so
//! every replica and both stores cut time at the same instants. A client is two numbers, the
//! window it was last counted in and its count there; a count from an older window is simply
//! ignored. The cheapest algorithm, at the price of letting a client spend up to twice the
//! limit across a window boundary; the sliding window and sliding log exist to close that gap.
//!
//! On Redis a client's count is a plain integer on a key per window (the client's key, `:` and
//! the window's index), expiring `window_ms + 1000` ms after its first count: what a decision
//! without a script (`INCRBY` + `PEXPIRE ... NX`, `stores::redis`) reads and writes.
//! `scripts/fixed_window.lua` is the same function as this one, line for line, on that layout
//! (with `:w` beside it, the newest window counted: the state's `window`), for refunds,
//! charges, limit lists, pinned clocks and a Redis before 7. Expiries are relative (`PX`),
//! never absolute: an absolute expiry is read on the Redis server's own clock, which deletes
//! the key at once when tests pin `now` in the past.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use super::sliding_window::{LUA_EXACT, parse_limit_and_window, window_parameters};
use super::{Algorithm, Corrupt, DEBT_LIMITS, LeanArguments, LuaScript, ParameterError, StateReader, US_PER_MS, put_u64};
use crate::algorithms::LimitDecision;

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fixed_window.lua"))));

/// Parameters of one fixed window rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    /// Requests allowed in each window.
    pub limit: u64,
    /// Window length in milliseconds; windows start at multiples of it since the epoch.
    pub window_ms: u64,
}

/// What is remembered of one client: a count is only meaningful in its own window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Index of the window `count` belongs to (`now_ms / window_ms`).
    pub window: u64,
    /// Requests counted in that window.
    pub count: u64,
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    const NAME: &'static str = "fixed_window";
    window_parameters!();

    const KEY_SUFFIX: &'static str = "fw";
    // The count starts over at the window's end, an instant on the epoch's grid.
    const EXACT_RETRY: bool = true;
    const FILE_TAG: u8 = 3;
    const EXAMPLES: &'static [FixedWindow] = &[
        FixedWindow {
            limit: 5,
            window_ms: 1_000,
        },
        FixedWindow {
            limit: (1 << 50) - 1,
            window_ms: 1,
        },
    ];

    fn script() -> &'static LuaScript {
        &SCRIPT
    }

    const LEAN: Option<&'static str> = Some(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/fixed_window_decide.lua"
    )));

    /// The window (ms), the limit and the cost, decided as at most the limit + 1 (any cost
    /// above the limit is refused alike).
    fn lean_arguments(&self, cost: u64) -> LeanArguments {
        LeanArguments::new(&[self.window_ms, self.limit, cost.min(self.limit.saturating_add(1))])
    }

    /// The reply's state is the window the script placed now in and its count (none: a client
    /// never seen): [`check`](Algorithm::check) on it.
    fn lean_decision(&self, now_us: u64, state: &[u64], cost: u64) -> Option<LimitDecision> {
        let mut state = match *state {
            [] => FixedWindowState::default(),
            // Beyond what Lua's doubles hold exactly, no script wrote it.
            [window, count] if window.saturating_mul(self.window_ms) < LUA_EXACT && count < LUA_EXACT => {
                FixedWindowState { window, count }
            }
            _ => return None,
        };
        Some(self.check(&mut state, now_us, cost))
    }

    /// The window, then its count.
    fn save_state(&self, state: &FixedWindowState, out: &mut Vec<u8>) -> bool {
        put_u64(out, state.window);
        put_u64(out, state.count);
        true
    }

    fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<FixedWindowState, Corrupt> {
        let (window, count) = (input.u64()?, input.u64()?);
        if count > DEBT_LIMITS.saturating_mul(self.limit) || window.saturating_mul(self.window_ms * US_PER_MS) > saved_at {
            return Err("a fixed window over its bounded debt or not begun");
        }
        Ok(FixedWindowState { window, count })
    }

    fn from_parameters(limit: &str, window: &str) -> Result<Self, ParameterError> {
        let (limit, window_ms) = parse_limit_and_window(limit, window)?;
        Ok(FixedWindow { limit, window_ms })
    }

    fn check(&self, state: &mut FixedWindowState, now_us: u64, cost: u64) -> LimitDecision {
        let w = self.window_ms;
        // A clock that stepped back (or a request that read the clock just before another)
        // must not erase newer counts: never place `now` before the stored window.
        let now_ms = (now_us / US_PER_MS).max(state.window * w);
        let window = now_ms / w;
        let count = if state.window == window { state.count } else { 0 };
        // Durations are from the caller's clock, so retrying after them lands where promised.
        let until_end = Duration::from_micros((window + 1) * w * US_PER_MS - now_us);
        let at_us = now_us.max(now_ms * US_PER_MS);

        // Saturating: a cost above the limit, whatever it is, is refused.
        if count.saturating_add(cost) <= self.limit {
            let count = count + cost;
            // A look of cost 0 changes nothing (Redis writes nothing for it either).
            if cost > 0 {
                *state = FixedWindowState { window, count };
            }
            return LimitDecision {
                allowed: true,
                limit: self.limit,
                remaining: self.limit - count,
                retry_after: Duration::ZERO,
                // Nothing counted (a look of cost 0 at a whole budget): nothing to wait for.
                reset_after: if count == 0 {
                    Duration::ZERO
                } else {
                    until_end
                },
                at_us,
            };
        }
        // Denied, counting nothing. The count starts over when the window ends, which is when
        // the request fits (or, costing more than the limit, the honest bound to report).
        LimitDecision {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            retry_after: until_end,
            reset_after: until_end,
            at_us,
        }
    }

    /// Only the window the request was counted in can give it back; once that window is over,
    /// its count no longer matters.
    fn refund(&self, state: &mut FixedWindowState, at_us: u64, cost: u64) {
        if state.window == at_us / US_PER_MS / self.window_ms {
            state.count = state.count.saturating_sub(cost);
        }
    }

    /// Counted in the current window, past the limit if need be, up to twice the limit (the
    /// debt bound): the window's end forgives the debt, as it starts every count afresh.
    fn charge(&self, state: &mut FixedWindowState, now_us: u64, cost: u64) {
        let now_ms = (now_us / US_PER_MS).max(state.window * self.window_ms);
        let window = now_ms / self.window_ms;
        let count = if state.window == window { state.count } else { 0 };
        *state = FixedWindowState {
            window,
            count: count.saturating_add(cost).min(DEBT_LIMITS * self.limit),
        };
    }

    /// Once its window is over, a state decides like no state at all.
    fn idle_at(&self, state: &FixedWindowState) -> u64 {
        (state.window + 1) * self.window_ms * US_PER_MS
    }
}

impl fmt::Display for FixedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests per {} s", self.limit, self.window_ms as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000;
    const SECOND: u64 = 1_000_000;

    /// 3 requests per 10 s.
    fn window() -> FixedWindow {
        FixedWindow {
            limit: 3,
            window_ms: 10_000,
        }
    }

    #[test]
    fn a_charge_past_the_limit_refuses_until_the_window_ends() {
        let fw = window();
        let mut state = FixedWindowState::default();
        fw.charge(&mut state, 101 * SECOND, 7);
        assert_eq!(state.count, 6, "at most twice the limit: one limit of debt");
        let refused = fw.check(&mut state, 102 * SECOND, 1);
        assert_eq!(refused.retry_after, Duration::from_secs(8));
        assert!(
            fw.check(&mut state, 110 * SECOND, 1).allowed,
            "the window's end forgives it"
        );
    }

    fn remaining(fw: &FixedWindow, state: &mut FixedWindowState, now_us: u64, n: usize) -> Vec<Option<u64>> {
        (0..n)
            .map(|_| {
                let d = fw.check(state, now_us, 1);
                d.allowed.then_some(d.remaining)
            })
            .collect()
    }

    #[test]
    fn the_limit_holds_until_the_window_ends() {
        let fw = window();
        let mut state = FixedWindowState::default();
        // 2.5 s into window 10 (100 s to 110 s).
        let now = 102_500 * MS;
        assert_eq!(
            remaining(&fw, &mut state, now, 4),
            [Some(2), Some(1), Some(0), None]
        );
        let d = fw.check(&mut state, now, 1);
        assert_eq!(d.retry_after, Duration::from_micros(7_500 * MS));
        assert_eq!(d.reset_after, Duration::from_micros(7_500 * MS));
        assert_eq!(d.at_us, now);
        assert_eq!(state, FixedWindowState { window: 10, count: 3 });
        // 1 µs before the boundary: still denied; at it: a whole new budget.
        assert!(!fw.check(&mut state, 110 * SECOND - 1, 1).allowed);
        let d = fw.check(&mut state, 110 * SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
        assert_eq!(d.reset_after, Duration::from_secs(10));
        let d = fw.check(&mut state, 110 * SECOND + 1, 1);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.reset_after, Duration::from_micros(10 * SECOND - 1));
    }

    #[test]
    fn an_allowed_request_reports_the_window_end() {
        let d = window().check(&mut FixedWindowState::default(), 109_999_999, 1);
        assert!(d.allowed);
        assert_eq!(d.reset_after, Duration::from_micros(1));
    }

    #[test]
    fn a_cost_counts_as_that_many_requests() {
        let fw = window();
        let mut state = FixedWindowState::default();
        let d = fw.check(&mut state, 100 * SECOND, 2);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        let d = fw.check(&mut state, 101 * SECOND, 2);
        assert!(!d.allowed, "2 + 2 > 3");
        assert_eq!(d.retry_after, Duration::from_secs(9));
        assert_eq!(state.count, 2, "a denial counts nothing");
        assert!(fw.check(&mut state, 101 * SECOND, 1).allowed);
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed() {
        let fw = window();
        let mut state = FixedWindowState::default();
        let d = fw.check(&mut state, 104 * SECOND, 4);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(6));
        assert_eq!(d.reset_after, Duration::from_secs(6));
        assert_eq!(state, FixedWindowState::default());
    }

    #[test]
    fn a_clock_behind_the_stored_window_keeps_its_counts() {
        let fw = window();
        let mut state = FixedWindowState::default();
        fw.check(&mut state, 110 * SECOND, 3);
        // 1 ms earlier, in window 10: counted in window 11 all the same, so denied.
        let d = fw.check(&mut state, 110 * SECOND - MS, 1);
        assert!(!d.allowed);
        assert_eq!(d.at_us, 110 * SECOND);
        assert_eq!(d.retry_after, Duration::from_micros(10 * SECOND + MS));
        // An allowed request from behind is counted at the stored window's start.
        let mut state = FixedWindowState { window: 11, count: 1 };
        let d = fw.check(&mut state, 105 * SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.at_us, 110 * SECOND);
        assert_eq!(d.reset_after, Duration::from_secs(15));
        assert_eq!(state, FixedWindowState { window: 11, count: 2 });
    }

    #[test]
    fn refunds_reach_only_the_window_still_counting() {
        let fw = window();
        let mut state = FixedWindowState::default();
        let at = fw.check(&mut state, 105 * SECOND, 2).at_us;
        fw.refund(&mut state, at, 1);
        assert_eq!(state.count, 1, "same window");
        fw.refund(&mut state, at, 5);
        assert_eq!(state.count, 0, "never below zero");
        // A request of the previous window: its count is already forgotten.
        let at = fw.check(&mut state, 109 * SECOND, 1).at_us;
        fw.check(&mut state, 110 * SECOND, 2);
        fw.refund(&mut state, at, 1);
        assert_eq!(state, FixedWindowState { window: 11, count: 2 });
        // Counted from behind, at the stored window's start: its refund finds that window.
        let at = fw.check(&mut state, 108 * SECOND, 1).at_us;
        fw.refund(&mut state, at, 1);
        assert_eq!(state, FixedWindowState { window: 11, count: 2 });
    }

    #[test]
    fn idle_once_the_window_is_over() {
        let fw = window();
        let state = FixedWindowState { window: 10, count: 3 };
        assert!(!fw.is_idle(&state, 110 * SECOND - 1));
        assert!(fw.is_idle(&state, 110 * SECOND));
        assert!(fw.is_idle(&FixedWindowState::default(), 10 * SECOND));
    }

    #[test]
    fn parameters_and_display() {
        let fw = FixedWindow::from_parameters("100", "60").unwrap();
        assert_eq!(
            fw,
            FixedWindow {
                limit: 100,
                window_ms: 60_000
            }
        );
        assert_eq!(fw.to_string(), "100 requests per 60 s");
        assert_eq!(
            FixedWindow::from_parameters("5", "0.25").unwrap().to_string(),
            "5 requests per 0.25 s"
        );
        assert!(FixedWindow::from_parameters("0", "60").is_err());
    }

    proptest! {
        /// Never more than `limit` per aligned window; remaining never above the limit; a
        /// denial changes nothing; retry_after is exact to the microsecond; a refund right
        /// after an allowed request makes the same request decide the same again.
        #[test]
        fn never_more_than_the_budget(
            limit in 1u64..20,
            window_ms in 1u64..5_000,
            steps in proptest::collection::vec((-2_000_000i64..4_000_000, 1u64..4, any::<bool>()), 1..300),
        ) {
            let fw = FixedWindow { limit, window_ms };
            let mut now = 1_000_000_000_000u64;
            let mut state = FixedWindowState::default();
            let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
            for (dt, cost, refund) in steps {
                now = now.saturating_add_signed(dt);
                let before = state;
                let d = fw.check(&mut state, now, cost);
                prop_assert!(d.remaining <= limit);
                if d.allowed {
                    let mut undone = state;
                    fw.refund(&mut undone, d.at_us, cost);
                    prop_assert_eq!(fw.check(&mut undone, now, cost), d);
                    let counted = per_window.entry(d.at_us / MS / window_ms).or_default();
                    *counted += cost;
                    prop_assert!(*counted <= limit);
                    if refund {
                        fw.refund(&mut state, d.at_us, cost);
                        *counted -= cost;
                    }
                } else {
                    prop_assert_eq!(state, before);
                    prop_assert_eq!(d.remaining, 0);
                    prop_assert!(d.retry_after > Duration::ZERO);
                    if cost <= limit {
                        let at = now + d.retry_after.as_micros() as u64;
                        prop_assert!(fw.check(&mut state.clone(), at, cost).allowed);
                        prop_assert!(!fw.check(&mut state.clone(), at - 1, cost).allowed);
                    }
                }
            }
        }
    }
}
