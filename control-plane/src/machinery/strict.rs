//! Decoding a body into the kind's typed object, as Kubernetes does before anything else:
//! a body that does not decode is a 400 naming the field at fault ([`decode_error`]); with
//! `fieldValidation=Strict`, the fields the typed object does not know are reported too. The
//! body is decoded into the k8s-openapi struct (whose deserialisers skip unknown keys),
//! encoded back, and the two key trees compared: a key that did not survive the round trip
//! is unknown. Maps with free-form keys (labels, annotations, data, selector) survive whole,
//! so only struct fields can be reported.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use k8s_openapi::api::{
    admissionregistration, apps, autoscaling, batch, coordination, core, discovery, events, rbac,
};

/// Paths of unknown fields as Kubernetes' strict decoder names them
/// (`spec.template.spec.containers[0].imagee`), in document order. Empty when the kind is
/// not served here or the body does not decode at all (the decoder's own error then applies).
pub fn unknown_fields(group: &str, kind: &str, version: &str, v: &Value) -> Vec<String> {
    decode(group, kind, version, v).unwrap_or_default()
}

/// The body decoded into its kind once: Kubernetes' message when it does not decode
/// ([`decode_error`]), else the paths of its unknown fields ([`unknown_fields`]), so a write
/// pays for one round trip however its fields are validated.
pub fn decode(group: &str, kind: &str, version: &str, v: &Value) -> Result<Vec<String>, String> {
    let known = match round_trip(group, kind, version, v) {
        None => return Ok(vec![]),
        Some(Ok(known)) => known,
        Some(Err((path, why))) => {
            let at = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            return Err(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {at}{why}"
            ));
        }
    };
    let mut unknown = vec![];
    diff(v, &known, &mut String::new(), &mut unknown);
    Ok(unknown)
}

/// `strict decoding error: unknown field "a", unknown field "b"`, Kubernetes' message.
pub fn strict_error_message(unknown: &[String]) -> String {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    format!("strict decoding error: {}", fields.join(", "))
}

/// Why a body does not decode into its kind: Kubernetes' message, which names the field
/// (`Secret in version "v1" cannot be handled as a Secret: data.key: Invalid value ...`).
/// None when it decodes (or the kind is not served here).
pub fn decode_error(group: &str, kind: &str, version: &str, v: &Value) -> Option<String> {
    decode(group, kind, version, v).err()
}

/// The body decoded into `T` and encoded back, or where and why it does not decode.
fn typed<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, (String, String)> {
    let t: T = serde_path_to_error::deserialize(v)
        .map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
    serde_json::to_value(t).map_err(|e| (String::new(), e.to_string()))
}

fn round_trip(
    group: &str,
    kind: &str,
    version: &str,
    v: &Value,
) -> Option<Result<Value, (String, String)>> {
    Some(match (group, kind) {
        ("autoscaling", "HorizontalPodAutoscaler") if version == "v1" => {
            typed::<autoscaling::v1::HorizontalPodAutoscaler>(v)
        }
        ("autoscaling", "HorizontalPodAutoscaler") => {
            typed::<autoscaling::v2::HorizontalPodAutoscaler>(v)
        }
        ("", "Namespace") => typed::<core::v1::Namespace>(v),
        ("", "Pod") => typed::<core::v1::Pod>(v),
        ("", "Service") => typed::<core::v1::Service>(v),
        ("", "Endpoints") => typed::<core::v1::Endpoints>(v),
        ("", "Node") => typed::<core::v1::Node>(v),
        ("", "Event") => typed::<core::v1::Event>(v),
        ("", "ConfigMap") => typed::<core::v1::ConfigMap>(v),
        ("", "Secret") => typed::<core::v1::Secret>(v),
        ("", "ServiceAccount") => typed::<core::v1::ServiceAccount>(v),
        ("", "LimitRange") => typed::<core::v1::LimitRange>(v),
        ("", "ResourceQuota") => typed::<core::v1::ResourceQuota>(v),
        ("", "Binding") => typed::<core::v1::Binding>(v),
        ("apps", "Deployment") => typed::<apps::v1::Deployment>(v),
        ("apps", "ReplicaSet") => typed::<apps::v1::ReplicaSet>(v),
        ("apps", "DaemonSet") => typed::<apps::v1::DaemonSet>(v),
        ("discovery.k8s.io", "EndpointSlice") => typed::<discovery::v1::EndpointSlice>(v),
        ("coordination.k8s.io", "Lease") => typed::<coordination::v1::Lease>(v),
        ("events.k8s.io", "Event") => typed::<events::v1::Event>(v),
        ("autoscaling", "Scale") => typed::<autoscaling::v1::Scale>(v),
        ("rbac.authorization.k8s.io", "Role") => typed::<rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io", "ClusterRole") => typed::<rbac::v1::ClusterRole>(v),
        ("rbac.authorization.k8s.io", "RoleBinding") => typed::<rbac::v1::RoleBinding>(v),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            typed::<rbac::v1::ClusterRoleBinding>(v)
        }
        ("batch", "Job") => typed::<batch::v1::Job>(v),
        ("batch", "CronJob") => typed::<batch::v1::CronJob>(v),
        ("apps", "StatefulSet") => typed::<apps::v1::StatefulSet>(v),
        ("apps", "ControllerRevision") => typed::<apps::v1::ControllerRevision>(v),
        ("", "PersistentVolumeClaim") => typed::<core::v1::PersistentVolumeClaim>(v),
        ("", "PersistentVolume") => typed::<core::v1::PersistentVolume>(v),
        ("storage.k8s.io", "StorageClass") => typed::<k8s_openapi::api::storage::v1::StorageClass>(v),
        ("storage.k8s.io", "CSIDriver") => typed::<k8s_openapi::api::storage::v1::CSIDriver>(v),
        ("storage.k8s.io", "CSINode") => typed::<k8s_openapi::api::storage::v1::CSINode>(v),
        ("storage.k8s.io", "VolumeAttachment") => {
            typed::<k8s_openapi::api::storage::v1::VolumeAttachment>(v)
        }
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            typed::<admissionregistration::v1::MutatingWebhookConfiguration>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            typed::<admissionregistration::v1::ValidatingWebhookConfiguration>(v)
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => typed::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(v),
        _ => return None,
    })
}

fn diff(input: &Value, known: &Value, path: &mut String, out: &mut Vec<String>) {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => {
            for (key, value) in i {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                match k.get(key) {
                    // An explicit null decodes to "absent": not unknown.
                    None if value.is_null() => {}
                    None => out.push(path.clone()),
                    Some(kv) => diff(value, kv, path, out),
                }
                path.truncate(len);
            }
        }
        (Value::Array(i), Value::Array(k)) => {
            for (n, (iv, kv)) in i.iter().zip(k).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{n}]"));
                diff(iv, kv, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"any-key": "x"}, "annotations": {"free/form": "y"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]}
                }
            }
        })
    }

    #[test]
    fn known_object_has_no_unknown_fields() {
        assert!(unknown_fields("apps", "Deployment", "v1", &deployment()).is_empty());
        let cm = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"any.key":"v"},"binaryData":{"b":"AAE="}});
        assert!(unknown_fields("", "ConfigMap", "v1", &cm).is_empty());
    }

    #[test]
    fn reports_paths_like_kubernetes() {
        let mut d = deployment();
        d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("typo");
        d["spec"]["bogus"] = json!({"deep": 1});
        d["metadata"]["nmae"] = json!("x");
        let unknown = unknown_fields("apps", "Deployment", "v1", &d);
        assert_eq!(
            unknown,
            vec![
                "metadata.nmae",
                "spec.bogus",
                "spec.template.spec.containers[0].imagee"
            ]
        );
        assert_eq!(
            strict_error_message(&unknown[..1]),
            "strict decoding error: unknown field \"metadata.nmae\""
        );
    }

    #[test]
    fn nulls_and_undecodable_bodies() {
        let mut d = deployment();
        d["spec"]["paused"] = Value::Null;
        assert!(unknown_fields("apps", "Deployment", "v1", &d).is_empty());
        d["spec"]["replicas"] = json!("three");
        assert!(unknown_fields("apps", "Deployment", "v1", &d).is_empty());
        assert!(unknown_fields("example.com", "Widget", "v1", &json!({"x": 1})).is_empty());
    }

    #[test]
    fn undecodable_bodies_name_the_field() {
        let mut d = deployment();
        d["metadata"]["labels"] = json!(["a"]);
        let e = decode_error("apps", "Deployment", "v1", &d).unwrap();
        assert!(
            e.starts_with("Deployment in version \"v1\" cannot be handled as a Deployment: metadata.labels: invalid type: sequence"),
            "{e}"
        );
        let secret = json!({"metadata": {"name": "s"}, "data": {"key": "not base64!"}});
        let e = decode_error("", "Secret", "v1", &secret).unwrap();
        assert!(e.contains("data.key: "), "{e}");
        d["metadata"]["labels"] = json!({"a": "b"});
        assert_eq!(decode_error("apps", "Deployment", "v1", &d), None);
        assert_eq!(decode_error("example.com", "Widget", "v1", &d), None);
    }

    #[test]
    fn every_served_kind_decodes() {
        for (group, kind) in [
            ("", "Namespace"),
            ("", "Pod"),
            ("", "Service"),
            ("", "Endpoints"),
            ("", "Node"),
            ("", "Event"),
            ("", "ConfigMap"),
            ("", "Secret"),
            ("", "ServiceAccount"),
            ("", "LimitRange"),
            ("", "ResourceQuota"),
            ("", "Binding"),
            ("apps", "Deployment"),
            ("apps", "ReplicaSet"),
            ("apps", "DaemonSet"),
            ("discovery.k8s.io", "EndpointSlice"),
            ("coordination.k8s.io", "Lease"),
            ("events.k8s.io", "Event"),
            ("autoscaling", "Scale"),
            ("autoscaling", "HorizontalPodAutoscaler"),
            (
                "admissionregistration.k8s.io",
                "MutatingWebhookConfiguration",
            ),
            (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration",
            ),
        ] {
            let mut v = json!({"metadata": {"name": "x"}, "extra": 1});
            // Required fields of the few kinds that have them.
            match kind {
                "Binding" => v["target"] = json!({"name": "n"}),
                "EndpointSlice" => {
                    v["addressType"] = json!("IPv4");
                    v["endpoints"] = json!([]);
                }
                "Event" if group == "events.k8s.io" => {
                    v["eventTime"] = json!("2024-01-01T00:00:00.000000Z")
                }
                "Event" => v["involvedObject"] = json!({}),
                _ => {}
            }
            assert_eq!(
                unknown_fields(group, kind, "v1", &v),
                vec!["extra"],
                "{group}/{kind}"
            );
        }
    }

    proptest! {
        // Any unknown key added anywhere in the pod spec is reported at exactly its path.
        #[test]
        fn finds_injected_field(name in "[a-z]{3,8}x", at in 0..3usize) {
            let mut d = deployment();
            let (target, path) = match at {
                0 => (&mut d["spec"], "spec"),
                1 => (&mut d["spec"]["template"]["spec"], "spec.template.spec"),
                _ => (&mut d["spec"]["template"]["spec"]["containers"][0], "spec.template.spec.containers[0]"),
            };
            target[&name] = json!(1);
            prop_assert_eq!(unknown_fields("apps", "Deployment", "v1", &d), vec![format!("{path}.{name}")]);
        }
    }
}
