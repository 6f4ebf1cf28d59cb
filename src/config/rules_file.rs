//! `RULES_FILE`: the rule table's settings in TOML, point for point what the environment
//! says in variables, so the table can live in a ConfigMap and be reloaded without a restart.
//!
//! ```toml
//! auth_paths = ["/login", "/signup"]     # AUTH_PATHS
//! skip_paths = ["/healthz"]              # SKIP_PATHS
//! exempt = ["10.0.0.0/8"]                # EXEMPT
//! costs = { "/export" = 5 }              # COSTS
//! shadow = false                         # SHADOW_MODE
//! ipv6_prefix = 64                       # IPV6_PREFIX
//!
//! [general]
//! limits = "token_bucket:100:10"         # LIMITS (a list: "a+b", or ["a", "b"])
//! key = "ip"                             # KEY_BY
//! fail = "open"                          # FAIL_MODE
//! delay = 500                            # DELAY_MAX_MS
//!
//! [auth]
//! limits = "token_bucket:5:0.01"         # AUTH_LIMITS
//! key = "ip"                             # AUTH_KEY_BY
//! count = "failures"                     # AUTH_COUNT
//! fail = "closed"                        # AUTH_FAIL_MODE
//! delay = 0                              # AUTH_DELAY_MAX_MS
//!
//! [[routes]]                             # one route each, in order, as ROUTES would
//! name = "api"
//! path = "/api/*"
//! limits = ["token_bucket:20:10", "fixed_window:10000:86400"]
//! key = "header:X-API-Key"
//! cost = 2
//! method = ["GET", "HEAD"]
//! shadow = true
//! count = "failures"
//! fail = "local"
//! delay = 1500
//! ```
//!
//! Its top-level, `[general]` and `[auth]` settings are translated into the variables they
//! stand for, which the environment's parsers then read, so both mean exactly the same. Its
//! `[[routes]]` are read here into routes ([`RouteEntry`]: path and limits parsed, each other
//! key handed to its attribute's parser in `config::spec`, the one `ROUTES` uses), which take
//! the place of `ROUTES`. What only the file can get wrong is checked here (an unknown key,
//! with the likely one; a wrong type); what the parsers find wrong is located afterwards
//! ([`RulesFile::locate`]; a route's errors carry its place): every error names the file, the
//! line and the setting. A setting given in both the file and the environment is an error
//! naming both.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::ConfigError;
use super::spec::{self, RouteEntry, Toml, Written};
use crate::algorithms::{Limits, parse_limit, parse_limits};
use crate::rules::pattern::PathPattern;
use crate::suggest;
use crate::variables::{self as vars, Var};

/// The largest rules file read: a table is kilobytes; more is a mistake or an attack.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// A rules file, read and translated.
#[derive(Debug, Clone)]
pub(crate) struct RulesFile {
    /// The path, as `RULES_FILE` names it.
    path: String,
    /// The variables it sets, each with where.
    pub(crate) vars: Vec<(Var, String, Origin)>,
    /// Each list entry it sets (an auth path, a cost, ...), with where: an error about one
    /// entry is located at its own line.
    entries: Vec<(Var, String, Origin)>,
    /// Its `[[routes]]`, in order: read here, in place of `ROUTES`.
    routes: Vec<RouteEntry>,
    /// The bytes read, for telling a later change of the file from none.
    pub(crate) bytes: Vec<u8>,
}

/// Where in the file a setting is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// 1-based.
    line: usize,
    /// The setting's name in the file (`routes[2].limits`, `auth_paths`).
    setting: String,
}

/// The top-level settings, each the variable it stands for and how its value is written.
const TOP: &[(&str, Var, Kind)] = &[
    ("auth_paths", vars::AUTH_PATHS, Kind::List(",")),
    ("skip_paths", vars::SKIP_PATHS, Kind::List(",")),
    ("exempt", vars::EXEMPT, Kind::List(",")),
    ("costs", vars::COSTS, Kind::Costs),
    ("shadow", vars::SHADOW_MODE, Kind::Flag),
    ("ipv6_prefix", vars::IPV6_PREFIX, Kind::Number),
];

/// `[general]`.
const GENERAL: &[(&str, Var, Kind)] = &[
    ("limits", vars::LIMITS, Kind::Limits),
    ("key", vars::KEY_BY, Kind::Text),
    ("fail", vars::FAIL_MODE, Kind::Text),
    ("delay", vars::DELAY_MAX_MS, Kind::Number),
];

/// `[auth]`.
const AUTH: &[(&str, Var, Kind)] = &[
    ("limits", vars::AUTH_LIMITS, Kind::Limits),
    ("key", vars::AUTH_KEY_BY, Kind::Text),
    ("count", vars::AUTH_COUNT, Kind::Text),
    ("fail", vars::AUTH_FAIL_MODE, Kind::Text),
    ("delay", vars::AUTH_DELAY_MAX_MS, Kind::Number),
];

/// How a setting's value is written in TOML.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A string.
    Text,
    /// A boolean.
    Flag,
    /// A whole number.
    Number,
    /// An array of strings, joined with the separator for the variable.
    List(&'static str),
    /// A table of path patterns to whole numbers.
    Costs,
    /// A limit list: a string (`"token_bucket:20:10+fixed_window:10000:86400"`) or an array
    /// of limits (`["token_bucket:20:10", "fixed_window:10000:86400"]`), joined with `+`.
    Limits,
}

/// The bytes of the file at `path`, at most [`MAX_FILE_BYTES`]: one byte past the bound is read,
/// so a file that grows while read is refused too. The error says why, without the path.
pub(crate) fn read_bounded(path: &str) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE_BYTES + 1), &mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "more than {MAX_FILE_BYTES} bytes; a rules file is at most that"
        ));
    }
    Ok(bytes)
}

impl RulesFile {
    /// `RULES_FILE`'s file, read and translated; `None` when unset.
    pub(crate) fn load(path: Option<&str>) -> Result<Option<RulesFile>, ConfigError> {
        let Some(path) = path else {
            return Ok(None);
        };
        let error = |location: String, problem: String| ConfigError::File {
            var: vars::RULES_FILE.name,
            location,
            problem,
        };
        let file =
            std::fs::File::open(path).map_err(|e| error(path.to_owned(), format!("cannot be read: {e}")))?;
        // Read one byte past the bound, so a file that grows while read is refused too.
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE_BYTES + 1), &mut text)
            .map_err(|e| error(path.to_owned(), format!("cannot be read as UTF-8 text: {e}")))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(error(
                path.to_owned(),
                format!("more than {MAX_FILE_BYTES} bytes; a rules file is at most that"),
            ));
        }
        let mut file = RulesFile::parse(path, &text)?;
        file.bytes = text.into_bytes();
        Ok(Some(file))
    }

    /// Translate `text`, the file at `path`.
    pub(crate) fn parse(path: &str, text: &str) -> Result<RulesFile, ConfigError> {
        let mut file = RulesFile {
            path: path.to_owned(),
            vars: Vec::new(),
            entries: Vec::new(),
            routes: Vec::new(),
            bytes: Vec::new(),
        };
        let lines: Vec<usize> = memchr::memchr_iter(b'\n', text.as_bytes()).collect();
        let reader = Reader {
            file: &file,
            text,
            lines,
        };
        let table = DeTable::parse(text).map_err(|e| {
            let line = e.span().map_or(1, |span| reader.line(span.start));
            reader.file.error(line, "", e.message().to_owned())
        })?;
        let mut routes = Vec::new();
        let mut found = Vec::new();
        for (key, value) in table.get_ref() {
            let name = key.get_ref().as_ref();
            let line = reader.line(key.span().start);
            match name {
                "general" | "auth" => found.extend(reader.section(name, line, value)?),
                "routes" => {
                    let DeValue::Array(array) = value.get_ref() else {
                        return Err(reader.file.error(line, name, "expected [[routes]] tables".into()));
                    };
                    for (index, route) in array.iter().enumerate() {
                        routes.push(reader.route(index, route)?);
                    }
                }
                _ => {
                    let Some((_, var, kind)) = TOP.iter().find(|(known, ..)| *known == name) else {
                        let names = TOP
                            .iter()
                            .map(|(name, ..)| *name)
                            .chain(["general", "auth", "routes"]);
                        return Err(reader.unknown(key, name, names));
                    };
                    found.push(reader.setting(*var, *kind, name, value)?);
                }
            }
        }
        for (var, value, origin, entries) in found {
            file.entries
                .extend(entries.into_iter().map(|(entry, origin)| (var, entry, origin)));
            file.vars.push((var, value, origin));
        }
        file.routes = routes;
        Ok(file)
    }

    /// Its routes, in place of `ROUTES`; `None` when it has none.
    pub(crate) fn routes(&self) -> Option<Vec<RouteEntry>> {
        (!self.routes.is_empty()).then(|| self.routes.clone())
    }

    /// The variables of the environment (`vars`) with the file's added; a variable set both
    /// ways is an error naming both (`ROUTES` with the file's routes too).
    pub(crate) fn merge(&self, env: &[(String, String)]) -> Result<Vec<(String, String)>, ConfigError> {
        let set = |var: Var| {
            env.iter()
                .any(|(name, value)| name == var.name && !value.trim().is_empty())
        };
        let conflict = |var: Var, setting: &str, line: usize| {
            ConfigError::Conflict(format!(
                "{} is set in the environment and {setting} in RULES_FILE {} (line {line}): set it in one place",
                var.name, self.path
            ))
        };
        if let Some((var, _, origin)) = self.vars.iter().find(|(var, ..)| set(*var)) {
            return Err(conflict(*var, &origin.setting, origin.line));
        }
        // The file's routes take the place of ROUTES.
        if let Some(Written::File { line, .. }) = self.routes.first().map(|route| &route.at)
            && set(vars::ROUTES)
        {
            return Err(conflict(vars::ROUTES, "routes[0]", *line));
        }
        let mut merged = env.to_vec();
        merged.extend(
            self.vars
                .iter()
                .map(|(var, value, _)| (var.name.to_owned(), value.clone())),
        );
        Ok(merged)
    }

    /// `error`, from a parser of the variables, located in the file when what it is about
    /// came from there: the file, the line, the setting, then the parser's own words.
    pub(crate) fn locate(&self, error: ConfigError) -> ConfigError {
        let origin = match &error {
            ConfigError::Entry { var, entry, .. } => self
                .entries
                .iter()
                .find(|(held, text, _)| held.name == *var && text == entry)
                .or_else(|| self.vars.iter().find(|(held, ..)| held.name == *var))
                .map(|(_, _, origin)| origin),
            ConfigError::Invalid { var, .. }
            | ConfigError::Missing { var, .. }
            | ConfigError::InvalidSecret { var, .. } => self
                .vars
                .iter()
                .find(|(held, ..)| held.name == *var)
                .map(|(_, _, origin)| origin),
            // A conflict names variables in its words: the first of the file's it names.
            ConfigError::Conflict(words) => self
                .vars
                .iter()
                .find(|(held, ..)| mentions(words, held.name))
                .map(|(_, _, origin)| origin),
            ConfigError::File { .. } => None,
        };
        match origin {
            Some(origin) => self.error(origin.line, &origin.setting, error.to_string()),
            None => error,
        }
    }

    fn error(&self, line: usize, setting: &str, problem: String) -> ConfigError {
        let location = match setting {
            "" => format!("{}:{line}", self.path),
            setting => format!("{}:{line}: {setting}", self.path),
        };
        ConfigError::File {
            var: vars::RULES_FILE.name,
            location,
            problem,
        }
    }
}

/// Whether `words` name the variable `name` (as a whole word: `LIMITS` is not in `AUTH_LIMITS`).
fn mentions(words: &str, name: &str) -> bool {
    words
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word == name)
}

/// One setting's value in the variables' words, where it is, and its list entries with theirs.
type Found = (Var, String, Origin, Vec<(String, Origin)>);

/// Reads values out of the parsed file, naming where each is.
struct Reader<'a> {
    file: &'a RulesFile,
    text: &'a str,
    /// The offset of every newline, in order: a setting's line is found by binary search, not
    /// by counting from the start for each of thousands of entries.
    lines: Vec<usize>,
}

impl Reader<'_> {
    /// The 1-based line of byte `offset`.
    fn line(&self, offset: usize) -> usize {
        self.lines
            .partition_point(|&newline| newline < offset.min(self.text.len()))
            + 1
    }

    fn origin(&self, span: Range<usize>, setting: &str) -> Origin {
        Origin {
            line: self.line(span.start),
            setting: setting.to_owned(),
        }
    }

    fn fail(&self, span: Range<usize>, setting: &str, problem: String) -> ConfigError {
        self.file.error(self.line(span.start), setting, problem)
    }

    /// An unknown key, with the likely one.
    fn unknown<'n>(
        &self,
        key: &Spanned<toml::de::DeString<'_>>,
        setting: &str,
        names: impl Iterator<Item = &'n str> + Clone,
    ) -> ConfigError {
        let name = key.get_ref().as_ref();
        let hint = match suggest::closest(name, names.clone(), 3) {
            Some(near) => format!("; did you mean {near:?}?"),
            None => String::new(),
        };
        let variable = vars::ALL.iter().any(|var| var.name.eq_ignore_ascii_case(name));
        let live = if variable {
            format!(
                " ({} is read from the environment at start only: a rules file holds the rule table, \
                 which is what reloads)",
                name.to_ascii_uppercase()
            )
        } else {
            String::new()
        };
        let known: Vec<&str> = names.collect();
        self.fail(
            key.span(),
            setting,
            format!(
                "unknown setting {name:?}{live}{hint} (known here: {})",
                known.join(", ")
            ),
        )
    }

    /// One setting of `kind`, as its variable writes it.
    fn setting(
        &self,
        var: Var,
        kind: Kind,
        setting: &str,
        value: &Spanned<DeValue<'_>>,
    ) -> Result<Found, ConfigError> {
        let origin = self.origin(value.span(), setting);
        let mut entries = Vec::new();
        let text = match (kind, value.get_ref()) {
            (Kind::Text, DeValue::String(text)) => self.entry_text(value.span(), setting, text)?,
            (Kind::Limits, _) => self.limit_list(setting, value)?.0,
            (Kind::Flag, DeValue::Boolean(flag)) => flag.to_string(),
            (Kind::Number, DeValue::Integer(_)) => self.number(setting, value)?.to_string(),
            (Kind::List(separator), DeValue::Array(items)) => {
                let mut texts = Vec::new();
                for (index, item) in items.iter().enumerate() {
                    let at = format!("{setting}[{index}]");
                    let DeValue::String(text) = item.get_ref() else {
                        return Err(self.fail(item.span(), &at, "expected a string".into()));
                    };
                    let text = self.entry_text(item.span(), &at, text)?;
                    entries.push((text.clone(), self.origin(item.span(), &at)));
                    texts.push(text);
                }
                texts.join(separator)
            }
            (Kind::Costs, DeValue::Table(costs)) => {
                let mut texts = Vec::new();
                for (pattern, cost) in costs {
                    let at = format!("{setting}.{:?}", pattern.get_ref().as_ref());
                    let pattern = self.entry_text(pattern.span(), &at, pattern.get_ref())?;
                    let entry = format!("{pattern}={}", self.number(&at, cost)?);
                    entries.push((entry.clone(), self.origin(cost.span(), &at)));
                    texts.push(entry);
                }
                texts.join(";")
            }
            (kind, _) => {
                let expected = match kind {
                    Kind::Text => "a string",
                    Kind::Limits => {
                        "a limit list, e.g. \"token_bucket:20:10+fixed_window:10000:86400\" or [\"token_bucket:20:10\", \"fixed_window:10000:86400\"]"
                    }
                    Kind::Flag => "true or false",
                    Kind::Number => "a whole number",
                    Kind::List(_) => "an array of strings, e.g. [\"/login\", \"/signup\"]",
                    Kind::Costs => "a table of path patterns to costs, e.g. { \"/export\" = 5 }",
                };
                return Err(self.fail(value.span(), setting, format!("expected {expected}")));
            }
        };
        Ok((var, text, origin, entries))
    }

    /// A limit list (see [`Kind::Limits`]) as `LIMITS` writes it, each limit checked here so
    /// that its error names its own line.
    fn limit_list(
        &self,
        setting: &str,
        value: &Spanned<DeValue<'_>>,
    ) -> Result<(String, Limits), ConfigError> {
        let text = match value.get_ref() {
            DeValue::String(text) => self.entry_text(value.span(), setting, text)?,
            DeValue::Array(items) if !items.is_empty() => {
                let mut texts = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    let at = format!("{setting}[{index}]");
                    let DeValue::String(text) = item.get_ref() else {
                        return Err(self.fail(item.span(), &at, "expected a string".into()));
                    };
                    let text = self.entry_text(item.span(), &at, text)?;
                    parse_limit(&text).map_err(|why| self.fail(item.span(), &at, why))?;
                    texts.push(text);
                }
                texts.join("+")
            }
            _ => {
                return Err(self.fail(
                    value.span(),
                    setting,
                    "expected a limit list, e.g. \"token_bucket:20:10+fixed_window:10000:86400\" or [\"token_bucket:20:10\", \"fixed_window:10000:86400\"]".into(),
                ));
            }
        };
        let limits = parse_limits(&text).map_err(|why| self.fail(value.span(), setting, why))?;
        Ok((text, limits))
    }

    /// A whole number of at least 0.
    fn number(&self, setting: &str, value: &Spanned<DeValue<'_>>) -> Result<u64, ConfigError> {
        match value.get_ref() {
            DeValue::Integer(integer) => {
                u64::from_str_radix(integer.as_str(), integer.radix()).map_err(|_| {
                    self.fail(
                        value.span(),
                        setting,
                        "expected a whole number of at least 0".into(),
                    )
                })
            }
            _ => Err(self.fail(value.span(), setting, "expected a whole number".into())),
        }
    }

    /// A string that becomes (part of) one entry of a variable: the separators of the
    /// variables (`,` `;` `=`) and whitespace would change what it means there.
    fn entry_text(&self, span: Range<usize>, setting: &str, text: &str) -> Result<String, ConfigError> {
        let text = text.trim();
        if let Some(bad) = text.chars().find(|c| c.is_whitespace() || [',', ';'].contains(c)) {
            return Err(self.fail(
                span,
                setting,
                format!(
                    "{text:?} holds {bad:?}, which no setting here can hold; use a list for several values"
                ),
            ));
        }
        if text.is_empty() {
            return Err(self.fail(span, setting, "expected a value, not an empty string".into()));
        }
        Ok(text.to_owned())
    }

    /// `[general]` or `[auth]` (`name`, at `line`): each setting as its variable writes it.
    fn section(
        &self,
        name: &str,
        line: usize,
        value: &Spanned<DeValue<'_>>,
    ) -> Result<Vec<Found>, ConfigError> {
        let settings = if name == "general" { GENERAL } else { AUTH };
        let DeValue::Table(section) = value.get_ref() else {
            return Err(self.file.error(line, name, format!("expected a table: [{name}]")));
        };
        let mut found = Vec::new();
        for (key, value) in section {
            let setting = format!("{name}.{}", key.get_ref());
            let known = settings
                .iter()
                .find(|(known, ..)| *known == key.get_ref().as_ref());
            let Some((_, var, kind)) = known else {
                let names = settings.iter().map(|(name, ..)| *name);
                return Err(self.unknown(key, &setting, names));
            };
            found.push(self.setting(*var, *kind, &setting, value)?);
        }
        Ok(found)
    }

    /// One `[[routes]]` table as its route: its path and limits parsed here, its other keys
    /// handed to their attributes' parsers ([`spec::ATTRIBUTES`]), and where it starts.
    fn route(&self, index: usize, route: &Spanned<DeValue<'_>>) -> Result<RouteEntry, ConfigError> {
        let at = format!("routes[{index}]");
        let DeValue::Table(table) = route.get_ref() else {
            return Err(self.fail(route.span(), &at, "expected a table: [[routes]]".into()));
        };
        // Where the table starts: its first key in the file (the map is sorted by name).
        let start = table.keys().map(|key| key.span().start).min();
        let line = self.line(start.unwrap_or(route.span().start));
        let (mut pattern, mut limits, mut attributes) = (None, None, Vec::new());
        for (key, value) in table {
            let name = key.get_ref().as_ref();
            let setting = format!("{at}.{name}");
            match (name, spec::attribute(name)) {
                ("path", _) => pattern = Some(self.route_path(&setting, value)?),
                ("limits", _) => limits = Some(self.limit_list(&setting, value)?.1),
                (_, Some(attribute)) => {
                    let text = self.attribute_text(attribute.toml, &setting, value)?;
                    attributes.push((attribute.name, text));
                }
                (_, None) => {
                    let names = ["path", "limits"]
                        .into_iter()
                        .chain(spec::ATTRIBUTES.iter().map(|attribute| attribute.name));
                    return Err(self.unknown(key, &setting, names));
                }
            }
        }
        let missing = |name: &str, example: &str| {
            let problem = format!("{name} is required, e.g. {name} = {example}");
            self.file.error(line, &at, problem)
        };
        Ok(RouteEntry {
            pattern: pattern.ok_or_else(|| missing("path", "\"/api/*\""))?,
            limits: limits.ok_or_else(|| missing("limits", "\"token_bucket:20:10\""))?,
            attributes,
            at: Written::File {
                path: self.file.path.clone(),
                line,
                setting: at,
            },
        })
    }

    /// A route's `path`: a path pattern, as `ROUTES` may write it.
    fn route_path(&self, setting: &str, value: &Spanned<DeValue<'_>>) -> Result<PathPattern, ConfigError> {
        let DeValue::String(text) = value.get_ref() else {
            return Err(self.fail(value.span(), setting, "expected a string".into()));
        };
        if text.contains('=') {
            let problem = format!("{text:?} holds '=', which no path pattern can");
            return Err(self.fail(value.span(), setting, problem));
        }
        let text = self.entry_text(value.span(), setting, text)?;
        PathPattern::parse(&text).map_err(|why| self.fail(value.span(), setting, format!("pattern: {why}")))
    }

    /// A route attribute's value as its parser reads it, checked to be of the TOML type
    /// `toml`: a string trimmed, a number in decimal, a flag `true` or `false`, methods joined
    /// by `|`.
    fn attribute_text(
        &self,
        toml: Toml,
        setting: &str,
        value: &Spanned<DeValue<'_>>,
    ) -> Result<String, ConfigError> {
        let wrong = |expected: &str| Err(self.fail(value.span(), setting, format!("expected {expected}")));
        match (toml, value.get_ref()) {
            (Toml::Text, DeValue::String(text)) => self.entry_text(value.span(), setting, text),
            (Toml::Text, _) => wrong("a string"),
            (Toml::Number, _) => Ok(self.number(setting, value)?.to_string()),
            (Toml::Count, _) => match self.number(setting, value)? {
                0 => wrong("a whole number of at least 1"),
                count => Ok(count.to_string()),
            },
            (Toml::Flag, DeValue::Boolean(flag)) => Ok(flag.to_string()),
            (Toml::Flag, _) => wrong("true or false"),
            (Toml::Methods, _) => self.methods(setting, value),
        }
    }

    /// A route's `method`: one name, or an array of at least one, joined by `|`.
    fn methods(&self, setting: &str, value: &Spanned<DeValue<'_>>) -> Result<String, ConfigError> {
        const EXPECTED: &str = "expected method names, e.g. [\"GET\", \"HEAD\"]";
        let methods = match value.get_ref() {
            DeValue::String(text) => vec![self.entry_text(value.span(), setting, text)?],
            DeValue::Array(items) => {
                let mut methods = Vec::new();
                for item in items.iter() {
                    let DeValue::String(text) = item.get_ref() else {
                        return Err(self.fail(item.span(), setting, EXPECTED.into()));
                    };
                    methods.push(self.entry_text(item.span(), setting, text)?);
                }
                methods
            }
            _ => return Err(self.fail(value.span(), setting, EXPECTED.into())),
        };
        if methods.is_empty() {
            return Err(self.fail(value.span(), setting, "expected at least one method".into()));
        }
        Ok(methods.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RulesFile, String> {
        RulesFile::parse("rules.toml", text).map_err(|error| error.to_string())
    }

    fn vars(text: &str) -> Vec<(&'static str, String)> {
        parse(text)
            .unwrap()
            .vars
            .into_iter()
            .map(|(var, value, _)| (var.name, value))
            .collect()
    }

    #[test]
    fn every_setting_becomes_the_variable_it_stands_for() {
        let file = r#"
auth_paths = ["/login", "/signup"]
skip_paths = ["/healthz"]
exempt = ["10.0.0.0/8", "key:abc"]
costs = { "/export" = 5, "/search/*" = 2 }
shadow = true
ipv6_prefix = 56

[general]
limits = "token_bucket:100:10"
key = "header:X-API-Key"
fail = "local"
delay = 500

[auth]
limits = "fixed_window:5:60"
key = "ip"
count = "failures"
fail = "closed"
delay = 0

[[routes]]
path = "/api/*"
limits = "token_bucket:20:10"
name = "api"
key = "ip+header:X-API-Key"
cost = 2
method = ["GET", "HEAD"]
shadow = true
count = "failures"
fail = "open"
delay = 1500

[[routes]]
path = "/upload"
limits = "sliding_window:10:60"
method = "POST"
shadow = false

[[routes]]
path = "/search"
limits = ["token_bucket:5:1", "fixed_window:1000:86400"]
"#;
        let mut got = vars(file);
        got.sort();
        let mut expected = vec![
            ("AUTH_PATHS", "/login,/signup".to_owned()),
            ("SKIP_PATHS", "/healthz".into()),
            ("EXEMPT", "10.0.0.0/8,key:abc".into()),
            ("COSTS", "/export=5;/search/*=2".into()),
            ("SHADOW_MODE", "true".into()),
            ("IPV6_PREFIX", "56".into()),
            ("LIMITS", "token_bucket:100:10".into()),
            ("KEY_BY", "header:X-API-Key".into()),
            ("FAIL_MODE", "local".into()),
            ("DELAY_MAX_MS", "500".into()),
            ("AUTH_DELAY_MAX_MS", "0".into()),
            ("AUTH_LIMITS", "fixed_window:5:60".into()),
            ("AUTH_KEY_BY", "ip".into()),
            ("AUTH_COUNT", "failures".into()),
            ("AUTH_FAIL_MODE", "closed".into()),
        ];
        expected.sort();
        assert_eq!(got, expected);
        // The routes are no variable: each is the specification its ROUTES entry would be.
        let routes = "/api/*=token_bucket:20:10,cost=2,count=failures,delay=1500,fail=open,key=ip+header:X-API-Key,method=GET|HEAD,name=api,shadow;/upload=sliding_window:10:60,method=POST;/search=token_bucket:5:1+fixed_window:1000:86400";
        let file = parse(file).unwrap();
        let from_file: Vec<_> = file.routes.iter().map(spec_of).collect();
        let from_routes: Vec<_> = routes
            .split(';')
            .map(|entry| spec_of(&RouteEntry::parse(entry).unwrap()))
            .collect();
        assert_eq!(from_file, from_routes);
        assert_eq!(from_file.len(), 3);
    }

    /// A route's specification over a general rule of one token bucket.
    fn spec_of(route: &RouteEntry) -> crate::rules::RuleSpec {
        let limits = parse_limits("token_bucket:100:10").unwrap();
        let general = crate::rules::RuleSpec::new("general", crate::rules::Matching::Rest, limits);
        let context = spec::Context { shared_store: true };
        route.spec(&general, &context, &mut Vec::new()).unwrap()
    }

    #[test]
    fn an_unknown_key_names_the_file_the_line_and_the_likely_name() {
        let error =
            parse("auth_paths = [\"/login\"]\n\n[general]\nlimit = \"token_bucket:1:1\"\n").unwrap_err();
        assert!(error.contains("rules.toml:4: general.limit"), "{error}");
        assert!(error.contains("did you mean \"limits\""), "{error}");
        let error =
            parse("[[routes]]\npath = \"/a\"\nlimits = \"token_bucket:1:1\"\ncots = 2\n").unwrap_err();
        assert!(error.contains("rules.toml:4: routes[0].cots"), "{error}");
        assert!(error.contains("did you mean \"cost\""), "{error}");
        // A variable that is not the table's: said so.
        let error = parse("port = 8080\n").unwrap_err();
        assert!(
            error.contains("read from the environment at start only"),
            "{error}"
        );
    }

    #[test]
    fn wrong_types_and_values_name_where_they_are() {
        for (text, location, words) in [
            ("shadow = \"yes\"\n", "rules.toml:1: shadow", "true or false"),
            (
                "auth_paths = \"/login\"\n",
                "rules.toml:1: auth_paths",
                "an array",
            ),
            (
                "auth_paths = [\"/login /signup\"]\n",
                "rules.toml:1: auth_paths[0]",
                "holds ' '",
            ),
            (
                "[[routes]]\npath = \"/a\"\n",
                "rules.toml:2: routes[0]",
                "limits is required",
            ),
            (
                "[[routes]]\nlimits = \"token_bucket:1:1\"\ncost = 0\npath = \"/a\"\n",
                "rules.toml:3: routes[0].cost",
                "at least 1",
            ),
            (
                "[[routes]]\npath = \"/a,b\"\nlimits = \"token_bucket:1:1\"\n",
                "rules.toml:2: routes[0].path",
                "holds ','",
            ),
            ("[general\n", "rules.toml:1", ""),
            (
                "[general]\nlimits = [\"token_bucket:5:1\",\n  \"fixed_window:0:60\"]\n",
                "rules.toml:3: general.limits[1]",
                "limit",
            ),
            (
                "[general]\nlimits = \"token_bucket:5:1+token_bucket:5:1\"\n",
                "rules.toml:2: general.limits",
                "written twice",
            ),
            (
                "[auth]\nlimits = []\n",
                "rules.toml:2: auth.limits",
                "a limit list",
            ),
            (
                "costs = { \"/x\" = -1 }\n",
                "rules.toml:1: costs.\"/x\"",
                "whole number",
            ),
        ] {
            let error = parse(text).unwrap_err();
            assert!(
                error.contains(location) && error.contains(words),
                "{text:?}: {error}"
            );
        }
    }

    #[test]
    fn a_missing_huge_or_binary_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name).display().to_string();
        let load = |path: &str| RulesFile::load(Some(path)).unwrap_err().to_string();
        let missing = path("missing.toml");
        assert!(load(&missing).contains(&format!("RULES_FILE: {missing}: cannot be read")));
        let huge = path("huge.toml");
        std::fs::write(&huge, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(load(&huge).contains("a rules file is at most"), "{}", load(&huge));
        let binary = path("binary.toml");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        assert!(load(&binary).contains("UTF-8"));
        assert!(RulesFile::load(None).unwrap().is_none());
    }

    #[test]
    fn a_setting_in_both_the_file_and_the_environment_is_an_error_naming_both() {
        let file = RulesFile::parse("rules.toml", "\n[auth]\nkey = \"ip\"\n").unwrap();
        let error = file
            .merge(&[("AUTH_KEY_BY".into(), "header:X-Key".into())])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("AUTH_KEY_BY") && error.contains("auth.key") && error.contains("line 3"),
            "{error}"
        );
        // Empty counts as unset, as everywhere.
        assert!(file.merge(&[("AUTH_KEY_BY".into(), " ".into())]).is_ok());
    }
}
