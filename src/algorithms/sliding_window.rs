//! Sliding window counter, as the Go `ratelimiter` service documents it.
//!
//! Time is cut into fixed windows of `window_ms`. A client's count is the requests of the
//! current window plus those of the previous window weighted by how much of it still overlaps
//! the sliding window ending now: `previous * (window - elapsed) / window + current`. Two
//! counters per client, no per-request log.
//!
//! The comparison is done multiplied through by `window`, in whole request-milliseconds, so
//! there is no rounding at all and `scripts/sliding_window.lua` (Lua numbers are doubles,
//! exact below 2^53, which the configuration guarantees) reaches the same answers.
//!
//! On Redis the state is the fixed window's layout: a count per window, a plain integer on the
//! client's key, `:` and the window's index, expiring `2 * window_ms + 1000` ms after its first
//! count (it is the previous count through the window after its own), and `:w` beside them,
//! the newest window a script counted in (the state's `window`). A rule of one sliding window
//! is decided there without a script (`INCRBY` + `PEXPIRE ... NX` + `GET` of the window
//! before, `stores::redis`), by [`SlidingWindow::decide`] on the counts Redis answers;
//! `scripts/sliding_window.lua` (refunds, charges, peeks, limit lists, pinned clocks, a Redis
//! before 7) and `scripts/sliding_window_decide.lua` (the lean batch) are this function on
//! the same keys.

use crate::variables;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use super::{
    Algorithm, Corrupt, DEBT_LIMITS, LeanArguments, LuaScript, Parameter, ParameterError, StateReader, US_PER_MS, parse_count,
    parse_window_ms, put_u64,
};
use crate::algorithms::LimitDecision;

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/sliding_window.lua"))));

/// `LIMIT` x `WINDOW_SIZE` stays below 10^12 request-seconds, so the Lua arithmetic (about
/// twice this, in request-milliseconds) stays exact.
pub(crate) const MAX_REQUEST_MS: u64 = 1_000_000_000_000_000;

/// The `LIMIT`/`WINDOW_SIZE` pair shared by the window algorithms.
pub(crate) const WINDOW_PARAMETERS: [Parameter; 2] = [
    Parameter {
        meaning: "requests per window",
        general: variables::LIMIT,
        auth: variables::AUTH_LIMIT,
    },
    Parameter {
        meaning: "window seconds",
        general: variables::WINDOW_SIZE,
        auth: variables::AUTH_WINDOW_SIZE,
    },
];

/// The members of [`Algorithm`] that every window algorithm (a `limit` per `window_ms`, read
/// from `LIMIT` and `WINDOW_SIZE`) defines alike.
macro_rules! window_parameters {
    () => {
        const PARAMETERS: Option<[$crate::algorithms::Parameter; 2]> =
            Some($crate::algorithms::sliding_window::WINDOW_PARAMETERS);

        fn script_arguments(&self) -> [u64; 2] {
            [self.limit, self.window_ms]
        }

        fn from_script_arguments([limit, window_ms]: [u64; 2]) -> Self {
            Self { limit, window_ms }
        }

        fn limit(&self) -> u64 {
            self.limit
        }

        fn window(&self) -> std::time::Duration {
            std::time::Duration::from_millis(self.window_ms)
        }
    };
}
pub(crate) use window_parameters;

/// Parse `LIMIT` and `WINDOW_SIZE` (requests, seconds) into (requests, milliseconds).
pub(crate) fn parse_limit_and_window(limit: &str, window: &str) -> Result<(u64, u64), ParameterError> {
    let limit = parse_count(limit, 0)?;
    let window_ms = parse_window_ms(window, 1)?;
    if limit.saturating_mul(window_ms) >= MAX_REQUEST_MS {
        return Err(ParameterError::Combination(format!(
            "{limit} requests per {} s is too large: requests x window seconds must stay below 10^12",
            window_ms as f64 / 1e3
        )));
    }
    Ok((limit, window_ms))
}

/// 2^53: Lua's doubles hold every integer below it exactly.
pub(super) const LUA_EXACT: u64 = 1 << 53;

/// Parameters of one sliding window rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Requests allowed in any window-long stretch of time.
    pub limit: u64,
    /// Window length in milliseconds; windows are aligned to multiples of it.
    pub window_ms: u64,
}

/// What is remembered of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowState {
    /// Index of the window `current` counts (`now_ms / window_ms`).
    pub window: u64,
    /// Requests counted in window `window - 1`.
    pub previous: u64,
    /// Requests counted in window `window`.
    pub current: u64,
}

impl SlidingWindow {
    /// One decision at `now_us`; returns the state to store, `None` when denied (a denial
    /// counts nothing).
    pub fn decide(
        &self,
        state: Option<WindowState>,
        now_us: u64,
        cost: u64,
    ) -> (LimitDecision, Option<WindowState>) {
        let w = self.window_ms;
        // A clock that stepped back (or a request that read the clock just before another)
        // must not erase newer counts: never place `now` before the stored window.
        let now_ms = match state {
            Some(s) => (now_us / 1_000).max(s.window * w),
            None => now_us / 1_000,
        };
        let window = now_ms / w;
        let start = window * w;
        let elapsed = now_ms - start;
        let (previous, current) = match state {
            Some(s) if s.window == window => (s.previous, s.current),
            Some(s) if s.window + 1 == window => (s.current, 0),
            _ => (0, 0),
        };
        let budget = self.limit * w;
        // Counts are at most twice the limit (the debt bound) and the cost at most the limit
        // by the time anything is multiplied; saturating all the same.
        let previous_weight = previous.saturating_mul(w - elapsed);
        let after_ms = |at_ms: u64| Duration::from_micros((at_ms * 1_000).saturating_sub(now_us));

        if cost <= self.limit && previous_weight.saturating_add((current + cost).saturating_mul(w)) <= budget
        {
            let current = current + cost;
            let decision = LimitDecision {
                allowed: true,
                limit: self.limit,
                remaining: (budget - previous_weight - current * w) / w,
                retry_after: Duration::ZERO,
                // `current` leaves the sliding window when the next window ends, `previous`
                // when this one does; with neither, the budget is whole already.
                reset_after: if current > 0 {
                    after_ms(start + 2 * w)
                } else if previous > 0 {
                    after_ms(start + w)
                } else {
                    Duration::ZERO
                },
                at_us: now_us.max(now_ms * US_PER_MS),
            };
            let state = WindowState {
                window,
                previous,
                current,
            };
            return (decision, Some(state));
        }

        let reset_at = if current > 0 { start + 2 * w } else { start + w };
        let allowed_at = if cost > self.limit {
            // Never allowed, whatever it is (nothing is multiplied by it); the honest bound to
            // report is a full reset.
            reset_at
        } else if current.saturating_add(cost) <= self.limit {
            // Only the previous window's weight is in the way (so `previous > 0`): wait until
            // it has shrunk enough within this window.
            start + w - (self.limit - current - cost) * w / previous
        } else {
            // Wait for the next window, where `current` becomes the weighted previous count.
            start + 2 * w - (self.limit - cost) * w / current
        };
        let decision = LimitDecision {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            retry_after: after_ms(allowed_at),
            reset_after: after_ms(reset_at),
            at_us: now_us.max(now_ms * US_PER_MS),
        };
        (decision, None)
    }
}

impl Algorithm for SlidingWindow {
    type State = WindowState;

    const NAME: &'static str = "sliding_window";
    window_parameters!();

    const KEY_SUFFIX: &'static str = "sw";
    // The weighted previous count shrinks linearly through the window: the instant it leaves
    // room for `cost` is solved for exactly, in whole request-milliseconds.
    const EXACT_RETRY: bool = true;
    const FILE_TAG: u8 = 2;
    const EXAMPLES: &'static [SlidingWindow] = &[
        SlidingWindow {
            limit: 5,
            window_ms: 1_000,
        },
        SlidingWindow {
            limit: 999_999_999,
            window_ms: 999_999,
        },
    ];

    fn script() -> &'static LuaScript {
        &SCRIPT
    }

    const LEAN: Option<&'static str> = Some(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/sliding_window_decide.lua"
    )));

    /// The window (ms), the limit and the cost, decided as at most the limit + 1 (any cost
    /// above the limit is refused alike).
    fn lean_arguments(&self, cost: u64) -> LeanArguments {
        LeanArguments::new(&[self.window_ms, self.limit, cost.min(self.limit + 1)])
    }

    /// The reply's state is the window the script placed now in and its counts, previous and
    /// current (none: a client never seen): [`SlidingWindow::decide`] on it.
    fn lean_decision(&self, now_us: u64, state: &[u64], cost: u64) -> Option<LimitDecision> {
        let state = match *state {
            [] => None,
            // Beyond what Lua's doubles hold exactly, no script wrote it.
            [window, previous, current]
                if window.saturating_mul(self.window_ms) < LUA_EXACT && previous.max(current) < LUA_EXACT =>
            {
                Some(WindowState {
                window,
                    previous,
                    current,
                })
            }
            _ => return None,
        };
        Some(self.decide(state, now_us, cost).0)
    }

    /// The window, then the previous and current counts.
    fn save_state(&self, state: &WindowState, out: &mut Vec<u8>) -> bool {
        put_u64(out, state.window);
        put_u64(out, state.previous);
        put_u64(out, state.current);
        true
    }

    fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<WindowState, Corrupt> {
        let (window, previous, current) = (input.u64()?, input.u64()?, input.u64()?);
        let most = DEBT_LIMITS.saturating_mul(self.limit);
        if previous > most || current > most || window.saturating_mul(self.window_ms * US_PER_MS) > saved_at {
            return Err("a sliding window over its bounded debt or not begun");
        }
        Ok(WindowState {
            window,
            previous,
            current,
        })
    }

    fn from_parameters(limit: &str, window: &str) -> Result<Self, ParameterError> {
        let (limit, window_ms) = parse_limit_and_window(limit, window)?;
        Ok(SlidingWindow { limit, window_ms })
    }

    fn check(&self, state: &mut WindowState, now_us: u64, cost: u64) -> LimitDecision {
        let (decision, next) = self.decide(Some(*state), now_us, cost);
        if let Some(next) = next {
            *state = next;
        }
        decision
    }

    /// The request was counted in the window holding `at_us`: take it back from that window,
    /// which is now either the current or the previous one (older counts are forgotten).
    fn refund(&self, state: &mut WindowState, at_us: u64, cost: u64) {
        let window = at_us / US_PER_MS / self.window_ms;
        if state.window == window {
            state.current = state.current.saturating_sub(cost);
        } else if state.window == window + 1 {
            state.previous = state.previous.saturating_sub(cost);
        }
    }

    /// Counted in the current window, past the limit if need be, up to twice the limit (the
    /// debt bound): its weight holds requests back until it has slid out, within a window and
    /// a half of the one it was counted in.
    fn charge(&self, state: &mut WindowState, now_us: u64, cost: u64) {
        let w = self.window_ms;
        let now_ms = (now_us / US_PER_MS).max(state.window * w);
        let window = now_ms / w;
        let (previous, current) = if state.window == window {
            (state.previous, state.current)
        } else if state.window + 1 == window {
            (state.current, 0)
        } else {
            (0, 0)
        };
        *state = WindowState {
            window,
            previous,
            current: current.saturating_add(cost).min(DEBT_LIMITS * self.limit),
        };
    }

    /// Two windows after the stored one, nothing it counted weighs any more.
    fn idle_at(&self, state: &WindowState) -> u64 {
        if state.previous == 0 && state.current == 0 {
            0
        } else {
            (state.window + 2) * self.window_ms * US_PER_MS
        }
    }
}

impl fmt::Display for SlidingWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests per {} s", self.limit, self.window_ms as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000;

    /// 10 requests per 60 s.
    fn window() -> SlidingWindow {
        SlidingWindow {
            limit: 10,
            window_ms: 60_000,
        }
    }

    fn run(sw: &SlidingWindow, state: &mut Option<WindowState>, now_ms: u64, n: usize) -> Vec<LimitDecision> {
        (0..n)
            .map(|_| {
                let (d, next) = sw.decide(*state, now_ms * MS, 1);
                if next.is_some() {
                    *state = next;
                }
                d
            })
            .collect()
    }

    #[test]
    fn the_limit_holds_within_one_window() {
        let sw = window();
        let mut state = None;
        let t = 600_000; // start of window 10
        let decisions = run(&sw, &mut state, t, 11);
        let remaining: Vec<u64> = decisions[..10].iter().map(|d| d.remaining).collect();
        assert_eq!(remaining, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let denied = &decisions[10];
        assert!(!denied.allowed);
        // The next window starts at 660 s, where the 10 requests weigh 10 * (60 - e) / 60;
        // one more fits once e >= 6 s, so at 666 s.
        assert_eq!(denied.retry_after, Duration::from_secs(66));
        assert_eq!(denied.reset_after, Duration::from_secs(120));
    }

    #[test]
    fn the_previous_window_is_weighted_by_its_overlap() {
        let sw = window();
        let mut state = None;
        run(&sw, &mut state, 600_000, 10);
        // 15 s into the next window: previous weighs 10 * 45/60 = 7.5, so 2 more fit (9.5).
        let decisions = run(&sw, &mut state, 675_000, 3);
        assert!(decisions[0].allowed && decisions[1].allowed);
        assert_eq!(decisions[1].remaining, 0);
        assert!(!decisions[2].allowed);
        // A third fits when 10 * (60 - e) / 60 + 3 <= 10, so at e = 18 s.
        assert_eq!(decisions[2].retry_after, Duration::from_secs(3));
        // Two windows later, everything is forgotten.
        let decisions = run(&sw, &mut state, 780_000, 1);
        assert_eq!(decisions[0].remaining, 9);
    }

    #[test]
    fn retry_after_is_exact_to_the_microsecond() {
        let sw = SlidingWindow {
            limit: 1,
            window_ms: 1_000,
        };
        let (_, state) = sw.decide(None, 5_000_250, 1);
        let (d, _) = sw.decide(state, 5_000_750, 1);
        // Next window starts at 6 s; the previous single request weighs 1 * (1000 - e)/1000,
        // which leaves room for one more only at e = 1000 ms, i.e. at 7 s.
        assert_eq!(d.retry_after, Duration::from_micros(7_000_000 - 5_000_750));
    }

    #[test]
    fn a_clock_behind_the_stored_window_keeps_its_counts() {
        let sw = SlidingWindow {
            limit: 2,
            window_ms: 1_000,
        };
        let (_, state) = sw.decide(None, 5_000_000, 1);
        let (_, state) = sw.decide(state, 5_000_100, 1);
        // 1 ms earlier, in the previous window: still the same two requests, so denied.
        let (d, _) = sw.decide(state, 4_999_000, 1);
        assert!(!d.allowed);
    }

    #[test]
    fn idle_after_two_windows() {
        let sw = window();
        let state = WindowState {
            window: 10,
            previous: 3,
            current: 4,
        };
        assert!(!sw.is_idle(&state, 719_999_999));
        assert!(sw.is_idle(&state, 720_000_000));
    }

    proptest! {
        /// In any window-long stretch ending at a request, at most `limit` requests (counting
        /// whole windows: the sliding count is an estimate, but it never lets a fixed window
        /// hold more than `limit`, nor two adjacent ones more than `2 * limit`).
        #[test]
        fn never_more_than_the_budget(
            limit in 1u64..30,
            window_ms in 1u64..10_000,
            steps in proptest::collection::vec((0u64..2_000_000, 1u64..3), 1..300),
        ) {
            let sw = SlidingWindow { limit, window_ms };
            let mut now = 1_000_000_000u64;
            let mut state = None;
            let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
            for (dt, cost) in steps {
                now += dt;
                let (d, next) = sw.decide(state, now, cost);
                prop_assert!(d.remaining <= limit);
                if d.allowed {
                    *per_window.entry(now / 1_000 / window_ms).or_default() += cost;
                    state = next;
                } else {
                    prop_assert_eq!(next, None);
                    prop_assert_eq!(d.remaining, 0);
                    prop_assert!(d.retry_after > Duration::ZERO);
                    // Retrying exactly when told succeeds, one microsecond earlier does not.
                    if cost <= limit {
                        let at = now + d.retry_after.as_micros() as u64;
                        prop_assert!(sw.decide(state, at, cost).0.allowed);
                        prop_assert!(!sw.decide(state, at - 1, cost).0.allowed);
                    }
                }
            }
            for (w, n) in &per_window {
                prop_assert!(*n <= limit);
                if let Some(next) = per_window.get(&(w + 1)) {
                    prop_assert!(n + next <= 2 * limit);
                }
            }
        }
    }
}
