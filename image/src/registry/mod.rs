//! Registry references, credentials and the client that talks the OCI
//! distribution API (`Store::pull`, src/store/pull.rs, is the user). The
//! references and options are always here; the client only with the
//! `registry` feature, which mvm-pull has and mvm does not.

#[cfg(feature = "registry")]
mod auth;
#[cfg(feature = "registry")]
mod fail;
#[cfg(feature = "registry")]
mod remote;

use std::time::Duration;

#[cfg(feature = "registry")]
pub(crate) use auth::Credentials;
#[cfg(feature = "registry")]
pub(crate) use remote::Remote;

use crate::digest::hex_of;
use crate::source::is_tag;
use crate::Error;

/// How a pull reaches registries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullOptions {
    /// HOST[:PORT] spoken to over plain HTTP; every other host is HTTPS.
    pub insecure: Vec<String>,
    /// Longest wait for a TCP connection (and the name lookup before it).
    pub connect_timeout: Duration,
    /// Longest wait for any byte of an answer: a registry that accepts
    /// the connection and then says nothing fails after this, however
    /// long the whole pull takes while bytes keep coming.
    pub read_timeout: Duration,
}

/// The defaults: 15 s to connect, 30 s without a byte.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            insecure: Vec::new(),
            connect_timeout: CONNECT_TIMEOUT,
            read_timeout: READ_TIMEOUT,
        }
    }
}

impl PullOptions {
    /// The defaults with what the environment adds: `MVM_INSECURE_REGISTRIES`
    /// (HOST[:PORT],...) and `MVM_REGISTRY_TIMEOUT` (seconds, both timeouts).
    pub fn from_env() -> Result<PullOptions, Error> {
        let mut o = PullOptions::default();
        if let Ok(list) = std::env::var("MVM_INSECURE_REGISTRIES") {
            o.insecure.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(String::from),
            );
        }
        if let Ok(secs) = std::env::var("MVM_REGISTRY_TIMEOUT") {
            let s: u64 =
                secs.trim()
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| Error::BadReference {
                        reference: format!("MVM_REGISTRY_TIMEOUT={secs}"),
                        why: "give a whole number of seconds, at least 1".into(),
                    })?;
            o.connect_timeout = Duration::from_secs(s);
            o.read_timeout = Duration::from_secs(s);
        }
        Ok(o)
    }
}

/// Whether `reference` names a registry: its first component is a host
/// (it has a dot or a port, or is `localhost`). Store names never do.
pub fn names_a_registry(reference: &str) -> bool {
    reference.split_once('/').is_some_and(|(first, _)| {
        first.contains('.') || first.contains(':') || first == "localhost"
    })
}

/// HOST[:PORT]/NAME[:TAG][@sha256:HEX], parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RegistryRef {
    /// HOST[:PORT], as given (the key of auth files and --insecure-registry).
    pub host: String,
    pub repository: String,
    /// The tag given, `latest` if neither a tag nor a digest was.
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl RegistryRef {
    pub(crate) fn parse(reference: &str) -> Result<RegistryRef, Error> {
        let bad = |why: &str| Error::BadReference {
            reference: crate::error::show(reference.as_bytes()),
            why: why.into(),
        };
        if !names_a_registry(reference) {
            return Err(bad(
                "a registry reference is HOST[:PORT]/NAME[:TAG] or HOST[:PORT]/NAME@sha256:HEX",
            ));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((r, d)) => {
                hex_of(d)?;
                (r, Some(d.to_string()))
            }
            None => (reference, None),
        };
        let (host, path) = rest.split_once('/').expect("names_a_registry saw a '/'");
        let host_ok = |c: char| c.is_ascii_alphanumeric() || ".-:[]".contains(c);
        if host.is_empty() || !host.chars().all(host_ok) {
            return Err(bad("the host is letters, digits, . and - (then :PORT)"));
        }
        let last = path.rsplit('/').next().unwrap_or(path);
        let (repository, tag) = match last.rsplit_once(':') {
            Some((_, t)) => (&path[..path.len() - t.len() - 1], Some(t.to_string())),
            None => (path, None),
        };
        if let Some(t) = &tag {
            if !is_tag(t) {
                return Err(bad("a tag is letters, digits and . _ - (at most 128)"));
            }
        }
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
        };
        if !repository.split('/').all(component_ok) {
            return Err(bad(
                "a name is lowercase letters, digits and . _ - between slashes",
            ));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(RegistryRef {
            host: host.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The name the pulled image gets in the store: the reference with
    /// its tag (HOST/NAME:TAG); none for a digest-only reference, which
    /// stays reachable by digest.
    pub(crate) fn store_name(&self) -> Option<String> {
        let tag = self.tag.as_ref()?;
        Some(format!("{}/{}:{tag}", self.host, self.repository))
    }

    /// HOST/NAME:TAG or HOST/NAME@DIGEST, for messages.
    #[cfg(feature = "registry")]
    pub(crate) fn describe(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("{}/{}@{d}", self.host, self.repository),
            (None, Some(t)) => format!("{}/{}:{t}", self.host, self.repository),
            (None, None) => format!("{}/{}", self.host, self.repository),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_references() {
        let r = RegistryRef::parse("127.0.0.1:5000/mvm-test/layers:1").unwrap();
        assert_eq!(r.host, "127.0.0.1:5000");
        assert_eq!(r.repository, "mvm-test/layers");
        assert_eq!(r.tag.as_deref(), Some("1"));
        assert_eq!(r.store_name().unwrap(), "127.0.0.1:5000/mvm-test/layers:1");
        let r = RegistryRef::parse("registry.example/app").unwrap();
        assert_eq!(r.tag.as_deref(), Some("latest"));
        let r = RegistryRef::parse(&format!("localhost/app@{D}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.store_name(), None);
        let r = RegistryRef::parse(&format!("h.example:1/a/b:v2@{D}")).unwrap();
        assert_eq!(r.store_name().unwrap(), "h.example:1/a/b:v2");
    }

    #[test]
    fn refuses_bad_references() {
        for bad in [
            "app:1",
            "library/app",
            "h.example/App",
            "h.example/a//b",
            "h.example/a:bad tag",
            "h.example/a@sha256:12",
            "h.example/",
            "h.example/a@md5:00",
        ] {
            assert!(RegistryRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn registry_references_are_told_from_store_names() {
        assert!(names_a_registry("registry.example:5000/app:1"));
        assert!(names_a_registry("localhost/app"));
        assert!(!names_a_registry("app:1"));
        assert!(!names_a_registry("library/app"));
    }
}
