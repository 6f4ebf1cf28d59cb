//! An OTLP trace collector for the tests: `otlp_receiver.py` (the OpenTelemetry project's own
//! messages, from the `opentelemetry-proto` package) on a free port, over HTTP or gRPC, each
//! span it receives kept as the JSON line it prints.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::free_port;
use super::redis::wait_for;

/// `http/protobuf` or `grpc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Otlp {
    Http,
    Grpc,
}

pub struct Collector {
    child: Child,
    pub port: u16,
    protocol: Otlp,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Collector {
    pub fn start(protocol: Otlp) -> Collector {
        let port = free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/otlp_receiver.py");
        let kind = match protocol {
            Otlp::Http => "http",
            Otlp::Grpc => "grpc",
        };
        let mut child = Command::new("python3")
            .args([script, kind, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (scripts/test.sh installs it and opentelemetry-proto)");
        let stdout = child.stdout.take().expect("piped");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let span: Value = serde_json::from_str(&line).expect("the receiver prints JSON lines");
                kept.lock().unwrap().push(span);
            }
        });
        wait_for(
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "the OTLP receiver to listen",
        );
        Collector {
            child,
            port,
            protocol,
            spans,
        }
    }

    /// The gateway's variables to send here.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let protocol = match self.protocol {
            Otlp::Http => "http/protobuf",
            Otlp::Grpc => "grpc",
        };
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
        ]
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Value> {
        self.spans.lock().unwrap().clone()
    }

    /// Wait (up to 10 s) until `count` spans matching `wanted` have been received; those.
    pub async fn wait_for(&self, count: usize, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<Value> = self.spans().into_iter().filter(|span| wanted(span)).collect();
            if found.len() >= count {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} spans received: {:#?}",
                found.len(),
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop it (the collector down).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A span's attribute.
pub fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}
