//! The reverse proxy's settings: `BACKEND_URL` (and its TLS), the backend's and the request
//! body's clocks, the headers forwarded or not, upgrades and CORS, into [`ProxySettings`].

use std::path::PathBuf;
use std::time::Duration;

use http::uri::{Authority, Scheme, Uri};

use super::answers::Answers;
use super::env::{self, Env};
use super::{ConfigError, DEFAULT_BODY_MIN_RATE_WINDOW};
use crate::proxy::body::MinRate;
use crate::proxy::cors::Cors;
use crate::proxy::headers::{MethodOverride, UnderscoreHeaders};
use crate::proxy::tls::{self, BackendTls};
use crate::proxy::upgrades::UpgradeProtocols;
use crate::proxy::{Backend, ProxySettings};
use crate::variables as vars;

/// The proxy's settings, answering with `answers`; `None` when tollgate does not proxy
/// (`proxied` false: `DECIDE_PORT` without `BACKEND_URL`). The other variables are read (and
/// checked) either way.
pub(crate) fn parse(
    env: &Env,
    proxied: bool,
    answers: Answers,
) -> Result<Option<ProxySettings>, ConfigError> {
    let backend = proxied.then(|| backend(env)).transpose()?;
    let response_cost_header = env
        .get(vars::RESPONSE_COST_HEADER)
        .map(|name| {
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    vars::RESPONSE_COST_HEADER.name,
                    name,
                    "a header name, such as X-Tokens-Used",
                )
            })
        })
        .transpose()?;
    let backend_timeout = env.millis(vars::BACKEND_TIMEOUT_MS)?;
    let backend_idle_timeout = env.millis(vars::BACKEND_IDLE_TIMEOUT_MS)?;
    let body_idle_timeout = env.millis(vars::BODY_IDLE_TIMEOUT_MS)?;
    let body_min_rate = body_min_rate(env, body_idle_timeout)?;
    let upgrade_protocols = {
        let value = env.value(vars::UPGRADE_PROTOCOLS);
        UpgradeProtocols::parse(value)
            .map_err(|error| ConfigError::invalid(vars::UPGRADE_PROTOCOLS.name, value, &error.to_string()))?
    };
    let underscore_headers = env.parse(
        vars::UNDERSCORE_HEADERS,
        "drop (not forwarded, as nginx does) or forward",
        UnderscoreHeaders::parse,
    )?;
    let method_override = env.parse(
        vars::METHOD_OVERRIDE,
        "meter (forwarded, and counted as the method it names too) or strip (removed)",
        MethodOverride::parse,
    )?;
    let cors = {
        let value = env.value(vars::CORS_ALLOW_ORIGINS);
        Cors::parse(value)
            .map_err(|problem| ConfigError::invalid(vars::CORS_ALLOW_ORIGINS.name, value, &problem))?
    };
    let upgrade_idle_timeout = upgrade_idle_timeout(env)?;
    Ok(backend.map(|backend| ProxySettings {
        backend,
        headers: answers.headers,
        refusals: answers.refusals,
        forward_headers: answers.forward_headers,
        response_cost_header,
        access_log: answers.access_log,
        backend_timeout,
        backend_idle_timeout,
        body_idle_timeout,
        body_min_rate,
        upgrade_idle_timeout,
        upgrade_protocols,
        underscore_headers,
        method_override,
        cors,
    }))
}

/// `BODY_MIN_RATE`, and its window (`BODY_MIN_RATE_WINDOW_MS`) when there is a rate to check:
/// set with `BODY_MIN_RATE=0`, the window is warned about.
fn body_min_rate(env: &Env, body_idle_timeout: Duration) -> Result<Option<MinRate>, ConfigError> {
    let rate = env.parse(
        vars::BODY_MIN_RATE,
        "a whole number of bytes per second, 0 for no minimum",
        |s| s.parse::<u64>().ok(),
    )?;
    if rate == 0 {
        return Ok(None);
    }
    // A window shorter than the pause BODY_IDLE_TIMEOUT_MS allows would cut that pause (a
    // window of waiting with nothing in it): the default never is.
    let window = body_idle_timeout.max(DEFAULT_BODY_MIN_RATE_WINDOW);
    let window = env.millis_or(vars::BODY_MIN_RATE_WINDOW_MS, &window.as_millis().to_string())?;
    Ok(Some(MinRate::new(rate, window)))
}

/// `UPGRADE_IDLE_TIMEOUT_MS`; `None` (`0`): a tunnel is never closed for idling.
fn upgrade_idle_timeout(env: &Env) -> Result<Option<Duration>, ConfigError> {
    env.parse(
        vars::UPGRADE_IDLE_TIMEOUT_MS,
        "a whole number of milliseconds up to 31536000000 (a year), 0 for never",
        |s| {
            s.parse::<u64>()
                .ok()
                .filter(|ms| *ms <= env::MAX_MILLIS)
                .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
        },
    )
}

/// `BACKEND_URL`: an http or https URL without credentials or a query.
pub(crate) fn backend(env: &Env) -> Result<Backend, ConfigError> {
    let expected = "an http or https URL such as http://127.0.0.1:8000";
    let value = env.get(vars::BACKEND_URL).ok_or(ConfigError::Missing {
        var: vars::BACKEND_URL.name,
        expected: "where allowed requests go, e.g. http://127.0.0.1:8000 (unless DECIDE_PORT is set: a \
                   decision service alone needs no backend)",
    })?;
    let invalid = |expected: &str| ConfigError::invalid(vars::BACKEND_URL.name, value, expected);
    let uri: Uri = value.parse().map_err(|_| invalid(expected))?;
    let scheme = match uri.scheme() {
        Some(scheme) if *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS => scheme.clone(),
        _ => return Err(invalid(expected)),
    };
    let authority = uri.authority().cloned().ok_or_else(|| invalid(expected))?;
    if authority.as_str().contains('@') {
        return Err(invalid("a URL without user:password@"));
    }
    if uri.query().is_some() {
        return Err(invalid("a URL without a query string"));
    }
    // `Uri` takes any digits after the colon, and reads a port above 65535 as none at all (so
    // port 80); the port written must be the port used.
    let written_port = authority
        .as_str()
        .rsplit_once(':')
        .filter(|(_, port)| !port.contains(']'))
        .map(|(_, port)| port);
    if let Some(port) = written_port
        && !port.parse::<u16>().is_ok_and(|port| port > 0)
    {
        return Err(invalid("a port from 1 to 65535 after the host"));
    }
    let tls = match scheme == Scheme::HTTPS {
        true => Some(backend_tls(env, &authority)?),
        false => None,
    };
    Ok(Backend {
        scheme,
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        tls,
    })
}

/// `BACKEND_CA_FILE` and `BACKEND_TLS_SERVER_NAME`, read for an https `BACKEND_URL` only (set
/// for an http one, they are warned about as unread). The file is read when the proxy starts.
fn backend_tls(env: &Env, authority: &Authority) -> Result<BackendTls, ConfigError> {
    let server_name = match env.get(vars::BACKEND_TLS_SERVER_NAME) {
        Some(name) => tls::server_name(name).ok_or_else(|| {
            ConfigError::invalid(
                vars::BACKEND_TLS_SERVER_NAME.name,
                name,
                "a DNS name or IP address the backend's certificate is valid for",
            )
        })?,
        None => tls::server_name(authority.host()).ok_or_else(|| {
            ConfigError::invalid(
                vars::BACKEND_URL.name,
                authority.as_str(),
                "a host that is a DNS name or IP address (the TLS server name), or set \
                 BACKEND_TLS_SERVER_NAME",
            )
        })?,
    };
    Ok(BackendTls {
        ca_file: env.get(vars::BACKEND_CA_FILE).map(PathBuf::from),
        server_name,
    })
}
