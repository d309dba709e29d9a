//! The command line, and turning it into an open, configured proxy: all
//! files are read or opened here, before confinement.

use std::fs::{File, OpenOptions};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::intercept::Intercept;
use crate::limits::{parse_duration, parse_size, Limits};
use crate::policy::Policy;
use crate::resolve::{self, Resolver};
use crate::secrets::Secrets;
use crate::tls::Tls;

#[derive(Debug, Parser)]
#[command(
    name = "mvm-egress",
    about = "mvm's egress proxy: HTTP CONNECT and plain HTTP over a Unix socket, filtered by an allowlist",
    version
)]
pub struct Args {
    /// Unix socket to create and listen on (must not exist).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "listen_fd",
        required_unless_present = "listen_fd"
    )]
    pub listen: Option<PathBuf>,
    /// An inherited, already listening Unix socket.
    #[arg(long, value_name = "FD")]
    pub listen_fd: Option<RawFd>,
    /// Allow a host, `*.domain` (one label), `**.domain` (any depth), an
    /// address or range; `:PORT` or `:*` (default 80 and 443). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Deny the same kinds of pattern; deny wins. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// A policy file, added to the flags: TOML (allow = [...], deny = [...])
    /// or JSON ({"allow": [...], "deny": [...]}), by its name (.toml, .json)
    /// or else by its first character.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The JSON Lines request log, appended to (created 0600).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "log_fd",
        required_unless_present = "log_fd"
    )]
    pub log: Option<PathBuf>,
    /// The request log as an inherited fd (opened for writing, O_APPEND).
    #[arg(long, value_name = "FD")]
    pub log_fd: Option<RawFd>,
    /// A file kept holding the run's summary (one JSON object).
    #[arg(long, value_name = "PATH", conflicts_with = "summary_fd")]
    pub summary: Option<PathBuf>,
    /// The summary file as an inherited fd (a regular file, for writing).
    #[arg(long, value_name = "FD")]
    pub summary_fd: Option<RawFd>,
    /// The run's id, copied into every log line.
    #[arg(long, value_name = "ID", default_value = "")]
    pub run_id: String,
    /// Resolve NAME to ADDR without DNS (like curl's --resolve). Repeatable.
    #[arg(long, value_name = "NAME=ADDR")]
    pub resolve: Vec<String>,
    /// DNS server to ask instead of /etc/resolv.conf's. Repeatable.
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub nameserver: Vec<String>,
    /// Do not read /etc/hosts.
    #[arg(long)]
    pub no_hosts_file: bool,
    /// Connections open at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// New connections accepted per second.
    #[arg(long, value_name = "N", default_value_t = Limits::default().conn_rate)]
    pub conn_rate: u32,
    /// Bytes both ways, all connections together (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "8G", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Largest request head.
    #[arg(long, value_name = "SIZE", default_value = "16K", value_parser = parse_size)]
    pub max_header_bytes: u64,
    /// Time to send a complete request head.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: std::time::Duration,
    /// A connection with no bytes either way for this long is closed.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// Time to connect to the server (then 504).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: std::time::Duration,
    /// Time for a DNS answer (then 502).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub dns_timeout: std::time::Duration,
    /// Secrets to swap in for their placeholders (docs/network.md,
    /// "Secrets"): a JSON array [{"name", "placeholder", "value",
    /// "hosts": ["host:port", ...]}] on an inherited fd (a pipe: what mvm
    /// uses, so that no value is ever in a file or on a command line).
    #[arg(long, value_name = "FD")]
    pub secrets_fd: Option<RawFd>,
    /// The same from a file (for tests and by hand).
    #[arg(long, value_name = "PATH", conflicts_with = "secrets_fd")]
    pub secrets_file: Option<PathBuf>,
    /// Extra trusted roots (PEM) for the real servers of intercepted
    /// hosts, besides the host's CA bundle. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
    /// Where to write the run's CA certificate (PEM; public: the guest
    /// trusts it); its key never leaves the proxy.
    #[arg(long, value_name = "PATH", conflicts_with = "ca_cert_fd")]
    pub ca_cert: Option<PathBuf>,
    /// The same as an inherited fd (a regular file, for writing).
    #[arg(long, value_name = "FD")]
    pub ca_cert_fd: Option<RawFd>,
    /// Run without Landlock (for kernels without it).
    #[arg(long)]
    pub no_landlock: bool,
    /// Run without the seccomp filter (for debugging only).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Tests only: once confined, try to open PATH, say how it went on
    /// stderr, and exit (a forbidden call ends the process instead).
    #[arg(long, value_name = "PATH", hide = true)]
    pub confinement_probe: Option<PathBuf>,
}

/// Everything open and read: what `main` confines and then runs.
pub struct Setup {
    pub policy: Policy,
    pub resolver: Resolver,
    pub limits: Limits,
    pub listener: UnixListener,
    pub log: File,
    pub summary: Option<File>,
    pub intercept: Option<Intercept>,
}

pub fn setup(args: &Args) -> Result<Setup, String> {
    let mut policy = Policy::from_args(&args.allow, &args.deny).map_err(|e| e.to_string())?;
    if let Some(p) = &args.policy {
        policy.add_file(p).map_err(|e| e.to_string())?;
    }
    let resolver = resolver(args)?;
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        conn_rate: args.conn_rate.max(1),
        max_bytes: args.max_bytes,
        max_header_bytes: usize::try_from(args.max_header_bytes).unwrap_or(usize::MAX),
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        connect_timeout: args.connect_timeout,
        dns_timeout: args.dns_timeout,
    };
    let log = match (&args.log, args.log_fd) {
        (Some(p), _) => open_for_writing(p, true)
            .map_err(|e| format!("cannot open the log {}: {e}", p.display()))?,
        (None, Some(fd)) => inherited(fd, "--log-fd")?,
        (None, None) => return Err("give --log PATH or --log-fd FD".into()),
    };
    let summary = match (&args.summary, args.summary_fd) {
        (Some(p), _) => Some(
            open_for_writing(p, false)
                .map_err(|e| format!("cannot open the summary {}: {e}", p.display()))?,
        ),
        (None, Some(fd)) => Some(inherited(fd, "--summary-fd")?),
        (None, None) => None,
    };
    let listener = match (&args.listen, args.listen_fd) {
        (Some(p), _) => UnixListener::bind(p).map_err(|e| {
            format!(
                "cannot listen on {}: {e} (remove a stale socket first)",
                p.display()
            )
        })?,
        (None, Some(fd)) => {
            UnixListener::from(std::os::fd::OwnedFd::from(inherited(fd, "--listen-fd")?))
        }
        (None, None) => return Err("give --listen PATH or --listen-fd FD".into()),
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot use the listening socket: {e}"))?;
    let intercept = intercept(args)?;
    Ok(Setup {
        policy,
        resolver,
        limits,
        listener,
        log,
        summary,
        intercept,
    })
}

/// The secrets, the run's CA and the TLS configurations, when any secret
/// is given; the CA's certificate is written out for mvm to give the guest.
fn intercept(args: &Args) -> Result<Option<Intercept>, String> {
    let secrets = match (&args.secrets_file, args.secrets_fd) {
        (Some(p), _) => Secrets::from_json(
            &std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
        )?,
        (None, Some(fd)) => {
            let file = inherited(fd, "--secrets-fd")?;
            Secrets::from_fd(std::os::fd::IntoRawFd::into_raw_fd(file))?
        }
        (None, None) => return Ok(None),
    };
    if secrets.is_empty() {
        return Ok(None);
    }
    let mut hosts: Vec<String> = secrets
        .hosts()
        .iter()
        .map(|t| {
            t.rsplit_once(':')
                .map_or(t.as_str(), |(h, _)| h)
                .to_string()
        })
        .collect();
    hosts.dedup();
    let tls = Tls::new(&hosts, &args.upstream_ca)?;
    let mut out = match (&args.ca_cert, args.ca_cert_fd) {
        (Some(p), _) => open_for_writing(p, false)
            .map_err(|e| format!("cannot write the CA certificate {}: {e}", p.display()))?,
        (None, Some(fd)) => inherited(fd, "--ca-cert-fd")?,
        (None, None) => return Err("secrets need --ca-cert PATH or --ca-cert-fd FD".into()),
    };
    std::io::Write::write_all(&mut out, tls.ca_pem.as_bytes())
        .map_err(|e| format!("cannot write the CA certificate: {e}"))?;
    Ok(Some(Intercept { secrets, tls }))
}

fn resolver(args: &Args) -> Result<Resolver, String> {
    let nameservers = if args.nameserver.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        resolve::parse_resolv_conf(&text)
    } else {
        args.nameserver
            .iter()
            .map(|s| {
                s.parse::<SocketAddr>()
                    .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .map_err(|_| {
                        format!("bad --nameserver '{s}': use ADDR, ADDR:PORT or [ADDR]:PORT")
                    })
            })
            .collect::<Result<_, _>>()?
    };
    let mut fixed = if args.no_hosts_file {
        Default::default()
    } else {
        resolve::parse_hosts(&std::fs::read_to_string("/etc/hosts").unwrap_or_default())
    };
    for entry in &args.resolve {
        let bad =
            || format!("bad --resolve '{entry}': use NAME=ADDR, e.g. api.example.org=192.0.2.1");
        let (name, addr) = entry.split_once('=').ok_or_else(bad)?;
        let name = crate::pattern::host_name(name).ok_or_else(bad)?;
        let ip: IpAddr = addr.parse().map_err(|_| bad())?;
        // --resolve replaces what /etc/hosts says for the name.
        fixed.insert(name, vec![ip]);
    }
    Ok(Resolver {
        fixed,
        nameservers,
        timeout: args.dns_timeout,
    })
}

fn open_for_writing(p: &Path, append: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).mode(0o600);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    o.open(p)
}

/// An fd the caller passed down, checked to be open, and kept from any
/// child (the proxy starts none, but the fd is ours now).
fn inherited(fd: RawFd, flag: &str) -> Result<File, String> {
    // SAFETY: fcntl on an integer fd only queries or sets its flags.
    let ok = fd > 2 && unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == 0;
    if !ok {
        return Err(format!("{flag} {fd}: not an open file descriptor above 2"));
    }
    // SAFETY: fd is open (checked) and handed to this process to own.
    Ok(unsafe { File::from_raw_fd(fd) })
}
