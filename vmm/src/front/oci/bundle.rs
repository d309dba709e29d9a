//! A bundle's `config.json` (OCI runtime spec) as the `mvm run` options
//! that run it: the root directory, the process, the mounts a VM can
//! honour and the machine's size. What a VM cannot honour is refused with
//! the reason, or left out where the spec lets a runtime ignore it; both
//! lists are in docs/kubernetes.md.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{PosixRlimitType, Process, Spec};

/// Guest memory when `linux.resources.memory.limit` is absent: `mvm run`'s
/// own default.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
/// The least memory the guest kernel boots with (`--memory`'s floor).
const MIN_MEMORY_MIB: u64 = 64;
/// The most vCPUs `--cpus` takes.
const MAX_CPUS: u64 = 32;

/// Mount destinations the guest provides itself (guest-init mounts
/// them): the bundle's entries for them are left out.
const GUEST_OWN: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/dev/pts",
    "/dev/shm",
    "/dev/mqueue",
    "/sys/fs/cgroup",
];
/// Mount types the guest provides itself, wherever they are asked for.
const GUEST_OWN_TYPES: &[&str] = &["proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("cannot read {0}: {1}")]
    Config(String, String),
    #[error("unsupported ociVersion {0:?}: mvm supports runtime spec 1.x")]
    Version(String),
    #[error("config.json has no root: set root.path to the container's root filesystem")]
    NoRoot,
    #[error("root.path {0} is not a directory")]
    RootNotADirectory(String),
    #[error("config.json has no process, or its args are empty: there is nothing to run")]
    NoProcess,
    #[error("process.cwd {0:?} must be an absolute path")]
    RelativeCwd(String),
    #[error("process.env entry {0:?} is not KEY=VALUE")]
    BadEnv(String),
    #[error("process.terminal is true but no --console-socket was given")]
    NoConsoleSocket,
    #[error("hooks are not supported: mvm runs the container in its own kernel, where host hooks cannot act on it")]
    Hooks,
    #[error("mount at {0}: type {1:?} is not supported (bind mounts of directories, tmpfs and the guest's own proc, sys and dev are)")]
    MountType(String, String),
    #[error("mount at {0}: source {1} does not exist")]
    MountSource(String, String),
    #[error("hostname {0:?}: {1}")]
    Hostname(String, mvm_protocol::HostnameProblem),
}

/// What `mvm run` is asked to do for the bundle.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The root filesystem, absolute.
    pub rootfs: PathBuf,
    /// `mvm run`'s options and the command after `--`.
    pub run_args: Vec<String>,
    pub terminal: bool,
}

/// Loads `bundle/config.json` and plans the run. `console_socket`: whether
/// the caller gave one (a terminal needs it).
pub fn plan(bundle: &Path, console_socket: bool) -> Result<Plan, Error> {
    let path = bundle.join("config.json");
    let spec =
        Spec::load(&path).map_err(|e| Error::Config(path.display().to_string(), e.to_string()))?;
    plan_spec(&spec, bundle, console_socket)
}

fn plan_spec(spec: &Spec, bundle: &Path, console_socket: bool) -> Result<Plan, Error> {
    if !spec.version().starts_with("1.") {
        return Err(Error::Version(spec.version().clone()));
    }
    if spec.hooks().as_ref().is_some_and(|h| !hooks_empty(h)) {
        return Err(Error::Hooks);
    }
    let root = spec.root().as_ref().ok_or(Error::NoRoot)?;
    let rootfs = bundle.join(root.path());
    if !rootfs.is_dir() {
        return Err(Error::RootNotADirectory(rootfs.display().to_string()));
    }
    let process = spec.process().as_ref().ok_or(Error::NoProcess)?;
    let guest = process_plan(process)?;
    if guest.terminal && !console_socket {
        return Err(Error::NoConsoleSocket);
    }
    let mut run: Vec<String> = vec![
        "--rootfs".into(),
        rootfs.display().to_string(),
        "--no-workspace".into(),
        // The container's stdin is whatever the shim gave: forwarded.
        "--interactive".into(),
        // `mvm oci exec` joins the container's VM (docs/kubernetes.md).
        "--serve-exec".into(),
    ];
    if guest.terminal {
        run.push("--tty".into());
    }
    let (memory_mib, cpus) = size(spec);
    run.extend(["--memory".into(), format!("{memory_mib}M")]);
    run.extend(["--cpus".into(), cpus.to_string()]);
    run.extend(["--workdir".into(), guest.cwd]);
    if let Some(name) = spec.hostname().as_deref().filter(|n| !n.is_empty()) {
        mvm_protocol::check_hostname(name)
            .map_err(|problem| Error::Hostname(name.to_string(), problem))?;
        run.extend(["--hostname".into(), name.to_string()]);
    }
    run.extend(["--user".into(), guest.user]);
    for (key, value) in &guest.env {
        run.extend(["--env".into(), format!("{key}={value}")]);
    }
    for limit in process.rlimits().iter().flatten() {
        // The one limit mvm sets in the guest; the others keep the guest
        // kernel's defaults (docs/kubernetes.md).
        if limit.typ() == PosixRlimitType::RlimitNproc {
            run.extend(["--max-procs".into(), limit.soft().max(1).to_string()]);
        }
    }
    for (source, destination, read_only) in bind_mounts(spec, bundle)? {
        let mode = if read_only { "ro" } else { "rw" };
        run.extend([
            "--mount".into(),
            format!("{}:{destination}:{mode}", source.display()),
        ]);
    }
    run.push("--".into());
    run.extend(guest.argv);
    Ok(Plan {
        rootfs,
        run_args: run,
        terminal: guest.terminal,
    })
}

/// A runtime-spec process (config.json's, or an exec's process.json) as
/// the guest runs it.
#[derive(Debug, PartialEq, Eq)]
pub struct ProcessPlan {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Absolute.
    pub cwd: String,
    /// `UID:GID`, as `--user` takes it.
    pub user: String,
    pub terminal: bool,
    /// The pty's rows and columns (`consoleSize`), if given.
    pub size: Option<(u16, u16)>,
}

pub fn process_plan(process: &Process) -> Result<ProcessPlan, Error> {
    let argv = process
        .args()
        .clone()
        .filter(|a| !a.is_empty())
        .ok_or(Error::NoProcess)?;
    let cwd = process.cwd().display().to_string();
    if !cwd.starts_with('/') {
        return Err(Error::RelativeCwd(cwd));
    }
    let mut env = Vec::new();
    for item in process.env().iter().flatten() {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => env.push((key.to_string(), value.to_string())),
            _ => return Err(Error::BadEnv(item.clone())),
        }
    }
    let user = process.user();
    let size = process.console_size().map(|b| {
        let clamp = |n: u64| u16::try_from(n).unwrap_or(u16::MAX);
        (clamp(b.height()), clamp(b.width()))
    });
    Ok(ProcessPlan {
        argv,
        env,
        cwd,
        user: format!("{}:{}", user.uid(), user.gid()),
        terminal: process.terminal().unwrap_or(false),
        size,
    })
}

/// An exec's process.json (runtime spec `process`).
pub fn load_process(path: &Path) -> Result<ProcessPlan, Error> {
    let text = std::fs::read(path)
        .map_err(|e| Error::Config(path.display().to_string(), e.to_string()))?;
    let process: Process = serde_json::from_slice(&text)
        .map_err(|e| Error::Config(path.display().to_string(), e.to_string()))?;
    process_plan(&process)
}

fn hooks_empty(hooks: &oci_spec::runtime::Hooks) -> bool {
    let none = |h: &Option<Vec<oci_spec::runtime::Hook>>| h.as_ref().is_none_or(Vec::is_empty);
    #[allow(deprecated)]
    let prestart = hooks.prestart();
    none(prestart)
        && none(hooks.create_runtime())
        && none(hooks.create_container())
        && none(hooks.start_container())
        && none(hooks.poststart())
        && none(hooks.poststop())
}

/// Guest memory in MiB and vCPUs from `linux.resources`: the memory limit
/// rounded up to a MiB (at least the guest's floor), the CPU quota over
/// its period rounded up (1 to 32); absent, `mvm run`'s defaults.
fn size(spec: &Spec) -> (u64, u64) {
    let resources = spec.linux().as_ref().and_then(|l| l.resources().as_ref());
    let memory = resources
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.limit())
        .filter(|&l| l > 0)
        .map(|l| (l as u64).div_ceil(1 << 20).max(MIN_MEMORY_MIB))
        .unwrap_or(DEFAULT_MEMORY_MIB);
    let cpus = resources
        .and_then(|r| r.cpu().as_ref())
        .and_then(|c| Some((c.quota()?, c.period()?)))
        .filter(|&(quota, period)| quota > 0 && period > 0)
        .map(|(quota, period)| (quota as u64).div_ceil(period).clamp(1, MAX_CPUS))
        .unwrap_or(1);
    (memory, cpus)
}

/// The bundle's bind mounts of directories, as (source, destination,
/// read-only). The guest's own file systems and tmpfs (the guest's /tmp,
/// /run and /dev/shm are tmpfs already) are left out; a bind mount of a
/// file (containerd's /etc/hosts, /etc/resolv.conf) is left out too, since
/// mvm shares directories and the guest has no network to resolve with.
fn bind_mounts(spec: &Spec, bundle: &Path) -> Result<Vec<(PathBuf, String, bool)>, Error> {
    let mut binds = Vec::new();
    for mount in spec.mounts().iter().flatten() {
        let destination = mount.destination().display().to_string();
        let typ = mount.typ().clone().unwrap_or_default();
        let options = mount.options().clone().unwrap_or_default();
        let bind = typ == "bind" || options.iter().any(|o| o == "bind" || o == "rbind");
        if !bind {
            if GUEST_OWN.contains(&destination.as_str())
                || GUEST_OWN_TYPES.contains(&typ.as_str())
                || typ == "tmpfs"
            {
                continue;
            }
            return Err(Error::MountType(destination, typ));
        }
        let source = mount
            .source()
            .as_ref()
            .map(|s| bundle.join(s))
            .unwrap_or_default();
        if !source.exists() {
            return Err(Error::MountSource(
                destination,
                source.display().to_string(),
            ));
        }
        if !source.is_dir() {
            continue;
        }
        binds.push((source, destination, options.iter().any(|o| o == "ro")));
    }
    Ok(binds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch bundle with a rootfs directory and `config` as its
    /// config.json.
    fn bundle(name: &str, config: &serde_json::Value) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mvm-oci-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rootfs")).unwrap();
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(dir.join("hosts"), "").unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        dir
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": {
                "args": ["sh", "-c", "echo hi"],
                "env": ["PATH=/bin", "A=b=c"],
                "cwd": "/",
                "user": {"uid": 0, "gid": 0},
                "rlimits": [{"type": "RLIMIT_NPROC", "hard": 100, "soft": 50}]
            },
            "hostname": "web-1",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
                {"destination": "/etc/hosts", "type": "bind", "source": "hosts", "options": ["rbind", "ro"]},
                {"destination": "/data", "type": "bind", "source": "data", "options": ["rbind", "ro"]}
            ],
            "linux": {"resources": {
                "memory": {"limit": 268435457i64},
                "cpu": {"quota": 150000i64, "period": 100000u64}
            }}
        })
    }

    #[test]
    fn a_bundle_becomes_the_run_options() {
        let dir = bundle("plan", &base());
        let plan = plan(&dir, false).unwrap();
        let root = dir.join("rootfs").display().to_string();
        let data = format!("{}:/data:ro", dir.join("data").display());
        let want: Vec<String> = [
            "--rootfs",
            &root,
            "--no-workspace",
            "--interactive",
            "--serve-exec",
            "--memory",
            "257M",
            "--cpus",
            "2",
            "--workdir",
            "/",
            "--hostname",
            "web-1",
            "--user",
            "0:0",
            "--env",
            "PATH=/bin",
            "--env",
            "A=b=c",
            "--max-procs",
            "50",
            "--mount",
            &data,
            "--",
            "sh",
            "-c",
            "echo hi",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(plan.run_args, want);
        assert!(!plan.terminal);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_exec_s_process_json_is_what_the_guest_runs() {
        let dir = std::env::temp_dir().join(format!("mvm-oci-process-{}", std::process::id()));
        let path = dir.join("process.json");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            &path,
            serde_json::json!({
                "args": ["sh", "-c", "echo in"],
                "env": ["PATH=/bin", "X=1=2"],
                "cwd": "/srv",
                "user": {"uid": 1000, "gid": 100},
                "terminal": true,
                "consoleSize": {"height": 30, "width": 100}
            })
            .to_string(),
        )
        .unwrap();
        let plan = load_process(&path).unwrap();
        assert_eq!(
            plan,
            ProcessPlan {
                argv: vec!["sh".into(), "-c".into(), "echo in".into()],
                env: vec![("PATH".into(), "/bin".into()), ("X".into(), "1=2".into())],
                cwd: "/srv".into(),
                user: "1000:100".into(),
                terminal: true,
                size: Some((30, 100)),
            }
        );
        std::fs::write(
            &path,
            r#"{"args": [], "cwd": "/", "user": {"uid": 0, "gid": 0}}"#,
        )
        .unwrap();
        assert_eq!(load_process(&path), Err(Error::NoProcess));
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(load_process(&path), Err(Error::Config(..))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn defaults_without_resources() {
        let mut config = base();
        config["linux"] = serde_json::json!({});
        config["hostname"] = "".into();
        let dir = bundle("defaults", &config);
        let plan = plan(&dir, false).unwrap();
        let at = |flag: &str| {
            let i = plan.run_args.iter().position(|a| a == flag).unwrap();
            plan.run_args[i + 1].clone()
        };
        assert_eq!(at("--memory"), "512M");
        assert_eq!(at("--cpus"), "1");
        // No hostname (or an empty one): the guest's own default.
        assert!(!plan.run_args.iter().any(|a| a == "--hostname"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_bundles_say_what_is_wrong() {
        type Change = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Change, Error)> = vec![
            (
                "version",
                Box::new(|c| c["ociVersion"] = "2.0.0".into()),
                Error::Version("2.0.0".into()),
            ),
            (
                "noroot",
                Box::new(|c| c["root"] = serde_json::Value::Null),
                Error::NoRoot,
            ),
            (
                "noargs",
                Box::new(|c| c["process"]["args"] = serde_json::json!([])),
                Error::NoProcess,
            ),
            (
                "cwd",
                Box::new(|c| c["process"]["cwd"] = "rel".into()),
                Error::RelativeCwd("rel".into()),
            ),
            (
                "env",
                Box::new(|c| c["process"]["env"] = serde_json::json!(["NOEQUALS"])),
                Error::BadEnv("NOEQUALS".into()),
            ),
            (
                "tty",
                Box::new(|c| c["process"]["terminal"] = true.into()),
                Error::NoConsoleSocket,
            ),
            (
                "hooks",
                Box::new(|c| {
                    c["hooks"] = serde_json::json!({"poststart": [{"path": "/bin/true"}]})
                }),
                Error::Hooks,
            ),
            (
                "mounttype",
                Box::new(|c| {
                    c["mounts"] =
                        serde_json::json!([{"destination": "/x", "type": "nfs", "source": "s"}])
                }),
                Error::MountType("/x".into(), "nfs".into()),
            ),
            (
                "hostname",
                Box::new(|c| c["hostname"] = "web 1".into()),
                Error::Hostname("web 1".into(), mvm_protocol::HostnameProblem::Label),
            ),
        ];
        for (name, change, want) in cases {
            let mut config = base();
            change(&mut config);
            let dir = bundle(name, &config);
            assert_eq!(plan(&dir, false), Err(want), "{name}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // A missing rootfs directory, a missing bind source, a malformed
        // and a missing config.json.
        let dir = bundle("norootfs", &base());
        std::fs::remove_dir_all(dir.join("rootfs")).unwrap();
        assert!(matches!(
            plan(&dir, false),
            Err(Error::RootNotADirectory(_))
        ));
        std::fs::create_dir(dir.join("rootfs")).unwrap();
        std::fs::remove_dir_all(dir.join("data")).unwrap();
        assert!(matches!(plan(&dir, false), Err(Error::MountSource(d, _)) if d == "/data"));
        std::fs::write(dir.join("config.json"), "{not json").unwrap();
        assert!(matches!(plan(&dir, false), Err(Error::Config(..))));
        std::fs::remove_file(dir.join("config.json")).unwrap();
        assert!(matches!(plan(&dir, false), Err(Error::Config(..))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
