//! `redis-server` processes owned by a test: started on free ports, killed on drop, and
//! available to kill, freeze (SIGSTOP), thaw and restart mid-test; alone or as a cluster,
//! in plain TCP or TLS only.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::free_port;

/// A self-signed certificate for `localhost` and 127.0.0.1, and its key, in a temp dir.
pub struct Certificate {
    dir: TempDir,
}

impl Certificate {
    pub fn generate() -> Arc<Certificate> {
        let dir = tempfile::tempdir().unwrap();
        let names = ["localhost".to_owned(), "127.0.0.1".to_owned()];
        let certified = rcgen::generate_simple_self_signed(names).unwrap();
        std::fs::write(dir.path().join("cert.pem"), certified.cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), certified.signing_key.serialize_pem()).unwrap();
        Arc::new(Certificate { dir })
    }

    /// The certificate (self-signed: trust it as a root).
    pub fn cert_file(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn key_file(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }
}

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra: Vec<String>,
    /// When set, the server speaks only TLS, with this certificate.
    tls: Option<Arc<Certificate>>,
}

impl RedisServer {
    /// A fresh, empty server on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(free_port(), &[])
    }

    /// A server on `port` with extra `redis-server` arguments.
    pub fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        Self::launch(port, extra, None)
    }

    /// A server on a free port that speaks only TLS, with a fresh certificate.
    pub fn start_tls() -> RedisServer {
        Self::launch(free_port(), &[], Some(Certificate::generate()))
    }

    fn launch(port: u16, extra: &[&str], tls: Option<Arc<Certificate>>) -> RedisServer {
        let mut server = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls,
        };
        server.restart();
        server
    }

    /// `host:port`, for `REDIS_ADDR`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Now on this server's clock, in ms.
    pub fn now_ms(&self) -> u64 {
        let time = self.cli(&["TIME"]);
        let mut time = time.lines().map(|line| line.trim().parse::<u64>().unwrap());
        time.next().unwrap() * 1_000 + time.next().unwrap() / 1_000
    }

    /// The URL of a user `name` this server's ACL allows everything but `commands` (`-`
    /// rules: `-pexpire`, `-function`), for a Redis that refuses them.
    pub fn url_of_user_without(&self, name: &str, commands: &str) -> String {
        self.cli(&[
            "ACL", "SETUSER", name, "on", ">secret", "~*", "&*", "+@all", commands,
        ]);
        format!("redis://{name}:secret@{}", self.addr())
    }

    /// The certificate of a TLS server.
    pub fn cert_file(&self) -> PathBuf {
        self.tls.as_ref().expect("not a TLS server").cert_file()
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
        let mut command = Command::new("redis-server");
        command.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        command.arg("--dir").arg(self.dir.path());
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some(certificate) => command
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &self.port.to_string(),
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(certificate.cert_file())
                .arg("--tls-key-file")
                .arg(certificate.key_file())
                .arg("--tls-ca-cert-file")
                .arg(certificate.cert_file()),
        };
        let child = command
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
    /// `calls` of one command in its `INFO commandstats` (0 for a command never run).
    pub fn calls(&self, command: &str) -> u64 {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().unwrap())
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, self.tls.as_deref(), args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a frozen (SIGSTOPped) server too.
        self.kill();
    }
}

/// `redis-cli -p port args...` (over TLS with `tls`), output as text.
fn cli(port: u16, tls: Option<&Certificate>, args: &[&str]) -> String {
    let output = redis_cli(tls)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli must be installed (scripts/test.sh installs it)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn redis_cli(tls: Option<&Certificate>) -> Command {
    let mut command = Command::new("redis-cli");
    if let Some(certificate) = tls {
        command.arg("--tls").arg("--cacert").arg(certificate.cert_file());
    }
    command
}

/// Poll `ready` for up to 10 s.
pub fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Redis Cluster of three masters, with or without a replica each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    tls: Option<Arc<Certificate>>,
}

impl RedisCluster {
    /// Plain TCP.
    pub fn start() -> RedisCluster {
        Self::form(None, 0)
    }

    /// Plain TCP, each master with one replica (six nodes): a killed master fails over.
    pub fn start_with_replicas() -> RedisCluster {
        Self::form(None, 1)
    }

    /// TLS only, clients and cluster bus alike, all nodes with one certificate.
    pub fn start_tls() -> RedisCluster {
        Self::form(Some(Certificate::generate()), 0)
    }

    /// TLS only, replication too, each master with one replica (six nodes).
    pub fn start_tls_with_replicas() -> RedisCluster {
        Self::form(Some(Certificate::generate()), 1)
    }

    fn form(tls: Option<Arc<Certificate>>, replicas: usize) -> RedisCluster {
        let mut extra = vec!["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"];
        extra.extend(["--cluster-node-timeout", "2000"]);
        if tls.is_some() {
            // A node has no plain port: its bus and its replicas' links are TLS too.
            extra.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        }
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                // The cluster bus listens on port + 10000, which must be free too.
                let port = loop {
                    let port = free_port();
                    if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
                        break port;
                    }
                };
                RedisServer::launch(port, &extra, tls.clone())
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
        let output = redis_cli(tls.as_deref())
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes, tls };
        cluster.wait_until_ok();
        if replicas > 0 {
            cluster.wait_until_replicas_sync();
        }
        cluster
    }

    /// Wait until every replica's link to its master is up: a replica that never synced
    /// refuses to fail over ("disconnected from master for longer than allowed"). The first
    /// sync of a new cluster takes several seconds (the first `PSYNC` times out).
    fn wait_until_replicas_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &self.nodes {
            loop {
                let replication = node.cli(&["INFO", "replication"]);
                if !replication.contains("role:slave") || replication.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "replica {} never synced", node.addr());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Wait until every running node says `cluster_state:ok`.
    pub fn wait_until_ok(&self) {
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            wait_for(
                || node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"),
                "the cluster to be ok",
            );
        }
    }

    /// Let the masters that are up keep serving their own slots while another master is
    /// down (`cluster-require-full-coverage no`). With the default, `yes`, the whole cluster
    /// refuses every key with `CLUSTERDOWN` once a master has been unreachable for
    /// `cluster-node-timeout`.
    pub fn allow_partial_coverage(&self) {
        for node in &self.nodes {
            let reply = node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
            assert_eq!(reply.trim(), "OK");
        }
    }

    /// The index in [`nodes`](Self::nodes) of the master that owns `key`'s hash slot
    /// (asked of the first running node).
    pub fn owner_of(&self, key: &str) -> usize {
        let asked = self
            .nodes
            .iter()
            .find(|node| node.child.is_some())
            .expect("no node is running");
        self.owner_seen_by(asked, key)
            .unwrap_or_else(|| panic!("no master owns the slot of {key}"))
    }

    /// The owner of `key`'s hash slot once every running node agrees on it; `None` while
    /// their views differ (a failover is not known everywhere yet: a client that asks the
    /// cluster for its slot map then may still be told the old owner).
    pub fn agreed_owner_of(&self, key: &str) -> Option<usize> {
        let mut views = self
            .nodes
            .iter()
            .filter(|node| node.child.is_some())
            .map(|node| self.owner_seen_by(node, key));
        let first = views.next().expect("no node is running")?;
        views.all(|view| view == Some(first)).then_some(first)
    }

    /// The owner of `key`'s hash slot in `asked`'s `CLUSTER NODES`.
    fn owner_seen_by(&self, asked: &RedisServer, key: &str) -> Option<usize> {
        let slot: u16 = asked.cli(&["CLUSTER", "KEYSLOT", key]).trim().parse().unwrap();
        // `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slots>...`
        for line in asked.cli(&["CLUSTER", "NODES"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(port) = fields
                .get(1)
                .and_then(|address| address.split('@').next())
                .and_then(|address| address.rsplit_once(':'))
                .and_then(|(_, port)| port.parse::<u16>().ok())
            else {
                continue;
            };
            let owns = fields.iter().skip(8).any(|range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                match (first.parse::<u16>(), last.parse::<u16>()) {
                    (Ok(first), Ok(last)) => (first..=last).contains(&slot),
                    _ => false,
                }
            });
            if owns {
                let owner = self.nodes.iter().position(|node| node.port == port);
                return Some(owner.expect("the owner is one of ours"));
            }
        }
        None
    }

    /// A store on this Cluster, its keys under `prefix`, with a timeout of 5 s.
    pub fn store(&self, prefix: &str) -> tollgate::stores::RedisStore {
        tollgate::stores::RedisStore::new(
            &tollgate::stores::RedisTarget::Cluster {
                nodes: self.nodes.iter().map(RedisServer::addr).collect(),
                password: None,
                tls: false,
            },
            prefix,
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// `REDIS_CLUSTER_NODES`.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How many masters hold at least one key.
    pub fn masters_holding_keys(&self) -> usize {
        self.nodes
            .iter()
            .filter(|node| node.cli(&["DBSIZE"]).trim() != "0")
            .count()
    }

    /// The certificate of a TLS cluster.
    pub fn cert_file(&self) -> PathBuf {
        self.tls.as_ref().expect("not a TLS cluster").cert_file()
    }
}

/// A Redis Sentinel group: one master, one replica, and three Sentinels (quorum 2) that call a
/// master down after 500 ms and fail over to the replica. The Sentinels are `redis-server
/// --sentinel` (Debian's `redis-sentinel` is the same binary), each with its own config file,
/// which Sentinel rewrites as it learns.
pub struct SentinelGroup {
    /// The servers: `servers[0]` starts as master, `servers[1]` as its replica.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<Child>,
    sentinel_ports: Vec<u16>,
    dir: TempDir,
}

/// The name the Sentinels monitor the master by.
pub const SENTINEL_MASTER: &str = "tollgate-master";

impl SentinelGroup {
    pub fn start() -> SentinelGroup {
        let master = RedisServer::start();
        let replicaof = ["--replicaof", "127.0.0.1", &master.port.to_string()].map(str::to_owned);
        let replica = RedisServer::start_with(free_port(), &replicaof.each_ref().map(String::as_str));
        wait_for(
            || {
                replica
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            },
            "the replica to sync",
        );
        let dir = tempfile::tempdir().unwrap();
        let mut group = SentinelGroup {
            servers: vec![master, replica],
            sentinels: Vec::new(),
            sentinel_ports: Vec::new(),
            dir,
        };
        for _ in 0..3 {
            let port = free_port();
            let config = group.dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 2000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                    dir = group.dir.path().display(),
                    master = group.servers[0].port,
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (scripts/test.sh installs it)");
            group.sentinels.push(child);
            group.sentinel_ports.push(port);
        }
        // Every Sentinel knows the master, its replica and the other two Sentinels.
        for &port in &group.sentinel_ports {
            wait_for(
                || {
                    let master = cli(port, None, &["SENTINEL", "MASTER", SENTINEL_MASTER]);
                    let fields: Vec<&str> = master.lines().collect();
                    let field = |name: &str| {
                        fields
                            .iter()
                            .position(|line| *line == name)
                            .and_then(|at| fields.get(at + 1))
                            .copied()
                    };
                    field("num-slaves") == Some("1") && field("num-other-sentinels") == Some("2")
                },
                "the sentinels to know each other and the replica",
            );
        }
        group
    }

    /// `host:port,...` of the Sentinels, for `REDIS_SENTINELS`.
    pub fn sentinels(&self) -> String {
        let each: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        each.join(",")
    }

    /// The port of the server a Sentinel names master now.
    pub fn master_port(&self) -> Option<u16> {
        let reply = cli(
            self.sentinel_ports[0],
            None,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
        );
        reply.lines().nth(1)?.trim().parse().ok()
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for sentinel in &mut self.sentinels {
            let _ = sentinel.kill();
            let _ = sentinel.wait();
        }
    }
}

/// The Redis key the gateway configured by `vars` writes for `client` (as logs write it) under
/// `rule`'s first limit: `{KEY_PREFIX}{rule:client}:{algorithm}:{numbers}`, the numbers the
/// limit's policy fingerprint, so a test can reach a key before the gateway has written it.
pub fn key_of(vars: &[(&str, &str)], rule: &str, client: &str) -> String {
    keys_of(vars, rule, client).remove(0)
}

/// The Redis keys the gateway configured by `vars` writes for `client` under each limit of
/// `rule`, in the order the rule writes them.
pub fn keys_of(vars: &[(&str, &str)], rule: &str, client: &str) -> Vec<String> {
    let mut all = vec![("BACKEND_URL", "http://127.0.0.1:9")];
    all.extend_from_slice(vars);
    let config = tollgate::Config::from_vars(all).unwrap();
    let limits = config.rule_table().rule(rule).unwrap().limits.clone();
    let prefix = vars
        .iter()
        .find(|(name, _)| *name == "KEY_PREFIX")
        .map_or("tollgate:", |(_, prefix)| prefix);
    limits
        .iter()
        .map(|policy| {
            format!(
                "{prefix}{{{rule}:{client}}}:{}:{:08x}",
                policy.key_suffix(),
                policy.fingerprint()
            )
        })
        .collect()
}

/// How many of `n` requests of cost 1 for `client` under `rule`, decided all at once by
/// `stores` in turn (each a replica's connection), were allowed; every decision must succeed.
pub async fn admitted_at_once(
    stores: &[tollgate::stores::RedisStore],
    rule: &tollgate::rules::Rule,
    client: std::net::IpAddr,
    n: usize,
) -> usize {
    let decisions = futures_util::future::join_all(
        (0..n).map(|i| stores[i % stores.len()].check(rule, client.into(), tollgate::algorithms::Cost::ONE)),
    )
    .await;
    decisions.iter().filter(|d| d.as_ref().unwrap().allowed).count()
}
