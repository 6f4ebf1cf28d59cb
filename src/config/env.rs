//! The reader of named variables: the environment as a map of strings, read one name at a
//! time, remembering every name it was asked for (so a later check can tell which variables
//! that look like ours were never read).
//!
//! Values are trimmed and an empty value (`FOO=`) counts as unset. Nothing here knows what a
//! variable means; the parsers in [`super`] turn strings into settings and name the variable
//! in every error.

use crate::variables::Var;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use super::ConfigError;

/// The longest duration a `*_MS` setting takes: a year. Longer is no timeout in practice, and
/// deadlines computed from it must not overflow the clock.
pub(crate) const MAX_MILLIS: u64 = 365 * 24 * 3600 * 1000;

/// The variables, and the names read so far.
#[derive(Debug, Default)]
pub(crate) struct Env {
    vars: HashMap<String, String>,
    read: RefCell<BTreeSet<&'static str>>,
    /// A reload's: the header-key hasher the running table digests with, kept when
    /// `KEY_HASH_SECRET` is unset (a fresh random one would give every client a new key).
    inherited_hasher: Option<crate::rules::KeyHasher>,
    /// A rules file's `[[routes]]`, read there: the routes in place of `ROUTES`.
    file_routes: Option<Vec<super::spec::RouteEntry>>,
}

impl Env {
    /// From `NAME=value` pairs; later pairs win, as in a shell.
    pub(crate) fn new<I, K, V>(vars: I) -> Env
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let vars = vars
            .into_iter()
            .map(|(name, value)| (name.into(), value.into().trim().to_owned()))
            .filter(|(_, value)| !value.is_empty())
            .collect();
        Env {
            vars,
            read: RefCell::default(),
            inherited_hasher: None,
            file_routes: None,
        }
    }

    /// This environment, digesting keys with `hasher` unless `KEY_HASH_SECRET` says otherwise.
    pub(crate) fn inheriting(mut self, hasher: Option<crate::rules::KeyHasher>) -> Env {
        self.inherited_hasher = hasher;
        self
    }

    /// This environment with a rules file's routes (`None` when it has none), which take the
    /// place of `ROUTES`.
    pub(crate) fn with_routes(mut self, routes: Option<Vec<super::spec::RouteEntry>>) -> Env {
        self.file_routes = routes;
        self
    }

    /// A rules file's routes, if it has any.
    pub(crate) fn file_routes(&self) -> Option<&[super::spec::RouteEntry]> {
        self.file_routes.as_deref()
    }

    /// The hasher a reload keeps, if this is a reload's environment.
    pub(crate) fn inherited_hasher(&self) -> Option<&crate::rules::KeyHasher> {
        self.inherited_hasher.as_ref()
    }

    /// The trimmed value of `var`, if set and not empty.
    pub(crate) fn get(&self, var: Var) -> Option<&str> {
        self.read.borrow_mut().insert(var.name);
        self.vars.get(var.name).map(String::as_str)
    }

    /// The value of `var`, or its default (empty for one without).
    pub(crate) fn value(&self, var: Var) -> &str {
        self.get(var).or(var.default).unwrap_or_default()
    }

    /// True when `var` is set (recorded as read).
    pub(crate) fn is_set(&self, var: Var) -> bool {
        self.get(var).is_some()
    }

    /// Every name asked for so far.
    pub(crate) fn read_names(&self) -> BTreeSet<&'static str> {
        self.read.borrow().clone()
    }

    /// The names of every variable that is set (not empty), sorted; none is recorded as read.
    pub(crate) fn set_names(&self) -> BTreeSet<&str> {
        self.vars.keys().map(String::as_str).collect()
    }

    /// The value of any variable, without recording it as read: for the checks that look at
    /// the variables no parser asked for.
    pub(crate) fn peek(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// Parse `var` (or its default when unset) with `parse`; `None` from it is an error naming
    /// the variable and the value, saying what is `expected`.
    pub(crate) fn parse<T>(
        &self,
        var: Var,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, ConfigError> {
        self.parse_or(var, var.default.unwrap_or_default(), expected, parse)
    }

    /// [`Env::parse`] of a variable whose default is worked out from others (`default`).
    pub(crate) fn parse_or<T>(
        &self,
        var: Var,
        default: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, ConfigError> {
        let value = self.get(var).unwrap_or(default);
        parse(value).ok_or_else(|| ConfigError::invalid(var.name, value, expected))
    }

    /// A duration in whole milliseconds, at least 1 and at most [`MAX_MILLIS`].
    pub(crate) fn millis(&self, var: Var) -> Result<Duration, ConfigError> {
        self.millis_or(var, var.default.unwrap_or_default())
    }

    /// [`Env::millis`] of a variable whose default is worked out from others (`default`).
    pub(crate) fn millis_or(&self, var: Var, default: &str) -> Result<Duration, ConfigError> {
        self.parse_or(
            var,
            default,
            "a whole number of milliseconds, at least 1 and at most 31536000000 (a year)",
            |s| {
                s.parse::<u64>()
                    .ok()
                    .filter(|ms| (1..=MAX_MILLIS).contains(ms))
                    .map(Duration::from_millis)
            },
        )
    }

    /// `true` or `false`.
    pub(crate) fn flag(&self, var: Var) -> Result<bool, ConfigError> {
        self.parse(var, "true or false", |s| match s {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        })
    }
}

/// Entries of a list variable split on any of `separators`, trimmed, empty ones skipped.
pub(crate) fn entries<'a>(value: &'a str, separators: &'a [char]) -> impl Iterator<Item = &'a str> {
    value
        .split(separators)
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_every_name_read_and_treats_empty_as_unset() {
        let env = Env::new([("PORT", " 81 "), ("BIND", "  ")]);
        assert_eq!(env.get(crate::variables::PORT), Some("81"));
        assert_eq!(env.get(crate::variables::BIND), None);
        assert!(!env.is_set(crate::variables::LIMIT));
        assert_eq!(
            env.read_names().into_iter().collect::<Vec<_>>(),
            ["BIND", "LIMIT", "PORT"]
        );
    }

    #[test]
    fn set_names_and_peek_record_nothing() {
        let env = Env::new([("PORT", "81"), ("BIND", ""), ("MAX_TOKEN", "5")]);
        assert_eq!(
            env.set_names().into_iter().collect::<Vec<_>>(),
            ["MAX_TOKEN", "PORT"]
        );
        assert_eq!(env.peek("MAX_TOKEN"), Some("5"));
        assert!(env.read_names().is_empty());
    }
}
