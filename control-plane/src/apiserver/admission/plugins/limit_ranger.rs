//! LimitRanger: the namespace's LimitRanges applied to a new pod. Mutating: each container
//! without a limit (request) for a resource gets the LimitRange's `default`
//! (`defaultRequest`), recorded in the `kubernetes.io/limit-ranger` annotation. Validating:
//! each container's and the pod's requests and limits within `min`/`max`, and
//! limit/request within `maxLimitRequestRatio`, with Kubernetes' messages. Pods on create (a
//! pod's resources cannot change afterwards); PersistentVolumeClaims' requested storage
//! within the `PersistentVolumeClaim` items' `min`/`max` on create and on update (a resize),
//! as Kubernetes' plugin does.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    Container, LimitRange, LimitRangeItem, PersistentVolumeClaim, Pod,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use serde_json::Value;

use super::super::{Env, Operation, Plugin, Request};
use crate::machinery::quantity::Quantity;
use crate::machinery::quota;
use crate::machinery::ApiError;

const ANNOTATION: &str = "kubernetes.io/limit-ranger";

type Resources = BTreeMap<String, ApiQuantity>;

pub struct LimitRanger {
    env: Env,
}

impl LimitRanger {
    pub fn new(env: Env) -> LimitRanger {
        LimitRanger { env }
    }

    /// The namespace's LimitRanges, when the request is one the plugin acts on.
    async fn ranges(&self, req: &Request<'_>) -> Result<Vec<LimitRange>, ApiError> {
        let acts = match req.operation {
            Operation::Create => req.is_pod() || is_claim(req),
            Operation::Update => is_claim(req),
            Operation::Delete | Operation::Connect => false,
        };
        let (true, Some(ns)) = (acts, req.namespace) else {
            return Ok(Vec::new());
        };
        let found = self.env.list("", "limitranges", Some(ns)).await?;
        Ok(found
            .iter()
            .filter_map(|o| serde_json::from_slice(&o.json).ok())
            .collect())
    }
}

#[async_trait]
impl Plugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    async fn admit(&self, req: &Request<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        let ranges = self.ranges(req).await?;
        if ranges.is_empty() || !req.is_pod() {
            return Ok(());
        }
        let Ok(mut pod) = serde_json::from_value::<Pod>(obj.clone()) else {
            // Schema validation reports what does not decode.
            return Ok(());
        };
        for lr in &ranges {
            set_defaults(lr, &mut pod);
        }
        *obj = serde_json::to_value(&pod).map_err(ApiError::internal)?;
        Ok(())
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        let ranges = self.ranges(req).await?;
        if ranges.is_empty() {
            return Ok(());
        }
        let errors: Vec<String> = if is_claim(req) {
            let Ok(claim) = serde_json::from_value::<PersistentVolumeClaim>(obj.clone()) else {
                return Ok(());
            };
            ranges
                .iter()
                .flat_map(|lr| claim_violations(lr, &claim))
                .collect()
        } else {
            let Ok(pod) = serde_json::from_value::<Pod>(obj.clone()) else {
                return Ok(());
            };
            ranges.iter().flat_map(|lr| violations(lr, &pod)).collect()
        };
        match aggregate(&errors) {
            None => Ok(()),
            Some(message) => Err(req.forbidden(Some(obj), message)),
        }
    }
}

/// A PersistentVolumeClaim itself (not its status).
fn is_claim(req: &Request<'_>) -> bool {
    req.is("", "PersistentVolumeClaim") && req.subresource.is_none()
}

/// PersistentVolumeClaimValidateLimitFunc: the requested storage (what the user asks for;
/// a claim's limits are not) against the `PersistentVolumeClaim` items' min and max.
fn claim_violations(lr: &LimitRange, claim: &PersistentVolumeClaim) -> Vec<String> {
    const KIND: &str = "PersistentVolumeClaim";
    let requests = quota::from_api(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    );
    let mut out = Vec::new();
    for item in items(lr, KIND) {
        for (res, enforced) in quota::from_api(item.min.as_ref()) {
            match requests.get(&res) {
                None => out.push(format!(
                    "minimum {res} usage per {KIND} is {enforced}.  No request is specified"
                )),
                Some(req) if req < &enforced => out.push(format!(
                    "minimum {res} usage per {KIND} is {enforced}, but request is {req}"
                )),
                Some(_) => {}
            }
        }
        for (res, enforced) in quota::from_api(item.max.as_ref()) {
            match requests.get(&res) {
                None => out.push(format!(
                    "maximum {res} usage per {KIND} is {enforced}.  No request is specified"
                )),
                Some(req) if req > &enforced => out.push(format!(
                    "maximum {res} usage per {KIND} is {enforced}, but request is {req}"
                )),
                Some(_) => {}
            }
        }
    }
    out
}

/// Go's utilerrors.NewAggregate message: one error as it is, several as `[a, b]` (repeats
/// dropped).
pub fn aggregate(errors: &[String]) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => None,
        1 => Some(seen[0].to_string()),
        _ => Some(format!("[{}]", seen.join(", "))),
    }
}

fn items<'a>(lr: &'a LimitRange, kind: &'a str) -> impl Iterator<Item = &'a LimitRangeItem> {
    lr.spec
        .iter()
        .flat_map(|s| s.limits.iter())
        .filter(move |i| i.type_ == kind)
}

/// Fills containers' missing limits and requests from the LimitRange's container defaults.
fn set_defaults(lr: &LimitRange, pod: &mut Pod) {
    let mut limits = Resources::new();
    let mut requests = Resources::new();
    for item in items(lr, "Container") {
        limits.extend(item.default.clone().unwrap_or_default());
        requests.extend(item.default_request.clone().unwrap_or_default());
    }
    if limits.is_empty() && requests.is_empty() {
        return;
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let mut notes = Vec::new();
    for c in spec.containers.iter_mut() {
        merge(c, &limits, &requests, "container", &mut notes);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        merge(c, &limits, &requests, "init container", &mut notes);
    }
    if !notes.is_empty() {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                ANNOTATION.to_string(),
                format!("LimitRanger plugin set: {}", notes.join("; ")),
            );
    }
}

fn merge(
    c: &mut Container,
    limits: &Resources,
    requests: &Resources,
    what: &str,
    notes: &mut Vec<String>,
) {
    let r = c.resources.get_or_insert_with(Default::default);
    let set = |have: &mut Option<Resources>, defaults: &Resources| {
        let have = have.get_or_insert_with(Resources::new);
        let mut set = Vec::new();
        for (k, v) in defaults {
            if !have.contains_key(k) {
                have.insert(k.clone(), v.clone());
                set.push(k.clone());
            }
        }
        set
    };
    let set_requests = set(&mut r.requests, requests);
    let set_limits = set(&mut r.limits, limits);
    if !set_requests.is_empty() {
        notes.push(format!(
            "{} request for {what} {}",
            set_requests.join(", "),
            c.name
        ));
    }
    if !set_limits.is_empty() {
        notes.push(format!(
            "{} limit for {what} {}",
            set_limits.join(", "),
            c.name
        ));
    }
}

/// Every violation of `lr` by the pod, in Kubernetes' words.
fn violations(lr: &LimitRange, pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items(lr, "Container") {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let r = c.resources.as_ref();
            let requests = quota::from_api(r.and_then(|r| r.requests.as_ref()));
            let limits = quota::from_api(r.and_then(|r| r.limits.as_ref()));
            check(item, "Container", &requests, &limits, &mut out);
        }
    }
    for item in items(lr, "Pod") {
        let (requests, limits) = quota::pod_requests_limits(pod);
        check(item, "Pod", &requests, &limits, &mut out);
    }
    out
}

/// Kubernetes' resource.MaxMilliValue: the largest value whose milli form fits an int64.
const MAX_MILLI_VALUE: i64 = i64::MAX / 1000;

/// requestLimitEnforcedValues: milli-units where they cannot overflow, else whole units.
fn common_precision(values: [Option<&Quantity>; 3]) -> [i64; 3] {
    let whole = values.map(|q| q.map_or(0, Quantity::value));
    if whole.iter().all(|v| *v <= MAX_MILLI_VALUE) {
        values.map(|q| q.map_or(0, Quantity::milli_value))
    } else {
        whole
    }
}

fn check(
    item: &LimitRangeItem,
    kind: &str,
    requests: &BTreeMap<String, Quantity>,
    limits: &BTreeMap<String, Quantity>,
    out: &mut Vec<String>,
) {
    for (res, enforced) in quota::from_api(item.min.as_ref()) {
        let (req, lim) = (requests.get(&res), limits.get(&res));
        let [r, l, e] = common_precision([req, lim, Some(&enforced)]);
        match (req, lim) {
            (None, _) => out.push(format!(
                "minimum {res} usage per {kind} is {enforced}.  No request is specified"
            )),
            (Some(req), _) if r < e => out.push(format!(
                "minimum {res} usage per {kind} is {enforced}, but request is {req}"
            )),
            (_, Some(lim)) if l < e => out.push(format!(
                "minimum {res} usage per {kind} is {enforced}, but limit is {lim}"
            )),
            _ => {}
        }
    }
    for (res, enforced) in quota::from_api(item.max.as_ref()) {
        let (req, lim) = (requests.get(&res), limits.get(&res));
        let [r, l, e] = common_precision([req, lim, Some(&enforced)]);
        match (req, lim) {
            (_, None) => out.push(format!(
                "maximum {res} usage per {kind} is {enforced}.  No limit is specified"
            )),
            (_, Some(lim)) if l > e => out.push(format!(
                "maximum {res} usage per {kind} is {enforced}, but limit is {lim}"
            )),
            (Some(req), _) if r > e => out.push(format!(
                "maximum {res} usage per {kind} is {enforced}, but request is {req}"
            )),
            _ => {}
        }
    }
    for (res, enforced) in quota::from_api(item.max_limit_request_ratio.as_ref()) {
        let (req, lim) = (requests.get(&res), limits.get(&res));
        let [r, l, _] = common_precision([req, lim, Some(&enforced)]);
        if req.is_none() || r == 0 {
            out.push(format!("{res} max limit to request ratio per {kind} is {enforced}, but no request is specified or request is 0"));
            continue;
        }
        if lim.is_none() || l == 0 {
            out.push(format!("{res} max limit to request ratio per {kind} is {enforced}, but no limit is specified or limit is 0"));
            continue;
        }
        let observed = l as f64 / r as f64;
        // Compared in milli-units unless that would overflow, as Kubernetes does.
        let (scaled, max) = if enforced.value() <= MAX_MILLI_VALUE {
            (observed * 1000.0, enforced.milli_value() as f64)
        } else {
            (observed, enforced.value() as f64)
        };
        if scaled > max {
            out.push(format!(
                "{res} max limit to request ratio per {kind} is {enforced}, but provided ratio is {observed:.6}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn range(limits: Value) -> LimitRange {
        let mut v = json!({"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"l"},"spec":{"limits":limits}});
        if let Some(k) = crate::machinery::kinds::rules("", "LimitRange") {
            (k.default)(&mut v);
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(resources: Value) -> Pod {
        serde_json::from_value(json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"web","image":"i","resources":resources}]}}))
        .unwrap()
    }

    #[test]
    fn claims_request_storage_within_min_and_max() {
        let lr = range(json!([{"type":"PersistentVolumeClaim",
            "min":{"storage":"1Gi"},"max":{"storage":"10Gi"}}]));
        let claim = |requests: Value| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata":{"name":"c"},
                "spec":{"resources":{"requests":requests}}}))
            .unwrap()
        };
        assert!(claim_violations(&lr, &claim(json!({"storage":"5Gi"}))).is_empty());
        assert_eq!(
            claim_violations(&lr, &claim(json!({"storage":"20Gi"}))),
            ["maximum storage usage per PersistentVolumeClaim is 10Gi, but request is 20Gi"]
        );
        assert_eq!(
            claim_violations(&lr, &claim(json!({"storage":"500Mi"}))),
            ["minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi"]
        );
        assert_eq!(
            claim_violations(&lr, &claim(json!({}))),
            [
                "minimum storage usage per PersistentVolumeClaim is 1Gi.  No request is specified",
                "maximum storage usage per PersistentVolumeClaim is 10Gi.  No request is specified"
            ]
        );
        // Container items say nothing about claims.
        let containers = range(json!([{"type":"Container","max":{"cpu":"1"}}]));
        assert!(claim_violations(&containers, &claim(json!({}))).is_empty());
    }

    #[test]
    fn defaults_fill_what_is_missing_and_say_so() {
        let lr = range(
            json!([{"type":"Container","default":{"cpu":"500m","memory":"128Mi"},
            "defaultRequest":{"cpu":"100m"}}]),
        );
        let mut p = pod(json!({"limits":{"memory":"64Mi"}}));
        set_defaults(&lr, &mut p);
        let r = p.spec.unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()["cpu"].0, "500m");
        assert_eq!(r.requests.unwrap()["memory"].0, "128Mi");
        assert_eq!(
            p.metadata.annotations.unwrap()[ANNOTATION],
            "LimitRanger plugin set: cpu, memory request for container web; cpu limit for container web"
        );
    }

    #[test]
    fn min_max_and_ratio_in_kubernetes_words() {
        let lr = range(
            json!([{"type":"Container","max":{"cpu":"1"},"min":{"memory":"64Mi"},
            "maxLimitRequestRatio":{"cpu":"2"}}]),
        );
        let p = pod(
            json!({"limits":{"cpu":"2","memory":"128Mi"},"requests":{"cpu":"500m","memory":"32Mi"}}),
        );
        let v = violations(&lr, &p);
        assert_eq!(
            v,
            vec![
                "minimum memory usage per Container is 64Mi, but request is 32Mi",
                "maximum cpu usage per Container is 1, but limit is 2",
                "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000",
            ]
        );
        assert_eq!(aggregate(&v).unwrap(), format!("[{}]", v.join(", ")));
        let none = pod(json!({}));
        assert_eq!(
            violations(&lr, &none),
            vec![
                "minimum memory usage per Container is 64Mi.  No request is specified",
                "maximum cpu usage per Container is 1.  No limit is specified",
                "cpu max limit to request ratio per Container is 2, but no request is specified or request is 0",
            ]
        );
        let fits = pod(
            json!({"limits":{"cpu":"1","memory":"64Mi"},"requests":{"cpu":"500m","memory":"64Mi"}}),
        );
        assert!(violations(&lr, &fits).is_empty());
    }

    #[test]
    fn pod_limits_count_every_container() {
        let lr = range(json!([{"type":"Pod","max":{"memory":"100Mi"}}]));
        let p: Pod = serde_json::from_value(json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"a","image":"i","resources":{"limits":{"memory":"60Mi"}}},
            {"name":"b","image":"i","resources":{"limits":{"memory":"60Mi"}}}]}}))
        .unwrap();
        assert_eq!(
            violations(&lr, &p),
            vec!["maximum memory usage per Pod is 100Mi, but limit is 120Mi"]
        );
    }
}
