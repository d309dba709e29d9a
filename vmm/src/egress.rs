//! mvm-egress, the host side of controlled egress (docs/network.md), as a
//! helper process like virtiofsd: one per run that allows any egress,
//! started before the VM is built and killed with its process group when
//! `mvm run` ends.
//!
//! The VMM binds the proxy's Unix socket itself (the path the vsock device
//! connects each guest-initiated egress connection to) and hands it over
//! as fd 3, with the audit log on fd 4 and the summary file on fd 5, so
//! the proxy opens nothing by name but its policy file, and confines
//! itself (Landlock with no filesystem access, seccomp) before it serves.
//! Its environment is empty; it gets SIGKILL if mvm dies
//! (PR_SET_PDEATHSIG) and has a process group of its own.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::helper_log::{self, LogPump};

const LISTEN_FD: RawFd = 3;
const LOG_FD: RawFd = 4;
const SUMMARY_FD: RawFd = 5;
/// With secrets: the read end of a pipe holding them (docs/network.md,
/// "Secrets"), and the file the proxy writes its per-run CA to.
const SECRETS_FD: RawFd = 6;
const CA_CERT_FD: RawFd = 7;
/// The most secret bytes (JSON) handed over: they are written into the
/// pipe before the proxy starts, so they must fit its buffer.
pub const MAX_SECRETS_BYTES: usize = 48 << 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the egress proxy's socket {0}: {1}")]
    Socket(String, io::Error),
    #[error("cannot open the network log {0}: {1} (choose another --net-log FILE)")]
    Log(String, io::Error),
    #[error("cannot create the egress proxy's files in {0}: {1}")]
    Files(String, io::Error),
    #[error(
        "cannot start the egress proxy ({0}): {1}: run 'make', or set MVM_EGRESS to mvm-egress"
    )]
    Spawn(String, io::Error),
}

/// What the proxy enforces and where it writes.
pub struct Request<'a> {
    pub binary: &'a Path,
    /// Bound here; must not exist yet.
    pub socket: &'a Path,
    /// The JSON Lines audit log: --net-log, else one in the session dir.
    pub log: &'a Path,
    /// Rewritten by the proxy after every connection.
    pub summary: &'a Path,
    /// Its stderr, capped.
    pub stderr_log: &'a Path,
    pub run_id: &'a str,
    pub allow: &'a [String],
    pub deny: &'a [String],
    pub policy: Option<&'a Path>,
    /// Extra limit options, passed as they are (`--max-connections=N`...).
    pub limits: &'a [String],
    /// The secrets as mvm-egress reads them (a JSON array), if any, with
    /// the file for the run's CA and extra roots for the real servers.
    pub secrets: Option<Secrets<'a>>,
}

pub struct Secrets<'a> {
    pub json: &'a str,
    pub ca_cert: &'a Path,
    pub upstream_ca: &'a [PathBuf],
}

pub struct Egress {
    child: Child,
    summary: PathBuf,
    stderr_log: PathBuf,
    pump: Option<LogPump>,
}

/// How long the proxy may take to come up (under the TCG test host it is
/// tens of milliseconds; natively a few).
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long `finish` waits for the proxy to log what was open and exit
/// (it gives its connections 2 s itself; cutting them takes milliseconds).
const FINISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The proxy's arguments, apart from the binary.
pub fn arguments(req: &Request) -> Vec<String> {
    let mut args = vec![
        format!("--listen-fd={LISTEN_FD}"),
        format!("--log-fd={LOG_FD}"),
        format!("--summary-fd={SUMMARY_FD}"),
        format!("--run-id={}", req.run_id),
    ];
    args.extend(req.allow.iter().map(|p| format!("--allow={p}")));
    args.extend(req.deny.iter().map(|p| format!("--deny={p}")));
    if let Some(policy) = req.policy {
        args.push(format!("--policy={}", policy.display()));
    }
    args.extend(req.limits.iter().cloned());
    if let Some(s) = &req.secrets {
        args.push(format!("--secrets-fd={SECRETS_FD}"));
        args.push(format!("--ca-cert-fd={CA_CERT_FD}"));
        args.extend(
            s.upstream_ca
                .iter()
                .map(|p| format!("--upstream-ca={}", p.display())),
        );
    }
    args
}

/// A pipe holding `bytes`, its write end closed: the read end.
fn pipe_holding(bytes: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned here.
    let (read, write) = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            File::from_raw_fd(fds[1]),
        )
    };
    let mut write = write;
    io::Write::write_all(&mut write, bytes)?;
    Ok(read)
}

pub fn spawn(req: &Request) -> Result<Egress, Error> {
    let listener = UnixListener::bind(req.socket)
        .map_err(|e| Error::Socket(req.socket.display().to_string(), e))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(req.log)
        .map_err(|e| Error::Log(req.log.display().to_string(), e))?;
    let files = |e| Error::Files(req.summary.display().to_string(), e);
    let summary = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(req.summary)
        .map_err(files)?;
    let stderr_file = File::create(req.stderr_log).map_err(files)?;
    let (stderr, pump) = helper_log::pipe(stderr_file).map_err(files)?;
    let secrets = match &req.secrets {
        Some(s) => {
            let pipe = pipe_holding(s.json.as_bytes()).map_err(files)?;
            let ca = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o644)
                .open(s.ca_cert)
                .map_err(files)?;
            Some((pipe, ca))
        }
        None => None,
    };
    let mut fds = vec![
        (listener.as_raw_fd(), LISTEN_FD),
        (log.as_raw_fd(), LOG_FD),
        (summary.as_raw_fd(), SUMMARY_FD),
    ];
    if let Some((pipe, ca)) = &secrets {
        fds.push((pipe.as_raw_fd(), SECRETS_FD));
        fds.push((ca.as_raw_fd(), CA_CERT_FD));
    }
    let mut command = Command::new(req.binary);
    command
        .args(arguments(req))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .env_clear();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes system calls (dup2, fcntl, setpgid, prctl, getppid).
    unsafe {
        let parent = std::process::id() as libc::pid_t;
        command.pre_exec(move || child_setup(&fds, parent));
    }
    let child = command
        .spawn()
        .map_err(|e| Error::Spawn(req.binary.display().to_string(), e))?;
    // The proxy has its copies.
    drop((listener, log, summary, secrets));
    Ok(Egress {
        child,
        summary: req.summary.to_owned(),
        stderr_log: req.stderr_log.to_owned(),
        pump: Some(pump),
    })
}

/// In the child, before exec: the fds at their numbers (inheritable), a
/// process group of its own, death with the parent.
fn child_setup(fds: &[(RawFd, RawFd)], parent: libc::pid_t) -> io::Result<()> {
    let check = |ret: libc::c_int| {
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain syscalls on fds and ids this process owns. The fds are
    // first moved above the targets, so no dup2 overwrites a source.
    unsafe {
        let mut high = [0; 8];
        for (i, (from, _)) in fds.iter().enumerate().take(high.len()) {
            high[i] = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 10);
            check(high[i])?;
        }
        for (i, (_, to)) in fds.iter().enumerate() {
            check(libc::dup2(high[i], *to))?;
        }
    }
    crate::helper_process::own_group_and_die_with(parent)
}

/// What the proxy counted, from its summary file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub denied_hosts: Vec<String>,
    pub denied_hosts_more: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The proxy's peak resident memory, KiB.
    pub peak_rss_kib: u64,
}

/// Parses the proxy's summary (one JSON object).
pub fn parse_summary(text: &str) -> Option<Counts> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Some(Counts {
        requests: n("requests"),
        allowed: n("allowed"),
        denied: n("denied"),
        errors: n("errors"),
        denied_hosts: v["denied_hosts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        denied_hosts_more: n("denied_hosts_more"),
        bytes_up: n("bytes_up"),
        bytes_down: n("bytes_down"),
        peak_rss_kib: n("peak_rss_kib"),
    })
}

impl Egress {
    /// Its process group (its pid), the one the VMM kills at the end.
    pub fn process_group(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Waits until the proxy is serving: it writes its first summary once
    /// its policy is read and it is confined. A proxy that exits first (a
    /// policy file it cannot read or parse, say) is an error with its own
    /// last line, so a run never starts with a way out that is not there.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = std::time::Instant::now() + READY_TIMEOUT;
        loop {
            if std::fs::metadata(&self.summary).is_ok_and(|m| m.len() > 0) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                if let Some(pump) = &mut self.pump {
                    pump.drain();
                }
                let last = std::fs::read_to_string(&self.stderr_log)
                    .ok()
                    .and_then(|t| {
                        t.lines()
                            .rev()
                            .find(|l| !l.trim().is_empty())
                            .map(String::from)
                    });
                return Err(match last {
                    Some(line) => {
                        format!("the egress proxy did not start ({status}): {}", line.trim())
                    }
                    None => format!("the egress proxy did not start ({status})"),
                });
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "the egress proxy did not start within {} s",
                    READY_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    pub fn take_log_pump(&mut self) -> Option<LogPump> {
        self.pump.take()
    }

    /// The run is over: SIGTERM, upon which the proxy cuts each connection
    /// still open, logs it with its bytes, and exits; waited for at most
    /// `FINISH_TIMEOUT` (Drop kills it anyway). After this the log and
    /// the counts are complete.
    pub fn finish(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: signals the process group this process created
        // (allowed by the vmm thread's filter: `allow_ending_groups`).
        unsafe {
            libc::kill(-self.process_group(), libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + FINISH_TIMEOUT;
        while std::time::Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The counts so far (the proxy rewrites them after each connection).
    pub fn counts(&self) -> Option<Counts> {
        parse_summary(&std::fs::read_to_string(&self.summary).ok()?)
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        crate::helper_process::end_group(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_goes_on_the_command_line_and_the_fds_are_fixed() {
        let args = arguments(&Request {
            binary: Path::new("mvm-egress"),
            socket: Path::new("/run/egress.sock"),
            log: Path::new("/run/net.log"),
            summary: Path::new("/run/summary.json"),
            stderr_log: Path::new("/run/egress.err"),
            run_id: "mvm-1-2",
            allow: &["example.org".into(), "**.example.net:8443".into()],
            deny: &["bad.example.org".into()],
            policy: Some(Path::new("/etc/policy.json")),
            limits: &["--max-connections=8".into()],
            secrets: None,
        });
        assert_eq!(
            args,
            [
                "--listen-fd=3",
                "--log-fd=4",
                "--summary-fd=5",
                "--run-id=mvm-1-2",
                "--allow=example.org",
                "--allow=**.example.net:8443",
                "--deny=bad.example.org",
                "--policy=/etc/policy.json",
                "--max-connections=8"
            ]
        );
    }

    #[test]
    fn summaries_parse() {
        let c = parse_summary(
            r#"{"requests":3,"allowed":1,"denied":2,"errors":0,"denied_hosts":["a.test:443","b.test:80"],"denied_hosts_more":0,"bytes_up":1,"bytes_down":2,"log_errors":0,"peak_rss_kib":5300}"#,
        )
        .unwrap();
        assert_eq!((c.requests, c.allowed, c.denied), (3, 1, 2));
        assert_eq!((c.bytes_up, c.bytes_down, c.peak_rss_kib), (1, 2, 5300));
        assert_eq!(c.denied_hosts, ["a.test:443", "b.test:80"]);
        assert!(parse_summary("not json").is_none());
    }
}
