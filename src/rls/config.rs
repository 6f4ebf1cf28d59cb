//! `RLS_CONFIG`: envoyproxy/ratelimit's descriptor configuration, read into a validated
//! [`DescriptorTable`].
//!
//! The format is that service's: one domain per file, a tree of `descriptors`, each a `key`,
//! an optional `value` (exact, or a wildcard when it holds `*`), an optional `rate_limit`
//! (`unit` and `requests_per_unit`, or `unlimited: true`; a `name`, and the `replaces` of other
//! limits' names), `shadow_mode`, `quota_mode`, `share_threshold` (a wildcard's values share
//! one budget), `metadata`, `detailed_metric`, `value_to_metric` and nested `descriptors`:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: /login
//!     descriptors:
//!       - key: remote_address
//!         rate_limit: { unit: minute, requests_per_unit: 5, name: login }
//! ```
//!
//! What that service refuses is refused here at startup, naming the file, the line and the
//! entry's path in the file (`descriptors[1].descriptors[0].rate_limit.unit`): an empty
//! domain or key, a unit it does not know, one key and value twice at one level, `unlimited`
//! beside a unit, a `replaces` naming the limit itself. Refused here although that service
//! lets them pass (each would silently do nothing): a key at a level where it means nothing
//! (with "did you mean" for a misspelling), `unlimited` beside `requests_per_unit`, a
//! `replaces` that names no limit of the domain, and two files with one domain unless
//! `RLS_MERGE_DOMAIN_CONFIG` merges them (as that service's `MERGE_DOMAIN_CONFIG`).
//!
//! tollgate extends `rate_limit` with two keys (a file without them means exactly what it means
//! to that service, and makes the same rules it always made):
//!
//! - `algorithm`: an algorithm's name (`Policy::spellings`: `token_bucket`, ...), with `unit` and
//!   `requests_per_unit` (both required, at least 1): that algorithm's numbers derived from
//!   them, read by `ROUTES`' parser. A token bucket holds `requests_per_unit` and refills
//!   `requests_per_unit` each unit (`token_bucket:N:N/S`, `S` the unit's seconds); a window
//!   algorithm allows `requests_per_unit` in each window of the unit (`ALGORITHM:N:S`).
//! - `limits`: a limit list in `ROUTES`' syntax, one string joined by `+` or a list of strings
//!   (`[token_bucket:20:10, fixed_window:10000:86400]`), every limit enforced.
//!
//! Refused, each naming its line: `limits` beside `unit`, `requests_per_unit` or `algorithm`
//! (the list says every number itself), `algorithm` without `unit` or `requests_per_unit`,
//! `unlimited` beside either, and whatever `ROUTES` refuses of the numbers.
//!
//! Each rate limit becomes one [`RuleSpec`] (a fixed window of its unit, or its policies), named
//! `rls/<domain>/<key>=<value>/<key>...` after its place in the tree, so the name is stable
//! across restarts: it is part of the Redis key and the metrics' `rule` label.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::yaml::{self, Node, Value};
use crate::algorithms::{Algorithm, FixedWindow, Limits, Policy, TokenBucket};
use crate::algorithms::{algorithm_names, parse_limit, parse_limits, policy_of};
use crate::rules::{FailMode, Matching, RuleSpec};
use crate::suggest::closest;

/// Most rate limits (so rules) all files may define: each is a rule with room for `MAX_KEYS`
/// clients in memory, and rule ids are 16 bits beside the `ROUTES`.
pub(crate) const MAX_LIMITS: usize = 1_000;

/// Most files a directory may hold.
const MAX_FILES: usize = 1_000;

/// Largest file read: a descriptor tree is a few kilobytes.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Rule name characters kept as they are; the rest are percent-encoded, so a name is one
/// Redis key part and one label value whatever a domain, key or value holds, and `/` and `=`
/// only ever separate.
const NAME_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'*');

/// The time unit of a limit, as envoyproxy/ratelimit names them (case-insensitive) and counts
/// them in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as that service counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    const NAMES: &'static str = "second, minute, hour, day, week, month or year";
    /// Every unit, shortest first.
    pub(crate) const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit called `name`, in any case.
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.as_str().eq_ignore_ascii_case(name))
    }

    /// The name, lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Its length: fixed windows are aligned to multiples of it since the Unix epoch, as that
    /// service aligns them (`now / unit`).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }
}

/// What a limit allows.
#[derive(Debug, Clone, PartialEq)]
pub enum Allowance {
    /// `unlimited: true`: answered OK, never counted.
    Unlimited,
    /// `requests_per_unit` in each `unit`: a fixed window, as envoyproxy/ratelimit counts.
    Rate {
        /// Requests (hits) allowed in each window.
        requests_per_unit: u32,
        /// The window.
        unit: Unit,
    },
    /// tollgate's extension: `algorithm` with `unit` and `requests_per_unit` (one policy of
    /// that algorithm), or a `limits` list (each its own algorithm and numbers, all enforced).
    Limits(Limits),
}

impl Allowance {
    /// Whether requests under it are counted (it is a rule): every allowance but `unlimited`.
    pub fn counted(&self) -> bool {
        !matches!(self, Allowance::Unlimited)
    }
}

/// One `rate_limit` of the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The rule's name (`rls/<domain>/...`), unique in the table: the Redis key part and the
    /// metrics label of its budgets.
    pub rule: Arc<str>,
    /// Unlimited, or the rate.
    pub allowance: Allowance,
    /// The limit's `name`, what `replaces` refers to and the answer's `current_limit.name`.
    pub name: Option<String>,
    /// The names of the limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, but always answered OK.
    pub shadow: bool,
    /// `quota_mode`: over its limit, the descriptor's status is `OVER_LIMIT`, but the answer is
    /// `OVER_LIMIT` only when every quota descriptor of the request is over (or a descriptor
    /// not in quota mode is), as in envoyproxy/ratelimit.
    pub quota: bool,
    /// The descriptor's `metadata`, carried in the answer's `dynamic_metadata` when the
    /// descriptor is within its limit.
    pub metadata: Option<prost_types::Struct>,
    /// `detailed_metric`: its decisions counted per descriptor with every value the request
    /// sent (`tollgate_rls_descriptor_total`).
    pub detailed_metric: bool,
    /// `value_to_metric` on its descriptor or one above it: its decisions counted per
    /// descriptor, with the request's values at those levels.
    pub value_to_metric: bool,
}

impl Limit {
    /// Whether its decisions are counted per descriptor (`tollgate_rls_descriptor_total`):
    /// `detailed_metric` or `value_to_metric` says so. Read once per decided descriptor, so
    /// a table without either key costs the request path nothing more.
    pub fn per_descriptor(&self) -> bool {
        self.detailed_metric || self.value_to_metric
    }
}

/// Index of a limit in [`DescriptorTable::limits`].
pub(crate) type LimitId = usize;

/// One descriptor of the tree: its limit and what may follow it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DescriptorNode {
    /// Its `rate_limit`, if it has one.
    pub limit: Option<LimitId>,
    /// `value_to_metric`: the request's value for it in the descriptor's metric key, also
    /// when matched by a wildcard or by the key alone.
    pub value_to_metric: bool,
    /// The descriptors under it, by key.
    pub children: HashMap<String, Children>,
}

/// The descriptors of one level that share a key, in the order the matcher tries them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Children {
    /// `value: X`: the value exactly.
    pub exact: HashMap<String, DescriptorNode>,
    /// `value: A*B`: the values a pattern with `*` matches, in file order (the first that
    /// matches wins).
    pub wildcards: Vec<Wildcard>,
    /// No `value`: any value, each its own budget.
    pub any: Option<Box<DescriptorNode>>,
}

/// A `value` holding `*` (`foo*`, `bar*b`, `foo*bar*baz`): each `*` matches any run of
/// characters, none included, as envoyproxy/ratelimit matches them.
#[derive(Debug, Clone, PartialEq)]
pub struct Wildcard {
    /// The value as written: part of the rule name, and with `share_threshold` the value the
    /// budget is keyed by.
    pub pattern: String,
    /// `pattern` split at each `*` once at load time, so a match allocates nothing.
    parts: Vec<String>,
    /// `share_threshold: true`: every value the pattern matches spends one budget (keyed by
    /// the pattern); without it each value has its own.
    pub share: bool,
    /// The descriptor.
    pub node: DescriptorNode,
}

impl Wildcard {
    /// The wildcard of `pattern` (which holds a `*`).
    pub(crate) fn new(pattern: String, share: bool, node: DescriptorNode) -> Wildcard {
        let parts = pattern.split('*').map(str::to_owned).collect();
        Wildcard {
            pattern,
            parts,
            share,
            node,
        }
    }

    /// Whether `value` matches: it starts with the text before the first `*`, ends with the
    /// text after the last, and holds the texts between, in order, in what remains.
    pub fn matches(&self, value: &str) -> bool {
        let Some((first, rest)) = self.parts.split_first() else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        // The prefix comes off first and the suffix from what remains: they never overlap.
        let Some(rest) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
            return false;
        };
        for part in middle {
            // The leftmost place of each part leaves the most room for the next.
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Every domain's descriptor tree and every limit, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DescriptorTable {
    /// Each domain's top level.
    pub domains: HashMap<String, DescriptorNode>,
    /// Every limit, by [`LimitId`].
    pub limits: Vec<Limit>,
    /// The files read, for `--check-config`.
    pub files: Vec<PathBuf>,
}

/// Why `RLS_CONFIG` cannot be used: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {problem}")]
pub struct RlsConfigError {
    /// `file`, `file:line` or `file:line: path.in.file`.
    pub location: String,
    /// What is wrong, and what is accepted.
    pub problem: String,
}

impl DescriptorTable {
    /// The files `path` names: itself, or a directory's `*.yaml` and `*.yml` files in name
    /// order.
    fn files(path: &Path) -> Result<Vec<PathBuf>, RlsConfigError> {
        let whole = |problem: String| RlsConfigError {
            location: path.display().to_string(),
            problem,
        };
        let metadata = std::fs::metadata(path).map_err(|error| whole(format!("cannot be read: {error}")))?;
        let files = if metadata.is_dir() {
            let mut files = Vec::new();
            let entries =
                std::fs::read_dir(path).map_err(|error| whole(format!("cannot be listed: {error}")))?;
            for entry in entries {
                let entry = entry.map_err(|error| whole(format!("cannot be listed: {error}")))?;
                let file = entry.path();
                let yaml = file
                    .extension()
                    .is_some_and(|extension| extension == "yaml" || extension == "yml");
                if yaml && file.is_file() {
                    files.push(file);
                }
            }
            if files.len() > MAX_FILES {
                return Err(whole(format!("more than {MAX_FILES} YAML files")));
            }
            files.sort();
            if files.is_empty() {
                return Err(whole("holds no *.yaml or *.yml file".into()));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        Ok(files)
    }

    /// The bytes of every file `path` names, each with its name: what a reload compares to
    /// see a change (a file added, removed or edited); `None` when one cannot be read.
    pub(crate) fn snapshot(path: &Path) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        for file in DescriptorTable::files(path).ok()? {
            if std::fs::metadata(&file).ok()?.len() > MAX_FILE_BYTES {
                return None;
            }
            let text = std::fs::read(&file).ok()?;
            let name = file.display().to_string();
            for part in [name.as_bytes(), text.as_slice()] {
                bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
                bytes.extend_from_slice(part);
            }
        }
        Some(bytes)
    }

    /// Read `path`: one file, or every `*.yaml` and `*.yml` file of a directory (not its
    /// subdirectories), in name order; files of one domain merged if `merge`
    /// ([`DescriptorTable::parse_merging`]).
    pub fn load(path: &Path, merge: bool) -> Result<DescriptorTable, RlsConfigError> {
        let files = DescriptorTable::files(path)?;
        let mut texts = Vec::with_capacity(files.len());
        for file in &files {
            let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
            if size > MAX_FILE_BYTES {
                return Err(RlsConfigError {
                    location: file.display().to_string(),
                    problem: format!("larger than {MAX_FILE_BYTES} bytes"),
                });
            }
            let text = std::fs::read_to_string(file).map_err(|error| RlsConfigError {
                location: file.display().to_string(),
                problem: format!("cannot be read: {error}"),
            })?;
            texts.push((file.display().to_string(), text));
        }
        let mut table = DescriptorTable::parse_merging(
            texts.iter().map(|(name, text)| (name.as_str(), text.as_str())),
            merge,
        )?;
        table.files = files;
        Ok(table)
    }

    /// The table of `files`, each `(name, text)`: a pure function of the texts, for tests and
    /// fuzzing. Two files of one domain are refused.
    #[cfg(any(test, feature = "testing"))]
    pub fn parse<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<DescriptorTable, RlsConfigError> {
        DescriptorTable::parse_merging(files, false)
    }

    /// The table of `files`; with `merge` (`RLS_MERGE_DOMAIN_CONFIG`, upstream's
    /// `MERGE_DOMAIN_CONFIG`) the descriptors of files of one domain are put together (one key
    /// and value in two of them refused), else a second file of a domain is refused, naming it.
    pub fn parse_merging<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge: bool,
    ) -> Result<DescriptorTable, RlsConfigError> {
        let mut table = DescriptorTable::default();
        let mut domain_files: HashMap<String, String> = HashMap::new();
        // Each domain's limits so far, and its `replaces` waiting for every file of it.
        let mut domain_limits: HashMap<String, Vec<LimitId>> = HashMap::new();
        let mut pending: Vec<(String, String, Vec<PendingReplace>)> = Vec::new();
        for (file, text) in files {
            let mut reader = FileReader {
                file,
                table: &mut table,
                pending_replaces: Vec::new(),
            };
            let first = reader.table.limits.len();
            let (domain, root) = reader.file(text)?;
            let replaces = std::mem::take(&mut reader.pending_replaces);
            let ids = first..table.limits.len();
            if let Some(earlier) = domain_files.get(&domain) {
                if !merge {
                    return Err(RlsConfigError {
                        location: file.to_owned(),
                        problem: format!(
                            "duplicate domain {domain:?} in config file: {earlier} has it already (one \
                             file per domain, or set RLS_MERGE_DOMAIN_CONFIG=true to merge them)"
                        ),
                    });
                }
                let into = table.domains.entry(domain.clone()).or_default();
                merge_level(into, root).map_err(|shown| RlsConfigError {
                    location: file.to_owned(),
                    problem: format!(
                        "duplicate descriptor composite key in domain {domain:?}: {shown} is in {earlier} \
                         already (files of one domain merge, never override one another)"
                    ),
                })?;
            } else {
                domain_files.insert(domain.clone(), file.to_owned());
                table.domains.insert(domain.clone(), root);
            }
            domain_limits.entry(domain.clone()).or_default().extend(ids);
            pending.push((file.to_owned(), domain, replaces));
        }
        // A `replaces` may name a limit of any file of its domain.
        for (file, domain, replaces) in pending {
            let names: HashSet<&str> = domain_limits
                .get(&domain)
                .into_iter()
                .flatten()
                .filter_map(|id| table.limits[*id].name.as_deref())
                .collect();
            if let Some((name, line, path)) = replaces
                .iter()
                .find(|(name, _, _)| !names.contains(name.as_str()))
            {
                return Err(RlsConfigError {
                    location: format!("{file}:{line}: {path}"),
                    problem: format!("replaces {name:?}, but no rate_limit of this domain has that name"),
                });
            }
        }
        Ok(table)
    }

    /// The specifications of the counted limits' rules, in limit order (ids are set when the
    /// rule table takes them), each failing as `fail_mode` says and shadowed if its descriptor
    /// or `shadow` says so (`SHADOW_MODE`). Keyed, costed and counted as any rule by default:
    /// the door names the key (the descriptor's entries), and Envoy holds the request while it
    /// waits for the answer, so a descriptor's limit is never delayed.
    pub fn specs(&self, fail_mode: FailMode, shadow: bool) -> Vec<RuleSpec> {
        self.limits
            .iter()
            .filter_map(|limit| {
                let limits = match &limit.allowance {
                    Allowance::Unlimited => return None,
                    Allowance::Rate {
                        requests_per_unit,
                        unit,
                    } => fixed_window(u64::from(*requests_per_unit), *unit),
                    Allowance::Limits(limits) => limits.clone(),
                };
                let mut spec = RuleSpec::new(&limit.rule, Matching::Named, limits);
                spec.rule.shadow = limit.shadow || shadow;
                spec.rule.fail_mode = fail_mode;
                Some(spec)
            })
            .collect()
    }

    /// The rule a descriptor's own `limit` (Envoy's per-request override) is decided under,
    /// [`OVERRIDE_RULE`]: the numbers are the request's (a fixed window of its unit), the rule
    /// gives the id, the name (the metrics' `rule` label and the Redis key's part) and the fail
    /// mode. One rule for every unit (the unit is part of the budget's key): one more table of
    /// `MAX_KEYS` in memory, not seven.
    pub fn override_spec(fail_mode: FailMode, shadow: bool) -> RuleSpec {
        let mut spec = RuleSpec::new(OVERRIDE_RULE, Matching::Named, fixed_window(0, Unit::Second));
        spec.rule.shadow = shadow;
        spec.rule.fail_mode = fail_mode;
        spec
    }

    /// How many limits are counted (are rules).
    pub fn counted(&self) -> usize {
        self.limits
            .iter()
            .filter(|limit| limit.allowance.counted())
            .count()
    }
}

/// The name of the rule of a descriptor's `limit` override (no domain's name, percent-encoded
/// after `rls/`, can be it).
pub(crate) const OVERRIDE_RULE: &str = "rls~override";

/// The table in words, for `--check-config`.
impl fmt::Display for DescriptorTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut domains: Vec<&String> = self.domains.keys().collect();
        domains.sort();
        write!(
            f,
            "{} domain(s) ({}), {} limit(s), {} counted",
            domains.len(),
            domains.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", "),
            self.limits.len(),
            self.counted()
        )
    }
}

/// The entry being read: its path in the file, for messages.
#[derive(Clone)]
struct Place {
    /// `descriptors[0].rate_limit`.
    path: String,
    /// `rls/<domain>/...`: the rule name so far.
    rule: String,
    /// `value_to_metric` on the entry or one above it.
    value_to_metric: bool,
}

/// Reads one file into the table.
struct FileReader<'a> {
    /// The file's name, for messages.
    file: &'a str,
    /// Where its limits go.
    table: &'a mut DescriptorTable,
    /// Each `replaces` of the file, checked once every file of its domain is read.
    pending_replaces: Vec<PendingReplace>,
}

/// A `replaces` waiting for every name of its domain: the name, its line and path.
type PendingReplace = (String, usize, String);

/// What a descriptor says of its `rate_limit` beside it.
struct Mode {
    /// `shadow_mode`.
    shadow: bool,
    /// `quota_mode`.
    quota: bool,
    /// `metadata`.
    metadata: Option<prost_types::Struct>,
    /// `detailed_metric`.
    detailed_metric: bool,
    /// `value_to_metric` here or above.
    value_to_metric: bool,
}

/// The keys each level accepts.
const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "limits",
];
const REPLACES_KEYS: &[&str] = &["name"];

impl FileReader<'_> {
    fn fail(&self, line: usize, path: &str, problem: impl Into<String>) -> RlsConfigError {
        let location = match path {
            "" => format!("{}:{line}", self.file),
            path => format!("{}:{line}: {path}", self.file),
        };
        RlsConfigError {
            location,
            problem: problem.into(),
        }
    }

    /// The domain and its top level.
    fn file(&mut self, text: &str) -> Result<(String, DescriptorNode), RlsConfigError> {
        let root = yaml::parse(text).map_err(|error| self.fail(error.line, "", error.problem))?;
        let Some(root) = root.filter(|root| !root.is_null()) else {
            return Err(self.fail(
                1,
                "",
                "config file cannot have empty domain (the file holds nothing)",
            ));
        };
        let entries = self.mapping(&root, "", ROOT_KEYS)?;
        let domain = match entries.get("domain") {
            Some(node) => self.string(node, "domain")?,
            None => String::new(),
        };
        if domain.is_empty() {
            return Err(self.fail(root.line, "domain", "config file cannot have empty domain"));
        }
        let place = Place {
            path: String::new(),
            rule: format!("rls/{}", utf8_percent_encode(&domain, NAME_ESCAPES)),
            value_to_metric: false,
        };
        let top = match entries.get("descriptors") {
            Some(node) => self.descriptors(node, &place, 0)?,
            None => DescriptorNode::default(),
        };
        Ok((domain, top))
    }

    /// `node` as a mapping whose keys are among `allowed`: each key's value.
    fn mapping<'n>(
        &self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
    ) -> Result<HashMap<&'n str, &'n Node>, RlsConfigError> {
        let Value::Mapping(entries) = &node.value else {
            return Err(self.fail(
                node.line,
                path,
                format!("expected a mapping, found {}", node.kind()),
            ));
        };
        let mut keys = HashMap::new();
        for (key, value) in entries {
            if !allowed.contains(&key.as_str()) {
                let hint = closest(key, allowed.iter().copied(), 2.max(key.len() / 3))
                    .map_or_else(String::new, |candidate| format!("; did you mean {candidate:?}?"));
                let here = if path.is_empty() { "the top level" } else { path };
                return Err(self.fail(
                    value.line,
                    path,
                    format!(
                        "config error, unknown key {key:?} (at {here}: {}){hint}",
                        allowed.join(", ")
                    ),
                ));
            }
            keys.insert(key.as_str(), value);
        }
        Ok(keys)
    }

    fn string(&self, node: &Node, path: &str) -> Result<String, RlsConfigError> {
        match &node.value {
            _ if node.is_null() => Ok(String::new()),
            Value::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.fail(node.line, path, format!("expected text, found {}", node.kind()))),
        }
    }

    fn boolean(&self, node: Option<&&Node>, path: &str) -> Result<bool, RlsConfigError> {
        let Some(node) = node else { return Ok(false) };
        match &node.value {
            _ if node.is_null() => Ok(false),
            Value::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
                other => Err(self.fail(
                    node.line,
                    path,
                    format!("expected true or false, found {other:?}"),
                )),
            },
            _ => Err(self.fail(
                node.line,
                path,
                format!("expected true or false, found {}", node.kind()),
            )),
        }
    }

    /// A list of descriptors, one level of the tree.
    fn descriptors(
        &mut self,
        node: &Node,
        parent: &Place,
        depth: usize,
    ) -> Result<DescriptorNode, RlsConfigError> {
        let path = match parent.path.as_str() {
            "" => "descriptors".to_owned(),
            path => format!("{path}.descriptors"),
        };
        if depth > yaml::MAX_DEPTH {
            return Err(self.fail(node.line, &path, "descriptors nested too deep"));
        }
        let mut level = DescriptorNode::default();
        if node.is_null() {
            return Ok(level);
        }
        let Value::Sequence(items) = &node.value else {
            return Err(self.fail(
                node.line,
                &path,
                format!("expected a list of descriptors, found {}", node.kind()),
            ));
        };
        // Where each (key, value) was first defined, for the duplicate's message.
        let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
        for (index, item) in items.iter().enumerate() {
            let here = format!("{path}[{index}]");
            let entries = self.descriptor_entries(item, &here)?;
            let (key, value) = self.key_and_value(&entries, item, &here, &mut seen)?;
            let share = self.shared(&entries, item, &here, &key, value.as_deref())?;
            let child = self.descriptor(&entries, &here, parent, (&key, value.as_deref()), depth)?;
            let children = level.children.entry(key).or_default();
            match value {
                None => children.any = Some(Box::new(child)),
                Some(value) if value.contains('*') => {
                    children.wildcards.push(Wildcard::new(value, share, child));
                }
                Some(value) => {
                    children.exact.insert(value, child);
                }
            }
        }
        Ok(level)
    }

    /// One item of a descriptor list: a mapping of the keys a descriptor has.
    fn descriptor_entries<'n>(
        &self,
        item: &'n Node,
        here: &str,
    ) -> Result<HashMap<&'n str, &'n Node>, RlsConfigError> {
        if !matches!(item.value, Value::Mapping(_)) {
            return Err(self.fail(
                item.line,
                here,
                format!(
                    "config error, yaml file contains list of type other than map: {}",
                    item.kind()
                ),
            ));
        }
        self.mapping(item, here, DESCRIPTOR_KEYS)
    }

    /// A descriptor's `key` (never empty) and `value` (`None` when empty or absent), the pair
    /// not `seen` before at its level.
    fn key_and_value(
        &self,
        entries: &HashMap<&str, &Node>,
        item: &Node,
        here: &str,
        seen: &mut HashMap<(String, Option<String>), usize>,
    ) -> Result<(String, Option<String>), RlsConfigError> {
        let key = match entries.get("key") {
            Some(node) => self.string(node, &format!("{here}.key"))?,
            None => String::new(),
        };
        if key.is_empty() {
            return Err(self.fail(item.line, here, "descriptor has empty key"));
        }
        let value = match entries.get("value") {
            Some(node) => Some(self.string(node, &format!("{here}.value"))?).filter(|v| !v.is_empty()),
            None => None,
        };
        let Some(first) = seen.insert((key.clone(), value.clone()), item.line) else {
            return Ok((key, value));
        };
        let shown = match &value {
            Some(value) => format!("key {key:?}, value {value:?}"),
            None => format!("key {key:?} without a value"),
        };
        Err(self.fail(
            item.line,
            here,
            format!("duplicate descriptor composite key: {shown} is on line {first} already"),
        ))
    }

    /// `share_threshold`: only beside a wildcard value.
    fn shared(
        &self,
        entries: &HashMap<&str, &Node>,
        item: &Node,
        here: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<bool, RlsConfigError> {
        let share = self.boolean(entries.get("share_threshold"), &format!("{here}.share_threshold"))?;
        if !share || value.is_some_and(|value| value.contains('*')) {
            return Ok(share);
        }
        let line = entries.get("share_threshold").map_or(item.line, |node| node.line);
        Err(self.fail(
            line,
            &format!("{here}.share_threshold"),
            format!(
                "share_threshold can only be used with wildcard values (containing '*'), but {} has none",
                match value {
                    Some(value) => format!("value {value:?}"),
                    None => format!("key {key:?}"),
                }
            ),
        ))
    }

    /// One descriptor (`key`, `value`) below `parent`: its rate limit, modes and children.
    fn descriptor(
        &mut self,
        entries: &HashMap<&str, &Node>,
        here: &str,
        parent: &Place,
        (key, value): (&str, Option<&str>),
        depth: usize,
    ) -> Result<DescriptorNode, RlsConfigError> {
        let segment = match value {
            Some(value) => format!(
                "{}={}",
                utf8_percent_encode(key, NAME_ESCAPES),
                utf8_percent_encode(value, NAME_ESCAPES)
            ),
            None => utf8_percent_encode(key, NAME_ESCAPES).to_string(),
        };
        let flag = |name: &str| self.boolean(entries.get(name), &format!("{here}.{name}"));
        let (shadow, quota) = (flag("shadow_mode")?, flag("quota_mode")?);
        let (detailed_metric, value_to_metric) = (flag("detailed_metric")?, flag("value_to_metric")?);
        let place = Place {
            path: here.to_owned(),
            rule: format!("{}/{segment}", parent.rule),
            value_to_metric: parent.value_to_metric || value_to_metric,
        };
        let metadata = match entries.get("metadata") {
            Some(node) if !node.is_null() => Some(self.metadata(node, &format!("{here}.metadata"))?),
            _ => None,
        };
        let limit = match entries.get("rate_limit") {
            Some(node) if !node.is_null() => {
                let mode = Mode {
                    shadow,
                    quota,
                    metadata,
                    detailed_metric,
                    value_to_metric: place.value_to_metric,
                };
                Some(self.rate_limit(node, &place, mode)?)
            }
            _ => None,
        };
        let mut child = match entries.get("descriptors") {
            Some(node) => self.descriptors(node, &place, depth + 1)?,
            None => DescriptorNode::default(),
        };
        child.limit = limit;
        child.value_to_metric = value_to_metric;
        Ok(child)
    }

    /// One `rate_limit`: what it allows, its name and what it replaces, as a limit of the table.
    fn rate_limit(&mut self, node: &Node, place: &Place, mode: Mode) -> Result<LimitId, RlsConfigError> {
        let path = format!("{}.rate_limit", place.path);
        let entries = self.mapping(node, &path, RATE_LIMIT_KEYS)?;
        let fields = self.rate_fields(&entries, &path)?;
        let allowance = self.allowance(fields, node, &path)?;
        let name = match entries.get("name") {
            Some(node) => Some(self.string(node, &format!("{path}.name"))?).filter(|n| !n.is_empty()),
            None => None,
        };
        let replaces = self.replaces(&entries, &path, name.as_deref())?;
        if allowance.counted() && self.table.counted() >= MAX_LIMITS {
            return Err(self.fail(
                node.line,
                &path,
                format!("more than {MAX_LIMITS} rate limits in RLS_CONFIG"),
            ));
        }
        let id = self.table.limits.len();
        self.table.limits.push(Limit {
            rule: place.rule.clone().into(),
            allowance,
            name,
            replaces: replaces.into_iter().map(|(name, _, _)| name).collect(),
            shadow: mode.shadow,
            quota: mode.quota,
            metadata: mode.metadata,
            detailed_metric: mode.detailed_metric,
            value_to_metric: mode.value_to_metric,
        });
        Ok(id)
    }

    /// The keys of a `rate_limit` that say what it allows, each read alone.
    fn rate_fields(&self, entries: &HashMap<&str, &Node>, path: &str) -> Result<RateFields, RlsConfigError> {
        let present = |key: &str| entries.get(key).copied().filter(|node| !node.is_null());
        let field = |key: &str| format!("{path}.{key}");
        Ok(RateFields {
            unlimited: self.boolean(entries.get("unlimited"), &field("unlimited"))?,
            unit: match present("unit") {
                Some(node) => Some((self.unit(node, &field("unit"))?, node.line)),
                None => None,
            },
            requests: match present("requests_per_unit") {
                Some(node) => Some((self.requests(node, &field("requests_per_unit"))?, node.line)),
                None => None,
            },
            // tollgate's extension: an algorithm for the unit's numbers, or a list of limits.
            algorithm: match present("algorithm") {
                Some(node) => Some((self.algorithm(node, &field("algorithm"))?, node.line)),
                None => None,
            },
            limits: match present("limits") {
                Some(node) => Some((self.limit_list(node, &field("limits"))?, node.line)),
                None => None,
            },
        })
    }

    /// `unit`: one [`Unit::NAMES`] names, in any case.
    fn unit(&self, node: &Node, field: &str) -> Result<Unit, RlsConfigError> {
        let text = self.string(node, field)?;
        Unit::parse(&text).ok_or_else(|| {
            let units = Unit::ALL.iter().map(|unit| unit.as_str());
            let hint = closest(&text.to_ascii_lowercase(), units, 2)
                .map_or_else(String::new, |name| format!("; did you mean {name:?}?"));
            self.fail(
                node.line,
                field,
                format!("invalid rate limit unit {text:?}: expected {}{hint}", Unit::NAMES),
            )
        })
    }

    /// `requests_per_unit`: a whole number that fits 32 bits, as that service reads it.
    fn requests(&self, node: &Node, field: &str) -> Result<u32, RlsConfigError> {
        let text = self.string(node, field)?;
        let digits = text.strip_prefix('+').unwrap_or(&text);
        digits
            .parse::<u32>()
            .ok()
            .filter(|_| digits.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| {
                self.fail(
                    node.line,
                    field,
                    format!("expected a whole number from 0 to {}, found {text:?}", u32::MAX),
                )
            })
    }

    /// What a `rate_limit` (at `node`, `path`) allows, from its keys: unlimited, a list of
    /// limits, or a unit's number (a fixed window, or the algorithm's numbers derived).
    fn allowance(&self, fields: RateFields, node: &Node, path: &str) -> Result<Allowance, RlsConfigError> {
        let algorithm_line = fields.algorithm.as_ref().map(|(_, line)| *line);
        if fields.unlimited {
            let beside = [
                ("unit", fields.unit.map(|(_, line)| line)),
                ("requests_per_unit", fields.requests.map(|(_, line)| line)),
                ("algorithm", algorithm_line),
                ("limits", fields.limits.as_ref().map(|(_, line)| *line)),
            ];
            return match beside.into_iter().find_map(|(key, line)| Some((key, line?))) {
                Some((key, line)) => Err(self.fail(line, &format!("{path}.{key}"), unlimited_beside(key))),
                None => Ok(Allowance::Unlimited),
            };
        }
        if let Some((limits, _)) = fields.limits {
            let beside = [
                ("unit", fields.unit.map(|(_, line)| line)),
                ("requests_per_unit", fields.requests.map(|(_, line)| line)),
                ("algorithm", algorithm_line),
            ];
            if let Some((key, line)) = beside.into_iter().find_map(|(key, line)| Some((key, line?))) {
                return Err(self.fail(
                    line,
                    &format!("{path}.{key}"),
                    format!(
                        "should not specify {key} beside limits: each limit of the list says its own \
                         algorithm and numbers (ALGORITHM:A:B; fixed_window:10:60 is 10 a minute)"
                    ),
                ));
            }
            return Ok(Allowance::Limits(limits));
        }
        let Some((unit, _)) = fields.unit else {
            return Err(self.no_unit(fields.algorithm.as_ref(), node, path));
        };
        let Some((algorithm, line)) = &fields.algorithm else {
            // As in that service, a missing number is 0: every hit is over the limit.
            let requests_per_unit = fields.requests.map_or(0, |(n, _)| n);
            return Ok(Allowance::Rate {
                requests_per_unit,
                unit,
            });
        };
        let Some((requests_per_unit, requests_line)) = fields.requests else {
            return Err(self.fail(
                *line,
                &format!("{path}.algorithm"),
                format!("algorithm {algorithm} needs requests_per_unit, at least 1"),
            ));
        };
        let policy = derive(algorithm, requests_per_unit, unit)
            .map_err(|why| self.fail(requests_line, &format!("{path}.requests_per_unit"), why))?;
        Ok(Allowance::Limits(Limits::one(policy)))
    }

    /// The error of a `rate_limit` that says neither a unit, `unlimited` nor a list.
    fn no_unit(&self, algorithm: Option<&(String, usize)>, node: &Node, path: &str) -> RlsConfigError {
        match algorithm {
            Some((algorithm, line)) => self.fail(
                *line,
                &format!("{path}.algorithm"),
                format!(
                    "algorithm {algorithm} needs a unit ({}) and requests_per_unit, its numbers \
                     derive from them (or write a limits list instead)",
                    Unit::NAMES
                ),
            ),
            None => self.fail(
                node.line,
                path,
                format!(
                    "invalid rate limit unit \"\": a rate_limit needs a unit ({}), unlimited: true or a limits list",
                    Unit::NAMES
                ),
            ),
        }
    }

    /// `replaces`: the names of other limits of the domain, each with its line and path,
    /// checked once every file of the domain is read (queued here).
    fn replaces(
        &mut self,
        entries: &HashMap<&str, &Node>,
        path: &str,
        name: Option<&str>,
    ) -> Result<Vec<PendingReplace>, RlsConfigError> {
        let mut replaces = Vec::new();
        let Some(list) = entries.get("replaces").filter(|node| !node.is_null()) else {
            return Ok(replaces);
        };
        let field = format!("{path}.replaces");
        let Value::Sequence(items) = &list.value else {
            return Err(self.fail(
                list.line,
                &field,
                format!("expected a list of {{name: X}}, found {}", list.kind()),
            ));
        };
        for (index, item) in items.iter().enumerate() {
            let here = format!("{field}[{index}]");
            let entry = self.mapping(item, &here, REPLACES_KEYS)?;
            let replaced = match entry.get("name") {
                Some(node) => self.string(node, &format!("{here}.name"))?,
                None => String::new(),
            };
            if replaced.is_empty() {
                return Err(self.fail(item.line, &here, "should not have an empty replaces entry"));
            }
            if name == Some(replaced.as_str()) {
                return Err(self.fail(
                    item.line,
                    &here,
                    "replaces should not contain name of same descriptor",
                ));
            }
            replaces.push((replaced, item.line, here));
        }
        self.pending_replaces.extend(replaces.iter().cloned());
        Ok(replaces)
    }

    /// `algorithm`: a name [`Policy::parse`] knows (`token_bucket`, `gcra`, ...), written as
    /// `ROUTES` writes it.
    fn algorithm(&self, node: &Node, path: &str) -> Result<String, RlsConfigError> {
        let name = self.string(node, path)?;
        if Policy::parameters(&name).is_some() {
            return Ok(name);
        }
        let hint = closest(&name.to_ascii_lowercase(), Policy::NAMES.iter().copied(), 3)
            .map_or_else(String::new, |known| format!("; did you mean {known:?}?"));
        Err(self.fail(
            node.line,
            path,
            format!("unknown algorithm {name:?}: expected {}{hint}", algorithm_names()),
        ))
    }

    /// `limits`: one string of limits joined by `+` (spaces around a `+` allowed), or a list of
    /// strings, one limit each, in `ROUTES`' syntax and read by its parser; an error names the
    /// item's own line.
    fn limit_list(&self, node: &Node, path: &str) -> Result<Limits, RlsConfigError> {
        let joined =
            |parts: &mut dyn Iterator<Item = &str>| parts.map(str::trim).collect::<Vec<_>>().join("+");
        let text = match &node.value {
            Value::Scalar { text, .. } => joined(&mut text.split('+')),
            Value::Sequence(items) if !items.is_empty() => {
                let mut texts = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    let here = format!("{path}[{index}]");
                    let Value::Scalar { text, .. } = &item.value else {
                        return Err(self.fail(
                            item.line,
                            &here,
                            format!("expected one limit (ALGORITHM:A:B), found {}", item.kind()),
                        ));
                    };
                    parse_limit(text.trim()).map_err(|why| self.fail(item.line, &here, why))?;
                    texts.push(text.as_str());
                }
                joined(&mut texts.into_iter())
            }
            _ => {
                return Err(self.fail(
                    node.line,
                    path,
                    format!(
                        "expected a limit list, e.g. \"token_bucket:20:10+fixed_window:10000:86400\" or \
                         [token_bucket:20:10, fixed_window:10000:86400], found {}",
                        node.kind()
                    ),
                ));
            }
        };
        parse_limits(&text).map_err(|why| self.fail(node.line, path, why))
    }

    /// Every `replaces` of the limits from `first` on names a limit of the same domain.
    /// `metadata`: a mapping of anything, as protobuf's `Struct` carries it (a plain `true`,
    /// `false`, `null` or number is one; any other scalar, or a quoted one, is text).
    fn metadata(&self, node: &Node, path: &str) -> Result<prost_types::Struct, RlsConfigError> {
        match metadata_value(node).kind {
            Some(prost_types::value::Kind::StructValue(fields)) => Ok(fields),
            _ => Err(self.fail(
                node.line,
                path,
                format!(
                    "error parsing metadata: expected a mapping, found {}",
                    node.kind()
                ),
            )),
        }
    }
}

/// `limit` requests in each window of `unit`, as envoyproxy/ratelimit counts.
fn fixed_window(limit: u64, unit: Unit) -> Limits {
    Limits::one(Policy::FixedWindow(FixedWindow {
        limit,
        window_ms: unit.seconds() * 1_000,
    }))
}

/// What a `rate_limit` says of what it allows, each key with its line.
struct RateFields {
    /// `unlimited`.
    unlimited: bool,
    /// `unit`.
    unit: Option<(Unit, usize)>,
    /// `requests_per_unit`.
    requests: Option<(u32, usize)>,
    /// `algorithm` (tollgate's extension).
    algorithm: Option<(String, usize)>,
    /// `limits` (tollgate's extension).
    limits: Option<(Limits, usize)>,
}

/// Why `key` may not be beside `unlimited: true`, in that service's words where it has them.
fn unlimited_beside(key: &str) -> String {
    match key {
        "unit" => "should not specify rate limit unit when unlimited".into(),
        "requests_per_unit" => "should not specify requests_per_unit when unlimited".into(),
        key => format!("should not specify {key} when unlimited: an unlimited limit is never counted"),
    }
}

/// Put the descriptors of `from` (a second file's top level of a domain) beside those of
/// `into`; a key and value both define is refused, shown as the message shows it.
fn merge_level(into: &mut DescriptorNode, from: DescriptorNode) -> Result<(), String> {
    for (key, children) in from.children {
        let target = into.children.entry(key.clone()).or_default();
        for (value, node) in children.exact {
            if target.exact.contains_key(&value) {
                return Err(format!("key {key:?}, value {value:?}"));
            }
            target.exact.insert(value, node);
        }
        for wildcard in children.wildcards {
            if target
                .wildcards
                .iter()
                .any(|known| known.pattern == wildcard.pattern)
            {
                return Err(format!("key {key:?}, value {:?}", wildcard.pattern));
            }
            target.wildcards.push(wildcard);
        }
        if let Some(any) = children.any {
            if target.any.is_some() {
                return Err(format!("key {key:?} without a value"));
            }
            target.any = Some(any);
        }
    }
    Ok(())
}

/// `node` as a protobuf `Value`.
fn metadata_value(node: &Node) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match &node.value {
        _ if node.is_null() => Kind::NullValue(0),
        Value::Scalar { text, plain: true } => match text.as_str() {
            "true" | "True" | "TRUE" => Kind::BoolValue(true),
            "false" | "False" | "FALSE" => Kind::BoolValue(false),
            number if yaml_number(number) => Kind::NumberValue(number.parse().unwrap_or_default()),
            text => Kind::StringValue(text.to_owned()),
        },
        Value::Scalar { text, .. } => Kind::StringValue(text.clone()),
        Value::Sequence(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(metadata_value).collect(),
        }),
        Value::Mapping(entries) => Kind::StructValue(prost_types::Struct {
            fields: entries
                .iter()
                .map(|(key, value)| (key.clone(), metadata_value(value)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Whether a plain scalar is a number to YAML: an optional sign, digits, and at most one `.`
/// and an exponent (what `f64` parses, less `inf`, `NaN` and the like, which are text).
fn yaml_number(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && text.parse::<f64>().is_ok_and(f64::is_finite)
}

/// The policy `algorithm` enforces for `requests_per_unit` in each `unit`, from the numbers
/// derived, read by the algorithm's own parameter parser: for `token_bucket` (`gcra`) a
/// capacity of `requests_per_unit`, refilled at `requests_per_unit` per unit (`N` and `N/S`,
/// `S` the unit's seconds: a burst of `N`, then the unit's rate); for the windows
/// `requests_per_unit` in each window of the unit (`N` and `S`). The error says what was
/// derived, as a limit list writes it, and why it is refused.
fn derive(algorithm: &str, requests_per_unit: u32, unit: Unit) -> Result<Policy, String> {
    let seconds = unit.seconds();
    let token_bucket = algorithm == TokenBucket::NAME || TokenBucket::ALIASES.contains(&algorithm);
    let second = if token_bucket {
        // Display writes the shortest text that parses back to the same number.
        (f64::from(requests_per_unit) / seconds as f64).to_string()
    } else {
        seconds.to_string()
    };
    let first = requests_per_unit.to_string();
    policy_of(algorithm, &first, &second).map_err(|why| {
        format!(
            "algorithm {algorithm} with {requests_per_unit} per {} is {algorithm}:{first}:{second}, \
             which is refused: {why}",
            unit.as_str()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::{SlidingLog, SlidingWindow};
    use crate::rules::{Count, Rule};

    fn refused(text: &str) -> RlsConfigError {
        DescriptorTable::parse([("test.yaml", text)]).expect_err("refused")
    }

    fn assert_refused(text: &str, location: &str, problem: &str) {
        let error = refused(text);
        assert!(error.location.contains(location), "{error}");
        assert!(error.problem.contains(problem), "{error}");
    }

    #[test]
    fn a_tree_becomes_limits_and_fixed_window_rules() {
        let table = DescriptorTable::parse([(
            "a.yaml",
            "domain: edge\ndescriptors:\n  - key: path\n    value: /api v1\n    rate_limit: {unit: Minute, requests_per_unit: 7, name: api}\n  - key: free\n    rate_limit: {unlimited: true}\n",
        )])
        .unwrap();
        assert_eq!(table.limits.len(), 2);
        assert_eq!(table.counted(), 1);
        let rules: Vec<Rule> = table
            .specs(FailMode::Closed, false)
            .into_iter()
            .map(|spec| spec.rule)
            .collect();
        assert_eq!(rules.len(), 1);
        // Characters other than [A-Za-z0-9-_.*] are percent-encoded: `/` and `=` only separate.
        assert_eq!(&*rules[0].name, "rls/edge/path=%2Fapi%20v1");
        assert_eq!(
            *rules[0].limits.first(),
            Policy::FixedWindow(FixedWindow {
                limit: 7,
                window_ms: 60_000
            })
        );
        assert_eq!(rules[0].fail_mode, FailMode::Closed);
        assert_eq!(table.limits[0].name.as_deref(), Some("api"));
        assert!(table.specs(FailMode::Open, true)[0].rule.shadow);
    }

    /// The refusals of envoyproxy/ratelimit's own test configurations (`test/config/*.yaml`).
    #[test]
    fn what_the_reference_refuses_is_refused() {
        assert_refused(
            "descriptors:\n  - key: a\n",
            "test.yaml:1",
            "config file cannot have empty domain",
        );
        assert_refused("", "test.yaml", "config file cannot have empty domain");
        assert_refused(
            "domain: d\ndescriptors:\n  - value: v\n",
            "descriptors[0]",
            "descriptor has empty key",
        );
        assert_refused(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
            "test.yaml:5: descriptors[1]",
            "duplicate descriptor composite key: key \"key1\", value \"value1\" is on line 3",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 1\n",
            "test.yaml:5: descriptors[0].rate_limit.unit",
            "invalid rate limit unit \"foo\"",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: me\n      replaces:\n        - name: me\n",
            "replaces[0]",
            "replaces should not contain name of same descriptor",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n",
            "replaces[0]",
            "should not have an empty replaces entry",
        );
        assert_refused("domain: d\ndescriptors: [\n", "test.yaml:", "");
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: second\n",
            "descriptors[0]",
            "unknown key \"ratelimit\" (at descriptors[0]: key, value, rate_limit, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata); did you mean \"rate_limit\"?",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n",
            "test.yaml:6: descriptors[0].rate_limit",
            "did you mean \"requests_per_unit\"?",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    0.25: x\n",
            "descriptors[0]",
            "unknown key \"0.25\"",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - a\n",
            "descriptors[0]",
            "yaml file contains list of type other than map",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      unlimited: true\n",
            "rate_limit.unit",
            "should not specify rate limit unit when unlimited",
        );
    }

    #[test]
    fn what_the_reference_lets_do_nothing_is_refused_too() {
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n      unlimited: true\n",
            "rate_limit.requests_per_unit",
            "should not specify requests_per_unit when unlimited",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: nobody\n",
            "test.yaml:8: descriptors[0].rate_limit.replaces[0]",
            "replaces \"nobody\", but no rate_limit of this domain has that name",
        );
        // A valid key where it means nothing.
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      shadow_mode: true\n",
            "rate_limit",
            "unknown key \"shadow_mode\"",
        );
        assert_refused("domain: a\ndomain: b\n", "test.yaml:2", "again (first on line 1)");
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: secnd\n",
            "unit",
            "did you mean \"second\"?",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
            "requests_per_unit",
            "a whole number",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n",
            "descriptors[0].rate_limit",
            "needs a unit",
        );
        let two = DescriptorTable::parse([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]).unwrap_err();
        assert_eq!(two.location, "b.yaml");
        assert!(two.problem.contains("a.yaml has it already"), "{two}");
    }

    /// envoyproxy/ratelimit's `merge_domain_key1.yaml` and `merge_domain_key2.yaml`, and its
    /// `TestDuplicateDomain` and `TestDuplicateKeyDomainMerge`.
    #[test]
    fn two_files_of_one_domain_are_refused_naming_it_or_merged_when_asked() {
        let key1 = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10, name: one}\n";
        let key2 = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20, replaces: [{name: one}]}\n  - key: key1\n    value: other\n    rate_limit: {unit: minute, requests_per_unit: 30}\n";
        let files = [("merge_domain_key1.yaml", key1), ("merge_domain_key2.yaml", key2)];
        let refused = DescriptorTable::parse(files).unwrap_err();
        assert_eq!(refused.location, "merge_domain_key2.yaml");
        assert!(
            refused.problem.contains("duplicate domain \"test-domain\""),
            "{refused}"
        );
        assert!(
            refused.problem.contains("RLS_MERGE_DOMAIN_CONFIG=true"),
            "{refused}"
        );
        let merged = DescriptorTable::parse_merging(files, true).unwrap();
        assert_eq!(merged.domains.len(), 1);
        let rule = |entries: &[(&str, &str)]| {
            super::super::matcher::find(&merged, "test-domain", entries.iter().copied())
                .map(|found| merged.limits[found.limit].rule.to_string())
        };
        assert_eq!(
            rule(&[("key1", "value1")]).as_deref(),
            Some("rls/test-domain/key1=value1")
        );
        assert_eq!(
            rule(&[("key2", "value2")]).as_deref(),
            Some("rls/test-domain/key2=value2")
        );
        assert_eq!(
            rule(&[("key1", "other")]).as_deref(),
            Some("rls/test-domain/key1=other")
        );
        // A replaces may name a limit of the domain's other file.
        assert_eq!(merged.limits[1].replaces, ["one"]);
        // One key and value in both files: refused, merged or not.
        for (again, shown) in [
            (
                "  - key: key1\n    value: value1\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
                "key \"key1\", value \"value1\"",
            ),
            (
                "  - key: key1\n    value: v*\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
                "key \"key1\", value \"v*\"",
            ),
        ] {
            let first = format!(
                "{key1}  - key: key1\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n  - key: key1\n    value: v*\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
            );
            let second = format!("domain: test-domain\ndescriptors:\n{again}");
            let error = DescriptorTable::parse_merging(
                [("a.yaml", first.as_str()), ("b.yaml", second.as_str())],
                true,
            )
            .unwrap_err();
            assert_eq!(error.location, "b.yaml");
            assert!(
                error.problem.contains(&format!(
                    "duplicate descriptor composite key in domain \"test-domain\": {shown} is in a.yaml already"
                )),
                "{error}"
            );
        }
        let lone = "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        let error = DescriptorTable::parse_merging([("a.yaml", lone), ("b.yaml", lone)], true).unwrap_err();
        assert_eq!(error.location, "b.yaml");
        assert!(
            error
                .problem
                .contains("key \"key1\" without a value is in a.yaml already"),
            "{error}"
        );
    }

    #[test]
    fn quota_mode_metadata_and_the_metric_keys_are_read() {
        let table = DescriptorTable::parse([(
            "metadata.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key2\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n    metadata:\n      service_with_quota:\n        name: service_2\n        weight: 1.5\n        tags: [a, 'true', true, ~, -3]\n",
        )])
        .unwrap();
        let limit = &table.limits[0];
        assert!(limit.quota);
        let text = |text: &str| prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(text.into())),
        };
        let number = |n: f64| prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(n)),
        };
        use prost_types::value::Kind;
        let inner = prost_types::Struct {
            fields: [
                ("name".to_owned(), text("service_2")),
                ("weight".to_owned(), number(1.5)),
                (
                    "tags".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::ListValue(prost_types::ListValue {
                            values: vec![
                                text("a"),
                                text("true"),
                                prost_types::Value {
                                    kind: Some(Kind::BoolValue(true)),
                                },
                                prost_types::Value {
                                    kind: Some(Kind::NullValue(0)),
                                },
                                number(-3.0),
                            ],
                        })),
                    },
                ),
            ]
            .into_iter()
            .collect(),
        };
        let expected = prost_types::Struct {
            fields: [(
                "service_with_quota".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::StructValue(inner)),
                },
            )]
            .into_iter()
            .collect(),
        };
        assert_eq!(limit.metadata.as_ref(), Some(&expected));
        assert!(yaml_number("12") && yaml_number("-1e3") && yaml_number(".5"));
        assert!(!yaml_number("inf") && !yaml_number("NaN") && !yaml_number("1.2.3") && !yaml_number("e5"));
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "test.yaml:4: descriptors[0].metadata",
            "error parsing metadata: expected a mapping, found a list",
        );
        assert_refused(
            "domain: d\ndescriptors:\n  - key: k\n    quota_mode: maybe\n",
            "descriptors[0].quota_mode",
            "expected true or false",
        );
    }

    /// envoyproxy/ratelimit refuses `share_threshold` on a descriptor without a wildcard.
    #[test]
    fn share_threshold_needs_a_wildcard() {
        for (descriptor, shown) in [
            ("key: k\n    value: exact", "value \"exact\""),
            ("key: k", "key \"k\""),
        ] {
            assert_refused(
                &format!(
                    "domain: d\ndescriptors:\n  - {descriptor}\n    share_threshold: true\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
                ),
                "descriptors[0].share_threshold",
                &format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but {shown} has none"
                ),
            );
        }
        let table = DescriptorTable::parse([(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )])
        .unwrap();
        let wildcard = &table.domains["d"].children["k"].wildcards[0];
        assert!(wildcard.share && wildcard.matches("axxb") && !wildcard.matches("axx"));
    }

    #[test]
    fn a_replaces_may_name_a_limit_anywhere_in_its_domain() {
        let table = DescriptorTable::parse([(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: b}]\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: hour, requests_per_unit: 2, name: b}\n",
        )])
        .unwrap();
        assert_eq!(table.limits[0].replaces, ["b"]);
    }

    #[test]
    fn a_directory_is_every_yaml_file_in_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("one.yaml"), "domain: one\n").unwrap();
        std::fs::write(dir.path().join("two.yml"), "domain: two\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not: yaml: at all").unwrap();
        let table = DescriptorTable::load(dir.path(), false).unwrap();
        assert_eq!(table.domains.len(), 2);
        assert_eq!(table.files.len(), 2);
        let empty = tempfile::tempdir().unwrap();
        assert!(
            DescriptorTable::load(empty.path(), false)
                .unwrap_err()
                .problem
                .contains("no *.yaml")
        );
        let missing = DescriptorTable::load(&dir.path().join("missing.yaml"), false).unwrap_err();
        assert!(missing.problem.contains("cannot be read"), "{missing}");
    }

    /// The rules of the one file `text`, which must be valid.
    fn rules_of(text: &str) -> Vec<Rule> {
        let table = DescriptorTable::parse([("test.yaml", text)]).unwrap();
        let specs = table.specs(FailMode::Closed, false);
        specs.into_iter().map(|spec| spec.rule).collect()
    }

    /// The limits of the first rule of `text`.
    fn limits_of(text: &str) -> Limits {
        rules_of(text).remove(0).limits
    }

    fn fixed(limit: u64, seconds: u64) -> Policy {
        Policy::FixedWindow(FixedWindow {
            limit,
            window_ms: seconds * 1_000,
        })
    }

    /// A file without `algorithm` or `limits` means what it means to envoyproxy/ratelimit, and
    /// what it meant here before them: the same rule names and the same fixed windows, so the
    /// same Redis keys and metrics labels.
    #[test]
    fn a_file_without_the_extension_makes_the_rules_it_always_made() {
        let text = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: path\n    value: /api/*\n    descriptors:\n      - key: plan\n        value: gold\n        rate_limit: {unit: Hour, requests_per_unit: 600, name: gold}\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: nothing\n    rate_limit: {unit: year}\n  - key: beta\n    shadow_mode: true\n    rate_limit: {unit: week, requests_per_unit: 4294967295}\n";
        let rules = rules_of(text);
        let expected = [
            ("rls/edge/remote_address", fixed(10, 1), false),
            ("rls/edge/path=%2Fapi%2F*/plan=gold", fixed(600, 3_600), false),
            ("rls/edge/nothing", fixed(0, 365 * 86_400), false),
            ("rls/edge/beta", fixed(u64::from(u32::MAX), 7 * 86_400), true),
        ];
        assert_eq!(rules.len(), expected.len());
        for (rule, (name, policy, shadow)) in rules.iter().zip(expected) {
            assert_eq!(&*rule.name, name);
            assert_eq!(rule.limits, Limits::one(policy), "{name}");
            assert_eq!(rule.limits.to_string(), policy.to_string());
            assert_eq!((rule.cost, rule.shadow, rule.count), (1, shadow, Count::All));
        }
        // The last parts of the Redis key, `:fw:{fingerprint}`, as every release wrote them.
        let parts: Vec<String> = rules
            .iter()
            .map(|rule| {
                let policy = rule.limits.first();
                format!("{}:{:08x}", policy.key_suffix(), policy.fingerprint())
            })
            .collect();
        assert_eq!(
            parts,
            ["fw:ddf56364", "fw:150f3ba1", "fw:f277c188", "fw:699c34c3"]
        );
        // `algorithm: fixed_window` says what a plain limit says.
        let plain = rules_of(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
        );
        let explicit = rules_of(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: fixed_window, unit: minute, requests_per_unit: 7}\n",
        );
        assert_eq!(plain, explicit);
    }

    #[test]
    fn an_algorithm_derives_its_numbers_from_the_unit() {
        let with = |algorithm: &str, unit: &str, requests: u32| {
            limits_of(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      algorithm: {algorithm}\n      unit: {unit}\n      requests_per_unit: {requests}\n"
            ))
        };
        // A burst of requests_per_unit, refilled at requests_per_unit a unit.
        let bucket = Limits::one(Policy::TokenBucket(TokenBucket {
            capacity: 10,
            interval_us: 6_000_000,
        }));
        assert_eq!(with("token_bucket", "minute", 10), bucket);
        assert_eq!(with("gcra", "minute", 10), bucket);
        assert_eq!(
            with("token_bucket", "day", 3),
            Limits::one(Policy::TokenBucket(TokenBucket {
                capacity: 3,
                interval_us: 28_800_000_000,
            }))
        );
        assert_eq!(
            with("token_bucket", "second", 1_000_000),
            Limits::one(Policy::TokenBucket(TokenBucket {
                capacity: 1_000_000,
                interval_us: 1,
            }))
        );
        assert_eq!(
            with("sliding_window", "hour", 100),
            Limits::one(Policy::SlidingWindow(SlidingWindow {
                limit: 100,
                window_ms: 3_600_000,
            }))
        );
        assert_eq!(
            with("sliding_log", "second", 5),
            Limits::one(Policy::SlidingLog(SlidingLog {
                limit: 5,
                window_ms: 1_000,
            }))
        );
        assert_eq!(with("fixed_window", "day", 9), Limits::one(fixed(9, 86_400)));
        // Each is exactly what ROUTES reads from the numbers derived.
        assert_eq!(
            with("token_bucket", "minute", 10),
            parse_limits("token_bucket:10:0.16666666666666666").unwrap()
        );
        let table = DescriptorTable::parse([(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 2}\n",
        )])
        .unwrap();
        assert_eq!(table.counted(), 1);
        assert!(matches!(table.limits[0].allowance, Allowance::Limits(_)));
    }

    #[test]
    fn a_limits_list_is_read_by_the_routes_parser() {
        let expected = parse_limits("token_bucket:20:10+fixed_window:10000:86400").unwrap();
        for written in [
            "limits: token_bucket:20:10+fixed_window:10000:86400",
            "limits: \"token_bucket:20:10 + fixed_window:10000:86400\"",
            "limits: [token_bucket:20:10, fixed_window:10000:86400]",
            "limits:\n        - token_bucket:20:10\n        - fixed_window:10000:86400",
        ] {
            let text = format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: api\n      {written}\n"
            );
            let table = DescriptorTable::parse([("a.yaml", text.as_str())]).unwrap();
            assert_eq!(table.limits[0].name.as_deref(), Some("api"));
            let rules: Vec<Rule> = table
                .specs(FailMode::Open, false)
                .into_iter()
                .map(|spec| spec.rule)
                .collect();
            assert_eq!(&*rules[0].name, "rls/d/k", "{written}");
            assert_eq!(rules[0].limits, expected, "{written}");
        }
        // One limit alone is a list too.
        assert_eq!(
            limits_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limits: sliding_window:5:60}\n"),
            parse_limits("sliding_window:5:60").unwrap()
        );
    }

    #[test]
    fn what_the_extension_cannot_mean_is_refused_naming_its_line() {
        let rate_limit = |body: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{body}");
        // The algorithms named as the registry lists them (`token_bucket, gcra, sliding_window,
        // fixed_window or sliding_log`, the list's own test checks): a new one joins the list.
        let unknown = format!(
            "unknown algorithm \"token_bukket\": expected {}; did you mean \"token_bucket\"?",
            crate::algorithms::algorithm_names()
        );
        let cases: &[(&str, &str, &str)] = &[
            (
                "      algorithm: token_bukket\n      unit: second\n      requests_per_unit: 1\n",
                "test.yaml:5: descriptors[0].rate_limit.algorithm",
                &unknown,
            ),
            (
                "      algorithm: token_bucket\n      requests_per_unit: 1\n",
                "test.yaml:5: descriptors[0].rate_limit.algorithm",
                "algorithm token_bucket needs a unit",
            ),
            (
                "      algorithm: sliding_window\n      unit: minute\n",
                "test.yaml:5: descriptors[0].rate_limit.algorithm",
                "algorithm sliding_window needs requests_per_unit",
            ),
            (
                "      algorithm: token_bucket\n      unit: minute\n      requests_per_unit: 0\n",
                "test.yaml:7: descriptors[0].rate_limit.requests_per_unit",
                "algorithm token_bucket with 0 per minute is token_bucket:0:0, which is refused: capacity \"0\"",
            ),
            (
                "      algorithm: token_bucket\n      unit: second\n      requests_per_unit: 2000000\n",
                "test.yaml:7: descriptors[0].rate_limit.requests_per_unit",
                "tokens per second \"2000000\": expected tokens per second: a number above 0 and at most 1000000",
            ),
            (
                "      algorithm: sliding_log\n      unit: second\n      requests_per_unit: 10001\n",
                "test.yaml:7: descriptors[0].rate_limit.requests_per_unit",
                "the sliding log keeps one timestamp per request",
            ),
            (
                "      unit: second\n      limits: token_bucket:20:10\n",
                "test.yaml:5: descriptors[0].rate_limit.unit",
                "should not specify unit beside limits",
            ),
            (
                "      limits: token_bucket:20:10\n      requests_per_unit: 3\n",
                "test.yaml:6: descriptors[0].rate_limit.requests_per_unit",
                "should not specify requests_per_unit beside limits",
            ),
            (
                "      algorithm: token_bucket\n      limits: token_bucket:20:10\n",
                "test.yaml:5: descriptors[0].rate_limit.algorithm",
                "should not specify algorithm beside limits",
            ),
            (
                "      unlimited: true\n      algorithm: token_bucket\n",
                "test.yaml:6: descriptors[0].rate_limit.algorithm",
                "should not specify algorithm when unlimited",
            ),
            (
                "      unlimited: true\n      limits: [token_bucket:20:10]\n",
                "test.yaml:6: descriptors[0].rate_limit.limits",
                "should not specify limits when unlimited",
            ),
            (
                "      limits:\n        - token_bucket:20:10\n        - fixed_window:ten:60\n",
                "test.yaml:7: descriptors[0].rate_limit.limits[1]",
                "requests per window \"ten\": expected a whole number of at least 1",
            ),
            (
                "      limits:\n        - token_bucket:20:10\n        - {algorithm: fixed_window}\n",
                "test.yaml:7: descriptors[0].rate_limit.limits[1]",
                "expected one limit (ALGORITHM:A:B), found a mapping",
            ),
            (
                "      limits: token_bucket:20:10+leaky:1:1\n",
                "test.yaml:5: descriptors[0].rate_limit.limits",
                "limit \"leaky:1:1\": unknown algorithm \"leaky\"",
            ),
            (
                "      limits: [token_bucket:20:10, token_bucket:20:10]\n",
                "test.yaml:5: descriptors[0].rate_limit.limits",
                "is written twice",
            ),
            (
                "      limits: [fixed_window:1:1, fixed_window:2:1, fixed_window:3:1, fixed_window:4:1, fixed_window:5:1, fixed_window:6:1, fixed_window:7:1]\n",
                "test.yaml:5: descriptors[0].rate_limit.limits",
                "7 limits, more than the 6 one rule holds",
            ),
            (
                "      limits: []\n",
                "test.yaml:5: descriptors[0].rate_limit.limits",
                "expected a limit list",
            ),
            (
                "      limits: {token_bucket: 20}\n",
                "test.yaml:5: descriptors[0].rate_limit.limits",
                "expected a limit list",
            ),
            (
                "      limit: token_bucket:20:10\n",
                "test.yaml:5: descriptors[0].rate_limit",
                "did you mean \"limits\"?",
            ),
        ];
        for (body, location, problem) in cases {
            let error = refused(&rate_limit(body));
            assert_eq!(error.location, *location, "{error}");
            assert!(error.problem.contains(problem), "{error}");
        }
    }

    /// `config` reads this loader (RLS_CONFIG), so this loader reads nothing of `config`: the
    /// rules it makes are `rules`' specifications, and no module circle closes through here.
    #[test]
    fn the_loader_imports_nothing_of_the_configuration() {
        for (file, source) in [
            ("config.rs", include_str!("config.rs")),
            ("yaml.rs", include_str!("yaml.rs")),
        ] {
            let code = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
            // Spelt in two halves, so that this test's own text names no module.
            for path in [concat!("crate::", "config"), concat!("super::super::", "config")] {
                assert!(!code.contains(path), "{file}: {path}");
            }
        }
    }
}
