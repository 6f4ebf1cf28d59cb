//! The one typed specification of a rule, and the one step that compiles specifications
//! into a [`RuleTable`].
//!
//! Every source of rules produces [`RuleSpec`]s, each parsed once: a `ROUTES` entry and a
//! rules file's `[[routes]]` table (both through `config::spec`), `AUTH_PATHS` and the
//! general rule's variables (`config::rules`), and an Envoy descriptor's rate limit
//! (`rls::config`). [`RuleTable::compile`] numbers them and lays out their routes; nothing
//! else builds a table. A specification is a [`Rule`] (everything but its id) and what it
//! matches, so a new rule attribute is a field on [`Rule`] and its parser in `config::spec`.

use http::Method;

use crate::algorithms::Limits;
use crate::rules::key::KeyHasher;
use crate::rules::pattern::PathPattern;
use crate::rules::table::{Exemptions, Route, Rule, RuleTable, TableError};

/// One rule as configured, from whichever source: what it matches and how it limits.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    /// Which requests it takes.
    pub matching: Matching,
    /// How it limits them: its name (`general`, `auth`, a route's `name=` or pattern, an Envoy
    /// limit's place in its tree), limits, key, cost, shadow, count, fail mode and delay, as
    /// the table will hold it; its `id` is set when the table is compiled.
    pub rule: Rule,
}

/// Which requests a rule takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Matching {
    /// Requests for these paths (and methods), tried in the table's order: a `ROUTES` entry,
    /// a rules file's `[[routes]]` table, the auth rule's `AUTH_PATHS`.
    Paths(Vec<RouteSpec>),
    /// Every request no earlier rule takes: the general rule.
    Rest,
    /// None by its path: a door names it (an Envoy descriptor's limit).
    Named,
}

/// A path pattern that selects a rule, optionally for some methods only.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    /// Which paths.
    pub pattern: PathPattern,
    /// Which methods (`None`: all; `GET` takes `HEAD` too, added by the parser).
    pub methods: Option<Vec<Method>>,
}

impl RouteSpec {
    /// True when every request `later` matches is matched by `self`, which comes first.
    pub fn takes_all_of(&self, later: &RouteSpec) -> bool {
        let methods = match (&self.methods, &later.methods) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(earlier), Some(later)) => later.iter().all(|method| earlier.contains(method)),
        };
        methods && self.pattern.covers(&later.pattern)
    }
}

impl RuleSpec {
    /// A rule of `limits` named `name`, matching as `matching` says: keyed by IP, costing 1,
    /// enforced, counting every request, failing open, never delayed ([`Rule::new`]).
    pub fn new(name: &str, matching: Matching, limits: Limits) -> RuleSpec {
        RuleSpec {
            matching,
            rule: Rule::new(0, name, limits),
        }
    }

    /// The routes it is matched by (none for the general rule and named ones).
    pub fn routes(&self) -> &[RouteSpec] {
        match &self.matching {
            Matching::Paths(routes) => routes,
            Matching::Rest | Matching::Named => &[],
        }
    }

    /// The compiled rule, at `id` in its table.
    pub fn compiled(&self, id: u16) -> Rule {
        Rule {
            id,
            ..self.rule.clone()
        }
    }
}

/// Everything a table is compiled from.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// The rules requests are classified into, in the order their routes are tried; the
    /// general rule ([`Matching::Rest`]) last.
    pub rules: Vec<RuleSpec>,
    /// `COSTS`: the first matching entry prices the request.
    pub costs: Vec<(PathPattern, u64)>,
    /// `SKIP_PATHS`.
    pub skip: Vec<PathPattern>,
    /// `EXEMPT`.
    pub exempt: Exemptions,
    /// `IPV6_PREFIX`.
    pub ipv6_prefix: u8,
    /// Digests keys read from requests.
    pub hasher: KeyHasher,
}

impl RuleTable {
    /// The one compile step: `spec`'s rules numbered in order, their routes laid out in the
    /// same order. Its rules must end with the general rule, alone of [`Matching::Rest`];
    /// named rules come later, with [`RuleTable::with_named`].
    pub fn compile(spec: TableSpec) -> Result<RuleTable, TableError> {
        if spec.rules.len() > crate::rules::table::MAX_RULES {
            return Err(TableError::TooManyRules(spec.rules.len()));
        }
        let general = spec.rules.iter().position(|rule| rule.matching == Matching::Rest);
        if general.is_none() || general != spec.rules.len().checked_sub(1) {
            return Err(TableError::NoGeneralRule);
        }
        let mut routes = Vec::new();
        for (index, rule) in spec.rules.iter().enumerate() {
            routes.extend(rule.routes().iter().map(|route| Route {
                pattern: route.pattern.clone(),
                methods: route.methods.clone(),
                rule: index,
            }));
        }
        let rules = spec
            .rules
            .iter()
            .enumerate()
            // Below MAX_RULES, checked above.
            .map(|(id, rule)| rule.compiled(id as u16))
            .collect();
        RuleTable::new(
            rules,
            routes,
            spec.costs,
            spec.skip,
            spec.exempt,
            spec.ipv6_prefix,
            spec.hasher,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::parse_limits;

    fn spec(name: &str, matching: Matching) -> RuleSpec {
        RuleSpec::new(name, matching, parse_limits("token_bucket:5:1").unwrap())
    }

    fn table(rules: Vec<RuleSpec>) -> Result<RuleTable, TableError> {
        RuleTable::compile(TableSpec {
            rules,
            costs: Vec::new(),
            skip: Vec::new(),
            exempt: Exemptions::default(),
            ipv6_prefix: 64,
            hasher: KeyHasher::from_secret("0123456789abcdef"),
        })
    }

    fn route(pattern: &str) -> RouteSpec {
        RouteSpec {
            pattern: PathPattern::parse(pattern).unwrap(),
            methods: None,
        }
    }

    #[test]
    fn compiling_numbers_the_rules_in_order_and_lays_out_their_routes() {
        let table = table(vec![
            spec("api", Matching::Paths(vec![route("/api/*")])),
            spec("auth", Matching::Paths(vec![route("/login"), route("/signup")])),
            spec("general", Matching::Rest),
        ])
        .unwrap();
        let names: Vec<(u16, &str)> = table.rules().iter().map(|rule| (rule.id, &*rule.name)).collect();
        assert_eq!(names, [(0, "api"), (1, "auth"), (2, "general")]);
        assert_eq!(table.paths_of("auth"), "/login,/signup");
        assert_eq!(table.general().name.as_ref(), "general");
        let named = table.with_named(vec![spec("rls/d/k", Matching::Named)]).unwrap();
        assert_eq!(named.named()[0].id, 3);
    }

    #[test]
    fn a_table_without_the_general_rule_last_is_refused() {
        for rules in [
            vec![spec("api", Matching::Paths(vec![route("/api/*")]))],
            vec![
                spec("general", Matching::Rest),
                spec("api", Matching::Paths(vec![])),
            ],
            vec![],
        ] {
            assert_eq!(table(rules).unwrap_err(), TableError::NoGeneralRule);
        }
    }

    /// The specification is the rules' own: it reads no source of them, so every source
    /// (config, rls) may import it without a circle.
    #[test]
    fn the_specification_imports_no_source_of_rules() {
        let source = include_str!("spec.rs");
        let code = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        // Spelt in two halves, so that this test's own text names no module.
        for module in ["config", "rls", "gate", "proxy", "decide"] {
            assert!(!code.contains(&format!("{}::{module}", "crate")), "{module}");
        }
    }
}
