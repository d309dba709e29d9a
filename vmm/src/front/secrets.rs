//! `mvm run --secret` (docs/network.md, "Secrets"): the command gets a
//! random placeholder in the variable; the real value, read here from
//! mvm's environment or a file, goes only to the host proxy (through a
//! pipe), which swaps it in for the placeholder in request headers to the
//! hosts it is bound to. The value is never on a command line, in the
//! session directory, in the guest, or in an error message.

use std::collections::HashSet;
use std::path::Path;

use mvm_protocol::{CA_BUNDLE_PATH, RUN_CA_PATH};

/// Every placeholder starts with this (mvm-egress checks it).
const PREFIX: &str = "mvm-secret-";

/// One `--secret`, its value read.
pub struct Bound {
    pub name: String,
    pub placeholder: String,
    value: String,
    /// `host:port`, lowercased; the port defaults to 443.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for Bound {
    // Never the value.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Parses `NAME@HOST[,HOST...]`, `NAME=env:OTHER@...` or
/// `NAME=file:PATH@...` and reads the value (`env` looks a variable up).
pub fn parse(spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Bound, String> {
    let usage = "use NAME@HOST, NAME=env:VAR@HOST or NAME=file:PATH@HOST (HOST[:PORT], several separated by commas)";
    let (left, hosts) = spec
        .rsplit_once('@')
        .ok_or_else(|| format!("--secret '{spec}': no @HOST; {usage}"))?;
    let (name, source) = match left.split_once('=') {
        Some((name, source)) => (name, Some(source)),
        None => (left, None),
    };
    let valid_name = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        return Err(format!(
            "--secret '{spec}': '{name}' is not an environment variable name; {usage}"
        ));
    }
    let hosts = hosts
        .split(',')
        .map(|h| host_port(h).ok_or_else(|| format!("--secret {name}: bad host '{h}'; {usage}")))
        .collect::<Result<Vec<_>, _>>()?;
    let value = match source {
        None => env(name).ok_or_else(|| {
            format!("--secret {name}: ${name} is not set in mvm's environment (export it, or use {name}=file:PATH@HOST)")
        })?,
        Some(s) => match s.split_once(':') {
            Some(("env", var)) => env(var).ok_or_else(|| {
                format!("--secret {name}: ${var} is not set in mvm's environment")
            })?,
            Some(("file", path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--secret {name}: cannot read {path}: {e}"))?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                text.strip_suffix('\r').unwrap_or(text).to_string()
            }
            _ => return Err(format!("--secret '{name}={s}': unknown source; {usage}")),
        },
    };
    if value.is_empty() {
        return Err(format!("--secret {name}: the value is empty"));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(format!(
            "--secret {name}: the value holds a line break or NUL, which no HTTP header can carry"
        ));
    }
    Ok(Bound {
        name: name.to_string(),
        placeholder: placeholder()?,
        value,
        hosts,
    })
}

/// `host` or `host:port` (default 443), lowercased; a name or an address,
/// never a pattern.
fn host_port(text: &str) -> Option<String> {
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse::<u16>().ok().filter(|&p| p > 0)?),
        _ => (text, 443),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    ok.then(|| format!("{host}:{port}"))
}

/// `mvm-secret-` and 32 random hex digits.
fn placeholder() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    // SAFETY: bytes is valid for writes of its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(format!(
            "cannot read the host's random source: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(format!(
        "{PREFIX}{}",
        mvm_protocol::boot::encode_hex(&bytes)
    ))
}

/// The `secret` list of a `--policy` file (`secret = ["NAME@HOST", ...]`
/// in TOML, `"secret": [...]` in JSON; told apart as mvm-egress does). A
/// file that cannot be read or parsed gives none here: the proxy reads
/// the same file and says what is wrong with it.
pub fn from_policy_file(path: &Path) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        secret: Vec<String>,
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let toml = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => true,
        Some("json") => false,
        _ => !text.trim_start().starts_with('{'),
    };
    let file: Option<File> = if toml {
        toml::from_str(&text).ok()
    } else {
        serde_json::from_str(&text).ok()
    };
    file.map(|f| f.secret).unwrap_or_default()
}

/// The secrets as mvm-egress reads them on its pipe.
pub fn to_json(list: &[Bound]) -> String {
    serde_json::Value::Array(
        list.iter()
            .map(|b| {
                serde_json::json!({
                    "name": b.name,
                    "placeholder": b.placeholder,
                    "value": b.value,
                    "hosts": b.hosts,
                })
            })
            .collect(),
    )
    .to_string()
}

/// The command's variables: each secret's placeholder, and the CA bundle
/// that holds the run's CA for the programs that do not read the
/// system's by default; `--env` values win, except over a secret's own
/// name, which is an error (the caller checks: `conflict`).
pub fn add_env(env: &mut Vec<(String, String)>, list: &[Bound], user_keys: &HashSet<String>) {
    for b in list {
        env.retain(|(k, _)| k != &b.name);
        env.push((b.name.clone(), b.placeholder.clone()));
    }
    let bundle = [
        ("SSL_CERT_FILE", CA_BUNDLE_PATH),
        ("REQUESTS_CA_BUNDLE", CA_BUNDLE_PATH),
        ("CURL_CA_BUNDLE", CA_BUNDLE_PATH),
        ("GIT_SSL_CAINFO", CA_BUNDLE_PATH),
        ("NODE_EXTRA_CA_CERTS", RUN_CA_PATH),
    ];
    for (k, v) in bundle {
        if !user_keys.contains(k) {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v.to_string()));
        }
    }
}

/// A secret's name also given with --env: which would win is unclear,
/// so neither does.
pub fn conflict(list: &[Bound], user_keys: &HashSet<String>) -> Option<String> {
    list.iter()
        .find(|b| user_keys.contains(&b.name))
        .map(|b| format!("--secret {0} and --env {0} both set {0}: drop one", b.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("tok-value".into()),
            "OTHER" => Some("other-value".into()),
            _ => None,
        }
    }

    #[test]
    fn the_three_forms_read_their_values() {
        let b = parse("TOKEN@API.example.org", &env).unwrap();
        assert_eq!(b.name, "TOKEN");
        assert_eq!(b.value, "tok-value");
        assert_eq!(b.hosts, ["api.example.org:443"]);
        assert!(b.placeholder.starts_with(PREFIX) && b.placeholder.len() == PREFIX.len() + 32);
        let b = parse("KEY=env:OTHER@a.test:8443,b.test", &env).unwrap();
        assert_eq!((b.name.as_str(), b.value.as_str()), ("KEY", "other-value"));
        assert_eq!(b.hosts, ["a.test:8443", "b.test:443"]);
        let dir = std::env::temp_dir().join(format!("mvm-secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-a-file\n").unwrap();
        let b = parse(&format!("F=file:{}@x.test", file.display()), &env).unwrap();
        assert_eq!(b.value, "from-a-file");
        std::fs::remove_dir_all(&dir).unwrap();
        // Two runs, two placeholders.
        assert_ne!(
            parse("TOKEN@a.test", &env).unwrap().placeholder,
            parse("TOKEN@a.test", &env).unwrap().placeholder
        );
    }

    #[test]
    fn bad_specs_say_what_to_write_and_never_the_value() {
        for (spec, says) in [
            ("TOKEN", "no @HOST"),
            ("1X@a.test", "not an environment variable name"),
            ("TOKEN@*.a.test", "bad host"),
            ("TOKEN@a.test:0", "bad host"),
            ("MISSING@a.test", "$MISSING is not set"),
            ("K=env:MISSING@a.test", "$MISSING is not set"),
            ("K=file:/nonexistent/x@a.test", "cannot read /nonexistent/x"),
            ("K=vault:x@a.test", "unknown source"),
        ] {
            let e = parse(spec, &env).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
            assert!(!e.contains("tok-value"), "{e}");
        }
        let b = parse("TOKEN@a.test", &env).unwrap();
        assert!(!format!("{b:?}").contains("tok-value"));
    }

    #[test]
    fn the_command_gets_placeholders_and_the_bundle() {
        let b = parse("TOKEN@a.test", &env).unwrap();
        let mut vars = vec![("TOKEN".to_string(), "image's".to_string())];
        let mut user = HashSet::new();
        user.insert("CURL_CA_BUNDLE".to_string());
        add_env(&mut vars, std::slice::from_ref(&b), &user);
        let get = |k: &str| {
            vars.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("TOKEN"), Some(b.placeholder.as_str()));
        assert_eq!(get("SSL_CERT_FILE"), Some(CA_BUNDLE_PATH));
        assert_eq!(get("NODE_EXTRA_CA_CERTS"), Some(RUN_CA_PATH));
        assert_eq!(get("CURL_CA_BUNDLE"), None, "--env's own stays");
        user.insert("TOKEN".to_string());
        assert!(conflict(&[b], &user).unwrap().contains("--env TOKEN"));
        let json = to_json(&[parse("TOKEN@a.test", &env).unwrap()]);
        assert!(json.contains("tok-value") && json.contains("a.test:443"));
    }

    #[test]
    fn policy_files_name_secrets_in_toml_or_json() {
        let dir = std::env::temp_dir().join(format!("mvm-policy-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            (
                "p.toml",
                "allow = [\"x.test\"]\nsecret = [\"TOKEN@a.test\"]\n",
            ),
            ("p.json", "{\"secret\": [\"TOKEN@a.test\"]}"),
            ("policy", "{\"allow\": [], \"secret\": [\"TOKEN@a.test\"]}"),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            assert_eq!(from_policy_file(&path), ["TOKEN@a.test"], "{name}");
        }
        assert!(from_policy_file(&dir.join("missing.toml")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
