//! One client connection's life after accept: the watchdog that closes it when it stays
//! silent or idle, the count of requests in flight that tells idle from busy, and the drain
//! that closes every connection on shutdown.
//!
//! hyper-util's protocol detection waits for bytes with no timer, hyper's HTTP/1
//! `header_read_timeout` starts only after it (and again when a keep-alive connection goes
//! idle, so it doubles as an idle timeout of the same length), and HTTP/2 has no idle timeout
//! at all. So hyper's timer is off and the watchdog ([`supervise`]) keeps Envoy's clocks
//! beside each connection:
//!
//! - from accept until the first request reaches the service, at most
//!   `HEADER_READ_TIMEOUT_MS`, the PROXY header and TLS handshake included (see
//!   [`super::listener`]). HTTP/2 calls the service when a request's `HEADERS` arrive, so
//!   a stalled preface, a missing `SETTINGS` and a connection opened "for later" are covered.
//! - after that, at most `IDLE_TIMEOUT_MS` with nothing in flight. A request is in flight
//!   from the moment the service is called until its response body has been sent or dropped
//!   ([`Tracked`]), not merely until the service returns: a long download is busy.
//! - on HTTP/1, once the first byte of the next request arrives, the idle clock stops and the
//!   request's headers must be complete within `HEADER_READ_TIMEOUT_MS` (slowloris).
//! - the socket must take some of what is written within `SEND_TIMEOUT_MS` of it taking none
//!   (slow read: a client that asks for a response and stops reading it would otherwise hold
//!   its connection, its place under `MAX_CONNECTIONS` and a backend connection for as long
//!   as it likes; nothing else runs while a request is in flight). A slow reader is not cut,
//!   only one that takes nothing at all; and as the connection cannot be closed gracefully
//!   through a socket that takes nothing, it is dropped. (An HTTP/2 stream whose window the
//!   client keeps shut while it reads the rest is [`super::streams`]'.)
//! - when a clock runs out, or the server drains, the connection is closed gracefully: HTTP/1
//!   closes at once when idle (after the response in progress otherwise), HTTP/2 sends
//!   `GOAWAY` and lets its streams finish. A peer that has not let go [`CLOSE_GRACE`] after
//!   its last response (an HTTP/2 client that never acknowledges the `GOAWAY` `PING`, an
//!   HTTP/1 client stalled inside a request head) is dropped.
//!
//! Bytes alone never keep a connection open: HTTP/2 `PING`s, `SETTINGS` or `WINDOW_UPDATE`s,
//! or a request head trickled in a byte at a time, count for nothing.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use http::Version;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;

use super::framing::Framing;
use super::limits::{ClientSlot, RequestPlace, Slot};
use super::transport::Transport;
use crate::gate::Settled;

/// How long a connection being closed may stay open with nothing in flight before it is
/// dropped: enough for an HTTP/2 client to acknowledge the `GOAWAY` `PING` (one round trip).
/// Envoy's `delayed_close_timeout` has the same default.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The watchdog's clocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// `HEADER_READ_TIMEOUT_MS`: from accept to the first request, and on HTTP/1 from the
    /// first byte of a later request to its last header.
    pub header_read: Duration,
    /// `IDLE_TIMEOUT_MS`: nothing in flight for this long closes the connection.
    pub idle: Duration,
    /// `SEND_TIMEOUT_MS`: a socket that takes no byte of what is written for this long drops
    /// the connection.
    pub send: Duration,
}

/// What one connection is doing, as the watchdog sees it: shared by the connection's
/// service (which starts requests), the response bodies (which end them) and the socket
/// (which sees the next HTTP/1 request begin).
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Requests whose response body has not been sent (or dropped) yet.
    in_flight: AtomicUsize,
    /// Whether the service has ever been called.
    requested: AtomicBool,
    /// The connection speaks HTTP/1 (known from its first request).
    http1: AtomicBool,
    /// HTTP/1: bytes of the next request have arrived while nothing was in flight.
    head_started: AtomicBool,
    /// The socket's last write took nothing (its send buffer is full: the client is not
    /// reading), and no write has taken anything since.
    write_stalled: AtomicBool,
    /// Stalls begun so far: while this has not moved, a stall is the one the watchdog already
    /// saw begin, and its send clock keeps running from then (a new request meanwhile, or the
    /// drain, does not restart it).
    stalls: AtomicU64,
    /// The connection was dropped for taking nothing: its socket is reset when closed, rather
    /// than left to the kernel with a full send queue the peer will not take.
    reset_on_close: AtomicBool,
    /// The connection has switched protocols (a `101` went out): the bytes that follow are
    /// not HTTP/1 and the service is not called again, so [`Framing`] no longer follows them.
    switched: AtomicBool,
    /// Set when a request starts, when the last one in flight ends, when the next HTTP/1
    /// request begins to arrive, and when the socket stops or starts again taking what is
    /// written; the watchdog clears it when it looks.
    changed: AtomicBool,
    /// The watchdog's task, woken when `changed` is set.
    waker: AtomicWaker,
    /// Whether the watchdog is polling the connection right now: a change made meanwhile (on
    /// HTTP/1 all of them are, by the service and the socket) is seen when that poll returns,
    /// without waking the task to poll the whole connection again.
    polling: AtomicBool,
}

impl Activity {
    /// A request reached the service: in flight until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>, version: Version) -> InFlight {
        if !self.requested.swap(true, Ordering::AcqRel) {
            self.http1.store(version < Version::HTTP_2, Ordering::Release);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(false, Ordering::Release);
        self.notify();
        InFlight(self.clone())
    }

    /// Tell the watchdog something changed. `changed` and `polling` are written and read
    /// sequentially consistent: either the watchdog sees the change after its poll, or this
    /// sees that it is not polling and wakes it.
    fn notify(&self) {
        self.changed.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.waker.wake();
        }
    }

    /// The socket read `n` bytes. On an idle HTTP/1 connection that is the next request's
    /// head beginning: its header clock starts.
    fn read(&self, n: usize) {
        if n > 0
            && self.http1.load(Ordering::Acquire)
            && !self.busy()
            && !self.head_started.swap(true, Ordering::AcqRel)
        {
            self.notify();
        }
    }

    /// A write to the socket took nothing: the send clock starts.
    fn write_pending(&self) {
        if !self.write_stalled.swap(true, Ordering::AcqRel) {
            self.stalls.fetch_add(1, Ordering::Relaxed);
            self.notify();
        }
    }

    /// A write to the socket took some bytes. Read first: this runs on every write, and a
    /// store each time would bounce the line between cores for nothing.
    fn wrote(&self) {
        if self.write_stalled.load(Ordering::Relaxed) && self.write_stalled.swap(false, Ordering::AcqRel) {
            self.notify();
        }
    }

    fn switched(&self) -> bool {
        self.switched.load(Ordering::Relaxed)
    }

    fn write_stalled(&self) -> bool {
        self.write_stalled.load(Ordering::Acquire)
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    fn head_started(&self) -> bool {
        self.head_started.load(Ordering::Acquire)
    }
}

/// A client's socket: it holds the connection's places under `MAX_CONNECTIONS` and
/// `MAX_CONNECTIONS_PER_CLIENT` until it is closed, whoever holds it last (the HTTP connection, or the tunnel it was upgraded to),
/// and tells the watchdog when bytes arrive on an idle HTTP/1 connection, and when a write
/// takes nothing (the client is not reading) or takes bytes again.
#[derive(Debug)]
pub(crate) struct ClientStream {
    /// The socket, or TLS over it.
    stream: Transport,
    activity: Arc<Activity>,
    /// Follows the request heads in the bytes read (see [`Framing`]).
    framing: Framing,
    heads: Arc<Heads>,
    _slots: (Slot, ClientSlot),
}

impl ClientStream {
    /// `stream`, counted under `slots`, reporting to `activity`, and to `heads` which request
    /// carried both `Content-Length` and `Transfer-Encoding`.
    pub(crate) fn new(
        stream: Transport,
        slots: (Slot, ClientSlot),
        activity: Arc<Activity>,
        heads: Arc<Heads>,
    ) -> ClientStream {
        ClientStream {
            stream,
            activity,
            framing: Framing::default(),
            heads,
            _slots: slots,
        }
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        // Dropped for taking nothing: a reset frees the send queue at once, where a close
        // would leave it to the kernel for as long as the peer keeps its window shut (nginx's
        // `reset_timedout_connection`).
        if self.activity.reset_on_close.load(Ordering::Relaxed)
            && let Err(error) = self.stream.tcp().set_zero_linger()
        {
            tracing::debug!(%error, "set_zero_linger failed");
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if polled.is_ready() {
            let read = &buf.filled()[before..];
            this.activity.read(read.len());
            // Nothing marked yet, and still HTTP/1.
            if this.heads.ambiguous.load(Ordering::Relaxed) == 0 && !this.activity.switched() {
                this.framing.read(read);
                if let Some(number) = this.framing.ambiguous() {
                    this.heads.ambiguous.store(number, Ordering::Release);
                }
            }
        }
        polled
    }
}

/// Between the socket, which sees request heads as the client sent them, and the service,
/// which sees them as hyper parsed them: which request hyper read without its
/// `Content-Length`.
#[derive(Debug, Default)]
pub(crate) struct Heads {
    /// The number (from 1) of the first request whose head had both `Content-Length` and
    /// `Transfer-Encoding`; 0 for none yet. Set before hyper hands that request on.
    ambiguous: AtomicU64,
    /// Requests the service has been called with.
    requests: AtomicU64,
}

impl Heads {
    /// Count a request reaching the service: true when it is the one whose head carried both
    /// `Content-Length` and `Transfer-Encoding`. HTTP/1 calls the service in order, one
    /// request at a time; on HTTP/2 nothing is ever marked.
    pub(crate) fn next_is_ambiguous(&self) -> bool {
        let number = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        self.ambiguous.load(Ordering::Acquire) == number
    }
}

impl ClientStream {
    /// Tell the watchdog whether a write took anything.
    fn written(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Pending => self.activity.write_pending(),
            Poll::Ready(Ok(written)) if written > 0 => self.activity.wrote(),
            Poll::Ready(_) => {}
        }
        polled
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.written(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.written(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// One request in flight on a connection; it ends when this is dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    /// This request's answer switches the connection's protocol (a `101`).
    pub(crate) fn switched(&self) {
        self.0.switched.store(true, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.notify();
        }
    }
}

/// The one wrapper around every response body: it keeps its request in flight (what `held`
/// stands for: an [`InFlight`]) until it is finished, fails, or is dropped (hyper drops a body
/// once it has sent it, and when the client goes away), and carries what else follows the
/// response ([`Follows`]): the places it gives back at its last frame, the counter of its
/// bytes. One `poll_frame` layer per response, whatever follows it.
///
/// The request's places among the requests in flight (under `MAX_CONNECTIONS` and
/// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`) and its admission's concurrency places go back sooner:
/// once the body has handed hyper its last frame. They stand for the work the gateway and the
/// backend do for a request; what is left, sending the last bytes, is the client's to take. An
/// HTTP/2 client that keeps its window shut (`SETTINGS_INITIAL_WINDOW_SIZE` 0) would otherwise
/// keep every answer it does not read, the gateway's own refusals included, holding a place
/// until `SEND_TIMEOUT_MS`.
///
/// On an HTTP/2 stream it also hands its data to hyper in pieces of at most
/// [`STREAM_PIECE`] and says, at each poll, whether it handed one (see [`super::streams`]).
#[derive(Debug)]
pub(crate) struct Tracked<B, H = InFlight, P = RequestPlace> {
    body: B,
    in_flight: Option<H>,
    /// What follows the response until its last frame.
    follows: Follows<P>,
    /// What is left of a chunk of `body` handed in pieces.
    rest: Option<Bytes>,
}

/// What follows one response besides its place in flight.
#[derive(Debug)]
pub(crate) struct Follows<P = RequestPlace> {
    /// The request's places among the requests in flight, until its last frame is handed over
    /// (`None` for a request answered `503` for want of one).
    pub place: Option<P>,
    /// What its settled admission holds (concurrency places), until its last frame is handed
    /// over.
    pub settled: Settled,
    /// Counts the body's data bytes (the backend's response bytes, by rule), if anything does.
    pub bytes: Option<Counter>,
}

impl<P> Follows<P> {
    /// Only `place`: nothing settled, nothing counted.
    #[cfg(test)]
    pub(crate) fn place(place: Option<P>) -> Follows<P> {
        Follows {
            place,
            settled: Settled::none(),
            bytes: None,
        }
    }

    /// The last frame is handed over (or none will be): give the places back.
    fn release(&mut self) {
        self.place = None;
        self.settled.release();
    }
}

/// The most an HTTP/2 stream's body hands hyper at once: an HTTP/2 `DATA` frame's default
/// size. hyper asks for the next piece once it has sent most of this one, so a stream's send
/// clock restarts every 16 KiB the client takes; handed whole, a chunk of the backend's (up to
/// about 400 KiB as hyper's reader grows its buffer) would have to be taken within one
/// `SEND_TIMEOUT_MS`, and a slow but steady reader would be reset.
pub(crate) const STREAM_PIECE: usize = 16 * 1024;

impl<B, H, P> Tracked<B, H, P> {
    /// `body`, keeping `held` until it ends and what `follows` it until its last frame is
    /// handed over.
    pub(crate) fn new(body: B, held: H, follows: Follows<P>) -> Tracked<B, H, P> {
        Tracked {
            body,
            in_flight: Some(held),
            follows,
            rest: None,
        }
    }

    /// `data` as the next frame; on an HTTP/2 stream, its first [`STREAM_PIECE`] bytes only,
    /// the rest kept for the next polls (split without a copy).
    fn piece(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > STREAM_PIECE && super::streams::in_stream() {
            self.rest = Some(data.split_off(STREAM_PIECE));
        }
        Frame::data(data)
    }
}

impl<B: Body<Data = Bytes> + Unpin, H: Unpin, P: Unpin> Body for Tracked<B, H, P> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = match this.rest.take() {
            Some(rest) => Poll::Ready(Some(Ok(this.piece(rest)))),
            None => match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_data() {
                    Ok(data) => {
                        if let Some(bytes) = &this.follows.bytes {
                            bytes.inc_by(data.len() as u64);
                        }
                        this.piece(data)
                    }
                    Err(trailers) => trailers,
                }))),
                other => other,
            },
        };
        // Whether hyper now waits for the client: an HTTP/2 stream's send clock.
        if matches!(polled, Poll::Ready(Some(Ok(_)))) {
            super::streams::handed_frame();
            // The last frame is handed over (hyper stops asking once `is_end_stream` says so):
            // the gateway's work for the request is done.
            if this.is_end_stream() {
                this.follows.release();
            }
        } else {
            super::streams::no_frame();
        }
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.in_flight = None;
            this.follows.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.body.size_hint();
        let rest = self.rest.as_ref().map_or(0, |rest| rest.len() as u64);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint.set_lower(hint.lower() + rest);
        hint
    }
}

/// Tells every connection to close gracefully, and waits until all have: hyper-util's
/// `GracefulShutdown`, for connections that the watchdog may also close.
#[derive(Debug)]
pub(crate) struct Drain {
    signal: watch::Sender<bool>,
    /// Set before `signal` changes (or goes): the watchdogs read this flag on every poll,
    /// and poll their (costlier) receiver only once it is set.
    draining: Arc<AtomicBool>,
}

/// One connection's end of the [`Drain`]: held until the connection ends.
#[derive(Debug)]
pub(crate) struct DrainWatcher {
    receiver: watch::Receiver<bool>,
    draining: Arc<AtomicBool>,
}

impl DrainWatcher {
    /// Completes when the drain begins (or the server is gone): for a connection that is
    /// not serving HTTP yet, to give up its handshake.
    pub(crate) async fn closing(&mut self) {
        let _ = self.receiver.wait_for(|draining| *draining).await;
    }
}

impl Drain {
    /// Nothing draining yet.
    pub(crate) fn new() -> Drain {
        Drain {
            signal: watch::Sender::new(false),
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// For one connection: held until it ends, and told when to close.
    pub(crate) fn watcher(&self) -> DrainWatcher {
        DrainWatcher {
            receiver: self.signal.subscribe(),
            draining: self.draining.clone(),
        }
    }

    /// Connections that have not ended yet.
    pub(crate) fn open(&self) -> usize {
        self.signal.receiver_count()
    }

    /// Ask every connection (and every later one) to close gracefully, and wait until they
    /// all have ended.
    pub(crate) async fn close_all(&self) {
        self.draining.store(true, Ordering::Release);
        self.signal.send_replace(true);
        self.signal.closed().await;
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        // The server is gone without a drain: the watchdogs close their connections all the
        // same (their receivers see the sender go).
        self.draining.store(true, Ordering::Release);
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the watchdog closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    /// The connection ended by itself (the client closed it, an error, an upgrade, or the
    /// graceful close the watchdog asked for completed).
    Ended,
    /// Dropped: it had not let go [`CLOSE_GRACE`] after being asked to close.
    Dropped,
    /// Dropped: its socket took no byte of a response for `SEND_TIMEOUT_MS`.
    Stalled,
}

/// Drive `connection` until it ends, closing it (with `close`, hyper's graceful shutdown)
/// when it sends no request by `first_request_by` (accept plus `timeouts.header_read`), when
/// it has nothing in flight for `timeouts.idle`, when an HTTP/1 request's head takes longer
/// than `timeouts.header_read` from its first byte, or when `drain` says so; and dropping it
/// when it has not let go [`CLOSE_GRACE`] after that with nothing in flight, or when its
/// socket has taken nothing of what was written for `timeouts.send`.
///
/// This runs on every poll of the connection, so it is a hand-written poll that touches
/// nothing shared unless something changed: the connection first, then the drain's receiver
/// (only once the drain's flag is set, or the first time and when the task's waker
/// changes), the activity's flag, and one timer kept for the connection's life. The timer is
/// never armed later than the clock that runs: when a request ends and the idle clock
/// restarts, the timer keeps its earlier time, fires early, and is re-armed then, rather
/// than being moved (and the timer wheel locked) on every request.
pub(crate) async fn supervise<C, E>(
    mut connection: Pin<&mut C>,
    mut close: impl FnMut(Pin<&mut C>),
    activity: &Activity,
    drain: DrainWatcher,
    timeouts: Timeouts,
    first_request_by: Instant,
) -> (Closed, Result<(), E>)
where
    C: Future<Output = Result<(), E>>,
{
    let DrainWatcher {
        mut receiver,
        draining,
    } = drain;
    // An error means the server is gone without a drain: close all the same.
    let mut drained = std::pin::pin!(receiver.wait_for(|draining| *draining));
    // The waker the drain's receiver was last polled with (it keeps it until woken).
    let mut drain_waker: Option<Waker> = None;
    let mut drain_seen = false;
    let first = first_request_by;
    // When the connection is closed, if nothing happens before; `None` while busy.
    let mut deadline = Some(first);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(first));
    let mut closing = false;
    // The stall the send clock runs for: its number in `activity.stalls`, and when it began.
    let mut stall: Option<(u64, Instant)> = None;
    std::future::poll_fn(|cx| {
        activity.waker.register(cx.waker());
        loop {
            activity.polling.store(true, Ordering::SeqCst);
            let polled = connection.as_mut().poll(cx);
            activity.polling.store(false, Ordering::SeqCst);
            if let Poll::Ready(result) = polled {
                return Poll::Ready((Closed::Ended, result));
            }
            if !drain_seen
                && (draining.load(Ordering::Acquire)
                    || drain_waker
                        .as_ref()
                        .is_none_or(|waker| !waker.will_wake(cx.waker())))
            {
                match drained.as_mut().poll(cx) {
                    Poll::Ready(_) => {
                        drain_seen = true;
                        if !closing {
                            tracing::trace!("draining: closing the connection");
                            close(connection.as_mut());
                            closing = true;
                            // The clocks are worked out again below (a running send clock kept).
                            activity.changed.store(true, Ordering::SeqCst);
                            continue;
                        }
                    }
                    Poll::Pending => drain_waker = Some(cx.waker().clone()),
                }
            }
            if activity.changed.swap(false, Ordering::SeqCst) {
                // Read only when a clock starts: not when a request begins on a socket that
                // takes what it is sent, which is every request's first change.
                let mut read = None;
                let mut now = || *read.get_or_insert_with(Instant::now);
                stall = activity.write_stalled().then(|| {
                    let number = activity.stalls.load(Ordering::Relaxed);
                    match stall {
                        // The same stall (a request started or ended meanwhile): its start
                        // stands, or a client could hold it off by opening streams.
                        Some((seen, since)) if seen == number => (seen, since),
                        _ => (number, now()),
                    }
                });
                let clock = match (activity.busy(), closing) {
                    (true, _) => None,
                    (false, true) => Some(now() + CLOSE_GRACE),
                    // The next request's head has begun: the idle clock gives way to the
                    // header clock.
                    (false, false) if activity.head_started() => Some(now() + timeouts.header_read),
                    (false, false) => Some(now() + timeouts.idle),
                };
                // The socket takes nothing: the send clock runs too, whatever else does (a
                // close would not get through it either).
                let send = stall.map(|(_, since)| since + timeouts.send);
                deadline = clock.into_iter().chain(send).min();
            }
            let Some(due) = deadline else {
                return Poll::Pending;
            };
            if timer.deadline() > due {
                timer.as_mut().reset(due);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if timer.deadline() < due {
                // An earlier clock's time: re-armed for this one.
                timer.as_mut().reset(due);
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            if activity.write_stalled()
                && stall.is_some_and(|(_, since)| since + timeouts.send <= Instant::now())
            {
                tracing::debug!("the client took no byte of what was sent for SEND_TIMEOUT_MS: dropped");
                activity.reset_on_close.store(true, Ordering::Relaxed);
                return Poll::Ready((Closed::Stalled, Ok(())));
            }
            if activity.busy() {
                // The send clock's time came, but the socket took bytes again meanwhile (its
                // change is seen next): nothing else runs while a request is in flight.
                deadline = None;
                continue;
            }
            if closing {
                tracing::debug!("closing connection did not let go: dropped");
                return Poll::Ready((Closed::Dropped, Ok(())));
            }
            if activity.head_started() {
                tracing::debug!("request headers incomplete after HEADER_READ_TIMEOUT_MS: closing");
            } else if activity.requested() {
                tracing::debug!("connection idle for IDLE_TIMEOUT_MS: closing");
            } else {
                tracing::debug!("no request within HEADER_READ_TIMEOUT_MS of accept: closing");
            }
            close(connection.as_mut());
            closing = true;
            deadline = Some(Instant::now() + CLOSE_GRACE);
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};

    /// A connection that never ends by itself; a graceful close ends it once nothing is in
    /// flight, as hyper's does, when it `obeys_close`.
    struct FakeConnection {
        closes: Arc<AtomicU32>,
        activity: Arc<Activity>,
        obeys_close: bool,
    }

    impl Future for FakeConnection {
        type Output = Result<(), ()>;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            if self.obeys_close && self.closes.load(Ordering::Acquire) > 0 && !self.activity.busy() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
    }

    struct Harness {
        activity: Arc<Activity>,
        closes: Arc<AtomicU32>,
        drain: Drain,
        task: tokio::task::JoinHandle<(Closed, Result<(), ()>)>,
    }

    const TIMEOUTS: Timeouts = Timeouts {
        header_read: Duration::from_secs(10),
        idle: Duration::from_secs(60),
        send: Duration::from_secs(30),
    };

    fn start(obeys_close: bool) -> Harness {
        let activity = Arc::new(Activity::default());
        let closes = Arc::new(AtomicU32::new(0));
        let drain = Drain::new();
        let watcher = drain.watcher();
        let (task_activity, task_closes) = (activity.clone(), closes.clone());
        let task = tokio::spawn(async move {
            let connection = std::pin::pin!(FakeConnection {
                closes: task_closes.clone(),
                activity: task_activity.clone(),
                obeys_close,
            });
            let close = |_: Pin<&mut FakeConnection>| {
                task_closes.fetch_add(1, Ordering::AcqRel);
            };
            let first_request_by = Instant::now() + TIMEOUTS.header_read;
            supervise(
                connection,
                close,
                &task_activity,
                watcher,
                TIMEOUTS,
                first_request_by,
            )
            .await
        });
        Harness {
            activity,
            closes,
            drain,
            task,
        }
    }

    impl Harness {
        fn closes(&self) -> u32 {
            self.closes.load(Ordering::Acquire)
        }
    }

    /// Let the watchdog run up to (not past) `by` from now.
    async fn advance(by: Duration) {
        tokio::time::sleep(by).await;
    }

    const JUST_UNDER: Duration = Duration::from_millis(999);

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_no_request_is_closed_after_the_header_read_timeout() {
        let harness = start(true);
        advance(TIMEOUTS.header_read - Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 0);
        advance(Duration::from_millis(2)).await;
        assert_eq!(harness.closes(), 1);
        assert_eq!(harness.task.await.unwrap(), (Closed::Ended, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_let_go_is_dropped_after_the_grace() {
        let harness = start(false);
        advance(TIMEOUTS.header_read + JUST_UNDER).await;
        assert_eq!(harness.closes(), 1);
        assert!(!harness.task.is_finished());
        advance(Duration::from_millis(2)).await;
        assert_eq!(harness.task.await.unwrap(), (Closed::Dropped, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_closed_while_a_request_is_in_flight_then_the_idle_clock_runs() {
        let harness = start(true);
        advance(Duration::from_secs(1)).await;
        let in_flight = harness.activity.start(Version::HTTP_2);
        // Far past both timeouts: a slow backend or a long download.
        advance(Duration::from_secs(600)).await;
        assert_eq!(harness.closes(), 0);
        drop(in_flight);
        advance(TIMEOUTS.idle - Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 0);
        // A second request restarts the clock.
        drop(harness.activity.start(Version::HTTP_2));
        advance(TIMEOUTS.idle - Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 0);
        advance(Duration::from_millis(2)).await;
        assert_eq!(harness.closes(), 1);
        assert_eq!(harness.task.await.unwrap(), (Closed::Ended, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_none_of_its_response_is_dropped_after_the_send_timeout() {
        let harness = start(true);
        let _in_flight = harness.activity.start(Version::HTTP_11);
        advance(Duration::from_secs(5)).await;
        harness.activity.write_pending();
        advance(TIMEOUTS.send - Duration::from_millis(1)).await;
        assert!(!harness.task.is_finished());
        advance(Duration::from_millis(2)).await;
        assert_eq!(
            harness.closes(),
            0,
            "no graceful close through a socket that takes nothing"
        );
        assert_eq!(harness.task.await.unwrap(), (Closed::Stalled, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut_and_the_send_clock_restarts_with_each_byte_taken() {
        let harness = start(true);
        let in_flight = harness.activity.start(Version::HTTP_2);
        for _ in 0..5 {
            harness.activity.write_pending();
            advance(TIMEOUTS.send - Duration::from_millis(1)).await;
            harness.activity.wrote();
        }
        // Taking everything written: busy, not stalled, for as long as it lasts.
        advance(Duration::from_secs(600)).await;
        assert!(!harness.task.is_finished());
        assert_eq!(harness.closes(), 0);
        drop(in_flight);
        advance(TIMEOUTS.idle + Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 1, "then the idle clock runs");
        assert_eq!(harness.task.await.unwrap(), (Closed::Ended, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_started_and_ended_during_a_stall_do_not_restart_the_send_clock() {
        let harness = start(true);
        let _stalled = harness.activity.start(Version::HTTP_2);
        harness.activity.write_pending();
        // An HTTP/2 client that takes nothing but opens a stream now and then.
        for _ in 0..3 {
            advance(TIMEOUTS.send / 4).await;
            drop(harness.activity.start(Version::HTTP_2));
        }
        advance(TIMEOUTS.send / 4 + Duration::from_millis(1)).await;
        assert_eq!(harness.task.await.unwrap(), (Closed::Stalled, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_keeps_a_running_send_clock() {
        let harness = start(false);
        let _stalled = harness.activity.start(Version::HTTP_11);
        harness.activity.write_pending();
        advance(TIMEOUTS.send / 2).await;
        let drain = harness.drain;
        tokio::spawn(async move { drain.close_all().await });
        advance(TIMEOUTS.send / 2 + Duration::from_millis(1)).await;
        assert_eq!(harness.closes.load(Ordering::Acquire), 1, "asked to close");
        assert_eq!(harness.task.await.unwrap(), (Closed::Stalled, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_socket_with_nothing_in_flight_is_dropped_after_the_send_timeout_too() {
        let harness = start(true);
        drop(harness.activity.start(Version::HTTP_2));
        // Bytes not taken after the last response left the service (its tail, a stream
        // reset): the idle clock runs, and the send clock beside it.
        harness.activity.write_pending();
        advance(TIMEOUTS.send - Duration::from_millis(1)).await;
        assert!(!harness.task.is_finished());
        advance(Duration::from_millis(2)).await;
        assert_eq!(harness.closes(), 0, "before the idle clock");
        assert_eq!(harness.task.await.unwrap(), (Closed::Stalled, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_http1_request_head_must_be_complete_within_the_header_read_timeout() {
        let harness = start(true);
        drop(harness.activity.start(Version::HTTP_11));
        advance(Duration::from_secs(30)).await;
        // The first bytes of the next head: the header clock replaces the idle clock.
        harness.activity.read(3);
        advance(TIMEOUTS.header_read - Duration::from_millis(1)).await;
        harness.activity.read(3);
        assert_eq!(harness.closes(), 0);
        advance(Duration::from_millis(2)).await;
        assert_eq!(harness.closes(), 1, "a trickled head is cut");
        assert_eq!(harness.task.await.unwrap(), (Closed::Ended, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_on_an_idle_http2_connection_are_not_a_request() {
        let harness = start(true);
        drop(harness.activity.start(Version::HTTP_2));
        // PINGs and WINDOW_UPDATEs: neither activity nor a head being read.
        harness.activity.read(17);
        advance(TIMEOUTS.header_read + Duration::from_secs(1)).await;
        assert_eq!(harness.closes(), 0);
        advance(TIMEOUTS.idle - TIMEOUTS.header_read).await;
        assert_eq!(harness.closes(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_body_keeps_its_request_in_flight_until_it_ends() {
        let harness = start(true);
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, ()>>(1);
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|frame| (frame, receiver))
        });
        let mut body = Tracked::new(
            StreamBody::new(Box::pin(stream)),
            harness.activity.start(Version::HTTP_2),
            Follows::place(None::<()>),
        );
        for _ in 0..10 {
            sender
                .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                .await
                .unwrap();
            body.frame().await.unwrap().unwrap();
            advance(TIMEOUTS.idle).await;
        }
        assert_eq!(harness.closes(), 0, "a download is not idle");
        drop(sender);
        assert!(body.frame().await.is_none());
        // Finished: the body no longer counts, even while it is still held.
        advance(TIMEOUTS.idle + Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 1);
        drop(body);
    }

    /// Moved from the metrics' own body wrapper, which this one replaced: its assertions kept.
    #[tokio::test(start_paused = true)]
    async fn a_counted_body_adds_each_data_frame_once() {
        let harness = start(true);
        let bytes = Counter::default();
        let frames = [
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"hello "))),
            Ok(Frame::data(Bytes::from_static(b"world"))),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ];
        let follows = Follows {
            bytes: Some(bytes.clone()),
            ..Follows::place(None::<()>)
        };
        let body = Tracked::new(
            StreamBody::new(futures_util::stream::iter(frames)),
            harness.activity.start(Version::HTTP_11),
            follows,
        );
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected, "hello world");
        assert_eq!(bytes.get(), 11);
        // Nothing to count into: the body passes through.
        let body = Tracked::new(
            Full::new(Bytes::from_static(b"x")),
            harness.activity.start(Version::HTTP_11),
            Follows::place(None::<()>),
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "x");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_s_places_go_back_once_its_last_frame_is_handed_over() {
        let harness = start(true);
        // An answer of the gateway's own: one frame, and then the body says it has ended.
        let place = Arc::new(());
        let mut refusal = Tracked::new(
            Full::new(Bytes::from_static(b"refused")),
            harness.activity.start(Version::HTTP_2),
            Follows::place(Some(place.clone())),
        );
        assert_eq!(Arc::strong_count(&place), 2);
        refusal.frame().await.unwrap().unwrap();
        assert_eq!(
            Arc::strong_count(&place),
            1,
            "handed over whole: its place is back, sent or not"
        );
        // Still in flight for the watchdog until it is sent (or given up).
        advance(TIMEOUTS.idle + Duration::from_millis(1)).await;
        assert_eq!(harness.closes(), 0);
        drop(refusal);
        // A body whose end only its last poll tells (a chunked backend answer) keeps its
        // place until then.
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, ()>>(1);
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|frame| (frame, receiver))
        });
        let mut streamed = Tracked::new(
            StreamBody::new(Box::pin(stream)),
            harness.activity.start(Version::HTTP_2),
            Follows::place(Some(place.clone())),
        );
        sender
            .send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .await
            .unwrap();
        streamed.frame().await.unwrap().unwrap();
        assert_eq!(Arc::strong_count(&place), 2, "more may come");
        drop(sender);
        assert!(streamed.frame().await.is_none());
        assert_eq!(Arc::strong_count(&place), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_closes_idle_connections_at_once_and_busy_ones_when_done() {
        let idle = start(true);
        drop(idle.activity.start(Version::HTTP_2));
        let busy = start(true);
        let in_flight = busy.activity.start(Version::HTTP_2);
        let (idle_drain, busy_drain) = (
            tokio::spawn(async move { idle.drain.close_all().await }),
            tokio::spawn(async move { busy.drain.close_all().await }),
        );
        tokio::task::yield_now().await;
        idle_drain.await.unwrap();
        assert_eq!(idle.closes.load(Ordering::Acquire), 1);
        assert_eq!(busy.closes.load(Ordering::Acquire), 1, "asked to close");
        advance(Duration::from_secs(30)).await;
        assert!(!busy_drain.is_finished(), "a request in flight is waited for");
        drop(in_flight);
        busy_drain.await.unwrap();
        assert_eq!(busy.task.await.unwrap(), (Closed::Ended, Ok(())));
    }
}
