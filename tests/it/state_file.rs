//! `STATE_FILE` through the real binary: a client limited before a SIGTERM restart (or a
//! SIGKILL after a periodic save) is still limited after it; a rule whose limits changed starts
//! afresh; a corrupt, cut or foreign file is logged and ignored, and the gateway serves; a
//! directory that cannot take the file stops startup, naming the variable.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::binary::Running;
use crate::support::{Backend, get_from};

const ALICE: [u8; 4] = [127, 0, 0, 1];
const BOB: [u8; 4] = [127, 0, 0, 2];

/// Statuses of `n` requests in a row from `from`.
async fn statuses(tollgate: &Running, from: [u8; 4], n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let reply = get_from(tollgate.addr, IpAddr::from(from), "/", &[]).await;
        statuses.push(reply.status.as_u16());
    }
    statuses
}

/// A gateway of two tokens refilled one per 100 s (nothing refills during a test), its budgets
/// saved to `state`, with `extra` settings.
fn start(backend: &Backend, state: &Path, extra: &[(&str, &str)]) -> Running {
    let mut vars = vec![
        ("BACKEND_URL", backend.url()),
        ("STATE_FILE", state.display().to_string()),
        ("MAX_TOKENS", "2".into()),
        ("REFILL_RATE", "0.01".into()),
    ];
    vars.extend(extra.iter().map(|(name, value)| (*name, value.to_string())));
    let vars: Vec<(&str, &str)> = vars.iter().map(|(name, value)| (*name, value.as_str())).collect();
    Running::start(&vars)
}

/// Wait (up to 5 s) for the log to hold `line`, and return the log.
async fn logged(tollgate: &Running, line: &str) -> String {
    for _ in 0..250 {
        if tollgate.log().contains(line) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = tollgate.log();
    assert!(log.contains(line), "the log should say {line:?}: {log}");
    log
}

#[tokio::test]
async fn a_client_limited_before_a_sigterm_restart_is_still_limited_after_it() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tollgate.state");
    let tollgate = start(&backend, &state, &[]);
    logged(&tollgate, "no state file yet").await;
    assert_eq!(statuses(&tollgate, ALICE, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&tollgate, BOB, 1).await, [200]);
    let log_before = tollgate.log();
    assert_eq!(tollgate.terminate().await.code(), Some(0), "{log_before}");
    assert!(state.exists(), "saved on shutdown");

    let tollgate = start(&backend, &state, &[]);
    let log = logged(&tollgate, "state file restored").await;
    assert!(log.contains("clients=2"), "{log}");
    assert!(log.contains("general (2 clients)"), "{log}");
    assert_eq!(statuses(&tollgate, ALICE, 1).await, [429], "still limited");
    assert_eq!(
        statuses(&tollgate, BOB, 2).await,
        [200, 429],
        "one token left, as before"
    );
    // A client never seen has its whole budget.
    assert_eq!(statuses(&tollgate, [127, 0, 0, 3], 3).await, [200, 200, 429]);
    assert_eq!(tollgate.terminate().await.code(), Some(0));
}

#[tokio::test]
async fn a_periodic_save_keeps_a_client_limited_across_a_sigkill() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tollgate.state");
    let tollgate = start(&backend, &state, &[("STATE_SAVE_INTERVAL_S", "1")]);
    assert_eq!(statuses(&tollgate, ALICE, 3).await, [200, 200, 429]);
    // The first save comes a second after startup, after the requests above.
    for _ in 0..250 {
        if state.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(state.exists(), "saved within a second or so: {}", tollgate.log());
    // Dropped: SIGKILL, no save on shutdown.
    drop(tollgate);

    let tollgate = start(&backend, &state, &[]);
    logged(&tollgate, "state file restored").await;
    assert_eq!(statuses(&tollgate, ALICE, 1).await, [429], "still limited");
}

#[tokio::test]
async fn a_rule_whose_limits_changed_starts_afresh() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tollgate.state");
    let tollgate = start(&backend, &state, &[]);
    assert_eq!(statuses(&tollgate, ALICE, 3).await, [200, 200, 429]);
    assert_eq!(tollgate.terminate().await.code(), Some(0));

    let tollgate = start(&backend, &state, &[("MAX_TOKENS", "3")]);
    let log = logged(&tollgate, "rule dropped").await;
    assert!(log.contains("its limits changed"), "{log}");
    assert!(log.contains("rule=general"), "{log}");
    assert_eq!(statuses(&tollgate, ALICE, 4).await, [200, 200, 200, 429]);
    assert_eq!(tollgate.terminate().await.code(), Some(0));
}

#[tokio::test]
async fn a_corrupt_cut_or_foreign_state_file_is_logged_and_ignored() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tollgate.state");
    let tollgate = start(&backend, &state, &[]);
    assert_eq!(statuses(&tollgate, ALICE, 3).await, [200, 200, 429]);
    assert_eq!(tollgate.terminate().await.code(), Some(0));
    let good = std::fs::read(&state).unwrap();

    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    let cases: [(&[u8], &str); 4] = [
        (&flipped, "checksum mismatch"),
        (&good[..good.len() / 2], "truncated"),
        (b"", "truncated"),
        (b"{\"not\": \"ours\"}\n", "not a tollgate state file"),
    ];
    for (bytes, said) in cases {
        std::fs::write(&state, bytes).unwrap();
        let tollgate = start(&backend, &state, &[]);
        let log = logged(&tollgate, "state file ignored").await;
        assert!(log.contains(said), "{said}: {log}");
        assert_eq!(
            statuses(&tollgate, ALICE, 3).await,
            [200, 200, 429],
            "{said}: served, every budget full"
        );
        // The shutdown's save replaces the bad file with a good one.
        assert_eq!(tollgate.terminate().await.code(), Some(0));
        let restarted = start(&backend, &state, &[]);
        logged(&restarted, "state file restored").await;
        assert_eq!(statuses(&restarted, ALICE, 1).await, [429], "{said}");
    }
}

#[tokio::test]
async fn a_directory_that_cannot_take_the_file_stops_startup_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("missing").join("tollgate.state");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .env_clear()
        .env("BACKEND_URL", "http://127.0.0.1:9")
        .env("BIND", "127.0.0.1")
        .env("PORT", crate::support::free_port().to_string())
        .env("ADMIN_PORT", crate::support::free_port().to_string())
        .env("STATE_FILE", &state)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("STATE_FILE") && stderr.contains("missing"),
        "{stderr}"
    );
    // --check-config says so, without failing: it may run on another machine.
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--check-config")
        .env_clear()
        .env("BACKEND_URL", "http://127.0.0.1:9")
        .env("STATE_FILE", &state)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "valid, with a warning: {stdout}");
    assert!(stdout.contains("warning: STATE_FILE: cannot write"), "{stdout}");
    assert!(
        stdout.contains(&format!("state file:       {}", state.display())),
        "{stdout}"
    );
    // With Redis: a configuration error, naming why.
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .env_clear()
        .env("BACKEND_URL", "http://127.0.0.1:9")
        .env("REDIS_ADDR", "127.0.0.1:6379")
        .env("STATE_FILE", &state)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already survive a restart"), "{stderr}");
}

#[tokio::test]
async fn after_a_reload_the_table_in_force_is_what_is_saved() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (state, rules) = (dir.path().join("tollgate.state"), dir.path().join("rules.toml"));
    let general = "[general]\nlimits = \"token_bucket:2:0.01\"\n";
    std::fs::write(&rules, general).unwrap();
    let start = || {
        let vars = [
            ("BACKEND_URL", backend.url()),
            ("STATE_FILE", state.display().to_string()),
            ("RULES_FILE", rules.display().to_string()),
            ("RULES_RELOAD_INTERVAL_MS", "0".into()),
        ];
        let vars: Vec<(&str, &str)> = vars.iter().map(|(name, value)| (*name, value.as_str())).collect();
        Running::start(&vars)
    };
    let tollgate = start();
    logged(&tollgate, "no state file yet").await;
    // A route added by a reload: its clients are saved on shutdown, and restored.
    let with_api = format!(
        "{general}\n[[routes]]\nname = \"api\"\npath = \"/api/*\"\nlimits = \"token_bucket:1:0.01\"\n"
    );
    std::fs::write(&rules, &with_api).unwrap();
    tollgate.hangup();
    logged(&tollgate, "rules reloaded").await;
    let api = |tollgate: &Running| {
        let addr = tollgate.addr;
        async move {
            get_from(addr, IpAddr::from(ALICE), "/api/x", &[])
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!((api(&tollgate).await, api(&tollgate).await), (200, 429));
    assert_eq!(tollgate.terminate().await.code(), Some(0));

    let tollgate = start();
    let log = logged(&tollgate, "state file restored").await;
    assert!(log.contains("api (1 clients)"), "{log}");
    assert_eq!(
        api(&tollgate).await,
        429,
        "the reloaded rule's client is still limited"
    );
}
