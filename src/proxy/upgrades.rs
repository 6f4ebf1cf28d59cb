//! Upgraded connections (WebSocket): which protocols may be upgraded to
//! ([`UpgradeProtocols`], `UPGRADE_PROTOCOLS`), and the tunnel that copies bytes both ways
//! after `101 Switching Protocols` ([`tunnel`]), closed after `UPGRADE_IDLE_TIMEOUT_MS`
//! without a byte. Whatever the client sends inside a tunnel is not rate-limited; the upgrade
//! request itself is decided like any other, and the gate caps the tunnels one client holds
//! (`MAX_UPGRADES_PER_CLIENT`, see [`crate::gate::tunnels`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::headers;

/// Copy bytes both ways between an upgraded client and backend until either closes, or
/// until no byte has moved either way for `idle` (`UPGRADE_IDLE_TIMEOUT_MS`; `None`: never),
/// when both are dropped (closed). Returns the bytes sent each way (client to backend, backend
/// to client), or why it ended otherwise.
pub(crate) async fn tunnel<C, B>(client: C, backend: B, idle: Option<Duration>) -> io::Result<(u64, u64)>
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
pub(crate) struct UpgradeProtocols {
    /// Protocol names, lower case, without a version: `websocket` admits `websocket/13` too.
    names: Vec<String>,
}

/// Why an `UPGRADE_PROTOCOLS` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UpgradeProtocolsError {
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
    pub(crate) fn parse(value: &str) -> Result<UpgradeProtocols, UpgradeProtocolsError> {
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
    pub(crate) fn allows(&self, token: &str) -> bool {
        let name = token.split_once('/').map_or(token, |(name, _)| name).trim();
        self.names
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(name))
    }

    /// Keep only the allowed protocols in a request's `Upgrade` lines, removing the header
    /// when none is left (`HTTP2-Settings`, hop-by-hop, goes with the other hop-by-hop
    /// headers). Returns how many tokens were removed.
    pub(crate) fn filter(&self, headers: &mut HeaderMap) -> usize {
        if !headers.contains_key(header::UPGRADE) {
            return 0;
        }
        let mut kept = String::new();
        let mut removed = 0;
        for token in headers::list_tokens(headers, &header::UPGRADE) {
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
    pub(crate) fn accepts(&self, response: &HeaderMap) -> bool {
        // A line that is not visible ASCII switches to something unknown.
        let readable = response
            .get_all(header::UPGRADE)
            .iter()
            .all(|line| line.to_str().is_ok());
        let mut tokens = headers::list_tokens(response, &header::UPGRADE).peekable();
        readable && tokens.peek().is_some() && tokens.all(|token| self.allows(token))
    }

    /// The list as written in `UPGRADE_PROTOCOLS` (`none` when empty).
    pub(crate) fn describe(&self) -> String {
        match self.names.is_empty() {
            true => "none".to_owned(),
            false => self.names.join(","),
        }
    }
}

/// What the proxy tunnels: an HTTP/1.1 request with `Connection: upgrade` and `Upgrade`.
pub(crate) fn is_upgrade<B>(request: &Request<B>) -> bool {
    request.version() == Version::HTTP_11 && headers::is_upgrade(request.headers())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
