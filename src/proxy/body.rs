//! The client's request body on its way to the backend, watched so that a body that breaks
//! off is blamed on the client, not on the backend.
//!
//! hyper's client reports a request body that fails as a failed request: without a
//! record of its own, the gateway could not tell "the client sent a malformed chunk, or hung
//! up mid-upload" from "the backend reset the connection", and would answer 502 with a
//! warning that blames the backend. [`ClientBody`] wraps the body hyper gives the server and
//! writes down, before the client sees its error, that the *client's* body failed; the
//! handler reads that record ([`Progress`]) to answer 400 (or 408) and log at debug.
//!
//! The record also says when the body ended, so `BACKEND_TIMEOUT_MS` can count from there (a
//! large upload is not a slow backend), and when it last moved, so a client that pauses longer
//! than `BODY_IDLE_TIMEOUT_MS` between chunks is cut off, while a backend that stops reading
//! the upload is bounded by `BACKEND_TIMEOUT_MS`.
//!
//! A pause bound alone lets a body trickle (a byte every `BODY_IDLE_TIMEOUT_MS`, less a
//! moment) and hold its connection, its place under `MAX_CONNECTIONS` and a backend connection
//! for as long as it likes. So a body must also bring `BODY_MIN_RATE` bytes a second
//! ([`MinRate`]), as Apache's `mod_reqtimeout` `MinRate` asks (nginx has only the pause bound,
//! `client_body_timeout`). Two things differ from Apache's, which extends one deadline by a
//! second per `MinRate` bytes since the start: the rate is measured over windows
//! (`BODY_MIN_RATE_WINDOW_MS`), each of which must bring its share, so a body that starts fast
//! earns no credit to trickle on later; and only time spent waiting for the client counts, so a
//! backend that reads slowly (and so holds the body back) never makes the client too slow. The
//! first window is the grace: nothing is cut before the body has waited for the client that
//! long.
//!
//! A request without a body (the common case) gets no record and costs nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// Why the client's request body did not arrive whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientBodyError {
    /// Malformed framing (a bad chunk size, chunk data longer than declared), or the client
    /// closed or reset the connection mid-body.
    #[error("the request body could not be read: {0}")]
    Unreadable(#[source] hyper::Error),
    /// The client sent nothing for `BODY_IDLE_TIMEOUT_MS` in the middle of its body.
    #[error("the client sent no request body data for {0:?}")]
    Idle(Duration),
    /// The client's body came slower than `BODY_MIN_RATE`.
    #[error("the request body came slower than {0}")]
    TooSlow(MinRate),
}

/// `BODY_MIN_RATE` bytes a second, over windows of `BODY_MIN_RATE_WINDOW_MS` spent waiting for
/// the client: each window must bring its share ([`MinRate::quota`]), or the body is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MinRate {
    /// `BODY_MIN_RATE`.
    bytes_per_second: u64,
    /// `BODY_MIN_RATE_WINDOW_MS`.
    window: Duration,
}

impl MinRate {
    /// At least `bytes_per_second` (more than 0), measured over `window` (at least 1 ms).
    pub(crate) fn new(bytes_per_second: u64, window: Duration) -> MinRate {
        MinRate {
            bytes_per_second,
            window,
        }
    }

    #[cfg(test)]
    /// `BODY_MIN_RATE`.
    pub(crate) fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    #[cfg(test)]
    /// `BODY_MIN_RATE_WINDOW_MS`.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// What one window must bring: the rate times the window, at least a byte.
    pub(crate) fn quota(&self) -> u64 {
        let bytes = u128::from(self.bytes_per_second) * self.window.as_millis() / 1000;
        u64::try_from(bytes).unwrap_or(u64::MAX).max(1)
    }
}

/// `500 B/s over 30000 ms`.
impl std::fmt::Display for MinRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} B/s over {} ms",
            self.bytes_per_second,
            self.window.as_millis()
        )
    }
}

/// How the body ended, as [`Progress`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyState {
    /// Still arriving.
    Streaming,
    /// Complete: the backend has all of it.
    Ended,
    /// Unreadable: see [`ClientBodyError::Unreadable`].
    Unreadable,
    /// Paused too long: see [`ClientBodyError::Idle`].
    Idle,
    /// Too slow: see [`ClientBodyError::TooSlow`].
    TooSlow,
}

impl BodyState {
    fn from_u8(value: u8) -> BodyState {
        match value {
            0 => BodyState::Streaming,
            1 => BodyState::Ended,
            2 => BodyState::Unreadable,
            3 => BodyState::Idle,
            _ => BodyState::TooSlow,
        }
    }
}

/// What the handler knows of a body the backend connection is reading, shared between the two.
#[derive(Debug)]
pub(crate) struct Progress {
    /// When the request started: [`Progress::activity`] counts from here.
    started: Instant,
    /// Microseconds from `started` to the last change, shifted left by one; the low bit is set
    /// while the body waits for the client (the backend wants more). One word, so the two are
    /// read together.
    activity: AtomicU64,
    /// A [`BodyState`].
    state: AtomicU8,
    /// Wakes the handler when the state leaves `Streaming`.
    changed: Notify,
}

impl Progress {
    fn new() -> Self {
        Progress {
            started: Instant::now(),
            activity: AtomicU64::new(0),
            state: AtomicU8::new(BodyState::Streaming as u8),
            changed: Notify::new(),
        }
    }

    /// When the body last moved, and whether it has been waiting for the client since (if not,
    /// it is the backend that is not reading).
    pub(crate) fn activity(&self) -> (Instant, bool) {
        let word = self.activity.load(Ordering::Acquire);
        (self.started + Duration::from_micros(word >> 1), word & 1 == 1)
    }

    fn touch(&self, waiting_for_client: bool) {
        let micros = self.started.elapsed().as_micros() as u64;
        self.activity
            .store(micros << 1 | u64::from(waiting_for_client), Ordering::Release);
    }

    /// The body's state now.
    pub(crate) fn state(&self) -> BodyState {
        BodyState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Record the end (the first one counts) and wake the handler.
    fn finish(&self, state: BodyState) {
        let recorded = self.state.compare_exchange(
            BodyState::Streaming as u8,
            state as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if recorded.is_ok() {
            // A stored permit if the handler is not waiting yet: it will not miss this.
            self.changed.notify_one();
        }
    }

    /// Wait until the body has ended or failed.
    pub(crate) async fn finished(&self) -> BodyState {
        loop {
            let state = self.state();
            if state != BodyState::Streaming {
                return state;
            }
            self.changed.notified().await;
        }
    }
}

/// The request body handed to the backend: the client's, recording its progress.
#[derive(Debug)]
pub(crate) struct ClientBody {
    inner: Incoming,
    /// `None` for a body already complete when the request arrived (no body at all).
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    progress: Arc<Progress>,
    /// `BODY_IDLE_TIMEOUT_MS`.
    idle_timeout: Duration,
    /// Runs while the body waits for the client, until `BODY_IDLE_TIMEOUT_MS` or the end of
    /// the rate's window, whichever comes first; made on the first wait.
    idle: Option<Pin<Box<Sleep>>>,
    /// Whether `idle` is running for the current wait.
    waiting: bool,
    /// When the current wait began.
    wait_started: Instant,
    /// `BODY_MIN_RATE`, and how its current window stands.
    rate: Option<RateWindow>,
    /// `tollgate_request_body_bytes_total` of the request's rule: one add a data frame.
    bytes: Option<Counter>,
}

/// The current window of a [`MinRate`]: it ends, and the next begins, when it has brought
/// its quota; a window that has waited for the client for the whole `BODY_MIN_RATE_WINDOW_MS`
/// without it ends the body. Bytes past a window's quota are not carried over.
#[derive(Debug)]
struct RateWindow {
    min: MinRate,
    /// [`MinRate::quota`].
    quota: u64,
    /// Bytes brought in this window.
    bytes: u64,
    /// Time spent waiting for the client in this window, the current wait not included.
    waited: Duration,
}

impl RateWindow {
    /// `bytes` arrived after a wait of `waited` (zero when they were there already): whether
    /// the window still stands.
    fn arrived(&mut self, bytes: usize, waited: Duration) -> bool {
        self.bytes = self.bytes.saturating_add(bytes as u64);
        self.waited += waited;
        if self.bytes >= self.quota {
            // The window is passed: the next one begins now.
            self.bytes = 0;
            self.waited = Duration::ZERO;
            return true;
        }
        self.waited < self.min.window
    }

    /// How long the current wait may last before the window has waited its whole length.
    fn left(&self) -> Duration {
        self.min.window.saturating_sub(self.waited)
    }
}

impl ClientBody {
    /// Wrap `inner`, cut off after `idle_timeout` without data from the client, or when it
    /// comes slower than `min_rate`, counting its bytes into `bytes`.
    pub(crate) fn new(
        inner: Incoming,
        idle_timeout: Duration,
        min_rate: Option<MinRate>,
        bytes: Option<&Counter>,
    ) -> Self {
        let watch = (!inner.is_end_stream()).then(|| Watch {
            progress: Arc::new(Progress::new()),
            idle_timeout,
            idle: None,
            waiting: false,
            bytes: bytes.cloned(),
            wait_started: Instant::now(),
            rate: min_rate.map(|min| RateWindow {
                min,
                quota: min.quota(),
                bytes: 0,
                waited: Duration::ZERO,
            }),
        });
        ClientBody { inner, watch }
    }

    /// The record the handler reads; `None` when there is no body to watch.
    pub(crate) fn progress(&self) -> Option<Arc<Progress>> {
        self.watch.as_ref().map(|watch| watch.progress.clone())
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let Some(watch) = &mut this.watch else {
            return polled.map_err(ClientBodyError::Unreadable);
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let waited = match std::mem::take(&mut watch.waiting) {
                    true if watch.rate.is_some() => watch.wait_started.elapsed(),
                    _ => Duration::ZERO,
                };
                if let (Some(bytes), Some(data)) = (&watch.bytes, frame.data_ref()) {
                    bytes.inc_by(data.len() as u64);
                }
                if this.inner.is_end_stream() {
                    watch.progress.finish(BodyState::Ended);
                    return Poll::Ready(Some(Ok(frame)));
                }
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                if let Some(rate) = &mut watch.rate
                    && !rate.arrived(bytes, waited)
                {
                    // A whole window of waiting, and not its quota.
                    watch.progress.finish(BodyState::TooSlow);
                    return Poll::Ready(Some(Err(ClientBodyError::TooSlow(rate.min))));
                }
                watch.progress.touch(false);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                watch.progress.finish(BodyState::Ended);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                // Recorded before hyper sees the error, so the handler knows whose it is.
                watch.progress.finish(BodyState::Unreadable);
                Poll::Ready(Some(Err(ClientBodyError::Unreadable(error))))
            }
            Poll::Pending => {
                if !watch.waiting {
                    watch.waiting = true;
                    watch.progress.touch(true);
                    let now = Instant::now();
                    watch.wait_started = now;
                    let wait = match &watch.rate {
                        Some(rate) => watch.idle_timeout.min(rate.left()),
                        None => watch.idle_timeout,
                    };
                    let deadline = now + wait;
                    match &mut watch.idle {
                        Some(idle) => idle.as_mut().reset(deadline),
                        None => watch.idle = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                let timed_out = watch
                    .idle
                    .as_mut()
                    .is_some_and(|idle| idle.as_mut().poll(cx).is_ready());
                if timed_out {
                    // Either clock ends the body: the one that ran out names the error.
                    return Poll::Ready(Some(Err(match &watch.rate {
                        Some(rate) if watch.wait_started.elapsed() < watch.idle_timeout => {
                            watch.progress.finish(BodyState::TooSlow);
                            ClientBodyError::TooSlow(rate.min)
                        }
                        _ => {
                            watch.progress.finish(BodyState::Idle);
                            ClientBodyError::Idle(watch.idle_timeout)
                        }
                    })));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(bytes_per_second: u64, window_ms: u64) -> RateWindow {
        let min = MinRate::new(bytes_per_second, Duration::from_millis(window_ms));
        RateWindow {
            min,
            quota: min.quota(),
            bytes: 0,
            waited: Duration::ZERO,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_quota_is_the_rate_over_the_window_and_at_least_a_byte() {
        assert_eq!(MinRate::new(500, Duration::from_secs(30)).quota(), 15_000);
        assert_eq!(MinRate::new(1, Duration::from_millis(1)).quota(), 1);
        assert_eq!(
            MinRate::new(u64::MAX, Duration::from_secs(1 << 40)).quota(),
            u64::MAX
        );
    }

    #[test]
    fn a_trickle_fails_once_it_has_waited_a_whole_window() {
        // 1000 B/s over 1 s: 1000 bytes per second spent waiting.
        let mut rate = window(1000, 1000);
        for _ in 0..9 {
            assert!(rate.arrived(1, 100 * MS));
        }
        assert_eq!(
            rate.left(),
            100 * MS,
            "the next wait may last what the window has left"
        );
        assert!(!rate.arrived(1, 100 * MS), "a whole window, 10 bytes");
    }

    #[test]
    fn each_window_brought_starts_the_next_and_earns_no_credit() {
        let mut rate = window(1000, 1000);
        // Fast to begin with: far more than the quota, at once.
        assert!(rate.arrived(1_000_000, Duration::ZERO));
        assert_eq!((rate.bytes, rate.waited), (0, Duration::ZERO));
        // Then a trickle: the megabyte does not carry it.
        for _ in 0..9 {
            assert!(rate.arrived(1, 100 * MS));
        }
        assert!(!rate.arrived(1, 100 * MS));
    }

    #[test]
    fn a_steady_body_above_the_rate_passes_window_after_window() {
        let mut rate = window(1000, 1000);
        // 200 bytes every 100 ms of waiting: twice the rate, for a hundred windows.
        for _ in 0..500 {
            assert!(rate.arrived(200, 100 * MS));
        }
        // Time the backend held the body back is no waiting for the client.
        for _ in 0..1000 {
            assert!(rate.arrived(1, Duration::ZERO));
        }
    }
}
