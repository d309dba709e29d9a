//! Which host directories a run shares, checked before anything starts:
//! the workspace (`--workspace`, default the current directory) at
//! [`WORKSPACE_GUEST_PATH`], read-only unless `--write`, and each
//! `--mount HOST:GUEST[:ro|rw]`, read-only unless `:rw`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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
}

/// One directory to share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Canonical: symlinks resolved, so what is checked is what is served.
    pub host: PathBuf,
    pub guest: String,
    pub read_only: bool,
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
        let host = check_host_dir(dir)?;
        match danger(&host, wanted.home) {
            Some(what) if !wanted.allow_home => {
                Err(Error::Dangerous(host.display().to_string(), what))
            }
            _ => Ok(host),
        }
    };
    let mut shares = Vec::new();
    if let Some(dir) = wanted.workspace {
        shares.push(Share {
            host: checked(dir)?,
            guest: WORKSPACE_GUEST_PATH.into(),
            read_only: !wanted.write,
        });
    }
    for spec in wanted.mounts {
        let (host, guest, read_only) = parse_mount(spec)?;
        let guest = check_guest_path(guest)?;
        if shares.iter().any(|s| s.guest == guest) {
            return Err(Error::DuplicateGuestPath(guest));
        }
        shares.push(Share {
            host: checked(Path::new(host))?,
            guest,
            read_only,
        });
    }
    Ok(shares)
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

fn check_host_dir(path: &Path) -> Result<PathBuf, Error> {
    let shown = path.display().to_string();
    let host = path.canonicalize().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::Missing(shown.clone()),
        io::ErrorKind::PermissionDenied => Error::Unreadable(shown.clone()),
        _ => Error::Inaccessible(shown.clone(), e.to_string()),
    })?;
    if !host.is_dir() {
        return Err(Error::NotADirectory(shown));
    }
    let c = CString::new(host.as_os_str().as_bytes())
        .map_err(|_| Error::Inaccessible(shown.clone(), "NUL in path".into()))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::X_OK) } != 0 {
        return Err(Error::Unreadable(shown));
    }
    Ok(host)
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
            check_host_dir(&tmp.join("missing")),
            Err(Error::Missing(_))
        ));
        assert!(matches!(
            check_host_dir(&file),
            Err(Error::NotADirectory(_))
        ));
        assert_eq!(check_host_dir(&tmp), Ok(tmp.canonicalize().unwrap()));
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
