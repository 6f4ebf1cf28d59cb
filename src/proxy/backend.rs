//! The connections to the backend: HTTP/1.1 over TCP, or over TLS for an `https` backend
//! (see [`super::tls`]), kept alive and reused.
//!
//! There is one backend and so one address: the pool is a stack of idle connections behind a
//! mutex, with no pool keys to hash and nothing to race. A request takes the connection used
//! most recently (the warmest; the oldest expire at the bottom), or opens a new one. A
//! connection goes back on the stack when the response body has been read to its end and
//! hyper's dispatcher is ready for the next request, which on one worker thread is already
//! true when the last frame comes out: no task is spawned per request. (hyper-util's pooled
//! client spawns one for every HTTP/1 request to wait for that moment, and hashes a pool key
//! twice; replacing it, with origin-form targets, took 0.86x the instructions a request,
//! docs/benchmarks.md part 4.)
//!
//! What the pooled client did and this keeps:
//! - A request that meets a kept-alive connection the backend has just closed (hyper hands it
//!   back unwritten) is sent once more, on a new connection. A request that was written is
//!   never sent twice.
//! - Idle connections are used for at most `BACKEND_IDLE_TIMEOUT_MS` (keep it below the
//!   backend's keep-alive timeout, so the backend never closes one just as it is used) and
//!   closed within twice that.
//! - Failures say what failed: resolving the backend's name, connecting to it, the TLS
//!   handshake (and why: expired, unknown issuer, wrong name), or the exchange (hyper's error,
//!   with its I/O cause).
//!
//! An https backend that chooses `h2` when offered it (ALPN) gets the requests of HTTP/2
//! clients over one shared HTTP/2 connection, opened when the first such request comes and
//! replaced when it closes or has been idle for `BACKEND_IDLE_TIMEOUT_MS`. Requests of HTTP/1
//! clients, and all requests to a backend that answered the offer with `http/1.1` (it is not
//! made again), use the HTTP/1.1 connections above.
//!
//! And what it adds: an exchange that has not finished `BACKEND_TIMEOUT_MS` after its response
//! ended (a backend that answered an upload early and stopped reading it) has its connection
//! closed, where the pooled client waited for it without end.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::uri::Authority;
use http::{Request, Response, Uri, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;
use tokio::task::AbortHandle;
use tokio::time::{Instant, Sleep};

use super::body::ClientBody;
use super::tls::{TlsConnector, TlsError};

/// Why the backend gave no response.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    /// The backend's name did not resolve (or resolved to no address).
    #[error("dns error: {0}")]
    Resolve(#[source] io::Error),
    /// No connection could be made to any of its addresses.
    #[error("connect error: {0}")]
    Connect(#[source] io::Error),
    /// Connected, but the TLS handshake failed (an https backend): never retried in plain text.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The connection was made but the exchange failed: refused by hyper, reset, closed early.
    #[error(transparent)]
    Exchange(#[from] hyper::Error),
    /// It answered `101 Switching Protocols` to a request that asked for no upgrade (or whose
    /// upgrade the gateway removed), or to a protocol not in `UPGRADE_PROTOCOLS`: no tunnel
    /// is opened.
    #[error("the backend switched to a protocol it was not asked for")]
    UnaskedSwitch,
    /// No response head before the deadline [`BackendPool::send`] was given
    /// (`BACKEND_TIMEOUT_MS` after the request was sent).
    #[error("no response before the deadline")]
    TimedOut,
}

/// Where the backend listens: an address, or a name resolved on every new connection (so a
/// backend that moves is followed, as a DNS-based deployment expects).
#[derive(Debug, Clone)]
enum Destination {
    /// An IP address and port: connected to as is.
    Address(SocketAddr),
    /// A host name and port: resolved, then its addresses tried in turn.
    Name(String, u16),
}

/// The connections to one backend. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub(crate) struct BackendPool {
    /// The pool itself; response bodies hold it weakly, to give their connection back.
    inner: Arc<Pool>,
}

struct Pool {
    /// Connections ready for a request, the most recently used last.
    idle: Mutex<VecDeque<Idle>>,
    /// Where to connect.
    destination: Destination,
    /// For an https backend: the TLS client, with its session cache.
    tls: Option<TlsConnector>,
    /// The backend's authority as a `Host` value.
    host: HeaderValue,
    /// The backend's authority, for HTTP/2's `:authority`.
    authority: Authority,
    /// The HTTP/2 connection HTTP/2 clients' requests share, once an https backend chose h2.
    multiplexed: Mutex<Option<Multiplexed>>,
    /// Held while an HTTP/2 connection is opened: requests that come meanwhile wait for it
    /// rather than each opening one.
    opening_h2: tokio::sync::Mutex<()>,
    /// Set once the backend answered an offer of `h2` with `http/1.1`: it is not offered again.
    h2_declined: AtomicBool,
    /// `BACKEND_TIMEOUT_MS`: shared among the addresses a name resolves to when connecting,
    /// and the most a connection may take to finish an exchange after its response (see
    /// [`Checkin::release`]).
    timeout: Duration,
    /// `BACKEND_IDLE_TIMEOUT_MS`.
    idle_timeout: Duration,
    /// `tollgate_backend_connections_total`.
    opened: Counter,
    /// Set once the task closing expired idle connections runs (started with the first
    /// connection, inside the runtime).
    reaper: OnceLock<()>,
}

/// One connection: where requests go in, and the task that runs it.
struct Connection {
    /// Hands requests to hyper's dispatcher.
    sender: SendRequest<ClientBody>,
    /// The dispatcher's task, to close a connection that will not finish an exchange.
    task: AbortHandle,
    /// The timer of its exchanges' deadlines, one for the connection's life: moved to each
    /// request's later deadline, a registered timer only has its expiry pushed back (one
    /// atomic operation), where a timer of the request's own is put into tokio's timer wheel
    /// and taken out again under its lock (about 450 instructions a request,
    /// docs/benchmarks.md part 21). Boxed: a timer must not move once polled.
    deadline: Pin<Box<Sleep>>,
}

/// The shared HTTP/2 connection.
struct Multiplexed {
    /// Cheap to clone; each request takes a clone.
    sender: http2::SendRequest<ClientBody>,
    /// When a request last took it.
    last_used: Instant,
}

/// A new connection, in the protocol the backend chose.
enum Opened {
    /// HTTP/1.1: one request at a time, pooled.
    Http1(Connection),
    /// HTTP/2 (an https backend that chose `h2`): shared.
    Http2(http2::SendRequest<ClientBody>),
}

/// A connection waiting for its next request.
struct Idle {
    /// The connection, ready for a request when it went idle.
    connection: Connection,
    /// When it went idle.
    since: Instant,
}

impl BackendPool {
    /// A pool for the backend at `authority`, over TLS with `tls` (port 443 when none is
    /// given) or plain TCP (port 80). Each connection it opens is counted in `opened`.
    pub(crate) fn new(
        authority: &Authority,
        tls: Option<TlsConnector>,
        timeout: Duration,
        idle_timeout: Duration,
        opened: Counter,
    ) -> Self {
        let port = authority
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        // `[::1]` in a URL is `::1` to a socket.
        let host = authority.host();
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let destination = match bare.parse::<IpAddr>() {
            Ok(ip) => Destination::Address(SocketAddr::new(ip, port)),
            Err(_) => Destination::Name(bare.to_owned(), port),
        };
        let host = HeaderValue::from_str(authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        BackendPool {
            inner: Arc::new(Pool {
                idle: Mutex::new(VecDeque::new()),
                destination,
                tls,
                host,
                authority: authority.clone(),
                multiplexed: Mutex::new(None),
                opening_h2: tokio::sync::Mutex::new(()),
                h2_declined: AtomicBool::new(false),
                timeout,
                idle_timeout,
                opened,
                reaper: OnceLock::new(),
            }),
        }
    }

    /// The backend's authority as a `Host` value, for requests that name no host.
    pub(crate) fn host(&self) -> &HeaderValue {
        &self.inner.host
    }

    /// Whether the backend is reached over TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.inner.tls.is_some()
    }

    /// Send `request` (origin-form target, with a `Host`) and wait for the response head.
    /// `HTTP/2` as its version asks for HTTP/2 to the backend (an HTTP/2 client's request),
    /// used if the backend is https and chooses it; anything else is sent as HTTP/1.1. The
    /// response body gives an HTTP/1.1 connection back to the pool when it has been read to
    /// its end. `now` is the caller's reading of the clock, which judges idle connections.
    /// With a `deadline`, a response head not there by then (a new connection included) is
    /// [`BackendError::TimedOut`], and the exchange is given up; without one the caller keeps
    /// the time.
    // Not an `async fn`: the pool's own future is the request's, with no future of this
    // function's around it (one copy of its state less, docs/benchmarks.md part 21).
    pub(crate) fn send(
        &self,
        request: Request<ClientBody>,
        now: Instant,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Response<BackendBody>, BackendError>> + Send + '_ {
        self.inner.send(request, now, deadline)
    }
}

impl Pool {
    /// See [`BackendPool::send`]: over a pooled HTTP/1.1 connection, or a new one, by
    /// `deadline`, on a pooled connection kept by the connection's own timer; an HTTP/2
    /// client's request to an https backend, over HTTP/2 if it chooses it.
    async fn send(
        self: &Arc<Self>,
        mut request: Request<ClientBody>,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<Response<BackendBody>, BackendError> {
        if request.version() == Version::HTTP_2
            && self.tls.is_some()
            && !self.h2_declined.load(Ordering::Relaxed)
        {
            // Boxed: the HTTP/2 path (and its handshake) is large, and inline it would make
            // every request's future as large, copied by value on each hand-off (about
            // 24 KB a request, measured with callgrind: docs/benchmarks.md).
            return within(deadline, Box::pin(self.send_h2(request, now))).await;
        }
        *request.version_mut() = Version::HTTP_11;
        if let Some(mut connection) = self.checkout(now) {
            let mut exchange = std::pin::pin!(connection.sender.try_send_request(request));
            if let Some(at) = deadline {
                connection.deadline.as_mut().reset(at);
            }
            let timer = &mut connection.deadline;
            // Polled in place, not in a future of its own: each nested future is one more copy
            // of its state into the one that awaits it.
            let sent = std::future::poll_fn(|cx| match exchange.as_mut().poll(cx) {
                // The exchange first: an answer that is there is taken even at the deadline.
                Poll::Ready(sent) => Poll::Ready(Ok(sent)),
                Poll::Pending if deadline.is_some() => {
                    timer.as_mut().poll(cx).map(|()| Err(BackendError::TimedOut))
                }
                Poll::Pending => Poll::Pending,
            })
            .await?;
            match sent {
                Ok(response) => return Ok(self.body_of(response, connection)),
                Err(mut error) => match error.take_message() {
                    // Never written: the backend closed this connection as it was taken.
                    Some(unsent) => request = unsent,
                    None => return Err(BackendError::Exchange(error.into_error())),
                },
            }
        }
        // Boxed for the same reason: a new connection (a TLS handshake, maybe an HTTP/2 one) is
        // the rare case, and its future is the largest. Under the deadline as a whole, the
        // connection's making included.
        within(deadline, Box::pin(self.send_fresh(request))).await
    }

    /// Send `request` over a new HTTP/1.1 connection.
    async fn send_fresh(
        self: &Arc<Self>,
        request: Request<ClientBody>,
    ) -> Result<Response<BackendBody>, BackendError> {
        let mut connection = match self.connect(false).await? {
            Opened::Http1(connection) => connection,
            // Offered http/1.1 only (rustls refuses a server that picks another itself).
            Opened::Http2(_) => {
                return Err(BackendError::Connect(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the backend chose h2, which was not offered",
                )));
            }
        };
        let response = connection.sender.send_request(request).await?;
        Ok(self.body_of(response, connection))
    }

    /// The most recently used connection that is still fresh at `now` and ready, if any.
    fn checkout(&self, now: Instant) -> Option<Connection> {
        let mut idle = self.idle.lock();
        while let Some(top) = idle.pop_back() {
            if now.saturating_duration_since(top.since) >= self.idle_timeout {
                // Everything below went idle earlier still.
                idle.clear();
                return None;
            }
            if top.connection.sender.is_ready() {
                return Some(top.connection);
            }
        }
        None
    }

    /// Put a connection whose exchange is over back on the stack. Expired ones below it are
    /// the reaper's to close, and `checkout` never takes them.
    fn checkin(&self, connection: Connection) {
        let since = Instant::now();
        self.idle.lock().push_back(Idle { connection, since });
    }

    /// Send an HTTP/2 client's request over the shared HTTP/2 connection, opening it if there
    /// is none; over HTTP/1.1 if the backend declines h2.
    async fn send_h2(
        self: &Arc<Self>,
        request: Request<ClientBody>,
        now: Instant,
    ) -> Result<Response<BackendBody>, BackendError> {
        let mut request = self.h2_form(request);
        if let Some(mut sender) = self.shared_h2(now) {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(unpooled(response)),
                Err(mut error) => match error.take_message() {
                    // Never sent: the connection was closing (GOAWAY). Once more on a new one.
                    Some(unsent) => request = unsent,
                    None => return Err(BackendError::Exchange(error.into_error())),
                },
            }
        }
        let opening = self.opening_h2.lock().await;
        // Opened (or declined) while this one waited?
        if let Some(mut sender) = self.shared_h2(Instant::now()) {
            drop(opening);
            return Ok(unpooled(sender.send_request(request).await?));
        }
        if self.h2_declined.load(Ordering::Relaxed) {
            drop(opening);
            // The caller's deadline holds around this whole exchange; as HTTP/1.1 (its form's
            // version), the way back to HTTP/2 is not taken.
            return self.send(self.http1_form(request), now, None).await;
        }
        match Box::pin(self.connect(true)).await? {
            Opened::Http2(mut sender) => {
                *self.multiplexed.lock() = Some(Multiplexed {
                    sender: sender.clone(),
                    last_used: Instant::now(),
                });
                drop(opening);
                Ok(unpooled(sender.send_request(request).await?))
            }
            Opened::Http1(mut connection) => {
                self.h2_declined.store(true, Ordering::Relaxed);
                drop(opening);
                tracing::debug!(
                    "the backend chose http/1.1 over h2: HTTP/2 clients' requests go over HTTP/1.1"
                );
                let response = connection.sender.send_request(self.http1_form(request)).await?;
                Ok(self.body_of(response, connection))
            }
        }
    }

    /// The shared HTTP/2 connection, if it is open and was used within the idle timeout
    /// (else it is let go: it closes once its streams have ended).
    fn shared_h2(&self, now: Instant) -> Option<http2::SendRequest<ClientBody>> {
        let mut slot = self.multiplexed.lock();
        match slot.as_mut() {
            Some(shared)
                if !shared.sender.is_closed()
                    && now.saturating_duration_since(shared.last_used) < self.idle_timeout =>
            {
                shared.last_used = shared.last_used.max(now);
                Some(shared.sender.clone())
            }
            _ => {
                *slot = None;
                None
            }
        }
    }

    /// `request` as HTTP/2 wants it: an absolute target (`:scheme`, `:authority`, `:path`),
    /// no `Host` (`:authority` says it, RFC 9113 section 8.3.1).
    fn h2_form(&self, request: Request<ClientBody>) -> Request<ClientBody> {
        let (mut parts, body) = request.into_parts();
        let mut uri = parts.uri.into_parts();
        uri.scheme = Some(http::uri::Scheme::HTTPS);
        uri.authority = Some(self.authority.clone());
        // Origin-form targets always have a path; `Uri::from_parts` needs one.
        if uri.path_and_query.is_none() {
            uri.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        parts.uri = Uri::from_parts(uri).unwrap_or_else(|_| Uri::from_static("/"));
        parts.headers.remove(http::header::HOST);
        parts.version = Version::HTTP_2;
        Request::from_parts(parts, body)
    }

    /// The reverse of [`Pool::h2_form`], for a backend that declined h2.
    fn http1_form(&self, request: Request<ClientBody>) -> Request<ClientBody> {
        let (mut parts, body) = request.into_parts();
        if let Some(path_and_query) = parts.uri.path_and_query() {
            parts.uri = Uri::from(path_and_query.clone());
        }
        parts.headers.insert(http::header::HOST, self.host.clone());
        parts.version = Version::HTTP_11;
        Request::from_parts(parts, body)
    }

    /// Open a connection (with its TLS handshake, for an https backend, offering h2 when
    /// `offer_h2`) and start hyper's dispatcher for it.
    async fn connect(self: &Arc<Self>, offer_h2: bool) -> Result<Opened, BackendError> {
        let deadline = Instant::now() + self.timeout;
        let stream = match &self.destination {
            Destination::Address(address) => connect_to(&[*address], self.timeout).await,
            Destination::Name(name, port) => {
                let addresses: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), *port))
                    .await
                    .map_err(BackendError::Resolve)?
                    .collect();
                if addresses.is_empty() {
                    return Err(BackendError::Resolve(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{name} resolved to no address"),
                    )));
                }
                connect_to(&addresses, self.timeout).await
            }
        }
        .map_err(BackendError::Connect)?;
        self.opened.inc();
        let connection = match &self.tls {
            None => Opened::Http1(start_http1(stream).await?),
            Some(tls) => {
                // Within what is left of BACKEND_TIMEOUT_MS: a backend that accepts and then
                // says nothing is a timeout (504), as one that does not accept.
                let stream = tokio::time::timeout_at(deadline, tls.connect(stream, offer_h2))
                    .await
                    .map_err(|_| {
                        BackendError::Connect(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the TLS handshake with {} timed out", tls.server_name().to_str()),
                        ))
                    })??;
                match super::tls::negotiated_h2(&stream) {
                    true => Opened::Http2(start_http2(stream).await?),
                    false => Opened::Http1(start_http1(stream).await?),
                }
            }
        };
        self.reaper.get_or_init(|| {
            tokio::spawn(reap(Arc::downgrade(self), self.idle_timeout));
        });
        Ok(connection)
    }

    fn body_of(
        self: &Arc<Self>,
        response: Response<Incoming>,
        connection: Connection,
    ) -> Response<BackendBody> {
        // A switched protocol owns the connection now; anything else may give it back.
        let checkin = (response.status() != http::StatusCode::SWITCHING_PROTOCOLS).then(|| Checkin {
            connection,
            pool: Arc::downgrade(self),
        });
        response.map(|inner| BackendBody { inner, checkin })
    }
}

/// Start hyper's HTTP/1.1 dispatcher on `stream` (TCP, or TLS over it), in a task of its own.
async fn start_http1<S>(stream: S) -> Result<Connection, BackendError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::Builder::new().handshake(TokioIo::new(stream)).await?;
    let task = tokio::spawn(async move {
        // Ends when the backend or the pool closes it; its error was the request's.
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "backend connection ended");
        }
    })
    .abort_handle();
    // Not in tokio's timer wheel until its first exchange with a deadline polls it.
    let deadline = Box::pin(tokio::time::sleep_until(Instant::now()));
    Ok(Connection {
        sender,
        task,
        deadline,
    })
}

/// Start hyper's HTTP/2 connection on `stream`, in a task of its own.
async fn start_http2<S>(stream: S) -> Result<http2::SendRequest<ClientBody>, BackendError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(async move {
        // Ends on GOAWAY, a broken connection, or once the pool has let it go and its
        // streams have ended.
        if let Err(error) = connection.await {
            tracing::debug!(%error, "backend HTTP/2 connection ended");
        }
    });
    Ok(sender)
}

/// `exchange`, unless `deadline` passes first ([`BackendError::TimedOut`]): on a timer of its
/// own, for the rare ways (a new connection, HTTP/2).
async fn within<F>(deadline: Option<Instant>, exchange: F) -> Result<Response<BackendBody>, BackendError>
where
    F: Future<Output = Result<Response<BackendBody>, BackendError>>,
{
    match deadline {
        Some(at) => tokio::time::timeout_at(at, exchange)
            .await
            .unwrap_or(Err(BackendError::TimedOut)),
        None => exchange.await,
    }
}

/// A response on the shared HTTP/2 connection: nothing to give back at its end.
fn unpooled(response: Response<Incoming>) -> Response<BackendBody> {
    response.map(|inner| BackendBody { inner, checkin: None })
}

/// Try `addresses` in order, each for its share of `timeout`.
async fn connect_to(addresses: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let share = timeout / u32::try_from(addresses.len()).unwrap_or(u32::MAX).max(1);
    let mut last = None;
    for address in addresses {
        match tokio::time::timeout(share, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                // Requests are written whole: no waiting for an ACK to send the next one.
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Ok(Err(error)) => last = Some(error),
            Err(_) => {
                last = Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {address} timed out"),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address to connect to")))
}

/// Close connections idle past the timeout (HTTP/1.1 ones, and the shared HTTP/2 one), every
/// `idle_timeout`, while the pool lives.
async fn reap(pool: Weak<Pool>, idle_timeout: Duration) {
    // `interval` panics on zero; the configuration never gives less than a millisecond.
    let mut interval = tokio::time::interval(idle_timeout.max(Duration::from_millis(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        pool.idle.lock().retain(|idle| {
            now.duration_since(idle.since) < idle_timeout && !idle.connection.sender.is_closed()
        });
        // The shared HTTP/2 connection too: let go, it closes once its streams have ended.
        let mut multiplexed = pool.multiplexed.lock();
        if multiplexed
            .as_ref()
            .is_some_and(|shared| now.saturating_duration_since(shared.last_used) >= idle_timeout)
        {
            *multiplexed = None;
        }
    }
}

/// The connection a response body came on, to give back when the body has ended.
struct Checkin {
    /// The connection the response came on.
    connection: Connection,
    /// Where to give it back (gone once the proxy is).
    pool: Weak<Pool>,
}

impl Checkin {
    /// Give the connection back once hyper is ready for its next request.
    fn release(self) {
        let Some(pool) = self.pool.upgrade() else { return };
        let mut connection = self.connection;
        if connection.sender.is_ready() {
            pool.checkin(connection);
        } else if !connection.sender.is_closed()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // The dispatcher has not caught up yet: it runs on another worker thread, or the
            // request body is still streaming after an early response. Rare; wait for it, but
            // not for ever: a backend that answered early and then stopped reading the body
            // would hold the connection (and its socket) with nothing else to time it out.
            runtime.spawn(async move {
                match tokio::time::timeout(pool.timeout, connection.sender.ready()).await {
                    Ok(Ok(())) => pool.checkin(connection),
                    Ok(Err(_)) => {}
                    Err(_) => connection.task.abort(),
                }
            });
        }
    }
}

/// The backend's response body: hyper's, giving its connection back when read to the end. A
/// body dropped before its end takes the connection with it (hyper closes it).
pub(crate) struct BackendBody {
    /// The body as hyper reads it.
    inner: Incoming,
    /// The connection to give back at the end; `None` once given back, after a `101`, or
    /// when the body failed.
    checkin: Option<Checkin>,
}

impl BackendBody {
    fn release(&mut self) {
        if let Some(checkin) = self.checkin.take() {
            checkin.release();
        }
    }
}

impl Body for BackendBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            // hyper's server stops polling once `is_end_stream` says so, and after trailers
            // (always the last frame; a chunked body never says `is_end_stream`).
            Some(Ok(frame)) if frame.is_trailers() || this.inner.is_end_stream() => this.release(),
            Some(Ok(_)) => {}
            None => this.release(),
            // The connection is broken: it goes down with the body.
            Some(Err(_)) => this.checkin = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for BackendBody {
    fn drop(&mut self) {
        // An empty body (204, 304, a response to HEAD) is never polled.
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

impl std::fmt::Debug for BackendBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendBody")
            .field("pooled", &self.checkin.is_some())
            .finish()
    }
}
