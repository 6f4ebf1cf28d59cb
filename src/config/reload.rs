//! The rule table's reloads: `RULES_FILE`, `OVERRIDES_FILE` and `RLS_CONFIG`, read again on
//! SIGHUP and every `RULES_RELOAD_INTERVAL_MS`; the settings the watcher is built from, and
//! what a reload read.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::env::{self, Env};
use super::overrides::OverridesFile;
use super::{ConfigError, VARIABLES, rules_file};
use crate::rls::DescriptorTable;
use crate::variables as vars;

/// `RULES_FILE` and `OVERRIDES_FILE`: the files the rule table is reloaded from.
#[derive(Clone)]
pub(crate) struct ReloadSettings {
    /// `RULES_FILE`, if set.
    pub(crate) rules_file: Option<String>,
    /// `OVERRIDES_FILE`, if set.
    pub(crate) overrides_file: Option<String>,
    /// `RLS_CONFIG`, if set: Envoy's descriptors reload with the rules.
    pub(crate) rls_config: Option<String>,
    /// `RULES_RELOAD_INTERVAL_MS`: how often they are read for changes; `None`: on SIGHUP only.
    pub(crate) interval: Option<Duration>,
    /// The environment the configuration was read from (the rules file's settings not
    /// added): a reload reads the files again beside it.
    pub(crate) environment: Arc<Vec<(String, String)>>,
    /// The files' bytes this configuration was built from: the watcher reloads when they
    /// change.
    pub(crate) loaded: Loaded,
    /// What `.env` set when this configuration was read ([`read_dot_env`]).
    pub(crate) dot_env: Arc<Vec<(String, String)>>,
}

/// What a reload read: the rule table to put in force, what it was built from, and Envoy's
/// descriptors (their rules in the table).
pub(crate) struct Reloaded {
    /// The rule table, `RLS_CONFIG`'s rules included.
    pub(crate) rules: crate::rules::RuleTable,
    /// The files' bytes.
    pub(crate) loaded: Loaded,
    /// `RLS_CONFIG`'s descriptors, when it is set.
    pub(crate) rls: Option<Arc<DescriptorTable>>,
}

/// The bytes of the files a rule table was built from (empty for a file not set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// `RULES_FILE`'s.
    pub(crate) rules: Arc<Vec<u8>>,
    /// `OVERRIDES_FILE`'s.
    pub(crate) overrides: Arc<Vec<u8>>,
    /// `RLS_CONFIG`'s files, each with its name ([`DescriptorTable::snapshot`]).
    pub(crate) rls: Arc<Vec<u8>>,
}

impl ReloadSettings {
    /// The files, as logs name them: `rules.toml,overrides.txt`.
    pub(crate) fn files(&self) -> String {
        let files: Vec<&str> = [&self.rules_file, &self.overrides_file, &self.rls_config]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        files.join(",")
    }

    /// Read the files as they are now (bounded as at start); `None` when one cannot be read.
    pub(crate) fn read(&self) -> Option<Loaded> {
        let read = |path: &Option<String>| match path {
            Some(path) => rules_file::read_bounded(path).ok().map(Arc::new),
            None => Some(Arc::default()),
        };
        let rls = match &self.rls_config {
            Some(path) => Arc::new(DescriptorTable::snapshot(Path::new(path))?),
            None => Arc::default(),
        };
        Some(Loaded {
            rules: read(&self.rules_file)?,
            overrides: read(&self.overrides_file)?,
            rls,
        })
    }
}
/// The tollgate variables `.env` in the working directory sets now (none when it is missing or
/// unreadable), for the warning about changes a reload does not apply.
pub(crate) fn read_dot_env() -> Vec<(String, String)> {
    let Ok(entries) = dotenvy::from_path_iter(".env") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|(name, _)| VARIABLES.contains(&name.as_str()))
        .collect()
}

impl fmt::Debug for ReloadSettings {
    // The environment holds secrets: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadSettings")
            .field("rules_file", &self.rules_file)
            .field("overrides_file", &self.overrides_file)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// The reload settings: `None` unless `RULES_FILE`, `OVERRIDES_FILE` or `RLS_CONFIG` is set.
/// The environment and the rules file's bytes are filled in by the caller, which has them.
pub(crate) fn parse(
    env: &Env,
    overrides_file: Option<&OverridesFile>,
) -> Result<Option<ReloadSettings>, ConfigError> {
    let interval = env.parse(
        vars::RULES_RELOAD_INTERVAL_MS,
        "a whole number of milliseconds, 0 (on SIGHUP only) to 31536000000 (a year)",
        |s| {
            s.parse::<u64>()
                .ok()
                .filter(|ms| *ms <= env::MAX_MILLIS)
                .map(Duration::from_millis)
        },
    )?;
    let rls_config = env.get(vars::RLS_CONFIG).map(str::to_owned);
    let reloads = env.is_set(vars::RULES_FILE) || overrides_file.is_some() || rls_config.is_some();
    if !reloads {
        return Ok(None);
    }
    // Read after the table was (a change between the two is one more reload).
    let rls = rls_config
        .as_deref()
        .and_then(|path| DescriptorTable::snapshot(Path::new(path)))
        .map(Arc::new)
        .unwrap_or_default();
    Ok(Some(ReloadSettings {
        rules_file: env.get(vars::RULES_FILE).map(str::to_owned),
        overrides_file: overrides_file.map(|file| file.path.clone()),
        rls_config,
        interval: (!interval.is_zero()).then_some(interval),
        environment: Arc::default(),
        loaded: Loaded {
            rules: Arc::default(),
            overrides: overrides_file.map(|file| file.bytes.clone()).unwrap_or_default(),
            rls,
        },
        dot_env: Arc::default(),
    }))
}
