//! Which limit applies to one request descriptor, as envoyproxy/ratelimit finds it.
//!
//! The descriptor's entries are walked down the domain's tree, one level each. At each level
//! the entry's key and value pick the most specific child: the exact value first, then the
//! first wildcard (`value: foo*`, `bar*b`, `foo*bar*baz`: each `*` any run of characters) in
//! file order that matches, then the key's value-less child (any value; each value is its own
//! budget, since the budget's key is the whole descriptor). The walk stops at an entry nothing
//! matches, or at a node with no children. The limit is that of the node the *last* entry
//! reached: a descriptor with more entries than the tree is deep, or one that stops short of a
//! node with a limit, matches nothing, as in that service (its `test/config/basic_config.yaml`
//! cases `key2=value2, subkey=subvalue` and `key5=value5, subkey5=subvalue`).
//!
//! An entry matched by a wildcard with `share_threshold: true` (at any level on the way, as
//! that service tracks them) spends its budget under the pattern instead of its value: every
//! value the pattern matches shares one budget. An exact value still wins over the wildcard.
//!
//! [`metric_key`] walks the same way to build that service's stat key for a limit with
//! `detailed_metric` or `value_to_metric`: asked only for those, so [`find`] stays as it was.

use super::config::{DescriptorNode, DescriptorTable, LimitId, Wildcard};

/// What one descriptor matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'t> {
    /// The limit.
    pub limit: LimitId,
    /// The entries (by index) matched by a `share_threshold` wildcard, each with its pattern:
    /// the budget is keyed by the pattern for them. Empty (no allocation) for most.
    pub shared: Vec<(usize, &'t str)>,
}

/// The limit the descriptor `entries` (`(key, value)`, in order) of `domain` falls under;
/// `None` for an unknown domain, no entries, or no match.
pub fn find<'t, 'e, I>(table: &'t DescriptorTable, domain: &str, entries: I) -> Option<Found<'t>>
where
    I: IntoIterator<Item = (&'e str, &'e str)>,
    I::IntoIter: ExactSizeIterator,
{
    let mut node = table.domains.get(domain)?;
    let entries = entries.into_iter();
    let last = entries.len().checked_sub(1)?;
    let mut shared = Vec::new();
    for (index, (key, value)) in entries.enumerate() {
        let (next, share) = step(node, key, value)?;
        if let Some(pattern) = share {
            shared.push((index, pattern));
        }
        if index == last {
            return next.limit.map(|limit| Found { limit, shared });
        }
        if next.children.is_empty() {
            return None;
        }
        node = next;
    }
    None
}

/// The child of `node` that the entry `key=value` matches, the most specific first, and the
/// pattern of a `share_threshold` wildcard that matched it.
fn step<'t>(
    node: &'t DescriptorNode,
    key: &str,
    value: &str,
) -> Option<(&'t DescriptorNode, Option<&'t str>)> {
    let (next, how) = step_how(node, key, value)?;
    let share = match how {
        How::Wildcard(wildcard) if wildcard.share => Some(wildcard.pattern.as_str()),
        _ => None,
    };
    Some((next, share))
}

/// How an entry matched its child.
#[derive(Clone, Copy)]
enum How<'t> {
    /// Its value exactly.
    Exact,
    /// This wildcard.
    Wildcard(&'t Wildcard),
    /// The key's value-less child.
    Any,
}

/// The child of `node` that the entry `key=value` matches, the most specific first, and how.
#[inline]
fn step_how<'t>(node: &'t DescriptorNode, key: &str, value: &str) -> Option<(&'t DescriptorNode, How<'t>)> {
    let children = node.children.get(key)?;
    if let Some(exact) = children.exact.get(value) {
        return Some((exact, How::Exact));
    }
    if let Some(wildcard) = children.wildcards.iter().find(|wildcard| wildcard.matches(value)) {
        return Some((&wildcard.node, How::Wildcard(wildcard)));
    }
    children.any.as_deref().map(|any| (any, How::Any))
}

/// Longest part of a request's value written into a metric key, in bytes (cut at a character
/// boundary): a client chooses the values, and a label value is held for every series.
pub const MAX_METRIC_VALUE_BYTES: usize = 64;

/// The metric key of a descriptor whose limit is `limit` (found by [`find`] for these
/// `entries`), as envoyproxy/ratelimit builds its stat key: the domain, then `key_value` (or
/// `key`) for each entry, joined with `.`.
///
/// - With the limit's `detailed_metric`: every entry's value as the request sent it (an entry
///   of a `share_threshold` wildcard: its pattern).
/// - Else, per entry: a value the configuration names exactly, that value; a wildcard's match:
///   the request's value with the descriptor's `value_to_metric`, the pattern without it (or
///   with `share_threshold`); a match by the key alone: the request's value with
///   `value_to_metric`, else the key alone.
///
/// An empty value is written as the key alone (no `_`), a request's value cut to
/// [`MAX_METRIC_VALUE_BYTES`] with its control characters as `_`. `None` when the entries do
/// not walk the domain's tree (not a descriptor [`find`] matched).
pub fn metric_key<'e, I>(table: &DescriptorTable, domain: &str, detailed: bool, entries: I) -> Option<String>
where
    I: IntoIterator<Item = (&'e str, &'e str)>,
{
    let mut node = table.domains.get(domain)?;
    let mut key = String::with_capacity(64);
    push_value(&mut key, domain);
    for (name, value) in entries {
        let (next, how) = step_how(node, name, value)?;
        let written = match how {
            How::Wildcard(wildcard) if wildcard.share => Written::Config(&wildcard.pattern),
            _ if detailed => Written::Request(value),
            How::Exact => Written::Config(value),
            How::Wildcard(_) if next.value_to_metric => Written::Request(value),
            How::Wildcard(wildcard) => Written::Config(&wildcard.pattern),
            How::Any if next.value_to_metric => Written::Request(value),
            How::Any => Written::Config(""),
        };
        key.push('.');
        push_value(&mut key, name);
        match written {
            Written::Config("") | Written::Request("") => {}
            Written::Config(text) => {
                key.push('_');
                push_value(&mut key, text);
            }
            Written::Request(text) => {
                key.push('_');
                push_value(&mut key, cut(text, MAX_METRIC_VALUE_BYTES));
            }
        }
        node = next;
    }
    Some(key)
}

/// What an entry writes after its key.
enum Written<'a> {
    /// Text of the configuration (bounded by it).
    Config(&'a str),
    /// The request's value (cut).
    Request(&'a str),
}

/// `text` with its control characters as `_`.
fn push_value(key: &mut String, text: &str) {
    key.extend(text.chars().map(|c| if c.is_control() { '_' } else { c }));
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// envoyproxy/ratelimit's `test/config/basic_config.yaml`.
    const BASIC: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: key2
    value: value3
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
  - key: key6
    rate_limit:
      unlimited: true
  - key: key7
    rate_limit:
      requests_per_unit: 70
      unit: minute
    detailed_metric: true
";

    /// envoyproxy/ratelimit's `test/config/wildcard.yaml`.
    const WILDCARD: &str = "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
";

    /// The cases of envoyproxy/ratelimit's `test/config/share_threshold.yaml`, written anew.
    const SHARE_THRESHOLD: &str = "
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
";

    fn table(text: &str) -> DescriptorTable {
        DescriptorTable::parse([("test.yaml", text)]).unwrap()
    }

    /// The rule name of what `entries` match, or `None`.
    fn matched(table: &DescriptorTable, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
        find(table, domain, entries.iter().copied()).map(|found| table.limits[found.limit].rule.to_string())
    }

    #[test]
    fn the_reference_basic_config_matches_as_the_reference_does() {
        let t = table(BASIC);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (&[], None),
            (&[("key1", "something")], None),
            // A node without a limit.
            (&[("key1", "value1")], None),
            // More entries than the tree below key2=value2.
            (&[("key2", "value2"), ("subkey", "subvalue")], None),
            // key5=value5 has a limit, but the request goes on and subkey5 does not match.
            (&[("key5", "value5"), ("subkey5", "subvalue")], None),
            (
                &[("key1", "value1"), ("subkey1", "something")],
                Some("rls/test-domain/key1=value1/subkey1"),
            ),
            (
                &[("key1", "value1"), ("subkey1", "subvalue1")],
                Some("rls/test-domain/key1=value1/subkey1=subvalue1"),
            ),
            (&[("key2", "something")], Some("rls/test-domain/key2")),
            (&[("key2", "value2")], Some("rls/test-domain/key2=value2")),
            // Exact value without a limit: whitelisted, not the key-only limit.
            (&[("key2", "value3")], None),
            (&[("key3", "foo")], Some("rls/test-domain/key3")),
            (&[("key4", "foo")], Some("rls/test-domain/key4")),
            (&[("key5", "value5")], Some("rls/test-domain/key5=value5")),
            (
                &[("key5", "value5"), ("subkey5", "subvalue5")],
                Some("rls/test-domain/key5=value5/subkey5=subvalue5"),
            ),
            (&[("key6", "foo")], Some("rls/test-domain/key6")),
            (&[("key7", "unspecified_value")], Some("rls/test-domain/key7")),
        ];
        for (entries, expected) in cases {
            assert_eq!(
                matched(&t, "test-domain", entries).as_deref(),
                *expected,
                "{entries:?}"
            );
        }
        assert_eq!(matched(&t, "foo_domain", &[("key2", "x")]), None);
    }

    #[test]
    fn the_reference_wildcard_config_matches_anywhere_in_a_value() {
        let t = table(WILDCARD);
        let domain = "test-domain";
        let of = |entries: &[(&str, &str)]| matched(&t, domain, entries);
        assert!(of(&[("noVal", "foo1")]).is_some());
        assert_eq!(of(&[("noVal", "foo1")]), of(&[("noVal", "foo2")]));
        let wild = of(&[("wild", "foo1")]);
        assert_eq!(wild.as_deref(), Some("rls/test-domain/wild=foo*"));
        assert_eq!(of(&[("wild", "foo2")]), wild);
        assert_eq!(of(&[("wild", "foo")]), wild);
        assert_eq!(of(&[("wild", "bar")]), None);
        assert_eq!(of(&[("noWild", "foo1")]), None);
        // A wildcard below the top level.
        assert_eq!(
            of(&[("nestedWild", "val1"), ("wild", "goo2")]).as_deref(),
            Some("rls/test-domain/nestedWild=val1/wild=goo*")
        );
        assert_eq!(of(&[("nestedWild", "val1"), ("wild", "foo2")]), None);
        // In the middle: the prefix and the suffix, anything (or nothing) between.
        let mid = Some("rls/test-domain/midWild=bar*b");
        for value in ["barab", "bar123b", "barb", "bar*b"] {
            assert_eq!(of(&[("midWild", value)]).as_deref(), mid, "{value}");
        }
        for value in ["bara", "xbarb", "bar", "ba", "b", ""] {
            assert_eq!(of(&[("midWild", value)]), None, "{value}");
        }
        // Several: each part in order.
        let multi = Some("rls/test-domain/multiWild=foo*bar*baz");
        for value in ["foo123bar456baz", "foobarbaz", "foobazbarbaz"] {
            assert_eq!(of(&[("multiWild", value)]).as_deref(), multi, "{value}");
        }
        for value in ["foo123baz", "bar456baz", "foobarba", "foobaz", "xfoobarbaz"] {
            assert_eq!(of(&[("multiWild", value)]), None, "{value}");
        }
    }

    #[test]
    fn a_pattern_never_lets_its_prefix_and_suffix_overlap() {
        let t = table(
            "
domain: d
descriptors:
  - key: k
    value: ab*ba
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: star
    value: '*'
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: stars
    value: a**b
    rate_limit: { unit: second, requests_per_unit: 1 }
",
        );
        assert_eq!(matched(&t, "d", &[("k", "aba")]), None);
        assert_eq!(
            matched(&t, "d", &[("k", "abba")]).as_deref(),
            Some("rls/d/k=ab*ba")
        );
        assert!(matched(&t, "d", &[("star", "")]).is_some());
        assert!(matched(&t, "d", &[("star", "anything")]).is_some());
        assert!(matched(&t, "d", &[("stars", "ab")]).is_some());
        assert!(matched(&t, "d", &[("stars", "a-b")]).is_some());
        assert_eq!(matched(&t, "d", &[("stars", "ba")]), None);
        // Non-ASCII values: parts are found on character boundaries.
        assert_eq!(
            matched(&t, "d", &[("k", "abéba")]).as_deref(),
            Some("rls/d/k=ab*ba")
        );
    }

    /// The reference's `share_threshold.yaml` cases: which limit, and which entries are keyed by
    /// the pattern.
    #[test]
    fn the_reference_share_threshold_config_shares_one_budget_per_pattern() {
        let t = table(SHARE_THRESHOLD);
        let found = |entries: &[(&str, &str)]| {
            find(&t, "test-domain", entries.iter().copied())
                .map(|found| (t.limits[found.limit].rule.to_string(), found.shared))
        };
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a [(usize, &'a str)]);
        let cases: &[Case] = &[
            (
                &[("files", "files/a.pdf")],
                "rls/test-domain/files=files%2F*",
                &[(0, "files/*")],
            ),
            (
                &[("files", "files/b.csv")],
                "rls/test-domain/files=files%2F*",
                &[(0, "files/*")],
            ),
            (
                &[("nested", "parent"), ("files", "nested/x")],
                "rls/test-domain/nested=parent/files=nested%2F*",
                &[(1, "nested/*")],
            ),
            (
                &[("files", "top/1"), ("files", "nested/2")],
                "rls/test-domain/files=top%2F*/files=nested%2F*",
                &[(0, "top/*"), (1, "nested/*")],
            ),
            // share_threshold: false below a sharing wildcard: that entry keeps its value.
            (
                &[("path", "path/a"), ("file", "file/b"), ("type", "pdf")],
                "rls/test-domain/path=path%2F*/file=file%2F*/type",
                &[(0, "path/*")],
            ),
            // An explicit value beats the wildcard, and has its own budget.
            (&[("file", "test1")], "rls/test-domain/file=test1", &[]),
            (
                &[("file", "test2")],
                "rls/test-domain/file=test*",
                &[(0, "test*")],
            ),
            (
                &[("midpath", "/api/users/v1")],
                "rls/test-domain/midpath=%2Fapi*v1",
                &[(0, "/api*v1")],
            ),
            (
                &[("multiroute", "svc-a-ep-b-rpc")],
                "rls/test-domain/multiroute=svc*ep*rpc",
                &[(0, "svc*ep*rpc")],
            ),
            (
                &[("tenant", "t1prod"), ("resource", "res1v2")],
                "rls/test-domain/tenant=t*prod/resource=res*v2",
                &[(0, "t*prod"), (1, "res*v2")],
            ),
        ];
        for (entries, rule, shared) in cases {
            assert_eq!(
                found(entries),
                Some((rule.to_string(), shared.to_vec())),
                "{entries:?}"
            );
        }
        assert_eq!(found(&[("midpath", "/api/users/v2")]), None);
        assert_eq!(found(&[("tenant", "t1prod"), ("resource", "res1v3")]), None);
    }

    #[test]
    fn the_most_specific_child_wins_at_every_level() {
        let t = table(
            "
domain: d
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: k
    value: ab*
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: k
    value: a*
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: k
    value: abc
    rate_limit: { unit: second, requests_per_unit: 4 }
  - key: outer
    descriptors:
      - key: inner
        value: x*
        rate_limit: { unit: second, requests_per_unit: 5 }
",
        );
        assert_eq!(matched(&t, "d", &[("k", "abc")]).as_deref(), Some("rls/d/k=abc"));
        // The first prefix in file order.
        assert_eq!(matched(&t, "d", &[("k", "abd")]).as_deref(), Some("rls/d/k=ab*"));
        assert_eq!(matched(&t, "d", &[("k", "azz")]).as_deref(), Some("rls/d/k=a*"));
        assert_eq!(matched(&t, "d", &[("k", "zzz")]).as_deref(), Some("rls/d/k"));
        assert_eq!(matched(&t, "d", &[("other", "abc")]), None);
        assert_eq!(
            matched(&t, "d", &[("outer", "any"), ("inner", "xyz")]).as_deref(),
            Some("rls/d/outer/inner=x*")
        );
        assert_eq!(matched(&t, "d", &[("outer", "any"), ("inner", "y")]), None);
        assert_eq!(matched(&t, "d", &[("outer", "any")]), None);
    }

    /// The metric key of what `entries` match, whatever the limit's flags (so the keys of
    /// envoyproxy/ratelimit's cases without them can be compared too), and whether the limit
    /// counts per descriptor at all.
    fn stat(table: &DescriptorTable, domain: &str, entries: &[(&str, &str)]) -> (String, bool) {
        let found = find(table, domain, entries.iter().copied()).expect("a limit");
        let limit = &table.limits[found.limit];
        let key = metric_key(table, domain, limit.detailed_metric, entries.iter().copied()).expect("a key");
        (key, limit.per_descriptor())
    }

    /// envoyproxy/ratelimit's `TestDetailedMetric`, its YAML written anew.
    #[test]
    fn detailed_metric_keys_are_the_reference_ones() {
        let nested = |detailed: bool| {
            table(&format!(
                "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {detailed}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: key-2\n        detailed_metric: {detailed}\n        rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
            ))
        };
        let on = nested(true);
        let off = nested(false);
        let one = [("key-1", "value-1")];
        let two = [("key-1", "value-1"), ("key-2", "value-2")];
        assert_eq!(stat(&on, "nested", &one), ("nested.key-1_value-1".into(), true));
        assert_eq!(stat(&off, "nested", &one), ("nested.key-1".into(), false));
        assert_eq!(
            stat(&on, "nested", &two),
            ("nested.key-1_value-1.key-2_value-2".into(), true)
        );
        assert_eq!(stat(&off, "nested", &two), ("nested.key-1.key-2".into(), false));

        let realistic = table(
            "
domain: nested
descriptors:
  - key: key_1
    rate_limit: {unit: minute, requests_per_unit: 500}
    detailed_metric: true
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    rate_limit: {unit: minute, requests_per_unit: 5000}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {unit: minute, requests_per_unit: 5}
        detailed_metric: true
  - key: key_2
    value: specific-id
    rate_limit: {unit: minute, requests_per_unit: 50000}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {unit: minute, requests_per_unit: 100}
        detailed_metric: true
",
        );
        for (entries, key) in [
            (
                &[("key_1", "value-for-key-1")][..],
                "nested.key_1_value-for-key-1",
            ),
            (&[("key_2", "key-2-value")][..], "nested.key_2_key-2-value"),
            (
                &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")][..],
                "nested.key_2_key-2-value.key_3_requested-key3-value",
            ),
        ] {
            assert_eq!(
                stat(&realistic, "nested", entries),
                (key.into(), true),
                "{entries:?}"
            );
        }
        // The configured value, without detailed_metric: counted in its rule's series only.
        assert_eq!(
            stat(&realistic, "nested", &[("key_1", "some-value-for-key-1")]),
            ("nested.key_1_some-value-for-key-1".into(), false)
        );
    }

    /// envoyproxy/ratelimit's `TestValueToMetric_*` cases, their YAML written anew.
    #[test]
    fn value_to_metric_keys_are_the_reference_ones() {
        let three = |leaf: &str| {
            table(&format!(
                "domain: domain\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n{leaf}            rate_limit: {{unit: minute, requests_per_unit: 60}}\n"
            ))
        };
        let runtime = three("");
        let request = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")];
        // UsesRuntimeValuesInStats, FullKeyMatchesStatsKey.
        assert_eq!(
            stat(&runtime, "domain", &request),
            ("domain.route_draw.http_method_GET.subject_id".into(), true)
        );
        // DoesNotOverrideDetailedMetric.
        let detailed = three("            detailed_metric: true\n");
        assert_eq!(
            stat(&detailed, "domain", &request),
            ("domain.route_draw.http_method_GET.subject_id_123".into(), true)
        );
        // WithEmptyValue: no `_` for an empty value.
        for (entries, key) in [
            (
                [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
                "domain.route.http_method_GET.subject_id",
            ),
            (
                [("route", "draw"), ("http_method", ""), ("subject_id", "123")],
                "domain.route_draw.http_method.subject_id",
            ),
            (
                [("route", ""), ("http_method", ""), ("subject_id", "123")],
                "domain.route.http_method.subject_id",
            ),
        ] {
            assert_eq!(stat(&runtime, "domain", &entries).0, key);
        }

        // DefaultKeyIncludesValueAtThatLevel, MidLevelOnly, NoFlag_Unchanged.
        let top = table(
            "domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert_eq!(
            stat(&top, "d", &[("k1", "A"), ("k2", "foo")]),
            ("d.k1_A.k2".into(), true)
        );
        let middle = table(
            "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert_eq!(
            stat(&middle, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]),
            ("d.k1.k2_Y.k3".into(), true)
        );
        let none = table(
            "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert_eq!(
            stat(&none, "d", &[("k1", "X"), ("k2", "Y")]),
            ("d.k1.k2".into(), false)
        );

        // WithConfiguredValues: a value the configuration names is written either way.
        let configured = table(
            "
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
",
        );
        for method in ["GET", "POST"] {
            assert_eq!(
                stat(
                    &configured,
                    "test-domain",
                    &[("route", "api"), ("http_method", method), ("subject_id", "u")]
                )
                .0,
                format!("test-domain.route_api.http_method_{method}.subject_id")
            );
        }

        // WithWildcard: the request's whole value, not the pattern.
        let wildcard = table(
            "
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
",
        );
        for (user, action, resource) in [
            ("alice", "readfile", "documents"),
            ("bob", "readdata", "database"),
        ] {
            assert_eq!(
                stat(
                    &wildcard,
                    "domain",
                    &[("user", user), ("action", action), ("resource", resource)]
                )
                .0,
                format!("domain.user_{user}.action_{action}.resource")
            );
        }
    }

    /// envoyproxy/ratelimit's `TestShareThreshold` keys: a `share_threshold` wildcard writes its
    /// pattern, over `value_to_metric` and `detailed_metric`; a wildcard without flags writes
    /// its pattern too.
    #[test]
    fn share_threshold_keys_are_the_reference_ones() {
        let shared = table(SHARE_THRESHOLD);
        for (entries, key) in [
            (&[("files", "files/a.pdf")][..], "test-domain.files_files/*"),
            (
                &[("nested", "parent"), ("files", "nested/file1.txt")][..],
                "test-domain.nested_parent.files_nested/*",
            ),
            (
                &[("files", "top/file1.txt"), ("files", "nested/file1.txt")][..],
                "test-domain.files_top/*.files_nested/*",
            ),
            (
                &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")][..],
                "test-domain.path_path/*.file_file/*.type",
            ),
            (&[("file", "test1")][..], "test-domain.file_test1"),
            (&[("file", "test2")][..], "test-domain.file_test*"),
            (&[("midpath", "/api/v1")][..], "test-domain.midpath_/api*v1"),
            (
                &[("multiroute", "svcAepBrpc")][..],
                "test-domain.multiroute_svc*ep*rpc",
            ),
            (
                &[("tenant", "t1prod"), ("resource", "resAv2")][..],
                "test-domain.tenant_t*prod.resource_res*v2",
            ),
        ] {
            assert_eq!(stat(&shared, "test-domain", entries).0, key, "{entries:?}");
        }
        let flagged = table(
            "
domain: test-domain
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 60}
",
        );
        for (entries, key) in [
            (
                &[("route", "api/v1"), ("method", "GET")][..],
                "test-domain.route_api/*.method",
            ),
            (
                &[("service", "svc/user"), ("endpoint", "get")][..],
                "test-domain.service_svc/*.endpoint_get",
            ),
            (&[("midroute", "/api/v2")][..], "test-domain.midroute_/api*v2"),
            (
                &[("midroute", "/api-beta-v2")][..],
                "test-domain.midroute_/api*v2",
            ),
        ] {
            assert_eq!(
                stat(&flagged, "test-domain", entries),
                (key.into(), true),
                "{entries:?}"
            );
        }
    }

    /// A client's value is cut to MAX_METRIC_VALUE_BYTES at a character boundary and its
    /// control characters written as `_`; what the configuration says is written whole.
    #[test]
    fn a_request_value_in_a_metric_key_is_bounded_and_printable() {
        let detailed = table(
            "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        let long = format!("{}é{}", "a".repeat(MAX_METRIC_VALUE_BYTES - 1), "b".repeat(500));
        let (key, _) = stat(&detailed, "d", &[("k", &long)]);
        assert_eq!(key, format!("d.k_{}", "a".repeat(MAX_METRIC_VALUE_BYTES - 1)));
        let (key, _) = stat(&detailed, "d", &[("k", "a\nb\u{7f}c\"d")]);
        assert_eq!(key, "d.k_a_b_c\"d");
        // Not a walk of the tree: no key.
        assert_eq!(metric_key(&detailed, "d", true, [("other", "x")]), None);
        assert_eq!(metric_key(&detailed, "unknown", true, [("k", "x")]), None);
    }
}
