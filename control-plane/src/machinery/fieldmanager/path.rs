//! Field paths as server-side apply names them: a field of a struct or map (`f:`), an item of
//! an associative list by its keys (`k:`), an item of a set by its value (`v:`), an item of a
//! list without keys by its index (`i:`). The order is structured-merge-diff's, so sets
//! serialise in the order Kubernetes writes them.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathElement {
    /// A struct field or a map key: `f:name`.
    Field(String),
    /// An item of an associative list, by its key fields sorted by name:
    /// `k:{"containerPort":80,"protocol":"TCP"}`.
    Key(Vec<(String, Value)>),
    /// An item of a set (a list of scalars): `v:"finalizer"`.
    Value(Value),
    /// An item of a list without keys, by position: `i:0`.
    Index(usize),
}

impl PathElement {
    pub fn field(name: &str) -> PathElement {
        PathElement::Field(name.to_string())
    }

    /// The element as a FieldsV1 key.
    pub fn serialize(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(fields) => {
                let map: serde_json::Map<String, Value> = fields.iter().cloned().collect();
                format!("k:{}", Value::Object(map))
            }
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a FieldsV1 key (`.` is not an element: the caller handles it).
    pub fn parse(s: &str) -> Result<PathElement, String> {
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("missing colon: {s}"))?;
        match kind {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "v" => serde_json::from_str(rest)
                .map(PathElement::Value)
                .map_err(|e| format!("{s}: {e}")),
            "k" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(m)) => {
                    let mut fields: Vec<(String, Value)> = m.into_iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(PathElement::Key(fields))
                }
                Ok(_) => Err(format!("{s}: a key must be an object")),
                Err(e) => Err(format!("{s}: {e}")),
            },
            "i" => rest
                .parse()
                .map(PathElement::Index)
                .map_err(|e| format!("{s}: {e}")),
            _ => Err(format!("unknown path element type: {s}")),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => {
                for ((an, av), (bn, bv)) in a.iter().zip(b) {
                    let o = an.cmp(bn).then_with(|| compare_values(av, bv));
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                a.len().cmp(&b.len())
            }
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A total order on JSON values (by type, then content), for keys and set items.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Number(_) => 2,
            Value::String(_) => 3,
            Value::Array(_) => 4,
            Value::Object(_) => 5,
        }
    }
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&y.as_f64().unwrap_or(0.0)),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| compare_values(x, y))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => x
            .iter()
            .zip(y)
            .map(|((xk, xv), (yk, yv))| xk.cmp(yk).then_with(|| compare_values(xv, yv)))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// A path from the object's root, printed as Kubernetes prints it in a conflict:
/// `.spec.containers[name="web"].image`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Path(pub Vec<PathElement>);

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pe in &self.0 {
            match pe {
                PathElement::Field(name) => write!(f, ".{name}")?,
                PathElement::Key(fields) => {
                    f.write_str("[")?;
                    for (i, (name, v)) in fields.iter().enumerate() {
                        if i > 0 {
                            f.write_str(",")?;
                        }
                        write!(f, "{name}={v}")?;
                    }
                    f.write_str("]")?;
                }
                PathElement::Value(v) => write!(f, "[={v}]")?,
                PathElement::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elements_round_trip_through_fields_v1_keys() {
        for pe in [
            PathElement::field("spec"),
            PathElement::Key(vec![
                ("containerPort".into(), json!(80)),
                ("protocol".into(), json!("TCP")),
            ]),
            PathElement::Value(json!("kubernetes.io/pvc-protection")),
            PathElement::Index(3),
        ] {
            assert_eq!(PathElement::parse(&pe.serialize()).unwrap(), pe);
        }
        assert_eq!(
            PathElement::Key(vec![("name".into(), json!("web"))]).serialize(),
            r#"k:{"name":"web"}"#
        );
        assert!(PathElement::parse("x:1").is_err());
        assert!(PathElement::parse("k:[1]").is_err());
        assert!(PathElement::parse("nocolon").is_err());
    }

    #[test]
    fn paths_print_as_in_kubernetes_conflicts() {
        let p = Path(vec![
            PathElement::field("spec"),
            PathElement::field("containers"),
            PathElement::Key(vec![("name".into(), json!("web"))]),
            PathElement::field("image"),
        ]);
        assert_eq!(p.to_string(), r#".spec.containers[name="web"].image"#);
        let p = Path(vec![
            PathElement::field("metadata"),
            PathElement::field("finalizers"),
            PathElement::Value(json!("a")),
        ]);
        assert_eq!(p.to_string(), r#".metadata.finalizers[="a"]"#);
    }

    #[test]
    fn fields_sort_before_keys_values_and_indexes() {
        let mut v = [
            PathElement::Index(0),
            PathElement::Value(json!(1)),
            PathElement::Key(vec![("a".into(), json!(1))]),
            PathElement::field("z"),
            PathElement::field("a"),
        ];
        v.sort();
        assert_eq!(v[0], PathElement::field("a"));
        assert_eq!(v[1], PathElement::field("z"));
        assert!(matches!(v[2], PathElement::Key(_)));
        assert!(matches!(v[4], PathElement::Index(0)));
    }
}
