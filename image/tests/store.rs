//! The store: a second import copies nothing, a second rootfs converts
//! nothing, docker archives import, names resolve, remove cleans up.

mod common;

use common::*;
use mvm_image::{ImageSource, Limits, NoProgress, Store};

#[test]
fn importing_twice_copies_nothing_and_rootfs_is_cached() {
    let dir = tempdir("twice");
    let layer = Tar::default().file(e("hello"), b"world\n").bytes();
    oci_layout(&dir.join("oci"), &[(gzip(&layer), GZ)], "amd64", "v1");
    let store = Store::open(&dir.join("store")).unwrap();
    let src = ImageSource::parse(&format!("oci:{}:v1", dir.join("oci").display()))
        .unwrap()
        .unwrap();
    let first = store.import(&src, None, &mut NoProgress).unwrap();
    assert_eq!(first.imported.blobs_copied, 3, "manifest, config, layer");
    assert_eq!(first.name.as_deref(), Some("oci:v1"));
    let second = store.import(&src, None, &mut NoProgress).unwrap();
    assert_eq!(second.imported.blobs_copied, 0);
    assert_eq!(second.manifest_digest, first.manifest_digest);
    let a = store
        .rootfs(&first, &Limits::default(), &mut NoProgress)
        .unwrap();
    let b = store
        .rootfs(&second, &Limits::default(), &mut NoProgress)
        .unwrap();
    assert!(a.converted && !b.converted);
    assert_eq!((a.path.clone(), a.entries), (b.path.clone(), b.entries));
    // Same input, same bytes.
    let bytes = std::fs::read(&a.path).unwrap();
    std::fs::remove_file(&a.path).unwrap();
    let c = store
        .rootfs(&first, &Limits::default(), &mut NoProgress)
        .unwrap();
    assert!(c.converted);
    assert_eq!(
        std::fs::read(&c.path).unwrap(),
        bytes,
        "conversion is deterministic"
    );
    // Lookups by name and by digest prefix.
    let hex = first.manifest_digest.trim_start_matches("sha256:");
    assert_eq!(
        store
            .find(&format!("sha256:{}", &hex[..12]))
            .unwrap()
            .manifest_digest,
        first.manifest_digest
    );
    assert_eq!(
        store.find("oci:v1").unwrap().manifest_digest,
        first.manifest_digest
    );
    assert!(
        store.find(&format!("sha256:{}", &hex[..11])).is_err(),
        "fewer than 12 digits"
    );
    assert_eq!(store.list().unwrap().len(), 1);
    store.remove("oci:v1").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert_eq!(
        store_files(store.root()),
        Vec::<std::path::PathBuf>::new(),
        "remove deletes blobs and the root"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn docker_archives_import_and_convert() {
    let dir = tempdir("docker");
    let l1 = Tar::default().file(e("a"), b"one").bytes();
    let l2 = Tar::default()
        .file(e(".wh.a"), b"")
        .file(e("b"), b"two")
        .bytes();
    docker_archive(&dir.join("img.tar"), &[l1, l2], "example/app:1.0");
    let store = Store::open(&dir.join("store")).unwrap();
    let src = ImageSource::parse(&format!("docker-archive:{}", dir.join("img.tar").display()))
        .unwrap()
        .unwrap();
    let img = store.import(&src, None, &mut NoProgress).unwrap();
    assert_eq!(img.name.as_deref(), Some("example/app:1.0"));
    assert_eq!(img.layers.len(), 2);
    assert_eq!(
        store
            .import(&src, None, &mut NoProgress)
            .unwrap()
            .imported
            .blobs_copied,
        0
    );
    let r = store
        .rootfs(&img, &Limits::default(), &mut NoProgress)
        .unwrap();
    fsck(&r.path);
    assert_eq!(r.entries, 2, "root and b");
    // A second name for the same image keeps its blobs when the first goes.
    store.import(&src, Some("other"), &mut NoProgress).unwrap();
    store.remove("example/app:1.0").unwrap();
    let left = store.find("other").unwrap();
    assert!(store
        .rootfs(&left, &Limits::default(), &mut NoProgress)
        .is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dead_writers_temp_files_are_swept() {
    let dir = tempdir("sweep");
    let store = Store::open(&dir.join("s")).unwrap();
    // No process holds a lock on this file: it is a dead writer's.
    std::fs::write(store.root().join("tmp/blob.1.0"), b"half").unwrap();
    let store = Store::open(store.root()).unwrap();
    assert_eq!(store_files(store.root()), Vec::<std::path::PathBuf>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// ~20k files, ~300 MB: `cargo test --release -p mvm-image --test store
/// -- --ignored --nocapture` prints the conversion rate.
#[test]
#[ignore]
fn conversion_rate() {
    let dir = tempdir("rate");
    let mut t = Tar::default();
    let mut total = 0;
    for i in 0..20_000u32 {
        let len = (i as usize * 7919) % 30_000 + 1;
        let data: Vec<u8> = (0..len).map(|j| (j as u32 ^ i) as u8).collect();
        total += len;
        t.file(e(&format!("d{}/f{i}", i % 200)), &data);
    }
    let tar = t.bytes();
    oci_layout(&dir.join("oci"), &[(tar, TAR)], "amd64", "latest");
    let store = Store::open(&dir.join("s")).unwrap();
    let src = ImageSource::OciLayout {
        dir: dir.join("oci"),
        tag: None,
    };
    let img = store.import(&src, Some("rate"), &mut NoProgress).unwrap();
    let start = std::time::Instant::now();
    let r = store
        .rootfs(&img, &Limits::default(), &mut NoProgress)
        .unwrap();
    let s = start.elapsed().as_secs_f64();
    eprintln!(
        "{} files, {:.0} MB: converted in {s:.2} s, {:.0} MB/s",
        20_000,
        total as f64 / 1e6,
        total as f64 / 1e6 / s
    );
    fsck(&r.path);
    let _ = std::fs::remove_dir_all(&dir);
}
