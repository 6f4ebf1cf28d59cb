//! TLS to the backend, for an `https` `BACKEND_URL`: rustls (ring), through tokio-rustls.
//!
//! The backend's certificate is checked against `BACKEND_CA_FILE` when it is set, and the
//! platform's CA store otherwise (rustls-native-certs: `SSL_CERT_FILE`, `SSL_CERT_DIR`, then
//! the system's bundle), for the name `BACKEND_TLS_SERVER_NAME` gives or else the URL's host;
//! that name is also the one sent in SNI. A handshake that fails is an error naming why
//! (expired, unknown issuer, wrong name), which the proxy answers with a 502: there is no
//! fallback to plain text.
//!
//! One [`rustls::ClientConfig`] per ALPN offer (`http/1.1` for HTTP/1 clients' requests,
//! `h2` and `http/1.1` for HTTP/2 clients'), sharing one session cache, lives as long as
//! the proxy: a connection opened after another one resumes its TLS session (a ticket or
//! session id, no full handshake), and the pool keeps the connections themselves alive.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The TLS settings of an `https` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BackendTls {
    /// `BACKEND_CA_FILE`: PEM CA certificates to trust instead of the platform's.
    pub ca_file: Option<PathBuf>,
    /// The name sent in SNI and checked against the certificate: `BACKEND_TLS_SERVER_NAME`,
    /// or the host of `BACKEND_URL`.
    pub server_name: ServerName<'static>,
}

impl fmt::Display for BackendTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server name {}, CAs from ", self.server_name.to_str())?;
        match &self.ca_file {
            Some(path) => write!(f, "{}", path.display()),
            None => write!(f, "the platform's store"),
        }
    }
}

/// Why the TLS client could not be set up at startup.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// `BACKEND_CA_FILE` could not be read or holds no certificate.
    #[error("BACKEND_CA_FILE={path:?}: {problem}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// No `BACKEND_CA_FILE`, and the platform's store holds no usable CA certificate.
    #[error(
        "BACKEND_URL is https and BACKEND_CA_FILE is unset, but the platform's CA store holds no \
         usable certificate ({0}); install the CA certificates (Debian: ca-certificates), point \
         SSL_CERT_FILE at a bundle, or set BACKEND_CA_FILE"
    )]
    NoPlatformRoots(String),
    /// The crypto provider refused the protocol versions (never with ring's defaults).
    #[error("the TLS client for BACKEND_URL cannot be built: {0}")]
    Provider(#[source] rustls::Error),
}

/// Why a TLS handshake with the backend failed, as the log line says it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// The certificate's validity ended.
    #[error("TLS handshake with {name} failed: certificate expired: {source}")]
    Expired {
        /// The name checked.
        name: String,
        /// rustls' own account (with the times).
        source: io::Error,
    },
    /// Not signed by a CA tollgate trusts.
    #[error("TLS handshake with {name} failed: certificate signed by an unknown issuer: {source}")]
    UnknownIssuer {
        /// The name checked.
        name: String,
        /// rustls' own account.
        source: io::Error,
    },
    /// Valid, but not for the name asked for.
    #[error("TLS handshake with {name} failed: wrong name: {source}")]
    WrongName {
        /// The name checked.
        name: String,
        /// rustls' own account (with the names the certificate is valid for).
        source: io::Error,
    },
    /// Any other failure: another certificate problem, no common protocol or cipher, a
    /// backend that does not speak TLS, a connection closed mid-handshake.
    #[error("TLS handshake with {name} failed: {source}")]
    Handshake {
        /// The name checked.
        name: String,
        /// rustls' or the socket's account.
        source: io::Error,
    },
}

impl TlsError {
    /// Sort a handshake's error by its certificate problem, if it has one.
    fn of(name: &ServerName<'_>, source: io::Error) -> TlsError {
        let name = name.to_str().into_owned();
        let certificate = source
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .and_then(|error| match error {
                rustls::Error::InvalidCertificate(certificate) => Some(certificate),
                _ => None,
            });
        match certificate {
            Some(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
                TlsError::Expired { name, source }
            }
            Some(CertificateError::UnknownIssuer) => TlsError::UnknownIssuer { name, source },
            Some(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }) => {
                TlsError::WrongName { name, source }
            }
            _ => TlsError::Handshake { name, source },
        }
    }
}

/// What opens TLS connections to the backend: the checked settings, built once at startup.
#[derive(Clone)]
pub(crate) struct TlsConnector {
    /// Offers `http/1.1` only: for requests that came in over HTTP/1.
    http1: tokio_rustls::TlsConnector,
    /// Offers `h2` then `http/1.1`: for requests that came in over HTTP/2.
    h2: tokio_rustls::TlsConnector,
    /// SNI, and the name the certificate must be valid for.
    server_name: ServerName<'static>,
}

/// The ALPN name of HTTP/2 (RFC 9113 section 3.2).
pub(crate) const ALPN_H2: &[u8] = b"h2";
/// The ALPN name of HTTP/1.1 (RFC 7301 section 6).
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";

impl TlsConnector {
    /// Load the trusted CAs (`BACKEND_CA_FILE` or the platform's) and build the clients.
    pub(crate) fn new(settings: &BackendTls) -> Result<TlsConnector, TlsSetupError> {
        let roots = match &settings.ca_file {
            Some(path) => roots_from_file(path)?,
            None => platform_roots()?,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut base = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Provider)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // One session cache for both offers: a connection for either resumes a session the
        // other made. (rustls' default is a cache of its own per config.)
        base.resumption = Resumption::in_memory_sessions(256);
        let mut http1 = base.clone();
        http1.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        let mut h2 = base;
        h2.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Ok(TlsConnector {
            http1: tokio_rustls::TlsConnector::from(Arc::new(http1)),
            h2: tokio_rustls::TlsConnector::from(Arc::new(h2)),
            server_name: settings.server_name.clone(),
        })
    }

    /// Run the handshake over `stream`, offering HTTP/2 when `offer_h2`.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
        offer_h2: bool,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let connector = if offer_h2 { &self.h2 } else { &self.http1 };
        connector
            .connect(self.server_name.clone(), stream)
            .await
            .map_err(|error| TlsError::of(&self.server_name, error))
    }

    /// The name checked, for messages.
    pub(crate) fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }
}

/// Whether the handshake on `stream` settled on HTTP/2.
pub(crate) fn negotiated_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(ALPN_H2)
}

/// The CA certificates in the PEM file at `path`; at least one.
fn roots_from_file(path: &Path) -> Result<RootCertStore, TlsSetupError> {
    let problem = |problem: String| TlsSetupError::CaFile {
        path: path.to_owned(),
        problem,
    };
    let pem = std::fs::read(path).map_err(|error| problem(format!("cannot read it: {error}")))?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| problem(format!("not PEM certificates: {error}")))?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(problem(match ignored {
            0 => "holds no certificate (expected PEM `BEGIN CERTIFICATE` blocks)".to_owned(),
            n => format!("none of its {n} certificates can be used as a CA"),
        }));
    }
    Ok(roots)
}

/// The platform's CA certificates; a store that yields none is an error (every handshake
/// would fail), a few unreadable ones among many are not.
fn platform_roots() -> Result<RootCertStore, TlsSetupError> {
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
    if added == 0 {
        let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
        let why = match errors.is_empty() {
            true => "none found".to_owned(),
            false => errors.join("; "),
        };
        return Err(TlsSetupError::NoPlatformRoots(why));
    }
    Ok(roots)
}

/// The server name of `host` (a DNS name or an IP address, brackets allowed), if it is one.
pub(crate) fn server_name(host: &str) -> Option<ServerName<'static>> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(bare.to_owned()).ok()
}
