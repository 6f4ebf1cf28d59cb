//! What happens when the Redis store fails: the fail mode and the circuit breakers.
//!
//! A failed or slow call costs at most `REDIS_TIMEOUT_MS`. After `REDIS_BREAKER_THRESHOLD`
//! consecutive failures a breaker opens: from then on every decision it guards is immediate
//! (the fail mode, without asking Redis) and one background task asks Redis `TIME` every
//! `REDIS_PROBE_INTERVAL_MS`. The first answered probe closes the breaker and limiting
//! resumes by itself. So an outage never makes every request wait for a timeout, and never
//! turns into an outage of the backend (with `FAIL_MODE=open` or `local`).
//!
//! A single Redis has one breaker. A Redis Cluster has one per master: the guard keeps the
//! cluster's slot map (`CLUSTER SLOTS`, asked again every few seconds to follow failovers),
//! finds each key's master from its hash slot, and a dead master hands the fail mode to its
//! own slots only, while every other slot keeps its exact limits. Its probe asks that master.
//! Each breaker also keeps the estimate of its node's clock that decisions' deadlines are put
//! on ([`RedisClock`]): each machine's clock is its own.
//!
//! `local` keeps limiting during the outage with a memory store of this replica's own: each
//! replica then enforces the full budget by itself (so N replicas allow up to N times the
//! budget), which protects the backend without refusing anyone.
//!
//! The fail mode is the rule's own ([`Rule::fail_mode`]: `FAIL_MODE`, `AUTH_FAIL_MODE`, a
//! route's `fail=`), so logins can be limited `local` while the API fails `open`; the breakers
//! are the store's, shared by every rule.
//!
//! The guard is generic over the store it guards: a [`Remote`] names what it needs of a store
//! that can fail (the client's key, a decision and a refund by key on a clock estimate, the
//! partitions and a probe), [`RedisStore`] is the one the gateway runs, and the guard is the
//! [`Store`] the limiter holds. So its logic is unit-tested against a store that fails on
//! command (`guard/tests.rs`), on paused time, and a store of another kind that can fail gets
//! the breakers and fail modes without a line of them.

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use std::num::NonZeroUsize;

use crate::algorithms::{Cost, Decision};
use crate::rules::FailMode;
use crate::rules::{ClientKey, Rule};
use crate::stores::denials::{DenialCache, Remembered, parse_reset_message};
use crate::stores::lease::{LeaseSettings, Leases, Return, Step, Taken, Want};
use crate::stores::redis_clock::RedisClock;
use crate::stores::slots::{Master, SlotMap, key_slot};
use crate::stores::store::{BreakerStats, Decide, Store, StoreStats};
use crate::stores::{MemoryStore, RedisStore, StoreError, Verdict};
use crate::telemetry::throttle::LogThrottle;

/// What went wrong with a Redis call, as counted for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisErrorKind {
    /// No answer within `REDIS_TIMEOUT_MS`.
    Timeout,
    /// Connecting failed or the connection broke.
    Connection,
    /// Redis answered with an error (`OOM`, `READONLY`, a script error, a wrong key type...).
    Script,
    /// The script answered something other than a decision.
    Reply,
}

impl RedisErrorKind {
    /// Every kind, in label order.
    pub const ALL: [RedisErrorKind; 4] = [
        RedisErrorKind::Timeout,
        RedisErrorKind::Connection,
        RedisErrorKind::Script,
        RedisErrorKind::Reply,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisErrorKind::Timeout => "timeout",
            RedisErrorKind::Connection => "connection",
            RedisErrorKind::Script => "script",
            RedisErrorKind::Reply => "reply",
        }
    }

    /// Whether a failure of this kind says the store is unreachable (no answer in time, or
    /// no connection): the only failures a circuit breaker counts. Redis's error replies and
    /// replies no script could have meant are about what one call asked (a key of the wrong
    /// type, a state written by something else), or answered at once (`OOM`, `READONLY`):
    /// each such request gets its rule's fail mode, and no client's numbers can open the
    /// breaker for every other client.
    pub fn feeds_breaker(self) -> bool {
        matches!(self, RedisErrorKind::Timeout | RedisErrorKind::Connection)
    }

    fn of(error: &StoreError) -> RedisErrorKind {
        match error {
            StoreError::Timeout(_) | StoreError::Expired | StoreError::BreakerOpen => RedisErrorKind::Timeout,
            // Before the I/O check: the client's response timeout is an I/O error too.
            StoreError::Redis(error) if error.is_timeout() => RedisErrorKind::Timeout,
            StoreError::Redis(error) if error.is_io_error() || error.is_connection_dropped() => {
                RedisErrorKind::Connection
            }
            StoreError::Redis(_) => RedisErrorKind::Script,
            StoreError::Reply(_) => RedisErrorKind::Reply,
        }
    }
}

/// What the [`Guard`] needs of a store that can fail: Redis, single or cluster, behind
/// Sentinel or not ([`RedisStore`]), or a test's double. Every call may fail; the guard
/// decides what a failure means.
///
/// The guard makes the client's key first and finds its breaker from it (on a cluster, the
/// key's master), then hands the key to the call: the key is made once per decision.
pub trait Remote: Send + Sync + 'static {
    /// The store's name for `/readyz` (`redis`).
    const NAME: &'static str;

    /// The key of one client under one rule; on a cluster its hash slot names its master.
    fn key(&self, rule: &Rule, client: ClientKey) -> String;

    /// Decide a request of `cost` under `rule` for the client of `key`, with the deadline put
    /// on `clock`, the estimate of the clock of the node that decides.
    fn check_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: String,
        cost: Cost,
        clock: &'a RedisClock,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a;

    /// Give back `cost` taken under `rule` at `at_us` (the decision's, on the store's clock)
    /// by the client of `key`.
    fn refund_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: Cost,
        at_us: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Spend `cost` under `rule` for the client of `key` whatever is left, into debt if need
    /// be (a cost the backend reported).
    fn charge_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: Cost,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;
    /// Renew the lease taken under `rule` (a rule of one concurrency limit) at `at_us` by the
    /// client of `key`, a request of `cost` still in flight. A store without leases has none.
    fn renew_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
        _cost: Cost,
        _at_us: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Ok(()))
    }

    /// What the client of `key` has left under `rule`, spending nothing and changing nothing.
    fn inspect_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a;

    /// Forget the client of `key` (`client`) under every limit of `rule`, for every replica
    /// sharing the store, and announce it to their [`reset_feed`](Self::reset_feed)s with a
    /// [`reset_message`](crate::stores::denials::reset_message); whether there was one to forget.
    fn reset_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        client: ClientKey,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// Take a share of `want.units` of the client of `key`'s budget under every limit of `rule`
    /// for `replica`, `want.cost` of them spent at once by the request that takes it, debited in
    /// one atomic step (`stores::lease`); sent at `sent`, its deadline put on `clock`. A store
    /// without leases never gives one: every request is asked of it.
    fn take_lease<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
        _want: Want,
        _replica: &'a str,
        _clock: &'a RedisClock,
        _sent: Instant,
    ) -> impl Future<Output = Result<Taken, StoreError>> + Send + 'a {
        std::future::ready(Ok(Taken::Refused))
    }

    /// The resets every replica announces (their [`reset_key`](Self::reset_key)s' messages),
    /// from now until the subscription is lost; `None` for a store that announces none.
    fn reset_feed(&self) -> impl Future<Output = Result<Option<ResetFeed>, StoreError>> + Send + '_ {
        std::future::ready(Ok(None))
    }

    /// True for a store cut into partitions (a Redis Cluster's masters) that fail alone, each
    /// then getting a breaker of its own from [`slot_map`](Self::slot_map).
    fn is_cluster(&self) -> bool;

    /// The estimate of a single node's clock (the whole store's breaker keeps it).
    fn clock(&self) -> &Arc<RedisClock>;

    /// The store's time in microseconds since the Unix epoch: the breaker's health probe,
    /// whose answer also renews the clock estimate. `slot` routes it to the partition that
    /// owns that slot; without one, any node answers.
    fn time(&self, slot: Option<u16>) -> impl Future<Output = Result<u64, StoreError>> + Send + '_;

    /// Which partition owns which slot, asked again every few seconds to follow failovers;
    /// `None` for a store of one node.
    fn slot_map(&self) -> impl Future<Output = Result<Option<SlotMap>, StoreError>> + Send + '_;
}

/// The messages of a subscription to the resets every replica announces, until it is lost.
pub type ResetFeed = BoxStream<'static, Vec<u8>>;

/// What is done to a decision after it was made ([`Guard`]'s `after`), with the cost it
/// concerns.
#[derive(Debug, Clone, Copy)]
enum After {
    /// Give back this much (`count=failures`, a reported cost below the one charged).
    Refund(Cost),
    /// Renew the leases of a request of this cost still in flight.
    Renew(Cost),
    /// Spend this much more, into debt if need be (a reported cost above the one charged).
    Charge(Cost),
}

/// The breaker's numbers (the fail modes are the rules' own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    /// `REDIS_BREAKER_THRESHOLD`: consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// `REDIS_PROBE_INTERVAL_MS`: how often an open breaker checks whether Redis is back.
    pub probe_interval: Duration,
}

/// A store that can fail ([`RedisStore`] unless named) behind circuit breakers: one for a
/// single Redis, one per master for a Redis Cluster (so a dead master hands the fail mode to
/// its own slots only). Cheap to clone; clones share the breakers.
pub struct Guard<S: Remote = RedisStore> {
    /// Shared with clones; its [`Shared`] part also with the guards of later rule tables and,
    /// weakly, with the probe and slot-map tasks (which end when the last guard goes).
    inner: Arc<Inner<S>>,
}

impl<S: Remote> Clone for Guard<S> {
    fn clone(&self) -> Self {
        Guard {
            inner: self.inner.clone(),
        }
    }
}

/// Each rule's name and fail mode, in table order.
type FailModes = Arc<[(Arc<str>, FailMode)]>;

/// One rule table's view of the guard: what changes with the table. The rest is [`Shared`].
struct Inner<S> {
    /// What every table's view shares: the store, its breakers and counters.
    shared: Arc<Shared<S>>,
    /// Decides for the rules that fail `local` while Redis cannot; `None` when none does.
    local: Option<MemoryStore>,
    /// Each rule's name and fail mode, in table order.
    fail_modes: FailModes,
    /// Denials repeated without asking Redis until their retry time (by rule id, so one per
    /// table: another table's ids mean other rules).
    denials: DenialCache,
}

/// What outlives a rule table: the store, its breakers, its counters, and the tasks that
/// watch them (which hold it weakly, and end when the last view goes).
struct Shared<S> {
    /// The store guarded.
    store: S,
    /// The breaker's numbers.
    settings: GuardSettings,
    /// `MAX_KEYS`: the bound of the local store and of the denial cache.
    max_keys: NonZeroUsize,
    /// The current table's fail modes, for the breakers' log lines.
    fail_modes: RwLock<FailModes>,
    /// Which breaker guards which key.
    breakers: Breakers,
    /// Failed calls since startup, by [`RedisErrorKind`].
    errors: [AtomicU64; RedisErrorKind::ALL.len()],
    /// Requests answered from a denial cache, since startup.
    denial_hits: Arc<AtomicU64>,
    /// Paces the warning for errors about one key, which recur on every request of that
    /// client (the errors that open a breaker stop with it).
    one_key_log: LogThrottle,
    /// Every rule table's view still in use (weakly): a reset announced by another replica
    /// reaches each one's denial cache.
    views: Mutex<Vec<Weak<Inner<S>>>>,
    /// Shares of hot keys' budgets in hand (`REDIS_LEASES=on`); `None` when off.
    leases: Option<Leases>,
}

/// One circuit breaker: for the whole store, or for one cluster master.
struct Breaker {
    /// The address of the master it guards, `None` for the whole store (a single Redis; on a
    /// cluster, the slots no known master serves, and every slot until the slot map is known).
    master: Option<String>,
    /// A slot the master owns, where its probe's `TIME` is routed; [`NO_SLOT`] for the whole
    /// store. Updated when a new slot map moves the master's slots.
    probe_slot: AtomicU32,
    /// Failures since the last success; reset by any success.
    consecutive_failures: AtomicU32,
    /// True while open: decisions skip Redis and a probe task runs.
    open: AtomicBool,
    /// Requests answered by the fail mode since the outage began, for its log lines.
    degraded: AtomicU64,
    /// The estimate of its node's clock, which each decision's deadline is put on: one per
    /// master, as each machine's clock is its own.
    clock: Arc<RedisClock>,
}

impl Breaker {
    fn new(master: Option<&Master>, clock: Arc<RedisClock>) -> Arc<Breaker> {
        Arc::new(Breaker {
            master: master.map(|master| master.address.clone()),
            probe_slot: AtomicU32::new(master.map_or(NO_SLOT, |master| u32::from(master.first_slot))),
            consecutive_failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            degraded: AtomicU64::new(0),
            clock,
        })
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The master's address for log lines, empty for the whole store.
    fn node(&self) -> &str {
        self.master.as_deref().unwrap_or_default()
    }

    /// Where its probe's `TIME` goes: the master's first slot, or any node.
    fn probe_slot(&self) -> Option<u16> {
        u16::try_from(self.probe_slot.load(Ordering::Relaxed)).ok()
    }
}

enum Breakers {
    /// A single Redis: one breaker.
    One(Arc<Breaker>),
    /// A Redis Cluster: the breaker of each key's master, from a slot map refreshed every
    /// [`SLOT_MAP_REFRESH`].
    PerMaster(RwLock<Arc<MasterBreakers>>),
}

/// A breaker per master of one slot map, and the whole-store breaker for everything else.
struct MasterBreakers {
    whole: Arc<Breaker>,
    /// By master, in the slot map's order.
    masters: Vec<Arc<Breaker>>,
    /// `None` until `CLUSTER SLOTS` has answered once.
    slots: Option<SlotMap>,
}

impl MasterBreakers {
    /// The breaker of `key`'s master.
    fn of(&self, key: &str) -> &Arc<Breaker> {
        self.slots
            .as_ref()
            .and_then(|slots| slots.owner(key_slot(key.as_bytes())))
            .map_or(&self.whole, |master| &self.masters[master])
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Breaker>> {
        std::iter::once(&self.whole).chain(&self.masters)
    }

    /// The breakers of a new slot map: a master already known (by its address) keeps its
    /// breaker and its state, with its probe routed to a slot it owns now; a new one starts
    /// closed; one that no longer owns slots is dropped (its probe notices and stops).
    fn remap(&self, slots: SlotMap) -> MasterBreakers {
        let masters = slots
            .masters()
            .iter()
            .map(|master| {
                match self
                    .masters
                    .iter()
                    .find(|known| known.master.as_deref() == Some(master.address.as_str()))
                {
                    Some(known) => {
                        known
                            .probe_slot
                            .store(u32::from(master.first_slot), Ordering::Relaxed);
                        known.clone()
                    }
                    None => Breaker::new(Some(master), Arc::new(RedisClock::new())),
                }
            })
            .collect();
        MasterBreakers {
            whole: self.whole.clone(),
            masters,
            slots: Some(slots),
        }
    }
}

/// [`Breaker::probe_slot`] of the whole store's breaker: no slot, any node.
const NO_SLOT: u32 = u32::MAX;

/// While a breaker stays open, how often the probe repeats that requests are degraded.
const OUTAGE_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// How often a cluster's slot map is asked again, to follow failovers and resharding.
const SLOT_MAP_REFRESH: Duration = Duration::from_secs(5);

impl<S: Remote> Guard<S> {
    /// Guard `store` with `settings` for `rules`, each with its fail mode; `max_keys` bounds
    /// the memory store of the rules that fail `local` (made only if one does). Call it inside
    /// a Tokio runtime: on a cluster it starts the task that keeps the slot map.
    pub fn new(store: S, settings: GuardSettings, max_keys: NonZeroUsize, rules: &[Rule]) -> Self {
        Guard::with_leases(store, settings, max_keys, rules, None)
    }

    /// [`Guard::new`], deciding hot keys from shares of their budgets (`REDIS_LEASES=on`,
    /// [`crate::stores::lease`]) when `leases` is given; it then starts the task that gives
    /// back shares whose time is up.
    pub fn with_leases(
        store: S,
        settings: GuardSettings,
        max_keys: NonZeroUsize,
        rules: &[Rule],
        leases: Option<LeaseSettings>,
    ) -> Self {
        // Until the slot map is known, the whole store's breaker serves every master, and
        // its clock estimate is the lowest of theirs: a deadline found passed in time is
        // sent again (see RedisClock).
        let breakers = if store.is_cluster() {
            Breakers::PerMaster(RwLock::new(Arc::new(MasterBreakers {
                whole: Breaker::new(None, Arc::new(RedisClock::new())),
                masters: Vec::new(),
                slots: None,
            })))
        } else {
            Breakers::One(Breaker::new(None, store.clock().clone()))
        };
        let shared = Arc::new(Shared {
            store,
            settings,
            max_keys,
            fail_modes: RwLock::new(Arc::from([])),
            breakers,
            errors: Default::default(),
            denial_hits: Default::default(),
            one_key_log: LogThrottle::new(),
            views: Mutex::default(),
            leases: leases.map(Leases::new),
        });
        if shared.leases.is_some() {
            tokio::spawn(return_expired(Arc::downgrade(&shared)));
        }
        if matches!(shared.breakers, Breakers::PerMaster(_)) {
            tokio::spawn(keep_slot_map(Arc::downgrade(&shared)));
        }
        tokio::spawn(follow_resets(Arc::downgrade(&shared)));
        Guard::of(shared, rules, None)
    }

    /// This guard for another table of `rules`: the same store, breakers and counters; the
    /// local store (`FAIL_MODE=local`) keeps the budgets of rules whose name and policy did
    /// not change; the denial cache starts empty (its entries are by rule id).
    pub fn for_rules(&self, rules: &[Rule]) -> Self {
        // A rule whose limits change must not be decided from shares of the old ones: every
        // share goes back (the hot keys take new ones under the new table at once).
        if let Some(leases) = &self.inner.shared.leases {
            let returns = leases.drain(Instant::now(), true, false);
            if !returns.is_empty() {
                tokio::spawn(give_back(self.inner.shared.clone(), returns));
            }
        }
        Guard::of(self.inner.shared.clone(), rules, self.inner.local.as_ref())
    }

    fn of(shared: Arc<Shared<S>>, rules: &[Rule], local: Option<&MemoryStore>) -> Self {
        let local = rules
            .iter()
            .any(|rule| rule.fail_mode == FailMode::Local)
            .then(|| match local {
                Some(store) => store.for_rules(rules),
                None => MemoryStore::new(shared.max_keys, rules),
            });
        let fail_modes: Arc<[(Arc<str>, FailMode)]> = rules
            .iter()
            .map(|rule| (rule.name.clone(), rule.fail_mode))
            .collect();
        *shared.fail_modes.write().unwrap_or_else(PoisonError::into_inner) = fail_modes.clone();
        let inner = Arc::new(Inner {
            denials: DenialCache::new(shared.max_keys, shared.denial_hits.clone()),
            shared,
            local,
            fail_modes,
        });
        let mut views = inner.shared.views.lock().unwrap_or_else(PoisonError::into_inner);
        views.retain(|view| view.strong_count() > 0);
        views.push(Arc::downgrade(&inner));
        drop(views);
        Guard { inner }
    }

    /// How many breakers are open, and how many there are: one for a single Redis; on a
    /// cluster, one per master plus one for slots no known master serves.
    fn breakers_open(&self) -> (usize, usize) {
        let count = |breakers: &mut dyn Iterator<Item = &Arc<Breaker>>| {
            breakers.fold((0, 0), |(open, all), breaker| {
                (open + usize::from(breaker.is_open()), all + 1)
            })
        };
        match &self.inner.shared.breakers {
            Breakers::One(breaker) => count(&mut std::iter::once(breaker)),
            Breakers::PerMaster(map) => count(&mut read(map).all()),
        }
    }

    /// Redis Cluster masters in the slot map, each with its breaker; 0 for a single Redis
    /// and until the cluster first answers `CLUSTER SLOTS`.
    fn masters(&self) -> usize {
        match &self.inner.shared.breakers {
            Breakers::One(_) => 0,
            Breakers::PerMaster(map) => read(map).masters.len(),
        }
    }

    /// True while Redis as a whole is given up on: the single Redis's breaker is open; on a
    /// cluster, the breaker of every master is (before the slot map is known, the whole
    /// store's).
    fn is_open(&self) -> bool {
        match &self.inner.shared.breakers {
            Breakers::One(breaker) => breaker.is_open(),
            // The whole-store breaker only serves unowned slots once the map is known.
            Breakers::PerMaster(map) => {
                let map = read(map);
                match map.slots {
                    None => map.whole.is_open(),
                    Some(_) => !map.masters.is_empty() && map.masters.iter().all(|b| b.is_open()),
                }
            }
        }
    }

    /// What is done to a decision after it was made (`after`), at the store that made it:
    /// the remote unless its breaker is open (then nothing, as each caller says why), or the
    /// local store; nothing for a fail mode's answer, which no store counted.
    fn after<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        verdict: &Verdict,
        after: After,
    ) -> Decide<'a, ()> {
        match verdict {
            Verdict::Decided(decision) => {
                let at_us = decision.at_us;
                let shared = &*self.inner.shared;
                let key = shared.store.key(rule, client);
                let breaker = shared.breaker(&key);
                if breaker.is_open() {
                    return Decide::ready(());
                }
                Decide::Pending(Box::pin(async move {
                    let store = &shared.store;
                    let done = match after {
                        After::Refund(cost) => store.refund_key(rule, &key, cost, at_us).await,
                        After::Renew(cost) => store.renew_key(rule, &key, cost, at_us).await,
                        After::Charge(cost) => store.charge_key(rule, &key, cost).await,
                    };
                    if let Err(error) = done {
                        self.record_failure(&breaker, &error);
                    }
                }))
            }
            Verdict::DecidedLocally(decision) => {
                if let Some(store) = self.local_store() {
                    match after {
                        After::Refund(cost) => store.refund(rule, client, cost, decision.at_us),
                        After::Renew(_) => store.renew(rule, client, decision.at_us),
                        After::Charge(cost) => store.charge(rule, client, cost),
                    }
                }
                Decide::ready(())
            }
            Verdict::FailOpen | Verdict::FailClosed => Decide::ready(()),
        }
    }

    /// Take a share for the hot client of `key` (see [`Leases::step`]): this request's decision
    /// when a share was taken; else, the share refused, Redis decides it as without leases.
    #[allow(clippy::too_many_arguments)]
    async fn take(
        &self,
        leases: &Leases,
        rule: &Rule,
        key: String,
        cost: Cost,
        want: u64,
        breaker: &Breaker,
        sent: Instant,
    ) -> Result<Decision, StoreError> {
        let store = &self.inner.shared.store;
        // The take forgotten if it fails, expires, or this future is dropped before it answers
        // (its request went away): only an answered take is the lease's to settle.
        let mut abandon = Abandon {
            leases,
            key: &key,
            armed: true,
        };
        let taken = store
            .take_lease(
                rule,
                &key,
                Want { cost, units: want },
                leases.replica(),
                &breaker.clock,
                sent,
            )
            .await?;
        match &taken {
            Taken::Share { now_us, .. } => breaker.clock.observe(sent, *now_us),
            Taken::Expired(redis_us) => {
                breaker.clock.reset(sent, *redis_us);
                return Err(StoreError::Expired);
            }
            Taken::Refused => {}
        }
        abandon.armed = false;
        drop(abandon);
        let mut returned = Vec::new();
        let decision = leases.taken(rule, &key, cost, sent, &taken, &mut returned);
        if !returned.is_empty() {
            tokio::spawn(give_back(self.inner.shared.clone(), returned));
        }
        match decision {
            Some(decision) => Ok(decision),
            None => store.check_key(rule, key, cost, &breaker.clock).await,
        }
    }

    /// The memory store of the rules that fail `local`, if one does.
    fn local_store(&self) -> Option<&MemoryStore> {
        self.inner.local.as_ref()
    }

    /// Redis cannot be asked: a client it refused stays refused until its retry time (the
    /// denial remembered, however long ago it was asked); anyone else gets the fail mode.
    fn cannot_ask(&self, breaker: &Breaker, rule: &Rule, client: ClientKey, cost: Cost) -> Verdict {
        match self.inner.denials.check_until_retry(rule, client, cost) {
            Some(denial) => Verdict::Decided(denial),
            None => self.fall_back(breaker, rule, client, cost),
        }
    }

    /// The rule's fail mode decides.
    fn fall_back(&self, breaker: &Breaker, rule: &Rule, client: ClientKey, cost: Cost) -> Verdict {
        breaker.degraded.fetch_add(1, Ordering::Relaxed);
        match (rule.fail_mode, &self.inner.local) {
            (FailMode::Open, _) => Verdict::FailOpen,
            (FailMode::Closed, _) => Verdict::FailClosed,
            (FailMode::Local, Some(store)) => Verdict::DecidedLocally(store.check(rule, client, cost)),
            // Not a rule of the table the guard was made for (every `local` rule of that one
            // has the store): forward, as the default mode does.
            (FailMode::Local, None) => Verdict::FailOpen,
        }
    }

    /// Count a failed call, and open `breaker` at the threshold when the store could not be
    /// reached ([`RedisErrorKind::feeds_breaker`]: a timeout or a connection failure, not an
    /// "expired" answer).
    fn record_failure(&self, breaker: &Arc<Breaker>, error: &StoreError) {
        let inner = &self.inner.shared;
        let kind = RedisErrorKind::of(error);
        inner.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
        let node = breaker.node();
        // An "expired" answer is an answer: Redis ran the call, late behind a busy Redis or
        // machine, and a breaker opened by it would let every request through unlimited for a
        // probe interval while Redis is there.
        if !kind.feeds_breaker() || matches!(error, StoreError::Expired) {
            // Redis answered: an error reply or a reply out of range is that call's trouble
            // and says nothing of the store's health, and an open breaker would hand every
            // other client the fail mode too.
            if let Some(suppressed) = inner.one_key_log.admit() {
                if suppressed > 0 {
                    tracing::warn!(suppressed, "{suppressed} similar lines suppressed");
                }
                tracing::warn!(%error, node, "rate-limit store call failed for this key alone");
            }
            return;
        }
        let failures = breaker.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(%error, node, consecutive_failures = failures, "rate-limit store call failed");
        if failures >= inner.settings.failure_threshold && !breaker.open.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                node,
                fail_mode = %inner.fail_modes_text(),
                probe_interval_ms = inner.settings.probe_interval.as_millis() as u64,
                "circuit breaker open: redis{} is not asked until a probe succeeds; its requests are {}",
                if breaker.master.is_some() { " master" } else { "" },
                inner.effects()
            );
            tokio::spawn(probe(Arc::downgrade(inner), breaker.clone()));
        }
    }
}

impl<S: Remote> Store for Guard<S> {
    /// Ask the store, unless it has already refused this request until later (see
    /// [`DenialCache`]) or the breaker of the client's master is open: both answered at once,
    /// without an allocation.
    fn check<'a>(&'a self, rule: &'a Rule, client: ClientKey, cost: Cost) -> Decide<'a, Verdict> {
        let inner = &*self.inner;
        let shared = &*inner.shared;
        // A denial of the client that does not answer this request is forgotten when the
        // request is admitted: what it spends puts the denial's retry time off.
        let remembered = match inner.denials.check(rule, client, cost) {
            Remembered::Refused(denial) => return Decide::ready(Verdict::Decided(denial)),
            Remembered::Unsure => true,
            Remembered::Nothing => false,
        };
        let key = shared.store.key(rule, client);
        let mut take = None;
        if let Some(leases) = &shared.leases {
            let mut returned = None;
            let step = leases.step(rule, &key, cost, Instant::now(), &mut returned);
            if let Some(returned) = returned {
                tokio::spawn(give_back(shared_arc(&self.inner), vec![returned]));
            }
            match step {
                Step::Local(decision, refresh) => {
                    if remembered && decision.allowed {
                        inner.denials.forget(rule, client);
                    }
                    if let Some(units) = refresh {
                        let breaker = shared.breaker(&key).into_owned();
                        tokio::spawn(refresh_share(
                            self.inner.shared.clone(),
                            rule.clone(),
                            key,
                            units,
                            breaker,
                        ));
                    }
                    return Decide::ready(Verdict::Decided(decision));
                }
                Step::Take(want) => take = Some((leases, want)),
                Step::Ask => {}
            }
        }
        let breaker = shared.breaker(&key);
        if breaker.is_open() {
            if let Some((leases, _)) = take {
                leases.abandon(&key);
            }
            return Decide::ready(self.cannot_ask(&breaker, rule, client, cost));
        }
        Decide::Pending(Box::pin(async move {
            let sent = Instant::now();
            let decided = match take {
                Some((leases, want)) => self.take(leases, rule, key, cost, want, &breaker, sent).await,
                None => shared.store.check_key(rule, key, cost, &breaker.clock).await,
            };
            match decided {
                Ok(decision) => {
                    // Read first: a store on every request would bounce the cache line.
                    if breaker.consecutive_failures.load(Ordering::Relaxed) != 0 {
                        breaker.consecutive_failures.store(0, Ordering::Relaxed);
                    }
                    // A refusal while this replica holds units of the key (or has them on
                    // their way) is not repeated: the next request spends them.
                    let holds = !decision.allowed
                        && shared
                            .leases
                            .as_ref()
                            .is_some_and(|leases| leases.may_hold(&shared.store.key(rule, client)));
                    if decision.allowed {
                        if remembered {
                            inner.denials.forget(rule, client);
                        }
                    } else if !holds {
                        inner.denials.remember(rule, client, cost, &decision, sent);
                    }
                    Verdict::Decided(decision)
                }
                Err(error) => {
                    self.record_failure(&breaker, &error);
                    self.cannot_ask(&breaker, rule, client, cost)
                }
            }
        }))
    }

    /// Refund a decision to the store that made it: the remote (see [`RedisStore::refund`]),
    /// or the local store. While the breaker is open the remote is not asked: the cost stays
    /// spent, erring toward the limit.
    fn refund<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.after(rule, client, verdict, After::Refund(cost))
    }

    /// Renew the leases of a request still in flight at the store that decided it, as
    /// [`refund`](Store::refund) gives back: not while the breaker is open (the lease then
    /// expires, erring toward the client).
    fn renew<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.after(rule, client, verdict, After::Renew(cost))
    }

    /// Charge a decision's client more, in the store that decided it, as [`Guard::refund`]
    /// gives back: while the breaker is open nothing is charged (the request went through
    /// already; erring toward the client, as the fail mode did).
    fn charge<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        self.after(rule, client, verdict, After::Charge(cost))
    }

    /// Ask the remote, past the denial cache (which holds denials, not budgets); while the
    /// key's breaker is open, [`StoreError::BreakerOpen`].
    fn inspect<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<Decision, StoreError>> {
        let shared = &*self.inner.shared;
        let key = shared.store.key(rule, client);
        let breaker = shared.breaker(&key);
        if breaker.is_open() {
            return Decide::ready(Err(StoreError::BreakerOpen));
        }
        Decide::Pending(Box::pin(async move {
            let inspected = shared.store.inspect_key(rule, &key).await;
            if let Err(error) = &inspected {
                self.record_failure(&breaker, error);
            }
            inspected
        }))
    }

    /// Forget the client everywhere this replica knows it: its cached denial and its local
    /// budget (`FAIL_MODE=local`) at once, then the remote's key, for every replica, which
    /// hear of it at once on the store's reset channel and forget their denials too. A replica
    /// whose subscription is down asks Redis again within
    /// [`RECHECK_AFTER`](crate::stores::denials::RECHECK_AFTER), and so does this one for a denial a
    /// request in flight remembers after the reset.
    fn reset<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<bool, StoreError>> {
        let inner = &*self.inner;
        inner.denials.forget(rule, client);
        let held_locally = self.local_store().is_some_and(|local| local.reset(rule, client));
        let shared = &*inner.shared;
        let key = shared.store.key(rule, client);
        if let Some(leases) = &shared.leases {
            leases.forget(&key);
        }
        let breaker = shared.breaker(&key);
        if breaker.is_open() {
            return Decide::ready(Err(StoreError::BreakerOpen));
        }
        Decide::Pending(Box::pin(async move {
            let reset = shared.store.reset_key(rule, &key, client).await;
            if let Err(error) = &reset {
                self.record_failure(&breaker, error);
            }
            reset.map(|held| held || held_locally)
        }))
    }

    fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let local = self.local_store();
        let (open, total) = self.breakers_open();
        StoreStats {
            kind: S::NAME,
            clients: local.map_or(0, MemoryStore::len),
            evictions: local.map_or(0, MemoryStore::evictions),
            cached_denials: inner.denials.hits(),
            breakers: Some(BreakerStats {
                open,
                total,
                all_open: self.is_open(),
            }),
            masters: self.masters(),
            errors: std::array::from_fn(|kind| inner.shared.errors[kind].load(Ordering::Relaxed)),
        }
    }

    fn fail_modes(&self) -> &[(Arc<str>, FailMode)] {
        &self.inner.fail_modes
    }

    /// The local store's idle clients (the remote's expire by their TTL).
    fn purge_idle(&self) -> usize {
        self.local_store().map_or(0, MemoryStore::purge_idle)
    }

    fn for_rules(&self, rules: &[Rule]) -> Arc<dyn Store> {
        Arc::new(Guard::for_rules(self, rules))
    }

    /// Give every share in hand back, and take none from now on (the shutdown, after the
    /// drain): each client's budget gets what this replica did not spend.
    fn release(&self) -> Decide<'_, ()> {
        let Some(leases) = &self.inner.shared.leases else {
            return Decide::ready(());
        };
        let returns = leases.drain(Instant::now(), true, true);
        if returns.is_empty() {
            return Decide::ready(());
        }
        Decide::Pending(Box::pin(give_back(self.inner.shared.clone(), returns)))
    }
}

impl<S> Shared<S> {
    /// Another replica (or this one) reset a client: forget its denial in every table's view
    /// that has a rule of that name.
    fn reset_heard(&self, message: &[u8]) {
        let Some((name, client)) = parse_reset_message(message) else {
            tracing::debug!("a message on the reset channel that is not a reset; ignored");
            return;
        };
        let views: Vec<Arc<Inner<S>>> = self
            .views
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for view in views {
            if let Some(id) = view.fail_modes.iter().position(|(rule, _)| **rule == *name) {
                // Ids are table positions, below u16::MAX.
                view.denials.forget_id(id as u16, client);
            }
        }
    }

    /// The current table's fail modes.
    fn fail_modes(&self) -> Arc<[(Arc<str>, FailMode)]> {
        self.fail_modes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The fail modes for log lines: `general=open` or `auth=local,general=open`.
    fn fail_modes_text(&self) -> String {
        let fail_modes = self.fail_modes();
        match fail_modes.split_first() {
            Some(((_, first), rest)) if rest.iter().all(|(_, mode)| mode == first) => {
                first.as_str().to_owned()
            }
            _ => {
                let each: Vec<String> = fail_modes
                    .iter()
                    .map(|(name, mode)| format!("{name}={}", mode.as_str()))
                    .collect();
                each.join(",")
            }
        }
    }

    /// What the fail modes do, for the breaker's log line: `forwarded without limiting`, or
    /// per rule when they differ (`auth: limited by this replica alone; general: ...`).
    fn effects(&self) -> String {
        let fail_modes = self.fail_modes();
        let mut modes = fail_modes.iter().map(|(_, mode)| *mode);
        match modes.next() {
            Some(first) if modes.all(|mode| mode == first) => first.effect().to_owned(),
            _ => {
                let each: Vec<String> = fail_modes
                    .iter()
                    .map(|(name, mode)| format!("{name}: {}", mode.effect()))
                    .collect();
                each.join("; ")
            }
        }
    }

    /// The breaker that guards `key` (borrowed for a single Redis: no reference count to
    /// bump on every request).
    fn breaker(&self, key: &str) -> Cow<'_, Arc<Breaker>> {
        match &self.breakers {
            Breakers::One(breaker) => Cow::Borrowed(breaker),
            Breakers::PerMaster(map) => Cow::Owned(read(map).of(key).clone()),
        }
    }

    /// True while `breaker` still guards something: always for a single Redis; on a
    /// cluster, while the current slot map has it (a master that failed over is dropped).
    fn guards(&self, breaker: &Arc<Breaker>) -> bool {
        match &self.breakers {
            Breakers::One(_) => true,
            Breakers::PerMaster(map) => read(map).all().any(|known| Arc::ptr_eq(known, breaker)),
        }
    }
}

/// The slot map behind the lock; a poisoned lock still holds a whole map (it is only ever
/// replaced in one assignment).
fn read(map: &RwLock<Arc<MasterBreakers>>) -> Arc<MasterBreakers> {
    map.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Ask `TIME` until Redis (or the breaker's master) answers, then renew the clock estimate
/// and close the breaker. Ends early if
/// the gateway is gone, or if the master no longer owns slots. Every
/// [`OUTAGE_REPORT_INTERVAL`] it logs how many requests the fail mode has answered.
async fn probe<S: Remote>(inner: Weak<Shared<S>>, breaker: Arc<Breaker>) {
    let mut last_report = Instant::now();
    let node = breaker.node();
    loop {
        let Some(interval) = inner.upgrade().map(|inner| inner.settings.probe_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !inner.guards(&breaker) {
            tracing::info!(
                node,
                degraded_requests = breaker.degraded.load(Ordering::Relaxed),
                "redis master no longer owns slots; its breaker is dropped"
            );
            return;
        }
        // A Redis that came back since the last probe is seen now: the store sends a call
        // that failed on a lost connection once more at once (the connection manager starts
        // a new connection only when a call fails on the old one). `TIME` rather than `PING`:
        // the node may have restarted elsewhere or had its clock stepped during the outage,
        // so its answer starts the clock estimate afresh.
        let slot = breaker.probe_slot();
        let sent = Instant::now();
        let answer = inner.store.time(slot).await;
        match answer {
            Ok(redis_us) => {
                breaker.clock.reset(sent, redis_us);
                breaker.consecutive_failures.store(0, Ordering::Relaxed);
                breaker.open.store(false, Ordering::Release);
                tracing::info!(
                    node,
                    degraded_requests = breaker.degraded.swap(0, Ordering::Relaxed),
                    "circuit breaker closed: redis answers again, limiting resumes"
                );
                return;
            }
            Err(error) => {
                tracing::debug!(%error, node, "redis probe failed; breaker stays open");
                if last_report.elapsed() >= OUTAGE_REPORT_INTERVAL {
                    last_report = Instant::now();
                    tracing::warn!(
                        %error,
                        node,
                        fail_mode = %inner.fail_modes_text(),
                        degraded_requests = breaker.degraded.load(Ordering::Relaxed),
                        "redis still unavailable; requests are answered by the fail mode"
                    );
                }
            }
        }
    }
}

/// Follow the resets other replicas announce ([`Remote::reset_feed`]) while the gateway
/// lives: subscribe, forget each reset client's denial as its message arrives, and subscribe
/// again once the subscription is lost or cannot be made (meanwhile the denial cache asks
/// Redis again every [`RECHECK_AFTER`](crate::stores::denials::RECHECK_AFTER), as it always does while
/// Redis can be asked). A subscription that keeps failing (Redis down, or a user without
/// pub/sub rights) is tried again after a probe interval, doubled with each failure up to
/// [`RESUBSCRIBE_AT_MOST`], and said once at `warn`. Ends at once for a store without resets.
async fn follow_resets<S: Remote>(inner: Weak<Shared<S>>) {
    let mut lost = false;
    let mut failures: u32 = 0;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let interval = strong.settings.probe_interval;
        let feed = strong.store.reset_feed().await;
        drop(strong);
        let mut wait = interval;
        match feed {
            Ok(None) => return,
            Ok(Some(mut feed)) => {
                failures = 0;
                if lost {
                    tracing::info!("subscribed to resets again: they reach this replica at once");
                }
                loop {
                    // Wakes every interval to end with the gateway.
                    match tokio::time::timeout(interval, feed.next()).await {
                        Ok(Some(message)) => match inner.upgrade() {
                            Some(strong) => strong.reset_heard(&message),
                            None => return,
                        },
                        Ok(None) => break,
                        Err(_) if inner.strong_count() == 0 => return,
                        Err(_) => {}
                    }
                }
                lost = true;
                tracing::warn!(
                    "subscription to resets lost: until it is back, a reset elsewhere reaches this \
                     replica's cached denials within a second"
                );
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(
                        %error,
                        "cannot subscribe to resets: until it can, a reset elsewhere reaches this \
                         replica's cached denials within a second"
                    );
                } else {
                    tracing::debug!(%error, failures, "cannot subscribe to resets; trying again");
                }
                wait = interval
                    .saturating_mul(1 << failures.min(16))
                    .min(RESUBSCRIBE_AT_MOST.max(interval));
            }
        }
        tokio::time::sleep(wait).await;
    }
}

/// The longest wait between two attempts to subscribe to resets: a Redis that refuses the
/// subscription for good is asked twice a minute, not twice a second.
const RESUBSCRIBE_AT_MOST: Duration = Duration::from_secs(30);

/// Keep a cluster's slot map: ask `CLUSTER SLOTS` now, again every [`SLOT_MAP_REFRESH`]
/// (every probe interval until it first answers), and give each master its breaker. Ends
/// when the gateway is gone.
async fn keep_slot_map<S: Remote>(inner: Weak<Shared<S>>) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let Breakers::PerMaster(map) = &strong.breakers else {
            return;
        };
        let wait = match strong.store.slot_map().await {
            Ok(Some(slots)) => {
                let current = read(map);
                if current.slots.as_ref() != Some(&slots) {
                    let masters: Vec<&str> = slots.masters().iter().map(|m| m.address.as_str()).collect();
                    tracing::info!(masters = %masters.join(","), "redis cluster slot map");
                    let remapped = Arc::new(current.remap(slots));
                    *map.write().unwrap_or_else(PoisonError::into_inner) = remapped;
                }
                SLOT_MAP_REFRESH
            }
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "redis cluster slot map not read; asking again");
                if read(map).slots.is_some() {
                    SLOT_MAP_REFRESH
                } else {
                    strong.settings.probe_interval
                }
            }
        };
        drop(strong);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests;

/// Forgets a take under way when dropped armed (its request went away before the answer).
struct Abandon<'a> {
    leases: &'a Leases,
    key: &'a str,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.leases.abandon(self.key);
        }
    }
}

/// The shared part of a view, for a task.
fn shared_arc<S>(inner: &Inner<S>) -> Arc<Shared<S>> {
    inner.shared.clone()
}

/// Give `returns` back to the store, each as a refund of a request counted at its take's time
/// (which gives back no more than was taken, and nothing to a window that has ended). A return
/// that fails leaves the share spent: never over.
async fn give_back<S: Remote>(shared: Arc<Shared<S>>, returns: Vec<Return>) {
    for returned in returns {
        let done = shared
            .store
            .refund_key(&returned.rule, &returned.key, returned.units, returned.at_us)
            .await;
        if let Err(error) = done {
            tracing::debug!(%error, "a lease's unspent share could not go back; it stays spent");
        }
    }
}

/// How often shares whose time is up are looked for, to go back.
const RETURN_INTERVAL: Duration = Duration::from_millis(100);

/// Every [`RETURN_INTERVAL`], give back the shares whose time is up, until the guard is gone.
async fn return_expired<S: Remote>(shared: Weak<Shared<S>>) {
    let mut tick = tokio::time::interval(RETURN_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(leases) = &shared.leases else {
            return;
        };
        let returns = leases.drain(Instant::now(), false, false);
        if !returns.is_empty() {
            give_back(shared, returns).await;
        }
    }
}

/// Take the next share of the hot key `key` under `rule` in the background (cost 0) while the
/// one in hand still serves it; what the take brings is added to it (see [`Leases::taken`]).
async fn refresh_share<S: Remote>(
    shared: Arc<Shared<S>>,
    rule: Rule,
    key: String,
    units: u64,
    breaker: Arc<Breaker>,
) {
    let Some(leases) = &shared.leases else {
        return;
    };
    if breaker.is_open() {
        leases.abandon(&key);
        return;
    }
    let sent = Instant::now();
    let want = Want {
        cost: Cost::ZERO,
        units,
    };
    let taken = shared
        .store
        .take_lease(&rule, &key, want, leases.replica(), &breaker.clock, sent)
        .await;
    let taken = match taken {
        Ok(taken) => taken,
        Err(error) => {
            leases.abandon(&key);
            if !error.is_about_one_key() {
                tracing::debug!(%error, "a lease's next share could not be taken");
            }
            return;
        }
    };
    match &taken {
        Taken::Share { now_us, .. } => breaker.clock.observe(sent, *now_us),
        Taken::Expired(redis_us) => {
            breaker.clock.reset(sent, *redis_us);
            leases.abandon(&key);
            return;
        }
        Taken::Refused => {}
    }
    let mut returned = Vec::new();
    leases.taken(&rule, &key, Cost::ZERO, sent, &taken, &mut returned);
    if !returned.is_empty() {
        give_back(shared, returned).await;
    }
}
