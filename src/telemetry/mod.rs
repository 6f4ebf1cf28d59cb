//! Logging: `tracing` events to stdout as text or JSON lines, level from `RUST_LOG`
//! (default `info`; `debug` adds one line per request). An invalid `RUST_LOG` is an error, not
//! a silent fallback: a filter that quietly logs less than asked for hides the 3 a.m. clue.
//! Lines that a flood could repeat go through a [`throttle::LogThrottle`].

pub mod throttle;

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `RUST_LOG` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    /// Not `tracing` EnvFilter directives.
    #[error(
        "RUST_LOG={value:?} is invalid: {reason} (expected EnvFilter directives such as info or info,tollgate=debug)"
    )]
    InvalidFilter {
        /// The value as given.
        value: String,
        /// What the filter parser objected to.
        reason: String,
    },
    /// Not UTF-8, so not directives either.
    #[error("RUST_LOG is invalid: it is not UTF-8")]
    NotUnicode,
}

/// The log filter from `RUST_LOG` in the process environment (after `.env` is loaded).
pub fn filter_from_env() -> Result<EnvFilter, TelemetryError> {
    filter(std::env::var_os(EnvFilter::DEFAULT_ENV).as_deref())
}

/// The log filter for a `RUST_LOG` of `value`: `info` when unset or empty (an empty value
/// counts as unset, as for every variable), an error when it does not parse.
pub fn filter(value: Option<&OsStr>) -> Result<EnvFilter, TelemetryError> {
    let value = match value.map(OsStr::to_str) {
        None => "",
        Some(None) => return Err(TelemetryError::NotUnicode),
        Some(Some(value)) => value.trim(),
    };
    if value.is_empty() {
        return Ok(EnvFilter::new("info"));
    }
    EnvFilter::builder()
        .parse(value)
        .map_err(|error| TelemetryError::InvalidFilter {
            value: value.to_owned(),
            reason: error.to_string(),
        })
}

/// Install the global subscriber. Call once, before serving; fails (installing nothing) when
/// `RUST_LOG` is invalid.
pub fn init(format: LogFormat) -> Result<(), TelemetryError> {
    let filter = filter_from_env()?;
    // Colour only for a person at a terminal, never into files or `docker logs`.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_rust_log_is_info_and_a_bad_one_is_an_error_naming_it() {
        for unset in [None, Some(OsStr::new("")), Some(OsStr::new("  "))] {
            assert_eq!(filter(unset).unwrap().to_string(), "info");
        }
        assert_eq!(
            filter(Some(OsStr::new("warn,tollgate=debug")))
                .unwrap()
                .to_string(),
            "tollgate=debug,warn"
        );
        let error = filter(Some(OsStr::new("info,foo=loud"))).unwrap_err().to_string();
        assert!(
            error.starts_with(r#"RUST_LOG="info,foo=loud" is invalid: "#),
            "{error}"
        );
    }
}
