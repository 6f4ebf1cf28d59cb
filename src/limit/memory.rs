//! The in-process store: client states in a fixed number of shards, each a small LRU map
//! behind its own mutex.
//!
//! Sharding keeps two requests from different clients off the same lock. When a shard is full,
//! a new client evicts one of the [`EVICTION_SAMPLE`] least recently seen: the one whose budget
//! is closest to entirely back, which loses the least information. So the `MAX_KEYS` bound
//! costs nothing on the hot path, a flood of invented identities cannot grow memory, and it
//! cannot hand a limited client (whose budget is far from back) a fresh budget either: the
//! flood's own entries, each having spent a little, go first. A decision for a known
//! client allocates nothing. Entries whose budget has fully come back are dropped by
//! [`MemoryStore::purge_idle`], which the server runs periodically.

use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use lru::LruCache;
use tokio::time::Instant;

use crate::limit::{ClientKey, Decision, Policy, Rule, State};

/// A client's budget is identified by its rule's position in the table and its key.
type EntryKey = (u16, ClientKey);

type Shard = Mutex<LruCache<EntryKey, State>>;

/// Most shards a store is cut into: enough that 2 to 64 cores rarely meet on a lock.
const MAX_SHARDS: usize = 64;

/// How many of a full shard's least recently seen clients are candidates for eviction.
pub const EVICTION_SAMPLE: usize = 8;

/// The in-memory store. Cheap to clone: clones share the same table.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Client states; a key lives in exactly one shard, chosen by `hasher`.
    shards: Box<[Shard]>,
    /// Picks the shard: the maps' own hasher (foldhash), a few times cheaper than SipHash and
    /// randomly seeded per process, so clients cannot aim at one shard.
    hasher: lru::DefaultHasher,
    /// The store's clock: microseconds since the Unix epoch, read from the monotonic clock
    /// (tokio's, so tests can pause it) anchored once to wall-clock time at `started`. Never
    /// steps back, and fixed windows align to the epoch as they do in Redis.
    started: Instant,
    /// Unix time in microseconds at `started`.
    started_unix_us: u64,
    /// Client states forgotten to stay within `MAX_KEYS`, since startup.
    evictions: AtomicU64,
    /// The policy of each rule, by rule id: what purging and eviction judge states by.
    policies: Box<[Policy]>,
}

impl MemoryStore {
    /// A store holding at most `max_keys` client states (per rule and client) in total, for
    /// the rules of one table (`rules[i].id == i`).
    pub fn new(max_keys: NonZeroUsize, rules: &[Rule]) -> Self {
        let max_keys = max_keys.get();
        // A power of two no larger than max_keys, so every shard holds at least one entry.
        let shard_count = MAX_SHARDS.min(1 << max_keys.ilog2());
        let shards = (0..shard_count)
            .map(|i| {
                // Spread the remainder over the first shards, so capacities add up exactly.
                let capacity = max_keys / shard_count + usize::from(i < max_keys % shard_count);
                let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
                Mutex::new(LruCache::new(capacity))
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                hasher: Default::default(),
                started: Instant::now(),
                started_unix_us: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX)),
                evictions: AtomicU64::new(0),
                policies: rules.iter().map(|rule| rule.policy).collect(),
            }),
        }
    }

    /// Microseconds since the Unix epoch on the store's clock.
    pub fn now_us(&self) -> u64 {
        let elapsed = u64::try_from(self.inner.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.inner.started_unix_us.saturating_add(elapsed)
    }

    /// Decide a request of `cost` for `client` under `rule`, now.
    pub fn check(&self, rule: &Rule, client: ClientKey, cost: u64) -> Decision {
        // The clock is read under the shard lock, so one client's decisions see it in order.
        self.decide(rule, client, cost, || self.now_us())
    }

    /// Decide a request at an explicit time on the store's clock, for tests and benchmarks
    /// driving a clock of their own.
    pub fn check_at(&self, rule: &Rule, client: ClientKey, cost: u64, now_us: u64) -> Decision {
        self.decide(rule, client, cost, || now_us)
    }

    fn decide(&self, rule: &Rule, client: ClientKey, cost: u64, now_us: impl FnOnce() -> u64) -> Decision {
        let key = (rule.id, client);
        let mut table = self.shard(&key);
        let now_us = now_us();
        match table.get_mut(&key) {
            Some(state) => rule.policy.check(state, now_us, cost),
            None => {
                let mut state = rule.policy.fresh_state();
                let decision = rule.policy.check(&mut state, now_us, cost);
                if decision.allowed {
                    if table.len() == table.cap().get() {
                        self.evict(&mut table);
                    }
                    table.push(key, state);
                }
                decision
            }
        }
    }

    /// Give back `cost` taken by an allowed request counted at `at_us` (see
    /// [`Algorithm::refund`](crate::limit::algorithm::Algorithm::refund)).
    pub fn refund(&self, rule: &Rule, client: ClientKey, cost: u64, at_us: u64) {
        let key = (rule.id, client);
        // `peek_mut`: a refund is not a sighting, so it leaves the eviction order alone.
        if let Some(state) = self.shard(&key).peek_mut(&key) {
            rule.policy.refund(state, at_us, cost);
        }
    }

    /// Make room in a full shard: of its [`EVICTION_SAMPLE`] least recently seen clients,
    /// forget the one whose budget is back soonest (a state under a rule the store does not
    /// know counts as back already).
    fn evict(&self, table: &mut LruCache<EntryKey, State>) {
        let victim = table
            .iter()
            .rev()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(key, state)| self.idle_at(key.0, state))
            .map(|(key, _)| *key);
        if let Some(victim) = victim {
            table.pop(&victim);
            self.inner.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn idle_at(&self, rule: u16, state: &State) -> u64 {
        self.inner
            .policies
            .get(usize::from(rule))
            .map_or(0, |policy| policy.idle_at(state))
    }

    /// Forget every client whose budget under its rule is entirely back, as of now. Returns
    /// how many were dropped.
    pub fn purge_idle(&self) -> usize {
        self.purge_idle_at(self.now_us())
    }

    /// [`purge_idle`](Self::purge_idle) at an explicit time.
    pub fn purge_idle_at(&self, now_us: u64) -> usize {
        let mut idle = Vec::new();
        let mut purged = 0;
        for shard in self.inner.shards.iter() {
            let mut table = lock(shard);
            idle.extend(
                table
                    .iter()
                    .filter(|(key, state)| self.idle_at(key.0, state) <= now_us)
                    .map(|(key, _)| *key),
            );
            for key in idle.drain(..) {
                table.pop(&key);
                purged += 1;
            }
        }
        purged
    }

    /// How many client states are held.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Client states forgotten to stay within `MAX_KEYS`, since startup.
    pub fn evictions(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }

    /// True when no client state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &EntryKey) -> MutexGuard<'_, LruCache<EntryKey, State>> {
        let hash = self.inner.hasher.hash_one(key);
        // Shard count is a power of two; the high bits are the best mixed.
        let index = (hash >> 32) as usize & (self.inner.shards.len() - 1);
        lock(&self.inner.shards[index])
    }
}

/// No code panics while holding a shard lock, but a poisoned shard is still consistent
/// (every update is a single assignment), so keep serving from it.
fn lock(shard: &Shard) -> MutexGuard<'_, LruCache<EntryKey, State>> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Policy;
    use crate::limit::algorithm::{SlidingWindow, TokenBucket};
    use std::net::{IpAddr, Ipv4Addr};

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
        assert!(store.check_at(&auth, ip(1), 1, 0).allowed);
        assert!(!store.check_at(&auth, ip(1), 1, 0).allowed);
        assert!(store.check_at(&auth, ip(2), 1, 0).allowed);
        assert_eq!(store.check_at(&general, ip(1), 1, 0).remaining, 1);
    }

    #[test]
    fn the_bound_holds_under_a_flood_and_evicts_the_idlest() {
        let max_keys = 1_000;
        let store = store(max_keys);
        let r = rule(GENERAL, 1);
        // The first client spends its budget, then 10x max_keys strangers arrive.
        assert!(store.check_at(&r, ip(0), 1, 0).allowed);
        for n in 1..=(10 * max_keys as u32) {
            store.check_at(&r, ip(n), 1, 0);
            assert!(store.len() <= max_keys);
        }
        assert!(
            store.len() > max_keys / 2,
            "capacity is used, got {}",
            store.len()
        );
        // The first client was the idlest, so it was forgotten and starts full again.
        assert!(store.check_at(&r, ip(0), 1, 0).allowed);
    }

    #[test]
    fn a_flood_of_identities_cannot_reset_a_limited_client() {
        let max_keys = 1_000;
        let store = store(max_keys);
        let r = rule(GENERAL, 10);
        // A client spends its whole budget (full again in 10 s), then goes quiet while 10x
        // max_keys strangers each spend one token (full again in 1 s).
        assert!(store.check_at(&r, ip(0), 10, 0).allowed);
        for n in 1..=(10 * max_keys as u32) {
            store.check_at(&r, ip(n), 1, u64::from(n));
        }
        assert!(store.evictions() > 0);
        assert!(!store.check_at(&r, ip(0), 1, 20_000).allowed, "still limited");
    }

    #[test]
    fn tiny_bounds_are_exact() {
        for max_keys in [1, 2, 3, 7, 65, 130] {
            let store = store(max_keys);
            let r = rule(GENERAL, 1);
            for n in 0..1_000 {
                store.check_at(&r, ip(n), 1, 0);
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
        let store = MemoryStore::new(NonZeroUsize::new(100).unwrap(), &[tb.clone(), sw.clone()]);
        store.check_at(&tb, ip(1), 1, 0); // full again at 1 s
        store.check_at(&tb, ip(2), 2, 0); // full again at 2 s
        store.check_at(&sw, ip(1), 1, 0); // forgotten at 20 s
        assert_eq!(store.purge_idle_at(1_500_000), 1);
        assert_eq!(store.len(), 2);
        assert_eq!(store.purge_idle_at(19_999_999), 1);
        assert_eq!(store.purge_idle_at(20_000_000), 1);
        assert!(store.is_empty());
    }

    #[test]
    fn a_denial_creates_no_entry() {
        let store = store(10);
        store.check_at(&rule(GENERAL, 1), ip(1), 5, 0);
        assert!(store.is_empty());
    }
}
