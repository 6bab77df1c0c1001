//! Validation shared by every kind: Kubernetes' name rules (DNS-1123 label and subdomain,
//! DNS-1035 label, qualified names, label values) with Kubernetes' own messages, and
//! `ObjectMeta` checks on create and update. Per-kind rules live in `kinds/`.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::status::{CauseType, FieldError};

pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Kubernetes' limit on the total size of an object's annotations (keys plus values).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_EXAMPLE: &str =
    "(e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_EXAMPLE: &str = "(e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1035_LABEL_EXAMPLE: &str =
    "(e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_EXAMPLE: &str = "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_EXAMPLE: &str = "(e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// A JSON field path as Kubernetes prints it: `spec.template.spec.containers[0].ports[1]`,
/// `metadata.labels[app]`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FieldPath(String);

impl FieldPath {
    pub fn new(root: &str) -> Self {
        FieldPath(root.to_string())
    }
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }
    pub fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{i}]", self.0))
    }
    pub fn key(&self, k: &str) -> Self {
        FieldPath(format!("{}[{k}]", self.0))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&FieldPath> for String {
    fn from(p: &FieldPath) -> String {
        p.0.clone()
    }
}

impl From<FieldPath> for String {
    fn from(p: FieldPath) -> String {
        p.0
    }
}

/// Which rule an object's name must follow (Kubernetes' `ValidateNameFunc`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// Most kinds (pods, deployments, nodes, configmaps...).
    Dns1123Subdomain,
    /// Namespaces.
    Dns1123Label,
    /// Services.
    Dns1035Label,
    /// RBAC roles and bindings: only a valid path segment (`system:node` is a valid name).
    PathSegment,
}

impl NameRule {
    /// Messages for `name`; with `prefix`, `name` is a generateName whose trailing `-` is fine.
    pub fn errors(self, name: &str, prefix: bool) -> Vec<String> {
        let name = if prefix {
            name.strip_suffix('-').unwrap_or(name)
        } else {
            name
        };
        let mut errs = path_segment_errors(name);
        errs.extend(match self {
            NameRule::Dns1123Subdomain => dns1123_subdomain_errors(name),
            NameRule::Dns1123Label => dns1123_label_errors(name),
            NameRule::Dns1035Label => dns1035_label_errors(name),
            NameRule::PathSegment => vec![],
        });
        errs
    }
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn max_len_error(max: usize) -> String {
    format!("must be no more than {max} characters")
}

fn label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

pub fn is_dns1123_label(s: &str) -> bool {
    dns1123_label_errors(s).is_empty()
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    dns1123_subdomain_errors(s).is_empty()
}

pub fn is_dns1035_label(s: &str) -> bool {
    dns1035_label_errors(s).is_empty()
}

pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = vec![];
    if s.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !label_shape(s) {
        errs.push(format!("{DNS1123_LABEL_MSG} {DNS1123_LABEL_EXAMPLE}"));
    }
    errs
}

pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = vec![];
    if s.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !s.split('.').all(label_shape) {
        errs.push(format!(
            "{DNS1123_SUBDOMAIN_MSG} {DNS1123_SUBDOMAIN_EXAMPLE}"
        ));
    }
    errs
}

pub fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut errs = vec![];
    if s.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !(label_shape(s) && s.as_bytes()[0].is_ascii_lowercase()) {
        errs.push(format!("{DNS1035_LABEL_MSG} {DNS1035_LABEL_EXAMPLE}"));
    }
    errs
}

/// Names are path segments in URLs: `.`, `..`, `/` and `%` are never allowed.
fn path_segment_errors(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    let mut errs = vec![];
    for c in ["/", "%"] {
        if s.contains(c) {
            errs.push(format!("may not contain '{c}'"));
        }
    }
    errs
}

fn qualified_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Label and annotation keys, finalizers: `[prefix/]name`, prefix a DNS-1123 subdomain.
pub fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = vec![];
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_MSG} {QUALIFIED_NAME_EXAMPLE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )]
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !name.is_empty() && !qualified_shape(name) {
        errs.push(format!(
            "name part {QUALIFIED_NAME_MSG} {QUALIFIED_NAME_EXAMPLE}"
        ));
    }
    errs
}

pub fn is_qualified_name(s: &str) -> bool {
    qualified_name_errors(s).is_empty()
}

pub fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = vec![];
    if s.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !s.is_empty() && !qualified_shape(s) {
        errs.push(format!("{LABEL_VALUE_MSG} {LABEL_VALUE_EXAMPLE}"));
    }
    errs
}

pub fn is_valid_label_value(s: &str) -> bool {
    label_value_errors(s).is_empty()
}

/// One `Invalid` cause per message, the way Kubernetes reports a value breaking several rules.
pub fn invalid_each(path: &FieldPath, value: &str, messages: Vec<String>) -> Vec<FieldError> {
    messages
        .into_iter()
        .map(|m| FieldError::invalid(path, value, &m))
        .collect()
}

/// Label keys and values (Kubernetes' `ValidateLabels`).
pub fn validate_labels(labels: &BTreeMap<String, String>, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    for (k, v) in labels {
        errs.extend(invalid_each(path, k, qualified_name_errors(k)));
        errs.extend(invalid_each(path, v, label_value_errors(v)));
    }
    errs
}

/// Annotation keys (lower-cased, as Kubernetes checks them) and their total size.
pub fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut total = 0usize;
    for (k, v) in annotations {
        errs.extend(invalid_each(
            path,
            k,
            qualified_name_errors(&k.to_lowercase()),
        ));
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::new(
            CauseType::TooLong,
            path,
            format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
        ));
    }
    errs
}

/// Whether the kind lives in a namespace (decides what `metadata.namespace` may hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// Kubernetes' `ValidateObjectMeta`: name or generateName, namespace for the scope, labels,
/// annotations, owner references and finalizers.
pub fn validate_object_meta(meta: &ObjectMeta, scope: Scope, rule: NameRule) -> Vec<FieldError> {
    let path = FieldPath::new("metadata");
    let mut errs = vec![];
    let name = meta.name.as_deref().unwrap_or("");
    let generate_name = meta.generate_name.as_deref().unwrap_or("");
    if !generate_name.is_empty() {
        errs.extend(invalid_each(
            &path.child("generateName"),
            generate_name,
            rule.errors(generate_name, true),
        ));
    }
    if name.is_empty() {
        if generate_name.is_empty() {
            errs.push(FieldError::new(
                CauseType::Required,
                path.child("name"),
                "Required value: name or generateName is required",
            ));
        }
    } else {
        errs.extend(invalid_each(
            &path.child("name"),
            name,
            rule.errors(name, false),
        ));
    }
    let namespace = meta.namespace.as_deref().unwrap_or("");
    match scope {
        Scope::Namespaced if namespace.is_empty() => {
            errs.push(FieldError::required(path.child("namespace")))
        }
        Scope::Namespaced => errs.extend(invalid_each(
            &path.child("namespace"),
            namespace,
            dns1123_label_errors(namespace),
        )),
        Scope::Cluster if !namespace.is_empty() => errs.push(FieldError::new(
            CauseType::Forbidden,
            path.child("namespace"),
            "Forbidden: not allowed on this type",
        )),
        Scope::Cluster => {}
    }
    if let Some(generation) = meta.generation {
        if generation < 0 {
            errs.push(FieldError::invalid(
                path.child("generation"),
                generation,
                "must be greater than or equal to 0",
            ));
        }
    }
    if let Some(labels) = &meta.labels {
        errs.extend(validate_labels(labels, &path.child("labels")));
    }
    if let Some(annotations) = &meta.annotations {
        errs.extend(validate_annotations(
            annotations,
            &path.child("annotations"),
        ));
    }
    for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
        let p = path.child("ownerReferences").index(i);
        for (field, value) in [
            ("apiVersion", &owner.api_version),
            ("kind", &owner.kind),
            ("name", &owner.name),
            ("uid", &owner.uid),
        ] {
            if value.is_empty() {
                errs.push(FieldError::new(
                    CauseType::Invalid,
                    p.child(field),
                    format!("Invalid value: \"\": {field} must not be empty"),
                ));
            }
        }
    }
    let controllers = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .count();
    if controllers > 1 {
        errs.push(FieldError::new(
            CauseType::Invalid,
            path.child("ownerReferences"),
            "Only one reference can have Controller set to true",
        ));
    }
    for (i, finalizer) in meta.finalizers.iter().flatten().enumerate() {
        errs.extend(invalid_each(
            &path.child("finalizers").index(i),
            finalizer,
            qualified_name_errors(finalizer),
        ));
    }
    errs
}

/// Kubernetes' `ValidateObjectMetaUpdate`: identity fields never change. A uid or
/// creationTimestamp left out of an update is not a change (the server carries the stored
/// ones over, as Kubernetes does); a different one is.
pub fn validate_object_meta_update(new: &ObjectMeta, old: &ObjectMeta) -> Vec<FieldError> {
    let path = FieldPath::new("metadata");
    let mut errs = vec![];
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    if new.name != old.name {
        errs.push(immutable_value(path.child("name"), value(&new.name)));
    }
    if new.namespace != old.namespace {
        errs.push(immutable_value(
            path.child("namespace"),
            value(&new.namespace),
        ));
    }
    if new.uid.is_some() && new.uid != old.uid {
        errs.push(immutable_value(path.child("uid"), value(&new.uid)));
    }
    if new.creation_timestamp.is_some() && new.creation_timestamp != old.creation_timestamp {
        errs.push(FieldError::immutable(path.child("creationTimestamp")));
    }
    if old.deletion_timestamp.is_some() && new.deletion_timestamp != old.deletion_timestamp {
        errs.push(FieldError::immutable(path.child("deletionTimestamp")));
    }
    if old.deletion_grace_period_seconds.is_some()
        && new.deletion_grace_period_seconds != old.deletion_grace_period_seconds
    {
        errs.push(FieldError::immutable(
            path.child("deletionGracePeriodSeconds"),
        ));
    }
    errs
}

/// `field: Invalid value: "x": field is immutable`, Kubernetes' `ValidateImmutableField`.
pub fn immutable_value(path: impl Into<String>, value: impl fmt::Display) -> FieldError {
    FieldError::invalid(path, value, "field is immutable")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dns_names() {
        for ok in ["a", "web", "web-1", "1-web", "a".repeat(63).as_str()] {
            assert!(is_dns1123_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a".repeat(64).as_str()] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        for ok in ["a.b", "kube-system", "web-7d9c.17a8e5f3", "example.com"] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in ["a..b", ".a", "a.", "Web", "a_b", &"a.".repeat(127)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        assert!(is_dns1035_label("web"));
        assert!(!is_dns1035_label("1web"));
    }

    #[test]
    fn kubernetes_messages() {
        let errs = dns1123_subdomain_errors("Web_1");
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("a lowercase RFC 1123 subdomain must consist of"));
        assert!(qualified_name_errors("a/b/c")[0].starts_with("a qualified name must consist"));
        assert_eq!(
            qualified_name_errors("example.com/"),
            vec!["name part must be non-empty"]
        );
        assert_eq!(
            qualified_name_errors(&"x".repeat(64)),
            vec!["name part must be no more than 63 characters"]
        );
    }

    #[test]
    fn labels_and_keys() {
        assert!(is_qualified_name("app"));
        assert!(is_qualified_name("app.kubernetes.io/name"));
        assert!(is_qualified_name("MyName"));
        assert!(!is_qualified_name("/app"));
        assert!(!is_qualified_name("App.Example.com/x"));
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("v1.2_3-x"));
        assert!(!is_valid_label_value("-x"));
        assert!(!is_valid_label_value("a b"));
    }

    fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: (!name.is_empty()).then(|| name.to_string()),
            namespace: ns.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn object_meta_on_create() {
        let errs = validate_object_meta(
            &meta("Bad_Name", Some("default")),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.name");
        assert!(errs[0]
            .message
            .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"));

        let errs = validate_object_meta(
            &meta("", Some("default")),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        assert_eq!(
            errs[0].message,
            "Required value: name or generateName is required"
        );

        let mut m = meta("", Some("default"));
        m.generate_name = Some("web-".into());
        assert!(validate_object_meta(&m, Scope::Namespaced, NameRule::Dns1123Subdomain).is_empty());

        let errs = validate_object_meta(
            &meta("x", None),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        assert_eq!(errs, vec![FieldError::required("metadata.namespace")]);
        let errs = validate_object_meta(
            &meta("x", Some("d")),
            Scope::Cluster,
            NameRule::Dns1123Subdomain,
        );
        assert_eq!(errs[0].kind, CauseType::Forbidden);

        let mut m = meta("x", Some("d"));
        m.labels = Some([("app".to_string(), "-bad".to_string())].into());
        m.annotations = Some([("big".to_string(), "x".repeat(300_000))].into());
        let errs = validate_object_meta(&m, Scope::Namespaced, NameRule::Dns1123Subdomain);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(errs[0].field, "metadata.labels");
        assert_eq!(errs[1].kind, CauseType::TooLong);
    }

    #[test]
    fn object_meta_on_update() {
        let old = meta("a", Some("d"));
        let new = meta("b", Some("d"));
        let errs = validate_object_meta_update(&new, &old);
        assert_eq!(errs[0].message, "Invalid value: \"b\": field is immutable");
        assert!(validate_object_meta_update(&old, &old).is_empty());
        let mut stored = meta("a", Some("d"));
        stored.uid = Some("u-1".into());
        let mut put = stored.clone();
        put.uid = None;
        assert!(
            validate_object_meta_update(&put, &stored).is_empty(),
            "left out is unchanged"
        );
        put.uid = Some("u-2".into());
        assert_eq!(
            validate_object_meta_update(&put, &stored)[0].message,
            "Invalid value: \"u-2\": field is immutable"
        );
    }

    proptest! {
        #[test]
        fn label_rule_matches_regex(s in "[a-z0-9-]{0,70}") {
            let b = s.as_bytes();
            let expected = !s.is_empty() && s.len() <= 63 && b[0] != b'-' && b[b.len()-1] != b'-';
            prop_assert_eq!(is_dns1123_label(&s), expected);
        }

        #[test]
        fn subdomain_is_dotted_labels(parts in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", 1..5)) {
            let s = parts.join(".");
            prop_assert!(is_dns1123_subdomain(&s));
        }

        #[test]
        fn never_panics(s in ".{0,80}") {
            let _ = qualified_name_errors(&s);
            let _ = label_value_errors(&s);
            let _ = NameRule::Dns1035Label.errors(&s, true);
        }
    }
}
