//! Exact leases for hot keys (`REDIS_LEASES=on`): a replica that decides often for one client
//! takes a share of that client's budget from Redis in one atomic step (`scripts/lease_take.lua`,
//! debited there at once), then decides the client's next requests from the share in its own
//! memory, without a round trip, until the share is spent or its time is up; what is left
//! unspent goes back as a refund of the take (on expiry, on a reload, at shutdown). What all
//! replicas may still admit is what Redis still holds plus the shares out, never more than the
//! budget: never over the limit, by construction. docs/algorithms.md ("Leases") has the
//! arithmetic of each algorithm, and what a replica killed with a share in hand costs.
//!
//! "Often" is counted cheaply: a fixed table of counters ([`SKETCH_SLOTS`], one atomic each,
//! indexed by the key's hash) of the decisions of the current second; a key whose counter
//! reaches `REDIS_LEASE_HOT` is hot. A cold key costs one clock read, one hash and one atomic
//! add per decision, and allocates nothing; only a hot key's lease is held in a map.
//!
//! Leases are taken for rules whose every limit is a token bucket, a fixed or a sliding
//! window; the sliding log (exact per timestamp) and concurrency limits (which keep their own
//! leases of places) never lease.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::algorithms::{Cost, Decision, LimitDecision, LuaScript, MAX_LIMITS, Policy};
use crate::rules::Rule;
use crate::stores::{RedisStore, StoreError};

/// How long a share may be spent for, at most: a replica killed with one in hand takes no more
/// than this much of its own demand with it (see docs/algorithms.md, "Leases").
pub const LEASE_PERIOD: Duration = Duration::from_secs(1);

/// `REDIS_LEASE_HOT`'s default: decisions a second for one key, on one replica, that make it hot.
pub const DEFAULT_HOT_PER_SECOND: u32 = 100;

/// Counters of decisions per key (by hash): two hot keys share one rarely, and a cold key
/// that shares a hot key's counter only takes a small share (one lease period of demand).
const SKETCH_SLOTS: usize = 4096;

/// Locks over the leases held (a power of two).
const SHARDS: usize = 16;

/// The most leases one shard holds: a replica holds at most `SHARDS` times this many keys'
/// shares; past it, the further hot keys are decided by Redis, as without leases.
const SHARD_CAPACITY: usize = 1024;

/// The sketch's flag for "a lease may be held for a key of this slot": look in the map even
/// while the second's count is low (a new second starts every count at 0).
const LEASED: u64 = 1 << 31;

/// The most units one take asks for (the script caps it by what is left anyway).
const MAX_WANT: u64 = 1 << 32;

/// `REDIS_LEASES` and `REDIS_LEASE_HOT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Decisions within one second, for one key on this replica, from which it takes shares.
    pub hot_per_second: u32,
}

/// The share a take debits, by the arithmetic of `scripts/lease_take.lua` (which computes it
/// in Redis; this is the same function, for the property tests and the docs): the smallest over
/// the limits of `min(want, cap, floor(avail / (2 · replicas)))`; below `cost + 1`, no share,
/// the request alone (`cost`); `None` when a limit cannot admit even the cost.
pub fn share_of(cost: u64, want: u64, replicas: u64, limits: &[(u64, u64)]) -> Option<u64> {
    let mut share = want;
    for &(avail, cap) in limits {
        if avail < cost {
            return None;
        }
        share = share.min(cap).min(avail / replicas.max(1).saturating_mul(2));
    }
    Some(if share < cost.saturating_add(1) {
        cost
    } else {
        share
    })
}

/// What a take answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// A share of `share` units (the cost of the request that took it included), debited at
    /// Redis time `now_us`; per limit, what it found.
    Share {
        /// Units debited under every limit.
        share: u64,
        /// The Redis time of the take.
        now_us: u64,
        /// Per limit, in the rule's order.
        parts: Vec<TakenPart>,
    },
    /// Some limit cannot admit the cost now: the request is asked of the algorithm's own
    /// script, which says when it could.
    Refused,
    /// Redis ran the take after its deadline (at this Redis time), and changed nothing.
    Expired(u64),
}

/// What one limit of a take found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TakenPart {
    /// Units Redis still holds for the limit after the share.
    pub left: u64,
    /// µs until the limit's budget is back, as of the take.
    pub reset_after_us: u64,
    /// When the share was counted (never before the stored window).
    pub at_us: u64,
    /// µs until the share's window ends (it must be spent by then); `None` for the bucket.
    pub until_end_us: Option<u64>,
}

impl Taken {
    /// The script's reply: `{0, now}`, `{-1, now}`, or the share, its time and four numbers
    /// per limit of `rule`; anything else is no reply a take could have meant.
    pub fn of(rule: &Rule, reply: &redis::Value) -> Result<Taken, String> {
        let unexpected = || format!("lease take: {reply:?}");
        let redis::Value::Array(fields) = reply else {
            return Err(unexpected());
        };
        let int = |field: &redis::Value| match field {
            redis::Value::Int(n) => Ok(*n),
            _ => Err(unexpected()),
        };
        let number =
            |field: &redis::Value| int(field).and_then(|n| u64::try_from(n).map_err(|_| unexpected()));
        match fields.as_slice() {
            [first, now] if int(first)? == 0 => {
                number(now)?;
                return Ok(Taken::Refused);
            }
            [first, now] if int(first)? == -1 => return Ok(Taken::Expired(number(now)?)),
            _ => {}
        }
        let limits = rule.limits.len();
        if fields.len() != 2 + 4 * limits {
            return Err(unexpected());
        }
        let share = number(&fields[0])?;
        let now_us = number(&fields[1])?;
        let mut parts = Vec::with_capacity(limits);
        for (policy, part) in rule.limits.iter().zip(fields[2..].chunks_exact(4)) {
            let left = number(&part[0])?;
            let until_end = int(&part[3])?;
            if left > policy.limit() || share > policy.limit() {
                return Err(unexpected());
            }
            parts.push(TakenPart {
                left,
                reset_after_us: number(&part[1])?.min(crate::stores::redis::MAX_WAIT_US),
                at_us: number(&part[2])?,
                until_end_us: u64::try_from(until_end).ok(),
            });
        }
        Ok(Taken::Share { share, now_us, parts })
    }
}

/// Whether a rule's requests may be decided from shares: every limit a token bucket, a fixed or
/// a sliding window.
pub fn leasable(rule: &Rule) -> bool {
    rule.limits.iter().all(|policy| {
        matches!(
            policy,
            Policy::TokenBucket(_) | Policy::FixedWindow(_) | Policy::SlidingWindow(_)
        )
    })
}

/// The lease script's name of an algorithm.
pub fn kind(policy: &Policy) -> &'static str {
    match policy {
        Policy::TokenBucket(_) => "tb",
        Policy::FixedWindow(_) => "fw",
        _ => "sw",
    }
}

/// What a take asks for: the cost of the request that takes it, and the units wanted (about
/// one lease period of demand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// The cost of the request that takes the share, spent from it at once.
    pub cost: Cost,
    /// Units wanted, the cost included.
    pub units: u64,
}

/// What the guard does with a decision, as the leases say.
#[derive(Debug)]
pub enum Step {
    /// Decided from this replica's share: allowed, no round trip; with the units of the next
    /// share to take meanwhile (cost 0, in the background) when this one runs low.
    Local(Decision, Option<u64>),
    /// The key is hot and holds no share: take one, wanting this many units.
    Take(u64),
    /// Ask Redis, as without leases.
    Ask,
}

/// A share to give back: `units` to the client of `key` under `rule`, as a refund of a
/// request counted at `at_us` (the take's time), which gives back no more than was taken
/// and nothing to a window that has ended.
#[derive(Debug)]
pub struct Return {
    /// The rule the share was taken under.
    pub rule: Rule,
    /// The client's key under its first limit.
    pub key: String,
    /// Units unspent.
    pub units: Cost,
    /// The take's time, on the Redis clock.
    pub at_us: u64,
}

/// One key's lease.
struct Lease {
    /// The rule it was taken under (an override's limits differ: the share follows them).
    rule: Rule,
    /// Being taken, in hand, or refused lately.
    state: State,
}

/// Where a key's lease is.
enum State {
    /// A take is under way: the key's other requests ask Redis meanwhile.
    Taking,
    /// A share in hand.
    Held(Box<Held>),
    /// The last take found a limit that could not admit the request: no take until then (its
    /// requests are asked of Redis, whose refusals the denial cache repeats), so a key at its
    /// limit costs one call per request, not a take and a call.
    Quiet(Instant),
}

/// How long a key whose take was refused asks Redis before it takes again.
const QUIET: Duration = Duration::from_millis(100);

/// A share in hand.
struct Held {
    /// Units left to spend.
    left: u64,
    /// When it may no longer be spent: a lease period after the take was sent, or its
    /// window's end if sooner (both measured from the send, so never late).
    expires: Instant,
    /// When the take was sent: reset times are counted down from it.
    sent: Instant,
    /// The take's time, on the Redis clock (what a return hands back).
    at_us: u64,
    /// Per limit: what Redis held after the share, its reset time as of the take, and when
    /// the share was counted.
    parts: [TakenPart; MAX_LIMITS],
    /// Units the take debited: below half of them left, the next share is taken.
    share: u64,
    /// The next share is being taken.
    refreshing: bool,
    /// A refresh found no share to take (the budget runs low): none before then.
    quiet_until: Option<Instant>,
}

/// The leases of one replica, over every rule table it serves.
pub struct Leases {
    settings: LeaseSettings,
    /// This replica's id in the scripts' registry of replicas taking shares.
    replica: String,
    /// Seconds are counted from here.
    epoch: Instant,
    /// Per slot: the second (high 32 bits), the [`LEASED`] flag and the decisions counted in
    /// that second (low 31 bits).
    sketch: Box<[AtomicU64]>,
    shards: Box<[Mutex<HashMap<String, Lease>>]>,
    hasher: DefaultHashBuilder,
    /// Set at shutdown: no share is taken any more.
    closed: AtomicBool,
    /// Decisions made from shares, since startup.
    local: AtomicU64,
    /// Shares taken, since startup.
    takes: AtomicU64,
}

impl Leases {
    /// The leases of a replica, with a random id.
    pub fn new(settings: LeaseSettings) -> Leases {
        let mut id = [0u8; 8];
        // Without randomness, the time: two replicas started in the same nanosecond share an
        // id and count as one, which makes their shares larger, never the sum over.
        if getrandom::fill(&mut id).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64);
            id = nanos.to_le_bytes();
        }
        Leases {
            settings,
            replica: format!("{:016x}", u64::from_le_bytes(id)),
            epoch: Instant::now(),
            sketch: (0..SKETCH_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: DefaultHashBuilder::default(),
            closed: AtomicBool::new(false),
            local: AtomicU64::new(0),
            takes: AtomicU64::new(0),
        }
    }

    /// This replica's id, as the take script's registry knows it.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Decisions made from shares, and shares taken, since startup.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.local.load(Ordering::Relaxed),
            self.takes.load(Ordering::Relaxed),
        )
    }

    /// Decide `cost` for the client of `key` under `rule` from a share in hand, or say
    /// whether to take one; a share found spent, expired or of other limits is handed back
    /// in `returned` to go back to Redis.
    pub fn step(
        &self,
        rule: &Rule,
        key: &str,
        cost: Cost,
        now: Instant,
        returned: &mut Option<Return>,
    ) -> Step {
        if self.closed.load(Ordering::Relaxed) || !leasable(rule) {
            return Step::Ask;
        }
        let hash = self.hasher.hash_one(key);
        let count = self.count(hash, now);
        let hot = count & !LEASED >= u64::from(self.settings.hot_per_second);
        if !hot && count & LEASED == 0 {
            return Step::Ask;
        }
        let mut shard = self.shards[shard_index(hash)].lock();
        let cost = cost.get();
        if let Some(lease) = shard.get_mut(key) {
            match &mut lease.state {
                // Being taken by another request: this one asks Redis meanwhile.
                State::Taking => return Step::Ask,
                State::Quiet(until) if now < *until => return Step::Ask,
                State::Quiet(_) => {}
                State::Held(held) => {
                    let usable = lease.rule.limits == rule.limits && now < held.expires;
                    if usable && held.left >= cost {
                        held.left -= cost;
                        self.local.fetch_add(1, Ordering::Relaxed);
                        // Below half the share, the next share is taken in the background while
                        // this one still serves: the key's requests never wait for a take.
                        let refresh = (hot
                            && !held.refreshing
                            && held.left < held.share / 2 + cost
                            && held.quiet_until.is_none_or(|until| now >= until))
                        .then(|| {
                            held.refreshing = true;
                            want(count, cost)
                        });
                        return Step::Local(held.decision(rule, now), refresh);
                    }
                    if held.refreshing {
                        // The next share is on its way: until then, Redis decides.
                        return Step::Ask;
                    }
                    // Spent, expired, or taken under other limits: what is left goes back.
                    if held.left > 0 {
                        *returned = Some(Return {
                            rule: lease.rule.clone(),
                            key: key.to_owned(),
                            units: Cost::saturating(held.left),
                            at_us: held.at_us,
                        });
                    }
                }
            }
            if hot {
                if lease.rule.limits != rule.limits {
                    lease.rule = rule.clone();
                }
                lease.state = State::Taking;
                return Step::Take(want(count, cost));
            }
            shard.remove(key);
            return Step::Ask;
        }
        if !hot || shard.len() >= SHARD_CAPACITY {
            return Step::Ask;
        }
        shard.insert(
            key.to_owned(),
            Lease {
                rule: rule.clone(),
                state: State::Taking,
            },
        );
        self.sketch[slot(hash)].fetch_or(LEASED, Ordering::Relaxed);
        Step::Take(want(count, cost))
    }

    /// Count one decision for the key of `hash` in the second of `now`; the count so far, with
    /// the [`LEASED`] flag.
    fn count(&self, hash: u64, now: Instant) -> u64 {
        let second = now.saturating_duration_since(self.epoch).as_secs() & 0xFFFF_FFFF;
        let cell = &self.sketch[slot(hash)];
        let mut seen = cell.load(Ordering::Relaxed);
        loop {
            let next = if seen >> 32 == second {
                // Saturating at the count's 31 bits.
                if seen & (LEASED - 1) == LEASED - 1 {
                    return seen & 0xFFFF_FFFF;
                }
                seen + 1
            } else {
                (second << 32) | (seen & LEASED) | 1
            };
            match cell.compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next & 0xFFFF_FFFF,
                Err(actual) => seen = actual,
            }
        }
    }

    /// A take sent at `sent` for the client of `key` under `rule` answered `taken`: keep the
    /// share (less the cost of the request that took it, whose decision this returns), added
    /// to the share still in hand when both are of the same windows; or drop the lease. `None`:
    /// no share, ask Redis. What is not kept goes to `returned`, to go back.
    pub fn taken(
        &self,
        rule: &Rule,
        key: &str,
        cost: Cost,
        sent: Instant,
        taken: &Taken,
        returned: &mut Vec<Return>,
    ) -> Option<Decision> {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[shard_index(hash)].lock();
        let Taken::Share { share, now_us, parts } = taken else {
            match shard.get_mut(key).map(|lease| &mut lease.state) {
                Some(State::Held(held)) => {
                    held.refreshing = false;
                    held.quiet_until = Some(sent + QUIET);
                }
                Some(state) => *state = State::Quiet(sent + QUIET),
                None => {}
            }
            return None;
        };
        self.takes.fetch_add(1, Ordering::Relaxed);
        let mut held = Held {
            left: share.saturating_sub(cost.get()),
            expires: sent + LEASE_PERIOD,
            sent,
            at_us: *now_us,
            parts: [TakenPart::default(); MAX_LIMITS],
            share: *share,
            refreshing: false,
            quiet_until: None,
        };
        for (slot, part) in held.parts.iter_mut().zip(parts) {
            *slot = *part;
            if let Some(until_end) = part.until_end_us {
                held.expires = held.expires.min(sent + Duration::from_micros(until_end));
            }
        }
        let decision = held.decision(rule, sent);
        let give_back = |held: &Held, under: &Rule| Return {
            rule: under.clone(),
            key: key.to_owned(),
            units: Cost::saturating(held.left),
            at_us: held.at_us,
        };
        let open = !self.closed.load(Ordering::Relaxed);
        let Some(lease) = shard
            .get_mut(key)
            .filter(|lease| open && lease.rule.limits == rule.limits)
        else {
            // The lease was dropped meanwhile (a reset, a reload, the shutdown), or is taken
            // under other limits since: the share goes back.
            if held.left > 0 {
                returned.push(give_back(&held, rule));
            }
            return Some(decision);
        };
        match &mut lease.state {
            State::Held(old) if old.refreshing => {
                if *share <= cost.get() {
                    // No units beyond the cost (the budget runs low): keep the share in hand,
                    // and take no other for a while.
                    old.refreshing = false;
                    old.quiet_until = Some(sent + QUIET);
                    return Some(decision);
                }
                if sent < old.expires && same_windows(rule, old, &held) {
                    // One share: the units of both, spent by the earlier end (no unit is spent
                    // later than a lease period after its take, nor past its window).
                    held.left = held.left.saturating_add(old.left);
                    held.expires = held.expires.min(old.expires);
                } else if old.left > 0 {
                    returned.push(give_back(old, &lease.rule));
                }
                if held.left > 0 {
                    lease.state = State::Held(Box::new(held));
                } else {
                    shard.remove(key);
                }
            }
            State::Taking if held.left > 0 => lease.state = State::Held(Box::new(held)),
            State::Taking => {
                shard.remove(key);
            }
            // A share in hand that did not ask for this one: this one goes back.
            _ => {
                if held.left > 0 {
                    returned.push(give_back(&held, rule));
                }
            }
        }
        Some(decision)
    }

    /// A take for `key` that will not be answered (it failed, or its request went away):
    /// forget that it is under way.
    pub fn abandon(&self, key: &str) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[shard_index(hash)].lock();
        match shard.get_mut(key).map(|lease| &mut lease.state) {
            Some(State::Taking) => {
                shard.remove(key);
            }
            Some(State::Held(held)) => held.refreshing = false,
            _ => {}
        }
    }

    /// Whether this replica holds units of `key`'s budget, or has a take of them on its way (a
    /// share with units left, a take under way, a refresh not back yet): a refusal Redis gives
    /// meanwhile is not the key's last word, since those units are this replica's to spend, so
    /// the denial cache must not repeat it (it would leave them unspent until the share
    /// expires).
    pub fn may_hold(&self, key: &str) -> bool {
        let hash = self.hasher.hash_one(key);
        match self.shards[shard_index(hash)]
            .lock()
            .get(key)
            .map(|lease| &lease.state)
        {
            Some(State::Taking) => true,
            Some(State::Held(held)) => held.left > 0 || held.refreshing,
            Some(State::Quiet(_)) | None => false,
        }
    }

    /// Forget the share of `key` without giving it back (an operator's reset gave the client
    /// its whole budget: spending the share now would be over it).
    pub fn forget(&self, key: &str) {
        let hash = self.hasher.hash_one(key);
        self.shards[shard_index(hash)].lock().remove(key);
    }

    /// Take out every share whose time is up as of `now` (or every share, with `all`), to go
    /// back; with `close`, no share is taken from now on.
    pub fn drain(&self, now: Instant, all: bool, close: bool) -> Vec<Return> {
        if close {
            self.closed.store(true, Ordering::Relaxed);
        }
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|key, lease| {
                let held = match &lease.state {
                    State::Held(held) => held,
                    State::Quiet(until) => return !all && now < *until,
                    State::Taking => return true,
                };
                if !all && now < held.expires {
                    return true;
                }
                if held.left > 0 {
                    returns.push(Return {
                        rule: lease.rule.clone(),
                        key: key.clone(),
                        units: Cost::saturating(held.left),
                        at_us: held.at_us,
                    });
                }
                false
            });
        }
        returns
    }

    /// Shares held now.
    pub fn held(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                shard
                    .lock()
                    .values()
                    .filter(|lease| matches!(lease.state, State::Held(_)))
                    .count()
            })
            .sum()
    }
}

impl Held {
    /// An allowed decision under `rule` from this share at `now`: each limit's remaining is what
    /// Redis held after the take plus what is left of the share (at most the limit), its reset
    /// counted down from the take.
    fn decision(&self, rule: &Rule, now: Instant) -> Decision {
        let elapsed = now.saturating_duration_since(self.sent);
        let mut parts = [LimitDecision::default(); MAX_LIMITS];
        let limits = rule.limits.len().min(MAX_LIMITS);
        for ((part, policy), taken) in parts.iter_mut().zip(rule.limits.iter()).zip(&self.parts) {
            *part = LimitDecision {
                allowed: true,
                limit: policy.limit(),
                remaining: taken.left.saturating_add(self.left).min(policy.limit()),
                retry_after: Duration::ZERO,
                reset_after: Duration::from_micros(taken.reset_after_us).saturating_sub(elapsed),
                at_us: taken.at_us,
            };
        }
        Decision::of(&parts[..limits])
    }
}

/// Whether two shares of `rule` were counted in the same window of every window limit (a
/// bucket has none): then their units may be spent as one.
fn same_windows(rule: &Rule, old: &Held, new: &Held) -> bool {
    rule.limits
        .iter()
        .zip(old.parts.iter().zip(&new.parts))
        .all(|(policy, (old, new))| match policy {
            Policy::FixedWindow(window) => same_window(old.at_us, new.at_us, window.window_ms),
            Policy::SlidingWindow(window) => same_window(old.at_us, new.at_us, window.window_ms),
            _ => true,
        })
}

/// Whether `a` and `b` (µs) fall in one window of `window_ms`, as the scripts number them.
fn same_window(a: u64, b: u64, window_ms: u64) -> bool {
    let window_ms = window_ms.max(1);
    a / 1000 / window_ms == b / 1000 / window_ms
}

/// How many units a take asks for: twice the decisions counted this second (about one lease
/// period of demand, as the second goes on), at least one more than the cost.
fn want(count: u64, cost: u64) -> u64 {
    (count & !LEASED)
        .saturating_mul(2)
        .max(cost.saturating_add(1))
        .min(MAX_WANT.max(cost))
}

fn slot(hash: u64) -> usize {
    (hash as usize) % SKETCH_SLOTS
}

/// The shard of `hash`: its top bits (the sketch takes the low ones).
fn shard_index(hash: u64) -> usize {
    (hash >> 60) as usize % SHARDS
}

/// `scripts/lease_take.lua`.
static TAKE_SCRIPT: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new(crate::algorithms::LEASE_TAKE));

/// The key of the replicas taking shares of the client whose key (under the rule's first limit)
/// is `key`: beside it, in its hash slot.
pub fn registry_key(key: &str) -> String {
    let mut registry = String::with_capacity(key.len() + 6);
    registry.push_str(key);
    registry.push_str(":lease");
    registry
}

/// Take a share of `want` units (`cost` of them spent at once) for the client of `key` under
/// `rule`, for `replica`, in one call of the take script, by the deadline on the Redis clock.
pub(crate) async fn take(
    store: &RedisStore,
    rule: &Rule,
    key: &str,
    want: Want,
    replica: &str,
    deadline_us: Option<u64>,
) -> Result<Taken, StoreError> {
    let mut keys = store.keys_of(rule, key);
    keys.push(registry_key(key));
    let mut args = Vec::with_capacity(6 + 3 * rule.limits.len());
    args.push(String::new());
    args.push(deadline_us.map_or_else(String::new, |us| us.to_string()));
    args.push(replica.to_owned());
    args.push(want.cost.get().to_string());
    args.push(want.units.min(Cost::MAX.get()).to_string());
    args.push(LEASE_PERIOD.as_millis().to_string());
    for policy in rule.limits.iter() {
        let (_, [first, second]) = policy.script();
        args.push(kind(policy).to_owned());
        args.push(first.to_string());
        args.push(second.to_string());
    }
    let reply = store
        .eval_keys(
            &TAKE_SCRIPT,
            crate::algorithms::function_library().lease(),
            &keys,
            &args,
        )
        .await?;
    Taken::of(rule, &reply).map_err(StoreError::Reply)
}

#[cfg(test)]
mod tests;
