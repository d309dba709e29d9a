//! Secrets by placeholder (docs/network.md, "Secrets"): the command sees a
//! random placeholder; only this process holds the real value, and swaps
//! it in for the placeholder in the request headers of a connection to a
//! host the secret is bound to (intercept.rs). A placeholder found going
//! anywhere else is a leak: refused and logged.
//!
//! mvm hands the secrets over on an inherited pipe (`--secrets-fd`), as
//! one JSON array, read before confinement: never on a command line, in a
//! file or in the environment.

use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};

use serde::Deserialize;

/// The prefix every placeholder starts with (mvm makes them: the prefix
/// and 32 random hex digits).
pub const PREFIX: &str = "mvm-secret-";

/// The most secret bytes taken from the pipe (all secrets together).
const MAX_INPUT: u64 = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// The environment variable's name in the guest (for the log).
    pub name: String,
    pub placeholder: String,
    pub value: String,
    /// `host:port` targets it is bound to, lowercased.
    pub hosts: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Secrets {
    list: Vec<Secret>,
}

/// What header substitution found in one value.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<'a> {
    /// No placeholder.
    None,
    /// Placeholders of these secrets, all bound here: the new value.
    Substituted(Vec<u8>, Vec<&'a str>),
    /// A placeholder of a secret not bound here (its name).
    Leak(&'a str),
}

impl Secrets {
    /// Reads and checks the JSON array on `fd` (then closed).
    pub fn from_fd(fd: RawFd) -> Result<Secrets, String> {
        // SAFETY: the fd is ours (handed over by mvm); the File owns and
        // closes it.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut text = String::new();
        file.take(MAX_INPUT)
            .read_to_string(&mut text)
            .map_err(|e| format!("--secrets-fd {fd}: {e}"))?;
        Secrets::from_json(&text)
    }

    pub fn from_json(text: &str) -> Result<Secrets, String> {
        let list: Vec<Secret> =
            serde_json::from_str(text).map_err(|e| format!("--secrets-fd: bad secrets: {e}"))?;
        for s in &list {
            let ok_placeholder = s.placeholder.len() >= PREFIX.len() + 16
                && s.placeholder.starts_with(PREFIX)
                && s.placeholder
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !ok_placeholder {
                return Err(format!("--secrets-fd: {}: a malformed placeholder", s.name));
            }
            if s.value.is_empty() || s.hosts.is_empty() {
                return Err(format!("--secrets-fd: {}: no value or no host", s.name));
            }
            // A value with a line break would let a header become two.
            if s.value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(format!(
                    "--secrets-fd: {}: the value holds a line break or NUL, which no header may carry",
                    s.name
                ));
            }
        }
        Ok(Secrets { list })
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every `host:port` some secret is bound to.
    pub fn hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self.list.iter().flat_map(|s| s.hosts.clone()).collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }

    /// Whether a connection to `target` (`host:port`) is intercepted.
    pub fn bound(&self, target: &str) -> bool {
        self.list
            .iter()
            .any(|s| s.hosts.iter().any(|h| h == target))
    }

    /// The longest placeholder: how much of a stream's tail to keep so
    /// that a placeholder split across two reads is still seen.
    pub fn longest(&self) -> usize {
        self.list
            .iter()
            .map(|s| s.placeholder.len())
            .max()
            .unwrap_or(0)
    }

    /// The name of the first secret whose placeholder is in `bytes`.
    pub fn leaked_in(&self, bytes: &[u8]) -> Option<&str> {
        self.list
            .iter()
            .find(|s| contains(bytes, s.placeholder.as_bytes()))
            .map(|s| s.name.as_str())
    }

    /// One header value on its way to `target`: placeholders of secrets
    /// bound there replaced by their values; one of a secret bound
    /// elsewhere is a leak.
    pub fn substitute(&self, target: &str, value: &[u8]) -> Found<'_> {
        let mut out = value.to_vec();
        let mut names = Vec::new();
        for s in &self.list {
            if !contains(&out, s.placeholder.as_bytes()) {
                continue;
            }
            if !s.hosts.iter().any(|h| h == target) {
                return Found::Leak(&s.name);
            }
            out = replace(&out, s.placeholder.as_bytes(), s.value.as_bytes());
            names.push(s.name.as_str());
        }
        if names.is_empty() {
            Found::None
        } else {
            Found::Substituted(out, names)
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P1: &str = "mvm-secret-0123456789abcdef0123456789abcdef";
    const P2: &str = "mvm-secret-fedcba9876543210fedcba9876543210";

    fn two() -> Secrets {
        Secrets::from_json(&format!(
            r#"[{{"name":"TOKEN","placeholder":"{P1}","value":"real-1","hosts":["api.test:443"]}},
                {{"name":"OTHER","placeholder":"{P2}","value":"real-2","hosts":["git.test:443","api.test:443"]}}]"#
        ))
        .unwrap()
    }

    #[test]
    fn placeholders_are_replaced_only_on_the_way_to_their_hosts() {
        let s = two();
        let v = format!("Bearer {P1} and {P2}");
        assert_eq!(
            s.substitute("api.test:443", v.as_bytes()),
            Found::Substituted(b"Bearer real-1 and real-2".to_vec(), vec!["TOKEN", "OTHER"])
        );
        assert_eq!(
            s.substitute("git.test:443", v.as_bytes()),
            Found::Leak("TOKEN")
        );
        assert_eq!(
            s.substitute("git.test:443", format!("token {P2}").as_bytes()),
            Found::Substituted(b"token real-2".to_vec(), vec!["OTHER"])
        );
        assert_eq!(s.substitute("api.test:443", b"Bearer abc"), Found::None);
        assert_eq!(s.hosts(), ["api.test:443", "git.test:443"]);
        assert!(s.bound("git.test:443") && !s.bound("git.test:8443"));
    }

    #[test]
    fn a_leak_is_found_anywhere_in_the_bytes() {
        let s = two();
        assert_eq!(
            s.leaked_in(format!("GET /?k={P2} HTTP/1.1").as_bytes()),
            Some("OTHER")
        );
        assert_eq!(s.leaked_in(b"GET / HTTP/1.1"), None);
        assert_eq!(s.longest(), P1.len());
    }

    #[test]
    fn bad_secrets_are_refused() {
        for bad in [
            r#"[{"name":"A","placeholder":"short","value":"v","hosts":["a:443"]}]"#.to_string(),
            format!(r#"[{{"name":"A","placeholder":"{P1}","value":"","hosts":["a:443"]}}]"#),
            format!(r#"[{{"name":"A","placeholder":"{P1}","value":"v","hosts":[]}}]"#),
            format!(
                r#"[{{"name":"A","placeholder":"{P1}","value":"a\r\nX-Evil: 1","hosts":["a:443"]}}]"#
            ),
            "{}".to_string(),
        ] {
            assert!(Secrets::from_json(&bad).is_err(), "{bad}");
        }
    }
}
