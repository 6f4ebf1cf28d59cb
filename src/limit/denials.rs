//! Denials remembered locally in Redis mode, so a flood of rejected traffic does not reach
//! Redis once per request.
//!
//! When Redis refuses a request of cost `c` and says it fits again after `retry_after`, every
//! request of cost `c` or more from that client under that rule is refused by Redis too until
//! then: nothing but time gives a budget back (refunds excepted: rules that refund, under
//! `count=failures`, are never cached). So this replica answers those itself, with the same
//! decision, and asks Redis again only once the time has come. It never admits anything: a
//! miss or an expired entry asks Redis.
//!
//! An entry is trusted for [`RECHECK_AFTER`] at most, however far its retry time: then Redis is
//! asked again (and refuses again, spending nothing). A reset on another replica (the admin's
//! `DELETE /v1/clients/RULE/KEY`) gives the client its budget back in Redis, where this
//! replica cannot see it; so it reaches every replica within that second, at the cost of one
//! call a second per refused client, not one per request.
//!
//! The entry's deadline is measured from the moment the request was *sent* to Redis, before
//! Redis read its clock, so it falls at or before the true retry time: the cache never refuses
//! a request after Redis would have admitted it. Entries are bounded (shards of LRU maps),
//! and an expired entry is simply overwritten or evicted.

use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::limit::{ClientKey, Cost, Count, Decision, Rule};

/// Shards of the cache: as the memory store, a power of two.
const SHARDS: usize = 16;

/// One remembered denial.
#[derive(Debug, Clone)]
struct Denial {
    /// Refused until then (for requests of at least `cost`).
    until: Instant,
    /// Answered from here until then: `until`, or [`RECHECK_AFTER`] after it was sent if sooner.
    recheck: Instant,
    /// When the request was sent: the decision's waits are counted from then.
    sent: Instant,
    /// The cost of the refused request: a cheaper one may fit sooner.
    cost: Cost,
    /// What Redis decided (every limit's part, for the headers).
    decision: Decision,
}

type Shard = Mutex<LruCache<(u16, ClientKey), Denial>>;

/// The cache. Cheap to share behind the guard.
pub struct DenialCache {
    shards: Box<[Shard]>,
    hasher: lru::DefaultHasher,
    /// Requests answered from the cache, since startup: shared by the caches of every rule
    /// table the guard has had.
    hits: Arc<AtomicU64>,
}

impl DenialCache {
    /// A cache of at most `max_entries` denials, counting its hits into `hits`.
    pub fn new(max_entries: NonZeroUsize, hits: Arc<AtomicU64>) -> DenialCache {
        let per_shard = NonZeroUsize::new(max_entries.get().div_ceil(SHARDS)).unwrap_or(NonZeroUsize::MIN);
        DenialCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per_shard)))
                .collect(),
            hasher: Default::default(),
            hits,
        }
    }

    /// The denial Redis would give this request now, if one is remembered.
    pub fn check(&self, rule: &Rule, client: ClientKey, cost: Cost) -> Option<Decision> {
        let key = (rule.id, client);
        let shard = self.shard(&key);
        let denial = shard.peek(&key)?.clone();
        let now = Instant::now();
        if now >= denial.recheck || cost < denial.cost {
            return None;
        }
        drop(shard);
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut decision = denial.decision.aged(now - denial.sent);
        decision.retry_after = denial.until - now;
        // Not counted anywhere, so there is nothing a refund could find.
        decision.at_us = 0;
        Some(decision)
    }

    /// Remember `decision`, a denial Redis gave a request of `cost` sent at `sent`.
    pub fn remember(&self, rule: &Rule, client: ClientKey, cost: Cost, decision: &Decision, sent: Instant) {
        if decision.allowed || rule.count == Count::Failures || decision.retry_after < MIN_WORTH_CACHING {
            return;
        }
        // A concurrency place comes back when some request ends, not after the retry time.
        let inexact = rule
            .limits
            .iter()
            .zip(decision.parts())
            .any(|(policy, part)| !part.allowed && !policy.exact_retry());
        if inexact {
            return;
        }
        let key = (rule.id, client);
        let until = sent + decision.retry_after;
        let denial = Denial {
            until,
            recheck: until.min(sent + RECHECK_AFTER),
            sent,
            cost,
            decision: decision.clone(),
        };
        self.shard(&key).put(key, denial);
    }

    /// Forget the denial of `client` under `rule`, if one is remembered (its budget was reset).
    pub fn forget(&self, rule: &Rule, client: ClientKey) {
        let key = (rule.id, client);
        self.shard(&key).pop(&key);
    }

    /// Requests answered from the cache since startup.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    fn shard(&self, key: &(u16, ClientKey)) -> MutexGuard<'_, LruCache<(u16, ClientKey), Denial>> {
        let index = (self.hasher.hash_one(key) >> 32) as usize & (SHARDS - 1);
        self.shards[index].lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Longest a denial is answered from here before Redis is asked again: how soon a reset on
/// another replica reaches this one.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// A denial that ends sooner than this is not worth an entry: the next request would find it
/// expired anyway.
const MIN_WORTH_CACHING: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::algorithm::TokenBucket;
    use crate::limit::{LimitDecision, Policy};

    fn rule(count: Count) -> Rule {
        let mut rule = Rule::new(
            0,
            "general",
            Policy::TokenBucket(TokenBucket {
                capacity: 5,
                interval_us: 1_000_000,
            }),
        );
        rule.count = count;
        rule
    }

    fn denied(retry_after: Duration) -> Decision {
        Decision::one(LimitDecision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after,
            reset_after: Duration::from_secs(5),
            at_us: 0,
        })
    }

    fn client() -> ClientKey {
        std::net::IpAddr::from([192, 0, 2, 1]).into()
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_is_repeated_until_its_retry_time_and_not_after() {
        let cache = DenialCache::new(NonZeroUsize::new(100).unwrap(), Default::default());
        let rule = rule(Count::All);
        let sent = Instant::now();
        cache.remember(
            &rule,
            client(),
            Cost::saturating(2),
            &denied(Duration::from_secs(2)),
            sent,
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        let decision = cache
            .check(&rule, client(), Cost::saturating(2))
            .expect("still refused");
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, Duration::from_millis(1_500));
        assert!(
            cache.check(&rule, client(), Cost::saturating(3)).is_some(),
            "a costlier request too"
        );
        assert!(
            cache.check(&rule, client(), Cost::ONE).is_none(),
            "a cheaper one may fit: ask Redis"
        );
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(
            cache.check(&rule, client(), Cost::saturating(2)).is_none(),
            "at the retry time, ask Redis"
        );
        assert_eq!(cache.hits(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_denial_is_asked_again_after_a_second_so_a_reset_elsewhere_is_seen() {
        let cache = DenialCache::new(NonZeroUsize::new(100).unwrap(), Default::default());
        let rule = rule(Count::All);
        cache.remember(
            &rule,
            client(),
            Cost::ONE,
            &denied(Duration::from_secs(3600)),
            Instant::now(),
        );
        tokio::time::advance(RECHECK_AFTER - Duration::from_millis(1)).await;
        let decision = cache
            .check(&rule, client(), Cost::ONE)
            .expect("still answered here");
        assert!(
            decision.retry_after > Duration::from_secs(3598),
            "the retry time Redis gave"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            cache.check(&rule, client(), Cost::ONE).is_none(),
            "a second on: ask Redis"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refunding_rules_and_allowed_decisions_are_never_cached() {
        let cache = DenialCache::new(NonZeroUsize::new(100).unwrap(), Default::default());
        let sent = Instant::now();
        cache.remember(
            &rule(Count::Failures),
            client(),
            Cost::ONE,
            &denied(Duration::from_secs(9)),
            sent,
        );
        assert!(cache.check(&rule(Count::Failures), client(), Cost::ONE).is_none());
        let mut allowed = denied(Duration::ZERO);
        allowed.allowed = true;
        cache.remember(&rule(Count::All), client(), Cost::ONE, &allowed, sent);
        assert!(cache.check(&rule(Count::All), client(), Cost::ONE).is_none());
    }
}
