//! Logging: `tracing` events to stdout as text or JSON lines, level from `RUST_LOG`
//! (default `info`; `debug` adds one line per request).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Install the global subscriber. Call once, before serving.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
