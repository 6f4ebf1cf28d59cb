//! Logging: `tracing` events to stdout as text or JSON lines, level from `RUST_LOG`
//! (default `info`; `debug` adds one line per request). An invalid `RUST_LOG` is an error, not
//! a silent fallback: a filter that quietly logs less than asked for hides the 3 a.m. clue.
//! EnvFilter takes a bare word that is not a level as a target (`RUST_LOG=warning` logs only
//! a target called `warning`, which is nothing), so a bare word must be a level or one of our
//! targets (`tollgate`, `tollgate::proxy`); another crate's target is written with its level
//! (`hyper=trace`).
//! Lines that a flood could repeat go through a [`throttle::LogThrottle`].
//! Traces (OpenTelemetry, over OTLP) are [`trace`]'s.

pub(crate) mod throttle;
pub(crate) mod trace;

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The log's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogSettings {
    /// `LOG_FORMAT`.
    pub format: LogFormat,
}

/// How log lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
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
    /// A bare word that is neither a level nor one of our targets: EnvFilter would take it
    /// for a target and silence every line.
    #[error(
        "RUST_LOG={value:?} is invalid: {directive:?} is neither a level nor a tollgate target, so every log line would be silenced; {hint}"
    )]
    NotALevel {
        /// The value as given.
        value: String,
        /// The bare word.
        directive: String,
        /// The likely level, or how to write a target.
        hint: String,
    },
    /// Not UTF-8, so not directives either.
    #[error("RUST_LOG is invalid: it is not UTF-8")]
    NotUnicode,
}

/// The log filter from `RUST_LOG` in the process environment (after `.env` is loaded).
pub(crate) fn filter_from_env() -> Result<EnvFilter, TelemetryError> {
    filter(std::env::var_os(EnvFilter::DEFAULT_ENV).as_deref())
}

/// The log filter for a `RUST_LOG` of `value`: `info` when unset or empty (an empty value
/// counts as unset, as for every variable), an error when it does not parse.
pub(crate) fn filter(value: Option<&OsStr>) -> Result<EnvFilter, TelemetryError> {
    let value = match value.map(OsStr::to_str) {
        None => "",
        Some(None) => return Err(TelemetryError::NotUnicode),
        Some(Some(value)) => value.trim(),
    };
    if value.is_empty() {
        return Ok(EnvFilter::new("info"));
    }
    if let Some(directive) = value
        .split(',')
        .map(str::trim)
        .find(|d| !names_a_level_or_ours(d))
    {
        return Err(TelemetryError::NotALevel {
            value: value.to_owned(),
            directive: directive.to_owned(),
            hint: match likely_level(directive) {
                Some(level) => format!("did you mean {level}?"),
                None => format!(
                    "expected a level (off, error, warn, info, debug, trace), or {directive}=LEVEL to log that target"
                ),
            },
        });
    }
    EnvFilter::builder()
        .parse(value)
        .map_err(|error| TelemetryError::InvalidFilter {
            value: value.to_owned(),
            reason: error.to_string(),
        })
}

/// The levels EnvFilter knows, most severe first.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// A directive with a level (`hyper=warn`), a span or field filter (`[request]`), a level alone
/// (`info`, any case, or its number `0` to `5`), or a bare target of ours (`tollgate`,
/// `tollgate::proxy`, which log everything of ours). Empty entries are skipped by the parser.
fn names_a_level_or_ours(directive: &str) -> bool {
    directive.is_empty()
        || directive.contains(['=', '['])
        || directive
            .parse::<tracing_subscriber::filter::LevelFilter>()
            .is_ok()
        || directive == "tollgate"
        || directive.starts_with("tollgate::")
}

/// The level a mistyped bare word most likely meant: one it starts with or that starts with it
/// (`warning`, `err`), or one a typo away (`debugg`, `inof`; one typo in the short ones, where
/// two would take `foo` for `off`).
fn likely_level(word: &str) -> Option<&'static str> {
    let word = word.to_ascii_lowercase();
    if word.len() < 3 {
        return None;
    }
    let near = |level: &&str| {
        let allowed = if level.len() < 5 { 1 } else { 2 };
        crate::suggest::edit_distance(&word, level) <= allowed
    };
    LEVELS
        .iter()
        .copied()
        .find(|level| word.starts_with(level) || level.starts_with(&*word))
        .or_else(|| LEVELS.iter().copied().find(near))
}

/// Check `RUST_LOG` in the process environment (after `.env` is loaded), as
/// [`init_logging`] reads it, without installing anything (`tollgate --check-config`).
pub fn check_log_filter() -> Result<(), TelemetryError> {
    filter_from_env().map(drop)
}

/// Install the global subscriber of `config` (`LOG_FORMAT`, `RUST_LOG`). Call once, before
/// serving; fails (installing nothing) when `RUST_LOG` is invalid.
pub fn init_logging(config: &crate::Config) -> Result<(), TelemetryError> {
    init(config.log.format)
}

/// Install the global subscriber. Call once, before serving; fails (installing nothing) when
/// `RUST_LOG` is invalid.
pub(crate) fn init(format: LogFormat) -> Result<(), TelemetryError> {
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

    #[test]
    fn a_bare_word_that_is_no_level_and_no_target_of_ours_is_an_error_with_the_likely_level() {
        for (value, level) in [
            ("warning", "warn"),
            ("debugg", "debug"),
            ("tollgate=debug,inof", "info"),
            ("Err", "error"),
            ("tarce", "trace"),
        ] {
            let error = filter(Some(OsStr::new(value))).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("RUST_LOG={value:?} is invalid: ")),
                "{error}"
            );
            assert!(error.ends_with(&format!("did you mean {level}?")), "{error}");
        }
        let error = filter(Some(OsStr::new("hyper"))).unwrap_err().to_string();
        assert!(error.contains("or hyper=LEVEL to log that target"), "{error}");
        for valid in [
            "info",
            "WARN",
            "3",
            "tollgate=debug,hyper=warn",
            "warn,tollgate::proxy=trace",
            "tollgate",
            "tollgate::limit,warn",
            "info,[request]=debug",
            "info,",
        ] {
            assert!(filter(Some(OsStr::new(valid))).is_ok(), "{valid}");
        }
    }
}
