//! `redis-server` processes owned by a test: started on free ports, killed on drop, and
//! available to kill, freeze (SIGSTOP), thaw and restart mid-test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::free_port;

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra: Vec<String>,
    /// Serving TLS only, with the certificate in `dir/cert.pem`.
    tls: bool,
}

impl RedisServer {
    /// A fresh, empty server on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(free_port(), &[])
    }

    /// A server on `port` with extra `redis-server` arguments.
    pub fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls: false,
        };
        server.restart();
        server
    }

    /// A server that speaks only TLS, with a fresh self-signed certificate for `localhost`
    /// and 127.0.0.1 (see [`cert_file`](Self::cert_file)).
    pub fn start_tls() -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let certified =
            rcgen::generate_simple_self_signed(["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        std::fs::write(dir.path().join("cert.pem"), certified.cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), certified.signing_key.serialize_pem()).unwrap();
        let cert = dir.path().join("cert.pem").display().to_string();
        let key = dir.path().join("key.pem").display().to_string();
        let port = free_port();
        let mut server = RedisServer {
            port,
            child: None,
            extra: vec![
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                cert.clone(),
                "--tls-key-file".into(),
                key,
                "--tls-ca-cert-file".into(),
                cert,
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            dir,
            tls: true,
        };
        server.restart();
        server
    }

    /// The certificate a TLS server presents (self-signed: trust it as a root).
    pub fn cert_file(&self) -> std::path::PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// `host:port`, for `REDIS_ADDR`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kill the server (SIGKILL): its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again on the same port, empty (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        let plain_port = if self.tls {
            "0".to_owned()
        } else {
            self.port.to_string()
        };
        let child = Command::new("redis-server")
            .args([
                "--port",
                &plain_port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        wait_for(
            || self.cli(&["PING"]).trim() == "PONG",
            "redis-server to answer PING",
        );
    }

    /// Freeze the process (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resume after [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("not running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Run `redis-cli` against this server and return its output.
    pub fn cli(&self, args: &[&str]) -> String {
        if self.tls {
            let cert = self.cert_file().display().to_string();
            let mut all = vec!["--tls", "--cacert", &cert];
            all.extend_from_slice(args);
            cli(self.port, &all)
        } else {
            cli(self.port, args)
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a frozen (SIGSTOPped) server too.
        self.kill();
    }
}

/// `redis-cli -p port args...`, output as text.
pub fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli must be installed (scripts/test.sh installs it)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Poll `ready` for up to 10 s.
pub fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Redis Cluster of three masters, no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                // The cluster bus listens on port + 10000, which must be free too.
                let port = loop {
                    let port = free_port();
                    if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
                        break port;
                    }
                };
                RedisServer::start_with(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for node in &nodes {
            wait_for(
                || node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"),
                "the cluster to be ok",
            );
        }
        RedisCluster { nodes }
    }

    /// `REDIS_CLUSTER_NODES`.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::addr)
            .collect::<Vec<_>>()
            .join(",")
    }
}
