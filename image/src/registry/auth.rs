//! Registry credentials from the files docker and podman users already
//! keep: `$REGISTRY_AUTH_FILE` if set (it alone), else
//! `$XDG_RUNTIME_DIR/containers/auth.json`, then `~/.docker/config.json`.
//! Each is `{"auths": {"HOST[:PORT]": {"auth": base64(USER:PASSWORD)}}}`.
//! Credential helpers (`credsStore`, `credHelpers`) are not run: they are
//! programs of the user's choosing, and a sandbox tool should not start
//! them. Nothing here is ever printed: messages name the file, not what
//! is in it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use crate::Error;

/// What a pull authenticates with.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// No entry for the host. `helper`: a credential helper the files
    /// name for it, which mvm does not run (said on a 401).
    Anonymous { helper: Option<(String, PathBuf)> },
    Basic {
        user: String,
        password: String,
        file: PathBuf,
    },
}

/// Never shows the password (nor the user: both are the user's secrets).
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous { .. } => f.write_str("Anonymous"),
            Credentials::Basic { file, .. } => write!(f, "Basic(from {})", file.display()),
        }
    }
}

#[derive(Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The auth files to read, in order.
fn candidates() -> Vec<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(f) = var("REGISTRY_AUTH_FILE") {
        return vec![PathBuf::from(f)];
    }
    let mut files = Vec::new();
    if let Some(run) = var("XDG_RUNTIME_DIR") {
        files.push(PathBuf::from(run).join("containers/auth.json"));
    }
    if let Some(home) = var("HOME") {
        files.push(PathBuf::from(home).join(".docker/config.json"));
    }
    files
}

/// An `auths` key as docker writes it (`https://HOST/v1/` for old logins)
/// reduced to HOST[:PORT].
fn key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

impl Credentials {
    /// The credentials for `host` from the first auth file that has them.
    pub(crate) fn for_host(host: &str) -> Result<Credentials, Error> {
        let mut helper = None;
        for file in candidates() {
            let bytes = match std::fs::read(&file) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(Error::Io {
                        what: format!("reading the registry auth file {}", file.display()),
                        source: e,
                    })
                }
            };
            // serde's message may quote the file's text: not shown.
            let parsed: AuthFile = serde_json::from_slice(&bytes).map_err(|_| Error::Auth {
                why: format!(
                    "{} is not a JSON auth file ({{\"auths\": {{...}}}}): fix it or point REGISTRY_AUTH_FILE elsewhere",
                    file.display()
                ),
            })?;
            if let Some(entry) = parsed.auths.iter().find(|(k, _)| key_host(k) == host) {
                return decode(entry.1, &file, host);
            }
            if helper.is_none() {
                let named = parsed
                    .cred_helpers
                    .get(host)
                    .cloned()
                    .or(parsed.creds_store.clone());
                helper = named.map(|h| (h, file.clone()));
            }
        }
        Ok(Credentials::Anonymous { helper })
    }
}

fn decode(entry: &Entry, file: &std::path::Path, host: &str) -> Result<Credentials, Error> {
    let bad = || {
        Error::Auth {
        why: format!(
            "the entry for {host} in {} has no usable \"auth\" (base64 of USER:PASSWORD): log in again with `docker login {host}` or `podman login {host}`",
            file.display()
        ),
    }
    };
    let (user, password) = match (&entry.auth, &entry.username, &entry.password) {
        (Some(a), _, _) if !a.is_empty() => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|_| bad())?;
            let text = String::from_utf8(raw).map_err(|_| bad())?;
            let (u, p) = text.split_once(':').ok_or_else(bad)?;
            (u.to_string(), p.to_string())
        }
        (_, Some(u), Some(p)) => (u.clone(), p.clone()),
        _ => return Err(bad()),
    };
    if user.is_empty() {
        return Err(bad());
    }
    Ok(Credentials::Basic {
        user,
        password,
        file: file.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_reduce_to_hosts() {
        assert_eq!(key_host("https://h.example/v1/"), "h.example");
        assert_eq!(key_host("127.0.0.1:5000"), "127.0.0.1:5000");
    }

    #[test]
    fn entries_decode_and_never_show() {
        let f = std::path::Path::new("auth.json");
        let e = Entry {
            // base64("me:s3cret:x")
            auth: Some("bWU6czNjcmV0Ong=".into()),
            ..Entry::default()
        };
        let c = decode(&e, f, "h").unwrap();
        assert_eq!(
            c,
            Credentials::Basic {
                user: "me".into(),
                password: "s3cret:x".into(),
                file: f.into()
            }
        );
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = Entry {
            auth: Some("!!".into()),
            ..Entry::default()
        };
        let err = decode(&e, f, "h").unwrap_err().to_string();
        assert!(err.contains("docker login h"), "{err}");
    }
}
