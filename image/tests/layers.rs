//! A two-layer image through import and conversion, checked on the
//! mounted result: whiteouts, opaque directories, hard links, owners,
//! modes, times, xattrs, devices, symlinks.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use common::*;
use mvm_image::{ImageSource, Limits, NoProgress, Store};

fn two_layers() -> (Vec<u8>, Vec<u8>) {
    let cap: &[u8] = &[
        1, 0, 0, 2, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let lower = Tar::default()
        .dir(e("etc"))
        .file(
            E {
                mode: 0o600,
                uid: 0,
                gid: 42,
                ..e("etc/shadow")
            },
            b"secret\n",
        )
        .file(e("etc/gone"), b"deleted by the upper layer\n")
        .dir(e("opq"))
        .file(e("opq/lower"), b"hidden by the opaque marker\n")
        .dir(e("opq/sub"))
        .file(e("opq/sub/deep"), b"also hidden\n")
        .file(
            E {
                mode: 0o4755,
                uid: 0,
                gid: 0,
                mtime: 1_600_000_000,
                xattrs: &[("security.capability", cap), ("user.note", b"hi")],
                ..e("bin/ping")
            },
            b"\x7fELF pretend",
        )
        .bytes();
    let upper = Tar::default()
        .file(e("etc/.wh.gone"), b"")
        .file(e("opq/.wh..wh..opq"), b"")
        .file(e("opq/upper"), b"from the upper layer\n")
        .file(
            E {
                uid: 4_000_000_000,
                gid: 7,
                mtime: 1_234_567_890,
                ..e("data/a")
            },
            &vec![b'x'; 10_000],
        )
        .hardlink(e("data/b"), "data/a")
        .symlink(e("data/link"), "../etc/shadow")
        .dev(
            E {
                mode: 0o666,
                ..e("dev/null")
            },
            tar::EntryType::Char,
            1,
            3,
        )
        .dev(e("dev/sda"), tar::EntryType::Block, 8, 0)
        .dev(e("dev/fifo"), tar::EntryType::Fifo, 0, 0)
        .dir(E {
            mode: 0o1777,
            ..e("tmp")
        })
        .bytes();
    (lower, upper)
}

#[test]
fn two_layers_flatten_into_the_expected_tree() {
    let dir = tempdir("layers");
    let (lower, upper) = two_layers();
    oci_layout(
        &dir.join("oci"),
        &[(gzip(&lower), GZ), (upper, TAR)],
        "amd64",
        "v1",
    );
    let store = Store::open(&dir.join("store")).unwrap();
    let src = ImageSource::parse(&format!("oci:{}:v1", dir.join("oci").display()))
        .unwrap()
        .unwrap();
    let image = store.import(&src, Some("two"), &mut NoProgress).unwrap();
    assert_eq!(image.name.as_deref(), Some("two:latest"));
    assert_eq!(image.config.entrypoint, ["/bin/sh"]);
    assert_eq!(image.config.user.as_deref(), Some("1000:1000"));
    let root = store
        .rootfs(&image, &Limits::default(), &mut NoProgress)
        .unwrap();
    assert!(root.converted);
    // root, etc, shadow, opq, upper, bin, ping, data, a (= b), link, dev + 3 nodes, tmp
    assert_eq!(root.entries, 15);
    fsck(&root.path);
    let Some(m) = Mount::new(&root.path) else {
        return;
    };
    let p = |s: &str| m.dir.join(s);
    let names = |s: &str| {
        let mut v: Vec<String> = std::fs::read_dir(p(s))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("."), ["bin", "data", "dev", "etc", "opq", "tmp"]);
    assert_eq!(names("etc"), ["shadow"], "the whiteout removed etc/gone");
    assert_eq!(
        names("opq"),
        ["upper"],
        "the opaque directory shows only the upper layer"
    );
    assert_eq!(
        std::fs::read(p("opq/upper")).unwrap(),
        b"from the upper layer\n"
    );
    let shadow = std::fs::symlink_metadata(p("etc/shadow")).unwrap();
    assert_eq!(
        (shadow.mode(), shadow.uid(), shadow.gid()),
        (0o100600, 0, 42)
    );
    assert_eq!(shadow.mtime(), 1_700_000_000);
    let a = std::fs::symlink_metadata(p("data/a")).unwrap();
    let b = std::fs::symlink_metadata(p("data/b")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard links share an inode");
    assert_eq!(a.nlink(), 2);
    assert_ne!(
        a.ino(),
        shadow.ino(),
        "positive control: other files have other inodes"
    );
    assert_eq!(
        (a.uid(), a.gid(), a.mtime(), a.len()),
        (4_000_000_000, 7, 1_234_567_890, 10_000)
    );
    assert_eq!(std::fs::read(p("data/b")).unwrap(), vec![b'x'; 10_000]);
    assert_eq!(
        std::fs::read_link(p("data/link")).unwrap().to_str(),
        Some("../etc/shadow")
    );
    let ping = std::fs::symlink_metadata(p("bin/ping")).unwrap();
    assert_eq!(ping.mode(), 0o104755, "setuid survives");
    assert_eq!(ping.mtime(), 1_600_000_000);
    assert_eq!(
        lgetxattr(&p("bin/ping"), "security.capability").unwrap()[..4],
        [1, 0, 0, 2]
    );
    assert_eq!(lgetxattr(&p("bin/ping"), "user.note").unwrap(), b"hi");
    assert_eq!(
        lgetxattr(&p("etc/shadow"), "user.note"),
        None,
        "positive control: no xattr where none was set"
    );
    let null = std::fs::symlink_metadata(p("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!((null.rdev(), null.mode()), (libc::makedev(1, 3), 0o020666));
    let sda = std::fs::symlink_metadata(p("dev/sda")).unwrap();
    assert!(sda.file_type().is_block_device());
    assert_eq!(sda.rdev(), libc::makedev(8, 0));
    assert!(std::fs::symlink_metadata(p("dev/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        std::fs::symlink_metadata(p("tmp")).unwrap().mode(),
        0o041777
    );
    // Implicit parents: 0755 root:root.
    let data = std::fs::symlink_metadata(p("data")).unwrap();
    assert_eq!((data.mode(), data.uid(), data.gid()), (0o040755, 0, 0));
    assert_eq!(std::fs::symlink_metadata(p("dev")).unwrap().nlink(), 2);
    assert_eq!(std::fs::symlink_metadata(p(".")).unwrap().nlink(), 8);
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}
