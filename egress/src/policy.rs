//! Allow and deny rules, and the two checks a request goes through: its
//! host name before any lookup (so a name no rule allows is never even
//! resolved, and cannot leak out through DNS), then each address it
//! resolves to, or the address it names. Deny wins over allow.

use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use crate::pattern::{self, Pattern};
use crate::special;

#[derive(Debug, Default, Clone)]
pub struct Policy {
    pub allow: Vec<Pattern>,
    pub deny: Vec<Pattern>,
}

/// The policy file: `{"allow": ["example.org", ...], "deny": [...]}` in
/// JSON, or `allow = ["example.org", ...]` and `deny = [...]` in TOML.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    /// `--secret` specs: mvm's to read (it reads their values and hands
    /// them over); only their hosts reach the proxy, as allow rules.
    #[serde(default, rename = "secret")]
    _secret: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--allow {0}")]
    Allow(pattern::Error),
    #[error("--deny {0}")]
    Deny(pattern::Error),
    #[error("cannot read the policy file {0}: {1}")]
    Read(String, std::io::Error),
    #[error(
        "policy file {0}: {1} (expected {{\"allow\": [PATTERN, ...], \"deny\": [PATTERN, ...]}})"
    )]
    Parse(String, String),
}

/// Why a request is refused; Display is the one line the client sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// No allow rule matches.
    NotAllowed { target: String, hint: String },
    /// A deny rule matches.
    Denied { target: String, rule: String },
    /// A special address (loopback, private, ...) without an explicit IP rule.
    Special {
        name: Option<String>,
        target: String,
        ip: IpAddr,
        kind: &'static str,
        hint: String,
    },
}

impl Denial {
    /// The rule that decided, for the log.
    pub fn rule(&self) -> String {
        match self {
            Denial::NotAllowed { .. } => "no allow rule".into(),
            Denial::Denied { rule, .. } => format!("deny {rule}"),
            Denial::Special { kind, .. } => format!("{kind} address"),
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Denial::NotAllowed { target, hint } => {
                write!(f, "{target} is not allowed; allow it with --allow {hint}")
            }
            Denial::Denied { target, rule } => {
                write!(f, "{target} is denied by --deny {rule}")
            }
            Denial::Special {
                name: Some(name),
                ip,
                kind,
                hint,
                ..
            } => write!(
                f,
                "{name} resolves to {ip}, a {kind} address; allow that address with --allow {hint}"
            ),
            Denial::Special {
                name: None,
                target,
                kind,
                hint,
                ..
            } => write!(
                f,
                "{target} is a {kind} address; allow it with --allow {hint}"
            ),
        }
    }
}

/// `host:port` as a client writes it (IPv6 bracketed).
pub fn target(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The pattern that would allow exactly this: the bare host on 80 and 443.
fn hint(host: &str, port: u16) -> String {
    if port == 80 || port == 443 {
        host.to_string()
    } else {
        target(host, port)
    }
}

impl Policy {
    pub fn from_args(allow: &[String], deny: &[String]) -> Result<Policy, Error> {
        let mut policy = Policy::default();
        policy.add(allow, deny)?;
        Ok(policy)
    }

    fn add(&mut self, allow: &[String], deny: &[String]) -> Result<(), Error> {
        for a in allow {
            self.allow.push(Pattern::parse(a).map_err(Error::Allow)?);
        }
        for d in deny {
            self.deny.push(Pattern::parse(d).map_err(Error::Deny)?);
        }
        Ok(())
    }

    /// Adds the rules of a policy file: TOML if its name ends in `.toml`,
    /// JSON if in `.json`, and otherwise JSON when its text starts with
    /// `{`, TOML when not.
    pub fn add_file(&mut self, path: &Path) -> Result<(), Error> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Read(name.clone(), e))?;
        let toml = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => true,
            Some("json") => false,
            _ => !text.trim_start().starts_with('{'),
        };
        if toml {
            self.add_toml(&name, &text)
        } else {
            self.add_json(&name, &text)
        }
    }

    pub fn add_json(&mut self, name: &str, text: &str) -> Result<(), Error> {
        let file: File =
            serde_json::from_str(text).map_err(|e| Error::Parse(name.into(), e.to_string()))?;
        self.add(&file.allow, &file.deny)
    }

    pub fn add_toml(&mut self, name: &str, text: &str) -> Result<(), Error> {
        // toml's messages span lines (the line, a caret); the error is one.
        let file: File = toml::from_str(text).map_err(|e| {
            Error::Parse(
                name.into(),
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        })?;
        self.add(&file.allow, &file.deny)
    }

    /// A host name: the allow rule that lets it be resolved, or why not.
    pub fn check_name(&self, name: &str, port: u16) -> Result<&Pattern, Denial> {
        if let Some(rule) = self.deny.iter().find(|r| r.matches_name(name, port)) {
            return Err(Denial::Denied {
                target: target(name, port),
                rule: rule.text.clone(),
            });
        }
        self.allow
            .iter()
            .find(|r| r.matches_name(name, port))
            .ok_or_else(|| Denial::NotAllowed {
                target: target(name, port),
                hint: hint(name, port),
            })
    }

    /// An address, named by the client (`name` None) or resolved from an
    /// allowed name: Ok with the IP rule that allowed it, if one had to.
    pub fn check_addr(
        &self,
        ip: IpAddr,
        port: u16,
        name: Option<&str>,
    ) -> Result<Option<&Pattern>, Denial> {
        let ip = crate::net::canonical(ip);
        let ip_text = ip.to_string();
        let shown = target(name.unwrap_or(&ip_text), port);
        if let Some(rule) = self.deny.iter().find(|r| r.matches_addr(ip, port)) {
            return Err(Denial::Denied {
                target: match name {
                    Some(_) => format!("{shown} ({ip})"),
                    None => shown,
                },
                rule: rule.text.clone(),
            });
        }
        if let Some(class) = special::class_of(ip) {
            // Only a rule inside the class counts: 0.0.0.0/0 is not an
            // explicit allow of the metadata service.
            let explicit = self.allow.iter().find(|r| {
                r.matches_addr(ip, port) && r.net().is_some_and(|n| class.range.covers(n))
            });
            return match explicit {
                Some(rule) => Ok(Some(rule)),
                None => Err(Denial::Special {
                    name: name.map(str::to_string),
                    target: target(&ip_text, port),
                    ip,
                    kind: class.kind,
                    hint: hint(&ip_text, port),
                }),
            };
        }
        if name.is_some() {
            return Ok(None);
        }
        match self.allow.iter().find(|r| r.matches_addr(ip, port)) {
            Some(rule) => Ok(Some(rule)),
            None => Err(Denial::NotAllowed {
                target: target(&ip_text, port),
                hint: hint(&ip_text, port),
            }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Policy::from_args(&v(allow), &v(deny)).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(&["**.example.org"], &["secret.example.org"]);
        assert!(p.check_name("www.example.org", 443).is_ok());
        let d = p.check_name("secret.example.org", 443).unwrap_err();
        assert_eq!(d.rule(), "deny secret.example.org");
        assert_eq!(
            d.to_string(),
            "secret.example.org:443 is denied by --deny secret.example.org"
        );
        // An address deny beats a name allow.
        let p = policy(&["example.org"], &["93.184.0.0/16"]);
        let d = p.check_addr(ip("93.184.216.34"), 443, Some("example.org"));
        assert!(matches!(d, Err(Denial::Denied { .. })), "{d:?}");
        // And an address allow.
        let p = policy(&["0.0.0.0/0:*"], &["8.8.8.8:53"]);
        assert!(p.check_addr(ip("8.8.8.8"), 53, None).is_err());
        assert!(p.check_addr(ip("8.8.8.8"), 443, None).is_ok());
    }

    #[test]
    fn what_is_not_allowed_names_the_flag_that_would() {
        let p = policy(&["example.org"], &[]);
        let d = p.check_name("example.com", 443).unwrap_err();
        assert_eq!(
            d.to_string(),
            "example.com:443 is not allowed; allow it with --allow example.com"
        );
        let d = p.check_name("example.org", 8443).unwrap_err();
        assert_eq!(
            d.to_string(),
            "example.org:8443 is not allowed; allow it with --allow example.org:8443"
        );
        let d = p.check_addr(ip("2001:db8::1"), 8080, None).unwrap_err();
        assert_eq!(
            d.to_string(),
            "[2001:db8::1]:8080 is not allowed; allow it with --allow [2001:db8::1]:8080"
        );
        assert_eq!(d.rule(), "no allow rule");
    }

    #[test]
    fn a_name_reaching_a_special_address_needs_that_address_allowed() {
        let p = policy(&["localhost", "*.test"], &[]);
        let d = p
            .check_addr(ip("127.0.0.1"), 80, Some("localhost"))
            .unwrap_err();
        assert_eq!(
            d.to_string(),
            "localhost resolves to 127.0.0.1, a loopback address; allow that address with --allow 127.0.0.1"
        );
        for (addr, kind) in [
            ("10.0.0.5", "private"),
            ("192.168.0.1", "private"),
            ("fd12::1", "private"),
            ("100.64.1.1", "CGNAT"),
            ("169.254.169.254", "cloud metadata"),
            ("fd00:ec2::254", "cloud metadata"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            match p.check_addr(ip(addr), 443, Some("a.test")) {
                Err(Denial::Special { kind: k, .. }) => assert_eq!(k, kind, "{addr}"),
                other => panic!("{addr}: {other:?}"),
            }
        }
        // A public address needs no IP rule.
        assert_eq!(
            p.check_addr(ip("93.184.216.34"), 443, Some("a.test")),
            Ok(None)
        );
        // Allowed explicitly: the address, or a range inside the class.
        let p = policy(&["localhost", "127.0.0.1", "10.1.0.0/16:*"], &[]);
        let rule = p
            .check_addr(ip("127.0.0.1"), 80, Some("localhost"))
            .unwrap();
        assert_eq!(rule.unwrap().text, "127.0.0.1");
        assert!(p
            .check_addr(ip("127.0.0.1"), 8080, Some("localhost"))
            .is_err());
        assert!(p
            .check_addr(ip("10.1.2.3"), 5432, Some("localhost"))
            .is_ok());
        assert!(p
            .check_addr(ip("10.2.0.1"), 5432, Some("localhost"))
            .is_err());
    }

    #[test]
    fn the_whole_internet_does_not_include_the_host_or_metadata() {
        let p = policy(&["0.0.0.0/0", "::/0", "169.254.0.0/16"], &[]);
        assert!(p.check_addr(ip("93.184.216.34"), 443, None).is_ok());
        assert!(p.check_addr(ip("2606:4700::1111"), 443, None).is_ok());
        for addr in ["127.0.0.1", "10.0.0.1", "::1", "fd00:ec2::254", "0.0.0.0"] {
            assert!(p.check_addr(ip(addr), 443, None).is_err(), "{addr}");
        }
        // 169.254.0.0/16 allows link-local but not the metadata address.
        assert!(p.check_addr(ip("169.254.1.1"), 80, None).is_ok());
        let d = p.check_addr(ip("169.254.169.254"), 80, None).unwrap_err();
        assert!(d.to_string().contains("--allow 169.254.169.254"), "{d}");
    }

    #[test]
    fn an_address_rule_does_not_allow_names() {
        let p = policy(&["93.184.216.34"], &[]);
        assert!(p.check_name("example.org", 443).is_err());
        assert!(p.check_addr(ip("93.184.216.34"), 443, None).is_ok());
    }

    #[test]
    fn policy_files_hold_the_same_rules() {
        let mut p = Policy::default();
        p.add_json(
            "t.json",
            r#"{"allow": ["*.example.org", "127.0.0.1:8080"], "deny": ["bad.example.org"]}"#,
        )
        .unwrap();
        assert!(p.check_name("www.example.org", 443).is_ok());
        assert!(p.check_name("bad.example.org", 443).is_err());
        assert!(p.check_addr(ip("127.0.0.1"), 8080, None).is_ok());
        for bad in [
            r#"{"allow": ["a.*.b"]}"#,
            r#"{"alow": ["example.org"]}"#,
            r#"["example.org"]"#,
            "not json",
        ] {
            let e = Policy::default().add_json("t.json", bad).unwrap_err();
            assert!(
                e.to_string().starts_with("--allow") || e.to_string().contains("t.json"),
                "{e}"
            );
        }
    }

    #[test]
    fn toml_policy_files_hold_the_same_rules() {
        let mut p = Policy::default();
        p.add_toml(
            "t.toml",
            "# the package index\nallow = [\"*.example.org\", \"127.0.0.1:8080\"]\ndeny = [\"bad.example.org\"]\n",
        )
        .unwrap();
        assert!(p.check_name("www.example.org", 443).is_ok());
        assert!(p.check_name("bad.example.org", 443).is_err());
        assert!(p.check_addr(ip("127.0.0.1"), 8080, None).is_ok());
        for bad in [
            "allow = [\"a.*.b\"]",
            "alow = [\"example.org\"]",
            "allow = \"example.org\"",
            "allow = [\n",
        ] {
            let e = Policy::default().add_toml("t.toml", bad).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("--allow") || text.contains("t.toml"),
                "{text}"
            );
            assert!(!text.contains('\n'), "one line: {text:?}");
        }
    }

    #[test]
    fn a_policy_file_is_toml_or_json_by_its_name_or_first_character() {
        let dir = std::env::temp_dir().join(format!("mvm-egress-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("p.toml", "allow = [\"a.example\"]"),
            ("p.json", "{\"allow\": [\"a.example\"]}"),
            ("policy", "  {\"allow\": [\"a.example\"]}"),
            ("policy.conf", "allow = [\"a.example\"]"),
        ];
        for (name, text) in cases {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let mut p = Policy::default();
            p.add_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(p.check_name("a.example", 443).is_ok(), "{name}");
        }
        // The name decides over the text: JSON in a .toml file is an error.
        let path = dir.join("wrong.toml");
        std::fs::write(&path, "{\"allow\": [\"a.example\"]}").unwrap();
        assert!(Policy::default().add_file(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
