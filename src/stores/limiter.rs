//! The gate's one handle on the configured store ([`Limiter`], an `Arc<dyn Store>`), and
//! what it answers ([`Verdict`]): a decision, or what the rule's fail mode says when the
//! store cannot decide.

use std::sync::Arc;

use crate::algorithms::{Cost, Decision};
use crate::rules::{ClientKey, FailMode, Rule};
use crate::stores::{Decide, MemoryStore, Store, StoreError, StoreStats};

/// What the proxy acts on: a decision, or what the fail mode says when Redis cannot decide.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub(crate) store: Arc<dyn Store>,
}

impl Limiter {
    /// Decide with `store`.
    pub fn new(store: impl Store) -> Limiter {
        Limiter {
            store: Arc::new(store),
        }
    }

    /// Decide one request of `cost` units for `client` under `rule`.
    pub fn check<'a>(&'a self, rule: &'a Rule, client: ClientKey, cost: Cost) -> Decide<'a, Verdict> {
        self.store.check(rule, client, cost)
    }

    /// Give back the `cost` an allowed request took (see [`Count::Failures`](crate::rules::Count::Failures)), to the store
    /// that decided it.
    pub fn refund<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.store.refund(rule, client, cost, verdict)
    }

    /// Renew the leases of an allowed request still in flight (see [`Store::renew`]).
    pub fn renew<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.store.renew(rule, client, cost, verdict)
    }

    /// Spend `cost` more of what `client` has under `rule`, into debt if need be, in the store
    /// that decided `verdict` (see [`Store::charge`]).
    pub fn charge<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.store.charge(rule, client, cost, verdict)
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
    pub fn reset<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<bool, StoreError>> {
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

    /// Give back what this replica holds of the shared budgets (see [`Store::release`]).
    pub fn release(&self) -> Decide<'_, ()> {
        self.store.release()
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
