//! The limiting domain: rules, keys, decisions, algorithms and the stores that remember
//! clients. Nothing here forwards or answers HTTP; the proxy hands a request head to the
//! [`RuleTable`], gets a [`Match`] (rule, key, cost, mode), and asks the [`Limiter`] for a
//! [`Verdict`].
//!
//! The limiter holds one [`Store`]: the [`MemoryStore`], or a [`Remote`] store (the
//! [`RedisStore`]) behind the [`Guard`], its circuit breakers and fail modes. The guard is
//! generic over the remote, so its logic is tested against a store that fails on command.
//!
//! Besides deciding, a store reads a client's budget without spending it and resets it (the
//! admin's operations, [`Store::inspect`] and [`Store::reset`]); `refused` keeps, in bounded
//! memory, the clients refused most.

pub mod algorithm;
pub mod denials;
pub mod guard;
pub mod key;
pub mod memory;
pub mod pattern;
pub mod redis;
pub mod redis_clock;
pub(crate) mod refused;
pub mod rules;
pub mod sentinel;
pub mod settings;
pub mod slots;
pub mod state_file;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

pub use algorithm::{Policy, State};
pub use guard::{FailMode, Guard, GuardSettings, Remote};
pub use key::{ClientIp, ClientKey, Digest, KeyBy, KeyHasher, Source};
pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisTarget, StoreError};
pub use rules::{Count, Match, Mode, RequestHead, Rule, RuleTable};
pub use store::{BreakerStats, Decide, Store, StoreStats};

/// The outcome of asking a store about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go through.
    pub allowed: bool,
    /// The rule's capacity or per-window limit (`X-RateLimit-Limit`).
    pub limit: u64,
    /// Whole units left after this request; 0 when denied (`X-RateLimit-Remaining`).
    pub remaining: u64,
    /// When denied, how long until the same request would be allowed; zero when allowed.
    pub retry_after: Duration,
    /// How long until the budget is entirely back (`X-RateLimit-Reset` is now plus this).
    pub reset_after: Duration,
    /// When the request was counted, in microseconds since the Unix epoch on the deciding
    /// store's clock: what a refund hands back to find what to give back.
    pub at_us: u64,
}

/// What the proxy acts on: a decision, or what the fail mode says when Redis cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The configured store answered.
    Decided(Decision),
    /// Redis could not answer; this replica's own memory store did (`FAIL_MODE=local`).
    DecidedLocally(Decision),
    /// Redis could not answer: forward without limiting (`FAIL_MODE=open`).
    FailOpen,
    /// Redis could not answer: refuse with 503 (`FAIL_MODE=closed`).
    FailClosed,
}

impl Verdict {
    /// The decision, if some store made one.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Verdict::Decided(decision) | Verdict::DecidedLocally(decision) => Some(decision),
            Verdict::FailOpen | Verdict::FailClosed => None,
        }
    }
}

/// The configured store, behind one call: what the gate holds. Cheap to clone; clones share
/// the store.
#[derive(Clone)]
pub struct Limiter {
    /// The store itself: memory, Redis behind its guard, or any other [`Store`].
    store: Arc<dyn Store>,
}

impl Limiter {
    /// Decide with `store`.
    pub fn new(store: impl Store) -> Limiter {
        Limiter {
            store: Arc::new(store),
        }
    }

    /// Decide one request of `cost` units for `client` under `rule`.
    pub fn check<'a>(&'a self, rule: &'a Rule, client: ClientKey, cost: u64) -> Decide<'a, Verdict> {
        self.store.check(rule, client, cost)
    }

    /// Give back the `cost` an allowed request took (see [`Count::Failures`]), to the store
    /// that decided it.
    pub fn refund<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: u64,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.store.refund(rule, client, cost, verdict)
    }

    /// What `client` has left under `rule`, spending nothing (see [`Store::inspect`]).
    pub fn inspect<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
    ) -> Decide<'a, Result<Decision, StoreError>> {
        self.store.inspect(rule, client)
    }

    /// Give `client` its whole budget under `rule` back (see [`Store::reset`]).
    pub fn reset<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<(), StoreError>> {
        self.store.reset(rule, client)
    }

    /// What the store knows now, for the metrics and `/readyz`.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Each rule's fail mode, in table order; empty for a store that never fails.
    pub fn fail_modes(&self) -> &[(Arc<str>, FailMode)] {
        self.store.fail_modes()
    }

    /// Forget the clients whose budget is entirely back (the server's periodic purge).
    pub fn purge_idle(&self) -> usize {
        self.store.purge_idle()
    }

    /// The memory store, if that is the store (see [`Store::memory`]).
    pub fn memory(&self) -> Option<&MemoryStore> {
        self.store.memory()
    }

    /// This limiter for another table's `rules` (see [`Store::for_rules`]).
    pub fn for_rules(&self, rules: &[Rule]) -> Limiter {
        Limiter {
            store: self.store.for_rules(rules),
        }
    }
}
