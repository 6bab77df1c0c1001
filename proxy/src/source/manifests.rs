//! The manifests-directory source: Kubernetes objects in YAML or JSON files (several
//! documents per file, or a `kind: List`, the shapes kubectl reads and prints), watched with
//! inotify. A changed file is re-read alone and diffed against what it held before, so a
//! change costs the size of that file, not of the directory. A file that does not parse
//! keeps its previous objects: bad input never takes down what is programmed.

use super::{InputError, Kind, Resource, ResourceRef, Source, SourceError, SourceEvent};
use crate::model::ObjectKey;
use notify::{RecursiveMode, Watcher};
use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

pub struct ManifestDir {
    dir: PathBuf,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ManifestDir { dir: dir.into() }
    }
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    !hidden
        && matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
}

impl Source for ManifestDir {
    async fn run(self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |res| {
            let _ = ntx.send(res);
        })
        .map_err(|source| SourceError::Watch {
            path: self.dir.display().to_string(),
            source,
        })?;
        // Watch first, then list: a change during the listing is not lost.
        watcher
            .watch(&self.dir, RecursiveMode::NonRecursive)
            .map_err(|source| SourceError::Watch {
                path: self.dir.display().to_string(),
                source,
            })?;
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map_err(|source| SourceError::Io {
                path: self.dir.display().to_string(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_manifest(p))
            .collect();
        paths.sort();
        let mut state = DirState::default();
        for path in paths {
            for ev in state.reload(&path) {
                if events.send(ev).await.is_err() {
                    return Ok(());
                }
            }
        }
        if events.send(SourceEvent::Synced).await.is_err() {
            return Ok(());
        }
        while let Some(res) = nrx.recv().await {
            let ev: notify::Event = match res {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "manifest watch error");
                    continue;
                }
            };
            if ev.kind.is_access() {
                continue;
            }
            for path in ev.paths.iter().filter(|p| is_manifest(p)) {
                for out in state.reload(path) {
                    if events.send(out).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

/// One document, identified, with a fingerprint of its content.
struct Doc {
    r: ResourceRef,
    fingerprint: u64,
    /// `None`: the document names an object but does not decode; its previous version
    /// stays in force.
    resource: Option<Resource>,
}

/// What each file holds, and which file owns each object.
#[derive(Default)]
struct DirState {
    files: HashMap<PathBuf, BTreeMap<ResourceRef, u64>>,
    owner: HashMap<ResourceRef, PathBuf>,
}

impl DirState {
    /// Re-reads one file and returns the events that bring the consumer up to date.
    fn reload(&mut self, path: &Path) -> Vec<SourceEvent> {
        let origin = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return vec![SourceEvent::Rejected {
                    origin,
                    error: InputError::Malformed(e.to_string()),
                }]
            }
        };
        let mut out = Vec::new();
        let docs = match text.as_deref().map(|t| parse(path, t)) {
            None => Vec::new(),
            Some(Err(error)) => {
                // Keep what the file held before.
                out.push(SourceEvent::Rejected { origin, error });
                return out;
            }
            Some(Ok(docs)) => docs,
        };
        let old = self.files.remove(path).unwrap_or_default();
        let mut new: BTreeMap<ResourceRef, u64> = BTreeMap::new();
        for doc in docs {
            let doc = match doc {
                Ok(doc) => doc,
                Err(error) => {
                    out.push(SourceEvent::Rejected {
                        origin: origin.clone(),
                        error,
                    });
                    continue;
                }
            };
            let owned_elsewhere = self.owner.get(&doc.r).filter(|p| p.as_path() != path);
            if let Some(other) = owned_elsewhere {
                out.push(SourceEvent::Rejected {
                    origin: origin.clone(),
                    error: InputError::Duplicate {
                        object: doc.r.to_string(),
                        other: other.display().to_string(),
                    },
                });
                continue;
            }
            if new.contains_key(&doc.r) {
                out.push(SourceEvent::Rejected {
                    origin: origin.clone(),
                    error: InputError::Duplicate {
                        object: doc.r.to_string(),
                        other: origin.clone(),
                    },
                });
                continue;
            }
            match doc.resource {
                Some(resource) => {
                    if old.get(&doc.r) != Some(&doc.fingerprint) {
                        out.push(SourceEvent::Apply(resource));
                    }
                    new.insert(doc.r.clone(), doc.fingerprint);
                }
                None => {
                    if let Some(fp) = old.get(&doc.r) {
                        new.insert(doc.r.clone(), *fp);
                    }
                }
            }
            self.owner.insert(doc.r, path.to_path_buf());
        }
        for r in old.keys().filter(|r| !new.contains_key(r)) {
            self.owner.remove(r);
            out.push(SourceEvent::Delete(r.clone()));
        }
        if !new.is_empty() {
            self.files.insert(path.to_path_buf(), new);
        }
        out
    }
}

/// Splits a file into documents. A syntax error fails the whole file; a document of an
/// unknown kind or with a bad field fails alone.
fn parse(path: &Path, text: &str) -> Result<Vec<Result<Doc, InputError>>, InputError> {
    let values: Vec<Value> = if path.extension().and_then(|e| e.to_str()) == Some("json") {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| InputError::Malformed(e.to_string()))?
    } else {
        serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options(text.len()))
            .map_err(|e| InputError::Malformed(e.to_string()))?
    };
    let mut docs = Vec::new();
    for v in values {
        flatten(v, &mut docs);
    }
    Ok(docs.into_iter().map(decode).collect())
}

/// The YAML parser's budget for a file of `len` bytes. Its defaults cap a stream at 1,024
/// documents and 250,000 nodes: a guard against separator storms that also refuses an
/// honest export of a thousand Services with their slices. Every document and node takes
/// at least one byte of input unless an alias repeats it, so limits proportional to the
/// input refuse nothing honest, while the alias limits (absolute caps and the
/// aliases-per-anchor ratio) still refuse billion-laughs expansions.
fn yaml_options(len: usize) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: defaults.max_documents.max(len / 4 + 1),
            max_nodes: defaults.max_nodes.max(len),
            max_events: defaults.max_events.max(2 * len),
        },
    }
}

/// Expands `kind: List` (and `*List`) documents into their items; drops empty documents.
fn flatten(v: Value, out: &mut Vec<Value>) {
    if v.is_null() {
        return;
    }
    let is_list = v
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
        && v.get("items").is_some_and(Value::is_array);
    if is_list {
        if let Some(Value::Array(items)) = v.get("items").cloned() {
            for item in items {
                flatten(item, out);
            }
        }
    } else {
        out.push(v);
    }
}

fn decode(v: Value) -> Result<Doc, InputError> {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (api_version, kind_name) = (s("apiVersion"), s("kind"));
    let kind = match (api_version.as_str(), kind_name.as_str()) {
        ("v1", "Service") => Kind::Service,
        ("discovery.k8s.io/v1", "EndpointSlice") => Kind::EndpointSlice,
        _ => {
            return Err(InputError::UnknownKind {
                api_version,
                kind: kind_name,
            })
        }
    };
    let meta = v.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| InputError::Malformed(format!("{kind_name} without metadata.name")))?;
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let r = ResourceRef {
        kind,
        key: ObjectKey::new(namespace, name),
    };
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    let fingerprint = h.finish();
    let resource = match kind {
        Kind::Service => serde_json::from_value(v).map(|s| Resource::Service(Box::new(s))),
        Kind::EndpointSlice => {
            serde_json::from_value(v).map(|s| Resource::EndpointSlice(Box::new(s)))
        }
    };
    match resource {
        Ok(resource) => Ok(Doc {
            r,
            fingerprint,
            resource: Some(resource),
        }),
        Err(e) => {
            tracing::warn!(object = %r, error = %e, "manifest does not decode; keeping its previous version");
            Err(InputError::Malformed(format!("{r}: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.1]}]
"#;

    fn kinds(evs: &[SourceEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e {
                SourceEvent::Apply(Resource::Service(_)) => "apply-svc".into(),
                SourceEvent::Apply(Resource::EndpointSlice(_)) => "apply-slice".into(),
                SourceEvent::Delete(r) => format!("delete-{:?}", r.kind),
                SourceEvent::Synced => "synced".into(),
                SourceEvent::Rejected { error, .. } => format!("rejected-{}", error.reason()),
            })
            .collect()
    }

    #[test]
    fn a_file_is_diffed_against_what_it_held() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.yaml");
        let mut st = DirState::default();
        std::fs::write(&p, TWO).unwrap();
        assert_eq!(kinds(&st.reload(&p)), ["apply-svc", "apply-slice"]);
        // Unchanged content: nothing to do.
        assert!(st.reload(&p).is_empty());
        // Drop the slice: one delete.
        std::fs::write(&p, TWO.split("---").next().unwrap()).unwrap();
        assert_eq!(kinds(&st.reload(&p)), ["delete-EndpointSlice"]);
        // A syntax error keeps the service.
        std::fs::write(&p, "kind: [").unwrap();
        assert_eq!(kinds(&st.reload(&p)), ["rejected-malformed"]);
        // File removed: everything it held goes.
        std::fs::remove_file(&p).unwrap();
        assert_eq!(kinds(&st.reload(&p)), ["delete-Service"]);
    }

    /// An export of 1,000 Services with their slices (2,000 documents) is read whole.
    #[test]
    fn thousands_of_documents_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("many.yaml");
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str(&TWO.replace("web", &format!("web{i}")).replace(
                "clusterIP: 10.96.0.1",
                &format!("clusterIP: 10.96.{}.{}", i / 250, i % 250 + 1),
            ));
            text.push_str("---\n");
        }
        let mut st = DirState::default();
        let evs = st.reload(&p_write(&p, &text));
        assert_eq!(evs.len(), 2000, "{:?}", kinds(&evs[..evs.len().min(3)]));
        assert!(evs.iter().all(|e| matches!(e, SourceEvent::Apply(_))));
    }

    /// A billion-laughs file is still refused.
    #[test]
    fn alias_bombs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='k' {
            text.push_str(&format!(
                "{c}: &{c} [{}]\n",
                vec![format!("*{prev}"); 10].join(", ")
            ));
            prev = c;
        }
        let mut st = DirState::default();
        let evs = st.reload(&p_write(&dir.path().join("bomb.yaml"), &text));
        assert_eq!(kinds(&evs), ["rejected-malformed"]);
    }

    fn p_write(p: &Path, text: &str) -> PathBuf {
        std::fs::write(p, text).unwrap();
        p.to_path_buf()
    }

    #[test]
    fn unknown_kinds_and_duplicates_are_rejected_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = DirState::default();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, TWO).unwrap();
        st.reload(&a);
        let b = dir.path().join("b.json");
        std::fs::write(
            &b,
            r#"{"apiVersion":"v1","kind":"List","items":[
                {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}},
                {"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"clusterIP":"10.96.0.9"}},
                {"apiVersion":"v1","kind":"Service","metadata":{"name":"other"},"spec":{"clusterIP":"10.96.0.2"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            kinds(&st.reload(&b)),
            ["rejected-unknown_kind", "rejected-duplicate", "apply-svc"]
        );
    }
}
