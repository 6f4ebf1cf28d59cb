//! What happens on a connection between accept and HTTP: the PROXY header (when
//! `PROXY_PROTOCOL=true`) and the TLS handshake (when `TLS_CERT_FILE` is set), in that order,
//! and what a door is told of the connection ([`Peer`]).
//!
//! Both run within `HEADER_READ_TIMEOUT_MS` of accept, the clock the connection's first request
//! must also beat (see [`super::connection`]): a client that stalls a handshake is a client
//! that stalls its request head. A connection that fails either is closed and counted in
//! `tollgate_client_connections_rejected_total` by reason; a PROXY failure (a misconfigured
//! load balancer, or someone reaching the port around it) is logged at `warn`, rate-limited,
//! while TLS failures (scanners, clients that do not trust the certificate) are `debug`.

use crate::outcome::Rejection;
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::Peer;
use super::proxy_protocol::{self, HeaderError};
use super::tls::{self, Certificates, TlsError, TlsSettings};
use super::transport::{Prefixed, Transport};
use crate::gate::identity::ClientIdentity;
use crate::metrics::Metrics;
use crate::telemetry::throttle::LogThrottle;

/// `TLS_*` and `PROXY_PROTOCOL`: what the listener expects before HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListenerConfig {
    /// `TLS_CERT_FILE`, `TLS_KEY_FILE`: HTTPS; `None` is plain HTTP.
    pub tls: Option<TlsSettings>,
    /// `PROXY_PROTOCOL`: every connection from `TRUSTED_PROXIES` begins with a PROXY header,
    /// and no other peer may connect.
    pub proxy_protocol: bool,
}

/// The listener's part of every connection before HTTP.
pub(crate) struct Listener {
    /// The TLS side, when the listener is HTTPS.
    tls: Option<TlsAcceptor>,
    /// Whose PROXY headers are believed (`TRUSTED_PROXIES`), when `PROXY_PROTOCOL=true`.
    proxies: Option<ClientIdentity>,
    /// `tollgate_client_connections_rejected_total`, by [`Rejection`] index.
    rejected: [Counter; Rejection::ALL.len()],
    /// The PROXY failures' warnings.
    log: LogThrottle,
}

impl Listener {
    /// Load the TLS pair (and start watching its files), from `config`; `trusted` is
    /// `TRUSTED_PROXIES`. The watcher's task is returned, to be stopped with the server.
    pub(crate) fn new(
        config: &ListenerConfig,
        trusted: &ClientIdentity,
        metrics: &Metrics,
    ) -> Result<(Listener, Option<tokio::task::JoinHandle<()>>), TlsError> {
        let (tls, watcher) = match &config.tls {
            Some(settings) => {
                let certificates = Arc::new(Certificates::new(tls::load(settings)?));
                let server = tls::server_config(certificates.clone())?;
                let watcher = tls::watch(settings.clone(), certificates);
                (Some(TlsAcceptor::from(server)), Some(watcher))
            }
            None => (None, None),
        };
        let listener = Listener {
            tls,
            proxies: config.proxy_protocol.then(|| trusted.clone()),
            rejected: metrics.client_connections_rejected(),
            log: LogThrottle::new(),
        };
        Ok((listener, watcher))
    }

    /// Plain HTTP straight from the socket: nothing to do before it, nor any clock to set.
    pub(crate) fn is_plain(&self) -> bool {
        self.tls.is_none() && self.proxies.is_none()
    }

    /// Whether the listener is HTTPS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Read the PROXY header and do the TLS handshake that the configuration asks of a
    /// connection accepted from `peer`, and say what the proxy is to know of it. The caller
    /// bounds this in time. `Err(None)`: the peer closed the connection before sending a
    /// byte (a load balancer's TCP health check), which is not counted.
    pub(crate) async fn establish(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<(Transport, Peer), Option<Rejection>> {
        let mut address = peer;
        let mut rest = bytes::Bytes::new();
        if let Some(proxies) = &self.proxies {
            if !proxies.is_trusted(peer.ip().to_canonical()) {
                self.warn(
                    peer,
                    "PROXY_PROTOCOL=true and the peer is not in TRUSTED_PROXIES: closed",
                );
                return Err(Some(Rejection::ProxyUntrusted));
            }
            match proxy_protocol::read_header(&mut stream).await {
                Ok((header, after)) => {
                    address = header.source.unwrap_or(peer);
                    rest = after;
                }
                Err(HeaderError::Empty) => return Err(None),
                Err(HeaderError::Closed) => {
                    tracing::debug!(%peer, "connection closed before its PROXY header was complete");
                    return Err(Some(Rejection::ProxyMalformed));
                }
                Err(error) => {
                    self.warn(peer, &format!("{error}: closed"));
                    return Err(Some(Rejection::ProxyMalformed));
                }
            }
        }
        let transport = match &self.tls {
            None => Transport::Plain(Prefixed::new(rest, stream)),
            Some(acceptor) => {
                // Closed before a byte of a ClientHello (a TCP health check): not a failed
                // handshake. One peek, beside the handshake's several reads.
                if rest.is_empty() && matches!(stream.peek(&mut [0u8; 1]).await, Ok(0) | Err(_)) {
                    return Err(None);
                }
                match acceptor.accept(Prefixed::new(rest, stream)).await {
                    Ok(tls) => Transport::Tls(Box::new(tls)),
                    Err(error) => {
                        tracing::debug!(%peer, client = %address, %error, "TLS handshake failed");
                        return Err(Some(Rejection::TlsHandshake));
                    }
                }
            }
        };
        Ok((
            transport,
            Peer {
                address,
                tls: self.tls.is_some(),
            },
        ))
    }

    /// Count a connection closed before HTTP.
    pub(crate) fn rejected(&self, reason: Rejection) {
        self.rejected[reason as usize].inc();
    }

    fn warn(&self, peer: SocketAddr, message: &str) {
        if let Some(suppressed) = self.log.admit() {
            if suppressed > 0 {
                tracing::warn!(suppressed, "{suppressed} similar lines suppressed");
            }
            tracing::warn!(%peer, "{message}");
        }
    }
}
