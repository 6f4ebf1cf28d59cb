//! The listener: accept connections, serve HTTP/1.1 and HTTP/2 (h2c, prior knowledge) on the
//! same port to a [`Door`] (the proxy, or the decision endpoints), and drain on shutdown. What it is built from is wired in
//! [`crate::app`].
//!
//! - [`limits`]: `MAX_CONNECTIONS`, sized from the file-descriptor limit, and
//!   `MAX_CONNECTIONS_PER_CLIENT`; what the accept loop does past them or when `accept` fails;
//!   the same caps of requests in flight (`MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`);
//! - [`connection`]: the watchdog that closes silent and idle connections
//!   (`HEADER_READ_TIMEOUT_MS` from accept, `IDLE_TIMEOUT_MS` with nothing in flight), and the
//!   drain;
//! - [`listener`]: what comes before HTTP on a connection, within the same first clock: the
//!   PROXY header ([`proxy_protocol`]) and the TLS handshake ([`tls`], which also reloads the
//!   certificate when its files change), over a [`transport`] that is plain or TLS.

pub(crate) mod connection;
pub(crate) mod framing;
pub(crate) mod limits;
pub(crate) mod listener;
pub mod proxy_protocol;
pub(crate) mod streams;
pub(crate) mod tls;
pub(crate) mod transport;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};

use ipnet::IpNet;

use crate::gate::Settled;
use crate::metrics::{ConnectionsRefused, Metrics};
use crate::outcome::Rejection;
pub(crate) use connection::Drain;
use connection::{Activity, ClientStream, Closed, DrainWatcher, Follows, Heads, Timeouts, Tracked};
pub(crate) use limits::Overload;
pub use limits::raise_fd_limit;
use limits::{
    ClientConnections, ClientRequests, ClientSlot, ConnectionSlots, IntervalLog, RequestPlace, Slot,
};
use listener::Listener;
use prometheus_client::metrics::counter::Counter;
use streams::StreamExecutor;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again, so the
/// loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// At most one line per this about failed accepts, and one about refused connections, each
/// with the count since the last.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// HTTP/2 `PING`s sent this often on every connection, so a peer that vanished without a
/// close (a dead host, a dropped NAT mapping) is noticed even with a request in flight.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// A `PING` not acknowledged within this closes the connection.
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What [`Server::accept_until`] counts a connection against: the places under
/// `MAX_CONNECTIONS` for connections and for requests in flight, sized once at startup.
#[derive(Debug, Clone)]
pub(crate) struct Capacity {
    /// `MAX_CONNECTIONS` in force.
    pub max_connections: usize,
    /// The soft file-descriptor limit it was sized from, if it could be read.
    pub fd_limit: Option<u64>,
    /// Client connections open (tunnels included).
    pub connections: ConnectionSlots,
    /// Requests in flight across all connections, capped at the same number: file
    /// descriptors are budgeted for one backend connection per client connection, and
    /// HTTP/2 streams could otherwise outnumber them.
    pub requests: ConnectionSlots,
}

impl Capacity {
    /// `MAX_CONNECTIONS` as `settings` ask and the file-descriptor limit allows (a warning is
    /// logged when the two disagree).
    pub(crate) fn of(settings: &ServerSettings) -> Capacity {
        let fd_limit = limits::fd_limit();
        let (max_connections, warning) =
            limits::effective_max_connections(settings.max_connections, fd_limit);
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
        }
        Capacity {
            max_connections,
            fd_limit,
            connections: ConnectionSlots::new(max_connections),
            requests: ConnectionSlots::new(max_connections),
        }
    }

    /// `MAX_CONNECTIONS_PER_CLIENT` in force, `None` when off.
    pub(crate) fn max_per_client(&self, settings: &ServerSettings) -> Option<usize> {
        settings
            .max_connections_per_client
            .effective(self.max_connections)
    }

    /// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` in force (a share of the `MAX_CONNECTIONS` requests
    /// in flight), `None` when off.
    pub(crate) fn max_requests_per_client(&self, settings: &ServerSettings) -> Option<usize> {
        settings.max_requests_per_client.effective(self.max_connections)
    }
}

/// What the listener tells a door about the connection a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    /// The connection's other end as the gateway believes it: the TCP peer, or the source
    /// address of the PROXY header a trusted proxy sent (`PROXY_PROTOCOL=true`). This is the
    /// peer the client address and the forwarding headers start from.
    pub address: SocketAddr,
    /// The connection is TLS (the listener is HTTPS): `X-Forwarded-Proto` and the `Forwarded`
    /// element say `https`.
    pub tls: bool,
}

impl Peer {
    /// A plain-HTTP connection from `address`.
    pub(crate) fn plain(address: SocketAddr) -> Peer {
        Peer { address, tls: false }
    }
}

/// What the server knows of a request's arrival that the request itself does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The connection it came on.
    pub connection: Peer,
    /// It arrived while `MAX_CONNECTIONS` requests were in flight (HTTP/2 streams can
    /// outnumber connections), or `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT` of its client's: it is
    /// answered `503` at once. The server keeps the counts.
    pub overloaded: Option<Overload>,
    /// Its HTTP/1 head had `Content-Length` beside `Transfer-Encoding`, which hyper drops
    /// before the request is seen (see [`crate::proxy::strict::check`]).
    pub content_length_dropped: bool,
}

/// A door's answer to one request: the response, and what its body is to account for while
/// the server sends it (one wrapper, [`connection::Tracked`], follows the whole response).
#[derive(Debug)]
pub(crate) struct Answered<B> {
    /// The response.
    pub response: http::Response<B>,
    /// What the request's settled admission still holds (its concurrency places): given back
    /// once the body's last frame is handed over.
    pub settled: Settled,
    /// Where the body's data bytes are counted (`tollgate_response_body_bytes_total` of the
    /// rule, for a backend's response), if anywhere.
    pub bytes: Option<Counter>,
}

impl<B> Answered<B> {
    /// `response`, holding nothing and counted nowhere: the gateway's own answers.
    pub(crate) fn plain(response: http::Response<B>) -> Answered<B> {
        Answered {
            response,
            settled: Settled::none(),
            bytes: None,
        }
    }
}

/// What a listener hands each request to, with what the server knows of its arrival: the
/// reverse proxy, or the decision endpoints (`DECIDE_PORT`).
pub(crate) trait Door: Send + Sync + 'static {
    /// The body of its answers.
    type Body: hyper::body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Unpin
        + 'static;

    /// Answer `request`.
    fn handle(
        &self,
        request: Request<Incoming>,
        arrival: Arrival,
    ) -> impl Future<Output = Answered<Self::Body>> + Send;
}

/// The accept loop and what it serves connections with.
pub(crate) struct Server<D> {
    serving: Arc<Serving<D>>,
    capacity: Capacity,
    /// `MAX_CONNECTIONS_PER_CLIENT`.
    clients: ClientConnections,
    max_per_client: Option<usize>,
    /// `tollgate_client_connections_refused_total`.
    refused: ConnectionsRefused,
    /// `SHUTDOWN_TIMEOUT_MS`.
    shutdown_timeout: Duration,
}

impl<D: Door> Server<D> {
    /// A server of `settings` handing requests to `door`, with what comes before HTTP on a
    /// connection (`listener`: the PROXY header and TLS) and the `capacity` it counts against.
    /// `trusted_proxies` are not capped per client; clients are grouped by `ipv6_prefix` as
    /// budgets are.
    pub(crate) fn new(
        settings: &ServerSettings,
        door: Arc<D>,
        listener: Arc<Listener>,
        capacity: Capacity,
        (trusted_proxies, ipv6_prefix): (&[IpNet], u8),
        metrics: &Metrics,
    ) -> Server<D> {
        let mut builder = auto::Builder::new(StreamExecutor {
            send_timeout: settings.send_timeout,
            unread: metrics.client_streams_unread(),
        });
        builder
            .http1()
            // hyper's own header read timeout (30 s unless set, once a timer is) also runs while
            // a keep-alive connection waits for its next request, cutting IDLE_TIMEOUT_MS short;
            // the watchdog keeps both clocks (see `connection`). The timer stays, so a timeout
            // set here later is not silently ignored.
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        builder
            .http2()
            .max_concurrent_streams(settings.h2_max_concurrent_streams)
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
        let timeouts = Timeouts {
            header_read: settings.header_read_timeout,
            idle: settings.idle_timeout,
            send: settings.send_timeout,
        };
        let max_per_client = capacity.max_per_client(settings);
        let client_requests = ClientRequests::new(
            capacity.max_requests_per_client(settings),
            ipv6_prefix,
            trusted_proxies,
        );
        Server {
            serving: Arc::new(Serving {
                builder,
                listener,
                door,
                requests: capacity.requests.clone(),
                client_requests,
                timeouts,
                unread: metrics.client_connections_unread(),
            }),
            clients: ClientConnections::new(max_per_client, ipv6_prefix, trusted_proxies),
            max_per_client,
            capacity,
            refused: metrics.client_connections_refused(),
            shutdown_timeout: settings.shutdown_timeout,
        }
    }

    /// Accept and serve connections on `listener` until `shutdown` completes; then stop
    /// accepting and hand back the connections still open, to be drained.
    pub(crate) async fn accept_until(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Drain {
        let max_connections = self.capacity.max_connections;
        let mut accept_failures = IntervalLog::new(ACCEPT_LOG_INTERVAL);
        let mut refusals = IntervalLog::new(ACCEPT_LOG_INTERVAL);
        let mut client_refusals = IntervalLog::new(ACCEPT_LOG_INTERVAL);
        let drain = Drain::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) if limits::is_connection_error(&error) => {
                        tracing::debug!(%error, "accept failed for one connection");
                        continue;
                    }
                    Err(error) => {
                        // Out of file descriptors (or memory): what is queued waits until
                        // connections close. One line per interval, however often it recurs.
                        if let Some(failures) = accept_failures.event() {
                            tracing::warn!(
                                %error,
                                failures,
                                open_connections = self.capacity.connections.open(),
                                max_connections,
                                "accept failed; retrying (out of file descriptors? see MAX_CONNECTIONS)"
                            );
                        }
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Some(slot) = self.capacity.connections.try_acquire() else {
                refuse(stream);
                self.refused.max_connections.inc();
                if let Some(refused) = refusals.event() {
                    tracing::warn!(
                        refused,
                        max_connections,
                        "MAX_CONNECTIONS reached: refusing new connections"
                    );
                }
                continue;
            };
            let client_slot = match self.clients.try_acquire(peer.ip()) {
                Ok(client_slot) => client_slot,
                Err(client) => {
                    refuse(stream);
                    drop(slot);
                    self.refused.per_client.inc();
                    // One line per interval, naming the client of the moment: a flood from many
                    // addresses must not become a flood of lines (the metric counts them all).
                    if let Some(refused) = client_refusals.event() {
                        tracing::warn!(
                            refused,
                            %client,
                            max_connections_per_client = self.max_per_client.unwrap_or_default(),
                            "MAX_CONNECTIONS_PER_CLIENT reached: refusing a client's new connections"
                        );
                    }
                    continue;
                }
            };
            serve_connection(&self.serving, stream, peer, (slot, client_slot), drain.watcher());
        }
        drain
    }

    /// Wait up to `SHUTDOWN_TIMEOUT_MS` for the connections of `drain` to finish.
    pub(crate) async fn drain(&self, drain: Drain) {
        tracing::info!(
            in_flight_connections = drain.open(),
            "shutting down: draining connections"
        );
        match tokio::time::timeout(self.shutdown_timeout, drain.close_all()).await {
            Ok(()) => tracing::info!("all connections drained"),
            Err(_) => tracing::warn!(
                timeout_ms = self.shutdown_timeout.as_millis() as u64,
                "shutdown timeout: closing connections that are still busy"
            ),
        }
    }
}

/// Close a connection refused at accept at once, with a reset: the client learns now,
/// nothing lingers in TIME_WAIT, and the queue keeps moving for when a slot frees.
fn refuse(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// The listener's settings: where it listens, what it expects before HTTP, and the limits and
/// clocks of its connections.
#[derive(Debug, Clone)]
pub(crate) struct ServerSettings {
    /// `BIND` and `PORT`.
    pub listen: SocketAddr,
    /// `TLS_CERT_FILE`, `TLS_KEY_FILE`, `PROXY_PROTOCOL`: what `PORT` expects before HTTP.
    pub listener: listener::ListenerConfig,
    /// `HEADER_READ_TIMEOUT_MS`: a client must send its request headers within this
    /// (slowloris protection); a new connection must send its first request within this of
    /// being accepted (HTTP/2: preface, settings and the first request's headers).
    pub header_read_timeout: Duration,
    /// `IDLE_TIMEOUT_MS`: a client connection with nothing in flight for this long is closed
    /// (HTTP/2 with `GOAWAY`), so idle keep-alive connections cannot pile up.
    pub idle_timeout: Duration,
    /// `SEND_TIMEOUT_MS`: a client connection whose socket takes no byte of a response for
    /// this long is dropped (slow-read protection: a client that stops reading its response).
    pub send_timeout: Duration,
    /// `MAX_CONNECTIONS`: most client connections open at once, tunnels included; past it a
    /// new connection is closed at once. `None`: sized from the file-descriptor limit when
    /// serving starts (see [`crate::server::limits`]).
    pub max_connections: Option<NonZeroUsize>,
    /// `MAX_CONNECTIONS_PER_CLIENT`: most client connections one peer address (IPv6 grouped by
    /// `IPV6_PREFIX`) may hold at once, peers in `TRUSTED_PROXIES` not counted; past it a new
    /// connection is closed at once. Unset: three quarters of `MAX_CONNECTIONS`.
    pub max_connections_per_client: limits::PerClientCap,
    /// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`: most requests in flight one client (the peer as
    /// the listener believes it, IPv6 grouped by `IPV6_PREFIX`) may have across its
    /// connections, peers in `TRUSTED_PROXIES` not counted; past it a request is answered
    /// `503`. Unset: three quarters of `MAX_CONNECTIONS`, the cap of all requests in flight.
    pub max_requests_per_client: limits::PerClientCap,
    /// `H2_MAX_CONCURRENT_STREAMS`: streams one HTTP/2 connection may have open at once
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`); a stream past it is refused (`REFUSED_STREAM`).
    pub h2_max_concurrent_streams: u32,
    /// `SHUTDOWN_TIMEOUT_MS`: how long SIGTERM waits for in-flight requests (default 8 s, below
    /// the 10 s `docker stop` waits before SIGKILL).
    pub shutdown_timeout: Duration,
}

/// What every connection is served with.
struct Serving<D> {
    /// HTTP/1.1 and h2c, detected per connection.
    builder: auto::Builder<StreamExecutor>,
    /// The PROXY header and TLS, before HTTP.
    listener: Arc<Listener>,
    /// Answers each request.
    door: Arc<D>,
    /// Requests in flight across all connections, capped at `MAX_CONNECTIONS` too: file
    /// descriptors are budgeted for one backend connection per client connection, and HTTP/2
    /// streams could otherwise outnumber them. A request past it is answered `503`.
    requests: ConnectionSlots,
    /// `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`: one client's share of `requests`.
    client_requests: ClientRequests,
    timeouts: Timeouts,
    /// `tollgate_client_connections_unread_total`.
    unread: Counter,
}

/// Serve one accepted connection in a task of its own, under its watchdog (see [`connection`]):
/// `slots` are its places under `MAX_CONNECTIONS` and `MAX_CONNECTIONS_PER_CLIENT`, held by its
/// socket; `drain` tells it when to close. The PROXY
/// header and the TLS handshake, when the listener asks for them, come first, within
/// `HEADER_READ_TIMEOUT_MS` of now: the clock the first request must beat too.
fn serve_connection<D: Door>(
    serving: &Arc<Serving<D>>,
    stream: TcpStream,
    peer: SocketAddr,
    slots: (Slot, ClientSlot),
    mut drain: DrainWatcher,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "set_nodelay failed");
    }
    let first_request_by = tokio::time::Instant::now() + serving.timeouts.header_read;
    if serving.listener.is_plain() {
        let connection = (stream.into(), Peer::plain(peer));
        serve_http(serving, connection, slots, drain, first_request_by);
        return;
    }
    let serving = serving.clone();
    tokio::spawn(async move {
        let listener = &serving.listener;
        let established = tokio::select! {
            established = tokio::time::timeout_at(first_request_by, listener.establish(stream, peer)) => established,
            // Shutting down: a connection that has not sent a request yet is simply closed.
            () = drain.closing() => return,
        };
        match established {
            Ok(Ok(connection)) => serve_http(&serving, connection, slots, drain, first_request_by),
            Ok(Err(Some(rejection))) => listener.rejected(rejection),
            Ok(Err(None)) => {}
            Err(_) => {
                listener.rejected(Rejection::Timeout);
                tracing::debug!(%peer, "no PROXY header or TLS handshake within HEADER_READ_TIMEOUT_MS of accept: closed");
            }
        }
    });
}

/// Serve HTTP on a connection whose PROXY header and TLS handshake (if any) are done.
fn serve_http<D: Door>(
    serving: &Serving<D>,
    (transport, peer): (transport::Transport, Peer),
    slots: (Slot, ClientSlot),
    drain: DrainWatcher,
    first_request_by: tokio::time::Instant,
) {
    let Serving {
        builder,
        door,
        requests,
        client_requests,
        timeouts,
        unread,
        ..
    } = serving;
    let timeouts = *timeouts;
    // The client's count, found once per connection: a request then takes its place with
    // one atomic operation.
    let share = client_requests.connection(peer.address.ip());
    let activity = Arc::new(Activity::default());
    let heads = Arc::new(Heads::default());
    let service = {
        let (door, activity, heads, requests) =
            (door.clone(), activity.clone(), heads.clone(), requests.clone());
        service_fn(move |request: Request<Incoming>| {
            // In flight from here until the response body is sent or dropped.
            let in_flight = activity.start(request.version());
            // One place per request in flight, whatever the connection: the file descriptors
            // are budgeted for one backend connection per client connection, and HTTP/2
            // streams could otherwise outnumber them; and one of its client's share, so a few
            // connections of many streams cannot take them all.
            let place = RequestPlace::take(&requests, &share);
            let arrival = Arrival {
                connection: peer,
                overloaded: place.as_ref().err().copied(),
                content_length_dropped: heads.next_is_ambiguous(),
            };
            let door = door.clone();
            async move {
                let Answered {
                    response,
                    settled,
                    bytes,
                } = door.handle(request, arrival).await;
                if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    in_flight.switched();
                }
                let follows = Follows {
                    place: place.ok(),
                    settled,
                    bytes,
                };
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, in_flight, follows)))
            }
        })
    };
    let io = TokioIo::new(ClientStream::new(transport, slots, activity.clone(), heads));
    let connection = builder.serve_connection_with_upgrades(io, service).into_owned();
    let unread = unread.clone();
    let peer = peer.address;
    tokio::spawn(async move {
        let connection = std::pin::pin!(connection);
        let close = |connection: Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(connection);
        match connection::supervise(connection, close, &activity, drain, timeouts, first_request_by).await {
            (_, Err(error)) => {
                tracing::debug!(%peer, error = %error, "connection ended with an error");
            }
            (Closed::Dropped, Ok(())) => {
                tracing::debug!(%peer, "connection dropped: it did not close when asked");
            }
            (Closed::Stalled, Ok(())) => {
                unread.inc();
                tracing::debug!(%peer, "connection dropped: the client took none of what was sent for SEND_TIMEOUT_MS");
            }
            (Closed::Ended, Ok(())) => {}
        }
    });
}
