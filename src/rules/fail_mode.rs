//! What a rule does with its requests when its store cannot decide: `FAIL_MODE`,
//! `AUTH_FAIL_MODE`, a route's `fail=`. A setting of the rule (the rule table holds it); the
//! guard in `stores` acts on it.

/// What to do with a request when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Forward it unlimited (`FAIL_MODE=open`, the default): Redis trouble never blocks users.
    Open,
    /// Refuse it with 503 (`FAIL_MODE=closed`): the backend is never unprotected.
    Closed,
    /// Decide it with this replica's own memory store (`FAIL_MODE=local`).
    Local,
}

impl FailMode {
    /// Every mode, as written.
    pub const NAMES: &'static str = "open, closed or local";

    /// `open`, `closed` or `local`.
    pub fn parse(value: &str) -> Option<FailMode> {
        match value {
            "open" => Some(FailMode::Open),
            "closed" => Some(FailMode::Closed),
            "local" => Some(FailMode::Local),
            _ => None,
        }
    }

    /// What happens to a request the store cannot decide, for log lines.
    pub(crate) fn effect(self) -> &'static str {
        match self {
            FailMode::Open => "forwarded without limiting",
            FailMode::Closed => "refused with 503",
            FailMode::Local => "limited by this replica alone",
        }
    }

    /// The value as written in `FAIL_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}
