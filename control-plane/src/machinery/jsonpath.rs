//! kubectl-style JSONPath (`.spec.replicas`, `.status.conditions[?(@.type=="Ready")].status`)
//! as CustomResourceDefinitions' printer columns and scale subresource paths use it, evaluated
//! by the serde_json_path crate (RFC 9535) after the expression is given its root (`$`).

use serde_json::Value;
use serde_json_path::JsonPath;

/// A parsed path.
#[derive(Clone, Debug)]
pub struct Path {
    inner: JsonPath,
}

impl Path {
    /// Parses a kubectl-style path: `.a.b`, `{.a.b}`, `a.b` or `$.a.b`.
    pub fn parse(expr: &str) -> Result<Path, String> {
        let e = expr.trim();
        let e = e
            .strip_prefix('{')
            .and_then(|e| e.strip_suffix('}'))
            .unwrap_or(e);
        let rooted = if e.starts_with('$') {
            e.to_string()
        } else if e.starts_with('.') || e.starts_with('[') {
            format!("${e}")
        } else {
            format!("$.{e}")
        };
        JsonPath::parse(&rooted)
            .map(|inner| Path { inner })
            .map_err(|err| err.to_string())
    }

    /// The first value the path selects, if any.
    pub fn first<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        self.inner.query(v).all().into_iter().next()
    }

    /// Every value the path selects.
    pub fn all<'a>(&self, v: &'a Value) -> Vec<&'a Value> {
        self.inner.query(v).all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubectl_paths_select_what_kubectl_selects() {
        let v = json!({"spec": {"replicas": 3},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            Path::parse(".spec.replicas").unwrap().first(&v),
            Some(&json!(3))
        );
        assert_eq!(
            Path::parse("{.spec.replicas}").unwrap().first(&v),
            Some(&json!(3))
        );
        let ready = Path::parse(r#".status.conditions[?(@.type=="Ready")].status"#).unwrap();
        assert_eq!(ready.first(&v), Some(&json!("True")));
        assert_eq!(Path::parse(".spec.missing").unwrap().first(&v), None);
        assert!(Path::parse(".spec[").is_err());
    }
}
