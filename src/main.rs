//! The `tollgate` binary: configuration from the environment (and `.env`), logging, bind the
//! proxy and admin listeners, serve until SIGTERM or SIGINT (SIGHUP reloads RULES_FILE). `--check-config` validates and
//! prints the configuration with its warnings; `tollgate healthcheck` asks a running
//! tollgate's admin listener whether it serves (for a container's `HEALTHCHECK`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tollgate::Config;

const USAGE: &str = "\
tollgate: a rate-limiting reverse proxy

usage: tollgate                  serve until SIGTERM or SIGINT (SIGHUP reloads RULES_FILE's
                                 rule table; without one it is logged and ignored)
       tollgate --check-config   validate the configuration, print warnings and the effective
                                 rules, and exit: 0 if valid, 3 if valid but with warnings
                                 (a misspelt or unused variable: serving would start, and
                                 log them), 2 if not
       tollgate healthcheck      GET /healthz on the admin listener (ADMIN_BIND, ADMIN_PORT);
                                 exit 0 if it answers 200, 1 otherwise
       tollgate --version | -V   print the version
       tollgate --help | -h      print this help

Configuration comes from environment variables and from a .env file in the working directory
(a variable set in the environment wins). Every variable, its default and its meaning are in
.env.example and docs/operations.md. A configuration error exits with status 2.";

/// `--check-config`'s exit status for a valid configuration with warnings.
const WARNINGS_STATUS: u8 = 3;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let check_only = match args[..] {
        [] => false,
        ["--check-config"] => true,
        ["healthcheck"] => return healthcheck().await,
        ["--version" | "-V"] => {
            println!("tollgate {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        ["--help" | "-h"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => return fail(&format!("unexpected arguments {:?}\n\n{USAGE}", args.join(" "))),
    };
    if let Err(message) = load_dot_env() {
        return fail(&message);
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => return fail(&format!("configuration error: {error}")),
    };
    match check_only {
        true => check_config(&config),
        false => serve(config).await,
    }
}

/// `tollgate healthcheck`: GET /healthz on the admin listener the environment (and `.env`)
/// names.
async fn healthcheck() -> ExitCode {
    load_dot_env_quietly();
    let probed = match tollgate::config::admin_probe_address(std::env::vars()) {
        Ok(address) => tollgate::healthcheck(address).await,
        Err(error) => Err(error),
    };
    match probed {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate healthcheck: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config`: the verdict, the warnings and the effective configuration, printed.
fn check_config(config: &Config) -> ExitCode {
    if let Err(error) = tollgate::check_log_filter() {
        return fail(&format!("configuration error: {error}"));
    }
    let mut warnings: String = config
        .warnings()
        .iter()
        .map(|warning| format!("warning: {warning}\n"))
        .collect();
    // The machine this runs on may not be the one that serves, so this is a warning here;
    // serving stops at it.
    if let Some(state_file) = config.state_file()
        && let Err(error) = tollgate::limit::state_file::check_writable(&state_file.path)
    {
        warnings.push_str(&format!(
            "warning: STATE_FILE: {error} (tollgate would refuse to start here)\n"
        ));
    }
    // Valid with warnings is an exit status of its own: a deploy pipeline's check fails on
    // a misspelt variable that serving only warns about (Kubernetes injects variables
    // that look like ours, so serving cannot refuse them).
    let count = warnings.lines().count();
    let (verdict, status) = match count {
        0 => ("configuration ok".to_owned(), ExitCode::SUCCESS),
        1 => (
            format!("configuration ok, with 1 warning (exit status {WARNINGS_STATUS})"),
            ExitCode::from(WARNINGS_STATUS),
        ),
        _ => (
            format!("configuration ok, with {count} warnings (exit status {WARNINGS_STATUS})"),
            ExitCode::from(WARNINGS_STATUS),
        ),
    };
    // A closed pipe (`| head -1`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{verdict}\n{warnings}{config}");
    status
}

/// Serve until SIGTERM or SIGINT: logging, the signal handlers, the listeners bound, then
/// the app built and run.
async fn serve(config: Config) -> ExitCode {
    if let Err(error) = tollgate::init_logging(&config) {
        return fail(&format!("configuration error: {error}"));
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    // Before binding: a signal that comes once clients can connect must find its handler, not
    // the default action (which for SIGTERM and SIGHUP is to die at once, without draining).
    let shutdown = shutdown_signal(signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    ignore_sighup(config.reloads_rules());
    // Every connection is a file descriptor, and MAX_CONNECTIONS is sized from this limit
    // (the ready line shows both).
    if let Err(error) = tollgate::raise_fd_limit() {
        tracing::warn!(%error, "cannot raise the file-descriptor limit to its hard limit");
    }
    let listeners = match tollgate::bind(&config).await {
        Ok(listeners) => listeners,
        Err(error) => return fail(&error.to_string()),
    };
    match tollgate::App::build(config, listeners).await {
        Ok(app) => {
            app.run(shutdown).await;
            ExitCode::SUCCESS
        }
        Err(error) => fail(&error.to_string()),
    }
}

/// Completes on the first SIGTERM or SIGINT, which starts the drain. A second signal during
/// the drain exits at once (status 130), for an operator who does not want to wait. The
/// handlers are installed by the caller, when it calls `signal`, not when this is first polled.
async fn shutdown_signal(term: io::Result<Signal>, int: io::Result<Signal>) {
    let (Ok(mut term), Ok(mut int)) = (term, int) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal during the drain: exiting now");
        std::process::exit(130);
    });
}

/// SIGHUP asks many daemons to reload their configuration, and by default it kills the
/// process on the spot, dropping every request in flight. Without `RULES_FILE` there is
/// nothing to reload (the environment is read at start only): tollgate says so and carries on.
/// With it (`reloads`), the server reloads the rule table on SIGHUP with a handler of its own,
/// and this one only keeps the default action away until that one is installed.
fn ignore_sighup(reloads: bool) {
    match signal(SignalKind::hangup()) {
        Ok(mut hangup) => {
            tokio::spawn(async move {
                while hangup.recv().await.is_some() {
                    if reloads {
                        continue;
                    }
                    tracing::warn!(
                        "SIGHUP received: nothing to reload without RULES_FILE (environment variables are \
                         read at start only); nothing changed"
                    );
                }
            });
        }
        Err(error) => tracing::warn!(%error, "cannot install a SIGHUP handler: SIGHUP would stop tollgate"),
    }
}

/// `healthcheck` reads `.env` like the server, so both see the same admin address; a broken
/// `.env` is the server's to report, not the probe's.
fn load_dot_env_quietly() {
    let _ = load_dot_env();
}

/// Load `.env` from the working directory into the environment, where a variable already set
/// wins. No file is fine. A line dotenvy cannot parse is an error naming the file and the line
/// but never showing it: it may hold a password.
fn load_dot_env() -> Result<(), String> {
    let path = std::path::absolute(".env").unwrap_or_else(|_| PathBuf::from(".env"));
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    };
    let mut lines = LineByLine {
        inner: BufReader::new(file),
        line: 0,
        mid_line: false,
    };
    match dotenvy::from_read(&mut lines) {
        Ok(()) => Ok(()),
        // dotenvy reports the entry's text (a multi-line quoted value spans several lines)
        // and no line number: the entry ends on the last line handed over.
        Err(dotenvy::Error::LineParse(entry, _)) => {
            let first = lines
                .line
                .saturating_sub(entry.trim_end_matches(['\r', '\n']).matches('\n').count());
            Err(format!(
                "{} line {first} cannot be parsed (not shown: it may hold a secret); \
                 expected NAME=value (quote a value holding spaces; close every quote)",
                path.display()
            ))
        }
        Err(dotenvy::Error::Io(error)) => Err(format!(
            "cannot read {} (line {}): {error}",
            path.display(),
            lines.line
        )),
        Err(_) => Err(format!("cannot load {}", path.display())),
    }
}

/// Hands a file to dotenvy one line per `read`, counting lines. dotenvy's reader asks for more
/// only when it needs the next line, so `line` is the line it is parsing.
struct LineByLine<R> {
    inner: BufReader<R>,
    /// The 1-based number of the last line handed over (in part or whole).
    line: usize,
    /// The last byte handed over was not the end of a line.
    mid_line: bool,
}

impl<R: Read> Read for LineByLine<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.inner.fill_buf()?;
        let line_end = available
            .iter()
            .position(|&byte| byte == b'\n')
            .map_or(available.len(), |newline| newline + 1);
        let n = line_end.min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        buf[..n].copy_from_slice(&available[..n]);
        if !self.mid_line {
            self.line += 1;
        }
        self.mid_line = buf[n - 1] != b'\n';
        self.inner.consume(n);
        Ok(n)
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("tollgate: {message}");
    ExitCode::from(2)
}
