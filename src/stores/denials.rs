//! Denials remembered locally in Redis mode, so a flood of rejected traffic does not reach
//! Redis once per request.
//!
//! When Redis refuses a request of cost `c` and says it fits again after `retry_after`, the
//! same request from that client under that rule is refused by Redis too, with the same
//! numbers, until then: nothing but time gives a budget back (refunds excepted: rules that
//! refund, under `count=failures`, are never cached). So this replica answers those itself,
//! with the same decision, and asks Redis again only once the time has come. It never admits
//! anything: a miss or an expired entry asks Redis. A request of another cost asks Redis too:
//! a cheaper one may fit sooner, and a costlier one, refused all the same, may have to wait
//! longer than the denial says, or for another limit of the rule (its answer, `Retry-After`
//! and the limit it names, is Redis's, as the memory store's would be). When Redis admits a
//! request of a client it has a denial of (a cheaper request, or one after a reset), the
//! denial is forgotten: what the admission spent puts its retry time off.
//!
//! A reset on any replica (the admin's `DELETE /v1/clients/RULE/KEY`) gives the client its
//! budget back in Redis and announces it on the channel `<KEY_PREFIX>resets` in the same
//! step; every replica subscribes and forgets its denial at once ([`reset_message`]). As the
//! fallback, for a replica whose subscription is down and for a denial remembered by a call
//! that crossed the reset, an entry is trusted for [`RECHECK_AFTER`] at most while Redis can
//! be asked: then Redis is asked again (and refuses again, spending nothing), at the cost of
//! one call a second per refused client, not one per request. While Redis cannot be asked (the
//! breaker open, or the call failed), the entry answers until its retry time, whatever the
//! fail mode: the client Redis refused stays refused ([`DenialCache::check_until_retry`]).
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

use crate::algorithms::{Cost, Decision};
use crate::rules::{ClientKey, Count, Rule};

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
    /// The cost of the refused request: the one answered from here while Redis can be asked
    /// (a cheaper one may fit sooner, a costlier one wait longer).
    cost: Cost,
    /// What Redis decided (every limit's part, for the headers).
    decision: Decision,
}

type Shard = Mutex<LruCache<(u16, ClientKey), Denial>>;

/// What the cache knows of a request while Redis can be asked ([`DenialCache::check`]).
#[derive(Debug)]
pub enum Remembered {
    /// No denial of the client under the rule.
    Nothing,
    /// Refused as Redis refused the same request, less than [`RECHECK_AFTER`] ago: the answer.
    Refused(Decision),
    /// A denial that does not answer this request (of another cost, or due a recheck): Redis
    /// decides, and its admission of the request forgets the denial.
    Unsure,
}

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

    /// The denial Redis would give this request now, if Redis refused a request of the same
    /// cost less than [`RECHECK_AFTER`] ago; else whether a denial of the client is remembered
    /// at all (one Redis's admission of this request should forget).
    pub fn check(&self, rule: &Rule, client: ClientKey, cost: Cost) -> Remembered {
        let key = (rule.id, client);
        let shard = self.shard(&key);
        let Some(denial) = shard.peek(&key) else {
            return Remembered::Nothing;
        };
        let now = Instant::now();
        if now >= denial.recheck || cost != denial.cost {
            return Remembered::Unsure;
        }
        let denial = denial.clone();
        drop(shard);
        Remembered::Refused(self.answer(&denial, now))
    }

    /// A denial of this request until its retry time, if one of the same cost or a cheaper one
    /// is remembered (the retry time at least, a costlier request's may be later): for when
    /// Redis cannot be asked again, and a client it refused stays refused.
    pub fn check_until_retry(&self, rule: &Rule, client: ClientKey, cost: Cost) -> Option<Decision> {
        let key = (rule.id, client);
        let shard = self.shard(&key);
        let denial = shard.peek(&key)?.clone();
        drop(shard);
        let now = Instant::now();
        if now >= denial.until || cost < denial.cost {
            return None;
        }
        Some(self.answer(&denial, now))
    }

    /// What `denial` answers at `now`: its decision, aged by the time since it was asked.
    fn answer(&self, denial: &Denial, now: Instant) -> Decision {
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut decision = denial.decision.aged(now - denial.sent);
        decision.retry_after = denial.until - now;
        // Not counted anywhere, so there is nothing a refund could find.
        decision.at_us = 0;
        decision
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

    /// Forget the denial of `client` under `rule`, if one is remembered (its budget was reset,
    /// or Redis admitted a request of it since).
    pub fn forget(&self, rule: &Rule, client: ClientKey) {
        self.forget_id(rule.id, client);
    }

    /// [`forget`](Self::forget) by the rule's id.
    pub fn forget_id(&self, rule: u16, client: ClientKey) {
        let key = (rule, client);
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

/// Longest a denial is answered from here before Redis is asked again, while Redis can be:
/// how soon a reset on another replica reaches this one when its announcement does not.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// What a reset announces on `<KEY_PREFIX>resets`: the rule's name and the client as logs
/// write it (`203.0.113.7`, `key:<hex>`, ...), the client on the last line.
pub fn reset_message(rule: &str, client: ClientKey) -> String {
    format!("{rule}\n{client}")
}

/// The rule's name and the client of a [`reset_message`]; `None` for any other message (one
/// published by something else on the channel is ignored).
pub fn parse_reset_message(message: &[u8]) -> Option<(&str, ClientKey)> {
    let (rule, client) = std::str::from_utf8(message).ok()?.rsplit_once('\n')?;
    Some((rule, ClientKey::parse(client)?))
}

/// A denial that ends sooner than this is not worth an entry: the next request would find it
/// expired anyway.
const MIN_WORTH_CACHING: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::TokenBucket;
    use crate::algorithms::{LimitDecision, Policy};

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

    fn refused(remembered: Remembered) -> Option<Decision> {
        match remembered {
            Remembered::Refused(decision) => Some(decision),
            Remembered::Nothing | Remembered::Unsure => None,
        }
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
        let decision = refused(cache.check(&rule, client(), Cost::saturating(2))).expect("still refused");
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, Duration::from_millis(1_500));
        assert!(
            matches!(
                cache.check(&rule, client(), Cost::saturating(3)),
                Remembered::Unsure
            ),
            "a costlier request may wait longer, or for another limit: ask Redis"
        );
        assert!(
            matches!(cache.check(&rule, client(), Cost::ONE), Remembered::Unsure),
            "a cheaper one may fit: ask Redis"
        );
        let costlier = cache
            .check_until_retry(&rule, client(), Cost::saturating(3))
            .expect("Redis cannot be asked: a costlier request is refused until then at least");
        assert_eq!(costlier.retry_after, Duration::from_millis(1_500));
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(
            matches!(
                cache.check(&rule, client(), Cost::saturating(2)),
                Remembered::Unsure
            ),
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
        let decision = refused(cache.check(&rule, client(), Cost::ONE)).expect("still answered here");
        assert!(
            decision.retry_after > Duration::from_secs(3598),
            "the retry time Redis gave"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            matches!(cache.check(&rule, client(), Cost::ONE), Remembered::Unsure),
            "a second on: ask Redis"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn while_redis_cannot_be_asked_a_denial_holds_until_its_retry_time() {
        let cache = DenialCache::new(NonZeroUsize::new(100).unwrap(), Default::default());
        let rule = rule(Count::All);
        cache.remember(
            &rule,
            client(),
            Cost::ONE,
            &denied(Duration::from_secs(1000)),
            Instant::now(),
        );
        tokio::time::advance(Duration::from_secs(999)).await;
        assert!(
            matches!(cache.check(&rule, client(), Cost::ONE), Remembered::Unsure),
            "Redis is asked again"
        );
        let decision = cache
            .check_until_retry(&rule, client(), Cost::ONE)
            .expect("Redis cannot be asked: still refused");
        assert_eq!(decision.retry_after, Duration::from_secs(1));
        assert!(
            cache.check_until_retry(&rule, client(), Cost::ZERO).is_none(),
            "cheaper"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            cache.check_until_retry(&rule, client(), Cost::ONE).is_none(),
            "at its retry time the fail mode decides"
        );
        cache.remember(
            &rule,
            client(),
            Cost::ONE,
            &denied(Duration::from_secs(1000)),
            Instant::now(),
        );
        cache.forget_id(rule.id, client());
        assert!(
            cache.check_until_retry(&rule, client(), Cost::ONE).is_none(),
            "reset"
        );
    }

    #[test]
    fn a_reset_message_names_the_rule_and_the_client() {
        let client = ClientKey::parse("2001:db8:1:2::/64+key:0123456789abcdef0123456789abcdef").unwrap();
        let message = reset_message("api@gold", client);
        assert_eq!(
            parse_reset_message(message.as_bytes()),
            Some(("api@gold", client))
        );
        let odd = reset_message("a\nrule", client);
        assert_eq!(parse_reset_message(odd.as_bytes()), Some(("a\nrule", client)));
        for other in [&b"hello"[..], b"general\nnot a client", b"\xff\n1.2.3.4", b""] {
            assert_eq!(parse_reset_message(other), None, "{other:?}");
        }
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
        assert!(matches!(
            cache.check(&rule(Count::Failures), client(), Cost::ONE),
            Remembered::Nothing
        ));
        let mut allowed = denied(Duration::ZERO);
        allowed.allowed = true;
        cache.remember(&rule(Count::All), client(), Cost::ONE, &allowed, sent);
        assert!(matches!(
            cache.check(&rule(Count::All), client(), Cost::ONE),
            Remembered::Nothing
        ));
    }
}
