//! The listener before HTTP, through the real binary: HTTPS (a test CA made with rcgen, rustls,
//! curl and openssl as clients), certificate rotation while requests flow, and the PROXY
//! protocol from raw headers and from a real HAProxy (`send-proxy-v2`), alone and under TLS.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

use crate::binary::{Running, until_metrics_say};
use crate::support::redis::wait_for;
use crate::support::{Backend, free_port, get_from};

/// A certificate authority of the test's own, and the files the gateway reads.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    dir: tempfile::TempDir,
}

impl TestCa {
    fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let ca_pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: Issuer::new(params, key),
            ca_pem,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn cert_file(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    fn key_file(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    fn ca_file(&self) -> PathBuf {
        let path = self.dir.path().join("ca.pem");
        std::fs::write(&path, &self.ca_pem).unwrap();
        path
    }

    /// A new leaf for `localhost` and 127.0.0.1, written (leaf then CA: a chain) and returned
    /// as DER, as a rotation does it: into temporary files renamed over the served ones.
    fn issue(&self) -> CertificateDer<'static> {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        let key = KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &self.issuer).unwrap();
        replace(&self.cert_file(), &format!("{}{}", leaf.pem(), self.ca_pem));
        replace(&self.key_file(), &key.serialize_pem());
        leaf.der().clone()
    }

    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TLS_CERT_FILE", self.cert_file().display().to_string()),
            ("TLS_KEY_FILE", self.key_file().display().to_string()),
            ("TLS_RELOAD_INTERVAL_MS", "100".to_owned()),
        ]
    }

    /// A client trusting this CA only, offering `alpn`, with `versions`, and no session
    /// resumption (a resumed session does not show the certificate again).
    fn client(&self, alpn: &[&[u8]], versions: &[&'static rustls::SupportedProtocolVersion]) -> TlsConnector {
        self.client_resuming(alpn, versions, false)
    }

    /// [`Self::client`], resuming sessions when `resume`.
    fn client_resuming(
        &self,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
        resume: bool,
    ) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        if !resume {
            config.resumption = rustls::client::Resumption::disabled();
        }
        TlsConnector::from(Arc::new(config))
    }
}

use rustls::pki_types::pem::PemObject;

const BOTH: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Write `text` to `path` the way cert-manager and certbot do: whole, then renamed over it.
fn replace(path: &Path, text: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, path).unwrap();
}

fn start(backend: &Backend, vars: &[(&'static str, String)]) -> Running {
    // Budgets no test here runs out of.
    let mut all = vec![
        ("BACKEND_URL", backend.url()),
        ("MAX_TOKENS", "1000000".to_owned()),
        ("REFILL_RATE", "1000000".to_owned()),
    ];
    all.extend(vars.iter().cloned());
    let all: Vec<(&str, &str)> = all.iter().map(|(name, value)| (*name, value.as_str())).collect();
    Running::start(&all)
}

/// What one HTTPS request saw.
struct Answer {
    status: StatusCode,
    version: http::Version,
    /// The certificate the server presented.
    certificate: CertificateDer<'static>,
}

/// A TLS connection to `addr` (after `preface`, a PROXY header, if any) from `from`.
async fn connect(
    connector: &TlsConnector,
    addr: SocketAddr,
    from: IpAddr,
    preface: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let mut stream = socket.connect(addr).await?;
    stream.write_all(preface).await?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await
}

/// One `GET path` on a new TLS connection from 127.0.0.1, HTTP/2 when ALPN says so.
async fn https_get(connector: &TlsConnector, addr: SocketAddr, preface: &[u8], path: &str) -> Answer {
    https_get_from(connector, addr, [127, 0, 0, 1].into(), preface, path).await
}

/// [`https_get`] from `from`.
async fn https_get_from(
    connector: &TlsConnector,
    addr: SocketAddr,
    from: IpAddr,
    preface: &[u8],
    path: &str,
) -> Answer {
    let stream = connect(connector, addr, from, preface).await.unwrap();
    let (_, session) = stream.get_ref();
    let certificate = session.peer_certificates().unwrap()[0].clone();
    let h2 = session.alpn_protocol() == Some(b"h2");
    let request = Request::get(path).header("host", "gateway.test");
    let response = if h2 {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = Request::get(format!("https://gateway.test{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        sender.send_request(request).await.unwrap()
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        sender
            .send_request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap()
    };
    let (status, version) = (response.status(), response.version());
    response.into_body().collect().await.unwrap();
    Answer {
        status,
        version,
        certificate,
    }
}

#[tokio::test]
async fn https_with_alpn_h2_and_http1_tls_1_2_and_1_3_and_the_scheme_forwarded() {
    let backend = Backend::start().await;
    let ca = TestCa::new();
    let leaf = ca.issue();
    let tollgate = start(&backend, &ca.vars());

    let http1 = https_get(&ca.client(&[b"http/1.1"], BOTH), tollgate.addr, b"", "/one").await;
    assert_eq!(
        (http1.status, http1.version),
        (StatusCode::OK, http::Version::HTTP_11)
    );
    assert_eq!(http1.certificate, leaf, "the leaf of the chain file");
    let seen = backend.last();
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(
        seen.headers["forwarded"],
        "for=127.0.0.1;proto=https;host=gateway.test"
    );

    let h2 = https_get(
        &ca.client(&[b"h2", b"http/1.1"], BOTH),
        tollgate.addr,
        b"",
        "/two",
    )
    .await;
    assert_eq!((h2.status, h2.version), (StatusCode::OK, http::Version::HTTP_2));
    assert_eq!(backend.last().headers["x-forwarded-proto"], "https");

    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let answer = https_get(&ca.client(&[], &[version]), tollgate.addr, b"", "/three").await;
        assert_eq!(answer.status, StatusCode::OK, "{version:?}");
        // The second connection resumes the first's session (a ticket, or the session cache).
        let resuming = ca.client_resuming(&[], &[version], true);
        for kind in [rustls::HandshakeKind::Full, rustls::HandshakeKind::Resumed] {
            let mut stream = connect(&resuming, tollgate.addr, [127, 0, 0, 1].into(), b"")
                .await
                .unwrap();
            assert_eq!(stream.get_ref().1.handshake_kind(), Some(kind), "{version:?}");
            // TLS 1.3 sends its tickets after the handshake: read until the server closes.
            let request = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
            stream.write_all(request).await.unwrap();
            let _ = stream.read_to_end(&mut Vec::new()).await;
        }
    }

    // From the shell: curl over HTTP/2 and HTTP/1.1, and openssl asking for TLS 1.1.
    let url = format!("https://localhost:{}/curl", tollgate.addr.port());
    let ca_file = ca.ca_file();
    for (flag, expected) in [("--http2", "2 200"), ("--http1.1", "1.1 200")] {
        // Awaited, not waited for: the backend runs on this test's runtime.
        let output = tokio::process::Command::new("curl")
            .args(["-sS", flag, "--cacert"])
            .arg(&ca_file)
            .args([
                "--resolve",
                &format!("localhost:{}:127.0.0.1", tollgate.addr.port()),
            ])
            .args(["-o", "/dev/null", "-w", "%{http_version} %{http_code}", &url])
            .output()
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            expected,
            "{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            tollgate.log()
        );
    }
    let output = Command::new("openssl")
        .args(["s_client", "-connect", &tollgate.addr.to_string(), "-tls1_1"])
        .args(["-cipher", "DEFAULT:@SECLEVEL=0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "TLS 1.1 refused: {said}");
    // The server's refusal (rustls answers a TLS 1.1 ClientHello with handshake_failure), not
    // the client's own: openssl offered TLS 1.1 and got an alert back.
    assert!(said.contains("SSL alert number 40"), "the server's alert: {said}");
    assert!(said.contains("Cipher is (NONE)"), "{said}");
    until_metrics_say(
        &tollgate,
        r#"tollgate_client_connections_rejected_total{reason="tls_handshake"} 1"#,
    )
    .await;
}

#[test]
fn a_pair_that_does_not_load_at_startup_exits_2_naming_the_variable_and_file() {
    let ca = TestCa::new();
    ca.issue();
    let missing = ca.dir.path().join("missing.pem");
    let mismatched = ca.dir.path().join("other.key");
    std::fs::write(&mismatched, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let not_pem = ca.dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let cert = ca.cert_file();
    for (cert, key, named) in [
        (&missing, &ca.key_file(), "TLS_CERT_FILE"),
        (&cert, &mismatched, "does not go with"),
        (&not_pem, &ca.key_file(), "TLS_CERT_FILE"),
        (&cert, &not_pem, "TLS_KEY_FILE"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .env_clear()
            .env("BACKEND_URL", "http://127.0.0.1:9")
            .env("BIND", "127.0.0.1")
            .env("PORT", free_port().to_string())
            .env("ADMIN_PORT", free_port().to_string())
            .env("TLS_CERT_FILE", cert)
            .env("TLS_KEY_FILE", key)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(named), "{stderr} should say {named}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_and_a_bad_pair_keeps_the_old_one() {
    let backend = Backend::start().await;
    let ca = TestCa::new();
    let first = ca.issue();
    let tollgate = start(&backend, &ca.vars());
    let addr = tollgate.addr;
    let connector = ca.client(&[b"http/1.1"], BOTH);

    // A connection opened before the rotation, kept alive through it.
    let stream = connect(&connector, addr, [127, 0, 0, 1].into(), b"")
        .await
        .unwrap();
    let (mut kept, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let kept_get = |sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>| {
        let request = Request::get("/kept")
            .header("host", "gateway.test")
            .body(Empty::new())
            .unwrap();
        sender.send_request(request)
    };
    assert_eq!(kept_get(&mut kept).await.unwrap().status(), StatusCode::OK);

    // Requests on new connections the whole time: every one answered.
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let flow = {
        let (stop, answered, failed, connector) =
            (stop.clone(), answered.clone(), failed.clone(), connector.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match https_get(&connector, addr, b"", "/flow").await.status {
                    StatusCode::OK => answered.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };

    let second = ca.issue();
    assert_ne!(first, second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while https_get(&connector, addr, b"", "/new").await.certificate != second {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        kept_get(&mut kept).await.unwrap().status(),
        StatusCode::OK,
        "the old connection lives on"
    );

    // A bad pair: a key that is not the certificate's.
    replace(&ca.key_file(), &KeyPair::generate().unwrap().serialize_pem());
    wait_for(
        || tollgate.log().contains("the new pair cannot be used"),
        "the bad pair to be logged",
    );
    assert!(
        tollgate.log().contains("does not go with TLS_CERT_FILE"),
        "{}",
        tollgate.log()
    );
    assert_eq!(
        https_get(&connector, addr, b"", "/after").await.certificate,
        second,
        "the good pair stays"
    );

    stop.store(true, Ordering::Relaxed);
    flow.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(answered.load(Ordering::Relaxed) > 0);
    assert_eq!(kept_get(&mut kept).await.unwrap().status(), StatusCode::OK);
}

/// A v2 header: `command` 0 LOCAL or 1 PROXY, TCP over IPv4 or IPv6 from `source`.
fn v2_header(command: u8, source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    header.push(0x20 | command);
    let mut addresses = Vec::new();
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            header.push(0x11);
            addresses.extend_from_slice(&s.octets());
            addresses.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            header.push(0x21);
            addresses.extend_from_slice(&s.octets());
            addresses.extend_from_slice(&d.octets());
        }
        _ => unreachable!("one family"),
    }
    addresses.extend_from_slice(&source.port().to_be_bytes());
    addresses.extend_from_slice(&destination.port().to_be_bytes());
    header.extend_from_slice(&(addresses.len() as u16).to_be_bytes());
    header.extend_from_slice(&addresses);
    header
}

/// Send `bytes` from `from` and read all that comes back until the gateway closes.
async fn exchange(addr: SocketAddr, from: IpAddr, bytes: &[u8]) -> String {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

const REQUEST: &[u8] = b"GET /proxied HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn raw_proxy_headers_name_the_client_and_bad_ones_are_closed_and_counted() {
    let backend = Backend::start().await;
    let vars = [
        ("PROXY_PROTOCOL", "true".to_owned()),
        ("TRUSTED_PROXIES", "127.0.0.1,10.0.0.0/8".to_owned()),
    ];
    let tollgate = start(&backend, &vars);
    let addr = tollgate.addr;
    let local: IpAddr = [127, 0, 0, 1].into();
    let client_of = |backend: &Backend| backend.last().headers["x-real-ip"].to_str().unwrap().to_owned();

    // v1, split across two writes: the header is waited for whole.
    let v1 = b"PROXY TCP4 198.51.100.7 127.0.0.1 5555 80\r\n";
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&v1[..20]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    stream.write_all(&v1[20..]).await.unwrap();
    stream.write_all(REQUEST).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(client_of(&backend), "198.51.100.7");
    assert!(
        backend.last().headers["x-forwarded-for"]
            .to_str()
            .unwrap()
            .ends_with("198.51.100.7")
    );

    // v2 over IPv6, with the request in the same write.
    let source: SocketAddr = "[2001:db8::7]:5555".parse().unwrap();
    let mut bytes = v2_header(1, source, "[2001:db8::1]:80".parse().unwrap());
    bytes.extend_from_slice(REQUEST);
    assert!(exchange(addr, local, &bytes).await.starts_with("HTTP/1.1 200"));
    assert_eq!(client_of(&backend), "2001:db8::7");

    // A trusted source (a proxy behind the load balancer): X-Forwarded-For is walked from it.
    let mut bytes = b"PROXY TCP4 10.1.1.1 127.0.0.1 5555 80\r\n".to_vec();
    bytes.extend_from_slice(b"GET /walked HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6, 203.0.113.5\r\nConnection: close\r\n\r\n");
    assert!(exchange(addr, local, &bytes).await.starts_with("HTTP/1.1 200"));
    assert_eq!(client_of(&backend), "203.0.113.5");

    // LOCAL (a health check of the load balancer's own): the TCP peer is the client.
    let mut bytes = v2_header(0, "192.0.2.9:1".parse().unwrap(), "192.0.2.1:80".parse().unwrap());
    bytes.extend_from_slice(REQUEST);
    assert!(exchange(addr, local, &bytes).await.starts_with("HTTP/1.1 200"));
    assert_eq!(client_of(&backend), "127.0.0.1");

    // No header, a broken one: closed without an answer.
    let requests = backend.seen().len();
    assert_eq!(exchange(addr, local, REQUEST).await, "");
    assert_eq!(
        exchange(addr, local, b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n").await,
        ""
    );
    let mut wrong_version = v2_header(1, "1.2.3.4:1".parse().unwrap(), "5.6.7.8:2".parse().unwrap());
    wrong_version[12] = 0x11;
    assert_eq!(exchange(addr, local, &wrong_version).await, "");
    until_metrics_say(
        &tollgate,
        r#"tollgate_client_connections_rejected_total{reason="proxy_malformed"} 3"#,
    )
    .await;

    // A peer that is not a trusted proxy: closed, whatever it sends.
    let mut bytes = v1.to_vec();
    bytes.extend_from_slice(REQUEST);
    assert_eq!(exchange(addr, [127, 0, 0, 2].into(), &bytes).await, "");
    until_metrics_say(
        &tollgate,
        r#"tollgate_client_connections_rejected_total{reason="proxy_untrusted"} 1"#,
    )
    .await;
    assert_eq!(
        backend.seen().len(),
        requests,
        "nothing rejected reached the backend"
    );
    let log = tollgate.log();
    assert!(log.contains("malformed PROXY header"), "{log}");
    assert!(log.contains("not in TRUSTED_PROXIES"), "{log}");
}

#[tokio::test]
async fn a_raw_proxy_header_then_tls() {
    let backend = Backend::start().await;
    let ca = TestCa::new();
    ca.issue();
    let mut vars = ca.vars();
    vars.push(("PROXY_PROTOCOL", "true".to_owned()));
    vars.push(("TRUSTED_PROXIES", "127.0.0.1".to_owned()));
    let tollgate = start(&backend, &vars);
    let header = v2_header(
        1,
        "198.51.100.7:5555".parse().unwrap(),
        "192.0.2.1:443".parse().unwrap(),
    );
    let answer = https_get(&ca.client(&[b"h2"], BOTH), tollgate.addr, &header, "/both").await;
    assert_eq!(
        (answer.status, answer.version),
        (StatusCode::OK, http::Version::HTTP_2)
    );
    let seen = backend.last();
    assert_eq!(seen.headers["x-real-ip"], "198.51.100.7");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    // TLS without the header first: the ClientHello is no PROXY header.
    let refused = connect(&ca.client(&[], BOTH), tollgate.addr, [127, 0, 0, 1].into(), b"").await;
    assert!(refused.is_err());
}

/// HAProxy in TCP mode on a free port, sending `send-proxy-v2` to `to`; stopped on drop.
struct Haproxy {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(to: SocketAddr) -> Haproxy {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = format!(
            "global\n  maxconn 100\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend front\n  bind 127.0.0.1:{port}\n  default_backend tollgate\n\
             backend tollgate\n  server gate {to} send-proxy-v2\n"
        );
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, config).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .expect("haproxy (scripts/test.sh installs it)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for(|| std::net::TcpStream::connect(addr).is_ok(), "haproxy to listen");
        Haproxy {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn haproxy_send_proxy_v2_in_front_names_the_client_in_the_clear_and_under_tls() {
    let backend = Backend::start().await;
    let ca = TestCa::new();
    ca.issue();
    let proxy_vars = [
        ("PROXY_PROTOCOL", "true".to_owned()),
        ("TRUSTED_PROXIES", "127.0.0.1".to_owned()),
    ];
    let plain = start(&backend, &proxy_vars);
    let haproxy = Haproxy::start(plain.addr);
    // The client connects to HAProxy from 127.0.0.2; tollgate sees HAProxy (127.0.0.1).
    let reply = get_from(haproxy.addr, [127, 0, 0, 2].into(), "/via-haproxy", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(backend.last().headers["x-real-ip"], "127.0.0.2");
    assert_eq!(backend.last().headers["x-forwarded-proto"], "http");

    let mut vars = ca.vars();
    vars.extend(proxy_vars.iter().cloned());
    let tls = start(&backend, &vars);
    let haproxy = Haproxy::start(tls.addr);
    let connector = ca.client(&[b"h2", b"http/1.1"], BOTH);
    let answer = https_get_from(
        &connector,
        haproxy.addr,
        [127, 0, 0, 3].into(),
        b"",
        "/tls-via-haproxy",
    )
    .await;
    assert_eq!(
        (answer.status, answer.version),
        (StatusCode::OK, http::Version::HTTP_2)
    );
    assert_eq!(backend.last().headers["x-real-ip"], "127.0.0.3");
    assert_eq!(backend.last().headers["x-forwarded-proto"], "https");
}
