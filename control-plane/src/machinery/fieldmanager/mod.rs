//! Field management as Kubernetes does it: `metadata.managedFields` records, per manager and
//! operation, the fields each one set (FieldsV1). Every write updates it; server-side apply
//! uses it to find conflicts (another manager owns a field the apply changes: 409 naming the
//! fields and managers, unless forced), and to remove the fields a manager stops applying
//! when nobody else owns them.
//!
//! The rooms: `path.rs` (path elements and their order), `set.rs` (sets of paths, FieldsV1),
//! `schema.rs` (a kind's shape from its OpenAPI schema and merge strategies), `typed.rs`
//! (field sets, comparison, merge and removal along that shape). This file is the manager
//! logic of structured-merge-diff's `Updater` and the API server's field manager (stripped
//! metadata, `before-first-apply`, at most 10 update managers), written from their documented
//! behaviour.

mod path;
pub mod schema;
mod set;
mod typed;

use serde_json::{json, Map, Value};

use super::status::{ApiError, CauseType, FieldError, Reason};
pub use path::{Path, PathElement};
pub use schema::{type_of, SchemaBuilder, Type};
pub use set::Set;

/// The operation a managedFields entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Kubernetes' limit on a field manager's name.
pub const MAX_MANAGER_LENGTH: usize = 128;

/// Update managers kept before the oldest are merged into one.
const MAX_UPDATE_MANAGERS: usize = 10;

/// The manager the oldest updates are merged into past the cap.
const ANCIENT_CHANGES: &str = "ancient-changes";

/// The manager that owns what an object held before its first apply.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Who writes: the manager's name, the operation and the subresource written through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub operation: Operation,
    /// Empty for the main resource.
    pub subresource: &'a str,
    /// The group-version written (`apps/v1`).
    pub api_version: &'a str,
    /// The time to record, RFC 3339 to the second.
    pub now: &'a str,
    /// A top-level field whose changes nobody owns through this write (Kubernetes' reset
    /// fields: `status` on the main resource of a kind with a status subresource).
    pub ignored: Option<&'a str>,
}

/// The manager name when the client sent no `fieldManager`: the User-Agent up to its first
/// `/`, printable characters only, at most 128 of them (Kubernetes' prefixFromUserAgent).
pub fn manager_from_user_agent(user_agent: &str) -> String {
    user_agent
        .split('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_MANAGER_LENGTH)
        .collect()
}

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    manager: String,
    operation: Operation,
    api_version: String,
    subresource: String,
    time: Option<String>,
    set: Set,
}

impl Entry {
    /// Whether two entries are the same manager (Kubernetes' manager identifier: the time
    /// never counts, the API version only for updates).
    fn same(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    fn for_writer(w: &Writer<'_>, set: Set) -> Entry {
        Entry {
            manager: w.manager.to_string(),
            operation: w.operation,
            api_version: w.api_version.to_string(),
            subresource: w.subresource.to_string(),
            time: Some(w.now.to_string()),
            set,
        }
    }

    /// `"kubectl" using apps/v1`, as Kubernetes names a manager in a conflict.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation.as_str()));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    fn from_value(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let operation = match v.get("operation").and_then(Value::as_str) {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            other => return Err(format!("operation must be Apply or Update, not {other:?}")),
        };
        match v.get("fieldsType").and_then(Value::as_str) {
            Some("FieldsV1") | None => {}
            Some(other) => return Err(format!("unsupported fieldsType {other:?}")),
        }
        let set = match v.get("fieldsV1") {
            Some(f) => Set::from_fields_v1(f)?,
            None => Set::new(),
        };
        Ok(Entry {
            manager: s("manager"),
            operation,
            api_version: s("apiVersion"),
            subresource: s("subresource"),
            time: v.get("time").and_then(Value::as_str).map(str::to_string),
            set,
        })
    }
}

/// The managers of one object.
#[derive(Clone, Debug, Default, PartialEq)]
struct Managers(Vec<Entry>);

impl Managers {
    fn decode(list: &Value) -> Result<Managers, String> {
        let Value::Array(items) = list else {
            return Err("managedFields must be a list".into());
        };
        let mut out: Vec<Entry> = Vec::with_capacity(items.len());
        for item in items {
            let e = Entry::from_value(item)?;
            if out.iter().any(|o| o.same(&e)) {
                return Err(format!("duplicate manager entry {}", e.describe()));
            }
            out.push(e);
        }
        Ok(Managers(out))
    }

    fn of(obj: &Value) -> Managers {
        obj.pointer("/metadata/managedFields")
            .and_then(|l| Managers::decode(l).ok())
            .unwrap_or_default()
    }

    fn position(&self, e: &Entry) -> Option<usize> {
        self.0.iter().position(|o| o.same(e))
    }

    fn union(&self) -> Set {
        self.0.iter().fold(Set::new(), |acc, e| acc.union(&e.set))
    }

    /// Kubernetes' order: Apply before Update, then by time, manager, version, subresource.
    fn encode(mut self) -> Option<Value> {
        self.0.retain(|e| !e.set.is_empty());
        if self.0.is_empty() {
            return None;
        }
        self.0.sort_by(|a, b| {
            (
                a.operation,
                &a.time,
                &a.manager,
                &a.api_version,
                &a.subresource,
            )
                .cmp(&(
                    b.operation,
                    &b.time,
                    &b.manager,
                    &b.api_version,
                    &b.subresource,
                ))
        });
        Some(Value::Array(self.0.iter().map(Entry::to_value).collect()))
    }

    /// Merges the oldest update managers into `ancient-changes` past the cap.
    fn cap_updates(&mut self) {
        let updates = |m: &Managers| {
            m.0.iter()
                .filter(|e| e.operation == Operation::Update && e.manager != ANCIENT_CHANGES)
                .count()
        };
        while updates(self) > MAX_UPDATE_MANAGERS {
            let Some(oldest) = self
                .0
                .iter()
                .enumerate()
                .filter(|(_, e)| e.operation == Operation::Update && e.manager != ANCIENT_CHANGES)
                .min_by(|(_, a), (_, b)| (&a.time, &a.manager).cmp(&(&b.time, &b.manager)))
                .map(|(i, _)| i)
            else {
                return;
            };
            let e = self.0.remove(oldest);
            let bucket = Entry {
                manager: ANCIENT_CHANGES.into(),
                operation: Operation::Update,
                api_version: e.api_version.clone(),
                subresource: String::new(),
                time: e.time.clone(),
                set: Set::new(),
            };
            match self.position(&bucket) {
                Some(i) => self.0[i].set = self.0[i].set.union(&e.set),
                None => self.0.push(Entry {
                    set: e.set,
                    ..bucket
                }),
            }
        }
    }
}

/// The metadata fields no manager owns (Kubernetes' stripMeta).
fn strip_meta(set: &Set) -> Set {
    let mut strip = Set::new();
    for p in [&["apiVersion"][..], &["kind"], &["metadata"]] {
        strip.insert(&p.iter().map(|f| PathElement::field(f)).collect::<Vec<_>>());
    }
    for f in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        strip.insert(&[PathElement::field("metadata"), PathElement::field(f)]);
    }
    set.difference(&strip)
}

/// Removes an ignored top-level field (and everything below it) from a set.
fn without_ignored(set: &Set, ignored: Option<&str>) -> Set {
    match ignored {
        None => set.clone(),
        Some(f) => {
            let pe = PathElement::field(f);
            Set::from_entries(
                set.entries()
                    .filter(|(p, _, _)| **p != pe)
                    .map(|(p, m, c)| (p.clone(), m, c.clone())),
            )
        }
    }
}

/// The object without its managedFields (what managers own is compared on this).
fn bare(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    o
}

/// What an object of this shape holds before anything is written: the struct fields that
/// are never absent in Kubernetes' Go types (metadata, spec, status, a workload's template
/// and strategy), so that a create does not list them as added by its manager.
fn zero(t: &Type) -> Value {
    const ALWAYS: &[&[&str]] = &[
        &["metadata"],
        &["spec"],
        &["status"],
        &["spec", "template"],
        &["spec", "template", "metadata"],
        &["spec", "template", "spec"],
        &["spec", "strategy"],
        &["spec", "updateStrategy"],
    ];
    let mut out = json!({});
    'paths: for path in ALWAYS {
        let mut ty = t;
        for f in *path {
            if !ty.declares(f) {
                continue 'paths;
            }
            ty = ty.child(f).unwrap_or(ty);
        }
        if !matches!(ty, Type::Map { atomic: false, .. }) {
            continue;
        }
        let mut at = &mut out;
        for f in *path {
            at = at
                .as_object_mut()
                .expect("zero objects are objects")
                .entry(f.to_string())
                .or_insert_with(|| json!({}));
        }
    }
    out
}

/// Drops the empty maps and lists of optional fields and null fields, as Kubernetes' typed
/// decoding does (`annotations: {}` is not stored).
pub fn drop_empty(t: &Type, obj: &mut Value) {
    typed::drop_empty(obj, t);
}

fn set_managed_fields(obj: &mut Value, managers: Managers) {
    let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match managers.encode() {
        Some(v) => m.insert("managedFields".into(), v),
        None => m.remove("managedFields"),
    };
}

/// Records a create, update or non-apply patch in `new`'s managedFields: the fields it
/// changed become the writer's, and no longer anyone else's. `live` is None on create.
///
/// As in Kubernetes, a client may replace the list (an explicit `[]` clears it) and one that
/// leaves it out keeps the live list; a failure to compute the sets drops the list rather
/// than failing the write (validation then reports what is wrong with the object).
pub fn record_update(t: &Type, live: Option<&Value>, new: &mut Value, w: &Writer<'_>) {
    let managers = match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if a.is_empty() => Managers::default(),
        None | Some(Value::Null) => live.map(Managers::of).unwrap_or_default(),
        Some(given) => match Managers::decode(given) {
            Ok(m) if !m.0.is_empty() => m,
            _ => live.map(Managers::of).unwrap_or_default(),
        },
    };
    let old = live.map(bare).unwrap_or_else(|| zero(t));
    match updated_managers(t, &old, &bare(new), managers, w) {
        Ok(m) => set_managed_fields(new, m),
        Err(_) => {
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
        }
    }
}

fn updated_managers(
    t: &Type,
    old: &Value,
    new: &Value,
    mut managers: Managers,
    w: &Writer<'_>,
) -> Result<Managers, String> {
    let c = typed::compare(old, new, t)?;
    let changed = without_ignored(&c.changed(), w.ignored);
    let removed = without_ignored(&c.removed, w.ignored);
    // Every other manager loses what this write changed or removed (an update always wins).
    for e in &mut managers.0 {
        e.set = e.set.difference(&changed).difference(&removed);
    }
    let mine = Entry::for_writer(w, strip_meta(&changed));
    match managers.position(&mine) {
        Some(_) if mine.set.is_empty() => {}
        Some(i) => {
            let prev = std::mem::take(&mut managers.0[i].set);
            managers.0[i] = Entry {
                set: prev.union(&mine.set),
                ..mine
            };
        }
        None => managers.0.push(mine),
    }
    managers.0.retain(|e| !e.set.is_empty());
    managers.cap_updates();
    Ok(managers)
}

/// One field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The manager as Kubernetes prints it: `"kubectl" using apps/v1`.
    pub manager: String,
    pub path: Path,
}

/// Why an apply failed.
#[derive(Debug, PartialEq)]
pub enum ApplyError {
    /// Other managers own fields the apply changes (409 Conflict).
    Conflicts(Vec<Conflict>),
    /// The configuration does not fit the kind's shape (a list item without its key...).
    Invalid(String),
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> ApiError {
        match e {
            ApplyError::Invalid(m) => ApiError::bad_request(m),
            ApplyError::Conflicts(conflicts) => {
                let message = conflict_message(&conflicts);
                let mut e = ApiError::new(409, Reason::Conflict, message);
                e.causes = conflicts
                    .into_iter()
                    .map(|c| {
                        FieldError::new(
                            CauseType::FieldManagerConflict,
                            c.path.to_string(),
                            format!("conflict with {}", c.manager),
                        )
                    })
                    .collect();
                e
            }
        }
    }
}

/// Kubernetes' conflict message: one conflict on one line, several grouped by manager.
fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager, c.path
        );
    }
    let mut lines = Vec::new();
    let mut managers: Vec<&String> = conflicts.iter().map(|c| &c.manager).collect();
    managers.sort();
    managers.dedup();
    for m in managers {
        lines.push(format!("conflicts with {m}:"));
        for c in conflicts.iter().filter(|c| &c.manager == m) {
            lines.push(format!("- {}", c.path));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Server-side apply of `config` by `w` (an Apply operation) onto `live` (None: the object
/// does not exist yet). Returns the merged object with its managedFields. Fields the manager
/// applied last time and not this time are removed unless another manager owns them; fields
/// other managers own that the apply would change are conflicts, unless `force`, which takes
/// them over.
pub fn apply(
    t: &Type,
    live: Option<&Value>,
    config: &Value,
    w: &Writer<'_>,
    force: bool,
) -> Result<Value, ApplyError> {
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApplyError::Invalid(format!(
            "metadata.managedFields must be nil but was {}",
            config["metadata"]["managedFields"]
        )));
    }
    let old = live.map(bare).unwrap_or_else(|| json!({}));
    let mut managers = live.map(Managers::of).unwrap_or_default();
    if live.is_some() && managers.0.is_empty() {
        // An object written before field management: what it holds is owned by a
        // placeholder manager, so the first apply conflicts where it changes something.
        let set = typed::field_set(&old, t).map_err(ApplyError::Invalid)?;
        managers.0.push(Entry {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: Operation::Update,
            api_version: w.api_version.into(),
            subresource: w.subresource.into(),
            time: None,
            set: strip_meta(&set),
        });
    }
    let mut merged = typed::merge(&old, config, t).map_err(ApplyError::Invalid)?;
    let applied = without_ignored(
        &typed::field_set(config, t).map_err(ApplyError::Invalid)?,
        w.ignored,
    );
    let mine = Entry::for_writer(w, applied.clone());
    let (last, last_time) = match managers.position(&mine) {
        Some(i) => {
            let prev = std::mem::replace(&mut managers.0[i], mine.clone());
            (prev.set, prev.time)
        }
        None => {
            managers.0.push(mine.clone());
            (Set::new(), None)
        }
    };
    if !last.is_empty() {
        // Prune: what this manager applied before and no longer does, unless anyone (itself
        // included, through what it applies now) still owns it.
        let owned = typed::with_named_fields(&managers.union(), t);
        let drop = typed::with_named_fields(&last, t).difference(&owned);
        typed::remove(&mut merged, &drop, t).map_err(ApplyError::Invalid)?;
    }
    let c = typed::compare(&old, &merged, t).map_err(ApplyError::Invalid)?;
    let changed = without_ignored(&c.changed(), w.ignored);
    let removed = without_ignored(&c.removed, w.ignored);
    let mut conflicts = Vec::new();
    for e in managers.0.iter().filter(|e| !e.same(&mine)) {
        for path in e.set.intersection(&changed).paths() {
            conflicts.push(Conflict {
                manager: e.describe(),
                path,
            });
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort_by(|a, b| (&a.manager, &a.path).cmp(&(&b.manager, &b.path)));
        return Err(ApplyError::Conflicts(conflicts));
    }
    for e in managers.0.iter_mut().filter(|e| !e.same(&mine)) {
        e.set = e.set.difference(&changed).difference(&removed);
    }
    let unchanged = c.added.is_empty() && c.modified.is_empty() && c.removed.is_empty();
    if let Some(i) = managers.position(&mine) {
        managers.0[i].set = strip_meta(&applied);
        if unchanged && last_time.is_some() {
            // Nothing changed: the entry keeps the time of the last change it made.
            managers.0[i].time = last_time;
        }
    }
    managers.0.retain(|e| !e.set.is_empty());
    managers.cap_updates();
    if let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    set_managed_fields(&mut merged, managers);
    Ok(merged)
}

#[cfg(test)]
mod tests;
