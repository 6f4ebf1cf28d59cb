//! What the doors answer with, the same on the proxy and the decision endpoints:
//! `RATE_LIMIT_HEADERS`, `DENY_STATUS`, `DENY_FORMAT`, `FORWARD_RATELIMIT_HEADERS` and
//! `ACCESS_LOG`.

use super::ConfigError;
use super::env::Env;
use crate::limit_headers::HeaderStyle;
use crate::proxy::AccessLog;
use crate::refusal::{self, DenyFormat, Refusals};
use crate::variables as vars;

/// The doors' shared answer settings, handed to [`ProxySettings`](crate::proxy::ProxySettings)
/// and [`DecideSettings`](crate::decide::DecideSettings) alike.
#[derive(Debug, Clone)]
pub(crate) struct Answers {
    /// `RATE_LIMIT_HEADERS`.
    pub(crate) headers: HeaderStyle,
    /// `DENY_STATUS` and `DENY_FORMAT`.
    pub(crate) refusals: Refusals,
    /// `FORWARD_RATELIMIT_HEADERS`.
    pub(crate) forward_headers: bool,
    /// `ACCESS_LOG`.
    pub(crate) access_log: AccessLog,
}

/// The answer settings.
pub(crate) fn parse(env: &Env) -> Result<Answers, ConfigError> {
    let access_log = env.parse(vars::ACCESS_LOG, "off, denied or all", AccessLog::parse)?;
    let headers = env.parse(
        vars::RATE_LIMIT_HEADERS,
        "legacy, draft, both or none",
        HeaderStyle::parse,
    )?;
    let value = env.value(vars::DENY_STATUS);
    let status = refusal::parse_status(value)
        .map_err(|expected| ConfigError::invalid(vars::DENY_STATUS.name, value, &expected))?;
    let format = env.parse(vars::DENY_FORMAT, "json, problem or text", DenyFormat::parse)?;
    // RATE_LIMIT_HEADERS=none reveals nothing about the limits, the rule's name included.
    let refusals = Refusals::new(status, format, headers != HeaderStyle::None);
    Ok(Answers {
        headers,
        refusals,
        forward_headers: env.flag(vars::FORWARD_RATELIMIT_HEADERS)?,
        access_log,
    })
}
