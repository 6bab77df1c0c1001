//! Policy rules: whether a rule allows a request (Kubernetes' `RuleAllows`), whether one set
//! of rules covers another (escalation prevention's `Covers`, on rules broken down to one
//! verb, group, resource and name each), and the compact text Kubernetes prints for the rules
//! an escalation is missing. Pure.

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::attributes::{Attributes, Target};

/// `*`: every verb, group, resource or URL.
pub const ALL: &str = "*";

/// One rule of a Role or ClusterRole, with absent lists as empty ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

impl From<&PolicyRule> for Rule {
    fn from(r: &PolicyRule) -> Rule {
        let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
        Rule {
            verbs: r.verbs.clone(),
            api_groups: list(&r.api_groups),
            resources: list(&r.resources),
            resource_names: list(&r.resource_names),
            non_resource_urls: list(&r.non_resource_urls),
        }
    }
}

impl From<&Rule> for PolicyRule {
    fn from(r: &Rule) -> PolicyRule {
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        PolicyRule {
            verbs: r.verbs.clone(),
            api_groups: list(&r.api_groups),
            resources: list(&r.resources),
            resource_names: list(&r.resource_names),
            non_resource_urls: list(&r.non_resource_urls),
        }
    }
}

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

fn has_all(set: &[String], items: &[String]) -> bool {
    items.iter().all(|i| has(set, i))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A non-resource URL pattern: exact, `*`, or a prefix ending in `*`.
fn url_matches(pattern: &str, path: &str) -> bool {
    pattern == ALL
        || pattern == path
        || pattern
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

impl Rule {
    /// A resource rule.
    pub fn resource(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Rule {
        Rule {
            verbs: strings(verbs),
            api_groups: strings(groups),
            resources: strings(resources),
            ..Rule::default()
        }
    }

    /// A non-resource rule.
    pub fn urls(verbs: &[&str], urls: &[&str]) -> Rule {
        Rule {
            verbs: strings(verbs),
            non_resource_urls: strings(urls),
            ..Rule::default()
        }
    }

    /// The same rule limited to these object names.
    pub fn named(mut self, names: &[&str]) -> Rule {
        self.resource_names = strings(names);
        self
    }

    fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == ALL || v == verb)
    }

    /// Whether the rule allows the request (Kubernetes' `RuleAllows`).
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verb_matches(&a.verb) {
            return false;
        }
        match &a.target {
            Target::NonResource { path } => {
                self.non_resource_urls.iter().any(|u| url_matches(u, path))
            }
            Target::Resource(r) => {
                let group = self.api_groups.iter().any(|g| g == ALL || *g == r.group);
                let resource = self.resources.iter().any(|res| {
                    res == ALL
                        || (r.subresource.is_empty() && *res == r.resource)
                        || (!r.subresource.is_empty()
                            && (res.split_once('/')
                                == Some((r.resource.as_str(), r.subresource.as_str()))
                                || res.strip_prefix("*/") == Some(r.subresource.as_str())))
                });
                let name = self.resource_names.is_empty() || has(&self.resource_names, &r.name);
                group && resource && name
            }
        }
    }

    /// This rule broken down into atomic rules: one verb, group, resource and (when the rule
    /// names any) name each, or one verb and URL each (Kubernetes' `BreakdownRule`).
    pub fn breakdown(&self) -> Vec<Rule> {
        let mut out = vec![];
        for group in &self.api_groups {
            for resource in &self.resources {
                for verb in &self.verbs {
                    let base = Rule {
                        verbs: vec![verb.clone()],
                        api_groups: vec![group.clone()],
                        resources: vec![resource.clone()],
                        ..Rule::default()
                    };
                    if self.resource_names.is_empty() {
                        out.push(base);
                    } else {
                        for name in &self.resource_names {
                            out.push(Rule {
                                resource_names: vec![name.clone()],
                                ..base.clone()
                            });
                        }
                    }
                }
            }
        }
        for url in &self.non_resource_urls {
            for verb in &self.verbs {
                out.push(Rule {
                    verbs: vec![verb.clone()],
                    non_resource_urls: vec![url.clone()],
                    ..Rule::default()
                });
            }
        }
        out
    }

    /// Whether this rule grants everything `sub` does (Kubernetes' `ruleCovers`).
    fn covers(&self, sub: &Rule) -> bool {
        let verbs = has(&self.verbs, ALL) || has_all(&self.verbs, &sub.verbs);
        let groups = has(&self.api_groups, ALL) || has_all(&self.api_groups, &sub.api_groups);
        let resources = has(&self.resources, ALL)
            || sub.resources.iter().all(|r| {
                has(&self.resources, r)
                    || r.split_once('/')
                        .is_some_and(|(_, sub)| has(&self.resources, &format!("*/{sub}")))
            });
        let urls = sub
            .non_resource_urls
            .iter()
            .all(|u| self.non_resource_urls.iter().any(|o| url_matches(o, u)));
        let names = if sub.resource_names.is_empty() {
            self.resource_names.is_empty()
        } else {
            self.resource_names.is_empty() || has_all(&self.resource_names, &sub.resource_names)
        };
        verbs && groups && resources && urls && names
    }

    /// Kubernetes' `CompactString`: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`.
    pub fn compact_string(&self) -> String {
        let q = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
            format!("[{}]", items.join(" "))
        };
        let mut parts = vec![];
        for (label, list) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("NonResourceURLs", &self.non_resource_urls),
            ("ResourceNames", &self.resource_names),
            ("Verbs", &self.verbs),
        ] {
            if !list.is_empty() {
                parts.push(format!("{label}:{}", q(list)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }
}

/// Whether `owner` grants everything in `requested`; if not, the atomic rules it lacks.
pub fn covers(owner: &[Rule], requested: &[Rule]) -> Result<(), Vec<Rule>> {
    let missing: Vec<Rule> = requested
        .iter()
        .flat_map(Rule::breakdown)
        .filter(|atom| !owner.iter().any(|o| o.covers(atom)))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

/// Atomic rules merged back where they differ only in the verb (Kubernetes' `CompactRules`):
/// one line per group and resource in an escalation message.
pub fn compact(rules: Vec<Rule>) -> Vec<Rule> {
    let mut out: Vec<Rule> = vec![];
    for r in rules {
        let simple = r.resource_names.is_empty()
            && r.non_resource_urls.is_empty()
            && r.api_groups.len() == 1
            && r.resources.len() == 1;
        let same = out.iter_mut().find(|o| {
            simple
                && o.resource_names.is_empty()
                && o.non_resource_urls.is_empty()
                && o.api_groups == r.api_groups
                && o.resources == r.resources
        });
        match same {
            Some(o) => {
                for v in r.verbs {
                    if !has(&o.verbs, &v) {
                        o.verbs.push(v);
                    }
                }
            }
            None => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::authz::attributes::ResourceAttributes;
    use proptest::prelude::*;

    fn req(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            target: Target::Resource(ResourceAttributes {
                group: group.into(),
                version: "v1".into(),
                namespace: "default".into(),
                resource: resource.into(),
                subresource: sub.into(),
                name: name.into(),
                field_selector: None,
            }),
        }
    }

    fn url(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            target: Target::NonResource { path: path.into() },
        }
    }

    #[test]
    fn resource_rules_match_as_kubernetes_matches_them() {
        let pods = Rule::resource(&["get", "list"], &[""], &["pods"]);
        assert!(pods.allows(&req("get", "", "pods", "", "web")));
        assert!(pods.allows(&req("list", "", "pods", "", "")));
        assert!(!pods.allows(&req("delete", "", "pods", "", "web")));
        assert!(!pods.allows(&req("get", "apps", "pods", "", "web")));
        assert!(
            !pods.allows(&req("get", "", "pods", "log", "web")),
            "a resource does not grant its subresources"
        );
        let log = Rule::resource(&["get"], &[""], &["pods/log"]);
        assert!(log.allows(&req("get", "", "pods", "log", "web")));
        assert!(!log.allows(&req("get", "", "pods", "", "web")));
        let any_status = Rule::resource(&["update"], &["*"], &["*/status"]);
        assert!(any_status.allows(&req("update", "apps", "deployments", "status", "d")));
        assert!(!any_status.allows(&req("update", "apps", "deployments", "", "d")));
        let all = Rule::resource(&["*"], &["*"], &["*"]);
        assert!(all.allows(&req("escalate", "x.io", "things", "sub", "n")));
        assert!(
            !all.allows(&url("get", "/healthz")),
            "resource rules never match URLs"
        );
        let named = Rule::resource(&["get", "update"], &["coordination.k8s.io"], &["leases"])
            .named(&["kube-scheduler"]);
        assert!(named.allows(&req(
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-scheduler"
        )));
        assert!(!named.allows(&req("get", "coordination.k8s.io", "leases", "", "other")));
        assert!(
            !named.allows(&req("list", "coordination.k8s.io", "leases", "", "")),
            "a list has no name, so a named rule cannot allow it"
        );
    }

    #[test]
    fn url_rules_match_exactly_or_by_trailing_star() {
        let d = Rule::urls(&["get"], &["/api", "/api/*", "/version"]);
        assert!(d.allows(&url("get", "/api")));
        assert!(d.allows(&url("get", "/api/v1")));
        assert!(!d.allows(&url("get", "/apis")));
        assert!(!d.allows(&url("get", "/version/")));
        assert!(!d.allows(&url("post", "/api")));
        assert!(!d.allows(&req("get", "", "pods", "", "")));
        assert!(Rule::urls(&["*"], &["*"]).allows(&url("delete", "/anything")));
    }

    #[test]
    fn covers_breaks_rules_down_and_reports_what_is_missing() {
        let owner = vec![
            Rule::resource(&["get", "list", "watch"], &[""], &["pods", "pods/log"]),
            Rule::resource(&["*"], &["apps"], &["*/scale"]),
            Rule::urls(&["get"], &["/healthz/*"]),
        ];
        assert!(covers(&owner, &[Rule::resource(&["get"], &[""], &["pods"])]).is_ok());
        assert!(covers(
            &owner,
            &[Rule::resource(
                &["update"],
                &["apps"],
                &["deployments/scale"]
            )]
        )
        .is_ok());
        assert!(covers(&owner, &[Rule::urls(&["get"], &["/healthz/etcd"])]).is_ok());
        assert!(
            covers(
                &owner,
                &[Rule::resource(&["get"], &[""], &["pods"]).named(&["a"])]
            )
            .is_ok(),
            "an unnamed rule covers named ones"
        );
        let missing = covers(
            &owner,
            &[Rule::resource(
                &["get", "delete", "create"],
                &[""],
                &["pods", "secrets"],
            )],
        )
        .unwrap_err();
        let text: Vec<String> = compact(missing).iter().map(Rule::compact_string).collect();
        assert_eq!(
            text,
            vec![
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete" "create"]}"#,
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete" "create"]}"#,
            ]
        );
        let named_owner = vec![Rule::resource(&["get"], &[""], &["pods"]).named(&["a"])];
        assert!(covers(&named_owner, &[Rule::resource(&["get"], &[""], &["pods"])]).is_err());
    }

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            Just(String::new()),
            "[a-c]{1,2}".prop_map(String::from),
        ]
    }

    fn resource() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            "[a-c]{1,2}".prop_map(String::from),
            "[a-c]{1,2}/[xy]".prop_map(String::from),
            "\\*/[xy]".prop_map(String::from),
        ]
    }

    fn rule() -> impl Strategy<Value = Rule> {
        (
            prop::collection::vec(
                prop_oneof![
                    Just("*".to_string()),
                    "get|list|create".prop_map(String::from)
                ],
                1..3,
            ),
            prop::collection::vec(token(), 1..3),
            prop::collection::vec(resource(), 1..3),
            prop::collection::vec("[a-c]".prop_map(String::from), 0..2),
        )
            .prop_map(|(verbs, api_groups, resources, resource_names)| Rule {
                verbs,
                api_groups,
                resources,
                resource_names,
                non_resource_urls: vec![],
            })
    }

    fn request() -> impl Strategy<Value = Attributes> {
        (
            "get|list|create",
            "|[a-c]{1,2}",
            "[a-c]{1,2}",
            "|x|y",
            "|[a-c]",
        )
            .prop_map(|(v, g, r, s, n)| req(&v, &g, &r, &s, &n))
    }

    proptest! {
        /// Covering is sound: whatever a covered rule allows, the owner's rules allow too.
        #[test]
        fn covered_rules_never_allow_more(owner in prop::collection::vec(rule(), 1..4), sub in rule(), a in request()) {
            if covers(&owner, std::slice::from_ref(&sub)).is_ok() && sub.allows(&a) {
                prop_assert!(owner.iter().any(|o| o.allows(&a)), "{owner:?} covers {sub:?} but not {a:?}");
            }
        }

        /// A rule covers itself, and its breakdown allows exactly what it allows.
        #[test]
        fn breakdown_is_equivalent(r in rule(), a in request()) {
            prop_assert!(covers(std::slice::from_ref(&r), std::slice::from_ref(&r)).is_ok());
            let atoms = r.breakdown();
            prop_assert_eq!(r.allows(&a), atoms.iter().any(|x| x.allows(&a)));
        }
    }
}
