//! Token bucket, computed as GCRA (the generic cell rate algorithm).
//!
//! A bucket of `capacity` tokens refilled at one token per `interval` is fully described by
//! one number: the *theoretical arrival time* (TAT), the instant at which the bucket will be
//! full again. Tokens available at `now` are `(capacity * interval - (tat - now)) / interval`.
//! Storing the TAT instead of (tokens, last refill) keeps the state to one integer, keeps the
//! arithmetic in integers (so Lua's doubles and Rust's `u64` agree bit for bit) and makes
//! "fully refilled" a single comparison: `tat <= now`.
//!
//! `scripts/token_bucket.lua` is the same function, line for line. `ALGORITHM=gcra` names the
//! same algorithm.

use crate::variables;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use super::{
    Algorithm, Corrupt, DEBT_LIMITS, EXACT_LIMIT, LeanArguments, LuaScript, Parameter, ParameterError, StateReader, parse_count,
    put_u64,
};
use crate::algorithms::LimitDecision;

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/token_bucket.lua"))));

/// Parameters of one token bucket rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    /// Most tokens the bucket holds: the burst a fresh client may send at once.
    pub capacity: u64,
    /// Microseconds to refill one token (`1e6 / refill_rate`, rounded, at least 1).
    pub interval_us: u64,
}

impl TokenBucket {
    /// One decision. `tat` is the stored theoretical arrival time (`None` for a client seen
    /// for the first time, which starts with a full bucket); returns the decision and the TAT
    /// to store, which is `None` when the request is denied: a denial consumes nothing.
    pub fn decide(&self, tat: Option<u64>, now_us: u64, cost: u64) -> (LimitDecision, Option<u64>) {
        let tau = self.capacity * self.interval_us;
        let tat = tat.map_or(now_us, |tat| tat.clamp(now_us, self.debt_bound(now_us)));
        // A cost above the capacity is never allowed, whatever it is: it is decided as the
        // capacity + 1 (so nothing larger is ever multiplied), whose retry time is when a
        // bucket one token larger would hold it, the same answer it always had.
        let cost = cost.min(self.capacity + 1);
        // At most now + 3τ + one interval: no sum here comes near a u64's end.
        let new_tat = tat + cost * self.interval_us;
        if new_tat - now_us > tau {
            let decision = LimitDecision {
                allowed: false,
                limit: self.capacity,
                remaining: 0,
                retry_after: Duration::from_micros(new_tat - tau - now_us),
                reset_after: Duration::from_micros(tat - now_us),
                at_us: now_us,
            };
            return (decision, None);
        }
        let decision = LimitDecision {
            allowed: true,
            limit: self.capacity,
            remaining: (tau - (new_tat - now_us)) / self.interval_us,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_micros(new_tat - now_us),
            at_us: now_us,
        };
        (decision, Some(new_tat))
    }

    /// The latest TAT a state may hold at `now_us`: the bucket empty and one capacity owed
    /// ([`DEBT_LIMITS`] capacities spent). A charge leaves no more; a TAT beyond it (a Redis key
    /// written before the bound, or a clock stepped back) counts as it.
    fn debt_bound(&self, now_us: u64) -> u64 {
        now_us.saturating_add(DEBT_LIMITS * self.capacity * self.interval_us)
    }
}

/// The state is the TAT; 0 (long past) is a full bucket, the same as no state.
impl Algorithm for TokenBucket {
    type State = u64;

    const NAME: &'static str = "token_bucket";
    const ALIASES: &'static [&'static str] = &["gcra"];
    const PARAMETERS: Option<[Parameter; 2]> = Some([
        Parameter {
            meaning: "capacity",
            general: variables::MAX_TOKENS,
            auth: variables::AUTH_MAX_TOKENS,
        },
        Parameter {
            meaning: "tokens per second",
            general: variables::REFILL_RATE,
            auth: variables::AUTH_REFILL_RATE,
        },
    ]);
    const KEY_SUFFIX: &'static str = "tb";
    // GCRA: the request fits once the theoretical arrival time has come within the tolerance,
    // `new_tat - tau`, an integer of microseconds.
    const EXACT_RETRY: bool = true;
    const FILE_TAG: u8 = 1;
    const EXAMPLES: &'static [TokenBucket] = &[
        TokenBucket {
            capacity: 3,
            interval_us: 1_000_000,
        },
        // capacity x interval just below 2^50, the configuration's bound.
        TokenBucket {
            capacity: (1 << 25) - 1,
            interval_us: 1 << 25,
        },
    ];

    fn script() -> &'static LuaScript {
        &SCRIPT
    }

    const LEAN: Option<&'static str> = Some(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/token_bucket_decide.lua"
    )));

    /// τ (capacity x interval), the interval, and the cost decided as at most the capacity + 1
    /// (as [`TokenBucket::decide`] does); the increment, the cost times the interval, is below
    /// 2^51.
    fn lean_arguments(&self, cost: u64) -> LeanArguments {
        LeanArguments::new(&[
            self.capacity * self.interval_us,
            self.interval_us,
            cost.min(self.capacity + 1),
        ])
    }

    /// The reply's state is the TAT the script started from: [`TokenBucket::decide`] on it.
    fn lean_decision(&self, now_us: u64, state: &[u64], cost: u64) -> Option<LimitDecision> {
        match *state {
            [tat] => Some(self.decide(Some(tat), now_us, cost).0),
            _ => None,
        }
    }

    fn from_parameters(capacity: &str, rate: &str) -> Result<Self, ParameterError> {
        let capacity = parse_count(capacity, 0)?;
        let per_second = rate
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n > 0.0 && *n <= 1e6)
            .ok_or_else(|| ParameterError::Invalid {
                index: 1,
                expected: "tokens per second: a number above 0 and at most 1000000, fractions allowed \
                           (0.01 is one token every 100 s)"
                    .into(),
            })?;
        // At most 1e6 per second, so at least one microsecond per token.
        let interval_us = (1e6 / per_second).round() as u64;
        if interval_us >= EXACT_LIMIT || capacity.saturating_mul(interval_us) >= EXACT_LIMIT {
            return Err(ParameterError::Combination(format!(
                "a capacity of {capacity} at {per_second} tokens per second takes longer than 35 years \
                 to refill; raise the rate or lower the capacity"
            )));
        }
        Ok(TokenBucket {
            capacity,
            interval_us,
        })
    }

    fn script_arguments(&self) -> [u64; 2] {
        [self.capacity, self.interval_us]
    }

    fn from_script_arguments([capacity, interval_us]: [u64; 2]) -> Self {
        TokenBucket {
            capacity,
            interval_us,
        }
    }

    /// The TAT.
    fn save_state(&self, tat: &u64, out: &mut Vec<u8>) -> bool {
        put_u64(out, *tat);
        true
    }

    fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<u64, Corrupt> {
        let tat = input.u64()?;
        // A TAT is at most one full bucket ahead of the last decision, or its bounded debt
        // ahead after a charge (a cost the backend reported).
        let debt = DEBT_LIMITS
            .saturating_mul(self.capacity)
            .saturating_mul(self.interval_us);
        if tat > saved_at.saturating_add(debt) {
            return Err("a token bucket owing more than its bounded debt");
        }
        Ok(tat)
    }

    fn limit(&self) -> u64 {
        self.capacity
    }

    fn window(&self) -> Duration {
        Duration::from_micros(self.capacity * self.interval_us)
    }

    fn check(&self, tat: &mut u64, now_us: u64, cost: u64) -> LimitDecision {
        // Tidied: a TAT past the debt bound decides as the bound, and is kept so, so it ages.
        *tat = (*tat).min(self.debt_bound(now_us));
        let (decision, next) = self.decide(Some(*tat), now_us, cost);
        if let Some(next) = next {
            *tat = next;
        }
        decision
    }

    /// Moving the TAT back by the cost undoes the request whenever it was made; a bucket that
    /// is full already stays full. More than the debt bound's worth gives back no more (the
    /// TAT is never further ahead than that), so the cost is clamped before it is multiplied.
    fn refund(&self, tat: &mut u64, _at_us: u64, cost: u64) {
        *tat = tat.saturating_sub(cost.min(DEBT_LIMITS * self.capacity) * self.interval_us);
    }

    /// The TAT moves on by the cost from now or where it is, past `now + τ` if need be, but
    /// never past the debt bound (`now + 2τ`): at most one capacity of debt, paid back within
    /// two refills of the bucket.
    fn charge(&self, tat: &mut u64, now_us: u64, cost: u64) {
        let cost = cost.min(DEBT_LIMITS * self.capacity);
        *tat = (*tat)
            .max(now_us)
            .saturating_add(cost * self.interval_us)
            .min(self.debt_bound(now_us));
    }

    /// The TAT itself: the bucket is full from then on.
    fn idle_at(&self, tat: &u64) -> u64 {
        *tat
    }
}

impl fmt::Display for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens, refill {}/s (one token every {} ms)",
            self.capacity,
            1e6 / self.interval_us as f64,
            self.interval_us as f64 / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000;

    /// capacity 3, one token per second.
    fn bucket() -> TokenBucket {
        TokenBucket {
            capacity: 3,
            interval_us: SECOND,
        }
    }

    #[test]
    fn a_charge_past_the_capacity_is_a_debt_refilled_before_anything_passes() {
        let b = bucket();
        let mut tat = 0;
        b.charge(&mut tat, 100 * SECOND, 5);
        // 5 tokens of a 3-token bucket: 2 in debt, so the next token is 3 s away.
        let refused = b.check(&mut tat, 100 * SECOND, 1);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_secs(3));
        assert!(b.check(&mut tat, 103 * SECOND, 1).allowed, "paid back");
    }

    #[test]
    fn a_new_client_gets_the_whole_burst_then_is_denied() {
        let b = bucket();
        let now = 100 * SECOND;
        let mut tat = None;
        for expected_remaining in [2, 1, 0] {
            let (d, next) = b.decide(tat, now, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            tat = next;
        }
        let (d, next) = b.decide(tat, now, 1);
        assert!(!d.allowed);
        assert_eq!(next, None, "a denial stores nothing");
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert_eq!(d.reset_after, Duration::from_secs(3));
    }

    #[test]
    fn tokens_come_back_at_the_refill_rate() {
        let b = bucket();
        let t0 = 100 * SECOND;
        let (_, tat) = b.decide(None, t0, 3);
        let tat = tat.unwrap();
        // 0.999 s later: still nothing.
        let (d, _) = b.decide(Some(tat), t0 + SECOND - 1_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_micros(1_000));
        // Exactly one interval later: one token, and nothing left after it.
        let (d, tat2) = b.decide(Some(tat), t0 + SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(tat2, Some(t0 + 4 * SECOND));
        // Long idle: full again, never more than capacity.
        let (d, _) = b.decide(Some(tat), t0 + 1_000 * SECOND, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
    }

    #[test]
    fn fractional_rates_are_exact() {
        // REFILL_RATE=0.01: one token every 100 s.
        let b = TokenBucket {
            capacity: 5,
            interval_us: 100 * SECOND,
        };
        let (_, tat) = b.decide(None, 0, 5);
        let (d, _) = b.decide(tat, 99 * SECOND, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert_eq!(d.reset_after, Duration::from_secs(401));
    }

    #[test]
    fn a_cost_above_capacity_is_always_denied() {
        let (d, tat) = bucket().decide(None, 0, 4);
        assert!(!d.allowed);
        assert_eq!(tat, None);
    }

    #[test]
    fn idle_means_full() {
        assert!(bucket().is_idle(&10, 10));
        assert!(!bucket().is_idle(&11, 10));
    }

    proptest! {
        /// Over any run of requests, allowed <= capacity + elapsed / interval; remaining never
        /// exceeds capacity; denials leave the state untouched.
        #[test]
        fn never_more_than_the_budget(
            capacity in 1u64..50,
            interval_us in 1u64..5_000_000,
            steps in proptest::collection::vec((0u64..3_000_000, 1u64..4), 1..200),
        ) {
            let b = TokenBucket { capacity, interval_us };
            let start = 1_000 * SECOND;
            let mut now = start;
            let mut tat = None;
            let mut spent = 0u64;
            for (dt, cost) in steps {
                now += dt;
                let (d, next) = b.decide(tat, now, cost);
                prop_assert!(d.remaining <= capacity);
                if d.allowed {
                    spent += cost;
                    tat = next;
                } else {
                    prop_assert_eq!(next, None);
                    prop_assert_eq!(d.remaining, 0);
                    prop_assert!(d.retry_after > Duration::ZERO);
                }
                prop_assert!(spent <= capacity + (now - start) / interval_us);
            }
        }
    }
}
