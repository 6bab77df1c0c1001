//! What the server serves, from API discovery: the garbage collector watches every
//! resource that can be listed, watched and deleted, and the namespace controller empties
//! every namespaced one. Also maps an owner reference's apiVersion and kind to its resource.

use std::collections::HashMap;
use std::time::Duration;

use kube::discovery::{verbs, ApiResource, Discovery, Scope};
use kube::Client;
use tokio_util::sync::CancellationToken;

/// A served resource.
#[derive(Clone, Debug)]
pub struct Served {
    pub resource: ApiResource,
    pub namespaced: bool,
    pub operations: Vec<String>,
}

impl Served {
    pub fn supports(&self, op: &str) -> bool {
        self.operations.iter().any(|o| o == op)
    }
}

/// Every served resource, by `(apiVersion, kind)` (the preferred version of each group).
#[derive(Clone, Debug, Default)]
pub struct Resources {
    by_kind: HashMap<(String, String), Served>,
}

impl Resources {
    pub fn all(&self) -> impl Iterator<Item = &Served> {
        self.by_kind.values()
    }

    /// The resource of an object or owner reference.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&Served> {
        self.by_kind
            .get(&(api_version.to_string(), kind.to_string()))
    }

    /// Resources that can be listed, watched and deleted, events excepted (Kubernetes'
    /// garbage collector ignores them: they are many and own nothing).
    pub fn collectable(&self) -> Vec<Served> {
        let mut v: Vec<Served> = self
            .all()
            .filter(|s| {
                s.supports(verbs::LIST)
                    && s.supports(verbs::WATCH)
                    && s.supports(verbs::DELETE)
                    && s.resource.plural != "events"
            })
            .cloned()
            .collect();
        v.sort_by(|a, b| {
            (&a.resource.group, &a.resource.plural).cmp(&(&b.resource.group, &b.resource.plural))
        });
        v
    }
}

/// Runs discovery, retrying every 2 s until it succeeds (None if cancelled first).
pub async fn discover(client: &Client, token: &CancellationToken) -> Option<Resources> {
    loop {
        match Discovery::new(client.clone()).run().await {
            Ok(d) => {
                let mut by_kind = HashMap::new();
                for g in d.groups() {
                    for (ar, caps) in g.recommended_resources() {
                        let served = Served {
                            namespaced: caps.scope == Scope::Namespaced,
                            operations: caps.operations.clone(),
                            resource: ar.clone(),
                        };
                        by_kind.insert((ar.api_version.clone(), ar.kind.clone()), served);
                    }
                }
                return Some(Resources { by_kind });
            }
            Err(e) => tracing::warn!(error = %e, "API discovery failed; retrying"),
        }
        tokio::select! {
            _ = token.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}
