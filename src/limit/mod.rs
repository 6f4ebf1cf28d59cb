//! The limiting domain: rules, keys, decisions, algorithms and the stores that remember
//! clients. Nothing here forwards or answers HTTP; the proxy hands a request head to the
//! [`RuleTable`], gets a [`Match`] (rule, key, cost, mode), and asks the [`Limiter`] for a
//! [`Verdict`].

pub mod algorithm;
pub mod denials;
pub mod guard;
pub mod key;
pub mod memory;
pub mod pattern;
pub mod redis;
pub mod redis_clock;
pub mod rules;
pub mod sentinel;
pub mod settings;
pub mod slots;

use std::time::Duration;

pub use algorithm::{Policy, State};
pub use guard::{FailMode, Guard, GuardSettings};
pub use key::{ClientIp, ClientKey, KeyBy, KeyHasher};
pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisTarget, StoreError};
pub use rules::{Count, Match, Mode, RequestHead, Rule, RuleTable};

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

/// The configured store, behind one call.
#[derive(Clone)]
pub enum Limiter {
    /// In-process, for a single instance.
    Memory(MemoryStore),
    /// Redis, shared by every replica, guarded by the fail mode and circuit breaker.
    Redis(Guard),
}

impl Limiter {
    /// Decide one request of `cost` units for `client` under `rule`.
    pub async fn check(&self, rule: &Rule, client: ClientKey, cost: u64) -> Verdict {
        match self {
            Limiter::Memory(store) => Verdict::Decided(store.check(rule, client, cost)),
            // Boxed: the Redis path's future (the batch, the deadline, the breaker) is two
            // kilobytes, and inline it would make every request's future, memory mode's too,
            // that much larger, copied on each hand-off. One allocation beside a round trip.
            Limiter::Redis(guard) => Box::pin(guard.check(rule, client, cost)).await,
        }
    }

    /// Give back the `cost` an allowed request took (see [`Count::Failures`]), to the store
    /// that decided it.
    pub async fn refund(&self, rule: &Rule, client: ClientKey, cost: u64, verdict: &Verdict) {
        match (self, verdict) {
            (Limiter::Memory(store), Verdict::Decided(decision)) => {
                store.refund(rule, client, cost, decision.at_us);
            }
            (Limiter::Redis(guard), Verdict::Decided(decision)) => {
                Box::pin(guard.refund(rule, client, cost, decision.at_us)).await;
            }
            (Limiter::Redis(guard), Verdict::DecidedLocally(decision)) => {
                if let Some(store) = guard.local_store() {
                    store.refund(rule, client, cost, decision.at_us);
                }
            }
            _ => {}
        }
    }

    /// Every memory store this limiter holds (the store itself, or `FAIL_MODE=local`'s), for
    /// the periodic purge of idle clients.
    pub fn memory_store(&self) -> Option<&MemoryStore> {
        match self {
            Limiter::Memory(store) => Some(store),
            Limiter::Redis(guard) => guard.local_store(),
        }
    }

    /// The Redis guard, in Redis mode.
    pub fn guard(&self) -> Option<&Guard> {
        match self {
            Limiter::Memory(_) => None,
            Limiter::Redis(guard) => Some(guard),
        }
    }

    /// Name of the store, for the startup log.
    pub fn describe(&self) -> &'static str {
        match self {
            Limiter::Memory(_) => "memory",
            Limiter::Redis(_) => "redis",
        }
    }
}
