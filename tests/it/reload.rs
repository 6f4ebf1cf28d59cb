//! `RULES_FILE` reloads through the real binary: on SIGHUP and when the file changes, a rule
//! whose name and limits are unchanged keeps its clients' budgets (memory and Redis), a
//! changed one starts afresh, a bad file changes nothing, a storm of SIGHUPs drops nothing,
//! and requests under load never fail while the table is swapped.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;

use crate::binary::Running;
use crate::support::redis::RedisServer;
use crate::support::{Backend, get};

/// A rules file of its own, rewritten in place by the tests.
struct RulesFile {
    file: tempfile::NamedTempFile,
}

impl RulesFile {
    fn new(text: &str) -> RulesFile {
        let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        let rules = RulesFile { file };
        rules.write(text);
        rules
    }

    /// Replace the contents as an editor or a ConfigMap would: a new file renamed over it.
    fn write(&self, text: &str) {
        let path = self.file.path();
        let next = path.with_extension("next");
        let mut file = std::fs::File::create(&next).unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file.sync_all().unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    fn path(&self) -> &str {
        self.file.path().to_str().unwrap()
    }
}

const BEFORE: &str = r#"
auth_paths = ["/login"]

[general]
limits = "token_bucket:3:0.001"

[[routes]]
name = "api"
path = "/api/*"
limits = "token_bucket:2:0.001"
"#;

/// `api` gets other numbers, `search` is new, `general` is as it was.
const AFTER: &str = r#"
auth_paths = ["/login"]

[general]
limits = "token_bucket:3:0.001"

[[routes]]
name = "search"
path = "/search"
limits = "fixed_window:1:3600"

[[routes]]
name = "api"
path = "/api/*"
limits = "token_bucket:5:0.001"
"#;

/// `tollgate_config_reloads_total{result}` on the admin listener.
async fn reloads(tollgate: &Running, result: &str) -> u64 {
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], tollgate.admin_port));
    let text = get(admin, "/metrics").await;
    let series = format!("tollgate_config_reloads_total{{result=\"{result}\"}} ");
    text.text()
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.trim().parse::<f64>().ok())
        .map_or(0, |count| count as u64)
}

/// Wait until `result` reloads number at least `count`.
pub(crate) async fn await_reloads(tollgate: &Running, result: &str, count: u64) {
    for _ in 0..500 {
        if reloads(tollgate, result).await >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no {result} reload: {}", tollgate.log());
}

async fn statuses(tollgate: &Running, path: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(get(tollgate.addr, path).await.status.as_u16());
    }
    statuses
}

/// Spend `general` and `api`, reload to [`AFTER`], and see what each rule kept.
async fn kept_and_changed(tollgate: &Running, rules: &RulesFile) {
    assert_eq!(statuses(tollgate, "/", 4).await, [200, 200, 200, 429]);
    assert_eq!(statuses(tollgate, "/api/x", 3).await, [200, 200, 429]);
    rules.write(AFTER);
    tollgate.hangup();
    await_reloads(tollgate, "ok", 1).await;
    assert_eq!(
        statuses(tollgate, "/", 1).await,
        [429],
        "general kept its spent budget"
    );
    assert_eq!(
        statuses(tollgate, "/api/x", 6).await,
        [200, 200, 200, 200, 200, 429],
        "api's numbers changed: afresh, with the new ones"
    );
    assert_eq!(
        statuses(tollgate, "/search", 2).await,
        [200, 429],
        "the new route is in force"
    );
    let log = tollgate.log();
    assert!(log.contains("rules reloaded"), "{log}");
    assert!(
        log.contains("changed=api") && log.contains("added=search"),
        "{log}"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_budgets_of_unchanged_rules_and_starts_changed_ones_afresh() {
    let backend = Backend::start().await;
    let rules = RulesFile::new(BEFORE);
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "0"),
    ]);
    kept_and_changed(&tollgate, &rules).await;
}

#[tokio::test]
async fn a_reload_keeps_redis_budgets_of_unchanged_rules_and_starts_changed_ones_afresh() {
    let backend = Backend::start().await;
    let redis = RedisServer::start();
    let rules = RulesFile::new(BEFORE);
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("REDIS_URL", &redis.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "0"),
    ]);
    kept_and_changed(&tollgate, &rules).await;
}

#[tokio::test]
async fn a_changed_file_is_reloaded_without_a_signal() {
    let backend = Backend::start().await;
    let rules = RulesFile::new(BEFORE);
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "50"),
    ]);
    assert_eq!(
        statuses(&tollgate, "/search", 2).await,
        [200, 200],
        "general's, before"
    );
    rules.write(AFTER);
    await_reloads(&tollgate, "ok", 1).await;
    assert_eq!(statuses(&tollgate, "/search", 2).await, [200, 429]);
}

#[tokio::test]
async fn a_bad_file_changes_nothing_and_says_where_it_is_wrong() {
    let backend = Backend::start().await;
    let rules = RulesFile::new(BEFORE);
    let mut tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "0"),
    ]);
    assert_eq!(statuses(&tollgate, "/api/x", 3).await, [200, 200, 429]);
    let broken = BEFORE.replace("token_bucket:2:0.001", "token_bucket:two:0.001");
    rules.write(&broken);
    tollgate.hangup();
    await_reloads(&tollgate, "error", 1).await;
    let log = tollgate.log();
    let line = log
        .lines()
        .find(|line| line.contains("rules not reloaded"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains(&format!("{}:10: routes[0].limits", rules.path())),
        "{line}"
    );
    assert!(line.contains("\"two\""), "{line}");
    assert_eq!(
        statuses(&tollgate, "/api/x", 1).await,
        [429],
        "the old table, budgets and all"
    );
    assert_eq!(reloads(&tollgate, "ok").await, 0);
    // A file that does not parse, and one that is gone: the same.
    rules.write("[general\nlimits = ");
    tollgate.hangup();
    await_reloads(&tollgate, "error", 2).await;
    assert_eq!(statuses(&tollgate, "/api/x", 1).await, [429]);
    assert!(tollgate.child.try_wait().unwrap().is_none(), "still serving");
}

#[tokio::test]
async fn a_storm_of_sighups_under_load_fails_no_request_and_loses_no_budget() {
    storm(&[]).await;
}

#[tokio::test]
async fn a_storm_of_sighups_under_load_on_redis_fails_no_request_and_loses_no_budget() {
    let redis = RedisServer::start();
    storm(&[("REDIS_URL", &redis.url())]).await;
}

/// Four clients under load while fifty SIGHUPs reload the table, half of them a rewritten file.
async fn storm(store: &[(&str, &str)]) {
    let backend = Backend::start().await;
    let rules = RulesFile::new(
        r#"
[general]
limits = "token_bucket:1000000:0.001"

[[routes]]
name = "api"
path = "/api/*"
limits = "token_bucket:40:0.001"
"#,
    );
    let url = backend.url();
    let mut vars = vec![
        ("BACKEND_URL", url.as_str()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "0"),
    ];
    vars.extend_from_slice(store);
    let tollgate = Arc::new(Running::start(&vars));
    let (allowed, refused, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (tollgate, allowed, refused, failed) =
                (tollgate.clone(), allowed.clone(), refused.clone(), failed.clone());
            tokio::spawn(async move {
                for n in 0..60 {
                    let path = if n % 2 == 0 { "/" } else { "/api/x" };
                    let reply = get(tollgate.addr, path).await;
                    match (reply.status, path) {
                        (StatusCode::OK, "/api/x") => allowed.fetch_add(1, Ordering::Relaxed),
                        (StatusCode::TOO_MANY_REQUESTS, "/api/x") => refused.fetch_add(1, Ordering::Relaxed),
                        (StatusCode::OK, _) => 0,
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    // Fifty SIGHUPs while the clients run; every other one with the file rewritten (the same
    // rules, other bytes), so both the swap and the unchanged path are taken.
    for n in 0..50 {
        if n % 2 == 0 {
            rules.write(&format!(
                "# rewrite {n}\n{}",
                std::fs::read_to_string(rules.path()).unwrap()
            ));
        }
        tollgate.hangup();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for client in clients {
        client.await.unwrap();
    }
    await_reloads(&tollgate, "ok", 1).await;
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{}", tollgate.log());
    assert_eq!(
        allowed.load(Ordering::Relaxed),
        40,
        "exactly the budget, across every reload ({} refused)",
        refused.load(Ordering::Relaxed)
    );
    assert_eq!(reloads(&tollgate, "error").await, 0);
    assert_eq!(
        get(tollgate.addr, "/").await.status,
        StatusCode::OK,
        "still serving"
    );
}

#[tokio::test]
async fn a_setting_in_both_the_file_and_the_environment_stops_startup_naming_both() {
    let rules = RulesFile::new("[general]\nlimits = \"token_bucket:3:1\"\n");
    let output = Command::new(crate::binary::BINARY)
        .arg("--check-config")
        .env_clear()
        .env("BACKEND_URL", "http://127.0.0.1:9")
        .env("RULES_FILE", rules.path())
        .env("LIMITS", "token_bucket:5:1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("LIMITS") && stderr.contains("general.limits") && stderr.contains("line 2"),
        "{stderr}"
    );
    // And --check-config shows the file's table.
    let output = Command::new(crate::binary::BINARY)
        .arg("--check-config")
        .env_clear()
        .env("BACKEND_URL", "http://127.0.0.1:9")
        .env("RULES_FILE", rules.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("3 tokens"), "{stdout}");
}

#[tokio::test]
async fn a_changed_dot_env_is_named_in_a_warning_as_it_is_not_applied_live() {
    let backend = Backend::start().await;
    let rules = RulesFile::new(BEFORE);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "SHUTDOWN_TIMEOUT_MS=5000\nLOG_FORMAT=text\n",
    )
    .unwrap();
    let tollgate = Running::start_in(
        dir.path(),
        &[
            ("BACKEND_URL", &backend.url()),
            ("RULES_FILE", rules.path()),
            ("RULES_RELOAD_INTERVAL_MS", "0"),
        ],
    );
    std::fs::write(
        dir.path().join(".env"),
        "SHUTDOWN_TIMEOUT_MS=9000\nLOG_FORMAT=text\n",
    )
    .unwrap();
    tollgate.hangup();
    await_reloads(&tollgate, "ok", 1).await;
    let log = tollgate.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("changed in .env"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("SHUTDOWN_TIMEOUT_MS") && warnings[0].contains("restart"),
        "{log}"
    );
    assert!(!warnings[0].contains("9000"), "values are never shown: {log}");
}

#[tokio::test]
async fn clients_keyed_by_a_header_keep_their_budgets_across_a_reload_without_a_secret() {
    // No KEY_HASH_SECRET: the process digests header values with a random key of its own,
    // which a reload must keep, or every API key would come back with a full budget.
    let backend = Backend::start().await;
    let rules = RulesFile::new("[general]\nlimits = \"token_bucket:2:0.001\"\nkey = \"header:X-API-Key\"\n");
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "0"),
    ]);
    let from = std::net::IpAddr::from([127, 0, 0, 1]);
    let key = [("x-api-key", "tenant-7")];
    let send = || async {
        crate::support::get_from(tollgate.addr, from, "/", &key)
            .await
            .status
            .as_u16()
    };
    assert_eq!((send().await, send().await, send().await), (200, 200, 429));
    rules.write(
        "[general]\nlimits = \"token_bucket:2:0.001\"\nkey = \"header:X-API-Key\"\n\n[[routes]]\npath = \"/other\"\nlimits = \"token_bucket:1:1\"\n",
    );
    tollgate.hangup();
    await_reloads(&tollgate, "ok", 1).await;
    assert!(tollgate.log().contains("kept=auth,general"), "{}", tollgate.log());
    assert_eq!(send().await, 429, "the same key, still limited");
}

/// A file the watcher failed on is reported once, not at every tick it stays; put back to
/// the table in force, it is said to be fine again (it was silent, the error standing last).
#[tokio::test]
async fn a_file_put_back_after_a_failed_reload_is_said_to_be_fine_again() {
    let backend = Backend::start().await;
    let rules = RulesFile::new(BEFORE);
    let tollgate = Running::start(&[
        ("BACKEND_URL", &backend.url()),
        ("RULES_FILE", rules.path()),
        ("RULES_RELOAD_INTERVAL_MS", "20"),
    ]);
    rules.write(&BEFORE.replace("token_bucket:2:0.001", "token_bucket:two:0.001"));
    await_reloads(&tollgate, "error", 1).await;
    // Many ticks on the same bad bytes: still one error.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reloads(&tollgate, "error").await, 1, "{}", tollgate.log());
    rules.write(BEFORE);
    let mut log = tollgate.log();
    for _ in 0..250 {
        if log.contains("rules file is back to the rule table in force") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        log = tollgate.log();
    }
    let line = log
        .lines()
        .find(|line| line.contains("rules file is back to the rule table in force"))
        .unwrap_or_else(|| panic!("nothing said once the file was fixed:\n{log}"));
    assert!(line.contains("INFO") && line.contains(rules.path()), "{line}");
    assert_eq!(reloads(&tollgate, "ok").await, 0, "nothing was reloaded");
    assert_eq!(statuses(&tollgate, "/api/x", 3).await, [200, 200, 429]);
}
