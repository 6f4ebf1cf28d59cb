//! Token bucket, computed as GCRA (the generic cell rate algorithm).
//!
//! A bucket of `capacity` tokens refilled at one token per `interval` is fully described by
//! one number: the *theoretical arrival time* (TAT), the instant at which the bucket will be
//! full again. Tokens available at `now` are `(capacity * interval - (tat - now)) / interval`.
//! Storing the TAT instead of (tokens, last refill) keeps the state to one integer, keeps the
//! arithmetic in integers (so Lua's doubles and Rust's `u64` agree bit for bit) and makes
//! "fully refilled" a single comparison: `tat <= now`.
//!
//! `scripts/token_bucket.lua` is the same function, line for line.

use std::time::Duration;

use crate::limit::Decision;

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
    pub fn decide(&self, tat: Option<u64>, now_us: u64, cost: u64) -> (Decision, Option<u64>) {
        let tat = tat.map_or(now_us, |tat| tat.max(now_us));
        let tau = self.capacity * self.interval_us;
        let new_tat = tat + cost * self.interval_us;
        if new_tat - now_us > tau {
            let decision = Decision {
                allowed: false,
                limit: self.capacity,
                remaining: 0,
                retry_after: Duration::from_micros(new_tat - tau - now_us),
                reset_after: Duration::from_micros(tat - now_us),
            };
            return (decision, None);
        }
        let decision = Decision {
            allowed: true,
            limit: self.capacity,
            remaining: (tau - (new_tat - now_us)) / self.interval_us,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_micros(new_tat - now_us),
        };
        (decision, Some(new_tat))
    }

    /// True when a bucket with this TAT is full at `now`, so forgetting it changes nothing.
    pub fn is_idle(tat: u64, now_us: u64) -> bool {
        tat <= now_us
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
        assert!(TokenBucket::is_idle(10, 10));
        assert!(!TokenBucket::is_idle(11, 10));
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
