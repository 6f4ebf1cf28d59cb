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

use super::config::{DescriptorNode, DescriptorTable, LimitId};

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
    let children = node.children.get(key)?;
    if let Some(exact) = children.exact.get(value) {
        return Some((exact, None));
    }
    if let Some(wildcard) = children.wildcards.iter().find(|wildcard| wildcard.matches(value)) {
        let share = wildcard.share.then_some(wildcard.pattern.as_str());
        return Some((&wildcard.node, share));
    }
    children.any.as_deref().map(|any| (any, None))
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
}
