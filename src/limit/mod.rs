//! The limiting domain: rules, decisions, algorithms and the stores that remember clients.
//! Nothing here knows about HTTP; the proxy hands in a [`Rule`] and a [`ClientKey`] and gets a
//! [`Verdict`] back.

pub mod algorithm;
pub mod guard;
pub mod memory;
pub mod redis;

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use algorithm::{SlidingWindow, TokenBucket, WindowState};

pub use guard::{FailMode, Guard, GuardSettings};
pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisTarget, StoreError};

/// Who a budget belongs to: the client's IP address, as worked out by the proxy.
pub type ClientKey = IpAddr;

/// Which of the two budgets a request draws from. Every client has one of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleName {
    /// Every path not listed in `AUTH_PATHS`.
    General,
    /// The paths in `AUTH_PATHS` (login, signup, ...), which share one stricter budget.
    Auth,
}

impl RuleName {
    /// The name used in logs, Redis keys and `--check-config`.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleName::General => "general",
            RuleName::Auth => "auth",
        }
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named budget and the algorithm that enforces it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Which budget this is; part of every store key.
    pub name: RuleName,
    /// The algorithm and its numbers.
    pub policy: Policy,
}

/// An algorithm with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `ALGORITHM=token_bucket`.
    TokenBucket(TokenBucket),
    /// `ALGORITHM=sliding_window`.
    SlidingWindow(SlidingWindow),
}

/// What a store remembers of one client under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Theoretical arrival time of the token bucket (see [`TokenBucket`]).
    TokenBucket(u64),
    /// Counters of the sliding window.
    SlidingWindow(WindowState),
}

impl Policy {
    /// The number advertised in `X-RateLimit-Limit`.
    pub fn limit(&self) -> u64 {
        match self {
            Policy::TokenBucket(tb) => tb.capacity,
            Policy::SlidingWindow(sw) => sw.limit,
        }
    }

    /// The algorithm's decision for a request of `cost` at `now_us`. A stored state of another
    /// algorithm (impossible within one process) counts as no state.
    pub fn decide(&self, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, Option<State>) {
        match self {
            Policy::TokenBucket(tb) => {
                let tat = match state {
                    Some(State::TokenBucket(tat)) => Some(*tat),
                    _ => None,
                };
                let (decision, tat) = tb.decide(tat, now_us, cost);
                (decision, tat.map(State::TokenBucket))
            }
            Policy::SlidingWindow(sw) => {
                let counters = match state {
                    Some(State::SlidingWindow(counters)) => Some(*counters),
                    _ => None,
                };
                let (decision, counters) = sw.decide(counters, now_us, cost);
                (decision, counters.map(State::SlidingWindow))
            }
        }
    }

    /// True when forgetting `state` at `now_us` changes no future decision.
    pub fn is_idle(&self, state: &State, now_us: u64) -> bool {
        match (self, state) {
            (Policy::TokenBucket(_), State::TokenBucket(tat)) => TokenBucket::is_idle(*tat, now_us),
            (Policy::SlidingWindow(sw), State::SlidingWindow(counters)) => sw.is_idle(counters, now_us),
            _ => true,
        }
    }
}

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
            Limiter::Redis(guard) => guard.check(rule, client, cost).await,
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

    /// Name of the store, for the startup log.
    pub fn describe(&self) -> &'static str {
        match self {
            Limiter::Memory(_) => "memory",
            Limiter::Redis(_) => "redis",
        }
    }
}
