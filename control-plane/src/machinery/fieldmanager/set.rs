//! Sets of field paths (what one manager owns), as a trie: each node says whether the path
//! to it is a member and holds the sets below it. FieldsV1 is this trie as JSON: `f:`, `k:`,
//! `v:`, `i:` keys, and `"."` for a node that is itself a member and has children.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::path::{Path, PathElement};

/// A set of field paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    nodes: BTreeMap<PathElement, Node>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Node {
    member: bool,
    children: Set,
}

impl Node {
    fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }
}

impl Set {
    pub fn new() -> Set {
        Set::default()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Adds a path (an empty path adds nothing: the root is never a member).
    pub fn insert(&mut self, path: &[PathElement]) {
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut set = self;
        for pe in parents {
            set = &mut set.nodes.entry(pe.clone()).or_default().children;
        }
        set.nodes.entry(last.clone()).or_default().member = true;
    }

    /// Whether `path` is a member.
    pub fn has(&self, path: &[PathElement]) -> bool {
        let Some((last, parents)) = path.split_last() else {
            return false;
        };
        let mut set = self;
        for pe in parents {
            match set.nodes.get(pe) {
                Some(n) => set = &n.children,
                None => return false,
            }
        }
        set.nodes.get(last).is_some_and(|n| n.member)
    }

    /// Whether the element below this set is a member.
    pub fn is_member(&self, pe: &PathElement) -> bool {
        self.nodes.get(pe).is_some_and(|n| n.member)
    }

    /// The paths below `pe` (None when there are none).
    pub fn children(&self, pe: &PathElement) -> Option<&Set> {
        self.nodes
            .get(pe)
            .map(|n| &n.children)
            .filter(|c| !c.is_empty())
    }

    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.union_with(other);
        out
    }

    fn union_with(&mut self, other: &Set) {
        for (pe, on) in &other.nodes {
            let n = self.nodes.entry(pe.clone()).or_default();
            n.member |= on.member;
            n.children.union_with(&on.children);
        }
    }

    pub fn intersection(&self, other: &Set) -> Set {
        let mut out = Set::new();
        for (pe, n) in &self.nodes {
            if let Some(on) = other.nodes.get(pe) {
                let node = Node {
                    member: n.member && on.member,
                    children: n.children.intersection(&on.children),
                };
                if !node.is_empty() {
                    out.nodes.insert(pe.clone(), node);
                }
            }
        }
        out
    }

    /// The members of `self` that are not members of `other` (a member of `other` does not
    /// take away the paths below it: structured-merge-diff's Difference).
    pub fn difference(&self, other: &Set) -> Set {
        let mut out = Set::new();
        for (pe, n) in &self.nodes {
            let node = match other.nodes.get(pe) {
                None => n.clone(),
                Some(on) => Node {
                    member: n.member && !on.member,
                    children: n.children.difference(&on.children),
                },
            };
            if !node.is_empty() {
                out.nodes.insert(pe.clone(), node);
            }
        }
        out
    }

    /// Every member path, in order.
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Path>) {
        for (pe, n) in &self.nodes {
            prefix.push(pe.clone());
            if n.member {
                out.push(Path(prefix.clone()));
            }
            n.children.collect(prefix, out);
            prefix.pop();
        }
    }

    /// The elements directly below this set with their nodes, for walks along a value.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&PathElement, bool, &Set)> {
        self.nodes.iter().map(|(pe, n)| (pe, n.member, &n.children))
    }

    /// Builds a set from its elements (for walks that rebuild a set level by level).
    pub(super) fn from_entries(entries: impl IntoIterator<Item = (PathElement, bool, Set)>) -> Set {
        let nodes = entries
            .into_iter()
            .map(|(pe, member, children)| (pe, Node { member, children }))
            .filter(|(_, n)| !n.is_empty())
            .collect();
        Set { nodes }
    }

    /// The set as FieldsV1 JSON.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, include_self: bool) -> Map<String, Value> {
        let mut m = Map::new();
        if include_self {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (pe, n) in &self.nodes {
            let inner = if n.children.is_empty() {
                Map::new()
            } else {
                n.children.emit(n.member)
            };
            m.insert(pe.serialize(), Value::Object(inner));
        }
        m
    }

    /// Parses FieldsV1 JSON.
    pub fn from_fields_v1(v: &Value) -> Result<Set, String> {
        let Value::Object(m) = v else {
            return Err("FieldsV1 must be an object".into());
        };
        let mut set = Set::new();
        for (k, inner) in m {
            if k == "." {
                continue;
            }
            let pe = PathElement::parse(k)?;
            let Value::Object(im) = inner else {
                return Err(format!("{k}: FieldsV1 values must be objects"));
            };
            let children = Set::from_fields_v1(inner)?;
            let member = im.is_empty() || im.contains_key(".");
            set.nodes.insert(pe, Node { member, children });
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn f(s: &str) -> PathElement {
        PathElement::field(s)
    }

    fn set(paths: &[&[PathElement]]) -> Set {
        let mut s = Set::new();
        for p in paths {
            s.insert(p);
        }
        s
    }

    #[test]
    fn fields_v1_as_kubernetes_writes_it() {
        let key = PathElement::Key(vec![("name".into(), json!("web"))]);
        let s = set(&[
            &[f("metadata"), f("labels"), f("app")],
            &[f("spec"), f("containers"), key.clone()],
            &[f("spec"), f("containers"), key.clone(), f("image")],
            &[f("spec"), f("replicas")],
        ]);
        let v = s.to_fields_v1();
        assert_eq!(
            v,
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}}},
                    "f:replicas": {}
                }
            })
        );
        assert_eq!(Set::from_fields_v1(&v).unwrap(), s);
        assert!(Set::from_fields_v1(&json!({"x:1": {}})).is_err());
        assert!(Set::from_fields_v1(&json!([1])).is_err());
    }

    #[test]
    fn difference_keeps_children_of_removed_members() {
        let a = set(&[&[f("a")], &[f("a"), f("b")], &[f("c")]]);
        let b = set(&[&[f("a")]]);
        let d = a.difference(&b);
        assert!(!d.has(&[f("a")]));
        assert!(d.has(&[f("a"), f("b")]));
        assert!(d.has(&[f("c")]));
        assert_eq!(a.intersection(&b), b);
        assert_eq!(a.union(&b), a);
    }

    fn arb_path() -> impl Strategy<Value = Vec<PathElement>> {
        prop::collection::vec(
            prop_oneof![
                "[a-c]".prop_map(PathElement::Field),
                (0..3usize).prop_map(PathElement::Index),
                "[x-z]".prop_map(|s| PathElement::Value(json!(s))),
            ],
            1..4,
        )
    }

    proptest! {
        // The set operations agree with the same operations on the sets of member paths.
        #[test]
        fn operations_match_path_sets(
            a in prop::collection::vec(arb_path(), 0..8),
            b in prop::collection::vec(arb_path(), 0..8),
        ) {
            let sa = set(&a.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let sb = set(&b.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let pa: std::collections::BTreeSet<Path> = sa.paths().into_iter().collect();
            let pb: std::collections::BTreeSet<Path> = sb.paths().into_iter().collect();
            let paths = |s: Set| s.paths().into_iter().collect::<std::collections::BTreeSet<_>>();
            prop_assert_eq!(paths(sa.union(&sb)), pa.union(&pb).cloned().collect());
            prop_assert_eq!(paths(sa.intersection(&sb)), pa.intersection(&pb).cloned().collect());
            prop_assert_eq!(paths(sa.difference(&sb)), pa.difference(&pb).cloned().collect());
            prop_assert_eq!(Set::from_fields_v1(&sa.to_fields_v1()).unwrap(), sa.clone());
            for p in &a {
                prop_assert!(sa.has(p));
            }
        }
    }
}
