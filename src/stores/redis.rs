//! The Redis store: one shared budget per client across every replica.
//!
//! Each algorithm has a Lua script in `scripts/` (embedded at build time) that reads the state,
//! runs the same arithmetic as the Rust algorithm and writes the result in one atomic step, on
//! one round trip. The scripts are loaded once per Redis node as one function library
//! ([`function_library`]: `FUNCTION LOAD`, again after "Function not found") and called by
//! `FCALL`; a Redis before 7.0 runs them by `EVALSHA` (`EVAL` after `NOSCRIPT`). The script reads
//! Redis `TIME`, so replicas with skewed clocks agree. Every key carries a TTL and all keys of
//! one client and rule share a `{hash tag}`, so the same scripts run on Redis Cluster.
//!
//! On a single Redis, decisions coalesce under load: up to `REDIS_CALLS_IN_FLIGHT` calls go
//! out at once, each a decision alone, and the decisions that arrive meanwhile wait and go
//! together, up to [`MAX_BATCH`], in one call of the [`batch_script`] (every algorithm's
//! script as a function, run in turn) when a call comes back. One call for many decisions
//! costs Redis a sixth less per decision at the load of part 3 (a third in batches of 16;
//! docs/benchmarks.md, part 2), and nothing waits
//! while fewer than `REDIS_CALLS_IN_FLIGHT` are out. A decision that fails inside a batch (a
//! key of the wrong type) fails alone.
//!
//! Behind Redis Sentinel the store is a single Redis whose address changes: [`crate::stores::sentinel`]
//! asks the Sentinels which server is master and swaps the connection when they fail over.
//!
//! Connections are made lazily: a Redis that is down at boot does not stop the gateway. Every
//! call is bounded by `REDIS_TIMEOUT_MS`; what to do when it fails is [`crate::stores::guard`]'s job.
//! A decision also tells its script when the gateway stops waiting, on Redis's clock as
//! [`RedisClock`] estimates it: a call that reaches the script later (a Redis frozen, then
//! thawed) changes nothing, so a request answered by the fail mode is never charged.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use tokio::sync::OnceCell;

use crate::algorithms::{BATCH_CONTINUED, LuaScript, batch_script, function_library, peek_script};
use crate::algorithms::{
    Cost, Decision, FixedWindow, LeanArguments, LimitDecision, MAX_LIMITS, Policy, SlidingWindow, US_PER_MS,
    WindowState,
};
use crate::rules::{ClientKey, Rule};
use crate::stores::denials::reset_message;
use crate::stores::guard::{Remote, ResetFeed};
use crate::stores::lease::{Taken, Want};
use crate::stores::redis_clock::RedisClock;
use crate::stores::sentinel::{SentinelMaster, SentinelSettings};
use crate::stores::slots::{SlotMap, key_slot};

/// Why the store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within `REDIS_TIMEOUT_MS`.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis or the connection to it reported an error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The store is not asked while its circuit breaker is open (the admin's inspection and
    /// reset; a decision takes the rule's fail mode instead).
    #[error("redis is not asked while its circuit breaker is open")]
    BreakerOpen,
    /// A script answered with something no script could have meant: other than five
    /// non-negative integers, or numbers out of range (an `allowed` other than 0 or 1, more
    /// remaining than the limit, a wait beyond [`MAX_WAIT_US`]). That key's trouble, not the
    /// store's: it never counts toward the circuit breaker.
    #[error("redis script returned an unexpected reply: {0}")]
    Reply(String),
    /// Redis ran the call after its deadline on the Redis clock, and so decided nothing,
    /// though the gateway still waited (a Redis clock that jumps ahead, or a call answered
    /// just as `REDIS_TIMEOUT_MS` ran out).
    #[error("redis found the call's deadline passed and decided nothing")]
    Expired,
}

impl StoreError {
    /// True when Redis answered and the trouble is one key's content, not the store: a value
    /// of another type at the client's key (`WRONGTYPE`, say from another application sharing
    /// `KEY_PREFIX`). Other clients are unaffected, so the circuit breaker does not count it.
    pub fn is_about_one_key(&self) -> bool {
        matches!(self, StoreError::Redis(error) if error.code() == Some("WRONGTYPE")
            || error.detail().is_some_and(|detail| detail.starts_with("value is not an integer")))
    }
}

/// Where Redis is. The password is kept out of `Debug` and every message.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, as a `redis://` or `rediss://` URL (which may carry the password).
    Single(String),
    /// Seed nodes of a Redis Cluster, `host:port` each, and an optional password.
    Cluster {
        /// `host:port` of a few cluster nodes; the rest are discovered.
        nodes: Vec<String>,
        /// `REDIS_PASSWORD`, if the cluster wants one.
        password: Option<String>,
        /// `REDIS_TLS`: speak TLS to every node.
        tls: bool,
    },
    /// The master that Redis Sentinels name, followed through failovers.
    Sentinel {
        /// `REDIS_SENTINELS`: `host:port` of each Sentinel.
        sentinels: Vec<String>,
        /// `REDIS_SENTINEL_MASTER`: the name the Sentinels monitor the master by.
        master: String,
        /// `REDIS_PASSWORD`, if the master wants one.
        password: Option<String>,
        /// `REDIS_SENTINEL_PASSWORD`, if the Sentinels want one (their own `requirepass`).
        sentinel_password: Option<String>,
        /// `REDIS_TLS`: speak TLS to the Sentinels and to the master.
        tls: bool,
    },
}

impl RedisTarget {
    /// A description safe to log: the URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact_url(url),
            RedisTarget::Cluster { nodes, tls, .. } => {
                format!("cluster {}{}", nodes.join(","), if *tls { " (TLS)" } else { "" })
            }
            RedisTarget::Sentinel {
                sentinels,
                master,
                tls,
                ..
            } => format!(
                "sentinel master {master} via {}{}",
                sentinels.join(","),
                if *tls { " (TLS)" } else { "" }
            ),
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `redis://user:secret@host/0` becomes `redis://user:***@host/0`. The credentials end at
/// the last `@` (a Redis URL's path is a database number), so a password holding `/` or `?`,
/// as base64 secrets do, is hidden too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            // A user name is not secret, but one that holds a '/' is a password misplaced.
            let user = if user.contains(['/', '?', '#']) {
                "***"
            } else {
                user
            };
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

/// The Redis-backed store. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    /// `KEY_PREFIX`, in front of every key.
    prefix: Arc<str>,
    /// `REDIS_TIMEOUT_MS`: the most any one call may take, connecting included.
    timeout: Duration,
    /// Single Redis only: decisions that wait while `REDIS_CALLS_IN_FLIGHT` calls are out,
    /// sent together as one call when one comes back.
    coalescer: Option<Arc<Coalescer>>,
    /// Redis's clock as estimated, for the deadline of calls whose caller names no clock
    /// of its own (on a cluster the guard keeps one per master).
    clock: Arc<RedisClock>,
    /// A single Redis's client, for the subscription to resets (a connection of its own).
    pubsub_client: Option<Arc<redis::Client>>,
    /// True while Redis takes functions (`FCALL` of the [`function_library`], Redis 7 and
    /// later); false once it answered that it has no such command, or refused to load the
    /// library (an ACL without `FUNCTION`): scripts by `EVALSHA` from then on.
    functions: Arc<AtomicBool>,
    /// True while Redis takes `PEXPIRE ... NX` (7.0 and later): a fixed or sliding window of
    /// one limit is decided by `INCRBY` + `PEXPIRE NX` (+ `GET` of the window before) without
    /// a script ([`count`](Self::count)); false once Redis refused it: by the windows' scripts
    /// from then on.
    counters: Arc<AtomicBool>,
}

/// `REDIS_CALLS_IN_FLIGHT`'s default: decision calls out at once before further decisions
/// wait to be sent together. Enough for the multiplexed connection to keep Redis busy; past
/// it, coalescing saves Redis a sixth of each decision (docs/benchmarks.md, part 2).
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 4;

/// The longest a decision waits for a Redis that keeps answering (busy, or this machine
/// loaded), in `REDIS_TIMEOUT_MS`s, calls sent again after an "expired" answer included (see
/// [`RedisStore::patiently`]): 500 ms at the default 50.
pub const WAIT_LIMIT: u32 = 10;

/// The most decisions one call carries.
pub const MAX_BATCH: usize = 64;

/// The decisions waiting for a call, and how many calls are out.
struct Coalescer {
    /// `REDIS_CALLS_IN_FLIGHT`, at least 1.
    calls_in_flight: usize,
    state: parking_lot::Mutex<Coalescing>,
}

impl Coalescer {
    fn new(calls_in_flight: usize) -> Self {
        Coalescer {
            calls_in_flight,
            state: parking_lot::Mutex::new(Coalescing::default()),
        }
    }
}

#[derive(Default)]
struct Coalescing {
    /// Decision calls out (a single decision's or a batch's).
    in_flight: usize,
    /// Decisions waiting, oldest first.
    waiting: Vec<Waiting>,
}

/// When a decision goes to Redis.
enum Turn {
    /// At once, alone: in a place among the calls out (`None` on a cluster, which does not
    /// coalesce: its clients' keys are in different slots). The key comes back with it.
    Now(Option<CallSlot>, String),
    /// With the next batch, which answers here (and gives the key back) by the deadline.
    Later(tokio::sync::oneshot::Receiver<(String, BatchReply)>),
}

/// One decision's part of a batch's reply: its script's reply, or why it has none.
type BatchReply = Result<redis::Value, StoreError>;

/// What a script answered.
enum Answer {
    /// It decided.
    Decided(Decision),
    /// It found the call's deadline passed at this Redis time (µs), and changed nothing.
    Expired(u64),
}

/// One decision, as the [`batch_script`] is asked it.
struct Ask {
    /// The first limit's algorithm ([`Policy::script_index`](crate::algorithms::Policy::script_index)).
    algorithm: usize,
    /// Its script's first two arguments, and the cost.
    arguments: [u64; 3],
    /// Its lean decision's arguments, for an algorithm with one.
    lean: Option<LeanArguments>,
    /// The client's key under the first limit.
    key: String,
    /// A rule of several limits: each further limit's algorithm, arguments, lean arguments and
    /// key (empty, allocating nothing, for a rule of one).
    more: Vec<(usize, [u64; 2], Option<LeanArguments>, String)>,
    /// The pinned clock, for tests; `None` reads Redis `TIME`.
    now_us: Option<u64>,
    /// To decide, refund or charge.
    call: Call,
    /// The deadline on the Redis clock, as estimated when it was asked; `None` with a pinned
    /// clock.
    redis_deadline: Option<u64>,
}

impl Ask {
    /// `cost` of `rule` for the client whose key under the rule's first limit is `key`.
    fn new(rule: &Rule, key: String, cost: Cost, now_us: Option<u64>, redis_deadline: Option<u64>) -> Ask {
        let (_, [first, second]) = rule.limits.first().script();
        let more = (1..rule.limits.len())
            .map(|index| {
                let policy = &rule.limits[index];
                (
                    policy.script_index(),
                    policy.script().1,
                    policy.lean_arguments(cost),
                    limit_key(rule, &key, index),
                )
            })
            .collect();
        Ask {
            algorithm: rule.limits.first().script_index(),
            arguments: [first, second, cost.get()],
            lean: rule.limits.first().lean_arguments(cost),
            key,
            more,
            now_us,
            call: Call::Decide,
            redis_deadline,
        }
    }

    /// How many keys it asks about: one per limit.
    fn keys(&self) -> usize {
        1 + self.more.len()
    }

    /// A decision on Redis's clock whose every limit has a lean decision: the library's
    /// lean batch can take it.
    fn is_lean(&self) -> bool {
        self.call == Call::Decide
            && self.now_us.is_none()
            && self.lean.is_some()
            && self.more.iter().all(|(_, _, lean, _)| lean.is_some())
    }
}

/// What a script call does: its `ARGV[5]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// Decide (`""`).
    Decide,
    /// Give back the cost of the decision made at this time, in µs (`count=failures`, or a
    /// reported cost below the charged one).
    Refund(u64),
    /// Spend the cost whatever is left (`"charge"`: a reported cost above the charged one).
    Charge,
    /// Renew the lease of the decision made at this time, in µs (`r` and the time: a request
    /// still in flight under a concurrency limit).
    Renew(u64),
}

impl Call {
    /// Push it as the script's `ARGV[5]`.
    fn arg(self, cmd: &mut redis::Cmd) {
        match self {
            Call::Decide => cmd.arg(""),
            Call::Refund(at_us) => cmd.arg(at_us),
            Call::Charge => cmd.arg("charge"),
            Call::Renew(at_us) => cmd.arg(format!("r{at_us}")),
        };
    }
}

/// One decision waiting to be sent.
struct Waiting {
    /// What is asked.
    ask: Ask,
    /// Where the reply goes, with the key.
    reply: tokio::sync::oneshot::Sender<(String, BatchReply)>,
    /// Its caller's wait, from when it was queued: the batch that carries it answers within
    /// it, waiting for a place included, as a decision sent alone would.
    wait: Wait,
}

/// One window's count in a call of [`RedisStore::count`].
#[derive(Debug, Clone, Copy)]
struct Counted {
    window: Windowed,
    /// The window's index, on the clock estimate's time of the call.
    index: u64,
    /// What the call adds to the window's count: the cost, at most the limit + 1.
    counted: u64,
    /// How long the window's count lives after its first count.
    ttl: u64,
    /// Whether the call reads the window before's count too (a sliding window's, after the
    /// first window).
    reads_before: bool,
}

impl Counted {
    /// How many replies the call's commands for this window answer: `INCRBY`, `PEXPIRE`, and
    /// a sliding window's `GET` of the window before.
    fn replies(&self) -> usize {
        2 + usize::from(self.reads_before)
    }

    /// The limit's decision at `now_us` on `cost`, with the window before's count at
    /// `previous` and this one's at `before` (what the memory store decides on the same
    /// state); a cost of 0 is the limit as it stands.
    fn decide(&self, now_us: u64, previous: u64, before: u64, cost: u64) -> LimitDecision {
        match self.window {
            Windowed::Fixed(window) => {
                let count = before.saturating_add(cost);
                let until_end = Duration::from_micros(
                    (self.index + 1)
                        .saturating_mul(window.window_ms)
                        .saturating_mul(US_PER_MS)
                        .saturating_sub(now_us),
                );
                if count <= window.limit {
                    LimitDecision {
                        allowed: true,
                        limit: window.limit,
                        remaining: window.limit - count,
                        retry_after: Duration::ZERO,
                        // Nothing counted (a look of cost 0 at a whole budget): nothing to wait for.
                        reset_after: if count == 0 { Duration::ZERO } else { until_end },
                        at_us: now_us,
                    }
                } else {
                    LimitDecision {
                        allowed: false,
                        limit: window.limit,
                        remaining: 0,
                        retry_after: until_end,
                        reset_after: until_end,
                        at_us: now_us,
                    }
                }
            }
            // The memory store's decision, on the counts Redis answered (at most 2^63 each, the
            // cost at most the limit + 1: its sums cannot overflow).
            Windowed::Sliding(sliding) => {
                let state = WindowState {
                    window: self.index,
                    previous,
                    current: before,
                };
                sliding.decide(Some(state), now_us, cost).0
            }
        }
    }
}

/// A window's counter as a give-back names it: its key, what was counted on it, its TTL, and
/// how many replies its commands answered in the call that counted.
struct Counter {
    key: String,
    counted: u64,
    ttl: u64,
    replies: usize,
}

/// The counters of `counts`, the first under `key`, each further one under its own in `more`.
fn counters<'a>(key: &str, more: &[String], counts: impl Iterator<Item = &'a Counted>) -> Vec<Counter> {
    std::iter::once(key)
        .chain(more.iter().map(String::as_str))
        .zip(counts)
        .map(|(key, count)| {
            let mut counter = key.to_owned();
            counter_key(&mut counter, count.index);
            Counter {
                key: counter,
                counted: count.counted,
                ttl: count.ttl,
                replies: count.replies(),
            }
        })
        .collect()
}

/// Of `counters`, those whose increment `replies` (the counting call's) shows counted: only a
/// count answered proves it, and a give-back of an increment that failed would take away
/// what others counted.
fn counted(mut counters: Vec<Counter>, replies: &[redis::Value]) -> Vec<Counter> {
    let mut at = 0;
    counters.retain(|counter| {
        let counted = matches!(replies.get(at), Some(redis::Value::Int(_)));
        at += counter.replies;
        counted
    });
    counters
}

/// The windows a call of [`RedisStore::count`] counts `cost` in, one a limit of `rule`, on the
/// clock estimate's `now_us`; `None` if a limit is not a window, or the rule has more limits
/// than a call counts.
fn counts_of(rule: &Rule, cost: Cost, now_us: u64) -> Option<[Option<Counted>; MAX_LIMITS]> {
    if rule.limits.len() > MAX_LIMITS {
        return None;
    }
    let mut counts = [None::<Counted>; MAX_LIMITS];
    for (count, policy) in counts.iter_mut().zip(rule.limits.iter()) {
        let window = Windowed::of(policy)?;
        let (limit, window_ms) = window.limit_and_window_ms();
        let index = now_us / US_PER_MS / window_ms;
        *count = Some(Counted {
            window,
            index,
            counted: cost.get().min(limit.saturating_add(1)),
            ttl: window.counter_ttl_ms(),
            reads_before: matches!(window, Windowed::Sliding(_)) && index > 0,
        });
    }
    Some(counts)
}

/// The one pipeline of a call of [`RedisStore::count`]: for each window of `counts` (the
/// first under `key`, each further one under its own in `more`) its `INCRBY` and
/// `PEXPIRE ... NX`, and a sliding window's `GET` of the window before; then `TIME` if the
/// clock estimate wants a `sample`. The keys are left as they came.
fn count_pipeline(
    key: &mut String,
    more: &mut [String],
    counts: &[Option<Counted>],
    sample: bool,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (base, count) in std::iter::once(key)
        .chain(more.iter_mut())
        .zip(counts.iter().flatten())
    {
        let length = base.len();
        counter_key(base, count.index);
        pipe.cmd("INCRBY").arg(&**base).arg(count.counted);
        pipe.cmd("PEXPIRE").arg(&**base).arg(count.ttl).arg("NX");
        // After the increment: a late increment of the window before (a replica whose
        // clock estimate lags) that landed first is seen.
        if count.reads_before {
            base.truncate(length);
            counter_key(base, count.index - 1);
            pipe.cmd("GET").arg(&**base);
        }
        base.truncate(length);
    }
    if sample {
        pipe.cmd("TIME");
    }
    pipe
}

/// Each window's count before its increment and the window before's count
/// ([`read_counts`]).
type Read = [(u64, u64); MAX_LIMITS];

/// Why a call's replies decide nothing ([`read_counts`]).
enum Unread {
    /// Redis refused `PEXPIRE ... NX` (before 7.0, or an ACL): the scripts must decide.
    NoExpireNx(redis::ServerError),
    /// A limit's count failed, or the reply was not one: the first such error.
    Failed(StoreError),
}

/// Each window's count before its increment and the window before's count, as the scripts
/// read them (none, or not a number, is 0; below zero, a give-back that met a reset, is
/// nothing), from the `replies` of a call of `counts`; and the `TIME` reply after them, if
/// any.
fn read_counts<'a>(
    replies: &'a [redis::Value],
    counts: &[Option<Counted>],
) -> Result<(Read, Option<&'a redis::Value>), Unread> {
    let unexpected = || StoreError::Reply(format!("{replies:?}"));
    let mut read: Read = [(0, 0); MAX_LIMITS];
    let mut failed = None;
    let mut at = 0;
    for (read, count) in read.iter_mut().zip(counts.iter().flatten()) {
        let mine = &replies[at.min(replies.len())..];
        at += count.replies();
        let previous = match count.reads_before.then(|| mine.get(2)).flatten() {
            Some(redis::Value::ServerError(error)) => Err(StoreError::Redis(error.clone().into())),
            Some(value) => {
                Ok(redis::from_redis_value_ref::<i64>(value).map_or(0, |count| count.max(0) as u64))
            }
            None => Ok(0),
        };
        let counted = match (mine.first(), mine.get(1), previous) {
            (Some(redis::Value::Int(after)), Some(redis::Value::Int(_)), Ok(previous)) => {
                Ok((((*after).max(0) as u64).saturating_sub(count.counted), previous))
            }
            (Some(redis::Value::ServerError(error)), ..) => Err(StoreError::Redis(error.clone().into())),
            (Some(redis::Value::Int(_)), Some(redis::Value::ServerError(error)), _) => {
                return Err(Unread::NoExpireNx(error.clone()));
            }
            (_, _, Err(error)) => Err(error),
            _ => Err(unexpected()),
        };
        match counted {
            Ok(counted) => *read = counted,
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
    }
    match failed {
        Some(error) => Err(Unread::Failed(error)),
        None => Ok((read, replies.get(at))),
    }
}

/// Windows' counts on their way to Redis ([`RedisStore::count`]): dropped before its reply
/// was read (the caller gave up at its deadline, or its request went away), the call is
/// finished in a task of its own, and what it counted is given back. Only a reply that shows
/// a count proves it: an error (a connect that timed out, a call dropped unsent) gives
/// nothing back, which errs toward refusing, never toward admitting past the limit.
struct Counting<'a, F: Future<Output = redis::RedisResult<redis::Value>> + Send + 'static> {
    call: Option<std::pin::Pin<Box<F>>>,
    store: &'a RedisStore,
    /// The client's key under the rule's first limit, and under each further one (a
    /// window's counter is its key plus the window's index).
    key: &'a str,
    more: &'a [String],
    counts: &'a [Option<Counted>],
}

impl<F: Future<Output = redis::RedisResult<redis::Value>> + Send + 'static> Drop for Counting<'_, F> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let counters = counters(self.key, self.more, self.counts.iter().flatten());
        runtime.spawn(async move {
            if let Ok(redis::Value::Array(replies)) = call.await {
                store.uncount(&counted(counters, &replies)).await;
            }
        });
    }
}

/// Work that must not be lost with the future that awaits it: dropped unfinished (a deadline
/// passed, or the request went away), it is finished in a task of its own.
struct Finish<F: Future<Output = ()> + Send + 'static>(Option<std::pin::Pin<Box<F>>>);

impl<F: Future<Output = ()> + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        if let Some(work) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(work);
        }
    }
}

/// How long a decision waits for Redis: until `deadline` (`REDIS_TIMEOUT_MS` and the lag
/// replies showed lately), and on to `cap` while Redis keeps answering (see
/// [`RedisStore::patiently`]).
#[derive(Debug, Clone, Copy)]
struct Wait {
    deadline: tokio::time::Instant,
    cap: tokio::time::Instant,
}

/// A decision call's place among the `REDIS_CALLS_IN_FLIGHT`. When it ends (the call came
/// back, failed, or its caller went away), the place goes to the decisions waiting, sent as
/// one call, or is given up when none wait.
struct CallSlot {
    store: RedisStore,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let Some(coalescer) = &self.store.coalescer else {
            return;
        };
        let now = tokio::time::Instant::now();
        let mut state = coalescer.state.lock();
        // A decision whose caller stopped waiting (the request gone) or whose time is up was
        // answered by the fail mode: it must not spend the client's budget now.
        state
            .waiting
            .retain(|waiting| !waiting.reply.is_closed() && waiting.wait.cap > now);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (the process is ending): the waiting decisions see their replies
            // dropped and take the fail mode; the place is given up.
            state.waiting.clear();
            state.in_flight -= 1;
            return;
        };
        if state.waiting.is_empty() {
            state.in_flight -= 1;
            return;
        }
        let take = state.waiting.len().min(MAX_BATCH);
        let batch: Vec<Waiting> = state.waiting.drain(..take).collect();
        drop(state);
        // The place passes to the batch: held by its task, and handed on again (this very
        // Drop) when the task ends, or is dropped unrun.
        let slot = CallSlot {
            store: self.store.clone(),
        };
        runtime.spawn(slot.store.clone().send_batch(slot, batch));
    }
}

/// When a call that failed on its connection is sent once more, at once, on a new one.
///
/// The connection manager reconnects only when a call fails on its connection, and remembers
/// a failed reconnect until the next call: so after Redis was restarted, the first call finds
/// either the old connection closed or the refusal of a reconnect tried while Redis was down,
/// however long ago. That call has started a new connection; sent again, it is decided by the
/// Redis that is back, instead of getting the fail mode (a request let through uncounted, or
/// a 503) for an outage that is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Only when it never left: the connection was refused. A refund or a charge, which would
    /// count twice if it had reached Redis.
    IfNeverSent,
    /// Also when the connection was found closed or reset. A decision, a read or a `DEL`: sent
    /// twice only if the connection was cut after Redis ran it and before its reply came back
    /// (a window of one round trip at the moment of the cut), a decision counts twice.
    IfConnectionLost,
}

impl Resend {
    /// True when a call that failed with `error` is sent again.
    fn after(self, error: &redis::RedisError) -> bool {
        // A timeout is not the connection's loss: a frozen Redis costs one timeout, not two.
        if error.is_timeout() {
            return false;
        }
        match self {
            Resend::IfNeverSent => error.is_connection_refusal(),
            Resend::IfConnectionLost => error.is_connection_refusal() || error.is_connection_dropped(),
        }
    }
}

#[derive(Clone)]
enum Connection {
    /// Multiplexed and reconnecting; concurrent requests pipeline on one socket.
    Single(ConnectionManager),
    /// Connected on first use (the cluster client has no lazy constructor that retries).
    Cluster(Arc<LazyCluster>),
    /// The master the Sentinels name now: a [`ConnectionManager`] as for `Single`, replaced
    /// when they fail over.
    Sentinel(Arc<SentinelMaster>),
}

struct LazyCluster {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
}

impl Connection {
    /// Run `pipe` (its keys in one slot: on a cluster, the slot's master answers); on a single
    /// Redis (or Sentinel's master), once more at once if it failed on a connection that was
    /// gone, as a decision is ([`Resend::IfConnectionLost`]). The caller bounds it.
    async fn query_pipeline(&self, pipe: &redis::Pipeline) -> redis::RedisResult<redis::Value> {
        self.query_pipeline_resending(pipe, Resend::IfConnectionLost)
            .await
    }

    /// Run `pipe` as [`query_pipeline`](Self::query_pipeline) does, sent again only as
    /// `resend` allows: a give-back ([`Resend::IfNeverSent`]) that reached Redis must not run
    /// twice, or it would give back what others counted.
    async fn query_pipeline_resending(
        &self,
        pipe: &redis::Pipeline,
        resend: Resend,
    ) -> redis::RedisResult<redis::Value> {
        let once = || async {
            match self {
                Connection::Single(manager) => pipe.query_async(&mut manager.clone()).await,
                Connection::Cluster(cluster) => pipe.query_async(&mut cluster.get().await?).await,
                Connection::Sentinel(master) => master.query_pipeline(pipe).await,
            }
        };
        match once().await {
            Err(error) if resend.after(&error) && !matches!(self, Connection::Cluster(_)) => once().await,
            reply => reply,
        }
    }
}

impl RedisStore {
    /// A store for `target`; connects on first use, so this fails only on a malformed target.
    /// Call it inside a Tokio runtime: the connection manager starts its tasks there.
    pub fn new(target: &RedisTarget, prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        let clock = Arc::new(RedisClock::new());
        // A decision may wait longer than `timeout` while replies are slow (`patience`): the
        // client's own bound is the longest it may wait; each call is bounded by its caller.
        let longest = timeout.saturating_mul(WAIT_LIMIT);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(longest))
            .set_response_timeout(Some(longest))
            // Few, quick retries: the circuit breaker, not the client, rides out outages.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(timeout);
        let mut pubsub_client = None;
        let connection = match target {
            RedisTarget::Single(url) => {
                if url.starts_with("rediss://") {
                    install_tls_provider();
                }
                let client = redis::Client::open(url.as_str())?;
                pubsub_client = Some(Arc::new(client.clone()));
                Connection::Single(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            RedisTarget::Sentinel {
                sentinels,
                master,
                password,
                sentinel_password,
                tls,
            } => {
                if *tls {
                    install_tls_provider();
                }
                let settings = SentinelSettings {
                    sentinels,
                    master,
                    password: password.as_deref(),
                    sentinel_password: sentinel_password.as_deref(),
                    tls: *tls,
                };
                Connection::Sentinel(SentinelMaster::start(&settings, config, timeout, clock.clone())?)
            }
            RedisTarget::Cluster { nodes, password, tls } => {
                let scheme = if *tls { "rediss" } else { "redis" };
                if *tls {
                    install_tls_provider();
                }
                // The cluster client takes TLS from the first node's scheme.
                let mut builder =
                    ClusterClient::builder(nodes.iter().map(|node| format!("{scheme}://{node}")))
                        .connection_timeout(longest)
                        .response_timeout(longest)
                        .retries(1);
                if let Some(password) = password {
                    builder = builder.password(password);
                }
                Connection::Cluster(Arc::new(LazyCluster {
                    client: builder.build()?,
                    connection: OnceCell::new(),
                }))
            }
        };
        let coalescer = (!matches!(connection, Connection::Cluster(_)))
            .then(|| Arc::new(Coalescer::new(DEFAULT_CALLS_IN_FLIGHT)));
        Ok(RedisStore {
            connection,
            prefix: prefix.into(),
            timeout,
            coalescer,
            clock,
            pubsub_client,
            functions: Arc::new(AtomicBool::new(true)),
            counters: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Coalesce past `calls` decision calls out at once (`REDIS_CALLS_IN_FLIGHT`); 0 sends
    /// every decision alone. A cluster never coalesces.
    pub fn with_calls_in_flight(mut self, calls: usize) -> Self {
        if self.coalescer.is_some() {
            self.coalescer = (calls > 0).then(|| Arc::new(Coalescer::new(calls)));
        }
        self
    }

    /// Decide a request of `cost` for `client` under `rule`, on the Redis clock.
    pub async fn check(&self, rule: &Rule, client: ClientKey, cost: Cost) -> Result<Decision, StoreError> {
        self.decide(rule, self.key(rule, client), cost, None, &self.clock)
            .await
    }

    /// [`check`](Self::check) on the client's [`key`](Self::key), made by the caller (which
    /// needs it first to find the key's Redis Cluster master), with the deadline put on
    /// `clock`: the estimate of that master's clock. The key is moved, not copied, into the
    /// batch it may wait for.
    pub async fn check_key(
        &self,
        rule: &Rule,
        key: String,
        cost: Cost,
        clock: &RedisClock,
    ) -> Result<Decision, StoreError> {
        self.decide(rule, key, cost, None, clock).await
    }

    /// The estimate of Redis's clock that [`check`](Self::check) uses: a single Redis's (behind
    /// Sentinel, the master's, started afresh when a new master is named).
    pub fn clock(&self) -> &Arc<RedisClock> {
        &self.clock
    }

    /// Decide with the script's clock pinned to `now_us` (microseconds since the Unix epoch).
    /// For tests that hold Redis to the Rust algorithms; production always uses Redis `TIME`.
    #[doc(hidden)]
    pub async fn check_at(
        &self,
        rule: &Rule,
        client: ClientKey,
        cost: Cost,
        now_us: u64,
    ) -> Result<Decision, StoreError> {
        self.decide(rule, self.key(rule, client), cost, Some(now_us), &self.clock)
            .await
    }

    /// Give back `cost` taken by an allowed request counted at `at_us` (microseconds since
    /// the Unix epoch on the Redis clock), atomically.
    pub async fn refund(
        &self,
        rule: &Rule,
        client: ClientKey,
        cost: Cost,
        at_us: u64,
    ) -> Result<(), StoreError> {
        self.give_back(rule, &self.key(rule, client), cost, Call::Refund(at_us), None)
            .await
    }

    /// [`refund`](Self::refund) on the client's [`key`](Self::key), made by the caller.
    pub async fn refund_key(&self, rule: &Rule, key: &str, cost: Cost, at_us: u64) -> Result<(), StoreError> {
        self.give_back(rule, key, cost, Call::Refund(at_us), None).await
    }

    /// Renew the lease taken at `at_us` by the client of `key` under `rule`, a rule of one
    /// concurrency limit (what the gate renews), for a request of `cost` still in flight: it
    /// lasts its length from now, on the Redis clock. A lease expired or given back stays gone.
    pub async fn renew_key(&self, rule: &Rule, key: &str, cost: Cost, at_us: u64) -> Result<(), StoreError> {
        self.bounded(self.run_script(rule, key, cost, None, Call::Renew(at_us), None))
            .await
            .map(drop)
    }

    /// [`renew_key`](Self::renew_key) with the script's clock pinned to `now_us`, for tests.
    #[doc(hidden)]
    pub async fn renew_at(
        &self,
        rule: &Rule,
        client: ClientKey,
        cost: Cost,
        at_us: u64,
        now_us: u64,
    ) -> Result<(), StoreError> {
        let key = self.key(rule, client);
        self.bounded(self.run_script(rule, &key, cost, Some(now_us), Call::Renew(at_us), None))
            .await
            .map(drop)
    }

    /// [`refund`](Self::refund) with the script's clock pinned to `now_us`, for tests.
    #[doc(hidden)]
    pub async fn refund_at(
        &self,
        rule: &Rule,
        client: ClientKey,
        cost: Cost,
        at_us: u64,
        now_us: u64,
    ) -> Result<(), StoreError> {
        self.give_back(
            rule,
            &self.key(rule, client),
            cost,
            Call::Refund(at_us),
            Some(now_us),
        )
        .await
    }

    /// What the client of `key` has left under `rule`, on the Redis clock, spending nothing:
    /// the [`peek_script`], routed by the key (on a cluster, to its master).
    pub async fn inspect_key(&self, rule: &Rule, key: &str) -> Result<Decision, StoreError> {
        let keys = limit_keys(rule, key);
        let command = |name: &str, script: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script).arg(keys.len()).arg(&keys);
            for policy in rule.limits.iter() {
                let [first, second] = policy.script().1;
                cmd.arg(policy.script_index()).arg(first).arg(second);
            }
            cmd
        };
        let reply = match self
            .bounded(self.evaluate(
                peek_script(),
                function_library().peek(),
                key,
                command,
                Resend::IfConnectionLost,
            ))
            .await?
        {
            // One decision per limit: a rule of one reads as a single script's reply.
            redis::Value::Array(mut replies) if replies.len() == 1 && rule.limits.len() == 1 => {
                replies.remove(0)
            }
            reply => reply,
        };
        // The peek's replies are its scripts' own, with a cost of 0.
        match answer_of(rule, &reply, Cost::ZERO)? {
            Answer::Decided(decision) => Ok(decision),
            Answer::Expired(_) => Err(StoreError::Expired),
        }
    }

    /// Forget the client of `key` (`client`) under every limit of `rule`: one `DEL`, so every
    /// replica's next decision finds the whole budget, and in the same script a `PUBLISH` of
    /// the reset on `<KEY_PREFIX>resets`, so every replica subscribed forgets its remembered
    /// denial at once: a reset that deleted the keys has been announced. Every key of one
    /// client and rule shares a hash tag, so one node holds them all (on a cluster, a message
    /// published on any node reaches the subscribers of every node). Answers whether there was a
    /// key to delete.
    pub async fn reset_key(&self, rule: &Rule, key: &str, client: ClientKey) -> Result<bool, StoreError> {
        let keys = limit_keys(rule, key);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RESET_SCRIPT)
            .arg(keys.len())
            .arg(&keys)
            .arg(self.reset_channel())
            .arg(reset_message(&rule.name, client));
        for policy in rule.limits.iter() {
            match policy {
                Policy::FixedWindow(window) => cmd.arg(window.window_ms),
                Policy::SlidingWindow(window) => cmd.arg(window.window_ms),
                _ => cmd.arg(""),
            };
        }
        let deleted: u64 = self.bounded(self.query(&cmd, Resend::IfConnectionLost)).await?;
        Ok(deleted > 0)
    }

    /// `<KEY_PREFIX>resets`: where resets are announced.
    fn reset_channel(&self) -> String {
        format!("{}resets", self.prefix)
    }

    /// A subscription to the resets every replica announces (see [`reset_key`](Self::reset_key))
    /// on a connection of its own to the Redis decisions go to (behind Sentinel, the master
    /// now), made within `REDIS_TIMEOUT_MS`; `None` on a cluster, whose replicas rely on the
    /// denial cache's recheck alone.
    pub async fn reset_feed(&self) -> Result<Option<ResetFeed>, StoreError> {
        let client = match &self.connection {
            Connection::Single(_) => self.pubsub_client.as_deref().cloned(),
            Connection::Sentinel(master) => master.client(),
            Connection::Cluster(_) => return Ok(None),
        };
        let Some(client) = client else {
            // Behind Sentinel before any master is known: an I/O error, tried again.
            return Err(StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no master to subscribe to",
            ))));
        };
        let channel = self.reset_channel();
        let stream = self
            .bounded(async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok(pubsub.into_on_message())
            })
            .await?;
        Ok(Some(
            stream.map(|message| message.get_payload_bytes().to_vec()).boxed(),
        ))
    }

    /// The key of one client under one rule's first limit:
    /// `{prefix}{rule:client}:{algorithm}:{numbers}`, `numbers` the policy's
    /// [`fingerprint`](crate::algorithms::Policy::fingerprint) in hex (a limit whose numbers change
    /// starts afresh). The braces are a Redis Cluster hash tag, so every key of one client and
    /// rule lives on one node; the key under each further limit is this one with the limit's
    /// own last two parts (`limit_keys`).
    pub fn key(&self, rule: &Rule, client: ClientKey) -> String {
        // Room for the longest client key (an IPv6 prefix and a digest) in one allocation.
        let mut key = String::with_capacity(self.prefix.len() + rule.name.len() + LIMIT_PART + 96);
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(&rule.name);
        key.push(':');
        client.push_to(&mut key);
        key.push('}');
        push_limit_part(&mut key, rule, 0);
        key
    }

    /// True for a Redis Cluster, whose masters each get a circuit breaker of their own.
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    /// Redis `TIME` in microseconds since the Unix epoch, bounded by the timeout: a circuit
    /// breaker's health probe, whose answer also renews the clock estimate. On a cluster,
    /// `slot` routes it to the master that owns that slot; without one, any node answers.
    pub async fn time(&self, slot: Option<u16>) -> Result<u64, StoreError> {
        let cmd = redis::cmd("TIME");
        let reply: redis::Value = self
            .bounded(async {
                match (&self.connection, slot) {
                    (Connection::Single(_) | Connection::Sentinel(_), _) => {
                        self.query(&cmd, Resend::IfConnectionLost).await
                    }
                    // A master's probe: `TIME` from a script on a key of its slot. The cluster
                    // client answers a command routed to a node it is not connected to from
                    // another node (redis-rs's fallback while it reconnects), which would
                    // close a dead master's breaker; a keyed script is refused by any node but
                    // the slot's owner (`MOVED`, followed there), so only the master answers.
                    (Connection::Cluster(cluster), Some(slot)) => {
                        let mut script = redis::cmd("EVAL");
                        script
                            .arg("return redis.call('TIME')")
                            .arg(1)
                            .arg(key_in_slot(slot));
                        script.query_async(&mut cluster.get().await?).await
                    }
                    // Routed by redis-rs's default, a command without a key would go to every
                    // master and need them all: one answer is what "Redis answers" means here.
                    (Connection::Cluster(cluster), None) => {
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                        cluster.get().await?.route_command(cmd, routing).await
                    }
                }
            })
            .await?;
        let (seconds, micros): (u64, u64) =
            redis::from_redis_value(reply).map_err(|error| StoreError::Reply(error.to_string()))?;
        Ok(seconds.saturating_mul(1_000_000).saturating_add(micros))
    }

    /// Which master owns which slot (`CLUSTER SLOTS`, asked of any node), bounded by the
    /// timeout; `None` for a single Redis.
    pub async fn slot_map(&self) -> Result<Option<SlotMap>, StoreError> {
        let Connection::Cluster(cluster) = &self.connection else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let reply = self
            .bounded(async { cluster.get().await?.route_command(cmd, routing).await })
            .await?;
        SlotMap::from_cluster_slots(&reply)
            .map(Some)
            .map_err(StoreError::Reply)
    }

    /// Spend `cost` of the client of `key` under every limit of `rule` whatever is left, past
    /// the limits if need be (a cost the backend reported, `RESPONSE_COST_HEADER`), on the
    /// Redis clock, atomically.
    pub async fn charge_key(&self, rule: &Rule, key: &str, cost: Cost) -> Result<(), StoreError> {
        self.give_back(rule, key, cost, Call::Charge, None).await
    }

    /// [`charge_key`](Self::charge_key) with the script's clock pinned to `now_us`, for tests.
    #[doc(hidden)]
    pub async fn charge_at(
        &self,
        rule: &Rule,
        client: ClientKey,
        cost: Cost,
        now_us: u64,
    ) -> Result<(), StoreError> {
        self.give_back(rule, &self.key(rule, client), cost, Call::Charge, Some(now_us))
            .await
    }

    /// A refund or a charge (`call`) under every limit of `rule`.
    async fn give_back(
        &self,
        rule: &Rule,
        key: &str,
        cost: Cost,
        call: Call,
        now_us: Option<u64>,
    ) -> Result<(), StoreError> {
        // No deadline: a refund Redis runs late gives back what it would have on time (the
        // cost of a request that was counted, from the state that still remembers it), and
        // the client is owed it (docs/reliability.md); a charge is a cost already incurred.
        if rule.limits.len() == 1 {
            return self
                .bounded(self.run_script(rule, key, cost, now_us, call, None))
                .await
                .map(drop);
        }
        let mut ask = Ask::new(rule, key.to_owned(), cost, now_us, None);
        ask.call = call;
        let reply = self.bounded(self.run_asks(std::slice::from_ref(&ask))).await?;
        match reply {
            redis::Value::Array(replies) => replies
                .into_iter()
                .try_for_each(|reply| reply_of_one(reply).map(drop)),
            other => Err(StoreError::Reply(format!("{other:?}"))),
        }
    }

    /// Decide, telling the script the call's deadline on `clock`'s estimate of the Redis clock
    /// (a pinned clock, in tests, has no deadline): after it the script changes nothing and
    /// answers "expired". The gateway waits for the answer at least until then, and on while
    /// Redis keeps answering ([`patiently`](Self::patiently)), so whenever it gives up, a call
    /// that runs later counts nothing. An "expired" answer that arrives while it still waits
    /// (the call ran late: a busy Redis or machine, or the estimate was too low) is renewed
    /// from and the call sent again with a deadline of its own, until the
    /// [`WAIT_LIMIT`] from the first send.
    async fn decide(
        &self,
        rule: &Rule,
        mut key: String,
        cost: Cost,
        now_us: Option<u64>,
        clock: &RedisClock,
    ) -> Result<Decision, StoreError> {
        if now_us.is_none()
            && Windowed::all(&rule.limits)
            && self.counters.load(Ordering::Relaxed)
            && let Some(decision) = self.count(rule, &mut key, cost, clock).await?
        {
            return Ok(decision);
        }
        // One clock read: when the call is sent, and from it when the caller stops waiting.
        let mut sent = tokio::time::Instant::now();
        let cap = sent + self.timeout.saturating_mul(WAIT_LIMIT);
        loop {
            let wait = Wait {
                deadline: (sent + self.patience(clock)).min(cap),
                cap,
            };
            let redis_deadline = now_us.is_none().then(|| clock.redis_time(wait.deadline));
            let (returned, reply) = self
                .call(rule, key, cost, now_us, wait, clock, redis_deadline)
                .await?;
            match answer_of(rule, &reply, cost)? {
                Answer::Decided(decision) => {
                    if now_us.is_none() {
                        clock.observe(sent, decision.at_us);
                    }
                    return Ok(decision);
                }
                Answer::Expired(redis_us) => {
                    // Only a call with a deadline expires: its clock is Redis's own.
                    clock.reset(sent, redis_us);
                    sent = tokio::time::Instant::now();
                    if sent >= cap {
                        return Err(StoreError::Expired);
                    }
                    key = returned;
                }
            }
        }
    }

    /// Decide a rule whose every limit is a fixed or sliding window without a script: for
    /// each limit, `INCRBY` of the cost on the client's key of the window now on `clock`'s
    /// estimate of Redis's clock ([`counter_key`]) and `PEXPIRE ... NX` of it (the fixed
    /// window as envoyproxy/ratelimit runs it), and for a sliding window a `GET` of the window
    /// before's count after them; all pipelined, one round trip. The counts answered decide
    /// each limit: for a fixed window, at most the limit, allowed; for a sliding window,
    /// [`SlidingWindow::decide`] on the window before's count and this one's before the
    /// increment (allowed iff `previous · (W − elapsed) + count · W ≤ limit · W`). The request
    /// goes through when every limit allows it; refused, every increment is given back
    /// (`DECRBY`) before the refusal is answered, so a refusal spends nothing in any limit. A
    /// cost above a limit is sent as that limit + 1: refused whatever it is, and nothing
    /// hostile reaches `INCRBY`. Never coalesced: a pipeline costs Redis what the commands
    /// cost, and batching them would save nothing.
    ///
    /// **Exact across replicas.** `INCRBY` is atomic, so the counts the calls on one window's
    /// key answer are the running sums of their increments in Redis's order; a call is allowed
    /// only when its sum on every limit's key, every increment before it included, fits (a
    /// sliding window's also with the weight of the window before as it stood after the
    /// increment). Increments still there are those of allowed calls (never given back) and
    /// of refused ones not yet given back; so on each key the allowed ones' costs sum to at
    /// most its limit, whatever the interleaving of replicas: never more than a limit in a
    /// window. A refused increment not given back yet can only make a call that lands
    /// meanwhile see a larger sum: refused where it would have been allowed only when that
    /// sum, without it, still fits. With one limit and costs of 1 that needs the window full
    /// already (a refused call's increment takes the count above the limit only from the
    /// limit), so nothing is lost; with larger costs, a sliding window's weight, or a request
    /// another limit of the list refused, a request may be refused for one round trip that
    /// would have fit (transiently conservative). A given-back refusal leaves the counts as
    /// they were: `+c` then `-c`. What the window before's count may still gain after a call
    /// read it (a replica whose clock estimate lags, counting there late) is
    /// docs/algorithms.md's "The sliding window without a script".
    ///
    /// **The deadline.** No script checks it: a call the gateway stops waiting for (the fail
    /// mode answered) is left to finish in a task of its own, which gives back whatever it
    /// counted, so a request the fail mode answered is never charged; so is a call of which a
    /// limit's count failed (an error answers the request). What remains is a call Redis
    /// counted and whose reply the connection lost (docs/reliability.md).
    ///
    /// `None` (the key as it came) when Redis refused `PEXPIRE ... NX` (before 7.0): the
    /// increments given back, and the scripts decide, from then on.
    async fn count(
        &self,
        rule: &Rule,
        key: &mut String,
        cost: Cost,
        clock: &RedisClock,
    ) -> Result<Option<Decision>, StoreError> {
        let sent = tokio::time::Instant::now();
        let deadline = sent + self.patience(clock);
        let now_us = clock.redis_time(sent);
        let Some(counts) = counts_of(rule, cost, now_us) else {
            return Ok(None);
        };
        // The client's key under each further limit (none, and nothing allocated, for one).
        let mut more: Vec<String> = (1..rule.limits.len())
            .map(|index| limit_key(rule, key, index))
            .collect();
        let pipe = count_pipeline(key, &mut more, &counts, clock.wants_sample(sent));
        let key: &str = key;
        let connection = self.connection.clone();
        // Boxed, so that it can outlive the wait: a call given up on, or whose request went
        // away meanwhile, is finished in a task that gives back what it counted (`Counting`).
        let mut counting = Counting {
            call: Some(Box::pin(async move { connection.query_pipeline(&pipe).await })),
            store: self,
            key,
            more: &more,
            counts: &counts,
        };
        // What a call counted after its caller gave up goes back, so it may wait on while Redis
        // is answering, as a script's decision does.
        let wait = Wait {
            deadline,
            cap: sent + self.timeout.saturating_mul(WAIT_LIMIT),
        };
        let answered = match counting.call.as_mut() {
            Some(call) => self.patiently(clock, wait, call.as_mut()).await,
            None => None,
        };
        let reply = match answered {
            Some(reply) => {
                counting.call = None;
                let reply = reply?;
                clock.answered(now_us);
                reply
            }
            // `counting` is dropped armed: its task finishes the call.
            None => return Err(StoreError::Timeout(self.timeout)),
        };
        drop(counting);
        let redis::Value::Array(replies) = &reply else {
            return Err(StoreError::Reply(format!("{reply:?}")));
        };
        let (read, time) = match read_counts(replies, &counts) {
            Ok(read) => read,
            Err(Unread::NoExpireNx(error)) => {
                // A Redis before 7.0 (no NX), or an ACL that forbids PEXPIRE: the scripts
                // decide from now on.
                tracing::warn!(
                    "redis refused PEXPIRE ... NX ({}): deciding windows by script",
                    error.details().unwrap_or("")
                );
                self.counters.store(false, Ordering::Relaxed);
                return self.give_back_counts(key, &more, &counts, replies).await;
            }
            Err(Unread::Failed(error)) => {
                // What the other limits counted goes back: the error answers the request.
                let counters = counted(counters(key, &more, counts.iter().flatten()), replies);
                Finish(Some(Box::pin(self.clone().uncount_owned(counters))));
                return Err(error);
            }
        };
        if let Some(time) = time
            && let Ok((seconds, micros)) = redis::from_redis_value_ref::<(u64, u64)>(time)
        {
            clock.observe(sent, seconds.saturating_mul(1_000_000).saturating_add(micros));
        }
        let mut parts = [LimitDecision::default(); MAX_LIMITS];
        for ((part, count), &(before, previous)) in parts.iter_mut().zip(counts.iter().flatten()).zip(&read) {
            *part = count.decide(now_us, previous, before, count.counted);
        }
        let parts = &mut parts[..rule.limits.len()];
        if parts.iter().any(|part| !part.allowed) {
            // A limit that allowed it says what it has with nothing spent.
            for ((part, count), &(before, previous)) in
                parts.iter_mut().zip(counts.iter().flatten()).zip(&read)
            {
                if part.allowed {
                    *part = count.decide(now_us, previous, before, 0);
                }
            }
            self.give_back_refused(counters(key, &more, counts.iter().flatten()), deadline)
                .await;
        }
        Ok(Some(Decision::of(parts)))
    }

    /// A refused call's increments go back before the refusal is answered (by the call's
    /// `deadline`); past it, or if the request goes away meanwhile, in a task of their own
    /// (`Finish`).
    async fn give_back_refused(&self, counters: Vec<Counter>, deadline: tokio::time::Instant) {
        let mut give_back = Finish(Some(Box::pin(self.clone().uncount_owned(counters))));
        if let Some(call) = give_back.0.as_mut()
            && tokio::time::timeout_at(deadline, call.as_mut()).await.is_ok()
        {
            give_back.0 = None;
        }
    }

    /// Redis refused `PEXPIRE ... NX`: give back what the call counted, each counter with an
    /// expiry of its own (plain `PEXPIRE`), and answer `None` for the scripts to decide.
    async fn give_back_counts(
        &self,
        key: &str,
        more: &[String],
        counts: &[Option<Counted>],
        replies: &[redis::Value],
    ) -> Result<Option<Decision>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for counter in counted(counters(key, more, counts.iter().flatten()), replies) {
            pipe.cmd("DECRBY").arg(&counter.key).arg(counter.counted).ignore();
            pipe.cmd("PEXPIRE").arg(&counter.key).arg(counter.ttl).ignore();
        }
        let _ = self
            .bounded(
                self.connection
                    .query_pipeline_resending(&pipe, Resend::IfNeverSent),
            )
            .await;
        Ok(None)
    }

    /// [`uncount`](Self::uncount), owning what it needs: for a task of its own.
    async fn uncount_owned(self, counters: Vec<Counter>) {
        self.uncount(&counters).await;
    }

    /// Give back what was counted on each of `counters`: `DECRBY`, and `PEXPIRE ... NX` in
    /// case a reset deleted the key meanwhile. A count that went below zero so (the reset
    /// came between the count and its give-back) is brought back up to zero at once: a
    /// negative count would admit more than the limit. A failure leaves a window's count
    /// higher than it should be until the window ends: conservative, never over the limit.
    async fn uncount(&self, counters: &[Counter]) {
        if counters.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for counter in counters {
            pipe.cmd("DECRBY").arg(&counter.key).arg(counter.counted);
            pipe.cmd("PEXPIRE")
                .arg(&counter.key)
                .arg(counter.ttl)
                .arg("NX")
                .ignore();
        }
        // Sent again only if it never left: a give-back run twice would take away what
        // others counted.
        match self
            .connection
            .query_pipeline_resending(&pipe, Resend::IfNeverSent)
            .await
        {
            Ok(redis::Value::Array(replies)) => {
                let mut up = redis::pipe();
                for (reply, counter) in replies.iter().zip(counters) {
                    if let redis::Value::Int(count) = reply
                        && *count < 0
                    {
                        up.cmd("INCRBY")
                            .arg(&counter.key)
                            .arg(count.saturating_neg())
                            .ignore();
                    }
                }
                if !up.is_empty()
                    && let Err(error) = self
                        .connection
                        .query_pipeline_resending(&up, Resend::IfNeverSent)
                        .await
                {
                    tracing::debug!("a window's count below zero was not put back: {error}");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::debug!("a window's increment was not given back: {error}"),
        }
    }

    /// How long a decision waits for Redis: `REDIS_TIMEOUT_MS`, plus twice the lag `clock` has
    /// seen lately (a call's way there beyond the fastest, and as much back), at most
    /// [`WAIT_LIMIT`] times `REDIS_TIMEOUT_MS`. A machine or a Redis under load makes
    /// calls slower for a while, and a fixed timeout then hands them to the fail mode (a
    /// sliding log of 25 admitted 94 across three replicas at `FAIL_MODE=open`); a Redis
    /// frozen or gone answers nothing, so shows no lag, and its calls still time out after
    /// `REDIS_TIMEOUT_MS` for the circuit breaker to count (a timeout is not taken as a lag:
    /// a frozen Redis costs each request what it cost).
    fn patience(&self, clock: &RedisClock) -> Duration {
        let lag = clock.lag();
        self.timeout
            .saturating_add(lag.saturating_add(lag))
            .min(self.timeout.saturating_mul(WAIT_LIMIT))
    }

    /// Wait for `call` until `wait`'s deadline, and past it until its cap for as long as Redis
    /// may still be answering: a reply to any decision (as `clock` sees it) since the last
    /// look means Redis is busy or this machine loaded, not gone; and a gateway so busy that
    /// its own tasks wait their turn (the deadline's timer ran late, or a yield took long)
    /// cannot tell a silent Redis from replies it has not read yet. A decision handed to the
    /// fail mode then would let a burst through uncounted (three replicas of a sliding log
    /// admitted 94 of 25, and a circuit breaker opened by such timeouts let every request
    /// through for a probe interval). A Redis that answers nothing (frozen, cut off) to a
    /// gateway that is not overloaded is given up on at the first deadline, or one
    /// `REDIS_TIMEOUT_MS` later for a call sent just before it stopped (before the first
    /// reply, at the cap). Before giving up, what reached the process meanwhile is read (a
    /// yield lets the connection's task run), so a call already answered is never taken for
    /// a timeout. `None` when it timed out.
    async fn patiently<T>(&self, clock: &RedisClock, wait: Wait, call: impl Future<Output = T>) -> Option<T> {
        let mut call = std::pin::pin!(call);
        let mut seen = clock.latest_reply();
        let mut until = wait.deadline;
        // Later than this, the timer or a yield shows the gateway's own tasks queueing.
        let busy = self.timeout / 16;
        loop {
            if let Ok(done) = tokio::time::timeout_at(until, call.as_mut()).await {
                return Some(done);
            }
            let woken = tokio::time::Instant::now();
            tokio::task::yield_now().await;
            if let Poll::Ready(done) = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
                return Some(done);
            }
            let now = tokio::time::Instant::now();
            let latest = clock.latest_reply();
            let answering = latest != seen || latest == 0;
            let queueing =
                woken.saturating_duration_since(until) + now.saturating_duration_since(woken) > busy;
            if !(answering || queueing) || now >= wait.cap {
                self.timed_out();
                return None;
            }
            seen = latest;
            until = (now + self.timeout).min(wait.cap);
        }
    }

    /// One call of a decision's script, alone or in a batch, answered within `wait` (see
    /// [`patiently`](Self::patiently)); the key comes back with the reply.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        rule: &Rule,
        key: String,
        cost: Cost,
        now_us: Option<u64>,
        wait: Wait,
        clock: &RedisClock,
        redis_deadline: Option<u64>,
    ) -> Result<(String, redis::Value), StoreError> {
        match self.turn(rule, key, cost, now_us, wait, redis_deadline) {
            Turn::Now(slot, key) if rule.limits.len() > 1 => {
                let ask = Ask::new(rule, key, cost, now_us, redis_deadline);
                let reply = match self
                    .patiently(clock, wait, self.run_asks(std::slice::from_ref(&ask)))
                    .await
                {
                    Some(Ok(redis::Value::Array(replies))) => group_reply(replies),
                    Some(Ok(other)) => Err(StoreError::Reply(format!("{other:?}"))),
                    Some(Err(error)) => Err(StoreError::from(error)),
                    None => Err(StoreError::Timeout(self.timeout)),
                };
                drop(slot);
                Ok((ask.key, reply?))
            }
            Turn::Now(slot, key) => {
                let call = self.run_script(rule, &key, cost, now_us, Call::Decide, redis_deadline);
                let reply = match self.patiently(clock, wait, call).await {
                    Some(reply) => reply.map_err(StoreError::from),
                    None => Err(StoreError::Timeout(self.timeout)),
                };
                // The place passes to the decisions that waited meanwhile.
                drop(slot);
                Ok((key, reply?))
            }
            // The batch judges Redis from when it is sent, and answers by this decision's cap;
            // a millisecond more is only the backstop for a batch task that never ran.
            Turn::Later(waiting) => {
                match tokio::time::timeout_at(wait.cap + Duration::from_millis(1), waiting).await {
                    Ok(Ok((key, reply))) => Ok((key, reply?)),
                    // Dropped unsent: its cap passed while it waited for a place.
                    Ok(Err(_)) | Err(_) => Err(StoreError::Timeout(self.timeout)),
                }
            }
        }
    }

    /// When this decision goes to Redis: now, in a place among the calls out (or on a
    /// cluster, which does not coalesce), or later, with the next batch.
    fn turn(
        &self,
        rule: &Rule,
        key: String,
        cost: Cost,
        now_us: Option<u64>,
        wait: Wait,
        redis_deadline: Option<u64>,
    ) -> Turn {
        let Some(coalescer) = &self.coalescer else {
            return Turn::Now(None, key);
        };
        let mut state = coalescer.state.lock();
        if state.in_flight < coalescer.calls_in_flight {
            state.in_flight += 1;
            return Turn::Now(Some(CallSlot { store: self.clone() }), key);
        }
        let (reply, waiting) = tokio::sync::oneshot::channel();
        state.waiting.push(Waiting {
            ask: Ask::new(rule, key, cost, now_us, redis_deadline),
            reply,
            wait,
        });
        Turn::Later(waiting)
    }

    /// Send `batch` as one call (it holds a place among the calls out) and hand each decision
    /// its reply; then pass the place on.
    async fn send_batch(self, slot: CallSlot, batch: Vec<Waiting>) {
        let _slot = slot;
        // Redis is judged from now, when it is asked (a decision that waited for a place
        // waited for this gateway, not for Redis), and the batch gives up no later than the
        // first of its callers (they are queued in order). The scripts get the batch's own
        // deadline, never later than a caller's cap: a caller answered by the fail mode is
        // never counted afterwards.
        let now = tokio::time::Instant::now();
        let cap = batch.iter().map(|waiting| waiting.wait.cap).min().unwrap_or(now);
        let wait = Wait {
            deadline: (now + self.patience(&self.clock)).min(cap),
            cap,
        };
        let redis_deadline = self.clock.redis_time(wait.deadline);
        let (asks, senders): (Vec<Ask>, Vec<_>) = batch
            .into_iter()
            .map(|mut waiting| {
                if waiting.ask.redis_deadline.is_some() {
                    waiting.ask.redis_deadline = Some(redis_deadline);
                }
                (waiting.ask, waiting.reply)
            })
            .unzip();
        let keys: usize = asks.iter().map(Ask::keys).sum();
        let call = self.run_asks(&asks);
        let replies = match self.patiently(&self.clock, wait, call).await {
            Some(Ok(redis::Value::Array(replies))) if replies.len() == keys => Ok(replies),
            Some(Ok(other)) => Err(StoreError::Reply(format!("{other:?}"))),
            Some(Err(error)) => Err(StoreError::from(error)),
            None => Err(StoreError::Timeout(self.timeout)),
        };
        match replies {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                for (reply_to, ask) in senders.into_iter().zip(asks) {
                    let reply = match ask.more.len() {
                        0 => replies
                            .next()
                            .map_or_else(|| Err(StoreError::Reply("no reply".into())), reply_of_one),
                        more => group_reply(replies.by_ref().take(1 + more).collect()),
                    };
                    let _ = reply_to.send((ask.key, reply));
                }
            }
            Err(error) => {
                for (reply_to, ask) in senders.into_iter().zip(asks) {
                    let _ = reply_to.send((ask.key, Err(error.clone())));
                }
            }
        }
    }

    /// `FCALL` of [`batch_script`]'s function for `asks` (see [`evaluate`](Self::evaluate)): a
    /// batch of decisions, or a decision or refund under a rule of several limits; the lean
    /// batch's instead when every limit of every ask has a lean decision. A batch is given up
    /// at its first decision's deadline, so every decision in it is given that deadline on the
    /// Redis clock too. The reply has an entry per key, whichever function answered.
    async fn run_asks(&self, asks: &[Ask]) -> redis::RedisResult<redis::Value> {
        let script = batch_script();
        let keys: usize = asks.iter().map(Ask::keys).sum();
        let redis_deadline = asks.iter().filter_map(|ask| ask.redis_deadline).min();
        // Decisions on Redis's clock under lean algorithms only: the lean batch, whose
        // arguments are the lean decisions' (a Redis without functions runs the scripts).
        let lean = asks.iter().all(Ask::is_lean);
        let command = |name: &str, script: &str| {
            let mut cmd = redis::Cmd::with_capacity(3 + keys * 8, script.len() + keys * 200);
            cmd.arg(name).arg(script).arg(keys);
            for ask in asks {
                cmd.arg(&ask.key);
                for (_, _, _, key) in &ask.more {
                    cmd.arg(key);
                }
            }
            if lean && name == "FCALL" {
                lean_batch_arguments(&mut cmd, asks, redis_deadline);
                return cmd;
            }
            for ask in asks {
                let [first, second, cost] = ask.arguments;
                let limits = std::iter::once((ask.algorithm, [first, second])).chain(
                    ask.more
                        .iter()
                        .map(|&(algorithm, arguments, _, _)| (algorithm, arguments)),
                );
                for (i, (algorithm, [first, second])) in limits.enumerate() {
                    let continued = if i < ask.more.len() { BATCH_CONTINUED } else { 0 };
                    cmd.arg(algorithm + continued).arg(first).arg(second).arg(cost);
                    match ask.now_us {
                        Some(now_us) => cmd.arg(now_us),
                        None => cmd.arg(""),
                    };
                    ask.call.arg(&mut cmd);
                    match (ask.redis_deadline, redis_deadline) {
                        (Some(_), Some(first)) => cmd.arg(first),
                        _ => cmd.arg(""),
                    };
                }
            }
            cmd
        };
        // A batch of decisions may be sent again; a refund or charge only if it never left.
        let resend = match asks.iter().all(|ask| ask.call == Call::Decide) {
            true => Resend::IfConnectionLost,
            false => Resend::IfNeverSent,
        };
        let first_key = asks.first().map_or("", |ask| ask.key.as_str());
        let function = match lean {
            true => function_library().lean(),
            false => function_library().batch(),
        };
        let reply = self
            .evaluate(script, function, first_key, command, resend)
            .await?;
        Ok(match lean {
            true => entries_of_lean_batch(reply, keys),
            false => reply,
        })
    }

    /// `command("FCALL", function)`, the [`function_library`]'s `function`; after "Function
    /// not found" (a Redis restarted, flushed or failed over, or a master of a cluster never
    /// asked before) the library is loaded on the node of `key` and the call sent again. A
    /// Redis without functions (before 7) or a user the ACL forbids `FUNCTION LOAD` is asked
    /// by scripts instead, from then on: `command("EVALSHA", hash)` of `script`, and after
    /// `NOSCRIPT` `command("EVAL", source)`, which caches the script on that node.
    async fn evaluate(
        &self,
        script: &LuaScript,
        function: &str,
        key: &str,
        command: impl Fn(&str, &str) -> redis::Cmd,
        resend: Resend,
    ) -> redis::RedisResult<redis::Value> {
        if self.functions.load(Ordering::Relaxed) {
            let cmd = command("FCALL", function);
            match self.query(&cmd, resend).await {
                Err(error) if is_function_missing(&error) => match self.load_functions(key).await {
                    Ok(()) => return self.query(&cmd, resend).await,
                    Err(error) if error.code() == Some("NOPERM") => {
                        tracing::warn!("redis refuses FUNCTION LOAD to this user: deciding by EVALSHA");
                        self.functions.store(false, Ordering::Relaxed);
                    }
                    Err(error) => return Err(error),
                },
                Err(error) if is_without_functions(&error) => {
                    tracing::warn!("redis has no functions (before 7.0): deciding by EVALSHA");
                    self.functions.store(false, Ordering::Relaxed);
                }
                reply => return reply,
            }
        }
        match self.query(&command("EVALSHA", script.hash()), resend).await {
            Err(error) if error.code() == Some("NOSCRIPT") => {
                self.query(&command("EVAL", script.source()), resend).await
            }
            reply => reply,
        }
    }

    /// `FUNCTION LOAD REPLACE` of the [`function_library`] on the node of `key` (on a cluster,
    /// the master of its slot: another master down cannot fail it). Replicas loading it at
    /// once load the same code, so REPLACE makes the later ones harmless.
    async fn load_functions(&self, key: &str) -> redis::RedisResult<()> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(function_library().source());
        let _: redis::Value = match &self.connection {
            Connection::Cluster(cluster) => {
                let route = Route::new(key_slot(key.as_bytes()), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                cluster.get().await?.route_command(cmd, routing).await?
            }
            _ => self.query(&cmd, Resend::IfConnectionLost).await?,
        };
        Ok(())
    }

    /// Run the script of `rule` on `key` (see [`evaluate`](Self::evaluate)) with its six
    /// arguments (the rule's two numbers, the cost, the pinned clock or `""`, the refund's time
    /// or `""`, the deadline on the Redis clock or `""`); a decision on Redis's clock calls the
    /// library's function that takes the four that are not empty. Routed by the key, so on a
    /// cluster only the key's master is asked: a node down elsewhere cannot fail the reload. The command is built in one buffer, and the reply left as Redis sent
    /// it for the caller to read in place: the fewest allocations a call can make.
    async fn run_script(
        &self,
        rule: &Rule,
        key: &str,
        cost: Cost,
        now_us: Option<u64>,
        call: Call,
        deadline_us: Option<u64>,
    ) -> redis::RedisResult<redis::Value> {
        let policy = rule.limits.first();
        let (script, [first, second]) = policy.script();
        // A decision on Redis's clock calls the library's decision: the algorithm's lean one
        // (its own arguments), or its script with four.
        let lean = call == Call::Decide && now_us.is_none();
        let library = function_library();
        let function = match lean {
            true => library.decide(policy.script_index()),
            false => library.script(policy.script_index()),
        };
        let command = |name: &str, script: &str| {
            let decision = lean && name == "FCALL";
            // The algorithm's lean decision: its own arguments, then the deadline.
            if let Some(arguments) = decision.then(|| policy.lean_arguments(cost)).flatten() {
                let arguments = arguments.as_slice();
                let mut cmd =
                    redis::Cmd::with_capacity(5 + arguments.len(), script.len() + key.len() + 4 * 20);
                cmd.arg(name).arg(script).arg(1).arg(key);
                for argument in arguments {
                    cmd.arg(*argument);
                }
                match deadline_us {
                    Some(deadline_us) => cmd.arg(deadline_us),
                    None => cmd.arg(""),
                };
                return cmd;
            }
            let mut cmd = redis::Cmd::with_capacity(10, script.len() + key.len() + 6 * 20);
            cmd.arg(name)
                .arg(script)
                .arg(1)
                .arg(key)
                .arg(first)
                .arg(second)
                .arg(cost.get());
            if decision {
                match deadline_us {
                    Some(deadline_us) => cmd.arg(deadline_us),
                    None => cmd.arg(""),
                };
                return cmd;
            }
            match now_us {
                Some(now_us) => cmd.arg(now_us),
                None => cmd.arg(""),
            };
            call.arg(&mut cmd);
            match deadline_us {
                Some(deadline_us) => cmd.arg(deadline_us),
                None => cmd.arg(""),
            };
            cmd
        };
        let resend = match call {
            Call::Decide | Call::Renew(_) => Resend::IfConnectionLost,
            Call::Refund(_) | Call::Charge => Resend::IfNeverSent,
        };
        self.evaluate(script, function, key, command, resend).await
    }

    /// Run `script` (the library's `function`, see [`evaluate`](Self::evaluate)) on `keys`
    /// with `args`, routed by the first key, bounded by the timeout, sent
    /// again only if it never left (a lease's take, `stores::lease`, would debit twice).
    pub(crate) async fn eval_keys(
        &self,
        script: &LuaScript,
        function: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<redis::Value, StoreError> {
        let command = |name: &str, script: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        let first_key = keys.first().map_or("", String::as_str);
        self.bounded(self.evaluate(script, function, first_key, command, Resend::IfNeverSent))
            .await
    }

    /// The client's key under each of `rule`'s limits, from its key under the first.
    pub(crate) fn keys_of(&self, rule: &Rule, first: &str) -> Vec<String> {
        limit_keys(rule, first)
    }

    /// Run `cmd`; on a single Redis (or Sentinel's master), once more at once if it failed on
    /// a connection that `resend` says was gone (see [`Resend`]). The caller's deadline bounds
    /// both.
    async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        resend: Resend,
    ) -> redis::RedisResult<T> {
        match self.query_once(cmd).await {
            Err(error) if resend.after(&error) && !self.is_cluster() => self.query_once(cmd).await,
            reply => reply,
        }
    }

    async fn query_once<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match &self.connection {
            Connection::Single(manager) => cmd.query_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => cmd.query_async(&mut cluster.get().await?).await,
            Connection::Sentinel(master) => master.query(cmd).await,
        }
    }

    async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => {
                self.timed_out();
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }

    /// A call got no answer in time: behind Sentinel, the master may be frozen or cut off,
    /// and the Sentinels are asked again.
    fn timed_out(&self) {
        if let Connection::Sentinel(master) = &self.connection {
            master.timed_out();
        }
    }
}

/// A reset: delete the client's keys (`KEYS`), then announce it (`PUBLISH ARGV[1] ARGV[2]`),
/// in one atomic step; returns how many keys were deleted. The announcement is `pcall`ed: a
/// Redis user without pub/sub rights (Redis 7's ACL default, `resetchannels`) still resets,
/// and the other replicas hear of it by their recheck instead.
///
/// A fixed or sliding window's count is on a key per window (see [`counter_key`]): for the
/// i-th key `ARGV[2 + i]` is its window in ms (empty for other algorithms), and the keys of
/// the window now on Redis's clock, the two before and the one after go too (beside `:w`, the
/// newest window counted): every count a decision on a clock that did not step back more
/// than two windows can read, the sliding window's previous count included.
const RESET_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local doomed = {}
for i = 1, #KEYS do
  doomed[#doomed + 1] = KEYS[i]
  local w = tonumber(ARGV[2 + i])
  if w and w > 0 then
    doomed[#doomed + 1] = KEYS[i] .. ':w'
    local window = math.floor(now_ms / w)
    for k = window - 2, window + 1 do
      doomed[#doomed + 1] = KEYS[i] .. ':' .. string.format('%.0f', k)
    end
  end
end
local deleted = redis.call('DEL', unpack(doomed))
redis.pcall('PUBLISH', ARGV[1], ARGV[2])
return deleted
"#;

/// A key (`{N}`, the smallest such `N`) whose hash slot is `slot`: at most a few tens of
/// thousands of CRC16s of a few bytes, once per probe of a dead master.
fn key_in_slot(slot: u16) -> String {
    let mut key = String::with_capacity(16);
    for n in 0u32.. {
        key.clear();
        key.push('{');
        key.push_str(&n.to_string());
        key.push('}');
        if key_slot(key.as_bytes()) == slot {
            break;
        }
    }
    key
}

/// Redis has the command but not the function: "ERR Function not found".
fn is_function_missing(error: &redis::RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// Redis has no `FCALL` (before 7.0): "ERR unknown command 'FCALL'...".
fn is_without_functions(error: &redis::RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with("unknown command"))
}

/// One decision's entry in a batch's reply: its script's reply, or the text of its error.
fn reply_of_one(reply: redis::Value) -> BatchReply {
    let text = match &reply {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        _ => return Ok(reply),
    };
    // "WRONGTYPE Operation against a key...": the code first, as Redis writes its errors.
    let (code, detail) = text.split_once(' ').unwrap_or((text.as_str(), ""));
    Err(StoreError::Redis(redis::make_extension_error(
        code.to_owned(),
        Some(detail.to_owned()),
    )))
}

/// The entries of one request under a rule of several limits, one per limit: the first
/// error among them, or all of them, as one reply.
fn group_reply(replies: Vec<redis::Value>) -> BatchReply {
    let replies: Result<Vec<redis::Value>, StoreError> = replies.into_iter().map(reply_of_one).collect();
    replies.map(redis::Value::Array)
}

/// What a script's reply says: a decision (five non-negative integers; under a rule of several
/// limits, an array of those, one per limit), or that the call had expired (`-1` and the Redis
/// time; under several limits, any of them expired: the deadline is the same for all).
fn answer_of(rule: &Rule, reply: &redis::Value, cost: Cost) -> Result<Answer, StoreError> {
    if rule.limits.len() == 1 {
        return Ok(match limit_answer(rule.limits.first(), reply, cost)? {
            Ok(decision) => Answer::Decided(Decision::one(decision)),
            Err(redis_us) => Answer::Expired(redis_us),
        });
    }
    let unexpected = || StoreError::Reply(format!("{reply:?}"));
    let redis::Value::Array(replies) = reply else {
        return Err(unexpected());
    };
    if replies.len() != rule.limits.len() {
        return Err(unexpected());
    }
    let mut parts = [LimitDecision::default(); MAX_LIMITS];
    for ((part, policy), reply) in parts.iter_mut().zip(rule.limits.iter()).zip(replies) {
        match limit_answer(policy, reply, cost)? {
            Ok(decision) => *part = decision,
            Err(redis_us) => return Ok(Answer::Expired(redis_us)),
        }
    }
    // A refused request spent nothing: a lean reply is the state a limit read, so what a limit
    // that allowed it has left is its decision of a cost of 0 (the full scripts give the cost
    // back and say so themselves).
    if !parts.iter().take(rule.limits.len()).all(|part| part.allowed) {
        for ((part, policy), reply) in parts.iter_mut().zip(rule.limits.iter()).zip(replies) {
            if part.allowed
                && is_lean_reply(reply)
                && let Ok(decision) = limit_answer(policy, reply, Cost::ZERO)?
            {
                *part = decision;
            }
        }
    }
    Ok(Answer::Decided(Decision::of(
        &parts[..rule.limits.len().min(MAX_LIMITS)],
    )))
}

/// One algorithm's reply under `policy` to a request of `cost`: its decision, or the Redis
/// time (µs) at which it found the call's deadline passed. The script's five numbers, or the
/// lean decision's Redis time and the state it read (see [`Algorithm::LEAN`]), whose numbers
/// the algorithm works out here.
///
/// [`Algorithm::LEAN`]: crate::algorithms::Algorithm::LEAN
fn limit_answer(
    policy: &Policy,
    reply: &redis::Value,
    cost: Cost,
) -> Result<Result<LimitDecision, u64>, StoreError> {
    let unexpected = || StoreError::Reply(format!("{reply:?}"));
    let lean = |now_us: u64, state: &[u64]| {
        policy
            .lean_decision(now_us, state, cost)
            .filter(|decision| {
                decision.retry_after.as_micros() <= u128::from(MAX_WAIT_US)
                    && decision.reset_after.as_micros() <= u128::from(MAX_WAIT_US)
            })
            .map(Ok)
            .ok_or_else(unexpected)
    };
    let fields = match reply {
        redis::Value::Array(fields) => fields,
        // A lean decision alone: its numbers in one string.
        redis::Value::BulkString(text) => {
            let (numbers, count) = lean_numbers(text).ok_or_else(unexpected)?;
            return lean(numbers[0], &numbers[1..count]);
        }
        _ => return Err(unexpected()),
    };
    let number = |field: &redis::Value| match field {
        redis::Value::Int(n) => u64::try_from(*n).map_err(|_| unexpected()),
        _ => Err(unexpected()),
    };
    let [allowed, remaining, retry_after_us, reset_after_us, at_us] = fields.as_slice() else {
        return match fields.as_slice() {
            [redis::Value::Int(-1), redis_us] => Ok(Err(number(redis_us)?)),
            [now_us, state @ ..] if state.len() <= LEAN_STATE => {
                let mut numbers = [0; LEAN_STATE];
                for (slot, field) in numbers.iter_mut().zip(state) {
                    *slot = number(field)?;
                }
                lean(number(now_us)?, &numbers[..state.len()])
            }
            _ => Err(unexpected()),
        };
    };
    let allowed = match number(allowed)? {
        0 => false,
        1 => true,
        _ => return Err(unexpected()),
    };
    let remaining = number(remaining)?;
    let wait = |field: &redis::Value| {
        number(field).and_then(|us| (us <= MAX_WAIT_US).then_some(us).ok_or_else(unexpected))
    };
    if remaining > policy.limit() {
        return Err(unexpected());
    }
    Ok(Ok(LimitDecision {
        allowed,
        limit: policy.limit(),
        remaining,
        retry_after: Duration::from_micros(wait(retry_after_us)?),
        reset_after: Duration::from_micros(wait(reset_after_us)?),
        at_us: number(at_us)?,
    }))
}

/// The lean batch's arguments after its keys (see
/// [`LEAN_FUNCTIONS`](crate::algorithms::LEAN_FUNCTIONS)): the deadline, the limits the asks
/// are under, each once (its algorithm's index and parameters), then for each key the number
/// of its limit (from 1, negative when another key of the same request follows) and the cost.
fn lean_batch_arguments(cmd: &mut redis::Cmd, asks: &[Ask], redis_deadline: Option<u64>) {
    match redis_deadline {
        Some(deadline) => cmd.arg(deadline),
        None => cmd.arg(""),
    };
    // Each key's limit: its algorithm and parameters, and its cost (the lean arguments' last).
    let limits = || {
        asks.iter().flat_map(|ask| {
            std::iter::once((ask.algorithm, &ask.lean, ask.more.is_empty()))
                .chain(
                    ask.more
                        .iter()
                        .enumerate()
                        .map(|(i, (algorithm, _, lean, _))| (*algorithm, lean, i + 1 == ask.more.len())),
                )
                .map(|(algorithm, lean, last)| {
                    let arguments = lean.as_ref().map_or(&[][..], LeanArguments::as_slice);
                    let (cost, parameters) = arguments.split_last().unwrap_or((&0, &[]));
                    (algorithm, parameters, *cost, last)
                })
        })
    };
    // The distinct limits, in order of first use: a handful for any batch.
    let mut distinct: Vec<(usize, &[u64])> = Vec::new();
    for (algorithm, parameters, _, _) in limits() {
        if !distinct.contains(&(algorithm, parameters)) {
            distinct.push((algorithm, parameters));
        }
    }
    cmd.arg(distinct.len());
    for (algorithm, parameters) in &distinct {
        cmd.arg(*algorithm);
        for parameter in *parameters {
            cmd.arg(*parameter);
        }
    }
    for (algorithm, parameters, cost, last) in limits() {
        let number = distinct
            .iter()
            .position(|limit| *limit == (algorithm, parameters))
            .map_or(0, |i| i as i64 + 1);
        cmd.arg(if last { number } else { -number }).arg(cost);
    }
}

/// The lean batch's flat reply (see [`LEAN_FUNCTIONS`](crate::algorithms::LEAN_FUNCTIONS)) as
/// the batch script's, an entry per key: the Redis time and the numbers of the key's lean
/// reply, `{-1, now}` for each past the deadline, or the error's text. A reply of another
/// shape (the batch script's, from a Redis without functions) is left as it came.
fn entries_of_lean_batch(reply: redis::Value, keys: usize) -> redis::Value {
    use redis::Value::{Array, Int};
    let Array(flat) = &reply else {
        return reply;
    };
    let (now, mut rest) = match flat.as_slice() {
        [Int(-1), now] => return Array(vec![Array(vec![Int(-1), now.clone()]); keys]),
        [Int(now), rest @ ..] => (*now, rest),
        _ => return reply,
    };
    let mut entries = Vec::with_capacity(keys);
    while let [first, tail @ ..] = rest {
        match first {
            Int(count)
                if usize::try_from(*count).is_ok_and(|count| count <= LEAN_STATE && count <= tail.len()) =>
            {
                let (numbers, tail) = tail.split_at(*count as usize);
                let mut entry = Vec::with_capacity(1 + numbers.len());
                entry.push(Int(now));
                entry.extend_from_slice(numbers);
                entries.push(Array(entry));
                rest = tail;
            }
            error @ (redis::Value::BulkString(_) | redis::Value::SimpleString(_)) => {
                entries.push(error.clone());
                rest = tail;
            }
            // Not a reply the function makes: the caller's count check fails it.
            _ => return Array(Vec::new()),
        }
    }
    Array(entries)
}

/// The numbers of a lean decision's reply as `<library>_d<i>` writes them, the Redis time
/// then at most [`LEAN_STATE`] more, in decimal, one space apart: `None` for any other text
/// (nothing else, nothing longer, no number past a Redis integer's `i64`, as a table's would
/// be: the algorithms' sums on them stay far from a `u64`'s end).
fn lean_numbers(text: &[u8]) -> Option<([u64; 1 + LEAN_STATE], usize)> {
    let mut numbers = [0; 1 + LEAN_STATE];
    let mut count = 0;
    for part in text.split(|&byte| byte == b' ') {
        if part.is_empty() {
            return None;
        }
        let mut number: u64 = 0;
        for &byte in part {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            number = number.checked_mul(10)?.checked_add(u64::from(digit))?;
        }
        if number > i64::MAX as u64 {
            return None;
        }
        *numbers.get_mut(count)? = number;
        count += 1;
    }
    Some((numbers, count))
}

/// Whether `reply` is a lean decision's (the Redis time and the state read), not a script's
/// five numbers.
fn is_lean_reply(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::Array(fields) if fields.len() <= 1 + LEAN_STATE)
}

/// The most numbers of state a lean decision's reply carries after the Redis time.
const LEAN_STATE: usize = 3;

/// The longest wait a script's reply may tell, in µs: 2^52, over 140 years, past anything
/// the scripts can mean (a window or a refill is below 2^50 µs, and a debt at most one more),
/// and a number Lua's doubles still hold exactly.
pub const MAX_WAIT_US: u64 = 1 << 52;

/// The longest last two parts of a key (`:` and the algorithm's suffix, `:` and 8 hex
/// digits): room kept for them.
const LIMIT_PART: usize = 24;

/// Write the last two parts of a key under `rule`'s `index`-th limit:
/// `:{algorithm}:{fingerprint in hex}`.
fn push_limit_part(key: &mut String, rule: &Rule, index: usize) {
    key.push(':');
    key.push_str(rule.limits[index].key_suffix());
    key.push(':');
    let fingerprint = rule.limits.fingerprint(index);
    for shift in (0..8).rev() {
        let digit = (fingerprint >> (shift * 4)) & 0xF;
        key.push(char::from_digit(digit, 16).unwrap_or('0'));
    }
}

/// How long a fixed window's count lives after its first count, in ms: the window, and a
/// second more (a key counted first a little before its window began on Redis's own clock,
/// the clock estimate's error, still lasts past the window's end; and a TTL of at least a
/// second). The fixed window's script and the lease's take use the same.
pub fn counter_ttl_ms(window_ms: u64) -> u64 {
    window_ms.saturating_add(1_000)
}

/// How long a sliding window's count lives after its first count, in ms: two windows (it is
/// the previous count through the window after its own) and a second more, as
/// [`counter_ttl_ms`]. The sliding window's scripts and the lease's take use the same.
pub fn sliding_counter_ttl_ms(window_ms: u64) -> u64 {
    window_ms.saturating_mul(2).saturating_add(1_000)
}

/// A limit decided on its windows' counters without a script
/// ([`RedisStore::count`]).
#[derive(Debug, Clone, Copy)]
enum Windowed {
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
}

impl Windowed {
    /// The window `policy` is, if it is one.
    fn of(policy: &Policy) -> Option<Windowed> {
        match policy {
            Policy::FixedWindow(window) => Some(Windowed::Fixed(*window)),
            Policy::SlidingWindow(window) => Some(Windowed::Sliding(*window)),
            _ => None,
        }
    }

    /// Whether every one of `limits` (at most [`MAX_LIMITS`]) is a fixed or sliding window.
    fn all(limits: &[Policy]) -> bool {
        limits.len() <= MAX_LIMITS && limits.iter().all(|policy| Windowed::of(policy).is_some())
    }

    fn limit_and_window_ms(self) -> (u64, u64) {
        match self {
            Windowed::Fixed(window) => (window.limit, window.window_ms),
            Windowed::Sliding(window) => (window.limit, window.window_ms),
        }
    }

    /// How long a window's count lives after its first count.
    fn counter_ttl_ms(self) -> u64 {
        match self {
            Windowed::Fixed(window) => counter_ttl_ms(window.window_ms),
            Windowed::Sliding(window) => sliding_counter_ttl_ms(window.window_ms),
        }
    }
}

/// Append to a window's key (the client's key under a fixed or sliding window) `:` and the
/// window's index: the key of that window's count, in the key's hash slot
/// (scripts/fixed_window.lua and scripts/sliding_window.lua name it alike).
pub fn counter_key(key: &mut String, index: u64) {
    use std::fmt::Write;
    key.push(':');
    // Writing to a String cannot fail.
    let _ = write!(key, "{index}");
}

/// The key under `rule`'s `index`-th limit of the client whose key under its first limit is
/// `first`: the same up to the hash tag's end, then the limit's own last two parts.
fn limit_key(rule: &Rule, first: &str, index: usize) -> String {
    // The first limit's parts: `:`, its suffix, `:`, 8 digits.
    let tail = rule.limits.first().key_suffix().len() + 10;
    let base = &first[..first.len().saturating_sub(tail)];
    let mut key = String::with_capacity(base.len() + LIMIT_PART);
    key.push_str(base);
    push_limit_part(&mut key, rule, index);
    key
}

/// The client's key under each of `rule`'s limits, in order, from its key under the first.
fn limit_keys(rule: &Rule, first: &str) -> Vec<String> {
    std::iter::once(first.to_owned())
        .chain((1..rule.limits.len()).map(|index| limit_key(rule, first, index)))
        .collect()
}

/// TLS is rustls with the ring provider; trusted roots are the system's (or `SSL_CERT_FILE`).
/// Installing it twice is harmless, so the result is ignored.
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl LazyCluster {
    async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        self.connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

/// The guard's view of Redis: the inherent methods, by the names the guard knows them by.
impl Remote for RedisStore {
    const NAME: &'static str = "redis";

    fn key(&self, rule: &Rule, client: ClientKey) -> String {
        RedisStore::key(self, rule, client)
    }

    fn check_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: String,
        cost: Cost,
        clock: &'a RedisClock,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        RedisStore::check_key(self, rule, key, cost, clock)
    }

    fn refund_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: Cost,
        at_us: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        RedisStore::refund_key(self, rule, key, cost, at_us)
    }

    fn charge_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: Cost,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        RedisStore::charge_key(self, rule, key, cost)
    }

    fn renew_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: Cost,
        at_us: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        RedisStore::renew_key(self, rule, key, cost, at_us)
    }

    fn inspect_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        RedisStore::inspect_key(self, rule, key)
    }

    fn reset_key<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        client: ClientKey,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        RedisStore::reset_key(self, rule, key, client)
    }

    fn reset_feed(&self) -> impl Future<Output = Result<Option<ResetFeed>, StoreError>> + Send + '_ {
        RedisStore::reset_feed(self)
    }

    fn take_lease<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        want: Want,
        replica: &'a str,
        clock: &'a RedisClock,
        sent: tokio::time::Instant,
    ) -> impl Future<Output = Result<Taken, StoreError>> + Send + 'a {
        let deadline_us = clock.redis_time(sent + self.timeout);
        crate::stores::lease::take(self, rule, key, want, replica, Some(deadline_us))
    }

    fn is_cluster(&self) -> bool {
        RedisStore::is_cluster(self)
    }

    fn clock(&self) -> &Arc<RedisClock> {
        RedisStore::clock(self)
    }

    fn time(&self, slot: Option<u16>) -> impl Future<Output = Result<u64, StoreError>> + Send + '_ {
        RedisStore::time(self, slot)
    }

    fn slot_map(&self) -> impl Future<Output = Result<Option<SlotMap>, StoreError>> + Send + '_ {
        RedisStore::slot_map(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_in_every_slot() {
        for slot in [0, 1, 4725, 8191, 12182, 16383] {
            assert_eq!(key_slot(key_in_slot(slot).as_bytes()), slot);
        }
    }

    #[test]
    fn passwords_never_reach_a_description() {
        assert_eq!(redact_url("redis://:hunter2@db:6379/0"), "redis://:***@db:6379/0");
        assert_eq!(redact_url("rediss://me:hunter2@db"), "rediss://me:***@db");
        assert_eq!(redact_url("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact_url("garbage"), "***");
        assert_eq!(redact_url("redis://:hun/ter2@db/0"), "redis://:***@db/0");
        assert_eq!(redact_url("rediss://me:a?b/c@db"), "rediss://me:***@db");
        let target = RedisTarget::Cluster {
            nodes: vec!["a:1".into()],
            password: Some("hunter2".into()),
            tls: false,
        };
        assert!(!format!("{target:?}").contains("hunter2"));
    }

    /// A reply no script could have meant is refused, as that key's problem: a negative or
    /// out-of-range number (what a wrapped cost used to make a script return).
    #[test]
    fn replies_out_of_range_are_not_decisions() {
        use redis::Value::{Array, Int};
        let policy = crate::algorithms::Policy::TokenBucket(crate::algorithms::TokenBucket {
            capacity: 3,
            interval_us: 1_000_000,
        });
        let reply = |fields: [i64; 5]| Array(fields.into_iter().map(Int).collect());
        let decided = limit_answer(&policy, &reply([1, 2, 0, 1_000_000, 7]), Cost::ONE).unwrap();
        assert_eq!(decided.map(|d| (d.allowed, d.remaining)), Ok((true, 2)));
        let wait = MAX_WAIT_US as i64;
        for fields in [
            [0, 0, i64::MIN, 0, 7],
            [2, 0, 0, 0, 7],
            [1, 4, 0, 0, 7],
            [0, 0, wait + 1, 0, 7],
            [0, 0, 0, wait + 1, 7],
            [0, 0, 0, 0, -1],
        ] {
            assert!(
                matches!(
                    limit_answer(&policy, &reply(fields), Cost::ONE),
                    Err(StoreError::Reply(_))
                ),
                "{fields:?}"
            );
        }
        assert!(limit_answer(&policy, &reply([0, 0, wait, wait, 7]), Cost::ONE).is_ok());
    }

    /// A lean decision alone answers its numbers as one string: read as the table was, and any
    /// other text is no decision (never a panic, never a number made up).
    #[test]
    fn a_lean_reply_in_one_string_is_read_and_no_other_text_is() {
        let policy = crate::algorithms::Policy::TokenBucket(crate::algorithms::TokenBucket {
            capacity: 3,
            interval_us: 1_000_000,
        });
        let text = |text: &str| redis::Value::BulkString(text.as_bytes().to_vec());
        let as_table = redis::Value::Array(vec![redis::Value::Int(5_000_000), redis::Value::Int(5_500_000)]);
        let decided = limit_answer(&policy, &text("5000000 5500000"), Cost::ONE)
            .unwrap()
            .unwrap();
        assert_eq!(Ok(decided), limit_answer(&policy, &as_table, Cost::ONE).unwrap());
        assert!(decided.allowed);
        // A sliding window's client never seen: the time alone.
        let window = crate::algorithms::Policy::SlidingWindow(crate::algorithms::SlidingWindow {
            limit: 5,
            window_ms: 1_000,
        });
        for state in ["5000000", "5000000 5000 1 2"] {
            let decided = limit_answer(&window, &text(state), Cost::ONE).unwrap().unwrap();
            assert!(decided.allowed, "{state}");
        }
        for bad in [
            "",
            " ",
            "5000000 ",
            " 5000000",
            "5000000  5500000",
            "-5000000 5500000",
            "5000000 -1",
            "5000000 5.5",
            "5000000 1 2 3 4",
            "18446744073709551616 1",
            "18446744073709551615 1",
            "9223372036854775808 1",
            "99999999999999999999999 1",
            "WRONGTYPE Operation against a key",
        ] {
            assert!(
                matches!(
                    limit_answer(&policy, &text(bad), Cost::ONE),
                    Err(StoreError::Reply(_))
                ),
                "{bad:?}"
            );
        }
        // The largest numbers a Redis integer holds decide (or are refused as out of range),
        // never overflow: a time and a state at i64::MAX under either algorithm.
        for policy in [&policy, &window] {
            for extreme in [
                "9223372036854775807 9223372036854775807",
                "9223372036854775807 0 0 0",
            ] {
                let answer = limit_answer(policy, &text(extreme), Cost::ONE);
                assert!(
                    matches!(answer, Ok(Ok(_)) | Err(StoreError::Reply(_))),
                    "{policy:?} {extreme}: {answer:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn keys_share_a_hash_tag_per_client_and_rule() {
        let store = RedisStore::new(
            &RedisTarget::Single("redis://127.0.0.1:1".into()),
            "tollgate:",
            Duration::from_millis(10),
        )
        .unwrap();
        let policy = crate::algorithms::Policy::TokenBucket(crate::algorithms::TokenBucket {
            capacity: 1,
            interval_us: 1,
        });
        let rule = Rule::new(1, "auth", policy);
        let ip: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let numbers = format!("{:08x}", policy.fingerprint());
        assert_eq!(
            store.key(&rule, ip.into()),
            format!("tollgate:{{auth:2001:db8::1}}:tb:{numbers}")
        );
        let grouped = ClientKey::Ip(crate::rules::ClientIp::new(ip, 64));
        assert_eq!(
            store.key(&rule, grouped),
            format!("tollgate:{{auth:2001:db8::/64}}:tb:{numbers}")
        );
        let other = crate::algorithms::Policy::TokenBucket(crate::algorithms::TokenBucket {
            capacity: 2,
            interval_us: 1,
        });
        assert_ne!(
            other.fingerprint(),
            policy.fingerprint(),
            "other numbers, another key"
        );
    }
}
