//! Which limit applies to one request descriptor, as envoyproxy/ratelimit finds it.
//!
//! The descriptor's entries are walked down the domain's tree, one level each. At each level
//! the entry's key and value pick the most specific child: the exact value first, then the
//! first prefix (`value: foo*`) it starts with, then the key's value-less child (any value;
//! each value is its own budget, since the budget's key is the whole descriptor). The walk
//! stops at an entry nothing matches, or at a node with no children. The limit is that of the
//! node the *last* entry reached: a descriptor with more entries than the tree is deep, or
//! one that stops short of a node with a limit, matches nothing, as in that service (its
//! `test/config/basic_config.yaml` cases `key2=value2, subkey=subvalue` and `key5=value5,
//! subkey5=subvalue`).
//!
//! One difference: that service consults prefixes at the top level only (its lookup keeps the
//! domain's wildcard list at every level); here a `foo*` value is a prefix at any depth.

use super::config::{DescriptorNode, DescriptorTable, LimitId};

/// The limit the descriptor `entries` (`(key, value)`, in order) of `domain` falls under;
/// `None` for an unknown domain, no entries, or no match.
pub fn find<'e, I>(table: &DescriptorTable, domain: &str, entries: I) -> Option<LimitId>
where
    I: IntoIterator<Item = (&'e str, &'e str)>,
    I::IntoIter: ExactSizeIterator,
{
    let mut node = table.domains.get(domain)?;
    let entries = entries.into_iter();
    let last = entries.len().checked_sub(1)?;
    for (index, (key, value)) in entries.enumerate() {
        let next = step(node, key, value)?;
        if index == last {
            return next.limit;
        }
        if next.children.is_empty() {
            return None;
        }
        node = next;
    }
    None
}

/// The child of `node` that the entry `key=value` matches, the most specific first.
fn step<'t>(node: &'t DescriptorNode, key: &str, value: &str) -> Option<&'t DescriptorNode> {
    let children = node.children.get(key)?;
    children
        .exact
        .get(value)
        .or_else(|| {
            children
                .prefixes
                .iter()
                .find(|(prefix, _)| value.starts_with(prefix.as_str()))
                .map(|(_, node)| node)
        })
        .or(children.any.as_deref())
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
";

    fn table(text: &str) -> DescriptorTable {
        DescriptorTable::parse([("test.yaml", text)]).unwrap()
    }

    /// The rule name of what `entries` match, or `None`.
    fn matched(table: &DescriptorTable, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
        find(table, domain, entries.iter().copied()).map(|id| table.limits[id].rule.to_string())
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
    fn the_reference_wildcard_config_matches_prefixes_only() {
        let t = table(WILDCARD);
        let domain = "test-domain";
        assert_eq!(
            matched(&t, domain, &[("noVal", "foo1")]),
            matched(&t, domain, &[("noVal", "foo2")])
        );
        let wild = matched(&t, domain, &[("wild", "foo1")]);
        assert_eq!(wild.as_deref(), Some("rls/test-domain/wild=foo*"));
        assert_eq!(matched(&t, domain, &[("wild", "foo2")]), wild);
        assert_eq!(matched(&t, domain, &[("wild", "foo")]), wild);
        assert_eq!(matched(&t, domain, &[("wild", "bar")]), None);
        assert_eq!(matched(&t, domain, &[("noWild", "foo1")]), None);
        // `*` inside a value is a character like any other.
        assert_eq!(matched(&t, domain, &[("midWild", "barab")]), None);
        assert!(matched(&t, domain, &[("midWild", "bar*b")]).is_some());
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
