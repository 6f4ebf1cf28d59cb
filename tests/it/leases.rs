//! Exact leases (`REDIS_LEASES=on`): hot keys decided from shares of their budgets, with a real
//! `redis-server` shared by several replicas. Never over the budget; the whole budget when
//! every replica has demand; a killed replica's share back within seconds (token bucket); the
//! shares given back at shutdown and on a reload; the same totals as without leases.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;

use crate::support::{Backend, Gateway, RedisServer, get};

/// Leases on, from 20 decisions a second per key (the tests' loads reach it at once); a
/// timeout a loaded machine does not reach, and no request let through uncounted if it does.
const LEASES_ON: [(&str, &str); 4] = [
    ("REDIS_LEASES", "on"),
    ("REDIS_LEASE_HOT", "20"),
    ("REDIS_TIMEOUT_MS", "2000"),
    ("FAIL_MODE", "closed"),
];

/// `requests` requests to `addr` from 127.0.0.1 (one client), `workers` at a time; how many
/// were allowed. Anything but 200 or 429 fails the test.
async fn drive(addr: SocketAddr, requests: usize, workers: usize) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let allowed = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (next, allowed) = (next.clone(), allowed.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let reply = get(addr, "/").await;
                    match reply.status {
                        StatusCode::OK => {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    allowed.load(Ordering::Relaxed)
}

/// The calls Redis has run since its statistics were reset: every command but `INFO` and
/// `CONFIG` (the test's own).
fn redis_calls(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|line| !line.starts_with("cmdstat_info:") && !line.starts_with("cmdstat_config:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Three replicas sharing a budget of 1,000, each sent 1,000 requests of one client at once:
/// between 990 and 1,000 pass (never more: each share is debited in Redis when taken), for
/// both windows (a token bucket of a thousand a day refills less than a token a second, so it
/// never leases: below).
#[tokio::test]
async fn three_replicas_admit_the_whole_budget_and_never_more() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let url = backend.url();
    for limits in ["fixed_window:1000:10000000", "sliding_window:1000:3600"] {
        redis.cli(&["FLUSHALL"]);
        let mut vars = vec![("REDIS_ADDR", redis.addr()), ("LIMITS", limits.to_owned())];
        vars.extend(LEASES_ON.iter().map(|(n, v)| (*n, v.to_string())));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let replicas = [
            Gateway::start(&url, &vars).await,
            Gateway::start(&url, &vars).await,
            Gateway::start(&url, &vars).await,
        ];
        redis.cli(&["CONFIG", "RESETSTAT"]);
        let counts =
            futures_util::future::join_all(replicas.iter().map(|gateway| drive(gateway.addr, 1_000, 8)))
                .await;
        let calls = redis_calls(&redis);
        let admitted: usize = counts.iter().sum();
        assert!(
            (990..=1_000).contains(&admitted),
            "{limits}: {admitted} admitted ({counts:?}), Redis ran {calls} calls"
        );
        // Fewer calls than requests: the hot key was decided from shares.
        assert!(calls < 3_000, "{limits}: {calls} Redis calls for 3,000 requests");
        for gateway in replicas {
            gateway.stop().await;
        }
    }
}
