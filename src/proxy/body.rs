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
pub enum ClientBodyError {
    /// Malformed framing (a bad chunk size, chunk data longer than declared), or the client
    /// closed or reset the connection mid-body.
    #[error("the request body could not be read: {0}")]
    Unreadable(#[source] hyper::Error),
    /// The client sent nothing for `BODY_IDLE_TIMEOUT_MS` in the middle of its body.
    #[error("the client sent no request body data for {0:?}")]
    Idle(Duration),
}

/// How the body ended, as [`Progress`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Still arriving.
    Streaming,
    /// Complete: the backend has all of it.
    Ended,
    /// Unreadable: see [`ClientBodyError::Unreadable`].
    Unreadable,
    /// Too slow: see [`ClientBodyError::Idle`].
    Idle,
}

impl BodyState {
    fn from_u8(value: u8) -> BodyState {
        match value {
            0 => BodyState::Streaming,
            1 => BodyState::Ended,
            2 => BodyState::Unreadable,
            _ => BodyState::Idle,
        }
    }
}

/// What the handler knows of a body the backend connection is reading, shared between the two.
#[derive(Debug)]
pub struct Progress {
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
    pub fn activity(&self) -> (Instant, bool) {
        let word = self.activity.load(Ordering::Acquire);
        (self.started + Duration::from_micros(word >> 1), word & 1 == 1)
    }

    fn touch(&self, waiting_for_client: bool) {
        let micros = self.started.elapsed().as_micros() as u64;
        self.activity
            .store(micros << 1 | u64::from(waiting_for_client), Ordering::Release);
    }

    /// The body's state now.
    pub fn state(&self) -> BodyState {
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
    pub async fn finished(&self) -> BodyState {
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
pub struct ClientBody {
    inner: Incoming,
    /// `None` for a body already complete when the request arrived (no body at all).
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    progress: Arc<Progress>,
    /// `BODY_IDLE_TIMEOUT_MS`.
    idle_timeout: Duration,
    /// Runs while the body waits for the client; made on the first wait.
    idle: Option<Pin<Box<Sleep>>>,
    /// Whether `idle` is running for the current wait.
    waiting: bool,
    /// `tollgate_request_body_bytes_total` of the request's rule: one add a data frame.
    bytes: Option<Counter>,
}

impl ClientBody {
    /// Wrap `inner`, cut off after `idle_timeout` without data from the client, counting its
    /// bytes into `bytes`.
    pub fn new(inner: Incoming, idle_timeout: Duration, bytes: Option<&Counter>) -> Self {
        let watch = (!inner.is_end_stream()).then(|| Watch {
            progress: Arc::new(Progress::new()),
            idle_timeout,
            idle: None,
            waiting: false,
            bytes: bytes.cloned(),
        });
        ClientBody { inner, watch }
    }

    /// The record the handler reads; `None` when there is no body to watch.
    pub fn progress(&self) -> Option<Arc<Progress>> {
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
                watch.waiting = false;
                if let (Some(bytes), Some(data)) = (&watch.bytes, frame.data_ref()) {
                    bytes.inc_by(data.len() as u64);
                }
                if this.inner.is_end_stream() {
                    watch.progress.finish(BodyState::Ended);
                } else {
                    watch.progress.touch(false);
                }
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
                    let deadline = Instant::now() + watch.idle_timeout;
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
                    watch.progress.finish(BodyState::Idle);
                    return Poll::Ready(Some(Err(ClientBodyError::Idle(watch.idle_timeout))));
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
