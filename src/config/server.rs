//! The listeners' addresses (`BIND`, `PORT`, `DECIDE_PORT`, `ADMIN_BIND`, `ADMIN_PORT`), and
//! the server's settings: what `PORT` expects before HTTP ([`super::listener`]), the clocks
//! and the caps of client connections, into [`ServerSettings`].

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;

use ipnet::IpNet;

use super::ConfigError;
use super::env::Env;
use super::listener;
use crate::server::ServerSettings;
use crate::server::limits::PerClientCap;
use crate::variables::{self as vars, Var};

/// Where each listener is, checked for collisions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addresses {
    /// `BIND` and `PORT`: the proxy's.
    pub(crate) listen: SocketAddr,
    /// `BIND` and `DECIDE_PORT`: the decision endpoints'; `None` when unset.
    pub(crate) decide: Option<SocketAddr>,
    /// `ADMIN_BIND` and `ADMIN_PORT`.
    pub(crate) admin: SocketAddr,
    /// Whether tollgate proxies: `BACKEND_URL` is set, or `DECIDE_PORT` is not (and then
    /// `BACKEND_URL` is required).
    pub(crate) proxied: bool,
}

/// The listeners' addresses; a port two listeners would share is an error.
pub(crate) fn addresses(env: &Env) -> Result<Addresses, ConfigError> {
    let decide_port = env
        .get(vars::DECIDE_PORT)
        .map(|value| {
            value.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                ConfigError::invalid(vars::DECIDE_PORT.name, value, "a port number from 1 to 65535")
            })
        })
        .transpose()?;
    // A decision service alone needs no backend.
    let proxied = env.is_set(vars::BACKEND_URL) || decide_port.is_none();
    let port = port_number(env, vars::PORT)?;
    let bind: IpAddr = env.parse(vars::BIND, "an IP address such as 0.0.0.0 or ::", |s| {
        s.parse().ok()
    })?;
    // Loopback unless asked: metrics and probes are for this host's (or pod's) eyes, and an
    // admin port left open to clients lets them hold its few connections.
    let admin_bind: IpAddr = env.parse(vars::ADMIN_BIND, "an IP address such as 127.0.0.1 or ::", |s| {
        s.parse().ok()
    })?;
    let admin_port = port_number(env, vars::ADMIN_PORT)?;
    // One port on two addresses collides when either is unspecified (0.0.0.0 holds the
    // port on 127.0.0.1 too).
    let overlapping = admin_bind == bind || admin_bind.is_unspecified() || bind.is_unspecified();
    if admin_port == port && overlapping {
        return Err(ConfigError::Conflict(format!(
            "ADMIN_PORT={admin_port} is PORT too: the admin listener needs a port of its own"
        )));
    }
    if let Some(decide_port) = decide_port {
        if decide_port == port && proxied {
            return Err(ConfigError::Conflict(format!(
                "DECIDE_PORT={decide_port} is PORT too: the decision endpoints need a port of their own"
            )));
        }
        if decide_port == admin_port && overlapping {
            return Err(ConfigError::Conflict(format!(
                "DECIDE_PORT={decide_port} is ADMIN_PORT too: the decision endpoints need a port of their own"
            )));
        }
    }
    Ok(Addresses {
        listen: SocketAddr::new(bind, port),
        decide: decide_port.map(|decide_port| SocketAddr::new(bind, decide_port)),
        admin: SocketAddr::new(admin_bind, admin_port),
        proxied,
    })
}

fn port_number(env: &Env, var: Var) -> Result<u16, ConfigError> {
    env.parse(var, "a port number from 1 to 65535", |s| {
        s.parse().ok().filter(|p| *p != 0)
    })
}

/// The server's settings, listening on `listen`; `trusted_proxies` is `TRUSTED_PROXIES`, which
/// `PROXY_PROTOCOL=true` needs.
pub(crate) fn parse(
    env: &Env,
    listen: SocketAddr,
    trusted_proxies: &[IpNet],
) -> Result<ServerSettings, ConfigError> {
    Ok(ServerSettings {
        listen,
        listener: listener::parse(env, trusted_proxies)?,
        header_read_timeout: env.millis(vars::HEADER_READ_TIMEOUT_MS)?,
        idle_timeout: env.millis(vars::IDLE_TIMEOUT_MS)?,
        send_timeout: env.millis(vars::SEND_TIMEOUT_MS)?,
        max_connections: max_connections(env)?,
        max_connections_per_client: per_client_cap(env, vars::MAX_CONNECTIONS_PER_CLIENT)?,
        max_requests_per_client: per_client_cap(env, vars::MAX_REQUESTS_IN_FLIGHT_PER_CLIENT)?,
        h2_max_concurrent_streams: env.parse(
            vars::H2_MAX_CONCURRENT_STREAMS,
            "a whole number from 1 to 2147483647",
            |s| s.parse::<u32>().ok().filter(|n| (1..=0x7fff_ffff).contains(n)),
        )?,
        shutdown_timeout: env.millis(vars::SHUTDOWN_TIMEOUT_MS)?,
    })
}

/// `MAX_CONNECTIONS`; `None` when unset (sized from the file-descriptor limit).
fn max_connections(env: &Env) -> Result<Option<NonZeroUsize>, ConfigError> {
    env.get(vars::MAX_CONNECTIONS)
        .map(|value| {
            value
                .parse::<usize>()
                .ok()
                .and_then(NonZeroUsize::new)
                .ok_or_else(|| {
                    ConfigError::invalid(
                        vars::MAX_CONNECTIONS.name,
                        value,
                        "a whole number of at least 1 (unset: sized from the file-descriptor limit)",
                    )
                })
        })
        .transpose()
}

/// `MAX_CONNECTIONS_PER_CLIENT` or `MAX_REQUESTS_IN_FLIGHT_PER_CLIENT`.
fn per_client_cap(env: &Env, var: Var) -> Result<PerClientCap, ConfigError> {
    let cap = env.get(var).map(|value| {
        PerClientCap::parse(value).ok_or_else(|| {
            ConfigError::invalid(
                var.name,
                value,
                "a whole number, 0 for no cap per client (unset: three quarters of MAX_CONNECTIONS)",
            )
        })
    });
    Ok(cap.transpose()?.unwrap_or_default())
}
