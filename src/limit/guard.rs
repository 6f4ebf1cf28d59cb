//! What happens when the Redis store fails: the fail mode and the circuit breaker.
//!
//! A failed or slow call costs at most `REDIS_TIMEOUT_MS`. After `REDIS_BREAKER_THRESHOLD`
//! consecutive failures the breaker opens: from then on every decision is immediate (the fail
//! mode, without asking Redis) and one background task pings Redis every
//! `REDIS_PROBE_INTERVAL_MS`. The first successful ping closes the breaker and limiting
//! resumes by itself. So an outage never makes every request wait for a timeout, and never
//! turns into an outage of the backend (with `FAIL_MODE=open` or `local`).
//!
//! `FAIL_MODE=local` keeps limiting during the outage with a memory store of this replica's
//! own: each replica then enforces the full budget by itself (so N replicas allow up to N
//! times the budget), which protects the backend without refusing anyone.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use std::num::NonZeroUsize;

use crate::limit::denials::DenialCache;
use crate::limit::{ClientKey, MemoryStore, RedisStore, Rule, StoreError, Verdict};

/// What to do with a request when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Forward it unlimited (`FAIL_MODE=open`, the default): Redis trouble never blocks users.
    Open,
    /// Refuse it with 503 (`FAIL_MODE=closed`): the backend is never unprotected.
    Closed,
    /// Decide it with this replica's own memory store (`FAIL_MODE=local`).
    Local,
}

impl FailMode {
    /// The value as written in `FAIL_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}

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

    fn of(error: &StoreError) -> RedisErrorKind {
        match error {
            StoreError::Timeout(_) => RedisErrorKind::Timeout,
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

/// The breaker's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    /// `FAIL_MODE`.
    pub fail_mode: FailMode,
    /// `REDIS_BREAKER_THRESHOLD`: consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// `REDIS_PROBE_INTERVAL_MS`: how often an open breaker checks whether Redis is back.
    pub probe_interval: Duration,
}

/// A Redis store behind a circuit breaker. Cheap to clone; clones share the breaker.
#[derive(Clone)]
pub struct Guard {
    inner: Arc<Inner>,
}

struct Inner {
    store: RedisStore,
    settings: GuardSettings,
    /// Decides while Redis cannot: the fail mode, with its memory store for `local`.
    fallback: Fallback,
    /// Failures since the last success; reset by any success.
    consecutive_failures: AtomicU32,
    /// True while the breaker is open: decisions skip Redis and a probe task runs.
    open: AtomicBool,
    /// Requests answered by the fail mode since the outage began, for the outage's log lines.
    degraded: AtomicU64,
    /// Failed calls since startup, by [`RedisErrorKind`].
    errors: [AtomicU64; RedisErrorKind::ALL.len()],
    /// Denials repeated without asking Redis until their retry time.
    denials: DenialCache,
}

enum Fallback {
    Open,
    Closed,
    Local(MemoryStore),
}

/// While the breaker stays open, how often the probe repeats that requests are degraded.
const OUTAGE_REPORT_INTERVAL: Duration = Duration::from_secs(10);

impl Guard {
    /// Guard `store` with `settings`; `max_keys` bounds the memory store of `FAIL_MODE=local`,
    /// which serves `rules`.
    pub fn new(store: RedisStore, settings: GuardSettings, max_keys: NonZeroUsize, rules: &[Rule]) -> Self {
        let fallback = match settings.fail_mode {
            FailMode::Open => Fallback::Open,
            FailMode::Closed => Fallback::Closed,
            FailMode::Local => Fallback::Local(MemoryStore::new(max_keys, rules)),
        };
        Guard {
            inner: Arc::new(Inner {
                store,
                settings,
                fallback,
                consecutive_failures: AtomicU32::new(0),
                open: AtomicBool::new(false),
                degraded: AtomicU64::new(0),
                errors: Default::default(),
                denials: DenialCache::new(max_keys),
            }),
        }
    }

    /// Ask Redis, unless it has already refused this request until later (see
    /// [`DenialCache`]) or the breaker is open.
    pub async fn check(&self, rule: &Rule, client: ClientKey, cost: u64) -> Verdict {
        let inner = &self.inner;
        if let Some(denial) = inner.denials.check(rule, client, cost) {
            return Verdict::Decided(denial);
        }
        if inner.open.load(Ordering::Acquire) {
            return self.fall_back(rule, client, cost);
        }
        let sent = Instant::now();
        match inner.store.check(rule, client, cost).await {
            Ok(decision) => {
                // Read first: a store on every request would bounce the cache line.
                if inner.consecutive_failures.load(Ordering::Relaxed) != 0 {
                    inner.consecutive_failures.store(0, Ordering::Relaxed);
                }
                inner.denials.remember(rule, client, cost, &decision, sent);
                Verdict::Decided(decision)
            }
            Err(error) => {
                self.record_failure(&error);
                self.fall_back(rule, client, cost)
            }
        }
    }

    /// Refund a decision Redis made (see [`RedisStore::refund`]). While the breaker is open
    /// Redis is not asked: the cost stays spent, erring toward the limit.
    pub async fn refund(&self, rule: &Rule, client: ClientKey, cost: u64, at_us: u64) {
        if self.inner.open.load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = self.inner.store.refund(rule, client, cost, at_us).await {
            self.record_failure(&error);
        }
    }

    /// True while the breaker is open: requests get the fail mode without asking Redis.
    pub fn is_open(&self) -> bool {
        self.inner.open.load(Ordering::Acquire)
    }

    /// The fail mode and breaker settings.
    pub fn settings(&self) -> &GuardSettings {
        &self.inner.settings
    }

    /// Requests refused from the denial cache, without asking Redis, since startup.
    pub fn cached_denials(&self) -> u64 {
        self.inner.denials.hits()
    }

    /// Failed calls of `kind` since startup.
    pub fn errors(&self, kind: RedisErrorKind) -> u64 {
        self.inner.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// The memory store of `FAIL_MODE=local`, if that is the mode (the server purges it).
    pub fn local_store(&self) -> Option<&MemoryStore> {
        match &self.inner.fallback {
            Fallback::Local(store) => Some(store),
            Fallback::Open | Fallback::Closed => None,
        }
    }

    fn fall_back(&self, rule: &Rule, client: ClientKey, cost: u64) -> Verdict {
        self.inner.degraded.fetch_add(1, Ordering::Relaxed);
        match &self.inner.fallback {
            Fallback::Open => Verdict::FailOpen,
            Fallback::Closed => Verdict::FailClosed,
            Fallback::Local(store) => Verdict::DecidedLocally(store.check(rule, client, cost)),
        }
    }

    fn record_failure(&self, error: &StoreError) {
        let inner = &self.inner;
        inner.errors[RedisErrorKind::of(error) as usize].fetch_add(1, Ordering::Relaxed);
        if error.is_about_one_key() {
            // Redis answered: one key's trouble says nothing of its health, and an open
            // breaker would hand every other client the fail mode too.
            tracing::warn!(%error, "rate-limit store call failed for this key alone");
            return;
        }
        let failures = inner.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(%error, consecutive_failures = failures, "rate-limit store call failed");
        if failures >= inner.settings.failure_threshold && !inner.open.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                fail_mode = inner.settings.fail_mode.as_str(),
                probe_interval_ms = inner.settings.probe_interval.as_millis() as u64,
                "circuit breaker open: redis is not asked until a probe succeeds; requests are {}",
                match inner.settings.fail_mode {
                    FailMode::Open => "forwarded without limiting",
                    FailMode::Closed => "refused with 503",
                    FailMode::Local => "limited by this replica alone",
                }
            );
            tokio::spawn(probe(Arc::downgrade(&self.inner)));
        }
    }
}

/// Ping until Redis answers, then close the breaker. Ends early if the gateway is gone.
/// Every [`OUTAGE_REPORT_INTERVAL`] it logs how many requests the fail mode has answered.
async fn probe(inner: Weak<Inner>) {
    let mut last_report = Instant::now();
    loop {
        let Some(interval) = inner.upgrade().map(|inner| inner.settings.probe_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // The connection manager remembers a failed reconnect and starts a new one only when
        // a call fails on it: after a connection error, ask again at once, so a Redis that
        // came back since the last probe is seen now rather than one interval later.
        let answer = match inner.store.ping().await {
            Err(error) if RedisErrorKind::of(&error) == RedisErrorKind::Connection => {
                inner.store.ping().await
            }
            answer => answer,
        };
        match answer {
            Ok(()) => {
                inner.consecutive_failures.store(0, Ordering::Relaxed);
                inner.open.store(false, Ordering::Release);
                tracing::info!(
                    degraded_requests = inner.degraded.swap(0, Ordering::Relaxed),
                    "circuit breaker closed: redis answers again, limiting resumes"
                );
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "redis probe failed; breaker stays open");
                if last_report.elapsed() >= OUTAGE_REPORT_INTERVAL {
                    last_report = Instant::now();
                    tracing::warn!(
                        %error,
                        fail_mode = inner.settings.fail_mode.as_str(),
                        degraded_requests = inner.degraded.load(Ordering::Relaxed),
                        "redis still unavailable; requests are answered by the fail mode"
                    );
                }
            }
        }
    }
}
