//! The guard against a real passthrough file system on a scratch directory,
//! with a bare passthrough as the control.
use super::*;
use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};
use virtiofsd::filesystem::ROOT_ID;
use virtiofsd::passthrough::Config;
use virtiofsd::soft_idmap::{GuestGid, GuestUid};

/// A directory of its own under the temp dir, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("mvm-guard-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join(".git/hooks")).unwrap();
        fs::write(dir.join(".git/config"), "[core]\n").unwrap();
        fs::write(dir.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(dir.join("main.rs"), "fn main() {}\n").unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn passthrough(root: &Path) -> PassthroughFs {
    let fs = PassthroughFs::new(Config {
        root_dir: root.to_str().unwrap().into(),
        ..Default::default()
    })
    .unwrap();
    fs.init(FsOptions::empty()).unwrap();
    fs
}

fn ctx() -> Context {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Context {
        uid: GuestUid::from(uid),
        gid: GuestGid::from(gid),
        pid: std::process::id() as i32,
    }
}

fn c(name: &str) -> CString {
    CString::new(name).unwrap()
}

fn create<F: FileSystem<Inode = u64>>(fs: &F, parent: u64, name: &str) -> io::Result<Entry> {
    let flags = (libc::O_RDWR | libc::O_CREAT) as u32;
    fs.create(
        ctx(),
        parent,
        &c(name),
        0o644,
        false,
        flags,
        0,
        Extensions::default(),
    )
    .map(|(entry, _, _)| entry)
}

fn mkdir<F: FileSystem<Inode = u64>>(fs: &F, parent: u64, name: &str) -> io::Result<Entry> {
    fs.mkdir(ctx(), parent, &c(name), 0o755, 0, Extensions::default())
}

fn lookup(fs: &Guard, parent: u64, name: &str) -> u64 {
    fs.lookup(ctx(), parent, &c(name)).unwrap().inode
}

/// Whether a request was refused as the guard refuses (a request
/// that went through fails the test).
fn is_erofs<T>(result: io::Result<T>) -> bool {
    match result {
        Err(e) => e.raw_os_error() == Some(libc::EROFS),
        Ok(_) => panic!("the request went through"),
    }
}

#[test]
fn the_passthrough_alone_lets_the_guest_plant_them() {
    // The control: without the guard the same requests reach the host.
    let dir = Scratch::new("control");
    let fs = passthrough(&dir.0);
    create(&fs, ROOT_ID, ".envrc").unwrap();
    let git = fs.lookup(ctx(), ROOT_ID, &c(".git")).unwrap().inode;
    let hooks = fs.lookup(ctx(), git, &c("hooks")).unwrap().inode;
    create(&fs, hooks, "pre-commit").unwrap();
    assert!(dir.0.join(".envrc").exists());
    assert!(dir.0.join(".git/hooks/pre-commit").exists());
}

#[test]
fn new_guarded_names_are_refused_and_nothing_reaches_the_host() {
    let dir = Scratch::new("names");
    let fs = Guard::new(passthrough(&dir.0));
    assert!(is_erofs(create(&fs, ROOT_ID, ".envrc")));
    assert!(is_erofs(mkdir(&fs, ROOT_ID, ".vscode")));
    assert!(is_erofs(fs.symlink(
        ctx(),
        &c("/tmp/x"),
        ROOT_ID,
        &c(".bashrc"),
        Extensions::default()
    )));
    let sub = mkdir(&fs, ROOT_ID, "sub").unwrap().inode;
    assert!(is_erofs(create(&fs, sub, ".envrc")));
    assert!(is_erofs(mkdir(&fs, sub, ".git")));
    // Renamed or linked into a guarded name.
    let file = create(&fs, ROOT_ID, "payload").unwrap().inode;
    assert!(is_erofs(fs.rename(
        ctx(),
        ROOT_ID,
        &c("payload"),
        sub,
        &c(".envrc"),
        0
    )));
    assert!(is_erofs(fs.link(ctx(), file, ROOT_ID, &c(".zshrc"))));
    for name in [
        ".envrc",
        ".vscode",
        ".bashrc",
        ".zshrc",
        "sub/.envrc",
        "sub/.git",
    ] {
        assert!(!dir.0.join(name).exists(), "{name} reached the host");
    }
    // Ordinary work goes on.
    create(&fs, sub, "notes.txt").unwrap();
    fs.rename(ctx(), ROOT_ID, &c("payload"), sub, &c("moved"), 0)
        .unwrap();
    assert!(dir.0.join("sub/moved").exists());
}

#[test]
fn git_hooks_and_config_are_read_only_and_the_rest_of_git_is_not() {
    let dir = Scratch::new("git");
    let fs = Guard::new(passthrough(&dir.0));
    let git = lookup(&fs, ROOT_ID, ".git");
    let hooks = lookup(&fs, git, "hooks");
    let config = lookup(&fs, git, "config");
    assert!(is_erofs(create(&fs, hooks, "pre-commit")));
    assert!(is_erofs(fs.open(
        ctx(),
        config,
        false,
        libc::O_WRONLY as u32
    )));
    assert!(is_erofs(fs.open(
        ctx(),
        config,
        false,
        (libc::O_RDONLY | libc::O_TRUNC) as u32
    )));
    fs.open(ctx(), config, false, libc::O_RDONLY as u32)
        .unwrap();
    // git writes config by renaming config.lock over it.
    create(&fs, git, "config.lock").unwrap();
    assert!(is_erofs(fs.rename(
        ctx(),
        git,
        &c("config.lock"),
        git,
        &c("config"),
        0
    )));
    assert!(is_erofs(fs.unlink(ctx(), git, &c("config"))));
    assert!(is_erofs(fs.rmdir(ctx(), git, &c("hooks"))));
    assert!(is_erofs(fs.rename(
        ctx(),
        ROOT_ID,
        &c(".git"),
        ROOT_ID,
        &c("old-git"),
        0
    )));
    assert!(is_erofs(fs.setattr(
        ctx(),
        config,
        fuse::SetattrIn::default(),
        None,
        SetattrValid::MODE
    )));
    assert_eq!(
        fs::read_to_string(dir.0.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(dir
        .0
        .join(".git/hooks")
        .read_dir()
        .unwrap()
        .next()
        .is_none());
    // What a commit writes is free.
    let objects = mkdir(&fs, git, "objects").unwrap().inode;
    create(&fs, objects, "ab").unwrap();
    fs.rename(ctx(), git, &c("config.lock"), git, &c("index"), 0)
        .unwrap();
    // A submodule's git directory beneath .git keeps the rules.
    let modules = mkdir(&fs, git, "modules").unwrap().inode;
    let lib = mkdir(&fs, modules, "lib").unwrap().inode;
    assert!(is_erofs(mkdir(&fs, lib, "hooks")));
    assert!(dir.0.join(".git/objects/ab").exists());
}

#[test]
fn a_hard_link_to_a_guarded_file_is_refused() {
    let dir = Scratch::new("link");
    let fs = Guard::new(passthrough(&dir.0));
    let git = lookup(&fs, ROOT_ID, ".git");
    let config = lookup(&fs, git, "config");
    assert!(is_erofs(fs.link(ctx(), config, ROOT_ID, &c("cfg"))));
    assert!(!dir.0.join("cfg").exists());
}
