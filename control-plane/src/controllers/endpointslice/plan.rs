//! Planning EndpointSlice writes for one Service (the reconciler of Kubernetes'
//! EndpointSlice controller), pure and unit-tested: given the Service's existing slices and
//! its desired endpoints grouped by port set, decide which slices to create, update and
//! delete so that only slices whose content changes are written:
//!
//! - each existing slice keeps the endpoints still desired (with their new state) and drops
//!   the rest; untouched slices are not written;
//! - new endpoints go first into slices that are being written anyway, then into the fullest
//!   unchanged slice that can take all of them, and only then into new slices of at most
//!   `max` endpoints;
//! - slices of port sets no longer desired, and emptied slices, are deleted, and creations
//!   reuse slices about to be deleted (an update instead of a delete plus a create);
//! - a Service with no endpoints keeps one empty placeholder slice, as Kubernetes does.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// What every slice of the Service carries.
#[derive(Clone, Debug)]
pub struct SliceTemplate {
    pub namespace: String,
    pub generate_name: String,
    pub labels: BTreeMap<String, String>,
    pub owner: OwnerReference,
    pub address_type: String,
}

/// The endpoints wanted for one set of ports.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

/// The writes that bring the slices to the desired state.
#[derive(Debug, Default)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<Arc<EndpointSlice>>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// The canonical key of a port set (order-independent).
pub fn port_key(ports: &[EndpointPort]) -> String {
    let mut parts: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}/{}",
                p.name.as_deref().unwrap_or(""),
                p.protocol.as_deref().unwrap_or("TCP"),
                p.port.unwrap_or(0),
                p.app_protocol.as_deref().unwrap_or("")
            )
        })
        .collect();
    parts.sort();
    parts.join(",")
}

/// An endpoint's identity: the pod it stands for and its addresses.
fn endpoint_id(ep: &Endpoint) -> String {
    let target = ep
        .target_ref
        .as_ref()
        .map(|t| {
            format!(
                "{}/{}",
                t.namespace.as_deref().unwrap_or(""),
                t.name.as_deref().unwrap_or("")
            )
        })
        .unwrap_or_default();
    format!("{target}|{}", ep.addresses.join(","))
}

fn endpoints_of(s: &EndpointSlice) -> usize {
    s.endpoints.len()
}

/// Whether the slice carries the template's labels and owner.
fn metadata_current(s: &EndpointSlice, t: &SliceTemplate) -> bool {
    let labels_ok = t
        .labels
        .iter()
        .all(|(k, v)| s.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    let owner_ok = s
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.uid == t.owner.uid));
    labels_ok && owner_ok
}

fn with_template(mut s: EndpointSlice, t: &SliceTemplate) -> EndpointSlice {
    let labels = s.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(t.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    let owners = s.metadata.owner_references.get_or_insert_with(Vec::new);
    if !owners.iter().any(|r| r.uid == t.owner.uid) {
        owners.push(t.owner.clone());
    }
    s
}

fn new_slice(t: &SliceTemplate, ports: &[EndpointPort], endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(t.generate_name.clone()),
            namespace: Some(t.namespace.clone()),
            labels: Some(t.labels.clone()),
            owner_references: Some(vec![t.owner.clone()]),
            ..Default::default()
        },
        address_type: t.address_type.clone(),
        endpoints,
        ports: Some(ports.to_vec()),
    }
}

/// Plans the writes for one Service. `existing` are the slices this controller manages for
/// it; `desired` maps port keys to their endpoints.
pub fn plan(
    existing: &[Arc<EndpointSlice>],
    desired: BTreeMap<String, Desired>,
    template: &SliceTemplate,
    max: usize,
) -> Plan {
    let max = max.max(1);
    let mut out = Plan::default();
    let mut by_key: HashMap<String, Vec<Arc<EndpointSlice>>> = HashMap::new();
    for s in existing {
        by_key
            .entry(port_key(s.ports.as_deref().unwrap_or_default()))
            .or_default()
            .push(s.clone());
    }
    let no_endpoints = desired.values().all(|d| d.endpoints.is_empty());

    for (key, want) in &desired {
        if want.endpoints.is_empty() {
            continue;
        }
        let mut remaining: BTreeMap<String, Endpoint> = want
            .endpoints
            .iter()
            .map(|e| (endpoint_id(e), e.clone()))
            .collect();
        let mut updates: Vec<EndpointSlice> = Vec::new();
        let mut unchanged: Vec<Arc<EndpointSlice>> = Vec::new();
        for s in by_key.remove(key).unwrap_or_default() {
            let mut kept = Vec::new();
            let mut changed = !metadata_current(&s, template);
            for ep in &s.endpoints {
                match remaining.remove(&endpoint_id(ep)) {
                    Some(w) => {
                        changed |= &w != ep;
                        kept.push(w);
                    }
                    None => changed = true,
                }
            }
            if !changed {
                unchanged.push(s);
            } else if kept.is_empty() {
                out.delete.push(s);
            } else {
                let mut u = with_template((*s).clone(), template);
                u.endpoints = kept;
                updates.push(u);
            }
        }
        let mut rest: Vec<Endpoint> = remaining.into_values().collect();
        for u in &mut updates {
            while u.endpoints.len() < max && !rest.is_empty() {
                u.endpoints.push(rest.remove(0));
            }
        }
        if !rest.is_empty() {
            let fits = unchanged
                .iter()
                .enumerate()
                .filter(|(_, s)| endpoints_of(s) + rest.len() <= max)
                .max_by_key(|(_, s)| endpoints_of(s))
                .map(|(i, _)| i);
            if let Some(i) = fits {
                let s = unchanged.remove(i);
                let mut u = with_template((*s).clone(), template);
                u.endpoints.append(&mut rest);
                updates.push(u);
            }
        }
        while !rest.is_empty() {
            let chunk: Vec<Endpoint> = rest.drain(..rest.len().min(max)).collect();
            out.create.push(new_slice(template, &want.ports, chunk));
        }
        out.update.extend(updates);
    }

    // Port sets no longer wanted.
    let mut stale: Vec<Arc<EndpointSlice>> = by_key.into_values().flatten().collect();
    if no_endpoints {
        // Keep (or make) one placeholder: an empty slice without ports.
        let placeholder = stale
            .iter()
            .position(|s| s.endpoints.is_empty() && s.ports.as_ref().is_none_or(|p| p.is_empty()));
        match placeholder {
            Some(i) => {
                let p = stale.remove(i);
                if !metadata_current(&p, template) {
                    out.update.push(with_template((*p).clone(), template));
                }
            }
            None => out.create.push(new_slice(template, &[], Vec::new())),
        }
    }
    out.delete.extend(stale);
    out.delete
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    // Reuse slices about to be deleted for slices about to be created.
    while !out.create.is_empty() && !out.delete.is_empty() {
        let c = out.create.remove(0);
        let d = out.delete.remove(0);
        let mut reused = with_template((*d).clone(), template);
        reused.endpoints = c.endpoints;
        reused.ports = c.ports;
        out.update.push(reused);
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::EndpointConditions;

    use super::*;

    fn template() -> SliceTemplate {
        SliceTemplate {
            namespace: "default".into(),
            generate_name: "web-".into(),
            labels: [("kubernetes.io/service-name".to_string(), "web".to_string())].into(),
            owner: OwnerReference {
                uid: "svc-uid".into(),
                ..Default::default()
            },
            address_type: "IPv4".into(),
        }
    }

    fn port(n: i32) -> EndpointPort {
        EndpointPort {
            name: Some("http".into()),
            port: Some(n),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }
    }

    fn ep(i: usize, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![format!("10.0.{}.{}", i / 250, i % 250 + 1)],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("default".into()),
                name: Some(format!("p{i}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn desired(ports: &[EndpointPort], eps: Vec<Endpoint>) -> BTreeMap<String, Desired> {
        [(
            port_key(ports),
            Desired {
                ports: ports.to_vec(),
                endpoints: eps,
            },
        )]
        .into()
    }

    /// Applies a plan as the API would (names for creations).
    fn apply(
        existing: Vec<Arc<EndpointSlice>>,
        p: Plan,
        next: &mut usize,
    ) -> Vec<Arc<EndpointSlice>> {
        let mut by_name: BTreeMap<String, Arc<EndpointSlice>> = existing
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap(), s))
            .collect();
        for d in p.delete {
            by_name.remove(d.metadata.name.as_ref().unwrap());
        }
        for u in p.update {
            by_name.insert(u.metadata.name.clone().unwrap(), Arc::new(u));
        }
        for mut c in p.create {
            *next += 1;
            c.metadata.name = Some(format!("web-{next}"));
            by_name.insert(c.metadata.name.clone().unwrap(), Arc::new(c));
        }
        by_name.into_values().collect()
    }

    #[test]
    fn splits_at_the_maximum_and_touches_only_changed_slices() {
        let t = template();
        let ports = [port(8080)];
        let mut n = 0;
        let first = plan(
            &[],
            desired(&ports, (0..250).map(|i| ep(i, true)).collect()),
            &t,
            100,
        );
        assert_eq!((first.create.len(), first.update.len()), (3, 0));
        let slices = apply(vec![], first, &mut n);
        assert!(slices.iter().all(|s| s.endpoints.len() <= 100));

        // One pod turns unready: exactly one slice is rewritten.
        let mut eps: Vec<Endpoint> = (0..250).map(|i| ep(i, true)).collect();
        eps[7] = ep(7, false);
        let p = plan(&slices, desired(&ports, eps.clone()), &t, 100);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        let slices = apply(slices, p, &mut n);

        // Nothing changed: nothing written.
        assert!(plan(&slices, desired(&ports, eps.clone()), &t, 100).is_empty());

        // A new pod goes into the fullest slice that has room, no new slice.
        eps.push(ep(300, true));
        let p = plan(&slices, desired(&ports, eps), &t, 100);
        assert_eq!((p.create.len(), p.update.len()), (0, 1));
        assert_eq!(p.update[0].endpoints.len(), 51);
    }

    #[test]
    fn a_new_port_set_reuses_the_old_slices() {
        let t = template();
        let mut n = 0;
        let slices = apply(
            vec![],
            plan(&[], desired(&[port(80)], vec![ep(1, true)]), &t, 100),
            &mut n,
        );
        let p = plan(&slices, desired(&[port(8080)], vec![ep(1, true)]), &t, 100);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        assert_eq!(p.update[0].ports.as_ref().unwrap()[0].port, Some(8080));
    }

    #[test]
    fn no_endpoints_leaves_one_placeholder() {
        let t = template();
        let mut n = 0;
        let p = plan(&[], BTreeMap::new(), &t, 100);
        assert_eq!(p.create.len(), 1);
        let slices = apply(vec![], p, &mut n);
        assert!(plan(&slices, BTreeMap::new(), &t, 100).is_empty());
        // Endpoints appear: the placeholder becomes the real slice.
        let p = plan(&slices, desired(&[port(80)], vec![ep(1, true)]), &t, 100);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        // And when they go, the slice is emptied into a placeholder again.
        let slices = apply(slices, p, &mut n);
        let p = plan(&slices, BTreeMap::new(), &t, 100);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        assert!(p.update[0].endpoints.is_empty());
    }
}
