//! tollgate inside a Rust service: an axum app behind the tower layer (`tollgate::layer`),
//! configured from the binary's own variables (ROUTES, AUTH_PATHS, REDIS_URL, RULES_FILE, ...;
//! `.env.example`), so one `.env` serves the gateway and this app alike.
//!
//! - `GET /` answers `hello`, `POST /login` answers `ok` (under the stricter auth rule of
//!   `AUTH_PATHS`), `GET /slow` answers after 500 ms (try `ROUTES=/slow=concurrent:2`);
//! - listens on `BIND:PORT` (default `0.0.0.0:8080`), the gateway's proxy listener's variables;
//! - serves the gate's metrics on `ADMIN_BIND:ADMIN_PORT` (default `127.0.0.1:9091`), `GET /metrics`.
//!
//! ```sh
//! cargo build --release --example embedded
//! PORT=3000 AUTH_LIMITS=token_bucket:3:0.05 target/release/examples/embedded
//! for i in 1 2 3 4; do curl -si -X POST localhost:3000/login | head -1; done
//! ```

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tollgate::layer::RateLimitLayer;
use tollgate::variables::{ADMIN_BIND, ADMIN_PORT, BIND, PORT};

#[tokio::main]
async fn main() -> ExitCode {
    // A `.env` in the working directory, as the binary reads it (a variable set wins).
    let _ = dotenvy::dotenv();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("embedded: {error}");
            ExitCode::from(2)
        }
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let limits = RateLimitLayer::from_env()?;
    let routes = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", post(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow"
            }),
        );
    // Around the whole router (not `Router::layer`, which routes first): the router routes the
    // path the rules matched, and a request no route serves is decided too. The outer router
    // hands it every request and answers in axum's body type, as `axum::serve` wants.
    let app = Router::new().fallback_service(limits.wrap(routes));
    // The gate's registry, served where this app likes: here, beside nothing else.
    let admin = Router::new().route(
        "/metrics",
        get(move || {
            let limits = limits.clone();
            async move { limits.encode_metrics(false).unwrap_or_default() }
        }),
    );
    let listen = SocketAddr::new(address(BIND.name, BIND.default)?, port(PORT.name, PORT.default)?);
    let admin_listen = SocketAddr::new(
        address(ADMIN_BIND.name, ADMIN_BIND.default)?,
        port(ADMIN_PORT.name, ADMIN_PORT.default)?,
    );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let admin_listener = tokio::net::TcpListener::bind(admin_listen).await?;
    tracing::info!(%listen, metrics = %admin_listen, "embedded app ready");
    tokio::spawn(async move { axum::serve(admin_listener, admin).await });
    // The client's address reaches the layer as axum's ConnectInfo.
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The variable `name` as an IP address, or its `default`.
fn address(name: &str, default: Option<&str>) -> Result<IpAddr, String> {
    let value = std::env::var(name)
        .ok()
        .or(default.map(str::to_owned))
        .unwrap_or_default();
    value
        .parse()
        .map_err(|_| format!("{name}={value:?}: expected an IP address such as 0.0.0.0 or ::"))
}

/// The variable `name` as a port, or its `default`.
fn port(name: &str, default: Option<&str>) -> Result<u16, String> {
    let value = std::env::var(name)
        .ok()
        .or(default.map(str::to_owned))
        .unwrap_or_default();
    value
        .parse()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("{name}={value:?}: expected a port number from 1 to 65535"))
}
