//! The log's settings (`LOG_FORMAT`), into [`LogSettings`]. `RUST_LOG` is the log filter's own
//! (see [`crate::telemetry`]).

use super::ConfigError;
use super::env::Env;
use crate::telemetry::{LogFormat, LogSettings};
use crate::variables as vars;

/// The log's settings.
pub(crate) fn parse(env: &Env) -> Result<LogSettings, ConfigError> {
    let format = env.parse(vars::LOG_FORMAT, "text or json", |s| match s {
        "text" => Some(LogFormat::Text),
        "json" => Some(LogFormat::Json),
        _ => None,
    })?;
    Ok(LogSettings { format })
}
