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

use http::header::{self, HeaderMap, HeaderValue};
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

/// The protocols a client may upgrade to through the gateway (`UPGRADE_PROTOCOLS`, default
/// `websocket`).
///
/// After a `101` the gateway copies bytes and sees no more requests, so an upgrade is an
/// unmetered tunnel bought with one counted request. WebSocket is meant to be one (a
/// long-lived stream of messages, capped by `MAX_UPGRADES_PER_CLIENT`); `h2c` is not: inside
/// it a client sends as many HTTP requests as it likes, none of them decided. So `Upgrade`
/// tokens not listed here are removed before the request is forwarded (RFC 9110 section 7.8
/// lets a server ignore an upgrade: the client carries on in HTTP/1.1, under the limits), and
/// `h2c` can never be listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeProtocols {
    /// Protocol names, lower case, without a version: `websocket` admits `websocket/13` too.
    names: Vec<String>,
}

/// Why an `UPGRADE_PROTOCOLS` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeProtocolsError {
    /// Not a token (RFC 9110 section 5.6.2), or a name with a version.
    #[error("{0:?} is not a protocol name (a token such as websocket)")]
    NotAName(String),
    /// A protocol that carries requests the gateway would not see.
    #[error(
        "{0:?} cannot be allowed: inside an {0} tunnel every request would bypass the limits          (clients reach HTTP/2 over the listener itself, where each stream is decided)"
    )]
    Unmetered(String),
}

impl UpgradeProtocols {
    /// Parse a comma-separated list of protocol names (empty: no upgrade is forwarded).
    pub fn parse(value: &str) -> Result<UpgradeProtocols, UpgradeProtocolsError> {
        let mut names: Vec<String> = Vec::new();
        for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            if !name.bytes().all(headers::is_tchar) {
                return Err(UpgradeProtocolsError::NotAName(name.to_owned()));
            }
            let name = name.to_ascii_lowercase();
            if matches!(name.as_str(), "h2c" | "h2") {
                return Err(UpgradeProtocolsError::Unmetered(name));
            }
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(UpgradeProtocols { names })
    }

    /// Whether `token` (`name` or `name/version`, any case) may be upgraded to.
    pub fn allows(&self, token: &str) -> bool {
        let name = token.split_once('/').map_or(token, |(name, _)| name).trim();
        self.names
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(name))
    }

    /// Keep only the allowed protocols in a request's `Upgrade` lines, removing the header
    /// when none is left (`HTTP2-Settings`, hop-by-hop, goes with the other hop-by-hop
    /// headers). Returns how many tokens were removed.
    pub fn filter(&self, headers: &mut HeaderMap) -> usize {
        if !headers.contains_key(header::UPGRADE) {
            return 0;
        }
        let mut kept = String::new();
        let mut removed = 0;
        for token in headers
            .get_all(header::UPGRADE)
            .iter()
            .flat_map(|line| line.to_str().map_or(Vec::new(), |line| line.split(',').collect()))
            .map(str::trim)
            .filter(|token| !token.is_empty())
        {
            if self.allows(token) {
                if !kept.is_empty() {
                    kept.push_str(", ");
                }
                kept.push_str(token);
            } else {
                removed += 1;
            }
        }
        // A line that is not visible ASCII names nothing we allow: it goes too.
        match HeaderValue::try_from(kept) {
            Ok(value) if !value.is_empty() => {
                if removed > 0 || headers.get_all(header::UPGRADE).iter().count() > 1 {
                    headers.insert(header::UPGRADE, value);
                }
            }
            _ => {
                removed = removed.max(1);
                headers.remove(header::UPGRADE);
            }
        }
        removed
    }

    /// Whether a `101` response switches to allowed protocols only (and names at least one).
    pub fn accepts(&self, response: &HeaderMap) -> bool {
        let mut tokens = response
            .get_all(header::UPGRADE)
            .iter()
            .flat_map(|line| line.to_str().map_or(vec![""], |line| line.split(',').collect()))
            .map(str::trim)
            .peekable();
        tokens.peek().is_some() && tokens.all(|token| self.allows(token))
    }

    /// The list as written in `UPGRADE_PROTOCOLS` (`none` when empty).
    pub fn describe(&self) -> String {
        match self.names.is_empty() {
            true => "none".to_owned(),
            false => self.names.join(","),
        }
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

    fn upgrade_headers(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(header::UPGRADE, HeaderValue::from_str(line).unwrap());
        }
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        );
        headers
    }

    #[test]
    fn only_listed_protocols_are_upgraded_to() {
        let websocket = UpgradeProtocols::parse("websocket").unwrap();
        // h2c alone: the upgrade is gone, the request goes on as HTTP/1.1.
        let mut headers = upgrade_headers(&["h2c"]);
        assert_eq!(websocket.filter(&mut headers), 1);
        assert!(!headers.contains_key(header::UPGRADE));
        // A mixed offer keeps the allowed protocol, with its version.
        let mut headers = upgrade_headers(&["h2c, WebSocket/13", "foo"]);
        assert_eq!(websocket.filter(&mut headers), 2);
        assert_eq!(
            headers.get_all(header::UPGRADE).iter().collect::<Vec<_>>(),
            ["WebSocket/13"]
        );
        // Allowed as sent: untouched.
        let mut headers = upgrade_headers(&["websocket"]);
        assert_eq!(websocket.filter(&mut headers), 0);
        assert_eq!(headers[header::UPGRADE], "websocket");
        // None allowed: every upgrade goes.
        let none = UpgradeProtocols::parse("").unwrap();
        let mut headers = upgrade_headers(&["websocket"]);
        assert_eq!(none.filter(&mut headers), 1);
        assert!(!headers.contains_key(header::UPGRADE));
        assert_eq!(none.describe(), "none");
    }

    #[test]
    fn unmetered_protocols_cannot_be_listed() {
        assert_eq!(
            UpgradeProtocols::parse("websocket,H2C"),
            Err(UpgradeProtocolsError::Unmetered("h2c".into()))
        );
        assert!(UpgradeProtocols::parse("h2").is_err());
        assert!(UpgradeProtocols::parse("web socket").is_err());
        assert!(UpgradeProtocols::parse("websocket/13").is_err());
        let parsed = UpgradeProtocols::parse(" websocket , x-custom ,websocket").unwrap();
        assert_eq!(parsed.describe(), "websocket,x-custom");
    }

    #[test]
    fn zero_refuses_every_upgrade_and_leaves_no_entry() {
        let tunnels = tunnels(Some(0));
        assert!(tunnels.admit(&mut upgrade(), ip("192.0.2.1")).is_err());
        assert_eq!(tunnels.clients(), 0);
    }
}
