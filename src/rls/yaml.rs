//! A YAML document read into a small tree whose every node knows its line: what
//! [`super::config`] validates `RLS_CONFIG` files from.
//!
//! `saphyr-parser` gives events; this builds the tree and refuses what the reference
//! (envoyproxy/ratelimit reads its files with go-yaml) refuses or would read two ways: a key
//! twice in one mapping, more than one document, a key that is not a scalar. Aliases are
//! expanded, within a budget of nodes, so a few lines of anchors cannot expand into gigabytes.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// Most nodes a document may expand to (aliases included).
const MAX_NODES: usize = 200_000;

/// Deepest nesting of sequences and mappings: far below anything that would strain the
/// recursive walks over the tree, and far above any real descriptor tree.
pub(super) const MAX_DEPTH: usize = 128;

/// One node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Node {
    /// What it is.
    pub value: Value,
    /// The line it starts on, 1-based.
    pub line: usize,
}

/// The kinds of node.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    /// A scalar's text; `plain` when it was written without quotes (so `~`, `null` or nothing
    /// at all is null, and `true` a boolean).
    Scalar {
        /// The text.
        text: String,
        /// Written without quotes or block style.
        plain: bool,
    },
    /// A sequence.
    Sequence(Vec<Node>),
    /// A mapping: keys (scalars, each once) in the order written.
    Mapping(Vec<(String, Node)>),
}

impl Node {
    /// A plain scalar that YAML reads as null (`~`, `null`, or no value at all).
    pub(super) fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What kind of node, for messages.
    pub(super) fn kind(&self) -> &'static str {
        match &self.value {
            _ if self.is_null() => "nothing",
            Value::Scalar { .. } => "a scalar",
            Value::Sequence(_) => "a list",
            Value::Mapping(_) => "a mapping",
        }
    }
}

/// Why a text is not one YAML document this module reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub(super) struct YamlError {
    /// Where, 1-based.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

fn error(line: usize, problem: impl Into<String>) -> YamlError {
    YamlError {
        line,
        problem: problem.into(),
    }
}

/// What is being built: a sequence or a mapping (with the key read and waiting for its value).
enum Open {
    Sequence {
        items: Vec<Node>,
        line: usize,
        anchor: usize,
    },
    Mapping {
        entries: Vec<(String, Node)>,
        key: Option<(String, usize)>,
        line: usize,
        anchor: usize,
    },
}

/// The one document in `text`; `None` for a text with no document at all (empty, or only
/// comments).
pub(super) fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|scan| error(scan.marker().line(), scan.info().to_owned()))?;
        let line = span.start.line();
        let complete = builder.event(event, line)?;
        if builder.stack.len() > MAX_DEPTH {
            return Err(error(line, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        if let Some((node, anchor)) = complete {
            builder.place(node, anchor, line)?;
        }
    }
    Ok(builder.root)
}

/// The tree as the parser's events build it.
#[derive(Default)]
struct Builder {
    /// Each anchor's node, for its aliases.
    anchors: HashMap<usize, Node>,
    /// The collections begun and not yet ended, innermost last.
    stack: Vec<Open>,
    /// The document, once complete.
    root: Option<Node>,
    /// Documents begun: one is read.
    documents: usize,
    /// Nodes made, aliases expanded: at most [`MAX_NODES`].
    nodes: usize,
}

impl Builder {
    /// Read one event: a node it completes (with its anchor, 0 for none), if any.
    fn event(&mut self, event: Event<'_>, line: usize) -> Result<Option<(Node, usize)>, YamlError> {
        let node = |value: Value, line: usize| Node { value, line };
        Ok(match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => None,
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(error(
                        line,
                        "a second document (---): one file holds one domain, in one document",
                    ));
                }
                None
            }
            Event::Alias(id) => {
                let node = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| error(line, "an alias to an unknown anchor"))?;
                self.nodes = self.nodes.saturating_add(count(&node));
                Some((node, 0))
            }
            Event::Scalar(text, style, anchor, _) => {
                let plain = style == ScalarStyle::Plain;
                let text = text.into_owned();
                Some((node(Value::Scalar { text, plain }, line), anchor))
            }
            Event::SequenceStart(anchor, _) => {
                let items = Vec::new();
                self.stack.push(Open::Sequence { items, line, anchor });
                None
            }
            Event::MappingStart(anchor, _) => {
                let (entries, key) = (Vec::new(), None);
                self.stack.push(Open::Mapping {
                    entries,
                    key,
                    line,
                    anchor,
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Open::Sequence { items, line, anchor }) => {
                    Some((node(Value::Sequence(items), line), anchor))
                }
                Some(Open::Mapping {
                    entries,
                    line,
                    anchor,
                    ..
                }) => Some((node(Value::Mapping(entries), line), anchor)),
                None => return Err(error(line, "the end of a collection that never began")),
            },
        })
    }

    /// Put a complete node where it belongs: the root, an item, a mapping's key or value.
    fn place(&mut self, node: Node, anchor: usize, line: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(1);
        if self.nodes > MAX_NODES {
            return Err(error(
                line,
                format!("more than {MAX_NODES} nodes (with aliases expanded)"),
            ));
        }
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Open::Sequence { items, .. }) => items.push(node),
            Some(Open::Mapping { entries, key, .. }) => match key.take() {
                None => *key = Some(new_key(entries, node)?),
                Some((name, _)) => entries.push((name, node)),
            },
        }
        Ok(())
    }
}

/// A mapping's next key, `node`: a plain word, not among its `entries` already.
fn new_key(entries: &[(String, Node)], node: Node) -> Result<(String, usize), YamlError> {
    let Value::Scalar { text, .. } = node.value else {
        return Err(error(
            node.line,
            format!("a mapping key must be a plain word, not {}", node.kind()),
        ));
    };
    if let Some((_, earlier)) = entries.iter().find(|(name, _)| *name == text) {
        return Err(error(
            node.line,
            format!(
                "the key {text:?} again (first on line {}): YAML keys are unique",
                earlier.line
            ),
        ));
    }
    Ok((text, node.line))
}

/// How many nodes `node` holds, itself included.
fn count(node: &Node) -> usize {
    1 + match &node.value {
        Value::Scalar { .. } => 0,
        Value::Sequence(items) => items.iter().map(count).sum(),
        Value::Mapping(entries) => entries.iter().map(|(_, value)| count(value)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_keeps_its_keys_in_order_with_their_lines() {
        let root = parse("domain: d\ndescriptors:\n  - key: a\n").unwrap().unwrap();
        let Value::Mapping(entries) = root.value else {
            panic!("a mapping")
        };
        assert_eq!(entries[0].0, "domain");
        assert_eq!(entries[1].0, "descriptors");
        assert_eq!(entries[1].1.line, 3);
    }

    #[test]
    fn a_key_twice_is_refused_naming_both_lines() {
        let refused = parse("domain: a\nother: 1\ndomain: b\n").unwrap_err();
        assert_eq!(refused.line, 3);
        assert!(refused.problem.contains("first on line 1"), "{refused}");
    }

    #[test]
    fn empty_texts_hold_no_document() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }

    #[test]
    fn two_documents_are_refused() {
        assert!(parse("domain: a\n---\ndomain: b\n").is_err());
    }

    #[test]
    fn aliases_expand_within_a_budget() {
        let small = parse("a: &x [1, 2]\nb: *x\n").unwrap().unwrap();
        let Value::Mapping(entries) = small.value else {
            panic!("a mapping")
        };
        assert_eq!(entries[0].1.value, entries[1].1.value);
        // Each level doubles the one before: 2^30 nodes if expanded.
        let mut bomb = String::from("l0: &l0 [x, x]\n");
        for level in 1..30 {
            bomb.push_str(&format!(
                "l{level}: &l{level} [*l{}, *l{}]\n",
                level - 1,
                level - 1
            ));
        }
        assert!(parse(&bomb).unwrap_err().problem.contains("nodes"));
    }

    #[test]
    fn broken_yaml_names_its_line() {
        let refused = parse("domain: a\ndescriptors:\n  - key: [\n").unwrap_err();
        assert!(refused.line >= 3, "{refused}");
    }
}
