//! One rule of a policy, as written on the command line or in a policy
//! file: a host name (`example.org`), a wildcard of exactly one label
//! (`*.example.org`) or of any depth (`**.example.org`), an address or a
//! range (`10.0.0.0/8`, `fd00::/8`), each with an optional port (`:8443`,
//! `:*` for any; without one, 80 and 443). IPv6 with a port is bracketed:
//! `[::1]:8080`, `[fd00::/8]:443`.

use std::fmt;
use std::net::IpAddr;

use crate::net::Net;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Host(String),
    /// `*.SUFFIX`: one more label.
    OneLabel(String),
    /// `**.SUFFIX`: one or more labels.
    AnyDepth(String),
    Addr(Net),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// 80 and 443.
    Web,
    One(u16),
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// As written, for the log and for messages.
    pub text: String,
    pub target: Target,
    pub ports: Ports,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad pattern '{0}': {1}")]
pub struct Error(pub String, pub &'static str);

impl Ports {
    pub fn contains(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(p) => p == port,
            Ports::Any => true,
        }
    }
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, Error> {
        let err = |why| Error(text.to_string(), why);
        let s = text.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let (target, port) = split_port(s)
            .ok_or_else(|| err("an IPv6 address with a port goes in brackets: [::1]:8080"))?;
        let ports = match port {
            None => Ports::Web,
            Some("*") => Ports::Any,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && !p.starts_with('+') => Ports::One(n),
                _ => return Err(err("the port must be 1 to 65535 or *")),
            },
        };
        let target = if let Some(net) = Net::parse(target) {
            Target::Addr(net)
        } else if target.contains('/') || target.parse::<IpAddr>().is_ok() {
            return Err(err("not an address range (ADDR/PREFIX)"));
        } else if let Some(suffix) = target.strip_prefix("**.") {
            Target::AnyDepth(host_name(suffix).ok_or_else(|| err(NAME))?)
        } else if let Some(suffix) = target.strip_prefix("*.") {
            Target::OneLabel(host_name(suffix).ok_or_else(|| err(NAME))?)
        } else if target.contains('*') {
            return Err(err(
                "a wildcard goes only first, as *.example.org or **.example.org",
            ));
        } else {
            Target::Host(host_name(target).ok_or_else(|| err(NAME))?)
        };
        Ok(Pattern {
            text: s.to_string(),
            target,
            ports,
        })
    }

    /// A rule that can match this host name on this port (an address rule
    /// never matches a name: names and addresses are checked separately).
    pub fn matches_name(&self, name: &str, port: u16) -> bool {
        if !self.ports.contains(port) {
            return false;
        }
        let under = |suffix: &str| {
            name.strip_suffix(suffix)
                .and_then(|rest| rest.strip_suffix('.'))
                .filter(|rest| !rest.is_empty())
        };
        match &self.target {
            Target::Host(h) => h == name,
            Target::OneLabel(s) => under(s).is_some_and(|rest| !rest.contains('.')),
            Target::AnyDepth(s) => under(s).is_some(),
            Target::Addr(_) => false,
        }
    }

    pub fn matches_addr(&self, ip: IpAddr, port: u16) -> bool {
        match &self.target {
            Target::Addr(net) => self.ports.contains(port) && net.contains(ip),
            _ => false,
        }
    }

    pub fn net(&self) -> Option<&Net> {
        match &self.target {
            Target::Addr(net) => Some(net),
            _ => None,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.text)
    }
}

const NAME: &str = "not a host name (letters, digits, '-' and '_' in dot-separated labels)";

/// `TARGET[:PORT]`, with IPv6 (bare, or bracketed with a port). None for
/// a bracket that does not close.
fn split_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        return match after {
            "" => Some((inside, None)),
            _ => Some((inside, Some(after.strip_prefix(':')?))),
        };
    }
    match s.matches(':').count() {
        0 => Some((s, None)),
        1 => s.split_once(':').map(|(t, p)| (t, Some(p))),
        // Bare IPv6, no port.
        _ => Some((s, None)),
    }
}

/// A host name, lowercased and without a trailing dot; None if it is not one.
pub fn host_name(s: &str) -> Option<String> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() || s.len() > 253 {
        return None;
    }
    let ok = s.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    ok.then(|| s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn names_and_wildcards_match_as_documented() {
        // (pattern, name, port, matches)
        let cases = [
            ("example.org", "example.org", 443, true),
            ("example.org", "example.org", 80, true),
            ("example.org", "example.org", 8443, false),
            ("example.org", "www.example.org", 443, false),
            ("example.org", "example.org.evil.test", 443, false),
            ("Example.ORG.", "example.org", 443, true),
            ("*.example.org", "www.example.org", 443, true),
            ("*.example.org", "a.b.example.org", 443, false),
            ("*.example.org", "example.org", 443, false),
            ("*.example.org", "wwwexample.org", 443, false),
            ("**.example.org", "www.example.org", 443, true),
            ("**.example.org", "a.b.c.example.org", 80, true),
            ("**.example.org", "example.org", 443, false),
            ("**.example.org", "badexample.org", 443, false),
            ("example.org:8443", "example.org", 8443, true),
            ("example.org:8443", "example.org", 443, false),
            ("example.org:*", "example.org", 22, true),
            ("*.example.org:*", "x.example.org", 1, true),
            ("10.0.0.0/8", "example.org", 443, false),
        ];
        for (pat, name, port, want) in cases {
            assert_eq!(
                p(pat).matches_name(name, port),
                want,
                "{pat} vs {name}:{port}"
            );
        }
    }

    #[test]
    fn addresses_and_ranges_match_as_documented() {
        let cases = [
            ("127.0.0.1", "127.0.0.1", 80, true),
            ("127.0.0.1", "127.0.0.2", 80, false),
            ("127.0.0.1", "127.0.0.1", 8080, false),
            ("127.0.0.1:8080", "127.0.0.1", 8080, true),
            ("127.0.0.1:*", "127.0.0.1", 9, true),
            ("127.0.0.1", "::ffff:127.0.0.1", 443, true),
            ("10.0.0.0/8", "10.9.8.7", 443, true),
            ("10.0.0.0/8:22", "10.9.8.7", 22, true),
            ("10.0.0.0/8:22", "10.9.8.7", 443, false),
            ("::1", "::1", 443, true),
            ("[::1]:8080", "::1", 8080, true),
            ("[::1]:8080", "::1", 443, false),
            ("fd00::/8", "fd12:3456::1", 80, true),
            ("[fd00::/8]:*", "fd12:3456::1", 5432, true),
            ("fd00::/8", "fe80::1", 80, false),
            ("example.org", "93.184.216.34", 443, false),
        ];
        for (pat, ip, port, want) in cases {
            assert_eq!(
                p(pat).matches_addr(ip.parse().unwrap(), port),
                want,
                "{pat} vs {ip}:{port}"
            );
        }
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        for bad in [
            "",
            "exa mple.org",
            "example.org:0",
            "example.org:65536",
            "example.org:http",
            "example.org:+1",
            "a.*.example.org",
            "*example.org",
            "***.example.org",
            "*.",
            "10.0.0.0/33",
            "10.0.0/8",
            "[::1",
            "[::1]8080",
            "ex@mple.org",
            "http://example.org",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} parsed");
        }
        let e = Pattern::parse("a.*.b").unwrap_err();
        assert!(e.to_string().contains("*.example.org"), "{e}");
    }
}
