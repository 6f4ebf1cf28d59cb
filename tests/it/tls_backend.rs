//! An `https` `BACKEND_URL`, through the real binary, against a real TLS backend: a test CA
//! and certificates made by rcgen, a hyper server behind tokio-rustls. Certificates are
//! checked (expired, unknown issuer, wrong name: 502 and a log line saying which), SNI and
//! `Host` come from the URL, upgrades are tunnelled, and pooled TLS connections and sessions
//! are reused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::StatusCode;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::binary::Running;
use crate::support::backend::{Seen, answer};
use crate::support::{get, read_head};

/// A certificate authority made for one test.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM, in a file (for `BACKEND_CA_FILE` or `SSL_CERT_FILE`).
    file: tempfile::NamedTempFile,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), certificate.pem()).unwrap();
        TestCa {
            issuer: Issuer::new(params, key),
            file,
        }
    }

    fn path(&self) -> &str {
        self.file.path().to_str().unwrap()
    }

    /// A server certificate for `names`, valid now (or expired since 2001 when `expired`).
    fn issue(&self, names: &[&str], expired: bool) -> ServerCertificate {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        ServerCertificate {
            chain: vec![certificate.der().clone()],
            key: PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        }
    }
}

struct ServerCertificate {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// A TLS backend serving the recording backend's answers (`support::backend`), counting what
/// a test asserts on.
struct TlsBackend {
    addr: SocketAddr,
    /// TCP connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Handshakes that resumed an earlier session.
    resumed: Arc<AtomicUsize>,
    /// The SNI of each completed handshake (`None`: none sent).
    names: Arc<Mutex<Vec<Option<String>>>>,
    /// The protocol each completed handshake settled on (ALPN).
    protocols: Arc<Mutex<Vec<String>>>,
    /// Of each `ClientHello`: whether it offered `h2`.
    h2_offers: Arc<Mutex<Vec<bool>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsBackend {
    /// Serve `certificate`, offering `h2` and `http/1.1`; `keep_alive: false` closes each
    /// HTTP/1.1 connection after one response.
    async fn start(certificate: ServerCertificate, keep_alive: bool) -> TlsBackend {
        Self::start_with(certificate, keep_alive, &[b"h2", b"http/1.1"]).await
    }

    /// [`start`](Self::start), choosing among the protocols in `alpn` only.
    async fn start_with(certificate: ServerCertificate, keep_alive: bool, alpn: &[&[u8]]) -> TlsBackend {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certificate.chain, certificate.key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let resumed = Arc::new(AtomicUsize::new(0));
        let names = Arc::new(Mutex::new(Vec::new()));
        let protocols = Arc::new(Mutex::new(Vec::new()));
        let h2_offers = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (accepted, resumed, names, protocols, h2_offers, seen) = (
                accepted.clone(),
                resumed.clone(),
                names.clone(),
                protocols.clone(),
                h2_offers.clone(),
                seen.clone(),
            );
            async move {
                let mut connections = JoinSet::new();
                loop {
                    while connections.try_join_next().is_some() {}
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (config, resumed, names, protocols, h2_offers, seen) = (
                        config.clone(),
                        resumed.clone(),
                        names.clone(),
                        protocols.clone(),
                        h2_offers.clone(),
                        seen.clone(),
                    );
                    connections.spawn(async move {
                        let acceptor = rustls::server::Acceptor::default();
                        let Ok(start) = tokio_rustls::LazyConfigAcceptor::new(acceptor, stream).await else {
                            return;
                        };
                        let offers_h2 = start
                            .client_hello()
                            .alpn()
                            .is_some_and(|mut offered| offered.any(|protocol| protocol == b"h2"));
                        h2_offers.lock().unwrap().push(offers_h2);
                        // A refused handshake is the gateway's doing, and what some tests want.
                        let Ok(stream) = start.into_stream(config).await else {
                            return;
                        };
                        let connection = stream.get_ref().1;
                        if connection.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                            resumed.fetch_add(1, Ordering::SeqCst);
                        }
                        names
                            .lock()
                            .unwrap()
                            .push(connection.server_name().map(str::to_owned));
                        let protocol = connection.alpn_protocol().unwrap_or(b"none");
                        protocols
                            .lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(protocol).into_owned());
                        let service = service_fn(move |request| answer(request, seen.clone()));
                        let mut builder = auto::Builder::new(TokioExecutor::new());
                        builder.http1().keep_alive(keep_alive);
                        let _ = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        TlsBackend {
            addr,
            accepted,
            resumed,
            names,
            protocols,
            h2_offers,
            seen,
            task,
        }
    }

    fn protocols(&self) -> Vec<String> {
        self.protocols.lock().unwrap().clone()
    }

    /// `https://HOST:PORT` for this backend.
    fn url(&self, host: &str) -> String {
        format!("https://{host}:{}", self.addr.port())
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the backend saw no request")
    }

    fn names(&self) -> Vec<Option<String>> {
        self.names.lock().unwrap().clone()
    }
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn requests_pass_over_tls_with_sni_and_host_from_the_url() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["localhost"], false), true).await;
    let url = format!("{}/v1", backend.url("localhost"));
    let tollgate = Running::start(&[("BACKEND_URL", &url), ("BACKEND_CA_FILE", ca.path())]);

    let reply = get(tollgate.addr, "/hello?x=1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", tollgate.log());
    let seen = backend.last();
    assert_eq!(seen.uri, "/v1/hello?x=1");
    // The backend's own name, as its certificate and SNI; the client's in X-Forwarded-Host.
    let host = format!("localhost:{}", backend.addr.port());
    assert_eq!(seen.headers["host"], host.as_str());
    assert_eq!(seen.headers["x-forwarded-host"], "gateway.test");
    assert_eq!(backend.names(), [Some("localhost".to_owned())]);
    tollgate.terminate().await;
}

#[tokio::test]
async fn the_platform_store_is_used_without_backend_ca_file() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["127.0.0.1"], false), true).await;
    // rustls-native-certs reads SSL_CERT_FILE before the system's bundle: the test CA as the
    // platform's only one.
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("127.0.0.1")),
        ("SSL_CERT_FILE", ca.path()),
    ]);
    assert_eq!(
        get(tollgate.addr, "/").await.status,
        StatusCode::OK,
        "{}",
        tollgate.log()
    );
    // An IP address is checked against the certificate's IP SANs and sends no SNI.
    assert_eq!(backend.names(), [None]);
    tollgate.terminate().await;

    // The system's own store does not know the test CA.
    let tollgate = Running::start(&[("BACKEND_URL", &backend.url("127.0.0.1"))]);
    assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::BAD_GATEWAY);
    let log = tollgate.log();
    assert!(log.contains("certificate signed by an unknown issuer"), "{log}");
    tollgate.terminate().await;
}

/// A backend whose certificate fails as `certificate` does gets a 502, with a line saying why.
async fn refused(certificate: ServerCertificate, ca: &TestCa, vars: &[(&str, &str)], why: &str) {
    let backend = TlsBackend::start(certificate, true).await;
    let url = backend.url("localhost");
    let mut all = vec![("BACKEND_URL", url.as_str()), ("BACKEND_CA_FILE", ca.path())];
    all.extend_from_slice(vars);
    let tollgate = Running::start(&all);
    let reply = get(tollgate.addr, "/").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    // Never in plain text instead: nothing reached the backend's HTTP layer.
    assert!(backend.seen.lock().unwrap().is_empty());
    let log = tollgate.log();
    assert!(log.contains("backend request failed"), "{log}");
    assert!(log.contains("cause=\"tls\""), "{log}");
    assert!(log.contains(why), "{why}: {log}");
    tollgate.terminate().await;
}

#[tokio::test]
async fn an_unknown_issuer_is_a_502_that_says_so() {
    let trusted = TestCa::new("the CA tollgate trusts");
    let other = TestCa::new("another CA");
    let certificate = other.issue(&["localhost"], false);
    refused(
        certificate,
        &trusted,
        &[],
        "certificate signed by an unknown issuer",
    )
    .await;
}

#[tokio::test]
async fn a_wrong_name_is_a_502_that_says_so() {
    let ca = TestCa::new("tollgate test CA");
    let certificate = ca.issue(&["elsewhere.test"], false);
    refused(certificate, &ca, &[], "wrong name").await;
}

#[tokio::test]
async fn an_expired_certificate_is_a_502_that_says_so() {
    let ca = TestCa::new("tollgate test CA");
    let certificate = ca.issue(&["localhost"], true);
    refused(certificate, &ca, &[], "certificate expired").await;
}

#[tokio::test]
async fn backend_tls_server_name_overrides_sni_and_the_name_checked() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["api.backend.test"], false), true).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("127.0.0.1")),
        ("BACKEND_CA_FILE", ca.path()),
        ("BACKEND_TLS_SERVER_NAME", "api.backend.test"),
    ]);
    assert_eq!(
        get(tollgate.addr, "/").await.status,
        StatusCode::OK,
        "{}",
        tollgate.log()
    );
    assert_eq!(backend.names(), [Some("api.backend.test".to_owned())]);
    // Host stays the URL's.
    let host = format!("127.0.0.1:{}", backend.addr.port());
    assert_eq!(backend.last().headers["host"], host.as_str());
    tollgate.terminate().await;
}

#[tokio::test]
async fn a_websocket_upgrade_is_tunnelled_over_tls() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["localhost"], false), true).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("localhost")),
        ("BACKEND_CA_FILE", ca.path()),
    ]);
    let mut stream = tokio::net::TcpStream::connect(tollgate.addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    stream.write_all(b"ping over tls").await.unwrap();
    let mut echoed = [0u8; 13];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping over tls");
    tollgate.terminate().await;
}

#[tokio::test]
async fn kept_alive_tls_connections_are_reused() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["localhost"], false), true).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("localhost")),
        ("BACKEND_CA_FILE", ca.path()),
        ("MAX_TOKENS", "1000"),
    ]);
    for _ in 0..50 {
        assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    }
    // One after another: one connection, one handshake, for all 50.
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(backend.names().len(), 1);
    tollgate.terminate().await;
}

#[tokio::test]
async fn a_new_connection_resumes_the_tls_session() {
    let ca = TestCa::new("tollgate test CA");
    // The backend closes every connection after its response: each request needs a new one.
    let backend = TlsBackend::start(ca.issue(&["localhost"], false), false).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("localhost")),
        ("BACKEND_CA_FILE", ca.path()),
    ]);
    for _ in 0..5 {
        assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    }
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 5);
    // Only the first handshake is a full one.
    assert_eq!(backend.resumed.load(Ordering::SeqCst), 4);
    tollgate.terminate().await;
}

#[test]
fn an_unusable_backend_ca_file_stops_startup_naming_it() {
    let not_pem = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_pem.path(), "not a certificate\n").unwrap();
    let not_pem = not_pem.path().to_str().unwrap().to_owned();
    for ca_file in ["/nonexistent/ca.pem", not_pem.as_str()] {
        let [port, admin_port] = crate::support::free_ports();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .env_clear()
            .env("BIND", "127.0.0.1")
            .env("PORT", port.to_string())
            .env("ADMIN_PORT", admin_port.to_string())
            .env("BACKEND_URL", "https://127.0.0.1:9")
            .env("BACKEND_CA_FILE", ca_file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("BACKEND_CA_FILE"), "{stderr}");
    }
}

/// An HTTP/2 (prior knowledge) client connection to `addr`.
async fn h2_client(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

/// `POST path` with `body` on an HTTP/2 client connection: the status and the body back.
async fn h2_post(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    path: &str,
    body: &'static str,
) -> (StatusCode, String) {
    use http_body_util::BodyExt;

    let request = http::Request::post(format!("http://gateway.test{path}"))
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn http2_clients_get_http2_to_a_backend_that_chooses_it() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start(ca.issue(&["localhost"], false), true).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("localhost")),
        ("BACKEND_CA_FILE", ca.path()),
        ("MAX_TOKENS", "1000"),
    ]);
    let mut client = h2_client(tollgate.addr).await;
    // Ten at once, the first requests: one connection is opened for all of them.
    let together: Vec<_> = (0..10)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { h2_post(&mut client, "/echo", "together").await })
        })
        .collect();
    for request in together {
        let (status, body) = request.await.unwrap();
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "together"),
            "{}",
            tollgate.log()
        );
    }
    for _ in 0..10 {
        let (status, body) = h2_post(&mut client, "/echo", "over h2").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "over h2"));
    }
    assert_eq!(backend.protocols(), ["h2"]);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 1);
    // :authority is the backend's, as Host is over HTTP/1.1.
    let authority = format!("https://localhost:{}/echo", backend.addr.port());
    assert_eq!(backend.last().uri, authority);

    // An HTTP/1.1 client's requests stay HTTP/1.1, on a connection of their own.
    assert_eq!(get(tollgate.addr, "/").await.status, StatusCode::OK);
    assert_eq!(backend.protocols(), ["h2", "http/1.1"]);
    // And h2 is not offered for them.
    assert_eq!(*backend.h2_offers.lock().unwrap(), [true, false]);
    tollgate.terminate().await;
}

#[tokio::test]
async fn http2_clients_get_http1_from_a_backend_that_declines_h2() {
    let ca = TestCa::new("tollgate test CA");
    let backend = TlsBackend::start_with(ca.issue(&["localhost"], false), true, &[b"http/1.1"]).await;
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url("localhost")),
        ("BACKEND_CA_FILE", ca.path()),
        ("MAX_TOKENS", "1000"),
    ]);
    let mut client = h2_client(tollgate.addr).await;
    // Three at once first: h2 is offered on one connection only, the others wait for its
    // answer (and then take HTTP/1.1 connections of their own, one request each at a time).
    let together: Vec<_> = (0..3)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { h2_post(&mut client, "/slow", "").await })
        })
        .collect();
    for request in together {
        assert_eq!(request.await.unwrap().0, StatusCode::OK, "{}", tollgate.log());
    }
    let opened = backend.accepted.load(Ordering::SeqCst);
    let offers = backend.h2_offers.lock().unwrap().clone();
    assert_eq!(offers.iter().filter(|offered| **offered).count(), 1, "{offers:?}");
    for _ in 0..10 {
        let (status, body) = h2_post(&mut client, "/echo", "over h1").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "over h1"),
            "{}",
            tollgate.log()
        );
    }
    // Pooled HTTP/1.1 connections, reused: none opened for the ten.
    assert_eq!(backend.accepted.load(Ordering::SeqCst), opened);
    assert!(backend.protocols().iter().all(|protocol| protocol == "http/1.1"));
    let host = format!("localhost:{}", backend.addr.port());
    assert_eq!(backend.last().headers["host"], host.as_str());
    assert_eq!(backend.last().uri, "/echo");
    tollgate.terminate().await;
}
