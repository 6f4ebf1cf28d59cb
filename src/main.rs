//! The `tollgate` binary: configuration from the environment, logging, bind, serve until
//! SIGTERM or SIGINT.

use std::io::Write;
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tollgate::Config;

const USAGE: &str = "usage: tollgate [--check-config]\n\
    Configured through environment variables (and a .env file in the working directory);\n\
    see .env.example. --check-config validates them, prints the effective rules and exits.";

#[tokio::main]
async fn main() -> ExitCode {
    let check_only = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check-config") => true,
        Some("--version") => {
            println!("tollgate {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => return fail(&format!("unknown argument {other:?}\n{USAGE}")),
    };
    // A missing .env is normal; a malformed one is an error (its contents are not echoed).
    if let Err(error) = dotenvy::dotenv()
        && !error.not_found()
    {
        return fail("the .env file could not be read; check its syntax (values are not shown)");
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => return fail(&format!("configuration error: {error}")),
    };
    if check_only {
        // A closed pipe (`| head -1`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "configuration ok\n{config}");
        return ExitCode::SUCCESS;
    }
    tollgate::telemetry::init(config.log_format);
    let listener = match TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            return fail(&format!(
                "cannot listen on {} (BIND, PORT): {error}",
                config.listen
            ));
        }
    };
    match tollgate::serve(listener, config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error.to_string()),
    }
}

/// Completes on the first SIGTERM or SIGINT, which starts the drain. A second signal during
/// the drain exits at once (status 130), for an operator who does not want to wait.
async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
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

fn fail(message: &str) -> ExitCode {
    eprintln!("tollgate: {message}");
    ExitCode::from(2)
}
