//! autoscaling/v1 Scale, the body of the scale subresource (`kubectl scale`): replicas must
//! not be negative.

use k8s_openapi::api::autoscaling::v1::Scale;
use serde_json::Value;

use super::common::{meta_errors, validate_typed};
use crate::machinery::status::FieldError;
use crate::machinery::validation::{NameRule, Scope};

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Scale, old: Option<&Scale>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        if let Some(r) = new
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .filter(|r| *r < 0)
        {
            errs.push(FieldError::invalid_number(
                "spec.replicas",
                r.into(),
                "must be greater than or equal to 0",
            ));
        }
        errs
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn negative_replicas() {
        let v = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": -1}});
        let errs = validate(&v, None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.replicas");
        assert_eq!(
            errs[0].message,
            "Invalid value: -1: must be greater than or equal to 0"
        );
    }
}
