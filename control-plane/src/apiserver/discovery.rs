//! What the server tells clients about itself: /version, legacy discovery (APIVersions,
//! APIGroupList, APIResourceList), aggregated discovery v2 (and v2beta1, for kubectl 1.29) with
//! its exact content type, and OpenAPI v3 (per group-version) and v2 (one document, see
//! `openapi_v2.rs` for its protobuf form) from the same schemas, whose PATCH operations
//! declare the `fieldValidation` parameter, so kubectl leaves validation to the server.

use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ServerAddressByClientCIDR,
};
use serde_json::{json, Value};

use super::output::{self, Resp};
use super::registry::{self, Resource, Scope, Storage, Subresource};

/// The Kubernetes version the API types are (k8s-openapi's v1_33).
pub const MAJOR: &str = "1";
pub const MINOR: &str = "33";
pub const GIT_VERSION: &str = "v1.33.0";

pub fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": GIT_VERSION,
        "gitCommit": concat!("skiff-", env!("CARGO_PKG_VERSION")),
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "skiff (rust)",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub fn core_versions(server_address: &str) -> Value {
    to_value(&APIVersions {
        versions: vec!["v1".into()],
        server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
            client_cidr: "0.0.0.0/0".into(),
            server_address: server_address.into(),
        }],
    })
}

fn api_group(name: &str) -> APIGroup {
    let versions: Vec<GroupVersionForDiscovery> = registry::group_versions(name)
        .into_iter()
        .map(|version| GroupVersionForDiscovery {
            group_version: format!("{name}/{version}"),
            version: version.into(),
        })
        .collect();
    APIGroup {
        name: name.into(),
        preferred_version: versions.first().cloned(),
        server_address_by_client_cidrs: None,
        versions,
    }
}

pub fn groups() -> Value {
    to_value(&APIGroupList {
        groups: registry::groups().into_iter().map(api_group).collect(),
    })
}

pub fn group(name: &str) -> Option<Value> {
    registry::groups()
        .contains(&name)
        .then(|| to_value(&api_group(name)))
}

fn subresource_verbs(s: Subresource) -> Vec<String> {
    match s {
        Subresource::Status
        | Subresource::Scale
        | Subresource::EphemeralContainers
        | Subresource::Approval => {
            vec!["get".into(), "patch".into(), "update".into()]
        }
        Subresource::Binding | Subresource::Eviction | Subresource::Token => {
            vec!["create".into()]
        }
        Subresource::Log => vec!["get".into()],
        Subresource::Exec | Subresource::Attach | Subresource::PortForward => {
            vec!["create".into(), "get".into()]
        }
        Subresource::Proxy => ["create", "delete", "get", "patch", "update"]
            .map(String::from)
            .into(),
    }
}

fn subresource_kind(r: &Resource, s: Subresource) -> (&'static str, &'static str, &'static str) {
    match s {
        Subresource::Scale => ("autoscaling", "v1", "Scale"),
        Subresource::Binding => ("", "v1", "Binding"),
        Subresource::Log => ("", "v1", "Pod"),
        Subresource::Exec => ("", "v1", "PodExecOptions"),
        Subresource::Eviction => ("policy", "v1", "Eviction"),
        Subresource::Attach => ("", "v1", "PodAttachOptions"),
        Subresource::PortForward => ("", "v1", "PodPortForwardOptions"),
        Subresource::Proxy => ("", "v1", proxy_options(r.kind)),
        Subresource::Token => ("authentication.k8s.io", "v1", "TokenRequest"),
        Subresource::Status | Subresource::EphemeralContainers | Subresource::Approval => {
            (r.group, r.version, r.kind)
        }
    }
}

/// The options kind of a proxy subresource (`PodProxyOptions`, ...), as discovery names it.
fn proxy_options(kind: &str) -> &'static str {
    match kind {
        "Pod" => "PodProxyOptions",
        "Service" => "ServiceProxyOptions",
        _ => "NodeProxyOptions",
    }
}

pub fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in registry::all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(APIResource {
            name: r.plural.into(),
            singular_name: r.singular.into(),
            namespaced: r.namespaced(),
            kind: r.kind.into(),
            verbs: r.verbs().iter().map(|v| v.to_string()).collect(),
            short_names: (!r.short_names.is_empty())
                .then(|| r.short_names.iter().map(|s| s.to_string()).collect()),
            categories: (!r.categories.is_empty())
                .then(|| r.categories.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        });
        for s in r.subresources {
            let (g, v, k) = subresource_kind(r, *s);
            resources.push(APIResource {
                name: format!("{}/{}", r.plural, s.name()),
                singular_name: String::new(),
                namespaced: r.namespaced(),
                kind: k.into(),
                group: (g != r.group).then(|| g.to_string()),
                version: (v != r.version || g != r.group).then(|| v.to_string()),
                verbs: subresource_verbs(*s),
                ..Default::default()
            });
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    to_value(&APIResourceList {
        group_version: gv,
        resources,
    })
}

/// The content type of an aggregated discovery answer.
pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// APIGroupDiscoveryList for `/api` (core) or `/apis` (every named group).
pub fn aggregated(core: bool, version: &str) -> Value {
    let names: Vec<&str> = if core { vec![""] } else { registry::groups() };
    let items: Vec<Value> = names
        .into_iter()
        .map(|g| {
            let versions: Vec<Value> = registry::group_versions(g)
                .into_iter()
                .map(|version| {
            let resources: Vec<Value> = registry::all()
                .into_iter()
                .filter(|r| r.group == g && r.version == version)
                .map(|r| {
                    let subs: Vec<Value> = r
                        .subresources
                        .iter()
                        .map(|s| {
                            let (sg, sv, sk) = subresource_kind(r, *s);
                            json!({
                                "subresource": s.name(),
                                "responseKind": {"group": sg, "version": sv, "kind": sk},
                                "verbs": subresource_verbs(*s),
                            })
                        })
                        .collect();
                    let mut res = json!({
                        "resource": r.plural,
                        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                        "scope": if r.scope == Scope::Namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": r.singular,
                        "verbs": r.verbs(),
                    });
                    if !r.short_names.is_empty() {
                        res["shortNames"] = json!(r.short_names);
                    }
                    if !r.categories.is_empty() {
                        res["categories"] = json!(r.categories);
                    }
                    if !subs.is_empty() {
                        res["subresources"] = json!(subs);
                    }
                    res
                })
                .collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({
                "metadata": {"name": g, "creationTimestamp": null},
                "versions": versions,
            })
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// Path of a group-version's OpenAPI document: `api/v1`, `apis/apps/v1`.
fn openapi_gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn openapi_index() -> Value {
    let mut paths = serde_json::Map::new();
    let mut seen = Vec::new();
    for r in registry::all() {
        let p = openapi_gv_path(r.group, r.version);
        if !seen.contains(&p) {
            // kubectl caches a document by its hash: a custom resource's changes with its
            // definition (each definition spec is one interned resource).
            let hash = match r.custom() {
                Some(_) => format!("{}-{:p}", env!("CARGO_PKG_VERSION"), r),
                None => env!("CARGO_PKG_VERSION").to_string(),
            };
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
            );
            seen.push(p);
        }
    }
    json!({ "paths": paths })
}

/// The `fieldValidation` query parameter, in OpenAPI v3 (`schema`) or v2 (`type`) form.
pub fn field_validation_parameter(v2: bool) -> Value {
    let description = "Ignore, Warn or Strict: how unknown or duplicate fields are treated";
    if v2 {
        json!({"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": true,
               "description": description})
    } else {
        json!({"name": "fieldValidation", "in": "query",
               "schema": {"type": "string", "uniqueItems": true}, "description": description})
    }
}

/// A resource's collection and item paths with their operations, each marked with the
/// resource's group-version-kind and declaring the `fieldValidation` parameter on writes.
pub fn resource_paths(r: &Resource, gv_path: &str, v2: bool) -> Vec<(String, Value)> {
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let base = if r.namespaced() {
        format!("/{gv_path}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("/{gv_path}/{}", r.plural)
    };
    let op = |action: &str, id: &str| {
        json!({
            "operationId": format!("{id}{}", r.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [field_validation_parameter(v2)],
            "responses": {"200": {"description": "OK"}},
        })
    };
    if matches!(r.storage, Storage::None) {
        // Answered, never stored: only a create.
        return vec![(base, json!({"post": op("post", "create")}))];
    }
    if matches!(r.storage, Storage::Metrics) {
        return vec![
            (base.clone(), json!({"get": op("list", "list")})),
            (
                format!("{base}/{{name}}"),
                json!({"get": op("get", "read")}),
            ),
        ];
    }
    vec![
        (
            base.clone(),
            json!({"post": op("post", "create"), "get": op("list", "list")}),
        ),
        (
            format!("{base}/{{name}}"),
            json!({"get": op("get", "read"), "put": op("put", "replace"),
                   "patch": op("patch", "patch"), "delete": op("delete", "delete")}),
        ),
    ]
}

/// The schemas of the resources `include` selects and of everything they refer to, each
/// kind marked with its group-version-kind (as `kubectl explain` looks them up); references
/// point below `definitions_path` (`/components/schemas` for v3, `/definitions` for v2).
pub fn kind_schemas(
    definitions_path: &'static str,
    include: impl Fn(&Resource) -> bool,
) -> serde_json::Map<String, Value> {
    let mut settings = schemars::generate::SchemaSettings::openapi3();
    settings.definitions_path = definitions_path.into();
    let mut generator = settings.into_generator();
    let mut schemas = serde_json::Map::new();
    for r in registry::all().into_iter().filter(|r| include(r)) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        if let Some(c) = r.custom() {
            let meta = generator
                .subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>()
                .to_value();
            let mut schema = if definitions_path == "/definitions" {
                c.schema.openapi_v2()
            } else {
                c.schema.openapi()
            };
            if !schema.is_object() {
                schema = json!({"type": "object"});
            }
            let props = schema
                .as_object_mut()
                .expect("an object")
                .entry("properties")
                .or_insert_with(|| json!({}));
            props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
            props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
            props["metadata"] = meta;
            schema["x-kubernetes-group-version-kind"] = json!([gvk]);
            schemas.insert(custom_schema_name(r), schema);
            continue;
        }
        let mut schema = (r.schema.build)(&mut generator).to_value();
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert((r.schema.name)().into_owned(), schema);
    }
    // What the kinds refer to (ObjectMeta, PodSpec...), each once; the kinds themselves win.
    for (name, schema) in generator.take_definitions(true) {
        schemas.entry(name).or_insert(schema);
    }
    schemas
}

/// A custom kind's schema name, as Kubernetes names it: the group reversed, the version, the
/// kind (`com.example.v1.Widget`).
fn custom_schema_name(r: &Resource) -> String {
    let reversed: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
}

/// `/openapi/v3/<gv>`: each resource's paths with their group-version-kind and the
/// `fieldValidation` parameter on writes, and the resources' schemas (from k8s-openapi, with
/// their descriptions) under components.
pub fn openapi_group_version(gv_path: &str) -> Option<Value> {
    let in_gv = |r: &Resource| openapi_gv_path(r.group, r.version) == gv_path;
    let mut paths = serde_json::Map::new();
    for r in registry::all().into_iter().filter(|r| in_gv(r)) {
        paths.extend(resource_paths(r, gv_path, false));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": kind_schemas("/components/schemas", in_gv)},
    }))
}

/// `/openapi/v2`: every resource's paths and schemas in one Swagger 2.0 document.
pub fn openapi_v2() -> Value {
    let mut paths = serde_json::Map::new();
    for r in registry::all() {
        paths.extend(resource_paths(
            r,
            &openapi_gv_path(r.group, r.version),
            true,
        ));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "definitions": kind_schemas("/definitions", |_| true),
    })
}

/// Answers a discovery document, in aggregated form when the client asked for it.
pub fn answer(v: &Value) -> Resp {
    output::ok(v)
}

pub fn answer_aggregated(v: &Value, version: &str) -> Resp {
    output::bytes(
        StatusCode::OK,
        &aggregated_content_type(version),
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_lists_pods_with_short_names_and_subresources() {
        let v = aggregated(true, "v2");
        let pods = v["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .unwrap()
            .clone();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["scope"], "Namespaced");
        assert!(pods["subresources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["subresource"] == "status"));
        let apis = aggregated(false, "v2");
        let deploy = &apis["items"][0]["versions"][0]["resources"][0];
        assert_eq!(deploy["resource"], "deployments");
        assert_eq!(deploy["subresources"][1]["responseKind"]["kind"], "Scale");
    }

    #[test]
    fn legacy_documents_have_kinds() {
        assert_eq!(groups()["kind"], "APIGroupList");
        let l = resource_list("apps", "v1");
        assert_eq!(l["groupVersion"], "apps/v1");
        assert!(l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "deployments/scale"));
        assert!(group("nope").is_none());
    }

    #[test]
    fn openapi_declares_field_validation_on_patch() {
        let idx = openapi_index();
        assert!(idx["paths"]["apis/apps/v1"]["serverRelativeURL"].is_string());
        let doc = openapi_group_version("apis/apps/v1").unwrap();
        let p = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(p["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        assert_eq!(p["parameters"][0]["name"], "fieldValidation");
        assert!(openapi_group_version("apis/nope/v1").is_none());
    }
}
