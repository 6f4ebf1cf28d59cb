//! What the gate's [`Limiter`](crate::stores::Limiter) asks of a store, whichever it is: decide a
//! request, give back what one took, purge idle clients, and say what it knows for the
//! metrics and `/readyz`. [`MemoryStore`](crate::stores::MemoryStore) implements it directly; a
//! store that can fail ([`Remote`](crate::stores::guard::Remote), Redis) implements it through the
//! [`Guard`](crate::stores::Guard), which turns its failures into each rule's fail mode.
//!
//! The trait is dyn-compatible, so the limiter is one `Arc<dyn Store>`: a third store is one
//! file, its `mod` line and its line in `app::limiter` (docs/architecture.md's recipe), and
//! nothing above `stores` names a concrete store. Its futures
//! are a [`Decide`]: a store that answers at once (memory, a cached denial, an open breaker)
//! returns [`Decide::Ready`] and allocates nothing; one that waits for the network boxes its
//! future ([`Decide::Pending`]), as the Redis path did already (two kilobytes of batch,
//! deadline and breaker that would otherwise make every request's future that large). A
//! generic gate would avoid the virtual call too, but would make every type that holds the
//! gate generic for a saving the benchmarks cannot see beside the shard lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::algorithms::{Cost, Decision};
use crate::rules::FailMode;
use crate::rules::{ClientKey, Rule};
use crate::stores::guard::RedisErrorKind;
use crate::stores::{StoreError, Verdict};

/// What the gate's limiter asks of a store.
pub trait Store: Send + Sync + 'static {
    /// Decide one request of `cost` units for `client` under `rule`.
    fn check<'a>(&'a self, rule: &'a Rule, client: ClientKey, cost: Cost) -> Decide<'a, Verdict>;

    /// Give back the `cost` an allowed request took (see [`Count::Failures`](crate::rules::Count)),
    /// as `verdict` says it was decided: a store gives back only what it decided itself.
    fn refund<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()>;

    /// Spend `cost` more of `client`'s budget under every limit of `rule`, whatever is left,
    /// into debt if need be (a cost the backend reported above the one charged, see
    /// `RESPONSE_COST_HEADER`), in the store that made `verdict`.
    fn charge<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()>;
    /// Renew the leases an allowed request still in flight took (of `cost` places, decided as
    /// `verdict` says) under `rule`'s concurrency limits: they last their length from now.
    /// A store gives back nothing and renews only what it decided itself; a store without
    /// leases has nothing to renew.
    fn renew<'a>(
        &'a self,
        _rule: &'a Rule,
        _client: ClientKey,
        _cost: Cost,
        _verdict: &Verdict,
    ) -> Decide<'a, ()> {
        Decide::ready(())
    }

    /// What `client` has left under `rule` now, spending nothing (the admin's `GET
    /// /v1/clients/RULE/KEY`): the decision a request of cost 0 would get. A client never
    /// seen has its whole budget. Fails when the store cannot be asked (Redis down, its
    /// breaker open): an operator is told so rather than handed a fail mode's guess.
    fn inspect<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<Decision, StoreError>>;

    /// Forget `client`'s budget under `rule`, giving it the whole budget back (the admin's
    /// `DELETE /v1/clients/RULE/KEY`): in memory, or in Redis for every replica at once.
    /// Answers whether the store held a budget of it (else there was nothing to give back).
    fn reset<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<bool, StoreError>>;

    /// What the store knows now, for the metrics and `/readyz` (read at scrape time, not on
    /// the request path).
    fn stats(&self) -> StoreStats;

    /// Each rule's name and what the store does with its requests when it cannot decide, in
    /// table order; empty for a store that never fails.
    fn fail_modes(&self) -> &[(Arc<str>, FailMode)] {
        &[]
    }

    /// Forget the clients whose budget is entirely back, as of now, and say how many went.
    /// The server calls it periodically; a store that keeps no clients in memory has none.
    fn purge_idle(&self) -> usize {
        0
    }

    /// This store for another rule table of `rules` (`rules[i].id == i`), what a reload
    /// swaps in: every rule whose name and policy are unchanged keeps its clients' budgets,
    /// every other starts afresh. Connections, breakers and counters carry on.
    fn for_rules(&self, rules: &[Rule]) -> Arc<dyn Store>;

    /// Give back whatever this replica holds of the shared budgets (a lease's unspent share,
    /// `REDIS_LEASES`), and take no more: the shutdown's last word to the store, after the
    /// drain. A store that holds nothing has nothing to give back.
    fn release(&self) -> Decide<'_, ()> {
        Decide::ready(())
    }

    /// The memory store, if this is one (what `STATE_FILE` saves).
    fn memory(&self) -> Option<&crate::stores::MemoryStore> {
        None
    }
}

/// A store's answer: at once, or after a wait. A future, so callers `.await` it either way.
pub enum Decide<'a, T> {
    /// Answered without waiting (taken by the first poll): no allocation.
    Ready(Option<T>),
    /// Waiting for the network.
    Pending(Pin<Box<dyn Future<Output = T> + Send + 'a>>),
}

impl<T> Decide<'_, T> {
    /// An answer given at once.
    pub fn ready(value: T) -> Self {
        Decide::Ready(Some(value))
    }
}

// Nothing in a `Decide` is ever pinned in place: the pending future is pinned in its box, and
// a ready value is moved out.
impl<T> Unpin for Decide<'_, T> {}

impl<T> Future for Decide<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.get_mut() {
            // As `std::future::Ready`: polling a finished future is the caller's bug.
            Decide::Ready(value) => Poll::Ready(value.take().expect("`Decide` polled after completion")),
            Decide::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

/// What a store knows, read at scrape time. Zero (or `None`) wherever a store has no such
/// thing: the memory store has no breakers, a Redis store without `FAIL_MODE=local` holds no
/// clients in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// `memory` or `redis`: `/readyz`'s `store`.
    pub kind: &'static str,
    /// Client budgets held in this replica's memory (the store's own, or `FAIL_MODE=local`'s):
    /// `tollgate_memory_clients`.
    pub clients: usize,
    /// Client budgets forgotten to stay within `MAX_KEYS`: `tollgate_memory_evictions_total`.
    pub evictions: u64,
    /// Requests refused from the denial cache without asking the store:
    /// `tollgate_cached_denials_total`.
    pub cached_denials: u64,
    /// The circuit breakers of a store that can fail; `None` for one that cannot (`/readyz`
    /// then says `"breaker":"none"`).
    pub breakers: Option<BreakerStats>,
    /// Cluster masters in the slot map, each with a breaker: `tollgate_redis_masters`.
    pub masters: usize,
    /// Failed calls since startup, indexed by [`RedisErrorKind`]: `tollgate_redis_errors_total`.
    pub errors: [u64; RedisErrorKind::ALL.len()],
}

impl StoreStats {
    /// Failed calls of `kind` since startup.
    pub fn errors(&self, kind: RedisErrorKind) -> u64 {
        self.errors[kind as usize]
    }
}

/// The state of a store's circuit breakers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerStats {
    /// Breakers open (their requests get the fail mode): `tollgate_breaker_open`.
    pub open: usize,
    /// Breakers in all: one for a single Redis; on a cluster one per master, plus one for
    /// slots no known master serves.
    pub total: usize,
    /// True while the store as a whole is given up on (every master's breaker open): what
    /// makes `/readyz` say `open`, and refuse readiness when every rule fails closed.
    pub all_open: bool,
}

/// The fail mode every rule shares, or `None` when they differ (or there are none).
pub fn common_fail_mode(fail_modes: &[(Arc<str>, FailMode)]) -> Option<FailMode> {
    let mut modes = fail_modes.iter().map(|(_, mode)| *mode);
    let first = modes.next()?;
    modes.all(|mode| mode == first).then_some(first)
}
