//! The admin listener's settings (`ADMIN_BIND`, `ADMIN_PORT`, `ADMIN_TOKEN`), into
//! [`AdminSettings`]; and where `tollgate healthcheck` finds it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::ConfigError;
use super::decide::bearer_token;
use super::env::Env;
use crate::admin::AdminSettings;
use crate::variables as vars;

/// The admin listener's settings, on `address` (checked against the other listeners' by
/// [`super::server::addresses`]).
pub(crate) fn parse(env: &Env, address: SocketAddr) -> Result<AdminSettings, ConfigError> {
    Ok(AdminSettings {
        address,
        token: bearer_token(env, vars::ADMIN_TOKEN)?,
    })
}

/// Where the admin listener is, as the server would bind it: `ADMIN_BIND` (default
/// `127.0.0.1`) and `ADMIN_PORT` (default 9091), with an unspecified address (`0.0.0.0`, `::`)
/// replaced by loopback of the same family, which the listener answers on too.
pub(crate) fn admin_address(env: &Env) -> Result<SocketAddr, String> {
    let invalid = |var: &str, value: &str| format!("{var}={value:?} is invalid");
    let bind = env.value(vars::ADMIN_BIND);
    let ip: IpAddr = bind.parse().map_err(|_| invalid("ADMIN_BIND", bind))?;
    let port = env.value(vars::ADMIN_PORT);
    let port: u16 = port.parse().map_err(|_| invalid("ADMIN_PORT", port))?;
    let ip = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, port))
}
