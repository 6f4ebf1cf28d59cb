//! The in-process store: client states in a fixed number of shards, each behind its own
//! mutex (`parking_lot`'s: under two threads deciding one hot client it measured 0.58x the
//! time of the standard library's, docs/benchmarks.md part 1).
//!
//! Sharding keeps two requests from different clients off the same lock. A shard keeps its
//! clients packed in one vector (each entry the key, the state and a last-seen stamp, 80
//! bytes) and finds them through an `Index` of their positions: buckets of one cache line,
//! each holding 12 positions and a one-byte tag of each position's hash, so a client costs
//! about 87 bytes and no allocation of its own. A decision for a known client reads two
//! lines it is not likely to find in cache, one after the other (its bucket, then its entry),
//! runs the algorithm, and writes a stamp into the entry: nothing is relinked and nothing is
//! allocated. (A `hashbrown` table of positions reads three: its control bytes, the slot,
//! and the entry; at a million clients each is a cache and TLB miss.)
//!
//! Every rule has shards of its own, each rule room for `MAX_KEYS` clients: a flood of
//! invented identities on one rule (fresh API keys on the general rule, say) can only ever
//! evict clients of that rule, never buy a fresh budget on another (the auth rule's refused
//! addresses). A shard holds at least [`MIN_SHARD_CAPACITY`] clients (fewer shards when
//! `MAX_KEYS` is small), so the eviction sample below is drawn from many clients, not from
//! the one or two a tiny shard would hold.
//!
//! When a shard is full, a new client evicts one of [`EVICTION_SAMPLE`] clients picked at
//! random, the one that loses the least information: a client whose budget is entirely back
//! first, then one whose last request was allowed before one whose last request was refused,
//! then the one whose budget is closest to back (ties go to the least recently seen). So the
//! `MAX_KEYS` bound is exact and costs nothing on the hot path, a flood of invented
//! identities cannot grow memory, and it cannot hand a limited client a fresh budget either:
//! a refused client goes only when every client sampled beside it is refused too, and the
//! flood's own entries, each allowed and having spent a little, go first. Entries whose
//! budget has fully come back are dropped by [`MemoryStore::purge_idle`], which the server
//! runs periodically.

use std::cmp::Reverse;
use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use hashbrown::DefaultHashBuilder;
use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::algorithms::{Cost, Decision, LimitDecision, MAX_LIMITS, Policy, State};
use crate::rules::{ClientKey, Rule};
use crate::stores::{Decide, Store, StoreError, StoreStats, Verdict};

/// Most shards a store is cut into: enough that 2 to 64 cores rarely meet on a lock.
const MAX_SHARDS: usize = 64;

/// How many clients, picked at random in a full shard, are candidates for eviction.
pub const EVICTION_SAMPLE: usize = 8;

/// Fewest clients a shard is made to hold (unless `MAX_KEYS` is smaller): with fewer, the
/// eviction sample would be the whole shard, and a refused client alone in a shard of one
/// would be evicted by the next stranger to hash there.
pub const MIN_SHARD_CAPACITY: usize = 64;

/// The in-memory store. Cheap to clone: clones share the same table.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// One rule table's view of the store: each rule's limits' shards, by rule id. A store built
/// for the next table ([`MemoryStore::for_rules`]) holds the same shards for every limit whose
/// rule name and policy did not change, so a reload keeps those budgets, and requests still
/// deciding under the old table meet the new one's in the same shards.
struct Inner {
    /// Each rule's budgets, by rule id.
    rules: Box<[RuleBudgets]>,
    /// What every table's view shares.
    shared: Arc<Shared>,
}

/// What outlives a rule table: the clock, the hasher, the bound, the counters.
struct Shared {
    /// `MAX_KEYS`: how many clients each rule holds.
    max_keys: usize,
    /// How many shards each rule has: a power of two.
    shards_per_rule: usize,
    /// Hashes a client once per decision, for the shard and the shard's index alike:
    /// foldhash, a few times cheaper than SipHash and randomly seeded per process, so clients
    /// cannot aim at one shard or one chain of the index.
    hasher: DefaultHashBuilder,
    /// The store's clock: microseconds since the Unix epoch, read from the monotonic clock
    /// (tokio's, so tests can pause it) anchored once to wall-clock time at `started`. Never
    /// steps back, and fixed windows align to the epoch as they do in Redis.
    started: Instant,
    /// Unix time in microseconds at `started`.
    started_unix_us: u64,
    /// Client states forgotten to stay within `MAX_KEYS`, since startup.
    evictions: AtomicU64,
    /// Seeds each new shard's eviction sampler.
    shards_made: AtomicU64,
}

/// One rule's budgets: each of its limits' clients, in the rule's order.
///
/// A rule of several limits decides a client under all of them at once, holding the client's
/// shard of each; they are locked in the order of their addresses (`lock_order`), which is
/// the same in every table that shares them, so two decisions (one under the table before a
/// reload that reordered the limits, one under the table after) never wait on each other.
struct RuleBudgets {
    /// Each limit's clients, in the rule's order.
    limits: Box<[Arc<LimitShards>]>,
    /// Positions in `limits`, by the address of their shards.
    lock_order: Box<[usize]>,
}

/// One limit's clients: `shards_per_rule` shards; a key lives in exactly one, chosen by its
/// hash (the same one in each limit of a rule).
struct LimitShards {
    /// The name of the rule they were made for: a later table's rule of that name with the
    /// same limit shares them.
    rule: Arc<str>,
    /// The limit: what purging and eviction judge states by.
    policy: Policy,
    /// The shards.
    shards: Box<[Shard]>,
}

/// One shard's lock, alone on its cache lines (128 bytes: x86 fetches lines in pairs), so
/// threads working in neighbouring shards do not invalidate each other's lock.
#[repr(align(128))]
struct Shard(Mutex<Table>);

/// One client's budget under one rule.
struct Entry {
    /// Whose budget.
    client: ClientKey,
    /// What the rule's algorithm remembers.
    state: State,
    /// Whether this client's last request was refused: such a client is the last to be
    /// evicted, since forgetting it would hand it a fresh budget.
    refused: bool,
    /// The shard's [`Table::tick`] when this client was last decided: breaks ties between
    /// eviction candidates in favour of forgetting the least recently seen. A counter rather
    /// than a clock, so it orders even decisions made at the same microsecond; wrapping only
    /// makes a very old entry look recent, which costs a tie-break, never a bound.
    seen: u32,
}

/// A shard's clients: packed in `entries`, found through `index`.
struct Table {
    /// The clients, in no particular order; a removal moves the last one into the hole, so
    /// the vector stays dense (allocated once, at `capacity`, and touched as it fills).
    entries: Vec<Entry>,
    /// Positions in `entries`, hashed by (rule, client); allocated once, with a quarter more
    /// slots than `capacity`, and never grown.
    index: Index,
    /// Most entries this shard holds; the capacities of all shards add up to `MAX_KEYS`.
    capacity: usize,
    /// Counts this shard's decisions: the clock of [`Entry::seen`].
    tick: u32,
    /// xorshift64 state picking the eviction sample; seeded from the process's random hasher,
    /// so which clients are candidates cannot be predicted from outside.
    random: u64,
}

impl MemoryStore {
    /// A store holding at most `max_keys` client states for each of the rules of one table
    /// (`rules[i].id == i`).
    pub fn new(max_keys: NonZeroUsize, rules: &[Rule]) -> Self {
        let max_keys = max_keys.get();
        let shared = Arc::new(Shared {
            max_keys,
            // A power of two, each shard holding MIN_SHARD_CAPACITY clients or more (one
            // shard for a small MAX_KEYS).
            shards_per_rule: MAX_SHARDS.min(1 << (max_keys / MIN_SHARD_CAPACITY).max(1).ilog2()),
            hasher: DefaultHashBuilder::default(),
            started: Instant::now(),
            started_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX)),
            evictions: AtomicU64::new(0),
            shards_made: AtomicU64::new(0),
        });
        MemoryStore::of(shared, rules, &[])
    }

    /// This store for another table of `rules` (`rules[i].id == i`): each limit of a rule of
    /// the same name with the same policy as one of this store's keeps its clients (the same
    /// shards, shared), every other starts empty. Clocks, bounds and counters carry on.
    pub fn for_rules(&self, rules: &[Rule]) -> MemoryStore {
        MemoryStore::of(self.inner.shared.clone(), rules, &self.inner.rules)
    }

    fn of(shared: Arc<Shared>, rules: &[Rule], kept: &[RuleBudgets]) -> MemoryStore {
        // A table has a rule at least (the general rule); a store for none still answers.
        let fallback = [Rule::new(
            0,
            "",
            Policy::TokenBucket(crate::algorithms::TokenBucket {
                capacity: 1,
                interval_us: 1_000_000,
            }),
        )];
        let rules = if rules.is_empty() { &fallback[..] } else { rules };
        let rules = rules
            .iter()
            .map(|rule| {
                let limits: Box<[Arc<LimitShards>]> = rule
                    .limits
                    .iter()
                    .map(|policy| {
                        kept.iter()
                            .flat_map(|held| held.limits.iter())
                            .find(|held| held.rule == rule.name && held.policy == *policy)
                            .cloned()
                            .unwrap_or_else(|| Arc::new(LimitShards::new(&shared, &rule.name, *policy)))
                    })
                    .collect();
                let mut lock_order: Vec<usize> = (0..limits.len()).collect();
                lock_order.sort_by_key(|&i| Arc::as_ptr(&limits[i]) as usize);
                RuleBudgets {
                    limits,
                    lock_order: lock_order.into_boxed_slice(),
                }
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner { rules, shared }),
        }
    }

    /// Whether every limit of `rule` (by id) holds the same shards here as in `other`: its
    /// budgets were kept from one table to the next.
    pub fn shares_rule_with(&self, other: &MemoryStore, rule: u16) -> bool {
        self.budgets(rule).limits.iter().all(|limit| {
            other
                .inner
                .rules
                .iter()
                .flat_map(|held| held.limits.iter())
                .any(|held| Arc::ptr_eq(held, limit))
        })
    }

    /// Microseconds since the Unix epoch on the store's clock.
    pub fn now_us(&self) -> u64 {
        let shared = &*self.inner.shared;
        let elapsed = u64::try_from(shared.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        shared.started_unix_us.saturating_add(elapsed)
    }

    /// Decide a request of `cost` for `client` under `rule`, now.
    pub fn check(&self, rule: &Rule, client: ClientKey, cost: Cost) -> Decision {
        // The clock is read under the shard lock, so one client's decisions see it in order.
        self.decide(rule, client, cost, || self.now_us())
    }

    /// Decide a request at an explicit time on the store's clock, for tests and benchmarks
    /// driving a clock of their own.
    pub fn check_at(&self, rule: &Rule, client: ClientKey, cost: Cost, now_us: u64) -> Decision {
        self.decide(rule, client, cost, || now_us)
    }

    fn decide(&self, rule: &Rule, client: ClientKey, cost: Cost, now_us: impl FnOnce() -> u64) -> Decision {
        let shared = &*self.inner.shared;
        let hash = shared.hasher.hash_one(client);
        let budgets = self.budgets(rule.id);
        // The caller's rule decides (the store's own is the same, but for tests that ask
        // with other numbers); the shards' policy judges what to purge and evict.
        let ([limit], [policy]) = (&*budgets.limits, &*rule.limits) else {
            return self.decide_all(rule, budgets, client, hash, cost, now_us);
        };
        let mut table = limit.shard(hash);
        let now_us = now_us();
        table.tick = table.tick.wrapping_add(1);
        if let Some(position) = table.find(hash, &client) {
            let tick = table.tick;
            let entry = &mut table.entries[position];
            entry.seen = tick;
            let decision = policy.check(&mut entry.state, now_us, cost);
            entry.refused = !decision.allowed;
            return Decision::one(decision);
        }
        let mut state = policy.fresh_state();
        let decision = policy.check(&mut state, now_us, cost);
        if decision.allowed {
            table.admit(shared, limit.policy, now_us, hash, client, state, false);
        }
        Decision::one(decision)
    }

    /// Decide under a rule of several limits, in one step: the client's shard of each held
    /// (in [`RuleBudgets::lock_order`]), each limit decided, and when one refuses, the cost
    /// each other took given back at once, so a refused request spends nothing in any. A
    /// client new to a limit gets its entry only when the request goes through.
    fn decide_all(
        &self,
        rule: &Rule,
        budgets: &RuleBudgets,
        client: ClientKey,
        hash: u64,
        cost: Cost,
        now_us: impl FnOnce() -> u64,
    ) -> Decision {
        let shared = &*self.inner.shared;
        let limits = &budgets.limits[..budgets.limits.len().min(rule.limits.len()).min(MAX_LIMITS)];
        let mut tables: [Option<MutexGuard<'_, Table>>; MAX_LIMITS] = Default::default();
        for &i in budgets.lock_order.iter().filter(|&&i| i < limits.len()) {
            tables[i] = Some(limits[i].shard(hash));
        }
        let now_us = now_us();
        // Each limit's decision, and where its state is: an entry's position, or a fresh
        // state not held yet.
        let mut parts = [LimitDecision::default(); MAX_LIMITS];
        let mut fresh: [Option<State>; MAX_LIMITS] = Default::default();
        let mut positions = [None::<usize>; MAX_LIMITS];
        for (i, (policy, table)) in rule.limits.iter().zip(tables.iter_mut()).enumerate() {
            let Some(table) = table else { continue };
            table.tick = table.tick.wrapping_add(1);
            let decision = match table.find(hash, &client) {
                Some(position) => {
                    let tick = table.tick;
                    let entry = &mut table.entries[position];
                    entry.seen = tick;
                    positions[i] = Some(position);
                    policy.check(&mut entry.state, now_us, cost)
                }
                None => {
                    let mut state = policy.fresh_state();
                    let decision = policy.check(&mut state, now_us, cost);
                    fresh[i] = Some(state);
                    decision
                }
            };
            parts[i] = decision;
        }
        let allowed = parts[..limits.len()].iter().all(|part| part.allowed);
        for (i, ((limit, policy), table)) in limits
            .iter()
            .zip(rule.limits.iter())
            .zip(tables.iter_mut())
            .enumerate()
        {
            let (Some(table), part) = (table, &mut parts[i]) else {
                continue;
            };
            match (positions[i], fresh[i].take()) {
                (Some(position), _) => {
                    let entry = &mut table.entries[position];
                    if !allowed && part.allowed {
                        // Allowed here, refused by another: as if never asked.
                        policy.refund(&mut entry.state, part.at_us, cost);
                        *part = policy.peek(&entry.state, now_us);
                    } else {
                        entry.refused = !part.allowed;
                    }
                }
                (None, Some(state)) if allowed => {
                    table.admit(shared, limit.policy, now_us, hash, client, state, false);
                }
                (None, _) if part.allowed => *part = policy.peek(&policy.fresh_state(), now_us),
                (None, _) => {}
            }
        }
        Decision::of(&parts[..limits.len()])
    }

    /// Give back `cost` taken by an allowed request counted at `at_us`, in each limit of
    /// `rule` (see [`Algorithm::refund`](crate::algorithms::Algorithm::refund)). `rule`
    /// may hold only some of the limits of the rule of its id (the gate gives a concurrency
    /// place back under a rule of that limit alone): each is found by its policy.
    pub fn refund(&self, rule: &Rule, client: ClientKey, cost: Cost, at_us: u64) {
        let hash = self.inner.shared.hasher.hash_one(client);
        let budgets = self.budgets(rule.id);
        let same = budgets.limits.len() == rule.limits.len();
        for (i, policy) in rule.limits.iter().enumerate() {
            let held = match same {
                true => budgets.limits.get(i),
                false => budgets.limits.iter().find(|limit| limit.policy == *policy),
            };
            let Some(limit) = held else {
                continue;
            };
            let mut table = limit.shard(hash);
            // A refund is not a sighting, so it leaves the stamp alone.
            if let Some(position) = table.find(hash, &client) {
                policy.refund(&mut table.entries[position].state, at_us, cost);
            }
        }
    }

    /// Spend `cost` of `client`'s budget under every limit of `rule` now, whatever is left,
    /// into debt if need be (see [`Algorithm::charge`](crate::algorithms::Algorithm::charge)).
    pub fn charge(&self, rule: &Rule, client: ClientKey, cost: Cost) {
        self.charge_at(rule, client, cost, self.now_us());
    }

    /// [`charge`](Self::charge) at an explicit time, for tests.
    pub fn charge_at(&self, rule: &Rule, client: ClientKey, cost: Cost, now_us: u64) {
        let shared = &*self.inner.shared;
        let hash = shared.hasher.hash_one(client);
        let budgets = self.budgets(rule.id);
        for policy in rule.limits.iter() {
            // `rule` may hold only some of the limits of the rule of its id, as for `refund`.
            let Some(limit) = budgets.limits.iter().find(|limit| limit.policy == *policy) else {
                continue;
            };
            let mut table = limit.shard(hash);
            table.tick = table.tick.wrapping_add(1);
            let seen = table.tick;
            match table.find(hash, &client) {
                Some(position) => {
                    let entry = &mut table.entries[position];
                    entry.seen = seen;
                    policy.charge(&mut entry.state, now_us, cost);
                }
                None => {
                    let mut state = policy.fresh_state();
                    policy.charge(&mut state, now_us, cost);
                    table.admit(shared, limit.policy, now_us, hash, client, state, false);
                }
            }
        }
    }

    /// Renew the leases taken at `at_us` (a request still in flight) in each limit of `rule`
    /// that has leases (see [`Algorithm::renew`](crate::algorithms::Algorithm::renew)),
    /// now; `rule` may hold only some of the limits of the rule of its id, as for [`refund`].
    ///
    /// [`refund`]: MemoryStore::refund
    pub fn renew(&self, rule: &Rule, client: ClientKey, at_us: u64) {
        self.renew_with(rule, client, at_us, || self.now_us());
    }

    /// [`renew`](Self::renew) at an explicit time on the store's clock, for tests.
    pub fn renew_at(&self, rule: &Rule, client: ClientKey, at_us: u64, now_us: u64) {
        self.renew_with(rule, client, at_us, || now_us);
    }

    fn renew_with(&self, rule: &Rule, client: ClientKey, at_us: u64, now_us: impl Fn() -> u64) {
        let hash = self.inner.shared.hasher.hash_one(client);
        let budgets = self.budgets(rule.id);
        for policy in rule.limits.iter() {
            let Some(limit) = budgets.limits.iter().find(|limit| limit.policy == *policy) else {
                continue;
            };
            let mut table = limit.shard(hash);
            // Read under the lock, as a decision reads it.
            let now_us = now_us();
            if let Some(position) = table.find(hash, &client) {
                policy.renew(&mut table.entries[position].state, at_us, now_us);
            }
        }
    }

    /// What `client` has left under `rule` at `now_us`, spending nothing and leaving the
    /// entries' stamps alone (an inspection is not a sighting).
    pub fn inspect_at(&self, rule: &Rule, client: ClientKey, now_us: u64) -> Decision {
        let hash = self.inner.shared.hasher.hash_one(client);
        let mut parts = [LimitDecision::default(); MAX_LIMITS];
        let limits = self.budgets(rule.id).limits.iter().zip(rule.limits.iter());
        let mut held = 0;
        for (part, (limit, policy)) in parts.iter_mut().zip(limits) {
            let table = limit.shard(hash);
            *part = match table.find(hash, &client) {
                Some(position) => policy.peek(&table.entries[position].state, now_us),
                None => policy.peek(&policy.fresh_state(), now_us),
            };
            held += 1;
        }
        Decision::of(&parts[..held])
    }

    /// Forget `client`'s state under each limit of `rule`: its next request finds the whole
    /// budget. Returns whether there was one.
    pub fn reset(&self, rule: &Rule, client: ClientKey) -> bool {
        let hasher = &self.inner.shared.hasher;
        let hash = hasher.hash_one(client);
        let mut held = false;
        for limit in self.budgets(rule.id).limits.iter() {
            let mut table = limit.shard(hash);
            if let Some(position) = table.find(hash, &client) {
                table.remove(position, hasher);
                held = true;
            }
        }
        held
    }

    /// Forget every client state whose budget under its limit is entirely back, as of now.
    /// Returns how many were dropped.
    pub fn purge_idle(&self) -> usize {
        self.purge_idle_at(self.now_us())
    }

    /// [`purge_idle`](Self::purge_idle) at an explicit time.
    pub fn purge_idle_at(&self, now_us: u64) -> usize {
        let hasher = &self.inner.shared.hasher;
        let mut purged = 0;
        for limit in self.inner.rules.iter().flat_map(|rule| rule.limits.iter()) {
            for shard in limit.shards.iter() {
                let mut table = lock(shard);
                // From the end, so the entry a removal moves into the hole was already judged.
                for position in (0..table.entries.len()).rev() {
                    if limit.policy.idle_at(&table.entries[position].state) <= now_us {
                        table.remove(position, hasher);
                        purged += 1;
                    }
                }
            }
        }
        purged
    }

    /// Hand every client state held to `visit`: its rule's id, the limit's position in the
    /// rule, the client, the state, and whether its last request was refused. One shard at a
    /// time, each locked only while its own clients are visited (what saving the store to a
    /// file reads, `stores::state_file`).
    pub fn visit_states(&self, mut visit: impl FnMut(u16, usize, &ClientKey, &State, bool)) {
        for (id, rule) in self.inner.rules.iter().enumerate() {
            // At most u16::MAX + 1 rules: ids are 16 bits.
            let id = id as u16;
            for (position, limit) in rule.limits.iter().enumerate() {
                for shard in limit.shards.iter() {
                    let table = lock(shard);
                    for entry in &table.entries {
                        visit(id, position, &entry.client, &entry.state, entry.refused);
                    }
                }
            }
        }
    }

    /// Hold `state` for `client` under limit `limit` (its position) of the rule with id
    /// `rule`, as a decision would have left it (a state read back from a file,
    /// `stores::state_file`): replacing the client's state if held, otherwise inserting it,
    /// evicting as a new client does when the shard is full, so the `MAX_KEYS` bound stays
    /// exact. Returns false, holding nothing, for a rule or limit the store was not built for.
    pub fn restore(&self, rule: u16, limit: usize, client: ClientKey, state: State, refused: bool) -> bool {
        let Some(shards) = self
            .inner
            .rules
            .get(usize::from(rule))
            .and_then(|rule| rule.limits.get(limit))
        else {
            return false;
        };
        let shared = &*self.inner.shared;
        let hash = shared.hasher.hash_one(client);
        let mut table = shards.shard(hash);
        table.tick = table.tick.wrapping_add(1);
        let seen = table.tick;
        if let Some(position) = table.find(hash, &client) {
            let entry = &mut table.entries[position];
            (entry.state, entry.refused, entry.seen) = (state, refused, seen);
            return true;
        }
        table.admit(shared, shards.policy, self.now_us(), hash, client, state, refused);
        true
    }

    /// How many client states are held.
    pub fn len(&self) -> usize {
        self.shards().map(|shard| lock(shard).entries.len()).sum()
    }

    /// Client states forgotten to stay within `MAX_KEYS`, since startup.
    pub fn evictions(&self) -> u64 {
        self.inner.shared.evictions.load(Ordering::Relaxed)
    }

    /// True when no client state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every shard, rule by rule, limit by limit.
    fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.inner
            .rules
            .iter()
            .flat_map(|rule| rule.limits.iter())
            .flat_map(|limit| limit.shards.iter())
    }

    /// The budgets of rule `id`. A rule the store was not built for (none is, but nothing
    /// here may panic) shares the last rule's budgets.
    fn budgets(&self, id: u16) -> &RuleBudgets {
        let rules = &self.inner.rules;
        &rules[usize::from(id).min(rules.len() - 1)]
    }
}

impl LimitShards {
    /// Empty shards for `policy` of the rule called `rule`, their capacities adding up to
    /// `MAX_KEYS`.
    fn new(shared: &Shared, rule: &Arc<str>, policy: Policy) -> LimitShards {
        let (max_keys, count) = (shared.max_keys, shared.shards_per_rule);
        let shards = (0..count)
            .map(|i| {
                // Spread the remainder over the first shards, so capacities add up exactly.
                let capacity = max_keys / count + usize::from(i < max_keys % count);
                // Positions are u32: a shard of more than 4 billion clients would need
                // hundreds of gigabytes, and holding fewer keeps the bound.
                let capacity = capacity.clamp(1, u32::MAX as usize);
                let seed = shared.shards_made.fetch_add(1, Ordering::Relaxed);
                Shard(Mutex::new(Table {
                    entries: Vec::with_capacity(capacity),
                    index: Index::with_capacity(capacity),
                    capacity,
                    tick: 0,
                    random: shared.hasher.hash_one(seed) | 1,
                }))
            })
            .collect();
        LimitShards {
            rule: rule.clone(),
            policy,
            shards,
        }
    }

    /// The shard that holds `hash`, locked.
    fn shard(&self, hash: u64) -> MutexGuard<'_, Table> {
        lock(&self.shards[shard_index(hash, self.shards.len())])
    }
}

/// The shard of `hash` among `shards` (a power of two): the top bits of the hash multiplied by
/// 2^64 / φ (Fibonacci hashing), which depend on all its bits. foldhash's own high bits are not
/// enough: for some seeds, nearby keys (consecutive addresses) leave whole shards empty while
/// others overflow, and a client in an overfull shard is evicted sooner than `MAX_KEYS` says.
fn shard_index(hash: u64, shards: usize) -> usize {
    let bits = shards.trailing_zeros();
    // Shard count 1: no bits to take (a shift by 64 would overflow).
    hash.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .checked_shr(64 - bits)
        .map_or(0, |index| index as usize)
}

impl Table {
    /// The position of `client`'s entry, if held.
    fn find(&self, hash: u64, client: &ClientKey) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash, |position| entries[position].client == *client)
    }

    /// Hold `client`'s `state`, not held yet, stamped with the shard's tick: when the shard
    /// is full, one of its clients is evicted first (see [`Table::evict`], judged by `policy`
    /// at `now_us`) and counted, so the `MAX_KEYS` bound stays exact.
    #[expect(
        clippy::too_many_arguments,
        reason = "the eviction's judge and the entry's parts, each what a caller has at hand"
    )]
    fn admit(
        &mut self,
        shared: &Shared,
        policy: Policy,
        now_us: u64,
        hash: u64,
        client: ClientKey,
        state: State,
        refused: bool,
    ) {
        if self.entries.len() >= self.capacity && self.evict(shared, policy, now_us) {
            shared.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let seen = self.tick;
        self.insert(
            hash,
            Entry {
                client,
                state,
                refused,
                seen,
            },
        );
    }

    /// Add an entry not held yet; the caller has made room.
    fn insert(&mut self, hash: u64, entry: Entry) {
        let position = self.entries.len();
        self.entries.push(entry);
        self.index.insert(hash, position);
    }

    /// Forget the entry at `position`; the last entry takes its place.
    fn remove(&mut self, position: usize, hasher: &DefaultHashBuilder) {
        let last = self.entries.len() - 1;
        self.index
            .remove(hasher.hash_one(self.entries[position].client), position);
        self.entries.swap_remove(position);
        if position != last {
            let hash = hasher.hash_one(self.entries[position].client);
            self.index.relocate(hash, last, position);
        }
    }

    /// Make room: of [`EVICTION_SAMPLE`] entries picked at random, forget the one that loses
    /// least (see the module docs): a refused client only if all the others are refused too,
    /// then the one whose budget is back soonest, and of those the least recently seen.
    /// Returns whether one was dropped.
    fn evict(&mut self, store: &Shared, policy: Policy, now_us: u64) -> bool {
        let len = self.entries.len();
        if len == 0 {
            return false;
        }
        // Consecutive positions from a random start: distinct entries, in no meaningful order.
        let start = self.next_random() % len;
        let tick = self.tick;
        let victim = (0..EVICTION_SAMPLE.min(len))
            .map(|offset| (start + offset) % len)
            .min_by_key(|&position| {
                let entry = &self.entries[position];
                let idle_at = policy.idle_at(&entry.state);
                // A refused client whose budget has come back since loses nothing either.
                let limited = entry.refused && idle_at > now_us;
                (limited, idle_at, Reverse(tick.wrapping_sub(entry.seen)))
            });
        match victim {
            Some(position) => {
                self.remove(position, &store.hasher);
                true
            }
            None => false,
        }
    }

    /// xorshift64: cheap, and good enough to spread a sample over the shard.
    fn next_random(&mut self) -> usize {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        (x >> 32) as usize
    }
}

/// Positions in a bucket: with their tags and the overflow count, one cache line.
const SLOTS: usize = 12;

/// One cache line of an [`Index`]: up to [`SLOTS`] positions, each with a tag (eight bits of
/// its entry's hash, never 0), so a lookup compares the one entry whose tag matches (and 1 in
/// 255 others), and reads no other line of the index unless its bucket has overflowed.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    /// Tag of each slot; 0 marks a free slot.
    tags: [u8; SLOTS],
    /// Position in `entries` of each slot that has a tag.
    positions: [u32; SLOTS],
    /// How many entries whose home is this bucket or one before it are held in a later one
    /// (a lookup that misses here goes on only if this is not 0). Sticks at `u16::MAX`
    /// rather than wrapping, which costs a longer search, never a lost entry.
    overflow: u16,
}

impl Bucket {
    const FREE: Bucket = Bucket {
        tags: [0; SLOTS],
        positions: [0; SLOTS],
        overflow: 0,
    };

    /// The slots whose tag is `tag`, one bit each, found without a branch per slot.
    fn matching(&self, tag: u8) -> u16 {
        let mut mask = 0;
        for (slot, &t) in self.tags.iter().enumerate() {
            mask |= u16::from(t == tag) << slot;
        }
        mask
    }
}

/// An open-addressing table of positions in a shard's `entries`, in buckets of one cache line
/// (after folly's F14 "vector" tables): a position lives in its hash's home bucket or,
/// when that is full, in the next bucket with a free slot, and every bucket it passes counts it
/// in `overflow`. Removal frees the slot and uncounts it, so there are no tombstones, and the
/// table, sized once at a quarter more slots than the shard's capacity, never fills or grows.
struct Index {
    buckets: Box<[Bucket]>,
}

impl Index {
    /// An index for up to `capacity` positions.
    fn with_capacity(capacity: usize) -> Index {
        let buckets = (capacity + capacity / 4).div_ceil(SLOTS).max(1);
        Index {
            buckets: vec![Bucket::FREE; buckets].into_boxed_slice(),
        }
    }

    /// The home bucket of `hash` (its low 32 bits, spread over the buckets by a multiply:
    /// any bucket count works) and its tag (its top 8 bits, 0 made 1).
    fn home(&self, hash: u64) -> (usize, u8) {
        let bucket = ((hash & 0xFFFF_FFFF) * self.buckets.len() as u64) >> 32;
        (bucket as usize, ((hash >> 56) as u8).max(1))
    }

    fn next(&self, bucket: usize) -> usize {
        if bucket + 1 == self.buckets.len() {
            0
        } else {
            bucket + 1
        }
    }

    /// The first position of `hash` for which `is_match` holds.
    fn find(&self, hash: u64, is_match: impl FnMut(usize) -> bool) -> Option<usize> {
        self.probe(hash, is_match)
            .map(|(at, slot)| self.buckets[at].positions[slot] as usize)
    }

    /// The bucket and slot of the first position of `hash` for which `is_match` holds.
    #[inline]
    fn probe(&self, hash: u64, mut is_match: impl FnMut(usize) -> bool) -> Option<(usize, usize)> {
        let (mut at, tag) = self.home(hash);
        // Bounded: were every bucket's overflow count above 0, the search would come round.
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[at];
            let mut slots = bucket.matching(tag);
            while slots != 0 {
                let slot = slots.trailing_zeros() as usize;
                if is_match(bucket.positions[slot] as usize) {
                    return Some((at, slot));
                }
                slots &= slots - 1;
            }
            if bucket.overflow == 0 {
                return None;
            }
            at = self.next(at);
        }
        None
    }

    /// Add `position` under `hash`. The index has more slots than the shard has entries, so a
    /// free slot is always found.
    fn insert(&mut self, hash: u64, position: usize) {
        let (mut at, tag) = self.home(hash);
        // One lap at most: there is always a free slot (see above).
        for _ in 0..self.buckets.len() {
            let bucket = &mut self.buckets[at];
            if let Some(slot) = bucket.tags.iter().position(|&t| t == 0) {
                bucket.tags[slot] = tag;
                bucket.positions[slot] = position as u32;
                return;
            }
            bucket.overflow = bucket.overflow.saturating_add(1);
            at = self.next(at);
        }
        debug_assert!(false, "the index had no free slot for a new position");
    }

    /// The bucket and slot holding `position` under `hash`.
    fn slot_of(&self, hash: u64, position: usize) -> Option<(usize, usize)> {
        self.probe(hash, |held| held == position)
    }

    /// Forget `position`, held under `hash`.
    fn remove(&mut self, hash: u64, position: usize) {
        let Some((found, slot)) = self.slot_of(hash, position) else {
            debug_assert!(false, "removing a position the index does not hold");
            return;
        };
        self.buckets[found].tags[slot] = 0;
        // Uncount it in the buckets it passed.
        let (mut at, _) = self.home(hash);
        while at != found {
            let overflow = &mut self.buckets[at].overflow;
            if *overflow != u16::MAX {
                *overflow -= 1;
            }
            at = self.next(at);
        }
    }

    /// `from`, held under `hash`, is now at position `to`.
    fn relocate(&mut self, hash: u64, from: usize, to: usize) {
        match self.slot_of(hash, from) {
            Some((at, slot)) => self.buckets[at].positions[slot] = to as u32,
            None => debug_assert!(false, "moving a position the index does not hold"),
        }
    }

    /// How many positions are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets
            .iter()
            .map(|bucket| bucket.tags.iter().filter(|&&t| t != 0).count())
            .sum()
    }
}

/// A shard's table, locked. `parking_lot`'s mutex does not poison: no code panics while
/// holding a shard lock, and should one ever, the shard's clients are still served.
fn lock(shard: &Shard) -> MutexGuard<'_, Table> {
    shard.0.lock()
}

/// The memory store never fails and never waits: every answer is [`Decide::Ready`].
impl Store for MemoryStore {
    fn check<'a>(&'a self, rule: &'a Rule, client: ClientKey, cost: Cost) -> Decide<'a, Verdict> {
        Decide::ready(Verdict::Decided(MemoryStore::check(self, rule, client, cost)))
    }

    fn refund<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        if let Verdict::Decided(decision) = verdict {
            MemoryStore::refund(self, rule, client, cost, decision.at_us);
        }
        Decide::ready(())
    }

    fn renew<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        _cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        if let Verdict::Decided(decision) = verdict {
            MemoryStore::renew(self, rule, client, decision.at_us);
        }
        Decide::ready(())
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<Decision, StoreError>> {
        Decide::ready(Ok(self.inspect_at(rule, client, self.now_us())))
    }

    fn charge<'a>(
        &'a self,
        rule: &'a Rule,
        client: ClientKey,
        cost: Cost,
        verdict: &Verdict,
    ) -> Decide<'a, ()> {
        if let Verdict::Decided(_) = verdict {
            MemoryStore::charge(self, rule, client, cost);
        }
        Decide::ready(())
    }

    fn reset<'a>(&'a self, rule: &'a Rule, client: ClientKey) -> Decide<'a, Result<bool, StoreError>> {
        Decide::ready(Ok(MemoryStore::reset(self, rule, client)))
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            kind: "memory",
            clients: self.len(),
            evictions: self.evictions(),
            ..StoreStats::default()
        }
    }

    fn purge_idle(&self) -> usize {
        MemoryStore::purge_idle(self)
    }

    fn for_rules(&self, rules: &[Rule]) -> Arc<dyn Store> {
        Arc::new(MemoryStore::for_rules(self, rules))
    }

    fn memory(&self) -> Option<&MemoryStore> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Policy;
    use crate::algorithms::{FixedWindow, Limits, SlidingWindow, TokenBucket};
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    const GENERAL: u16 = 0;
    const AUTH: u16 = 1;

    fn rule(id: u16, capacity: u64) -> Rule {
        let policy = Policy::TokenBucket(TokenBucket {
            capacity,
            interval_us: 1_000_000,
        });
        Rule::new(id, if id == GENERAL { "general" } else { "auth" }, policy)
    }

    fn ip(n: u32) -> ClientKey {
        IpAddr::V4(Ipv4Addr::from(n)).into()
    }

    fn store(max_keys: usize) -> MemoryStore {
        MemoryStore::new(
            NonZeroUsize::new(max_keys).unwrap(),
            &[rule(GENERAL, 1), rule(AUTH, 1)],
        )
    }

    #[test]
    fn rules_and_clients_have_separate_budgets() {
        let store = store(100);
        let general = rule(GENERAL, 2);
        let auth = rule(AUTH, 1);
        assert!(store.check_at(&auth, ip(1), Cost::ONE, 0).allowed);
        assert!(!store.check_at(&auth, ip(1), Cost::ONE, 0).allowed);
        assert!(store.check_at(&auth, ip(2), Cost::ONE, 0).allowed);
        assert_eq!(store.check_at(&general, ip(1), Cost::ONE, 0).remaining, 1);
    }

    #[test]
    fn the_bound_holds_under_a_flood_and_evicts_the_idlest() {
        let max_keys = 1_000;
        let store = store(max_keys);
        let r = rule(GENERAL, 1);
        // The first client spends its budget, then 10x max_keys strangers arrive.
        assert!(store.check_at(&r, ip(0), Cost::ONE, 0).allowed);
        for n in 1..=(10 * max_keys as u32) {
            store.check_at(&r, ip(n), Cost::ONE, 0);
            assert!(store.len() <= max_keys);
        }
        assert!(
            store.len() > max_keys / 2,
            "capacity is used, got {}",
            store.len()
        );
        // The first client was the idlest, so it was forgotten and starts full again.
        assert!(store.check_at(&r, ip(0), Cost::ONE, 0).allowed);
    }

    #[test]
    fn a_flood_of_identities_cannot_reset_a_limited_client() {
        let max_keys = 1_000;
        let store = store(max_keys);
        let r = rule(GENERAL, 10);
        // A client spends its whole budget (full again in 10 s), then goes quiet while 10x
        // max_keys strangers each spend one token (full again in 1 s).
        assert!(store.check_at(&r, ip(0), Cost::saturating(10), 0).allowed);
        for n in 1..=(10 * max_keys as u32) {
            store.check_at(&r, ip(n), Cost::ONE, u64::from(n));
        }
        assert!(store.evictions() > 0);
        assert!(
            !store.check_at(&r, ip(0), Cost::ONE, 20_000).allowed,
            "still limited"
        );
    }

    #[test]
    fn a_store_for_the_next_table_keeps_the_budgets_of_unchanged_rules_only() {
        let store = store(1_000);
        let (general, auth) = (rule(GENERAL, 1), rule(AUTH, 1));
        assert!(store.check_at(&general, ip(1), Cost::ONE, 0).allowed);
        assert!(store.check_at(&auth, ip(1), Cost::ONE, 0).allowed);
        // A route comes first now (ids move), auth gets other numbers, general is as it was.
        let route = Rule::new(0, "api", general.limits.clone());
        let general_after = Rule {
            id: 2,
            ..general.clone()
        };
        let auth_after = Rule::new(1, "auth", rule(AUTH, 5).limits);
        let next = store.for_rules(&[route.clone(), auth_after.clone(), general_after.clone()]);
        assert!(
            !next.check_at(&general_after, ip(1), Cost::ONE, 0).allowed,
            "budget kept"
        );
        assert!(
            next.check_at(&auth_after, ip(1), Cost::ONE, 0).allowed,
            "a changed rule starts afresh"
        );
        assert!(
            next.check_at(&route, ip(1), Cost::ONE, 0).allowed,
            "a new rule starts afresh"
        );
        assert!(next.shares_rule_with(&store, 2) && !next.shares_rule_with(&store, 1));
        // The table before sees the same budget: a request still deciding under it agrees.
        assert!(!store.check_at(&general, ip(1), Cost::ONE, 0).allowed);
        assert_eq!(next.len(), 3, "the old auth state is not the new table's");
    }

    #[test]
    fn tiny_bounds_are_exact() {
        for max_keys in [1, 2, 3, 7, 65, 130] {
            let store = store(max_keys);
            let r = rule(GENERAL, 1);
            for n in 0..1_000 {
                store.check_at(&r, ip(n), Cost::ONE, 0);
            }
            assert!(store.len() <= max_keys, "max_keys={max_keys}");
        }
    }

    #[test]
    fn purge_drops_exactly_the_refilled_clients() {
        let tb = rule(GENERAL, 2);
        let sw = Rule::new(
            AUTH,
            "auth",
            Policy::SlidingWindow(SlidingWindow {
                limit: 5,
                window_ms: 10_000,
            }),
        );
        // Room for 156 clients a shard: with 100 (1 or 2 a shard), two of these three clients
        // met in a shard of one about one run in a hundred, and one evicted the other.
        let store = MemoryStore::new(NonZeroUsize::new(10_000).unwrap(), &[tb.clone(), sw.clone()]);
        store.check_at(&tb, ip(1), Cost::ONE, 0); // full again at 1 s
        store.check_at(&tb, ip(2), Cost::saturating(2), 0); // full again at 2 s
        store.check_at(&sw, ip(1), Cost::ONE, 0); // forgotten at 20 s
        assert_eq!(store.purge_idle_at(1_500_000), 1);
        assert_eq!(store.len(), 2);
        assert_eq!(store.purge_idle_at(19_999_999), 1);
        assert_eq!(store.purge_idle_at(20_000_000), 1);
        assert!(store.is_empty());
    }

    /// Every entry is found at its own position, the index holds nothing else, it has not
    /// grown, and each bucket's overflow count is exactly the entries that passed it.
    fn assert_consistent(store: &MemoryStore, buckets: &[usize]) {
        for (shard, &buckets) in store.shards().zip(buckets) {
            let table = lock(shard);
            let index = &table.index;
            assert_eq!(index.len(), table.entries.len());
            assert!(table.entries.len() <= table.capacity);
            assert_eq!(index.buckets.len(), buckets, "the index never grows");
            let mut overflow = vec![0u16; buckets];
            for (position, entry) in table.entries.iter().enumerate() {
                let hash = store.inner.shared.hasher.hash_one(entry.client);
                assert_eq!(table.find(hash, &entry.client), Some(position));
                let (found, _) = index.slot_of(hash, position).unwrap();
                let (mut at, _) = index.home(hash);
                while at != found {
                    overflow[at] += 1;
                    at = index.next(at);
                }
            }
            let counted: Vec<u16> = index.buckets.iter().map(|b| b.overflow).collect();
            assert_eq!(counted, overflow);
        }
    }

    #[test]
    fn the_index_follows_evictions_purges_and_churn() {
        let store = store(1_000);
        let buckets: Vec<usize> = store
            .shards()
            .map(|shard| lock(shard).index.buckets.len())
            .collect();
        let (general, auth) = (rule(GENERAL, 3), rule(AUTH, 1));
        // 50x max_keys clients: every shard is emptied and refilled many times over, by
        // evictions and by purges, under two rules.
        for n in 0..50_000u32 {
            let now = u64::from(n) * 100;
            store.check_at(&general, ip(n), Cost::saturating(1 + u64::from(n % 3)), now);
            if n % 7 == 0 {
                store.check_at(&auth, ip(n), Cost::ONE, now);
            }
            if n % 5_000 == 0 {
                store.purge_idle_at(now);
                assert_consistent(&store, &buckets);
            }
        }
        assert!(store.evictions() > 40_000);
        assert_consistent(&store, &buckets);
        // A client still held keeps its own budget: the last one spent 2 of 3 tokens.
        let last = 49_999;
        assert_eq!(
            store.check_at(&general, ip(last), Cost::ONE, 4_999_900).remaining,
            0
        );
        // Everything is idle at the end of time.
        let held = store.len();
        assert_eq!(store.purge_idle_at(u64::MAX), held);
        assert!(store.is_empty());
        assert_consistent(&store, &buckets);
    }

    #[test]
    fn a_full_index_overflows_and_wraps_around_without_losing_an_entry() {
        // One shard whose index has no slack at all (3 buckets for 36 entries): buckets
        // overflow into the next, the last into the first, and churn keeps moving them.
        let store = store(1);
        let capacity = 3 * SLOTS;
        *lock(&store.inner.rules[0].limits[0].shards[0]) = Table {
            entries: Vec::with_capacity(capacity),
            index: Index {
                buckets: vec![Bucket::FREE; 3].into_boxed_slice(),
            },
            capacity,
            tick: 0,
            random: 1,
        };
        let r = rule(GENERAL, 2);
        for n in 0..20_000 {
            store.check_at(&r, ip(n), Cost::ONE, u64::from(n));
            if n % 1_000 == 0 {
                assert_consistent(&store, &[3]);
            }
        }
        assert_eq!(store.len(), capacity);
        assert_consistent(&store, &[3]);
        // Every entry held is still found: a second request spends its last token.
        let held: Vec<ClientKey> = lock(&store.inner.rules[0].limits[0].shards[0])
            .entries
            .iter()
            .map(|entry| entry.client)
            .collect();
        for client in held {
            assert_eq!(store.check_at(&r, client, Cost::ONE, 19_999).remaining, 0);
        }
    }

    #[test]
    fn nearby_clients_spread_over_every_shard_whatever_the_seed() {
        // 500 consecutive addresses over 32 shards: about 15.6 each. For about one foldhash
        // seed in ten the hash's own high bits left shards empty; none may now. (Uniformly
        // random shards leave one empty with a chance of 1 in 4,000 over these 50 seeds.)
        for _ in 0..50 {
            let hasher = DefaultHashBuilder::default();
            let mut counts = [0u32; 32];
            for n in 0..500 {
                counts[shard_index(hasher.hash_one((GENERAL, ip(0x0A00_0000 + n))), 32)] += 1;
            }
            assert!(counts.iter().all(|&count| count > 0), "{counts:?}");
        }
        assert_eq!(shard_index(u64::MAX, 1), 0);
    }

    #[test]
    fn an_entry_stays_80_bytes() {
        // The refused flag sits in what was padding: the memory per client is unchanged.
        assert_eq!(std::mem::size_of::<Entry>(), 80);
    }

    #[test]
    fn a_decision_stays_small_to_move() {
        // Every request's future carries one: a rule of several limits keeps its parts
        // behind a pointer (docs/benchmarks.md, part 17).
        assert_eq!(std::mem::size_of::<Decision>(), 80);
    }

    #[test]
    fn a_flood_on_one_rule_never_evicts_another_rules_clients() {
        for max_keys in [1, 16, 1_000] {
            let store = store(max_keys);
            let (general, auth) = (rule(GENERAL, 100), rule(AUTH, 1));
            assert!(store.check_at(&auth, ip(0), Cost::ONE, 0).allowed);
            assert!(!store.check_at(&auth, ip(0), Cost::ONE, 0).allowed);
            for n in 1..=(100 * max_keys as u32) {
                store.check_at(&general, ip(n), Cost::ONE, 0);
            }
            assert!(
                !store.check_at(&auth, ip(0), Cost::ONE, 1).allowed,
                "max_keys={max_keys}"
            );
        }
    }

    #[test]
    fn a_refused_client_outlives_a_flood_of_allowed_ones_on_its_own_rule() {
        // A shard of 16 (one shard: fewer than 128 keys), sampled 8 at a time.
        let store = store(16);
        let r = rule(GENERAL, 2);
        for _ in 0..2 {
            assert!(store.check_at(&r, ip(0), Cost::ONE, 0).allowed);
        }
        assert!(!store.check_at(&r, ip(0), Cost::ONE, 0).allowed);
        // 100x MAX_KEYS strangers, each spending its whole budget (as far back as the
        // victim's), but allowed.
        for n in 1..=1_600u32 {
            store.check_at(&r, ip(n), Cost::saturating(2), 0);
        }
        assert!(store.evictions() >= 1_500);
        assert!(!store.check_at(&r, ip(0), Cost::ONE, 1).allowed, "still refused");
    }

    #[test]
    fn a_denial_creates_no_entry() {
        let store = store(10);
        store.check_at(&rule(GENERAL, 1), ip(1), Cost::saturating(5), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn inspecting_spends_nothing_and_a_reset_gives_the_whole_budget_back() {
        let store = store(1024);
        let general = rule(GENERAL, 3);
        let now = store.now_us();
        assert_eq!(
            store.inspect_at(&general, ip(1), now).remaining,
            3,
            "never seen: all of it"
        );
        assert!(store.is_empty(), "an inspection creates no entry");
        for _ in 0..2 {
            assert!(store.check_at(&general, ip(1), Cost::ONE, now).allowed);
        }
        for _ in 0..5 {
            assert_eq!(store.inspect_at(&general, ip(1), now).remaining, 1);
        }
        assert!(
            store.check_at(&general, ip(1), Cost::ONE, now).allowed,
            "the inspections took nothing"
        );
        assert!(!store.check_at(&general, ip(1), Cost::ONE, now).allowed);
        assert_eq!(store.inspect_at(&general, ip(1), now).remaining, 0);
        assert!(store.reset(&general, ip(1)));
        assert!(!store.reset(&general, ip(1)), "nothing left to reset");
        assert_eq!(store.inspect_at(&general, ip(1), now).remaining, 3);
        assert!(store.check_at(&general, ip(1), Cost::ONE, now).allowed);
    }

    /// A burst of 3 tokens refilling 1/s and a quota of 5 per 100 s: a rule of two limits.
    fn two_limits(id: u16, name: &str) -> Rule {
        let burst = Policy::TokenBucket(TokenBucket {
            capacity: 3,
            interval_us: 1_000_000,
        });
        let quota = Policy::FixedWindow(FixedWindow {
            limit: 5,
            window_ms: 100_000,
        });
        Rule::new(id, name, Limits::new(vec![burst, quota]).unwrap())
    }

    const S: u64 = 1_000_000;

    #[test]
    fn every_limit_must_allow_and_a_refusal_spends_in_none() {
        let rule = two_limits(0, "api");
        let store = MemoryStore::new(NonZeroUsize::new(100).unwrap(), std::slice::from_ref(&rule));
        let at = 1_000 * 100 * S;
        // The burst refuses the fourth at once; the quota had room, and keeps it.
        for n in 0..3 {
            let decision = store.check_at(&rule, ip(1), Cost::ONE, at);
            assert!(decision.allowed, "request {n}");
            assert_eq!(decision.parts()[0].remaining, 2 - n);
            assert_eq!(decision.parts()[1].remaining, 4 - n);
        }
        let refused = store.check_at(&rule, ip(1), Cost::ONE, at);
        assert!(!refused.allowed);
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(1),
            "the burst's retry time"
        );
        assert_eq!(refused.limit, 3, "described: the limit that refused");
        assert_eq!(
            (refused.parts()[0].allowed, refused.parts()[1].allowed),
            (false, true)
        );
        assert_eq!(refused.parts()[1].remaining, 2, "the quota spent nothing on it");
        // Two more pass as the burst refills; then the quota refuses, until its window ends.
        assert!(store.check_at(&rule, ip(1), Cost::ONE, at + S).allowed);
        let last = store.check_at(&rule, ip(1), Cost::ONE, at + 2 * S);
        assert!(last.allowed);
        assert_eq!(
            (last.limit, last.remaining),
            (5, 0),
            "described: the closest to exhaustion"
        );
        let over = store.check_at(&rule, ip(1), Cost::ONE, at + 3 * S);
        assert!(!over.allowed);
        assert_eq!(
            over.retry_after,
            Duration::from_secs(97),
            "the quota's window ends at 100 s"
        );
        assert!(
            over.parts()[0].allowed && over.parts()[0].remaining == 1,
            "the burst gave its token back"
        );
        // Both refuse: the later retry time is the rule's.
        for _ in 0..2 {
            assert!(!store.check_at(&rule, ip(1), Cost::ONE, at + 3 * S).allowed);
        }
        let inspected = store.inspect_at(&rule, ip(1), at + 3 * S);
        assert_eq!(
            inspected.parts()[0].remaining,
            1,
            "refusals left the burst as it was"
        );
        assert_eq!(inspected.parts()[1].remaining, 0);
        assert!(
            store.check_at(&rule, ip(1), Cost::ONE, at + 100 * S).allowed,
            "a new window"
        );
    }

    #[test]
    fn a_refused_first_request_leaves_no_entry_in_any_limit() {
        let rule = two_limits(0, "api");
        let store = MemoryStore::new(NonZeroUsize::new(100).unwrap(), std::slice::from_ref(&rule));
        assert!(
            !store.check_at(&rule, ip(1), Cost::saturating(4), 0).allowed,
            "above the burst's capacity"
        );
        assert!(store.is_empty());
        assert_eq!(store.inspect_at(&rule, ip(1), 0).parts()[1].remaining, 5);
    }

    #[test]
    fn each_limit_keeps_its_budget_across_tables_by_its_own_policy() {
        let rule = two_limits(0, "api");
        let store = MemoryStore::new(NonZeroUsize::new(100).unwrap(), std::slice::from_ref(&rule));
        for _ in 0..3 {
            assert!(store.check_at(&rule, ip(1), Cost::ONE, 0).allowed);
        }
        // The limits reordered, and a third added: the two kept, the new one fresh.
        let third = Policy::SlidingWindow(SlidingWindow {
            limit: 100,
            window_ms: 1_000,
        });
        let reordered = Rule::new(
            0,
            "api",
            Limits::new(vec![rule.limits[1], third, rule.limits[0]]).unwrap(),
        );
        let next = store.for_rules(std::slice::from_ref(&reordered));
        let decision = next.inspect_at(&reordered, ip(1), 0);
        let remaining: Vec<u64> = decision.parts().iter().map(|part| part.remaining).collect();
        assert_eq!(remaining, [2, 100, 0]);
        assert!(
            !next.check_at(&reordered, ip(1), Cost::ONE, 0).allowed,
            "the burst still refuses"
        );
        // Decisions under the old order and the new one at once never wait on each other.
        std::thread::scope(|scope| {
            for (store, rule) in [(&store, &rule), (&next, &reordered)] {
                scope.spawn(move || {
                    for n in 0..20_000u32 {
                        store.check_at(rule, ip(n % 7), Cost::ONE, u64::from(n) * S);
                    }
                });
            }
        });
    }
}
