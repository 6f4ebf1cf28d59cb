//! Concurrency: at most `places` of a client's requests in flight at once (`concurrent:N`,
//! or `concurrent:N:LEASE` with the lease in seconds).
//!
//! Unlike the four rate algorithms, what this limit counts ends with the request, not with
//! time: a request it allows takes `cost` places (a lease) until the gateway gives them back,
//! when the response body has been sent or the client went away (the gate's [`Place`],
//! dropped at the end of streaming). A refused request takes none, and a lease is given back
//! exactly once.
//!
//! Every lease also expires `lease_ms` after it was taken or last renewed: a gateway that dies
//! (or loses Redis) while holding places cannot hold them for ever, since the places come
//! back by themselves within the lease time (default [`DEFAULT_LEASE_MS`]). While the request
//! goes on, the gate renews its lease every third of the lease ([`Algorithm::renew`]), so a
//! long download or event stream keeps its place. The front doors that answer before the
//! request happens (forward-auth, `/v1/check`, Envoy's RLS) cannot give a place back nor
//! renew it, so there a lease always runs its full time.
//!
//! A lease is named by the microsecond it was taken at (`at_us` of the decision), moved on by
//! one while another lease of the client holds that name, so two requests of one client in the
//! same microsecond each get their own: the decision's `at_us` is the lease's name, and giving
//! it back (a refund at that time) removes that lease alone.
//!
//! How long until a place comes back is not known (it is when some request ends): a refusal
//! says [`RETRY_AFTER_US`], and [`Concurrent`]'s `EXACT_RETRY` is false.
//!
//! `scripts/concurrent.lua` is the same function, line for line, on a Redis sorted set whose
//! members are the leases' names (`ID`, and `ID:1`..`ID:cost-1` for a request of higher cost)
//! scored by their expiry.
//!
//! [`Place`]: crate::gate::Place

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use super::{Algorithm, Corrupt, LuaScript, ParameterError, StateReader, US_PER_MS, parse_count, parse_window_ms};
use crate::algorithms::LimitDecision;

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/concurrent.lua"))));

/// Most places one limit holds: each is a lease a client's state (or Redis sorted set) keeps
/// while it is held, so this bounds what one client can cost.
pub const MAX_PLACES: u64 = 10_000;

/// How long a lease lasts when `concurrent:N` does not say: long enough for the requests a
/// gateway usually proxies, short enough that a dead gateway's places come back within a
/// minute.
pub const DEFAULT_LEASE_MS: u64 = 60_000;

/// Shortest lease accepted, 1 s: a Redis expiry is counted in whole seconds.
pub const MIN_LEASE_MS: u64 = 1_000;

/// Longest lease accepted, a day: a dead gateway's places must come back some day.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// What a refusal says to wait (`Retry-After: 1`): a place comes back when a request ends,
/// which nobody can tell in advance.
pub const RETRY_AFTER_US: u64 = 1_000_000;

/// Parameters of one concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrent {
    /// Requests (units of cost) a client may have in flight at once.
    pub places: u64,
    /// How long a lease lasts, in milliseconds, unless given back before.
    pub lease_ms: u64,
}

/// One request's places, until given back or expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Its name: the microsecond it was taken at, moved on past the names held.
    pub id: u64,
    /// Places it holds: the request's cost.
    pub cost: u64,
    /// When it expires, in microseconds since the Unix epoch.
    pub expires_us: u64,
}

/// What is remembered of one client: the leases it holds, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrentState {
    /// The leases not given back, some perhaps expired (dropped at the next decision).
    pub leases: Vec<Lease>,
}

impl Algorithm for Concurrent {
    type State = ConcurrentState;

    const NAME: &'static str = "concurrent";
    const MEANINGS: [&'static str; 2] = ["places", "lease seconds"];
    // A limit list writes it; ALGORITHM and AUTH_ALGORITHM do not.
    const PARAMETERS: Option<[super::Parameter; 2]> = None;
    const KEY_SUFFIX: &'static str = "cc";
    // Places come back when requests end, which nobody knows in advance (its refusals say a
    // second).
    const EXACT_RETRY: bool = false;
    // Saved with no clients (see `save_state`).
    const FILE_TAG: u8 = 5;
    const EXAMPLES: &'static [Concurrent] = &[Concurrent {
        places: 2,
        lease_ms: 10_000,
    }];

    fn script() -> &'static LuaScript {
        &SCRIPT
    }

    /// Never saved: a lease belongs to a request of the process that saved it, over by the
    /// time the file is read.
    fn save_state(&self, _state: &ConcurrentState, _out: &mut Vec<u8>) -> bool {
        false
    }

    fn load_state(&self, _input: &mut StateReader<'_>, _saved_at: u64) -> Result<ConcurrentState, Corrupt> {
        Err("a concurrency limit's leases, which are never saved")
    }

    /// `places`, and the lease in seconds (`""`: [`DEFAULT_LEASE_MS`]).
    fn from_parameters(places: &str, lease: &str) -> Result<Self, ParameterError> {
        let places = parse_count(places, 0)
            .ok()
            .filter(|&places| places <= MAX_PLACES)
            .ok_or_else(|| ParameterError::Invalid {
                index: 0,
                expected: format!("a whole number from 1 to {MAX_PLACES}"),
            })?;
        let lease_ms = match lease {
            "" => DEFAULT_LEASE_MS,
            lease => parse_window_ms(lease, 1)
                .ok()
                .filter(|ms| (MIN_LEASE_MS..=MAX_LEASE_MS).contains(ms))
                .ok_or_else(|| ParameterError::Invalid {
                    index: 1,
                    expected: format!(
                        "a lease length in seconds, from {} to {}",
                        MIN_LEASE_MS / 1000,
                        MAX_LEASE_MS / 1000
                    ),
                })?,
        };
        Ok(Concurrent { places, lease_ms })
    }

    fn script_arguments(&self) -> [u64; 2] {
        [self.places, self.lease_ms]
    }

    fn from_script_arguments([places, lease_ms]: [u64; 2]) -> Self {
        Concurrent { places, lease_ms }
    }

    fn limit(&self) -> u64 {
        self.places
    }

    /// The lease: the longest a place is held.
    fn window(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    fn check(&self, state: &mut ConcurrentState, now_us: u64, cost: u64) -> LimitDecision {
        let leases = &mut state.leases;
        // Expired leases hold nothing: tidying them changes no decision.
        leases.retain(|lease| lease.expires_us > now_us);
        let held: u64 = leases.iter().map(|lease| lease.cost).sum();
        // Every place is back when the last lease expires (if none is given back before).
        let reset_us = leases
            .iter()
            .map(|lease| lease.expires_us - now_us)
            .max()
            .unwrap_or(0);
        let free = self.places.saturating_sub(held);
        if cost > free {
            return LimitDecision {
                allowed: false,
                limit: self.places,
                remaining: 0,
                retry_after: Duration::from_micros(RETRY_AFTER_US),
                reset_after: Duration::from_micros(reset_us),
                at_us: now_us,
            };
        }
        if cost == 0 {
            // A look (the admin's inspection): no lease.
            return LimitDecision {
                allowed: true,
                limit: self.places,
                remaining: free,
                retry_after: Duration::ZERO,
                reset_after: Duration::from_micros(reset_us),
                at_us: now_us,
            };
        }
        let mut id = now_us;
        while leases.iter().any(|lease| lease.id == id) {
            id += 1;
        }
        let lease_us = self.lease_ms * US_PER_MS;
        leases.push(Lease {
            id,
            cost,
            expires_us: now_us + lease_us,
        });
        LimitDecision {
            allowed: true,
            limit: self.places,
            remaining: free - cost,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_micros(reset_us.max(lease_us)),
            at_us: id,
        }
    }

    /// Gives back the lease named `at_us` (`cost` is what it was taken with, which the lease
    /// knows already); a lease
    /// given back already, or expired, is gone, so a second refund changes nothing.
    fn refund(&self, state: &mut ConcurrentState, at_us: u64, _cost: u64) {
        state.leases.retain(|lease| lease.id != at_us);
    }

    /// A cost reported after the response spends no places: a place is a request in flight,
    /// given back when it ends.
    fn charge(&self, _state: &mut ConcurrentState, _now_us: u64, _cost: u64) {}

    /// The lease named `at_us`, if it has not expired nor been given back, lasts its length
    /// from `now_us`.
    fn renew(&self, state: &mut ConcurrentState, at_us: u64, now_us: u64) {
        let leases = &mut state.leases;
        leases.retain(|lease| lease.expires_us > now_us);
        if let Some(lease) = leases.iter_mut().find(|lease| lease.id == at_us) {
            lease.expires_us = now_us + self.lease_ms * US_PER_MS;
        }
    }

    /// When the last lease expires (no lease: idle already).
    fn idle_at(&self, state: &ConcurrentState) -> u64 {
        state
            .leases
            .iter()
            .map(|lease| lease.expires_us)
            .max()
            .unwrap_or(0)
    }
}

impl fmt::Display for Concurrent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests in flight (leases of {} s)",
            self.places,
            self.lease_ms as f64 / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000;

    /// 2 places, leases of 10 s.
    fn two() -> Concurrent {
        Concurrent {
            places: 2,
            lease_ms: 10_000,
        }
    }

    #[test]
    fn places_are_taken_until_given_back() {
        let cc = two();
        let mut state = ConcurrentState::default();
        let first = cc.check(&mut state, 100 * SECOND, 1);
        assert!(first.allowed);
        assert_eq!((first.remaining, first.at_us), (1, 100 * SECOND));
        assert_eq!(first.reset_after, Duration::from_secs(10));
        let second = cc.check(&mut state, 101 * SECOND, 1);
        assert_eq!((second.allowed, second.remaining), (true, 0));
        let refused = cc.check(&mut state, 102 * SECOND, 1);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        // The last lease, taken at 101 s, expires at 111 s.
        assert_eq!(refused.reset_after, Duration::from_secs(9));
        assert_eq!(state.leases.len(), 2, "a refusal takes nothing");
        cc.refund(&mut state, first.at_us, 1);
        let third = cc.check(&mut state, 103 * SECOND, 1);
        assert_eq!((third.allowed, third.remaining), (true, 0));
    }

    #[test]
    fn a_lease_is_given_back_once() {
        let cc = two();
        let mut state = ConcurrentState::default();
        let first = cc.check(&mut state, 100 * SECOND, 1);
        let second = cc.check(&mut state, 100 * SECOND, 1);
        // The same microsecond: two leases, two names.
        assert_eq!(second.at_us, first.at_us + 1);
        cc.refund(&mut state, first.at_us, 1);
        cc.refund(&mut state, first.at_us, 1);
        assert_eq!(
            state.leases.len(),
            1,
            "the second refund of one lease gives nothing back"
        );
        assert_eq!(cc.check(&mut state, 100 * SECOND, 0).remaining, 1);
    }

    #[test]
    fn leases_expire_after_their_time() {
        let cc = two();
        let mut state = ConcurrentState::default();
        cc.check(&mut state, 100 * SECOND, 2);
        assert!(!cc.check(&mut state, 110 * SECOND - 1, 1).allowed);
        assert_eq!(cc.idle_at(&state), 110 * SECOND);
        let back = cc.check(&mut state, 110 * SECOND, 1);
        assert_eq!((back.allowed, back.remaining), (true, 1));
    }

    #[test]
    fn a_renewed_lease_lasts_its_length_again() {
        let cc = two();
        let mut state = ConcurrentState::default();
        let taken = cc.check(&mut state, 100 * SECOND, 1);
        cc.renew(&mut state, taken.at_us, 108 * SECOND);
        assert_eq!(cc.idle_at(&state), 118 * SECOND);
        assert_eq!(
            cc.check(&mut state, 117 * SECOND, 0).remaining,
            1,
            "still held at 117 s"
        );
        // Expired, it is not brought back.
        cc.renew(&mut state, taken.at_us, 118 * SECOND);
        assert!(state.leases.is_empty());
        // Nor is one given back.
        let again = cc.check(&mut state, 120 * SECOND, 1);
        cc.refund(&mut state, again.at_us, 1);
        cc.renew(&mut state, again.at_us, 121 * SECOND);
        assert!(state.leases.is_empty());
    }

    #[test]
    fn a_costly_request_takes_its_cost_in_places() {
        let cc = Concurrent {
            places: 3,
            lease_ms: 1_000,
        };
        let mut state = ConcurrentState::default();
        assert_eq!(cc.check(&mut state, SECOND, 2).remaining, 1);
        assert!(!cc.check(&mut state, SECOND, 2).allowed);
        assert!(
            !cc.check(&mut state, SECOND, 4).allowed,
            "more than the places: never"
        );
        assert!(cc.check(&mut state, SECOND, 1).allowed);
    }

    #[test]
    fn parameters_are_places_and_an_optional_lease() {
        assert_eq!(
            Concurrent::from_parameters("5", ""),
            Ok(Concurrent {
                places: 5,
                lease_ms: DEFAULT_LEASE_MS
            })
        );
        assert_eq!(
            Concurrent::from_parameters("5", "2.5").map(|c| c.lease_ms),
            Ok(2_500)
        );
        for (places, lease, index) in [
            ("0", "", 0),
            ("10001", "", 0),
            ("x", "", 0),
            ("5", "0.5", 1),
            ("5", "86401", 1),
        ] {
            assert!(
                matches!(Concurrent::from_parameters(places, lease), Err(ParameterError::Invalid { index: i, .. }) if i == index),
                "{places}:{lease}"
            );
        }
    }

    proptest! {
        /// Never more places held than the limit, and a refusal changes nothing a later
        /// decision could see.
        #[test]
        fn never_more_in_flight_than_the_places(
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..4, any::<bool>()), 1..60),
        ) {
            let cc = Concurrent { places: 3, lease_ms: 2_000 };
            let mut state = ConcurrentState::default();
            let mut now = SECOND;
            let mut taken = Vec::new();
            for (step, cost, give_back) in steps {
                now += step;
                if give_back && !taken.is_empty() {
                    let at = taken.remove(0);
                    cc.refund(&mut state, at, 1);
                }
                let before = state.clone();
                let decision = cc.check(&mut state, now, cost);
                let held: u64 = state.leases.iter().filter(|l| l.expires_us > now).map(|l| l.cost).sum();
                prop_assert!(held <= 3);
                if decision.allowed {
                    prop_assert_eq!(decision.remaining, 3 - held);
                    if cost > 0 {
                        taken.push(decision.at_us);
                    }
                } else {
                    let mut tidied = before;
                    tidied.leases.retain(|l| l.expires_us > now);
                    prop_assert_eq!(&state, &tidied);
                }
            }
        }
    }
}
