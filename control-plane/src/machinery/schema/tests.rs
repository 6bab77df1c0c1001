//! Real CRD schemas (as `kubectl apply` would send them) against Kubernetes' paths and
//! messages, one family of rules per test.

use serde_json::{json, Value};

use super::Structural;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::validation::FieldPath;

const AT: &str = "spec.versions[0].schema.openAPIV3Schema";

fn compile(schema: Value) -> Structural {
    Structural::compile(&schema, &FieldPath::new(AT))
        .unwrap_or_else(|e| panic!("schema rejected: {e:?}"))
}

fn schema_errors(schema: Value) -> Vec<String> {
    match Structural::compile(&schema, &FieldPath::new(AT)) {
        Ok(_) => panic!("schema accepted"),
        Err(errs) => errs.iter().map(render).collect(),
    }
}

fn render(e: &FieldError) -> String {
    format!("{}: {}", e.field, e.message)
}

fn errors(s: &Structural, obj: Value) -> Vec<String> {
    s.validate(&obj, None).iter().map(render).collect()
}

fn object(spec: Value) -> Value {
    json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "x"}, "spec": spec})
}

/// The CronTab of Kubernetes' CRD documentation, with a few more fields.
fn crontab() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "description": "The CronTab's desired state.",
                "required": ["cronSpec"],
                "properties": {
                    "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                    "image": {"type": "string", "maxLength": 20, "minLength": 2},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1.5, "multipleOf": 0.5},
                    "policy": {"type": "string", "enum": ["Allow", "Forbid"], "default": "Allow"},
                    "port": {"x-kubernetes-int-or-string": true},
                    "when": {"type": "string", "format": "date-time"},
                    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "note": {"type": "string", "nullable": true}
                }
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    })
}

#[test]
fn a_valid_object_has_no_errors() {
    let s = compile(crontab());
    let obj = object(json!({
        "cronSpec": "*/5 * * * *", "image": "nginx", "replicas": 3, "ratio": 1.0,
        "policy": "Forbid", "port": "http", "when": "2026-12-02T17:00:00Z",
        "tags": ["a"], "labels": {"x": "y"}, "note": null
    }));
    assert_eq!(errors(&s, obj), Vec::<String>::new());
}

#[test]
fn types_are_checked_with_kubernetes_wording() {
    let s = compile(crontab());
    let errs = s.validate(
        &object(json!({"cronSpec": "* * * * *", "replicas": "three", "port": true})),
        None,
    );
    assert_eq!(
        errs.iter().map(render).collect::<Vec<_>>(),
        vec![
            "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
            "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"",
        ]
    );
    assert!(errs.iter().all(|e| e.kind == CauseType::TypeInvalid));
}

#[test]
fn required_fields_are_named() {
    let s = compile(crontab());
    let errs = s.validate(&object(json!({"image": "nginx"})), None);
    assert_eq!(errs, vec![FieldError::required("spec.cronSpec")]);
}

#[test]
fn string_checks_pattern_lengths_format_enum() {
    let s = compile(crontab());
    let obj = object(json!({
        "cronSpec": "every minute", "image": "a-very-long-image-name:latest",
        "policy": "Maybe", "when": "yesterday"
    }));
    assert_eq!(
        errors(&s, obj),
        vec![
            "spec.cronSpec: Invalid value: \"every minute\": spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'",
            "spec.image: Too long: may not be more than 20 bytes",
            "spec.policy: Unsupported value: \"Maybe\": supported values: \"Allow\", \"Forbid\"",
            "spec.when: Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\"",
        ]
    );
    let short = object(json!({"cronSpec": "* * * * *", "image": "é"}));
    assert_eq!(
        errors(&s, short),
        vec![
            "spec.image: Invalid value: \"é\": spec.image in body should be at least 2 chars long"
        ]
    );
}

#[test]
fn numbers_and_items_are_bounded() {
    let s = compile(crontab());
    let obj = object(
        json!({"cronSpec": "* * * * *", "replicas": 11, "ratio": 1.5, "tags": ["a", "b", "c"]}),
    );
    assert_eq!(
        errors(&s, obj),
        vec![
            "spec.ratio: Invalid value: 1.5: spec.ratio in body should be less than 1.5",
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
            "spec.tags: Too many: 3: must have at most 2 items",
        ]
    );
    let obj = object(json!({"cronSpec": "* * * * *", "replicas": 0, "ratio": 0.7}));
    assert_eq!(
        errors(&s, obj),
        vec![
            "spec.ratio: Invalid value: 0.7: spec.ratio in body should be a multiple of 0.5",
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ]
    );
}

#[test]
fn nulls_follow_nullable() {
    let s = compile(crontab());
    assert_eq!(
        errors(&s, object(json!({"cronSpec": null}))),
        vec!["spec.cronSpec: Invalid value: \"null\": spec.cronSpec in body must be of type string: \"null\""]
    );
    // After defaulting a non-nullable null is gone (or defaulted) and the nullable one stays.
    let mut obj =
        object(json!({"cronSpec": "* * * * *", "image": null, "replicas": null, "note": null}));
    s.apply_defaults(&mut obj);
    assert_eq!(
        obj["spec"],
        json!({"cronSpec": "* * * * *", "replicas": 1, "policy": "Allow", "note": null})
    );
    assert_eq!(errors(&s, obj), Vec::<String>::new());
}

#[test]
fn unknown_fields_are_pruned_and_preserved_where_asked() {
    let s = compile(crontab());
    let mut obj = object(json!({"cronSpec": "* * * * *", "colour": "red", "labels": {"a": "b"}}));
    obj["status"] = json!({"anything": {"goes": [1, 2]}});
    obj["extra"] = json!(true);
    obj["metadata"]["unknownMeta"] = json!("the caller's");
    let pruned = s.prune(&mut obj);
    assert_eq!(pruned, vec!["extra", "spec.colour"]);
    assert_eq!(
        obj["spec"],
        json!({"cronSpec": "* * * * *", "labels": {"a": "b"}})
    );
    assert_eq!(obj["status"], json!({"anything": {"goes": [1, 2]}}));
    assert_eq!(obj["metadata"]["unknownMeta"], json!("the caller's"));
    assert_eq!(obj["apiVersion"], json!("stable.example.com/v1"));
}

#[test]
fn defaults_are_applied_inside_defaults_and_items() {
    let s = compile(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "default": {},
                "properties": {
                    "mode": {"type": "string", "default": "fast"},
                    "ports": {"type": "array", "items": {
                        "type": "object",
                        "properties": {"protocol": {"type": "string", "default": "TCP"}, "port": {"type": "integer"}}
                    }}
                }
            }
        }
    }));
    let mut obj = json!({"apiVersion": "a/v1", "kind": "K", "metadata": {}});
    s.apply_defaults(&mut obj);
    assert_eq!(obj["spec"], json!({"mode": "fast"}));
    let mut obj =
        json!({"spec": {"mode": "slow", "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}});
    s.apply_defaults(&mut obj);
    assert_eq!(
        obj["spec"],
        json!({"mode": "slow", "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]})
    );
}

#[test]
fn structural_rules_are_enforced_at_compile() {
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "untyped": {"description": "no type"},
                    "both": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
                    "list": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
                    "bad": {"type": "strin"},
                    "re": {"type": "string", "pattern": "(unclosed"}
                }
            }
        }
    }));
    let want = [
        format!("{AT}.properties[spec].properties[untyped].type: Required value: must not be empty for specified object fields"),
        format!("{AT}.properties[spec].properties[both].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"),
        format!("{AT}.properties[spec].properties[list].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"),
        format!("{AT}.properties[spec].properties[bad].type: Unsupported value: \"strin\": supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""),
    ];
    for w in &want {
        assert!(errs.contains(w), "missing {w:?} in {errs:#?}");
    }
    assert!(
        errs.iter().any(|e| e.starts_with(&format!(
            "{AT}.properties[spec].properties[re].pattern: Invalid value: \"(unclosed\": must be a valid regular expression, but isn't"
        ))),
        "{errs:#?}"
    );
}

#[test]
fn root_metadata_may_only_restrict_name() {
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}
    }));
    assert_eq!(
        errs,
        vec![format!("{AT}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified")]
    );
    let s = compile(json!({
        "type": "object",
        "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}}}}
    }));
    assert_eq!(
        errors(&s, json!({"metadata": {"name": "too-long-a-name"}})),
        vec!["metadata.name: Too long: may not be more than 5 bytes"]
    );
    assert_eq!(
        schema_errors(json!({"type": "array", "items": {"type": "string"}})),
        vec![format!(
            "{AT}.type: Invalid value: \"array\": must be object at the root"
        )]
    );
}

#[test]
fn list_types_set_and_map_reject_duplicates() {
    let s = compile(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "finalizers": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "ports": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name", "protocol"],
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "protocol": {"type": "string", "default": "TCP"},
                                "port": {"type": "integer"}
                            }
                        }
                    }
                }
            }
        }
    }));
    let obj = object(json!({
        "finalizers": ["a", "b", "a"],
        "ports": [{"name": "http", "port": 80}, {"name": "http", "protocol": "UDP"}, {"name": "http", "port": 81}]
    }));
    let errs = s.validate(&obj, None);
    assert_eq!(
        errs.iter().map(render).collect::<Vec<_>>(),
        vec![
            "spec.finalizers[2]: Duplicate value: \"a\"",
            "spec.ports[2]: Duplicate value: map[string]interface {}{\"name\":\"http\", \"protocol\":\"TCP\"}",
        ]
    );
    assert!(errs.iter().all(|e| e.kind == CauseType::Duplicate));
}

#[test]
fn list_type_rules_are_checked_at_compile() {
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {
            "m": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "n": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                  "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "o": {"type": "string", "x-kubernetes-list-type": "set"},
            "p": {"type": "array", "x-kubernetes-list-type": "bag", "items": {"type": "string"}}
        }
    }));
    assert_eq!(
        errs,
        vec![
            format!("{AT}.properties[m].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"),
            format!("{AT}.properties[n].items.required: Required value: all map keys must be required or have a default value: \"k\" is neither"),
            format!("{AT}.properties[o].x-kubernetes-list-type: Invalid value: \"set\": must only be used if type is array"),
            format!("{AT}.properties[p].x-kubernetes-list-type: Unsupported value: \"bag\": supported values: \"atomic\", \"set\", \"map\""),
        ]
    );
}

#[test]
fn additional_properties_and_preserve_unknown_fields() {
    let s = compile(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "known": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    "limits": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                    "free": {"type": "object", "additionalProperties": true}
                }
            }
        }
    }));
    let mut obj = object(json!({
        "kept": {"x": 1},
        "known": {"a": 1, "b": 2},
        "limits": {"cpu": 2, "memory": -1},
        "free": {"anything": [1]}
    }));
    assert_eq!(s.prune(&mut obj), vec!["spec.known.b"]);
    assert_eq!(
        obj["spec"],
        json!({"kept": {"x": 1}, "known": {"a": 1}, "limits": {"cpu": 2, "memory": -1}, "free": {"anything": [1]}})
    );
    assert_eq!(
        errors(&s, obj),
        vec!["spec.limits.memory: Invalid value: -1: spec.limits.memory in body should be greater than or equal to 0"]
    );
}

#[test]
fn embedded_resources_keep_type_and_object_meta() {
    let s = compile(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": true,
                        "properties": {"spec": {"type": "object", "properties": {"image": {"type": "string"}}}}
                    }
                }
            }
        }
    }));
    let mut obj = object(json!({"template": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "bogus": 1},
        "spec": {"image": "x", "other": 2}
    }}));
    assert_eq!(
        s.prune(&mut obj),
        vec!["spec.template.metadata.bogus", "spec.template.spec.other"]
    );
    assert_eq!(
        obj["spec"]["template"],
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"image": "x"}})
    );
    assert_eq!(errors(&s, obj), Vec::<String>::new());
    let untyped = object(json!({"template": {"kind": "", "spec": {}}}));
    assert_eq!(
        errors(&s, untyped),
        vec![
            "spec.template.apiVersion: Required value: must not be empty",
            "spec.template.kind: Invalid value: \"\": must not be empty",
        ]
    );
    assert_eq!(
        schema_errors(json!({"type": "object", "properties": {"e": {"x-kubernetes-embedded-resource": true}}})),
        vec![
            format!("{AT}.properties[e].type: Required value: must be object if x-kubernetes-embedded-resource is true"),
            format!("{AT}.properties[e].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields"),
        ]
    );
}

#[test]
fn value_validations_under_junctors() {
    let s = compile(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "size": {
                        "x-kubernetes-int-or-string": true,
                        "anyOf": [{"type": "integer"}, {"type": "string"}],
                        "pattern": "^[0-9]+(Mi|Gi)$"
                    },
                    "choice": {
                        "type": "object",
                        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]
                    },
                    "name": {"type": "string", "not": {"enum": ["forbidden"]}, "allOf": [{"minLength": 2}, {"maxLength": 5}]}
                }
            }
        }
    }));
    assert_eq!(
        errors(
            &s,
            object(json!({"size": 3, "choice": {"a": "x"}, "name": "abc"}))
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, object(json!({"size": "3Ki", "choice": {"a": "x", "b": "y"}, "name": "forbidden"}))),
        vec![
            "spec.choice: Invalid value: \"\": spec.choice in body must validate one and only one schema (oneOf)",
            "spec.name: Too long: may not be more than 5 bytes",
            "spec.name: Invalid value: \"\": spec.name in body must validate all the schemas (allOf)",
            "spec.name: Invalid value: \"\": spec.name in body must not validate the schema (not)",
            "spec.size: Invalid value: \"3Ki\": spec.size in body should match '^[0-9]+(Mi|Gi)$'",
        ]
    );
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {"x": {"type": "string", "allOf": [{"type": "string", "description": "d"}]}}
    }));
    assert_eq!(
        errs,
        vec![
            format!("{AT}.properties[x].allOf[0].type: Forbidden: must be empty to be structural"),
            format!("{AT}.properties[x].allOf[0].description: Forbidden: must be empty to be structural"),
        ]
    );
}

#[test]
fn defaults_must_validate_at_compile() {
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "mail": {"type": "string", "format": "email", "default": "abc"},
                "n": {"type": "integer", "default": "one"},
                "o": {"type": "object", "properties": {"a": {"type": "string"}}, "default": {"a": "x", "b": 1}}
            }}
        }
    }));
    assert_eq!(
        errs,
        vec![
            format!("{AT}.properties[spec].properties[mail].default: Invalid value: \"abc\": in body must be of type email: \"abc\""),
            format!("{AT}.properties[spec].properties[n].default: Invalid value: \"string\": in body must be of type integer: \"string\""),
            format!("{AT}.properties[spec].properties[o].default: Invalid value: {{\"a\":\"x\",\"b\":1}}: must not have unknown fields: b"),
        ]
    );
}

/// A schema with CEL rules as the Kubernetes documentation writes them.
fn cel_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.minReplicas <= self.replicas", "message": "replicas should be greater than or equal to minReplicas"},
                    {"rule": "!has(self.paused) || !self.paused || self.replicas == 0",
                     "messageExpression": "'paused, but replicas is ' + string(self.replicas)",
                     "fieldPath": ".replicas", "reason": "FieldValueForbidden"},
                    {"rule": "self.tags.all(t, t.startsWith('team-'))"}
                ],
                "properties": {
                    "replicas": {"type": "integer", "x-kubernetes-validations": [
                        {"rule": "self >= oldSelf", "message": "replicas may not decrease"}
                    ]},
                    "minReplicas": {"type": "integer"},
                    "paused": {"type": "boolean"},
                    "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 1.0"}]},
                    "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                    "immutable": {"type": "string", "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "is immutable"}
                    ]},
                    "token": {"type": "string", "x-kubernetes-validations": [
                        {"rule": "oldSelf.hasValue() || self.size() == 8", "optionalOldSelf": true,
                         "message": "a new token has 8 characters"}
                    ]}
                }
            }
        }
    })
}

#[test]
fn cel_rules_fail_with_their_messages() {
    let s = compile(cel_schema());
    let ok = object(json!({"replicas": 3, "minReplicas": 1, "ratio": 0.5, "tags": ["team-a"]}));
    assert_eq!(errors(&s, ok), Vec::<String>::new());
    let bad = object(
        json!({"replicas": 3, "minReplicas": 5, "paused": true, "ratio": 1, "tags": ["other"]}),
    );
    let errs = s.validate(&bad, None);
    assert_eq!(
        errs.iter().map(render).collect::<Vec<_>>(),
        vec![
            "spec.ratio: Invalid value: \"number\": failed rule: self < 1.0",
            "spec: Invalid value: \"object\": replicas should be greater than or equal to minReplicas",
            "spec.replicas: Forbidden: paused, but replicas is 3",
            "spec: Invalid value: \"object\": failed rule: self.tags.all(t, t.startsWith('team-'))",
        ]
    );
    assert_eq!(errs[2].kind, CauseType::Forbidden);
}

#[test]
fn cel_transition_rules_run_only_on_update() {
    let s = compile(cel_schema());
    let old = object(
        json!({"replicas": 3, "minReplicas": 1, "tags": [], "immutable": "a", "token": "12345678"}),
    );
    // On create oldSelf does not exist: the transition rules do not run, the optional one does.
    let created = object(
        json!({"replicas": 1, "minReplicas": 1, "tags": [], "immutable": "b", "token": "short"}),
    );
    assert_eq!(
        errors(&s, created.clone()),
        vec!["spec.token: Invalid value: \"string\": a new token has 8 characters"]
    );
    let updated = object(
        json!({"replicas": 2, "minReplicas": 1, "tags": [], "immutable": "b", "token": "short"}),
    );
    assert_eq!(
        s.validate(&updated, Some(&old))
            .iter()
            .map(render)
            .collect::<Vec<_>>(),
        vec![
            "spec.immutable: Invalid value: \"string\": is immutable",
            "spec.replicas: Invalid value: \"integer\": replicas may not decrease",
        ]
    );
    let grown = object(
        json!({"replicas": 4, "minReplicas": 1, "tags": [], "immutable": "a", "token": "short"}),
    );
    assert_eq!(s.validate(&grown, Some(&old)), vec![]);
}

#[test]
fn cel_rules_that_do_not_compile_are_schema_errors() {
    let errs = schema_errors(json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "x-kubernetes-validations": [
                {"rule": "self.a >"},
                {"rule": "self.a == other"},
                {"rule": "self.a == 1", "reason": "Bogus", "fieldPath": ".nope"},
                {"rule": "self.a == 1", "optionalOldSelf": true}
            ], "properties": {"a": {"type": "integer"}}},
            "list": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}
        }
    }));
    let p = format!("{AT}.properties[spec].x-kubernetes-validations");
    assert!(errs[0].starts_with(&format!("{AT}.properties[list].items.x-kubernetes-validations[0].rule: Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the schema")), "{errs:#?}");
    assert!(
        errs[1].starts_with(&format!(
            "{p}[0].rule: Invalid value: \"self.a >\": compilation failed: "
        )),
        "{errs:#?}"
    );
    assert_eq!(
        errs[2..],
        [
            format!("{p}[1].rule: Invalid value: \"self.a == other\": compilation failed: undeclared reference to 'other'"),
            format!("{p}[2].reason: Unsupported value: \"Bogus\": supported values: \"FieldValueRequired\", \"FieldValueDuplicate\", \"FieldValueInvalid\", \"FieldValueForbidden\""),
            format!("{p}[2].fieldPath: Invalid value: \".nope\": fieldPath must be a valid path"),
            format!("{p}[3].optionalOldSelf: Invalid value: true: may not be set if the rule does not reference oldSelf"),
        ]
    );
}

#[test]
fn cel_cost_is_bounded() {
    let s = compile(json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"xs": {
            "type": "array", "items": {"type": "integer"},
            "x-kubernetes-validations": [{"rule": "self.all(a, self.all(b, self.all(c, a + b + c >= 0)))"}]
        }}}}
    }));
    assert_eq!(
        errors(&s, object(json!({"xs": [1, 2, 3]}))),
        Vec::<String>::new()
    );
    let many: Vec<i64> = (0..200).collect();
    assert_eq!(
        errors(&s, object(json!({"xs": many}))),
        vec!["spec.xs: Invalid value: \"array\": call cost exceeds limit for rule: self.all(a, self.all(b, self.all(c, a + b + c >= 0)))"]
    );
}

#[test]
fn openapi_keeps_descriptions_and_v2_drops_what_it_cannot_say() {
    let s = compile(json!({
        "type": "object",
        "description": "A widget.",
        "properties": {
            "spec": {"type": "object", "description": "Desired state.", "properties": {
                "n": {"type": "string", "nullable": true, "description": "Optional."},
                "size": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}
            }}
        }
    }));
    let v3 = s.openapi();
    assert_eq!(
        v3["properties"]["spec"]["description"],
        json!("Desired state.")
    );
    assert_eq!(
        v3["properties"]["spec"]["properties"]["n"]["nullable"],
        json!(true)
    );
    let v2 = s.openapi_v2();
    assert_eq!(
        v2["properties"]["spec"]["properties"]["n"],
        json!({"description": "Optional."})
    );
    assert_eq!(
        v2["properties"]["spec"]["properties"]["size"],
        json!({"x-kubernetes-int-or-string": true})
    );
    assert_eq!(v2["description"], json!("A widget."));
}

#[test]
fn structural_is_shared_between_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<Structural>();
}

#[test]
fn formats_accept_and_reject_as_kubernetes() {
    use super::format::Format;
    let cases: &[(&str, &str, bool)] = &[
        ("date-time", "2026-12-02T17:00:00.123+01:00", true),
        ("date-time", "2026-12-02", false),
        ("date", "2026-12-02", true),
        ("date", "2026-13-02", false),
        ("byte", "aGVsbG8=", true),
        ("byte", "not base64!", false),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
        ("uuid4", "123e4567-e89b-12d3-a456-426614174000", false),
        ("ipv4", "10.0.0.1", true),
        ("ipv4", "10.0.0.256", false),
        ("ipv6", "fd00::1", true),
        ("cidr", "10.0.0.0/8", true),
        ("cidr", "10.0.0.0", false),
        ("mac", "00:1a:2b:3c:4d:5e", true),
        ("hostname", "example.com", true),
        ("hostname", "-bad.com", false),
        ("email", "a@example.com", true),
        ("email", "a.example.com", false),
        ("uri", "https://example.com/x", true),
        ("uri", "not a uri", false),
        ("duration", "1h30m", true),
        ("duration", "soon", false),
        ("isbn10", "0-306-40615-2", true),
        ("isbn13", "978-0-306-40615-7", true),
        ("creditcard", "4111 1111 1111 1111", true),
        ("creditcard", "4111 1111 1111 1112", false),
        ("hexcolor", "#ff00aa", true),
        ("rgbcolor", "rgb(255, 0, 10)", true),
        ("rgbcolor", "rgb(256, 0, 10)", false),
        ("bsonobjectid", "507f1f77bcf86cd799439011", true),
        ("ssn", "123-45-6789", true),
    ];
    for (name, value, want) in cases {
        let f = Format::parse(name).unwrap_or_else(|| panic!("format {name}"));
        assert_eq!(f.accepts(value), *want, "{name} {value}");
    }
    assert_eq!(
        Format::parse("int32"),
        None,
        "numeric formats constrain nothing"
    );
}
