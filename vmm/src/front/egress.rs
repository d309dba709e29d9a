//! `mvm run`'s egress options (docs/network.md): when they allow anything,
//! the host proxy (mvm-egress) is started for the run, the vsock device
//! serves its one guest port, and the command gets the proxy variables;
//! at the end, denials are said in one line.

use std::collections::HashSet;
use std::path::PathBuf;

use clap::Args;
use mvm_devices::virtio::vsock::GuestPort;
use mvm_protocol::{EGRESS_PROXY_PORT, EGRESS_VSOCK_PORT};

use super::{libexec_helper, secrets, setup_failure, Failure};
use crate::egress::{self, Egress};
use crate::session::SessionDir;

#[derive(Args, Debug, Default)]
pub struct EgressArgs {
    /// Let the command reach PATTERN through the host's egress proxy
    /// (repeatable): a host name, *.example.com (one label),
    /// **.example.com (any depth), an IP address or CIDR, with an optional
    /// :PORT (default 80 and 443). Without any, the VM has no way out
    #[arg(long = "allow", value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Refuse PATTERN even where --allow matches (repeatable; deny wins)
    #[arg(long = "deny", value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// The same rules from a file: TOML (allow = [...], deny = [...]) or
    /// JSON ({"allow": [...], "deny": [...]}), told apart by a .toml or
    /// .json name, else by a leading {
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Write the proxy's audit log (JSON Lines, one per connection) to FILE
    #[arg(long, value_name = "FILE")]
    pub net_log: Option<PathBuf>,
    /// Connections through the proxy open at once [default: 128]
    #[arg(long, value_name = "N")]
    pub net_max_connections: Option<u32>,
    /// New proxy connections accepted per second [default: 100]
    #[arg(long, value_name = "N")]
    pub net_rate: Option<u32>,
    /// Bytes through the proxy, both ways, all connections together
    /// (K, M, G suffixes) [default: 8G]
    #[arg(long, value_name = "SIZE")]
    pub net_max_bytes: Option<String>,
    /// Give the command $NAME as a random placeholder; the host proxy puts
    /// the real value (mvm's $NAME, or NAME=env:VAR, or NAME=file:PATH)
    /// into request headers to HOST only, over HTTPS it intercepts with a
    /// per-run CA the guest trusts. HOST[:PORT] (default 443), several
    /// separated by commas, each allowed implicitly (repeatable)
    #[arg(long = "secret", value_name = "NAME[=SOURCE]@HOST")]
    pub secret: Vec<String>,
    /// Trust FILE's certificates (PEM), besides the host's CA bundle, for
    /// the real servers behind --secret hosts (repeatable)
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
}

/// The proxy of a run, its guest port, and what the command gets from it.
pub(crate) struct Started {
    pub proxy: Egress,
    pub port: GuestPort,
    /// The proxy variables, and each secret's placeholder with the CA
    /// bundle variables.
    pub env: Vec<(String, String)>,
    /// Where the proxy writes its per-run CA (with secrets only).
    pub ca_cert: Option<PathBuf>,
}

impl EgressArgs {
    /// Whether the run allows any egress (a policy file might allow
    /// nothing; the proxy then refuses everything, visibly).
    pub fn wanted(&self) -> bool {
        !self.allow.is_empty() || self.policy.is_some() || !self.secret.is_empty()
    }

    /// Starts the proxy in the session directory, if the run wants one.
    /// `user_env`: the run's --env KEY=VALUE items (theirs win).
    pub(crate) fn start(
        &self,
        dir: &SessionDir,
        user_env: &[String],
    ) -> Result<Option<Started>, Failure> {
        if !self.wanted() {
            return Ok(None);
        }
        let user_keys: HashSet<String> = user_env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, _)| k.to_string())
            .collect();
        let user_keys = &user_keys;
        let limits = self.limits()?;
        let env_var = |name: &str| std::env::var(name).ok();
        let from_file = self
            .policy
            .as_deref()
            .map(secrets::from_policy_file)
            .unwrap_or_default();
        let secrets = self
            .secret
            .iter()
            .chain(&from_file)
            .map(|spec| secrets::parse(spec, &env_var))
            .collect::<Result<Vec<_>, _>>()
            .map_err(setup_failure)?;
        if let Some(why) = secrets::conflict(&secrets, user_keys) {
            return Err(setup_failure(why));
        }
        let json = secrets::to_json(&secrets);
        if json.len() > egress::MAX_SECRETS_BYTES {
            return Err(setup_failure(format!(
                "--secret: the secrets come to {} bytes, more than the {} the proxy takes",
                json.len(),
                egress::MAX_SECRETS_BYTES
            )));
        }
        for path in &self.upstream_ca {
            std::fs::metadata(path)
                .map_err(|e| setup_failure(format!("--upstream-ca {}: {e}", path.display())))?;
        }
        // A secret's hosts are allowed by binding it there.
        let mut allow = self.allow.clone();
        allow.extend(secrets.iter().flat_map(|b| b.hosts.iter().cloned()));
        let ca_cert = dir.path().join("egress-ca.pem");
        let binary = libexec_helper("MVM_EGRESS", "mvm-egress", "the egress proxy")?;
        let socket = dir.path().join("egress.sock");
        let log = self
            .net_log
            .clone()
            .unwrap_or_else(|| dir.path().join("net.log"));
        let run_id = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let proxy = egress::spawn(&egress::Request {
            binary: &binary,
            socket: &socket,
            log: &log,
            summary: &dir.path().join("net-summary.json"),
            stderr_log: &dir.path().join("egress.log"),
            run_id: &run_id,
            allow: &allow,
            deny: &self.deny,
            policy: self.policy.as_deref(),
            limits: &limits,
            secrets: (!secrets.is_empty()).then_some(egress::Secrets {
                json: &json,
                ca_cert: &ca_cert,
                upstream_ca: &self.upstream_ca,
            }),
        })
        .map_err(setup_failure)?;
        let mut env = Vec::new();
        add_proxy_env(&mut env, user_keys);
        if !secrets.is_empty() {
            secrets::add_env(&mut env, &secrets, user_keys);
        }
        Ok(Some(Started {
            proxy,
            port: GuestPort {
                port: EGRESS_VSOCK_PORT,
                socket,
            },
            env,
            ca_cert: (!secrets.is_empty()).then_some(ca_cert),
        }))
    }

    /// The limits given, as mvm-egress options, checked here so that a bad
    /// value is mvm's one line, not a proxy that never starts.
    fn limits(&self) -> Result<Vec<String>, Failure> {
        let mut out = Vec::new();
        if let Some(n) = self.net_max_connections {
            out.push(format!("--max-connections={n}"));
        }
        if let Some(n) = self.net_rate {
            out.push(format!("--conn-rate={n}"));
        }
        if let Some(size) = &self.net_max_bytes {
            let bytes = crate::config::parse_size(size).ok().filter(|&b| b > 0).ok_or_else(|| {
                setup_failure(format!(
                    "--net-max-bytes '{size}' is not a size above 0: use a number with an optional K, M or G suffix, e.g. 2G"
                ))
            })?;
            out.push(format!("--max-bytes={bytes}"));
        }
        Ok(out)
    }

    /// The line a run with denials ends with, and with --print-stats the
    /// counts.
    pub(crate) fn report(&self, proxy: &Egress, print_stats: bool) {
        let Some(c) = proxy.counts() else {
            return;
        };
        if print_stats {
            let mib = |n: u64| n as f64 / 1048576.0;
            eprintln!(
                "mvm: network: {} requests, {} allowed, {} denied, {} failed; {:.1} MiB up, {:.1} MiB down; proxy peak memory {:.1} MiB",
                c.requests,
                c.allowed,
                c.denied,
                c.errors,
                mib(c.bytes_up),
                mib(c.bytes_down),
                mib(c.peak_rss_kib << 10)
            );
        }
        if c.denied > 0 {
            let more = match c.denied_hosts_more {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            let see = match &self.net_log {
                Some(path) => format!("see {}", path.display()),
                None => "rerun with --net-log FILE for each request".into(),
            };
            eprintln!(
                "mvm: network: {} requests denied: {}{more} ({see})",
                c.denied,
                c.denied_hosts.join(", ")
            );
        }
    }
}

impl Started {
    /// Wires the proxy into the run: the vmm thread may connect guest
    /// connections to its socket, and the command gets its variables (an
    /// image's of the same names replaced). The proxy, its guest port and,
    /// with secrets, where its CA will be.
    pub(crate) fn attach(
        self,
        request: &mut mvm_protocol::ExecRequest,
    ) -> (Egress, GuestPort, Option<PathBuf>) {
        crate::confine::seccomp::allow_guest_connections();
        request.egress = true;
        for (name, value) in self.env {
            request.env.retain(|(n, _)| n != &name);
            request.env.push((name, value));
        }
        (self.proxy, self.port, self.ca_cert)
    }
}

/// The proxy's per-run CA (public; written before it was ready), for the
/// guest's trust store.
pub(crate) fn read_ca(path: &std::path::Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| {
        setup_failure(format!(
            "cannot read the egress proxy's CA {}: {e}",
            path.display()
        ))
    })
}

/// The proxy variables for the command, added to `env` unless the user
/// set them with --env (theirs win); an image's own values are replaced:
/// no other proxy is reachable anyway.
pub fn add_proxy_env(env: &mut Vec<(String, String)>, user_keys: &HashSet<String>) {
    let url = format!("http://127.0.0.1:{EGRESS_PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let java = format!(
        "-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={p} -Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort={p} -Dhttp.nonProxyHosts=localhost|127.0.0.1",
        p = EGRESS_PROXY_PORT
    );
    let vars = [
        ("HTTP_PROXY", url.clone()),
        ("HTTPS_PROXY", url.clone()),
        ("ALL_PROXY", url.clone()),
        ("http_proxy", url.clone()),
        ("https_proxy", url.clone()),
        ("all_proxy", url),
        ("NO_PROXY", no_proxy.clone()),
        ("no_proxy", no_proxy),
        // Node's fetch honours the variables only when asked.
        ("NODE_USE_ENV_PROXY", "1".into()),
        ("JAVA_TOOL_OPTIONS", java),
    ];
    for (name, value) in vars {
        if user_keys.contains(name) {
            continue;
        }
        env.retain(|(n, _)| n != name);
        env.push((name.to_string(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_variables_replace_the_images_but_not_the_users() {
        let mut env = vec![
            ("PATH".to_string(), "/bin".to_string()),
            (
                "HTTP_PROXY".to_string(),
                "http://image-proxy:8080".to_string(),
            ),
            ("HTTPS_PROXY".to_string(), "http://mine:1".to_string()),
        ];
        let user: HashSet<String> = ["HTTPS_PROXY".to_string()].into();
        add_proxy_env(&mut env, &user);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HTTP_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("HTTPS_PROXY"), Some("http://mine:1"));
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(get("NODE_USE_ENV_PROXY"), Some("1"));
        assert_eq!(env.iter().filter(|(n, _)| n == "HTTP_PROXY").count(), 1);
        assert_eq!(get("PATH"), Some("/bin"));
    }

    #[test]
    fn egress_is_wanted_only_when_something_may_be_allowed() {
        assert!(!EgressArgs::default().wanted());
        let deny_only = EgressArgs {
            deny: vec!["x.test".into()],
            ..EgressArgs::default()
        };
        assert!(!deny_only.wanted());
        let allow = EgressArgs {
            allow: vec!["x.test".into()],
            ..EgressArgs::default()
        };
        assert!(allow.wanted());
    }
}
