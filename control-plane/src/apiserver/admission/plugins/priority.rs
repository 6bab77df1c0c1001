//! Priority: a new pod's `priorityClassName` resolved to its class's value and preemption
//! policy (`spec.priority`, `spec.preemptionPolicy`, which the scheduler orders and preempts
//! by); a pod without a class gets the global default class, else priority 0. A pod naming
//! a class that does not exist, or carrying a priority other than its class's, is refused.
//! Only one class may be the global default, and the built-in system classes cannot be
//! deleted. As Kubernetes' Priority plugin (and its priorityclass storage).
//!
//! Classes are read from the watch cache: a cluster has a handful, so finding the default
//! is a scan of that handful, never of pods.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::super::{Env, Operation, Plugin, Request};
use crate::machinery::kinds::scheduling::{self, DEFAULT_PRIORITY, PREEMPT_LOWER_PRIORITY};
use crate::machinery::ApiError;

pub struct Priority {
    env: Env,
}

/// What a pod's class resolves to.
struct Resolved {
    class: Option<String>,
    value: i64,
    preemption_policy: String,
}

impl Priority {
    pub fn new(env: Env) -> Priority {
        Priority { env }
    }

    /// The global default class (the lowest valued one should there be several, as
    /// Kubernetes picks), or None.
    async fn default_class(&self) -> Result<Option<Value>, ApiError> {
        let mut best: Option<Value> = None;
        for o in self
            .env
            .list(scheduling::GROUP, "priorityclasses", None)
            .await?
        {
            let v = o.value().map_err(ApiError::internal)?;
            if v["globalDefault"] != json!(true) {
                continue;
            }
            if best.as_ref().is_none_or(|b| value_of(&v) < value_of(b)) {
                best = Some(v);
            }
        }
        Ok(best)
    }

    async fn resolve(&self, req: &Request<'_>, pod: &Value) -> Result<Resolved, ApiError> {
        let name = pod
            .pointer("/spec/priorityClassName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let class = if name.is_empty() {
            self.default_class().await?
        } else {
            match self
                .env
                .get_value(scheduling::GROUP, "priorityclasses", None, name)
                .await?
            {
                Some(c) => Some(c),
                None => {
                    return Err(req.forbidden(
                        Some(pod),
                        format!("no PriorityClass with name {name} was found"),
                    ))
                }
            }
        };
        Ok(match class {
            Some(c) => Resolved {
                class: c["metadata"]["name"].as_str().map(str::to_string),
                value: value_of(&c),
                preemption_policy: c["preemptionPolicy"]
                    .as_str()
                    .unwrap_or(PREEMPT_LOWER_PRIORITY)
                    .to_string(),
            },
            None => Resolved {
                class: None,
                value: DEFAULT_PRIORITY.into(),
                preemption_policy: PREEMPT_LOWER_PRIORITY.to_string(),
            },
        })
    }
}

fn value_of(class: &Value) -> i64 {
    class["value"].as_i64().unwrap_or_default()
}

#[async_trait]
impl Plugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    async fn admit(&self, req: &Request<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if !req.is_pod() || req.operation != Operation::Create {
            return Ok(());
        }
        let Some(pod) = obj else {
            return Ok(());
        };
        let r = self.resolve(req, pod).await?;
        let spec = &pod["spec"];
        if let Some(given) = spec["priority"].as_i64().filter(|p| *p != r.value) {
            return Err(req.forbidden(
                Some(pod),
                format!(
                    "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
                    r.value
                ),
            ));
        }
        if let Some(given) = spec["preemptionPolicy"]
            .as_str()
            .filter(|p| *p != r.preemption_policy)
        {
            return Err(req.forbidden(
                Some(pod),
                format!(
                    "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
                    r.preemption_policy
                ),
            ));
        }
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            if let Some(class) = r.class {
                spec.insert("priorityClassName".into(), json!(class));
            }
            spec.insert("priority".into(), json!(r.value));
            spec.insert("preemptionPolicy".into(), json!(r.preemption_policy));
        }
        Ok(())
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if !req.is(scheduling::GROUP, "PriorityClass") {
            return Ok(());
        }
        match (req.operation, obj) {
            (Operation::Delete, _) if scheduling::is_system_class(req.name) => Err(req.forbidden(
                None,
                "this is a system priority class and cannot be deleted",
            )),
            (Operation::Create | Operation::Update, Some(pc))
                if pc["globalDefault"] == json!(true) =>
            {
                let Some(current) = self.default_class().await? else {
                    return Ok(());
                };
                let current = current["metadata"]["name"].as_str().unwrap_or_default();
                if req.operation == Operation::Create || current != req.name {
                    return Err(req.forbidden(
                        Some(pc),
                        format!(
                            "PriorityClass {current} is already marked as default. Only one default can exist"
                        ),
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
