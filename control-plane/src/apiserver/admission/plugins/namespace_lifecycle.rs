//! NamespaceLifecycle: no new objects in a namespace that does not exist or is being
//! terminated, and the system namespaces cannot be deleted.

use async_trait::async_trait;
use serde_json::Value;

use super::super::{Env, Operation, Plugin, Request};
use crate::apiserver::handlers::SYSTEM_NAMESPACES;
use crate::apiserver::meta;
use crate::machinery::{ApiError, CauseType, FieldError};

pub struct NamespaceLifecycle {
    env: Env,
}

impl NamespaceLifecycle {
    pub fn new(env: Env) -> NamespaceLifecycle {
        NamespaceLifecycle { env }
    }
}

#[async_trait]
impl Plugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if req.is("", "Namespace") {
            if req.operation == Operation::Delete && SYSTEM_NAMESPACES.contains(&req.name) {
                return Err(ApiError::forbidden(format!(
                    "namespace {} is forbidden: this namespace may not be deleted",
                    req.name
                ))
                .with_details("", "namespaces", req.name));
            }
            return Ok(());
        }
        let (Operation::Create, Some(ns)) = (req.operation, req.namespace) else {
            return Ok(());
        };
        let Some(namespace) = self.env.get_value("", "namespaces", None, ns).await? else {
            return Err(ApiError::not_found("", "namespaces", ns));
        };
        let terminating = meta::deletion_timestamp(&namespace).is_some()
            || namespace.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating");
        if terminating {
            let mut e = req.forbidden(
                obj,
                format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            );
            e.causes.push(FieldError::new(
                CauseType::NamespaceTerminating,
                "metadata.namespace",
                format!("namespace {ns} is being terminated"),
            ));
            return Err(e);
        }
        Ok(())
    }
}
