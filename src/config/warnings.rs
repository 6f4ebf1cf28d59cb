//! Warnings about variables that are set but change nothing: a name that looks like one of
//! ours but is not (`MAX_TOKEN`), and one of ours that this configuration never reads (`LIMIT`
//! with the token bucket, `REDIS_TIMEOUT_MS` without Redis). They do not stop startup:
//! `--check-config` prints them and the server logs each once.
//!
//! A warning names variables, never their values: a value may be a secret.
//!
//! A variable that is not read is still checked ([`check_unused`]): `AUTH_LIMIT=five` under a
//! token bucket is an error, as it would be under a window algorithm, so a malformed value is
//! not found only on the day the configuration starts reading it.

use super::env::Env;
use crate::algorithms::{Parameter, Policy};
use crate::suggest::edit_distance;
use crate::variables;

/// Prefixes of our variables: a name starting with one is a misspelling or a guess even when
/// no known name is close to it (`REDIS_HOST`).
const PREFIXES: &[&str] = &[
    "AUTH_",
    "REDIS_",
    "MAX_",
    "KEY_",
    "BACKEND_",
    "ADMIN_",
    "RATE_LIMIT_",
    "TOLLGATE_",
];

/// Ours, but read by libraries from the process environment, never by the parsers.
const READ_BY_LIBRARIES: &[&str] = &["RUST_LOG", "SSL_CERT_FILE", "SSL_CERT_DIR"];

/// Read only when one of `REDIS_ADDR`, `REDIS_URL`, `REDIS_CLUSTER_NODES` and `REDIS_SENTINELS`
/// selects Redis.
const REDIS_ONLY: &[&str] = &[
    "REDIS_PASSWORD",
    "REDIS_TLS",
    "KEY_PREFIX",
    "REDIS_TIMEOUT_MS",
    "REDIS_LEASES",
    "REDIS_LEASE_HOT",
    "FAIL_MODE",
    "AUTH_FAIL_MODE",
    "REDIS_BREAKER_THRESHOLD",
    "REDIS_PROBE_INTERVAL_MS",
];

/// Read only when `REDIS_SENTINELS` selects Redis Sentinel.
const SENTINEL_ONLY: &[&str] = &["REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_PASSWORD"];

/// The algorithm of a rule whose `ALGORITHM` (or `AUTH_ALGORITHM`) is unset.
const DEFAULT_ALGORITHM: &str = match crate::variables::ALGORITHM.default {
    Some(algorithm) => algorithm,
    None => "",
};

/// One line per suspicious variable, sorted by name. Call after a successful parse, when every
/// name this configuration reads has been read.
pub(crate) fn warnings(env: &Env) -> Vec<String> {
    let read = env.read_names();
    env.set_names()
        .into_iter()
        .filter_map(|name| {
            if !variables::is_known(name) {
                unknown(env, name)
            } else if read.contains(name) || READ_BY_LIBRARIES.contains(&name) {
                None
            } else {
                Some(unused(env, name))
            }
        })
        .collect()
}

/// Check each of our variables that is set but was not read by parsing it as a configuration
/// that reads it would: `parse` is handed the variable, a `BACKEND_URL`, and what makes it
/// read (`REDIS_ADDR` for a Redis setting, an `ALGORITHM` for a rule's number). A rule number
/// several algorithms read is well-formed if one of them takes it. Call after a successful
/// parse of `env`.
pub(crate) fn check_unused(
    env: &Env,
    parse: impl Fn(Vec<(&str, &str)>) -> Result<(), super::ConfigError>,
) -> Result<(), super::ConfigError> {
    let read = env.read_names();
    let unused = env.set_names().into_iter().filter(|name| {
        variables::is_known(name) && !read.contains(name) && !READ_BY_LIBRARIES.contains(name)
    });
    for name in unused {
        let value = env.peek(name).unwrap_or_default();
        // A valid backend: only `name` can be wrong.
        let base = [("BACKEND_URL", "http://127.0.0.1:1"), (name, value)];
        let readers: Vec<Vec<(&str, &str)>> = if let Some(readers) = algorithms_reading(name) {
            readers
        } else if REDIS_ONLY.contains(&name) || name == "REDIS_CALLS_IN_FLIGHT" {
            vec![vec![("REDIS_ADDR", "127.0.0.1:6379")]]
        } else if name == "STATE_SAVE_INTERVAL_S" {
            vec![vec![("STATE_FILE", "tollgate.state")]]
        } else {
            // Nothing else goes unread; if something does, it has no check of its own here.
            continue;
        };
        let mut first_error = None;
        for selectors in readers {
            match parse(base.iter().copied().chain(selectors).collect()) {
                Ok(()) => {
                    first_error = None;
                    break;
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
    }
    Ok(())
}

/// For a rule number (`LIMIT`, `AUTH_MAX_TOKENS`, ...): the `ALGORITHM` (or `AUTH_ALGORITHM`)
/// settings under which it is read, one per algorithm that reads it.
fn algorithms_reading(name: &str) -> Option<Vec<Vec<(&'static str, &'static str)>>> {
    let mut readers = Vec::new();
    for algorithm in Policy::NAMES {
        for parameter in Policy::parameters(algorithm).into_iter().flatten() {
            if parameter.general.name == name {
                readers.push(vec![("ALGORITHM", *algorithm)]);
            } else if parameter.auth.name == name {
                readers.push(vec![("AUTH_ALGORITHM", *algorithm)]);
            }
        }
    }
    (!readers.is_empty()).then_some(readers)
}

/// A name that is not ours: a warning if it looks like ours, with the nearest known name.
fn unknown(env: &Env, name: &str) -> Option<String> {
    if is_service_link(env, name) {
        return None;
    }
    // Names are case-sensitive (`port` is not `PORT`), and `TOLLGATE_PORT` is a guess at `PORT`.
    let upper = name.to_ascii_uppercase();
    let stem = upper.strip_prefix("TOLLGATE_").unwrap_or(&upper);
    let nearest = variables::NAMES
        .iter()
        .filter_map(|known| Some((typos(stem, known)?, known)))
        .min_by_key(|(typos, _)| *typos);
    match nearest {
        Some((_, known)) => Some(format!(
            "{name} is not a tollgate variable; did you mean {known}?"
        )),
        None if PREFIXES.iter().any(|prefix| upper.starts_with(prefix)) => {
            Some(format!("{name} is not a tollgate variable (see .env.example)"))
        }
        None => None,
    }
}

/// How many typos away from the `known` name `name` is, if it is close enough to be taken for
/// it: two typos at most, one in the short names (where two would take `HOST` for `PORT`).
/// Leaving out the unit (`SHUTDOWN_TIMEOUT` for `SHUTDOWN_TIMEOUT_MS`) counts as one.
fn typos(name: &str, known: &str) -> Option<usize> {
    let allowed = if known.len() < 6 { 1 } else { 2 };
    let without_unit = known.strip_suffix("_MS").map(|stem| (stem, 1));
    [(known, 0)]
        .into_iter()
        .chain(without_unit)
        .filter(|(known, _)| known.len().abs_diff(name.len()) <= allowed)
        .map(|(known, left_out)| edit_distance(name, known) + left_out)
        .filter(|typos| *typos <= allowed)
        .min()
}

/// Kubernetes describes every Service of the namespace to every pod (`REDIS_SERVICE_HOST`,
/// `REDIS_PORT=tcp://10.0.0.11:6379`, `REDIS_PORT_6379_TCP_ADDR`, ...), as Docker links did: a
/// Service named `redis` or `tollgate` must not make each pod warn.
fn is_service_link(env: &Env, name: &str) -> bool {
    name.contains("_SERVICE_HOST")
        || name.contains("_SERVICE_PORT")
        || name
            .split_once("_PORT_")
            .is_some_and(|(_, rest)| rest.starts_with(|c: char| c.is_ascii_digit()))
        || (name.ends_with("_PORT")
            && env.peek(name).is_some_and(|value| {
                ["tcp://", "udp://", "sctp://"]
                    .iter()
                    .any(|scheme| value.starts_with(scheme))
            }))
}

/// One of ours, set but not read: say what this configuration reads instead.
fn unused(env: &Env, name: &str) -> String {
    if let Some(why) = algorithm_reads_others(env, name) {
        return format!("{name} is set but not used: {why}");
    }
    let redis = [
        "REDIS_ADDR",
        "REDIS_URL",
        "REDIS_CLUSTER_NODES",
        "REDIS_SENTINELS",
    ];
    if REDIS_ONLY.contains(&name) && !redis.iter().any(|selector| env.peek(selector).is_some()) {
        return format!(
            "{name} is set but not used: the store is in memory; Redis settings apply once \
             REDIS_ADDR, REDIS_URL, REDIS_CLUSTER_NODES or REDIS_SENTINELS is set"
        );
    }
    if name == "STATE_SAVE_INTERVAL_S" {
        return format!("{name} is set but not used: it goes with STATE_FILE");
    }
    if SENTINEL_ONLY.contains(&name) {
        return format!("{name} is set but not used: it goes with REDIS_SENTINELS");
    }
    format!("{name} is set but not used with this configuration (see .env.example)")
}

/// For a rule parameter (`LIMIT`, `AUTH_MAX_TOKENS`, ...): the algorithm its rule uses, what
/// that one reads, and which algorithms read `name`. Algorithm names are safe to show: the
/// configuration parsed, so they are valid names.
fn algorithm_reads_others(env: &Env, name: &str) -> Option<String> {
    let variable = |p: &Parameter, auth: bool| if auth { p.auth.name } else { p.general.name };
    let readers = |auth: bool| -> Vec<&str> {
        Policy::NAMES
            .iter()
            .copied()
            .filter(|algorithm| {
                Policy::parameters(algorithm).is_some_and(|ps| ps.iter().any(|p| variable(p, auth) == name))
            })
            .collect()
    };
    let auth = match (readers(false).is_empty(), readers(true).is_empty()) {
        (false, _) => false,
        (true, false) => true,
        (true, true) => return None,
    };
    let (general, auth_algorithm) = (env.peek("ALGORITHM"), env.peek("AUTH_ALGORITHM"));
    let (chosen, algorithm) = match (auth, auth_algorithm, general) {
        (false, _, Some(algorithm)) => (format!("ALGORITHM={algorithm}"), algorithm),
        (true, Some(algorithm), _) => (format!("AUTH_ALGORITHM={algorithm}"), algorithm),
        (true, None, Some(algorithm)) => (
            format!("AUTH_ALGORITHM defaults to ALGORITHM={algorithm}, which"),
            algorithm,
        ),
        (false, _, None) | (true, None, None) => (
            format!(
                "{}={DEFAULT_ALGORITHM} (the default)",
                if auth { "AUTH_ALGORITHM" } else { "ALGORITHM" }
            ),
            DEFAULT_ALGORITHM,
        ),
    };
    let [first, second] = Policy::parameters(algorithm)?.map(|p| variable(&p, auth));
    let readers = readers(auth);
    let readers = match readers.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => readers.join(""),
    };
    Some(format!(
        "{chosen} reads {first} and {second} ({name} is for {readers})"
    ))
}
