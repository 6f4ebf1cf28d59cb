//! Upgraded connections (WebSocket and any other `Upgrade` protocol) open per client, capped
//! at `MAX_UPGRADES_PER_CLIENT`.
//!
//! After `101 Switching Protocols` the gateway copies bytes both ways ([`tunnel`]) and sees
//! no more requests: whatever the client sends inside a tunnel is not rate-limited. A tunnel
//! in which nothing has moved for `UPGRADE_IDLE_TIMEOUT_MS` is closed. The upgrade request
//! itself is a request like any other (classified, counted, refused when over budget); this
//! cap bounds how many tunnels one client can hold at once.
//!
//! A client is its address as the rules see it (after `TRUSTED_PROXIES`, IPv6 grouped by
//! `IPV6_PREFIX`), whatever `KEY_BY` says: a header value is the client's to choose. The slot
//! is taken when the upgrade request arrives (before any budget is spent, so a refused
//! upgrade costs none) and held by the tunnel until it closes; a request that is not
//! switched (refused, or the backend did not agree) gives it back when it ends. Entries are
//! removed at zero, so the table holds only clients with a tunnel open.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::{ResponseBody, headers, response};
use crate::limit::ClientIp;

/// Open tunnels per client.
#[derive(Debug)]
pub struct Tunnels {
    /// `MAX_UPGRADES_PER_CLIENT`; `None` is unlimited (and nothing is counted).
    limit: Option<u32>,
    /// `IPV6_PREFIX`: clients are keyed as the rules key them.
    ipv6_prefix: u8,
    /// Tunnels (and upgrade requests in progress) per client; no zero entries.
    open: Arc<Mutex<HashMap<ClientIp, u32>>>,
}

/// One client's place under `MAX_UPGRADES_PER_CLIENT`, given back when the last clone is
/// dropped. The proxy puts it in the upgrade request's extensions (which need `Clone`); the
/// tunnel takes it from there.
#[derive(Debug, Clone)]
pub struct TunnelSlot {
    /// Dropped with the last clone.
    _held: Arc<Held>,
}

/// What a [`TunnelSlot`] holds.
#[derive(Debug)]
struct Held {
    open: Arc<Mutex<HashMap<ClientIp, u32>>>,
    client: ClientIp,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl Tunnels {
    /// At most `limit` tunnels per client (`None`: unlimited), IPv6 clients grouped by
    /// `ipv6_prefix` as the rules group them.
    pub fn new(limit: Option<u32>, ipv6_prefix: u8) -> Tunnels {
        Tunnels {
            limit,
            ipv6_prefix,
            open: Arc::default(),
        }
    }

    /// For an upgrade request from `client`: take a slot and attach it to the request, or
    /// answer `429` when the client holds `MAX_UPGRADES_PER_CLIENT` already. Any other request
    /// passes untouched.
    #[allow(clippy::result_large_err)]
    pub fn admit<B>(&self, request: &mut Request<B>, client: IpAddr) -> Result<(), Response<ResponseBody>> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        if !is_upgrade(request) {
            return Ok(());
        }
        match self.acquire(ClientIp::new(client, self.ipv6_prefix), limit) {
            Some(slot) => {
                request.extensions_mut().insert(slot);
                Ok(())
            }
            None => {
                tracing::debug!(%client, limit, "upgrade refused: MAX_UPGRADES_PER_CLIENT reached");
                Err(response::too_many_upgrades(limit))
            }
        }
    }

    fn acquire(&self, client: ClientIp, limit: u32) -> Option<TunnelSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                open.remove(&client);
            }
            return None;
        }
        *count += 1;
        Some(TunnelSlot {
            _held: Arc::new(Held {
                open: self.open.clone(),
                client,
            }),
        })
    }

    /// Clients holding at least one tunnel.
    pub fn clients(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Copy bytes both ways between an upgraded client and backend until either closes, or
/// until no byte has moved either way for `idle` (`UPGRADE_IDLE_TIMEOUT_MS`; `None`: never),
/// when both are dropped (closed). Returns the bytes sent each way (client to backend, backend
/// to client), or why it ended otherwise.
pub async fn tunnel<C, B>(client: C, backend: B, idle: Option<Duration>) -> io::Result<(u64, u64)>
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let Some(idle) = idle else {
        let (mut client, mut backend) = (client, backend);
        return tokio::io::copy_bidirectional(&mut client, &mut backend).await;
    };
    let started = Instant::now();
    let last_read = Arc::new(AtomicU64::new(0));
    let mut client = Stamped::new(client, started, last_read.clone());
    let mut backend = Stamped::new(backend, started, last_read.clone());
    let copy = tokio::io::copy_bidirectional(&mut client, &mut backend);
    let mut copy = std::pin::pin!(copy);
    loop {
        let quiet_since = started + Duration::from_millis(last_read.load(Ordering::Relaxed));
        tokio::select! {
            copied = &mut copy => return copied,
            () = tokio::time::sleep_until(quiet_since + idle) => {
                // Bytes read meanwhile moved the stamp: wait again from there.
                if Duration::from_millis(last_read.load(Ordering::Relaxed)) + idle <= started.elapsed() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no byte either way for {} ms", idle.as_millis()),
                    ));
                }
            }
        }
    }
}

/// One side of a tunnel, stamping the time of its last read (in milliseconds since the
/// tunnel began) so the tunnel knows how long it has been quiet. A write follows a read in a
/// tunnel, so reads are enough.
struct Stamped<T> {
    io: T,
    started: Instant,
    last_read: Arc<AtomicU64>,
}

impl<T> Stamped<T> {
    fn new(io: T, started: Instant, last_read: Arc<AtomicU64>) -> Self {
        Stamped {
            io,
            started,
            last_read,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stamped<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let now = u64::try_from(this.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            this.last_read.store(now, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stamped<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What the proxy tunnels: an HTTP/1.1 request with `Connection: upgrade` and `Upgrade`.
pub fn is_upgrade<B>(request: &Request<B>) -> bool {
    request.version() == Version::HTTP_11 && headers::is_upgrade(request.headers())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn tunnels(limit: Option<u32>) -> Tunnels {
        let config = Config::from_vars([("BACKEND_URL", "http://127.0.0.1:9")]).unwrap();
        Tunnels::new(limit, config.rules.ipv6_prefix())
    }

    fn upgrade() -> Request<()> {
        Request::get("/ws")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .body(())
            .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_gets_at_most_the_limit_and_a_closed_tunnel_frees_its_slot() {
        let tunnels = tunnels(Some(2));
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut request = upgrade();
            tunnels.admit(&mut request, ip("192.0.2.1")).unwrap();
            held.push(request.extensions_mut().remove::<TunnelSlot>().unwrap());
        }
        let refused = tunnels.admit(&mut upgrade(), ip("192.0.2.1")).unwrap_err();
        assert_eq!(refused.status(), http::StatusCode::TOO_MANY_REQUESTS);
        // Another client is counted apart.
        let mut other = upgrade();
        tunnels.admit(&mut other, ip("192.0.2.2")).unwrap();
        assert_eq!(tunnels.clients(), 2);
        held.pop();
        let mut again = upgrade();
        tunnels.admit(&mut again, ip("192.0.2.1")).unwrap();
        // Every slot given back: nothing is left in the table.
        drop((held, other, again));
        assert_eq!(tunnels.clients(), 0);
    }

    #[test]
    fn ipv6_clients_are_grouped_as_the_rules_group_them() {
        let tunnels = tunnels(Some(1));
        let mut first = upgrade();
        tunnels.admit(&mut first, ip("2001:db8:1:2::1")).unwrap();
        // The same /64 (IPV6_PREFIX=64 by default) is the same client.
        assert!(tunnels.admit(&mut upgrade(), ip("2001:db8:1:2::2")).is_err());
        assert!(tunnels.admit(&mut upgrade(), ip("2001:db8:1:3::1")).is_ok());
    }

    #[test]
    fn other_requests_and_an_unlimited_gateway_count_nothing() {
        let limited = tunnels(Some(1));
        let mut plain = Request::get("/").body(()).unwrap();
        limited.admit(&mut plain, ip("192.0.2.1")).unwrap();
        assert!(plain.extensions().get::<TunnelSlot>().is_none());
        let unlimited = tunnels(None);
        let mut request = upgrade();
        unlimited.admit(&mut request, ip("192.0.2.1")).unwrap();
        assert!(request.extensions().get::<TunnelSlot>().is_none());
        assert_eq!(unlimited.clients(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_stays_open_while_bytes_move_and_closes_when_quiet() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let idle = Duration::from_secs(10);
        let (mut client, client_side) = tokio::io::duplex(64);
        let (backend_side, mut backend) = tokio::io::duplex(64);
        let started = Instant::now();
        let tunnel = tokio::spawn(tunnel(client_side, backend_side, Some(idle)));
        // A byte each way every 6 s: never 10 s quiet.
        let mut byte = [0u8; 1];
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            client.write_all(b"c").await.unwrap();
            backend.read_exact(&mut byte).await.unwrap();
            backend.write_all(b"b").await.unwrap();
            client.read_exact(&mut byte).await.unwrap();
        }
        assert!(!tunnel.is_finished(), "open after 30 s of traffic");
        let error = tunnel.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed().as_secs(), 40, "closed 10 s after the last byte");
        // Both ends see the tunnel closed.
        assert_eq!(client.read(&mut byte).await.unwrap(), 0);
        assert_eq!(backend.read(&mut byte).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_idle_timeout_a_quiet_tunnel_stays_open() {
        let (_client, client_side) = tokio::io::duplex(64);
        let (backend_side, _backend) = tokio::io::duplex(64);
        let tunnel = tokio::spawn(tunnel(client_side, backend_side, None));
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        assert!(!tunnel.is_finished());
        tunnel.abort();
    }

    #[test]
    fn zero_refuses_every_upgrade_and_leaves_no_entry() {
        let tunnels = tunnels(Some(0));
        assert!(tunnels.admit(&mut upgrade(), ip("192.0.2.1")).is_err());
        assert_eq!(tunnels.clients(), 0);
    }
}
