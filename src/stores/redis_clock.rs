//! The gateway's estimate of one Redis node's clock, for the deadline each decision carries.
//!
//! A call the gateway gave up on (`REDIS_TIMEOUT_MS` passed, the fail mode answered) may
//! still sit in the connection's buffers, and a Redis frozen or busy runs it when it wakes:
//! the client would be charged for a request it was refused (or one that was forwarded or
//! decided locally, uncounted). So every decision tells its script the moment the gateway
//! stops waiting, and a script that finds Redis `TIME` past it changes nothing and answers
//! "expired". The scripts read Redis's clock, not the gateway's, and the two machines' clocks
//! differ: the deadline is sent on Redis's clock, as the gateway's monotonic clock plus an
//! estimated offset.
//!
//! Each reply carries the Redis time the script read, `r`, and was sent at gateway time `s`:
//! `r` was read no earlier than `s`, so `r - s` is an upper bound of the offset. The estimate
//! is the smallest such bound seen lately (the minimum over this period and the last, each
//! [`PERIOD`] long, so it follows drift and a Redis clock stepped forward within two periods),
//! which puts the deadline at most one request's way to Redis after the gateway's own. Being
//! an upper bound, it errs toward deciding: a call is never refused as expired because replies
//! were slow. When no reply has been seen yet, the gateway's wall clock stands in: machines
//! kept by NTP differ by far less than a timeout.
//!
//! A wrong estimate cannot refuse every call. An "expired" answer that arrives while the
//! gateway still waits means the estimate was too low (Redis's clock stepped forward, or the
//! wall-clock guess was behind): the estimate is replaced by that answer's bound and the call
//! is sent once more, which the script cannot find expired unless Redis's clock jumps again.
//! An estimate too high (Redis's clock stepped back) only widens the window in which a late
//! call still counts, until the next reply lowers it. The gateway's own clock steps change
//! nothing: offsets are taken against its monotonic clock.
//!
//! The same replies measure how late calls reach Redis: a reply's bound less the estimate is
//! how much longer than the fastest call lately this one took to reach the script (a Redis
//! busy or briefly paused, or this machine loaded, so that the gateway's task or the Redis
//! process waits for a core). The largest such [`lag`](RedisClock::lag) of this period and
//! the last is what a decision's deadline adds to `REDIS_TIMEOUT_MS` (twice, for the way back),
//! so a machine under load makes calls wait longer rather than time out into the fail mode.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// How long one period's minimum serves: the estimate is the minimum of this period and the
/// previous one, so a bound that has become too low is forgotten within two periods.
pub const PERIOD: Duration = Duration::from_secs(10);

/// How far (µs of Redis time) a reply must be past the last one marked to move
/// [`RedisClock::latest_reply`] on.
pub const PROGRESS_STEP: u64 = 1_000;

/// No bound yet in this period.
const NONE: i64 = i64::MAX;

/// The estimated offset of one Redis node's clock from the gateway's monotonic clock.
#[derive(Debug)]
pub struct RedisClock {
    /// The gateway's origin: offsets are Redis microseconds minus microseconds since `anchor`.
    anchor: Instant,
    /// The wall clock's offset at `anchor`: the estimate until a reply gives one.
    guess: i64,
    /// The smallest bound of the current period, or [`NONE`].
    current: AtomicI64,
    /// The smallest bound of the previous period, or [`NONE`].
    previous: AtomicI64,
    /// When the current period began, in microseconds since `anchor`.
    period_start: AtomicI64,
    /// The largest lag (µs) seen in the current period: a reply's bound less the estimate.
    lag_current: AtomicI64,
    /// The largest lag of the previous period.
    lag_previous: AtomicI64,
    /// The Redis time of a recent reply (µs), moved on by replies at least [`PROGRESS_STEP`]
    /// later: whether Redis answered anything while a call waited (see
    /// [`latest_reply`](RedisClock::latest_reply)).
    latest: AtomicU64,
}

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock::new()
    }
}

impl RedisClock {
    /// A clock with no reply seen yet: the gateway's wall clock stands in.
    pub fn new() -> RedisClock {
        let anchor = Instant::now();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, micros);
        RedisClock {
            anchor,
            guess: wall,
            current: AtomicI64::new(NONE),
            previous: AtomicI64::new(NONE),
            period_start: AtomicI64::new(0),
            lag_current: AtomicI64::new(0),
            lag_previous: AtomicI64::new(0),
            latest: AtomicU64::new(0),
        }
    }

    /// `at`, on the Redis clock as estimated, in microseconds since the Unix epoch: the
    /// deadline a script is sent for a call the gateway stops waiting for at `at`.
    pub fn redis_time(&self, at: Instant) -> u64 {
        u64::try_from(self.since_anchor(at).saturating_add(self.offset())).unwrap_or(0)
    }

    /// True once a reply has given an estimate (until then the wall clock stands in).
    pub fn is_estimated(&self) -> bool {
        self.current.load(Ordering::Relaxed) != NONE || self.previous.load(Ordering::Relaxed) != NONE
    }

    /// A reply to a call sent at `sent` says Redis's clock read `redis_us` (or later).
    pub fn observe(&self, sent: Instant, redis_us: u64) {
        self.answered(redis_us);
        // Periods are turned by the send time, a moment ago: no clock read on every reply.
        let now = self.since_anchor(sent);
        let bound = self.bound(sent, redis_us);
        let start = self.period_start.load(Ordering::Relaxed);
        if now.saturating_sub(start) >= micros(PERIOD)
            && self
                .period_start
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // One caller turns the period; a bound another caller adds meanwhile may land in
            // either, which only keeps a true bound one period more. After a silence of two
            // periods or more, the last one's bound is as stale as any: both go.
            let last = self.current.swap(bound, Ordering::Relaxed);
            let stale = now.saturating_sub(start) >= 2 * micros(PERIOD);
            self.previous
                .store(if stale { NONE } else { last }, Ordering::Relaxed);
            let lag = self.lag_current.swap(0, Ordering::Relaxed);
            self.lag_previous
                .store(if stale { 0 } else { lag }, Ordering::Relaxed);
            return;
        }
        // Read first: most replies bound no tighter, and a write on every reply would bounce
        // the cache line between the cores.
        let current = self.current.load(Ordering::Relaxed);
        if bound < current {
            self.current.fetch_min(bound, Ordering::Relaxed);
        }
        let lag = bound.saturating_sub(current.min(self.previous.load(Ordering::Relaxed)));
        if lag > self.lag_current.load(Ordering::Relaxed) {
            self.lag_current.fetch_max(lag, Ordering::Relaxed);
        }
    }

    /// True when no reply has bounded the offset in this period, or the period is due to
    /// turn: a caller whose calls read no Redis time (a fixed window decided without a
    /// script) then asks for `TIME` along with its call, so the estimate stays fresh at the
    /// cost of a `TIME` a period, not one a decision.
    pub fn wants_sample(&self, at: Instant) -> bool {
        self.current.load(Ordering::Relaxed) == NONE
            || self
                .since_anchor(at)
                .saturating_sub(self.period_start.load(Ordering::Relaxed))
                >= micros(PERIOD)
    }

    /// The largest lag seen in this period and the last: how much longer than the fastest
    /// call lately a call took to reach Redis (zero until replies have shown one).
    pub fn lag(&self) -> Duration {
        let lag = self
            .lag_current
            .load(Ordering::Relaxed)
            .max(self.lag_previous.load(Ordering::Relaxed));
        Duration::from_micros(u64::try_from(lag).unwrap_or(0))
    }

    /// A call sent at `sent` was found expired at `redis_us` while the gateway still waited:
    /// the estimate was too low. Start over from this bound alone.
    pub fn reset(&self, sent: Instant, redis_us: u64) {
        self.answered(redis_us);
        let bound = self.bound(sent, redis_us);
        self.previous.store(NONE, Ordering::Relaxed);
        self.current.store(bound, Ordering::Relaxed);
        self.period_start
            .store(self.since_anchor(Instant::now()), Ordering::Relaxed);
    }

    /// A mark that moves while Redis answers: a call that waited past its deadline compares it
    /// with the mark it saw when it began to wait, and a Redis that answered meanwhile (busy,
    /// or this machine loaded) is waited for longer, while a Redis that answered nothing
    /// (frozen, cut off) is not. Zero before any reply.
    pub fn latest_reply(&self) -> u64 {
        self.latest.load(Ordering::Relaxed)
    }

    /// Move [`latest_reply`](Self::latest_reply) on to `redis_us` if that is
    /// [`PROGRESS_STEP`] past it: one read a reply, a write at most once a step (a write on
    /// every reply would bounce the cache line between the cores). A reply that carries no
    /// Redis time (a fixed window's count) gives the estimate of it at its sending.
    pub fn answered(&self, redis_us: u64) {
        if redis_us >= self.latest.load(Ordering::Relaxed).saturating_add(PROGRESS_STEP) {
            self.latest.store(redis_us, Ordering::Relaxed);
        }
    }

    fn offset(&self) -> i64 {
        match self
            .current
            .load(Ordering::Relaxed)
            .min(self.previous.load(Ordering::Relaxed))
        {
            NONE => self.guess,
            offset => offset,
        }
    }

    fn bound(&self, sent: Instant, redis_us: u64) -> i64 {
        i64::try_from(redis_us)
            .unwrap_or(i64::MAX - 1)
            .saturating_sub(self.since_anchor(sent))
    }

    fn since_anchor(&self, at: Instant) -> i64 {
        micros(at.saturating_duration_since(self.anchor))
    }
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    #[tokio::test(start_paused = true)]
    async fn the_reply_mark_moves_on_with_replies_a_step_apart() {
        let clock = RedisClock::new();
        assert_eq!(clock.latest_reply(), 0, "no reply yet");
        let sent = Instant::now();
        clock.observe(sent, 1_000 * SECOND);
        assert_eq!(clock.latest_reply(), 1_000 * SECOND);
        // Replies within a step of the mark leave it (no write on every reply).
        clock.observe(sent, 1_000 * SECOND + PROGRESS_STEP - 1);
        assert_eq!(clock.latest_reply(), 1_000 * SECOND);
        clock.observe(sent, 1_000 * SECOND + PROGRESS_STEP);
        assert_eq!(clock.latest_reply(), 1_000 * SECOND + PROGRESS_STEP);
        // An "expired" answer is a reply too.
        clock.reset(sent, 1_001 * SECOND);
        assert_eq!(clock.latest_reply(), 1_001 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_the_tightest_bound_seen_plus_the_wait() {
        let clock = RedisClock::new();
        assert!(!clock.is_estimated());
        let sent = Instant::now();
        // Redis is 1000 s ahead; two replies read it 300 µs and 100 µs after sending.
        clock.observe(sent, 1_000 * SECOND + 300);
        clock.observe(sent, 1_000 * SECOND + 100);
        clock.observe(sent, 1_000 * SECOND + 900);
        assert!(clock.is_estimated());
        let deadline = sent + Duration::from_millis(50);
        assert_eq!(clock.redis_time(deadline), 1_000 * SECOND + 100 + 50_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bound_too_low_is_forgotten_within_two_periods() {
        let clock = RedisClock::new();
        let start = Instant::now();
        clock.observe(start, 500 * SECOND);
        // Redis's clock steps forward by 2 s: replies bound the offset higher from now on.
        tokio::time::advance(PERIOD).await;
        let sent = Instant::now();
        let ahead = 500 * SECOND + micros(PERIOD) as u64 + 2 * SECOND;
        clock.observe(sent, ahead);
        assert_eq!(
            clock.redis_time(sent),
            500 * SECOND + micros(PERIOD) as u64,
            "one period on"
        );
        tokio::time::advance(PERIOD).await;
        let later = Instant::now();
        clock.observe(later, ahead + micros(PERIOD) as u64);
        assert_eq!(
            clock.redis_time(later),
            ahead + micros(PERIOD) as u64,
            "two periods on"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_answer_in_time_replaces_the_estimate_at_once() {
        let clock = RedisClock::new();
        let sent = Instant::now();
        clock.observe(sent, 100 * SECOND);
        clock.reset(sent, 160 * SECOND);
        assert_eq!(clock.redis_time(sent), 160 * SECOND);
        // A Redis stepped back is followed by the next reply.
        clock.observe(sent, 120 * SECOND);
        assert_eq!(clock.redis_time(sent), 120 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn the_lag_is_the_latest_call_beyond_the_fastest_and_is_forgotten_in_two_periods() {
        let clock = RedisClock::new();
        let sent = Instant::now();
        clock.observe(sent, 1_000 * SECOND + 100);
        assert_eq!(clock.lag(), Duration::ZERO, "the first reply is the fastest");
        // A reply that reached Redis 30 ms later than the fastest, then quicker ones.
        clock.observe(sent, 1_000 * SECOND + 100 + 30_000);
        clock.observe(sent, 1_000 * SECOND + 100 + 2_000);
        assert_eq!(clock.lag(), Duration::from_millis(30));
        // NaN-free on hostile times: a reply from the far future saturates, never wraps.
        clock.observe(sent, u64::MAX);
        assert!(clock.lag() >= Duration::from_millis(30));
        tokio::time::advance(PERIOD).await;
        clock.observe(Instant::now(), 1_000 * SECOND + 100 + micros(PERIOD) as u64);
        assert!(clock.lag() > Duration::ZERO, "the last period's still counts");
        tokio::time::advance(PERIOD).await;
        clock.observe(Instant::now(), 1_000 * SECOND + 100 + 2 * micros(PERIOD) as u64);
        tokio::time::advance(PERIOD).await;
        clock.observe(Instant::now(), 1_000 * SECOND + 100 + 3 * micros(PERIOD) as u64);
        assert_eq!(clock.lag(), Duration::ZERO, "forgotten two periods on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sample_is_wanted_until_a_reply_and_again_when_the_period_turns() {
        let clock = RedisClock::new();
        let sent = Instant::now();
        assert!(clock.wants_sample(sent));
        clock.observe(sent, 1_000 * SECOND);
        assert!(!clock.wants_sample(sent));
        tokio::time::advance(PERIOD).await;
        assert!(clock.wants_sample(Instant::now()));
        clock.observe(Instant::now(), 1_000 * SECOND + micros(PERIOD) as u64);
        assert!(!clock.wants_sample(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_reply_the_wall_clock_stands_in() {
        let clock = RedisClock::new();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let estimate = Duration::from_micros(clock.redis_time(Instant::now()));
        // Read a moment apart: the same clock, within a second.
        assert!(
            estimate.abs_diff(wall) < Duration::from_secs(1),
            "{estimate:?} vs {wall:?}"
        );
    }
}
