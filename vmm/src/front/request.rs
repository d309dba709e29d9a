//! What `mvm run` asks of the guest: the image root's disk and the exec
//! request (command, environment, working directory, identity), built
//! from the options and the image's config before anything starts.

use std::fs::File;
use std::path::PathBuf;

use mvm_image::ImageConfig;
use mvm_protocol::boot::{MountParam, RootLower, RootParam};
use mvm_protocol::{ExecRequest, Setup, SETUP_ENTROPY_BYTES};

use super::run::RunArgs;
use super::{setup_failure, Failure};
use crate::config::{RootDisk, VmConfig, ROOT_GUEST_PATH};
use crate::session::{self, terminal};
use crate::shares::WORKSPACE_GUEST_PATH;

/// The image root's writable layer: `--scratch`, else half of the
/// guest's memory; refused without a root to write to.
pub(super) fn scratch_bytes(
    has_root: bool,
    scratch: Option<&str>,
    mem_size: u64,
) -> Result<Option<u64>, Failure> {
    match (has_root, scratch) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(setup_failure(
            "--scratch sizes the image root's writable layer: use it with --image or --rootfs",
        )),
        (true, None) => Ok(Some(mem_size / 2)),
        (true, Some(text)) => match crate::config::parse_size(text) {
            Ok(n) if n >= crate::config::MIB => Ok(Some(n)),
            _ => Err(setup_failure(format!(
                "--scratch '{text}' is not a size of at least 1M (e.g. 512M or 2G)"
            ))),
        },
    }
}

/// The image root's disk, its file checked readable before anything is
/// started.
pub(super) fn root_disk(path: PathBuf, scratch_bytes: u64) -> Result<RootDisk, Failure> {
    File::open(&path).map_err(|e| {
        setup_failure(format!(
            "cannot read the root image {}: {e} (pass an EROFS image file or a directory to --rootfs)",
            path.display()
        ))
    })?;
    Ok(RootDisk {
        path,
        scratch_bytes,
    })
}

/// What the guest mounts before the command: the root disk and the
/// shares `config` attaches, with fresh entropy (the clock is read when
/// the request is sent).
pub(super) fn machine_setup(config: &VmConfig) -> Result<Setup, Failure> {
    let root_share = config
        .shares
        .iter()
        .find(|s| s.guest_path == ROOT_GUEST_PATH);
    let root = match (&config.root_disk, &config.root_dir, root_share) {
        (Some(disk), _, _) => Some(RootParam {
            lower: RootLower::Disk,
            scratch_bytes: disk.scratch_bytes,
        }),
        (None, Some(dir), Some(share)) => Some(RootParam {
            lower: RootLower::Share(share.tag.clone()),
            scratch_bytes: dir.scratch_bytes,
        }),
        (None, Some(_), None) => {
            return Err(setup_failure(
                "internal error: a directory root without its share",
            ))
        }
        (None, None, _) => None,
    };
    let mounts: Vec<MountParam> = config
        .shares
        .iter()
        .filter(|s| s.guest_path != ROOT_GUEST_PATH)
        .map(|s| MountParam {
            tag: s.tag.clone(),
            read_only: s.read_only,
            path: s.guest_path.as_bytes().to_vec(),
        })
        .collect();
    let mut entropy = [0u8; SETUP_ENTROPY_BYTES];
    // SAFETY: entropy is valid for writes of its length.
    let n = unsafe { libc::getrandom(entropy.as_mut_ptr().cast(), entropy.len(), 0) };
    if n != entropy.len() as isize {
        return Err(setup_failure(format!(
            "cannot read the host's random source: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut setup = Setup::new(root.as_ref(), &mounts, 0, &entropy);
    setup.upper_on_disk = root.is_some() && config.sandbox_disk.is_some();
    Ok(setup)
}

/// The caller's login name for the guest's /etc/passwd: $USER or
/// $LOGNAME when it is a portable user name, else "user".
fn login_name() -> String {
    let portable = |name: &str| {
        (1..=32).contains(&name.len())
            && name.bytes().enumerate().all(|(i, b)| {
                b.is_ascii_lowercase() || b == b'_' || (i > 0 && (b.is_ascii_digit() || b == b'-'))
            })
    };
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|n| portable(n) && n != "root")
        .unwrap_or_else(|| "user".into())
}

/// What the guest agent is asked to run. With an image, its Env comes
/// first (--env wins), and its WorkingDir is the default when no
/// workspace is shared (with one, /workspace is: the project is where a
/// command expects to start).
pub(super) fn exec_request(
    args: &RunArgs,
    argv: Vec<String>,
    workspace: bool,
    image_root: bool,
    image: Option<&ImageConfig>,
) -> Result<ExecRequest, Failure> {
    let mut env = image.map(super::image::env).unwrap_or_default();
    for item in &args.command.env {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => env.push((key.to_string(), value.to_string())),
            _ => return Err(setup_failure(format!("--env '{item}' is not KEY=VALUE"))),
        }
    }
    let image_workdir = image
        .and_then(|c| c.working_dir.as_deref())
        .filter(|d| d.starts_with('/'));
    let default_workdir = match (workspace, image_workdir) {
        (true, _) => WORKSPACE_GUEST_PATH,
        (false, Some(dir)) => dir,
        (false, None) => "/",
    };
    let workdir = args.command.workdir.as_deref().unwrap_or(default_workdir);
    if !workdir.starts_with('/') {
        return Err(setup_failure(format!(
            "--workdir '{workdir}' must be an absolute path in the guest"
        )));
    }
    let (uid, gid) = guest_identity(
        args.command.root,
        session::dir::current_uid(),
        session::dir::current_gid(),
    );
    let (rows, cols) = if args.command.tty {
        terminal::size()
    } else {
        (0, 0)
    };
    Ok(ExecRequest {
        argv,
        env,
        cwd: workdir.to_string(),
        uid,
        gid,
        tty: args.command.tty,
        rows,
        cols,
        max_procs: args.max_procs,
        user_name: (image_root && uid != 0).then(login_name),
        user: args.command.user.clone(),
        egress: false,
        setup: None,
        keep_serving: false,
    })
}

/// The uid and gid the command gets in the guest: root with --root;
/// otherwise the caller's own, except that a root caller gets the
/// unprivileged [`UNPRIVILEGED_GUEST_ID`] (root in the guest only when
/// asked for).
fn guest_identity(root: bool, uid: u32, gid: u32) -> (u32, u32) {
    match (root, uid) {
        (true, _) => (0, 0),
        (false, 0) => (UNPRIVILEGED_GUEST_ID, UNPRIVILEGED_GUEST_ID),
        (false, _) => (uid, gid),
    }
}

/// The guest uid and gid a root caller's command runs as.
pub const UNPRIVILEGED_GUEST_ID: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(shares: &[(&str, &str)]) -> VmConfig {
        VmConfig {
            kernel: PathBuf::from("/nonexistent/vmlinux"),
            initrd: None,
            cmdline: String::new(),
            vcpus: 1,
            mem_size: 512 << 20,
            vsock: None,
            shares: shares
                .iter()
                .map(|(tag, guest)| crate::config::FsShare {
                    tag: tag.to_string(),
                    socket: PathBuf::from("/nonexistent"),
                    guest_path: guest.to_string(),
                    read_only: true,
                })
                .collect(),
            root_disk: None,
            root_dir: None,
            sandbox_disk: None,
            free_page_reporting: false,
            fs_bounce_pool: false,
        }
    }

    #[test]
    fn a_directory_root_is_the_overlay_over_its_share_and_not_a_mount() {
        let mut config = config_with(&[("mvm0", ROOT_GUEST_PATH), ("mvm1", "/workspace")]);
        config.root_dir = Some(crate::config::RootDir {
            scratch_bytes: 1 << 20,
        });
        let setup = machine_setup(&config).unwrap();
        assert_eq!(
            setup.root_param().unwrap(),
            Some(RootParam {
                lower: RootLower::Share("mvm0".into()),
                scratch_bytes: 1 << 20
            })
        );
        let mounts = setup.mount_params().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].tag, "mvm1");
        // Control: without the root, both are mounts and there is no root.
        let plain = machine_setup(&config_with(&[("mvm0", "/data"), ("mvm1", "/workspace")]));
        let plain = plain.unwrap();
        assert_eq!(plain.root_param().unwrap(), None);
        assert_eq!(plain.mount_params().unwrap().len(), 2);
    }

    #[test]
    fn scratch_needs_a_root_and_defaults_to_half_the_memory() {
        assert_eq!(scratch_bytes(false, None, 512 << 20).unwrap(), None);
        assert!(scratch_bytes(false, Some("64M"), 512 << 20).is_err());
        assert_eq!(
            scratch_bytes(true, None, 512 << 20).unwrap(),
            Some(256 << 20)
        );
        assert_eq!(
            scratch_bytes(true, Some("64M"), 512 << 20).unwrap(),
            Some(64 << 20)
        );
        assert!(scratch_bytes(true, Some("100K"), 512 << 20).is_err());
    }

    #[test]
    fn a_root_caller_is_unprivileged_in_the_guest_unless_root_is_asked() {
        assert_eq!(guest_identity(false, 0, 0), (1000, 1000));
        assert_eq!(guest_identity(true, 0, 0), (0, 0));
        assert_eq!(guest_identity(false, 1234, 100), (1234, 100));
        assert_eq!(guest_identity(true, 1234, 100), (0, 0));
    }
}
