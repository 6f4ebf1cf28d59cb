//! The guard's logic against [`FailingStore`], a remote that answers or fails on command: the
//! breaker's threshold, the probe, each fail mode, errors about one key, the denial cache.
//! On paused tokio time, so the probe's intervals pass at once and in order. (The same
//! behaviour against a real `redis-server` killed and paused is `tests/it/faults.rs`'s.)

use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::algorithms::TokenBucket;
use crate::algorithms::{LimitDecision, Policy};

const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// A single-node remote whose every call answers what the test last said.
#[derive(Clone, Default)]
struct FailingStore {
    /// Shared with the test, which keeps a clone to command it and read what was asked.
    control: Arc<Control>,
}

#[derive(Default)]
struct Control {
    /// What decisions answer: an allowed decision when `None`.
    reply: Mutex<Option<Result<Decision, StoreError>>>,
    /// Decisions and refunds asked.
    calls: AtomicU64,
    /// Probes (`time`) asked.
    probes: AtomicU64,
    /// The clock estimate the guard's single breaker keeps.
    clock: Arc<RedisClock>,
}

impl FailingStore {
    /// Every call fails with `error` from now on.
    fn fail_with(&self, error: StoreError) {
        *self.control.reply.lock().unwrap() = Some(Err(error));
    }

    /// Decisions answer `decision` from now on (and calls succeed).
    fn answer(&self, decision: Decision) {
        *self.control.reply.lock().unwrap() = Some(Ok(decision));
    }

    /// Every call succeeds from now on.
    fn heal(&self) {
        *self.control.reply.lock().unwrap() = None;
    }

    fn calls(&self) -> u64 {
        self.control.calls.load(Ordering::Relaxed)
    }

    fn probes(&self) -> u64 {
        self.control.probes.load(Ordering::Relaxed)
    }

    fn reply(&self) -> Result<Decision, StoreError> {
        self.control.reply.lock().unwrap().clone().unwrap_or(Ok(ALLOWED))
    }
}

const ALLOWED: Decision = Decision::one(LimitDecision {
    allowed: true,
    limit: 10,
    remaining: 9,
    retry_after: Duration::ZERO,
    reset_after: Duration::from_secs(1),
    at_us: 1,
});

impl Remote for FailingStore {
    const NAME: &'static str = "failing";

    fn key(&self, rule: &Rule, client: ClientKey) -> String {
        let mut key = format!("{{{}:", rule.name);
        client.push_to(&mut key);
        key.push('}');
        key
    }

    fn check_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: String,
        _cost: Cost,
        _clock: &'a RedisClock,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        self.control.calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply())
    }

    fn refund_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
        _cost: Cost,
        _at_us: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.control.calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply().map(drop))
    }

    fn charge_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
        _cost: Cost,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.control.calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply().map(drop))
    }

    fn inspect_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        self.control.calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply())
    }

    fn reset_key<'a>(
        &'a self,
        _rule: &'a Rule,
        _key: &'a str,
        _client: ClientKey,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        self.control.calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply().map(|_| true))
    }

    fn is_cluster(&self) -> bool {
        false
    }

    fn clock(&self) -> &Arc<RedisClock> {
        &self.control.clock
    }

    fn time(&self, _slot: Option<u16>) -> impl Future<Output = Result<u64, StoreError>> + Send + '_ {
        self.control.probes.fetch_add(1, Ordering::Relaxed);
        std::future::ready(self.reply().map(|_| 1_700_000_000_000_000))
    }

    fn slot_map(&self) -> impl Future<Output = Result<Option<SlotMap>, StoreError>> + Send + '_ {
        std::future::ready(Ok(None))
    }
}

fn rule(id: u16, name: &str, fail_mode: FailMode) -> Rule {
    let policy = Policy::TokenBucket(TokenBucket {
        capacity: 1,
        interval_us: 60_000_000,
    });
    Rule {
        fail_mode,
        ..Rule::new(id, name, policy)
    }
}

fn guarded(rules: &[Rule], failure_threshold: u32) -> (Guard<FailingStore>, FailingStore) {
    let store = FailingStore::default();
    let settings = GuardSettings {
        failure_threshold,
        probe_interval: PROBE_INTERVAL,
    };
    let guard = Guard::new(store.clone(), settings, NonZeroUsize::new(100).unwrap(), rules);
    (guard, store)
}

fn client(n: u8) -> ClientKey {
    std::net::IpAddr::from([10, 0, 0, n]).into()
}

fn timeout() -> StoreError {
    StoreError::Timeout(Duration::from_millis(50))
}

fn breakers(guard: &Guard<FailingStore>) -> BreakerStats {
    guard.stats().breakers.unwrap()
}

const CLOSED: BreakerStats = BreakerStats {
    open: 0,
    total: 1,
    all_open: false,
};

const OPEN: BreakerStats = BreakerStats {
    open: 1,
    total: 1,
    all_open: true,
};

#[tokio::test(start_paused = true)]
async fn the_threshold_opens_the_breaker_and_an_open_breaker_asks_nothing() {
    let rules = [rule(0, "general", FailMode::Open)];
    let (guard, store) = guarded(&rules, 3);
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::Decided(ALLOWED)
    );
    store.fail_with(timeout());
    for failures in 1..=3 {
        assert_eq!(breakers(&guard), CLOSED, "closed before failure {failures}");
        assert_eq!(
            guard.check(&rules[0], client(1), Cost::ONE).await,
            Verdict::FailOpen
        );
    }
    assert_eq!(breakers(&guard), OPEN);
    assert_eq!(store.calls(), 4);
    // Open: answered at once by the fail mode, the store not asked, refunds not sent.
    for n in 0..10 {
        assert_eq!(
            guard.check(&rules[0], client(n), Cost::ONE).await,
            Verdict::FailOpen
        );
    }
    guard
        .refund(&rules[0], client(1), Cost::ONE, &Verdict::Decided(ALLOWED))
        .await;
    assert_eq!(store.calls(), 4);
    let stats = guard.stats();
    assert_eq!(stats.errors(RedisErrorKind::Timeout), 3);
    assert_eq!(stats.errors(RedisErrorKind::Connection), 0);
    assert_eq!(stats.kind, "failing");
}

#[tokio::test(start_paused = true)]
async fn a_success_starts_the_count_of_failures_again() {
    let rules = [rule(0, "general", FailMode::Open)];
    let (guard, store) = guarded(&rules, 3);
    for _ in 0..3 {
        store.fail_with(timeout());
        for _ in 0..2 {
            assert_eq!(
                guard.check(&rules[0], client(1), Cost::ONE).await,
                Verdict::FailOpen
            );
        }
        store.heal();
        assert_eq!(
            guard.check(&rules[0], client(1), Cost::ONE).await,
            Verdict::Decided(ALLOWED)
        );
    }
    assert_eq!(breakers(&guard), CLOSED);
}

#[tokio::test(start_paused = true)]
async fn the_first_answered_probe_closes_the_breaker() {
    let rules = [rule(0, "general", FailMode::Closed)];
    let (guard, store) = guarded(&rules, 1);
    store.fail_with(timeout());
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::FailClosed
    );
    assert_eq!(breakers(&guard), OPEN);
    // Each interval the probe asks once, and a failed probe leaves it open. (A timeout is not
    // a connection error, so it is not asked again at once.)
    tokio::time::sleep(PROBE_INTERVAL * 3 + PROBE_INTERVAL / 2).await;
    assert_eq!(store.probes(), 3);
    assert_eq!(breakers(&guard), OPEN);
    assert_eq!(store.calls(), 1);
    store.heal();
    tokio::time::sleep(PROBE_INTERVAL).await;
    assert_eq!(store.probes(), 4);
    assert_eq!(breakers(&guard), CLOSED);
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::Decided(ALLOWED)
    );
    assert_eq!(store.calls(), 2);
    // Closed, the probe has stopped.
    tokio::time::sleep(PROBE_INTERVAL * 5).await;
    assert_eq!(store.probes(), 4);
}

#[tokio::test(start_paused = true)]
async fn each_rule_gets_its_own_fail_mode() {
    let rules = [
        rule(0, "auth", FailMode::Local),
        rule(1, "api", FailMode::Closed),
        rule(2, "general", FailMode::Open),
    ];
    let (guard, store) = guarded(&rules, 1);
    store.fail_with(timeout());
    // Before the breaker opens (the failed call) and after.
    for _ in 0..2 {
        assert_eq!(
            guard.check(&rules[1], client(1), Cost::ONE).await,
            Verdict::FailClosed
        );
        assert_eq!(
            guard.check(&rules[2], client(1), Cost::ONE).await,
            Verdict::FailOpen
        );
    }
    assert_eq!(breakers(&guard), OPEN);
    // `local`: this replica's own budget of 1, which a refund gives back to the local store.
    let first = guard.check(&rules[0], client(1), Cost::ONE).await;
    let Verdict::DecidedLocally(decision) = &first else {
        panic!("{first:?}");
    };
    assert!(decision.allowed);
    let Verdict::DecidedLocally(denied) = guard.check(&rules[0], client(1), Cost::ONE).await else {
        panic!("not decided locally");
    };
    assert!(!denied.allowed);
    assert_eq!(guard.stats().clients, 1);
    guard.refund(&rules[0], client(1), Cost::ONE, &first).await;
    let again = guard.check(&rules[0], client(1), Cost::ONE).await;
    assert!(
        matches!(&again, Verdict::DecidedLocally(decision) if decision.allowed),
        "{again:?}"
    );
    assert_eq!(store.calls(), 1);
    assert_eq!(
        guard.fail_modes(),
        [
            ("auth".into(), FailMode::Local),
            ("api".into(), FailMode::Closed),
            ("general".into(), FailMode::Open)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_about_one_key_never_opens_the_breaker() {
    let rules = [rule(0, "general", FailMode::Closed)];
    let (guard, store) = guarded(&rules, 2);
    let wrong_type =
        redis::parse_redis_value(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n")
            .unwrap()
            .extract_error()
            .unwrap_err();
    let error = StoreError::Redis(wrong_type);
    assert!(error.is_about_one_key());
    store.fail_with(error);
    for _ in 0..10 {
        // That client's request gets the fail mode; the breaker stays closed for the others.
        assert_eq!(
            guard.check(&rules[0], client(1), Cost::ONE).await,
            Verdict::FailClosed
        );
    }
    assert_eq!(store.calls(), 10);
    assert_eq!(breakers(&guard), CLOSED);
    assert_eq!(guard.stats().errors(RedisErrorKind::Script), 10);
}

/// Only a store that cannot be reached feeds the breaker (issue 26): an answer no script
/// could have meant (a hostile cost's reply out of range, once) and an error reply Redis gave
/// at once (`OOM`) are that request's fail mode, however many in a row; timeouts still open it.
#[tokio::test(start_paused = true)]
async fn only_timeouts_and_connection_failures_open_the_breaker() {
    let rules = [rule(0, "general", FailMode::Closed)];
    let (guard, store) = guarded(&rules, 3);
    let oom = redis::parse_redis_value(b"-OOM command not allowed when used memory > 'maxmemory'\r\n")
        .unwrap()
        .extract_error()
        .unwrap_err();
    for error in [
        StoreError::Reply("[Int(0), Int(0), Int(-9223372036854775808), Int(0), Int(1)]".into()),
        StoreError::Redis(oom),
    ] {
        store.fail_with(error);
        for _ in 0..10 {
            assert_eq!(
                guard.check(&rules[0], client(1), Cost::ONE).await,
                Verdict::FailClosed
            );
        }
        assert_eq!(breakers(&guard), CLOSED);
    }
    assert_eq!(guard.stats().errors(RedisErrorKind::Reply), 10);
    assert_eq!(guard.stats().errors(RedisErrorKind::Script), 10);
    store.fail_with(timeout());
    for _ in 0..3 {
        assert_eq!(
            guard.check(&rules[0], client(1), Cost::ONE).await,
            Verdict::FailClosed
        );
    }
    assert_eq!(breakers(&guard), OPEN);
}

#[tokio::test(start_paused = true)]
async fn a_denial_is_repeated_until_its_retry_time_without_asking() {
    let rules = [rule(0, "general", FailMode::Open)];
    let (guard, store) = guarded(&rules, 1);
    let denial = Decision {
        allowed: false,
        remaining: 0,
        retry_after: Duration::from_secs(2),
        ..ALLOWED
    };
    store.answer(denial.clone());
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::Decided(denial.clone())
    );
    for _ in 0..5 {
        let cached = guard.check(&rules[0], client(1), Cost::ONE).await;
        assert!(
            matches!(&cached, Verdict::Decided(decision) if !decision.allowed),
            "{cached:?}"
        );
    }
    assert_eq!(store.calls(), 1);
    assert_eq!(guard.stats().cached_denials, 5);
    // Another client is asked about; so is this one after its retry time.
    store.heal();
    assert_eq!(
        guard.check(&rules[0], client(2), Cost::ONE).await,
        Verdict::Decided(ALLOWED)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::Decided(ALLOWED)
    );
    assert_eq!(store.calls(), 3);
}

/// The cache answers only the request Redis refused: a costlier one may have to wait longer
/// (or for another limit) than the denial says, so Redis answers it, and so it does a cheaper
/// one, whose admission forgets the denial (what it spent puts the retry time off).
#[tokio::test(start_paused = true)]
async fn a_denial_answers_only_its_own_cost_and_an_admission_forgets_it() {
    let rules = [rule(0, "general", FailMode::Open)];
    let (guard, store) = guarded(&rules, 1);
    let two = Cost::saturating(2);
    let denial = Decision {
        allowed: false,
        remaining: 0,
        retry_after: Duration::from_secs(60),
        ..ALLOWED
    };
    store.answer(denial.clone());
    assert_eq!(
        guard.check(&rules[0], client(1), two).await,
        Verdict::Decided(denial.clone())
    );
    let refused = |verdict: &Verdict| matches!(verdict, Verdict::Decided(decision) if !decision.allowed);
    assert!(refused(&guard.check(&rules[0], client(1), two).await));
    assert_eq!((store.calls(), guard.stats().cached_denials), (1, 1));
    // Costlier: Redis is asked (and its denial, the costlier one's, is remembered instead).
    let longer = Decision {
        retry_after: Duration::from_secs(90),
        ..denial.clone()
    };
    store.answer(longer.clone());
    let three = Cost::saturating(3);
    assert_eq!(
        guard.check(&rules[0], client(1), three).await,
        Verdict::Decided(longer)
    );
    assert_eq!(store.calls(), 2);
    assert!(refused(&guard.check(&rules[0], client(1), three).await));
    assert_eq!((store.calls(), guard.stats().cached_denials), (2, 2));
    // Cheaper, and admitted: the denial is forgotten, and the next request of its cost asks.
    store.heal();
    assert_eq!(
        guard.check(&rules[0], client(1), Cost::ONE).await,
        Verdict::Decided(ALLOWED)
    );
    store.answer(denial.clone());
    assert_eq!(
        guard.check(&rules[0], client(1), three).await,
        Verdict::Decided(denial)
    );
    assert_eq!((store.calls(), guard.stats().cached_denials), (4, 2));
}

#[tokio::test(start_paused = true)]
async fn while_redis_cannot_be_asked_a_denial_holds_until_its_retry_time_in_every_fail_mode() {
    for fail_mode in [FailMode::Open, FailMode::Local, FailMode::Closed] {
        let rules = [rule(0, "general", fail_mode)];
        let (guard, store) = guarded(&rules, 2);
        let denial = Decision {
            allowed: false,
            remaining: 0,
            retry_after: Duration::from_secs(1000),
            ..ALLOWED
        };
        store.answer(denial);
        assert!(
            matches!(guard.check(&rules[0], client(1), Cost::ONE).await, Verdict::Decided(d) if !d.allowed)
        );
        // Past the recheck, Redis fails: the call is made, then the denial answers.
        store.fail_with(timeout());
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..2 {
            let verdict = guard.check(&rules[0], client(1), Cost::ONE).await;
            assert!(
                matches!(&verdict, Verdict::Decided(d) if !d.allowed && d.retry_after == Duration::from_secs(998)),
                "{fail_mode:?}: {verdict:?}"
            );
        }
        assert_eq!(breakers(&guard), OPEN, "{fail_mode:?}");
        // The breaker open: answered without a call, until the retry time.
        let calls = store.calls();
        tokio::time::sleep(Duration::from_secs(990)).await;
        let verdict = guard.check(&rules[0], client(1), Cost::ONE).await;
        assert!(
            matches!(&verdict, Verdict::Decided(d) if !d.allowed && d.retry_after == Duration::from_secs(8)),
            "{fail_mode:?}: {verdict:?}"
        );
        assert_eq!(store.calls(), calls);
        // Anyone else gets the fail mode; so does this client after its retry time.
        assert!(!matches!(
            guard.check(&rules[0], client(2), Cost::ONE).await,
            Verdict::Decided(_)
        ));
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(!matches!(
            guard.check(&rules[0], client(1), Cost::ONE).await,
            Verdict::Decided(_)
        ));
    }
}
