//! `GroupKind`: which kind of object a piece of machinery works on (`apps`/`Deployment`;
//! the core group is the empty string).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKind {
    pub group: String,
    pub kind: String,
}

impl GroupKind {
    pub fn new(group: &str, kind: &str) -> Self {
        GroupKind {
            group: group.to_string(),
            kind: kind.to_string(),
        }
    }

    /// The group of an `apiVersion` (`apps/v1` -> `apps`, `v1` -> ``).
    pub fn group_of(api_version: &str) -> &str {
        api_version
            .rsplit_once('/')
            .map_or("", |(group, _version)| group)
    }
}

/// `Deployment.apps`, or `Pod` for the core group, as Kubernetes names kinds in messages.
impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}
