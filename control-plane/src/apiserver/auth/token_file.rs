//! `--token-auth-file`: static bearer tokens in Kubernetes' CSV format, one user a line:
//! `token,user,uid,"group1,group2"` (the groups column optional). Read once at start.

use std::collections::HashMap;
use std::path::Path;

use super::UserInfo;

/// Why the token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: csv::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Line {
        path: String,
        line: u64,
        reason: String,
    },
}

/// The users of a token file, by token.
#[derive(Debug, Default)]
pub struct TokenFile {
    users: HashMap<String, UserInfo>,
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<TokenFile, TokenFileError> {
        let shown = path.display().to_string();
        let read = |source| TokenFileError::Read {
            path: shown.clone(),
            source,
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_path(path)
            .map_err(read)?;
        let mut users = HashMap::new();
        for record in reader.records() {
            let record = record.map_err(read)?;
            let line = record.position().map_or(0, |p| p.line());
            let bad = |reason: &str| TokenFileError::Line {
                path: shown.clone(),
                line,
                reason: reason.to_string(),
            };
            if record.len() < 3 {
                return Err(bad("expected token,user,uid[,\"groups\"]"));
            }
            let (token, name, uid) = (&record[0], &record[1], &record[2]);
            if token.is_empty() || name.is_empty() {
                return Err(bad("an empty token or user"));
            }
            let groups: Vec<&str> = record
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let mut user = UserInfo::new(name, &groups);
            user.uid = uid.to_string();
            if users.insert(token.to_string(), user).is_some() {
                return Err(bad("a token given twice"));
            }
        }
        Ok(TokenFile { users })
    }

    /// The user of `token`.
    pub fn authenticate(&self, token: &str) -> Option<&UserInfo> {
        self.users.get(token)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubernetes_token_csv() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tokens.csv");
        std::fs::write(
            &p,
            "# comment\nt0k3n,alice,1001,\"dev,ops\"\nother,bob,1002\n",
        )
        .unwrap();
        let f = TokenFile::load(&p).unwrap();
        let alice = f.authenticate("t0k3n").unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.uid, "1001");
        assert_eq!(alice.groups, ["dev", "ops", "system:authenticated"]);
        assert_eq!(
            f.authenticate("other").unwrap().groups,
            ["system:authenticated"]
        );
        assert!(f.authenticate("nope").is_none());

        std::fs::write(&p, "a,b\n").unwrap();
        assert!(TokenFile::load(&p).is_err());
        std::fs::write(&p, "a,b,1\na,c,2\n").unwrap();
        assert!(TokenFile::load(&p).is_err());
    }
}
