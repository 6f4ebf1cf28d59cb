//! HTTP/2 streams whose client takes none of the response: `SEND_TIMEOUT_MS` per stream.
//!
//! The watchdog of [`super::connection`] drops a connection whose socket takes nothing. An
//! HTTP/2 client can stall one stream without stalling its socket: it keeps that stream's
//! flow-control window shut while it reads everything else, `PING` answers included. hyper
//! then stops asking the stream's response body for data and waits for window, and the
//! stream would hold its place among the requests in flight and its backend connection for
//! as long as the client liked.
//!
//! hyper runs each HTTP/2 stream as a task given to its executor, so the executor here wraps
//! each one. Inside the task, the response body ([`super::connection::Tracked`]) says, each
//! time hyper asks it for data, whether it handed hyper a frame (hyper now waits for the
//! client) or has none yet (the backend is slow: not the client's doing). When the task is
//! left waiting with a frame handed and nothing more asked for `SEND_TIMEOUT_MS`, the stream
//! is given up: its task ends, which resets the stream and drops its body, and with it the
//! backend connection and the request's place. The body hands its data in pieces of at most
//! [`super::connection::STREAM_PIECE`] (16 KiB), and hyper asks for the next once it has sent
//! most of the last, so a stream restarts the clock every 16 KiB the client takes: one read
//! slowly but steadily is not cut (a client must take about 16 KiB, and its window step, per
//! `SEND_TIMEOUT_MS`), and one waiting for its backend never is.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

tokio::task_local! {
    /// The progress of the response body of the stream this task runs.
    static PROGRESS: Cell<Progress>;
}

/// What a stream's response body last told its task.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// Frames handed to hyper so far.
    handed: u64,
    /// The last poll handed a frame, and hyper has not asked for the next yet: it is waiting
    /// for the client (its window, or the socket).
    waiting_on_client: bool,
}

/// A response body handed hyper a frame. Outside a stream's task (HTTP/1) it does nothing.
pub(crate) fn handed_frame() {
    let _ = PROGRESS.try_with(|progress| {
        let mut now = progress.get();
        now.handed += 1;
        now.waiting_on_client = true;
        progress.set(now);
    });
}

/// Whether this runs in an HTTP/2 stream's task.
pub(crate) fn in_stream() -> bool {
    PROGRESS.try_with(|_| ()).is_ok()
}

/// A response body had no frame for hyper (its backend is slow) or has ended.
pub(crate) fn no_frame() {
    let _ = PROGRESS.try_with(|progress| {
        let mut now = progress.get();
        now.waiting_on_client = false;
        progress.set(now);
    });
}

/// hyper's executor for HTTP/2 streams: Tokio's, each stream under `SEND_TIMEOUT_MS`. (hyper
/// also runs an HTTP/2 `CONNECT` tunnel's task with it; tollgate answers `CONNECT` with `405`,
/// and a tunnel's task has no response body to report, so it would never be given up.)
#[derive(Debug, Clone)]
pub(crate) struct StreamExecutor {
    /// `SEND_TIMEOUT_MS`.
    pub send_timeout: Duration,
    /// `tollgate_client_streams_unread_total`: streams given up.
    pub unread: Counter,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
{
    fn execute(&self, stream: F) {
        // Boxed: a stream's future is several KB (the whole request's), and the task would
        // otherwise copy it whole at every move (measured: 3x an HTTP/2 request's
        // instructions); the box moves as a pointer.
        let (stream, timeout, unread) = (Box::pin(stream), self.send_timeout, self.unread.clone());
        tokio::spawn(PROGRESS.scope(Cell::default(), async move {
            if guard(stream, timeout).await == Ended::GivenUp {
                unread.inc();
            }
        }));
    }
}

/// How a stream's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// By itself: answered, or reset by the client.
    Done,
    /// Given up: its response waited for the client for `SEND_TIMEOUT_MS`.
    GivenUp,
}

/// Run `stream` until it ends, or until its response body has waited for the client for
/// `timeout` with a frame handed and nothing more asked; then give it up.
async fn guard<F: Future + ?Sized>(mut stream: Pin<Box<F>>, timeout: Duration) -> Ended {
    // Made when a stall first begins: a stream that never stalls (most) never reads the clock
    // or touches the timer.
    let mut timer = std::pin::pin!(None::<tokio::time::Sleep>);
    // The stall under way: frames handed when it began (a new frame is a new stall).
    let mut stall: Option<u64> = None;
    std::future::poll_fn(|cx| {
        if stream.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ended::Done);
        }
        let progress = PROGRESS.with(Cell::get);
        if !progress.waiting_on_client {
            stall = None;
            return Poll::Pending;
        }
        if stall != Some(progress.handed) {
            stall = Some(progress.handed);
            let due = Instant::now() + timeout;
            match timer.as_mut().as_pin_mut() {
                Some(sleep) => sleep.reset(due),
                None => timer.set(Some(tokio::time::sleep_until(due))),
            }
        }
        let fired = timer
            .as_mut()
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready());
        if fired {
            tracing::debug!("the client took none of a stream's response for SEND_TIMEOUT_MS: stream reset");
            return Poll::Ready(Ended::GivenUp);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::Waker;

    const TIMEOUT: Duration = Duration::from_secs(30);

    /// A stream's task as hyper runs it, reduced to what the guard sees. When it has window
    /// (`frames` > 0) it asks its response body for a frame and gets one (`hands`) or none
    /// (the backend is slow); without window it does not ask the body at all. It never ends
    /// by itself. `take` stands for the client taking a frame: one more of window, and hyper
    /// waking the task.
    #[derive(Clone)]
    struct FakeStream {
        hands: Arc<AtomicBool>,
        frames: Arc<AtomicU32>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl FakeStream {
        fn take(&self) {
            self.frames.fetch_add(1, Ordering::AcqRel);
            if let Some(waker) = self.waker.lock().unwrap().take() {
                waker.wake();
            }
        }
    }

    impl Future for FakeStream {
        type Output = ();

        fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
            if !self.hands.load(Ordering::Acquire) {
                no_frame();
            } else if self.frames.load(Ordering::Acquire) > 0 {
                self.frames.fetch_sub(1, Ordering::AcqRel);
                handed_frame();
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    fn start(hands: bool) -> (FakeStream, tokio::task::JoinHandle<Ended>) {
        let stream = FakeStream {
            hands: Arc::new(AtomicBool::new(hands)),
            frames: Arc::new(AtomicU32::new(1)),
            waker: Arc::default(),
        };
        let task = tokio::spawn(PROGRESS.scope(Cell::default(), guard(Box::pin(stream.clone()), TIMEOUT)));
        (stream, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_left_waiting_for_its_client_is_given_up_after_the_timeout() {
        let (_stream, task) = start(true);
        tokio::time::sleep(TIMEOUT - Duration::from_millis(1)).await;
        assert!(!task.is_finished());
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(task.await.unwrap(), Ended::GivenUp);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_for_its_backend_is_never_given_up() {
        let (_stream, task) = start(false);
        tokio::time::sleep(TIMEOUT * 20).await;
        assert!(!task.is_finished());
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn every_frame_the_client_takes_restarts_the_clock() {
        let (stream, task) = start(true);
        for _ in 0..5 {
            tokio::time::sleep(TIMEOUT - Duration::from_millis(1)).await;
            // The client takes the frame: hyper polls the stream again, and it hands the next.
            stream.take();
        }
        tokio::time::sleep(TIMEOUT - Duration::from_millis(1)).await;
        assert!(!task.is_finished());
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(
            task.await.unwrap(),
            Ended::GivenUp,
            "then stalls, and is given up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_ends_when_the_body_waits_for_its_backend_again() {
        let (stream, task) = start(true);
        tokio::time::sleep(TIMEOUT / 2).await;
        // The client took the frame, and the body has nothing more yet: its backend is slow.
        stream.hands.store(false, std::sync::atomic::Ordering::Release);
        stream.take();
        tokio::time::sleep(TIMEOUT * 4).await;
        assert!(
            !task.is_finished(),
            "waiting for the backend is not the client's doing"
        );
        task.abort();
    }
}
