//! Which host directories a run shares, checked before anything starts:
//! the workspace (`--workspace`, default the current directory) at
//! [`WORKSPACE_GUEST_PATH`], read-only unless `--write`, and each
//! `--mount HOST:GUEST[:ro|rw]`, read-only unless `:rw`.
//!
//! Each directory is opened once, here, and that open directory is what
//! virtiofsd serves (it starts in it: `--shared-dir=.`), never its name
//! looked up again: a directory swapped for a symlink after the check
//! changes nothing. The lookup itself follows no symlink the guest could
//! have planted: a relative path (inside the project, where an earlier
//! `--write` run could write) is walked from the current directory
//! without following any symlink; an absolute one is resolved first (its
//! symlinks are the host's) and then walked the same way, so a symlink
//! that appears in between is refused.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Where the workspace appears in the guest; also the command's default
/// working directory.
pub const WORKSPACE_GUEST_PATH: &str = "/workspace";

/// Guest paths a share may not cover: the guest's own system directories
/// (guest-init mounts /proc, /sys, /dev, /run, /tmp's siblings live in
/// /bin, /etc, ...), which a share would hide and break the guest with.
const RESERVED: &[&str] = &[
    "/bin", "/dev", "/etc", "/init", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("--mount '{0}' is not HOST:GUEST[:ro|rw] (GUEST an absolute path in the guest)")]
    BadMount(String),
    #[error("shared directory {0} does not exist: create it or fix the path")]
    Missing(String),
    #[error("shared directory {0} is not a directory: share the directory that holds it")]
    NotADirectory(String),
    #[error("shared directory {0} is not readable by you: fix its permissions or share another")]
    Unreadable(String),
    #[error("cannot use shared directory {0}: {1}")]
    Inaccessible(String, String),
    #[error("guest path '{0}' must be absolute, without '..' components")]
    BadGuestPath(String),
    #[error("guest path '{0}' is a guest system directory (or inside one): choose another, e.g. /mnt/NAME")]
    ReservedGuestPath(String),
    #[error("guest path {0} is shared twice: give each share its own guest path")]
    DuplicateGuestPath(String),
    #[error("{0} is {1}: sharing it would hand the guest your shell startup files, keys and every project; share the project directory instead (or pass --allow-home-share if you mean it)")]
    Dangerous(String, &'static str),
    #[error("shared directory {0}: {1} is a symbolic link, and mvm follows none in a relative share path (a guest with --write could have planted it): give the absolute path of the directory you mean")]
    Symlink(String, String),
}

/// One directory to share.
#[derive(Debug, Clone)]
pub struct Share {
    /// Where the directory is, for messages and checks (canonical).
    pub host: PathBuf,
    /// The directory itself, opened once: what virtiofsd serves.
    pub dir: Arc<OwnedFd>,
    pub guest: String,
    pub read_only: bool,
    /// A writable share whose files the host runs later stay read-only
    /// (virtiofsd/src/guard.rs); false when read-only or `--write-hooks`.
    pub guard: bool,
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host
            && self.guest == other.guest
            && self.read_only == other.read_only
            && self.guard == other.guard
    }
}

/// What the command line asked for.
pub struct Wanted<'a> {
    /// None: no workspace (`--no-workspace`).
    pub workspace: Option<&'a Path>,
    pub write: bool,
    pub mounts: &'a [String],
    /// The caller's home directory, canonical (None: unknown).
    pub home: Option<&'a Path>,
    /// `--allow-home-share`: share `/`, the home directory or a directory
    /// above it all the same.
    pub allow_home: bool,
    /// `--write-hooks`: writable shares may change the files the host
    /// runs later too.
    pub write_hooks: bool,
}

/// Why sharing `dir` would expose more than a project: it is `/`, the home
/// directory, or a directory above the home directory (e.g. `/home`).
fn danger(dir: &Path, home: Option<&Path>) -> Option<&'static str> {
    if dir == Path::new("/") {
        return Some("the root directory");
    }
    match home {
        Some(home) if dir == home => Some("your home directory"),
        Some(home) if home.starts_with(dir) => Some("a directory above your home directory"),
        _ => None,
    }
}

/// The caller's home directory ($HOME), canonical, if it exists.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .and_then(|h| Path::new(&h).canonicalize().ok())
}

/// The shares in mount order (the workspace first), every path checked.
pub fn plan(wanted: &Wanted) -> Result<Vec<Share>, Error> {
    let checked = |dir: &Path| {
        let (host, fd) = open_host_dir(dir)?;
        match danger(&host, wanted.home) {
            Some(what) if !wanted.allow_home => {
                Err(Error::Dangerous(host.display().to_string(), what))
            }
            _ => Ok((host, Arc::new(fd))),
        }
    };
    let mut shares = Vec::new();
    if let Some(dir) = wanted.workspace {
        let (host, dir) = checked(dir)?;
        shares.push(Share {
            host,
            dir,
            guest: WORKSPACE_GUEST_PATH.into(),
            read_only: !wanted.write,
            guard: wanted.write && !wanted.write_hooks,
        });
    }
    for spec in wanted.mounts {
        let (host, guest, read_only) = parse_mount(spec)?;
        let guest = check_guest_path(guest)?;
        if shares.iter().any(|s| s.guest == guest) {
            return Err(Error::DuplicateGuestPath(guest));
        }
        let (host, dir) = checked(Path::new(host))?;
        shares.push(Share {
            host,
            dir,
            guest,
            read_only,
            guard: !read_only && !wanted.write_hooks,
        });
    }
    Ok(shares)
}

/// `--rootfs DIR`: the directory as the root's read-only lower layer (a
/// share at [`crate::config::ROOT_GUEST_PATH`]), opened and checked as
/// every share is: `/`, the home directory and the directories above it
/// only with `allow_home`.
pub fn root_dir(dir: &Path, home: Option<&Path>, allow_home: bool) -> Result<Share, Error> {
    let (host, fd) = open_host_dir(dir)?;
    if let Some(what) = danger(&host, home).filter(|_| !allow_home) {
        return Err(Error::Dangerous(host.display().to_string(), what));
    }
    Ok(Share {
        host,
        dir: Arc::new(fd),
        guest: crate::config::ROOT_GUEST_PATH.into(),
        read_only: true,
        guard: false,
    })
}

/// `HOST:GUEST`, `HOST:GUEST:ro` or `HOST:GUEST:rw`. HOST may itself hold
/// colons; GUEST may not.
fn parse_mount(spec: &str) -> Result<(&str, &str, bool), Error> {
    let bad = || Error::BadMount(spec.to_string());
    let (rest, read_only) = match spec.rsplit_once(':') {
        Some((rest, "ro")) => (rest, true),
        Some((rest, "rw")) => (rest, false),
        _ => (spec, true),
    };
    let (host, guest) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || guest.is_empty() {
        return Err(bad());
    }
    Ok((host, guest, read_only))
}

fn check_guest_path(path: &str) -> Result<String, Error> {
    let p = Path::new(path);
    let bad = || Error::BadGuestPath(path.to_string());
    if !p.is_absolute() || path.contains('\0') || path.contains(',') {
        return Err(bad());
    }
    let mut clean = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => clean.push(name),
            Component::ParentDir | Component::Prefix(_) => return Err(bad()),
        }
    }
    let clean = clean.to_string_lossy().into_owned();
    if clean == "/"
        || RESERVED
            .iter()
            .any(|r| clean == *r || clean.starts_with(&format!("{r}/")))
    {
        return Err(Error::ReservedGuestPath(clean));
    }
    Ok(clean)
}

/// Opens the directory `path` names, following no symlink the guest could
/// have planted (see the module comment); returns where it is and the open
/// directory.
fn open_host_dir(path: &Path) -> Result<(PathBuf, OwnedFd), Error> {
    let shown = path.display().to_string();
    let lookup_err = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => Error::Missing(shown.clone()),
        io::ErrorKind::PermissionDenied => Error::Unreadable(shown.clone()),
        io::ErrorKind::NotADirectory => Error::NotADirectory(shown.clone()),
        _ => Error::Inaccessible(shown.clone(), e.to_string()),
    };
    let walked = if path.is_absolute() {
        path.canonicalize().map_err(lookup_err)?
    } else {
        path.to_path_buf()
    };
    let fd = walk_no_symlinks(&walked).map_err(|e| match e {
        Walk::Symlink(at) => Error::Symlink(shown.clone(), at),
        Walk::Io(e) => lookup_err(e),
    })?;
    // Where it is: what the open directory resolves to now (it is that
    // directory, whatever its name becomes).
    let host = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| Error::Inaccessible(shown.clone(), e.to_string()))?;
    let meta = File::from(fd.try_clone().map_err(lookup_err)?)
        .metadata()
        .map_err(lookup_err)?;
    if !meta.is_dir() {
        return Err(Error::NotADirectory(shown));
    }
    let c = CString::new(host.as_os_str().as_bytes())
        .map_err(|_| Error::Inaccessible(shown.clone(), "NUL in path".into()))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::X_OK) } != 0 {
        return Err(Error::Unreadable(shown));
    }
    Ok((host, fd))
}

enum Walk {
    /// This component is a symbolic link.
    Symlink(String),
    Io(io::Error),
}

fn openat(dir: libc::c_int, name: &OsStr, flags: libc::c_int) -> Result<OwnedFd, Walk> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| Walk::Io(io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: `c` is a valid C string; the result is a new fd we own.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Walk::Io(io::Error::last_os_error()));
    }
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` one component at a time with O_NOFOLLOW (what openat2's
/// RESOLVE_NO_SYMLINKS does, on any kernel): the last as a readable
/// directory, the ones before as O_PATH.
fn walk_no_symlinks(path: &Path) -> Result<OwnedFd, Walk> {
    let start = if path.is_absolute() { "/" } else { "." };
    let mut dir = openat(
        libc::AT_FDCWD,
        OsStr::new(start),
        libc::O_PATH | libc::O_DIRECTORY,
    )?;
    let mut at = PathBuf::new();
    let mut parts: Vec<&OsStr> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => parts.push(name),
            Component::ParentDir => parts.push(OsStr::new("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if parts.is_empty() {
        return openat(
            dir.as_raw_fd(),
            OsStr::new("."),
            libc::O_RDONLY | libc::O_DIRECTORY,
        );
    }
    let last = parts.len() - 1;
    for (i, name) in parts.into_iter().enumerate() {
        at.push(name);
        let flags = if i == last {
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW
        } else {
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW
        };
        dir = openat(dir.as_raw_fd(), name, flags).map_err(|e| match e {
            // O_NOFOLLOW|O_DIRECTORY on a symlink: ELOOP or ENOTDIR; say
            // which it was.
            Walk::Io(err) if is_symlink_at(&dir, name) => {
                let _ = err;
                Walk::Symlink(at.display().to_string())
            }
            other => other,
        })?;
    }
    Ok(dir)
}

fn is_symlink_at(dir: &OwnedFd, name: &OsStr) -> bool {
    let Ok(c) = CString::new(name.as_bytes()) else {
        return false;
    };
    // SAFETY: `st` is written by fstatat before it is read; `c` is valid.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        ) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFLNK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_specs() {
        assert_eq!(parse_mount("/a:/b"), Ok(("/a", "/b", true)));
        assert_eq!(parse_mount("/a:/b:ro"), Ok(("/a", "/b", true)));
        assert_eq!(parse_mount("/a:/b:rw"), Ok(("/a", "/b", false)));
        assert_eq!(parse_mount("/x:y:/b:rw"), Ok(("/x:y", "/b", false)));
        assert!(parse_mount("/a").is_err());
        assert!(parse_mount(":/b").is_err());
        assert!(parse_mount("/a:").is_err());
        assert!(parse_mount("/a:rw").is_err());
    }

    #[test]
    fn a_root_directory_is_a_read_only_share_at_the_root_and_never_home() {
        let dir = std::env::temp_dir().join(format!("mvm-root-dir-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        let share = root_dir(&dir, None, false).unwrap();
        assert_eq!(share.guest, crate::config::ROOT_GUEST_PATH);
        assert!(share.read_only && !share.guard);
        assert_eq!(share.host, dir.canonicalize().unwrap());
        // The same directory as the caller's home, and `/`: refused
        // unless asked for.
        let home = dir.canonicalize().unwrap();
        assert!(matches!(
            root_dir(&dir, Some(&home), false),
            Err(Error::Dangerous(_, "your home directory"))
        ));
        assert!(root_dir(&dir, Some(&home), true).is_ok());
        assert!(matches!(
            root_dir(Path::new("/"), None, false),
            Err(Error::Dangerous(_, "the root directory"))
        ));
        assert!(matches!(
            root_dir(&dir.join("absent"), None, false),
            Err(Error::Missing(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn guest_paths() {
        assert_eq!(check_guest_path("/data/./x/"), Ok("/data/x".into()));
        assert!(matches!(
            check_guest_path("data"),
            Err(Error::BadGuestPath(_))
        ));
        assert!(matches!(
            check_guest_path("/a/../etc"),
            Err(Error::BadGuestPath(_))
        ));
        assert!(matches!(
            check_guest_path("/a,b"),
            Err(Error::BadGuestPath(_))
        ));
        for reserved in ["/", "/proc", "/etc/ssl", "/usr", "/dev/shm", "//"] {
            assert!(
                matches!(check_guest_path(reserved), Err(Error::ReservedGuestPath(_))),
                "{reserved}"
            );
        }
        assert!(check_guest_path("/usrlocal").is_ok());
        assert!(check_guest_path("/tmp/data").is_ok());
    }

    #[test]
    fn host_dirs_are_checked_before_anything_starts() {
        let tmp = std::env::temp_dir().join(format!("mvm-shares-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let file = tmp.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            open_host_dir(&tmp.join("missing")),
            Err(Error::Missing(_))
        ));
        assert!(matches!(open_host_dir(&file), Err(Error::NotADirectory(_))));
        assert_eq!(open_host_dir(&tmp).unwrap().0, tmp.canonicalize().unwrap());
        let mounts = [
            format!("{}:/data:rw", tmp.display()),
            format!("{}:/data", tmp.display()),
        ];
        let plan_of = |mounts: &[String]| {
            plan(&Wanted {
                workspace: Some(&tmp),
                write: false,
                mounts,
                home: None,
                allow_home: false,
                write_hooks: false,
            })
        };
        let shares = plan_of(&mounts[..1]).unwrap();
        assert_eq!(shares[0].guest, WORKSPACE_GUEST_PATH);
        assert!(shares[0].read_only);
        assert_eq!(shares[1].guest, "/data");
        assert!(!shares[1].read_only);
        assert!(matches!(
            plan_of(&mounts),
            Err(Error::DuplicateGuestPath(_))
        ));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_relative_path_follows_no_symlink_and_the_open_directory_is_what_is_served() {
        let tmp = std::env::temp_dir().join(format!("mvm-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("project/data")).unwrap();
        std::fs::create_dir_all(tmp.join("secret")).unwrap();
        // What an earlier --write run could leave in the project.
        std::os::unix::fs::symlink(tmp.join("secret"), tmp.join("project/out")).unwrap();
        std::os::unix::fs::symlink("../secret", tmp.join("project/rel")).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let project = tmp.join("project").canonicalize().unwrap();
        let rel = |p: &str| pathdiff(&project.join(p), &cwd);
        for planted in ["out", "rel", "out/"] {
            let err = open_host_dir(&rel(planted)).unwrap_err();
            assert!(matches!(err, Error::Symlink(..)), "{planted}: {err}");
            assert!(err.to_string().contains("symbolic link"), "{err}");
        }
        // A symlink further up the path, too.
        std::os::unix::fs::symlink(project.join("data"), tmp.join("project/link")).unwrap();
        assert!(matches!(
            open_host_dir(&rel("link/../data")),
            Err(Error::Symlink(..))
        ));
        // An absolute path: the host's own symlinks are resolved first.
        let (host, _) = open_host_dir(&tmp.join("project/out")).unwrap();
        assert_eq!(host, tmp.join("secret").canonicalize().unwrap());
        // The open directory stays the one that was checked: swap it for a
        // symlink to elsewhere and the fd still names the original.
        let (_, fd) = open_host_dir(&rel("data")).unwrap();
        std::fs::write(project.join("data/marker"), b"inside").unwrap();
        std::fs::rename(project.join("data"), project.join("moved")).unwrap();
        std::os::unix::fs::symlink(tmp.join("secret"), project.join("data")).unwrap();
        let served = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(served, project.join("moved"));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// `to` relative to `from` (both absolute), as `../..`-style path.
    fn pathdiff(to: &Path, from: &Path) -> PathBuf {
        let to: Vec<_> = to.components().collect();
        let from: Vec<_> = from.components().collect();
        let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
        let mut p = PathBuf::new();
        for _ in common..from.len() {
            p.push("..");
        }
        for c in &to[common..] {
            p.push(c.as_os_str());
        }
        p
    }

    #[test]
    fn writable_shares_are_guarded_unless_write_hooks() {
        let tmp = std::env::temp_dir().join(format!("mvm-guard-plan-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let mounts = [
            format!("{}:/rw:rw", tmp.display()),
            format!("{}:/ro", tmp.display()),
        ];
        let guards = |write: bool, write_hooks: bool| {
            let shares = plan(&Wanted {
                workspace: Some(&tmp),
                write,
                mounts: &mounts,
                home: None,
                allow_home: false,
                write_hooks,
            })
            .unwrap();
            shares.iter().map(|s| s.guard).collect::<Vec<_>>()
        };
        assert_eq!(guards(true, false), [true, true, false]);
        assert_eq!(guards(false, false), [false, true, false]);
        assert_eq!(guards(true, true), [false, false, false]);
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn root_home_and_what_lies_above_home_are_shared_only_when_asked() {
        let tmp = std::env::temp_dir()
            .join(format!("mvm-home-{}", std::process::id()))
            .join("home/user");
        std::fs::create_dir_all(tmp.join("project")).unwrap();
        let home = tmp.canonicalize().unwrap();
        let above = home.parent().unwrap().to_path_buf();
        let project = home.join("project");
        let plan_of = |workspace: &Path, mounts: &[String], allow_home: bool| {
            plan(&Wanted {
                workspace: Some(workspace),
                write: true,
                mounts,
                home: Some(&home),
                allow_home,
                write_hooks: false,
            })
        };
        for (dir, what) in [
            (Path::new("/"), "the root directory"),
            (home.as_path(), "your home directory"),
            (above.as_path(), "a directory above your home directory"),
        ] {
            let err = plan_of(dir, &[], false).unwrap_err();
            assert_eq!(err, Error::Dangerous(dir.display().to_string(), what));
            assert!(err.to_string().contains("--allow-home-share"), "{err}");
            assert!(
                plan_of(dir, &[], true).is_ok(),
                "allowed when asked: {dir:?}"
            );
        }
        // As a --mount too, read-only or not.
        let mount = [format!("{}:/h:ro", home.display())];
        assert!(matches!(
            plan_of(&project, &mount, false),
            Err(Error::Dangerous(..))
        ));
        // A project inside the home directory is what a workspace is for.
        assert!(plan_of(&project, &[], false).is_ok());
        std::fs::remove_dir_all(tmp.parent().unwrap().parent().unwrap()).unwrap();
    }
}
