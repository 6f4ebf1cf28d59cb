//! The TLS listener: `TLS_CERT_FILE` and `TLS_KEY_FILE` (PEM; the certificate file may hold
//! the chain after the leaf) make `PORT` HTTPS, TLS 1.2 and 1.3 only, ALPN `h2` and
//! `http/1.1`.
//!
//! The pair is reloaded when either file changes, so a certificate rotated by cert-manager or
//! certbot is served without a restart: every handshake asks [`Certificates`] for the pair
//! loaded last, connections already open keep the session they made, and a new pair that does
//! not load (unreadable, not PEM, a key that is not the certificate's) leaves the old one in
//! place and says why.
//!
//! Change is noticed by a poll of both files' metadata every `TLS_RELOAD_INTERVAL_MS` (two
//! `stat` calls), not by inotify (the `notify` crate): cert-manager rotates a Kubernetes secret
//! volume by swapping a `..data` symlink in the directory, and certbot re-points the symlinks
//! in `live/` at new files in `archive/`; a watch on the configured path sees neither, and a
//! watch on the directory sees every other file. `stat` follows the links and sees the file
//! they lead to now.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// ALPN: HTTP/2 preferred, as nginx and Envoy offer it.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// `TLS_CERT_FILE`, `TLS_KEY_FILE` and how often they are looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// `TLS_CERT_FILE`: the certificate, then any intermediates (a `fullchain.pem`).
    pub cert_file: PathBuf,
    /// `TLS_KEY_FILE`: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `TLS_RELOAD_INTERVAL_MS`: how often both files are checked for a change.
    pub reload_interval: Duration,
}

/// Why a certificate and key could not be used, naming the variable and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{var}={}: cannot read it: {error}", path.display())]
    Read {
        /// `TLS_CERT_FILE` or `TLS_KEY_FILE`.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// The reason.
        error: io::Error,
    },
    /// Not PEM, or no item of the kind expected.
    #[error("{var}={}: {problem}", path.display())]
    Pem {
        /// `TLS_CERT_FILE` or `TLS_KEY_FILE`.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The key does not load, or is not the certificate's.
    #[error("TLS_KEY_FILE={} does not go with TLS_CERT_FILE={}: {error}", key.display(), cert.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason (a key mismatch, an unsupported key type).
        error: rustls::Error,
    },
    /// rustls refused the configuration (not expected with the ring provider).
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

/// The provider every TLS object here is built with: ring, as the rest of the crate uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read and check the pair named by `settings`.
pub(crate) fn load(settings: &TlsSettings) -> Result<CertifiedKey, TlsError> {
    let read = |var, path: &Path| {
        fs::read(path).map_err(|error| TlsError::Read {
            var,
            path: path.to_owned(),
            error,
        })
    };
    let cert_pem = read("TLS_CERT_FILE", &settings.cert_file)?;
    let key_pem = read("TLS_KEY_FILE", &settings.key_file)?;
    let pem_error = |var, path: &Path, problem: String| TlsError::Pem {
        var,
        path: path.to_owned(),
        problem,
    };
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error("TLS_CERT_FILE", &settings.cert_file, format!("not PEM: {error}")))?;
    if chain.is_empty() {
        return Err(pem_error(
            "TLS_CERT_FILE",
            &settings.cert_file,
            "no CERTIFICATE in it (expected PEM: the certificate, then its chain)".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| {
        pem_error(
            "TLS_KEY_FILE",
            &settings.key_file,
            format!(
                "no private key in it (expected PEM: PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY): {error}"
            ),
        )
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|error| TlsError::Pair {
        cert: settings.cert_file.clone(),
        key: settings.key_file.clone(),
        error,
    })
}

/// The pair every new handshake is served: swapped whole by the reloader, read (an `Arc`
/// clone under a read lock) once per handshake.
#[derive(Debug)]
pub(crate) struct Certificates {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificates {
    /// Serve `pair` until replaced.
    pub(crate) fn new(pair: CertifiedKey) -> Certificates {
        Certificates {
            current: RwLock::new(Arc::new(pair)),
        }
    }

    /// New handshakes get `pair` from now on; connections already open keep theirs.
    pub(crate) fn replace(&self, pair: CertifiedKey) {
        *self.current.write() = Arc::new(pair);
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// The server side of TLS: versions 1.2 and 1.3, ALPN `h2` then `http/1.1`, no client
/// certificates, the pair from `certificates`, and stateless session tickets (resumption
/// without a cache shared across connections) beside rustls' session cache.
pub(crate) fn server_config(certificates: Arc<Certificates>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
    config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(TlsError::Config)?;
    Ok(Arc::new(config))
}

/// What a file looked like when it was last looked at: a change in any of these is a new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    // Follows symlinks: the file the configured path leads to now.
    let metadata = fs::metadata(path).ok()?;
    Some(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode: metadata.ino(),
    })
}

/// Both files' stamps (`None` for one that cannot be looked at just now: mid-rotation).
fn stamps(settings: &TlsSettings) -> (Option<Stamp>, Option<Stamp>) {
    (stamp(&settings.cert_file), stamp(&settings.key_file))
}

/// Watch the pair's files for as long as the returned task runs, and put a new pair in
/// `certificates` when they change and it loads. A pair that does not load is logged once
/// (until the files change again) and the one served stays: a rotation that writes the
/// certificate before the key is logged as a mismatch, then loads when the key arrives.
pub(crate) fn watch(settings: TlsSettings, certificates: Arc<Certificates>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Taken before the first tick: a change between the load at startup and now is seen.
        let mut seen = stamps(&settings);
        let mut tick = tokio::time::interval(settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = {
                let settings = settings.clone();
                // Blocking file calls, off the runtime's worker threads (a stalled network
                // volume must not stall connections).
                match tokio::task::spawn_blocking(move || {
                    let now = stamps(&settings);
                    (now, (now != seen).then(|| load(&settings)))
                })
                .await
                {
                    Ok(now) => now,
                    Err(_) => continue,
                }
            };
            let (stamped, loaded) = now;
            seen = stamped;
            match loaded {
                None => {}
                Some(Ok(pair)) => {
                    certificates.replace(pair);
                    tracing::info!(
                        cert_file = %settings.cert_file.display(),
                        key_file = %settings.key_file.display(),
                        "TLS certificate reloaded: new connections get it"
                    );
                }
                Some(Err(error)) => tracing::warn!(
                    %error,
                    "TLS_CERT_FILE or TLS_KEY_FILE changed but the new pair cannot be used: \
                     still serving the pair loaded before"
                ),
            }
        }
    })
}
