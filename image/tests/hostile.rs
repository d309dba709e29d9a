//! Hostile and damaged images: each is refused with one line (or turned
//! into a correct image), and leaves the store as it was.

mod common;

use std::time::Instant;

use common::*;
use mvm_image::{Error, ImageSource, Limits, NoProgress, Store};

struct Case {
    dir: std::path::PathBuf,
    store: Store,
}

fn case(tag: &str) -> Case {
    let dir = tempdir(tag);
    let store = Store::open(&dir.join("store")).unwrap();
    Case { dir, store }
}

impl Case {
    fn src(&self) -> ImageSource {
        ImageSource::OciLayout {
            dir: self.dir.join("oci"),
            tag: None,
        }
    }

    /// Import and convert; the error line if either fails, with the store
    /// checked to be empty.
    fn run(&self, limits: &Limits) -> Result<mvm_image::Rootfs, String> {
        let r = self
            .store
            .import(&self.src(), Some("h"), &mut NoProgress)
            .and_then(|i| self.store.rootfs(&i, limits, &mut NoProgress));
        match r {
            Ok(r) => Ok(r),
            Err(e) => {
                // A failed conversion still has the import's blobs: the
                // name is removed and everything must go with it.
                let _ = self.store.remove("h");
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "one line: {msg}");
                assert_eq!(
                    store_files(self.store.root()),
                    Vec::<std::path::PathBuf>::new(),
                    "store left files after: {msg}"
                );
                Err(msg)
            }
        }
    }

    fn layer(&self, tar: Vec<u8>) -> &Self {
        oci_layout(&self.dir.join("oci"), &[(tar, TAR)], "amd64", "latest");
        self
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn dotdot_paths_are_refused() {
    let c = case("dotdot");
    let err = c
        .layer(Tar::default().file(e("a/../../etc/passwd"), b"x").bytes())
        .run(&Limits::default())
        .unwrap_err();
    assert!(err.contains("climbs out"), "{err}");
}

#[test]
fn absolute_paths_stay_inside() {
    let c = case("abs");
    let r = c
        .layer(
            Tar::default()
                .file(e("/etc/abs"), b"x")
                .file(e("./rel"), b"y")
                .bytes(),
        )
        .run(&Limits::default())
        .unwrap();
    fsck(&r.path);
    assert_eq!(r.entries, 4);
}

#[test]
fn hard_link_outside_or_missing_is_refused() {
    let c = case("hlout");
    let err = c
        .layer(Tar::default().hardlink(e("x"), "../../etc/passwd").bytes())
        .run(&Limits::default())
        .unwrap_err();
    assert!(err.contains("points out of the image"), "{err}");
    let c = case("hlmissing");
    let err = c
        .layer(Tar::default().hardlink(e("x"), "etc/passwd").bytes())
        .run(&Limits::default())
        .unwrap_err();
    assert!(err.contains("not a file in the image"), "{err}");
}

#[test]
fn symlink_outside_is_kept_as_a_link_and_never_followed() {
    let c = case("symout");
    // A lower symlink dir -> /etc, then a file placed "through" it: the
    // link is replaced by a directory, nothing is written via it.
    let tar = Tar::default()
        .symlink(e("esc"), "../../../etc")
        .file(e("esc/passwd"), b"pwned")
        .symlink(e("l"), "/etc/shadow")
        .bytes();
    let r = c.layer(tar).run(&Limits::default()).unwrap();
    fsck(&r.path);
    let Some(m) = Mount::new(&r.path) else { return };
    assert!(std::fs::symlink_metadata(m.dir.join("esc"))
        .unwrap()
        .is_dir());
    assert_eq!(std::fs::read(m.dir.join("esc/passwd")).unwrap(), b"pwned");
    assert_eq!(
        std::fs::read_link(m.dir.join("l")).unwrap().to_str(),
        Some("/etc/shadow")
    );
}

#[test]
fn truncated_gzip_is_refused() {
    let c = case("trunc");
    let gz = gzip(&Tar::default().file(e("f"), &vec![7u8; 100_000]).bytes());
    oci_layout(
        &c.dir.join("oci"),
        &[(gz[..gz.len() / 2].to_vec(), GZ)],
        "amd64",
        "latest",
    );
    let err = c.run(&Limits::default()).unwrap_err();
    assert!(err.contains("not a valid tar stream"), "{err}");
}

#[test]
fn a_descriptor_that_lies_about_size_is_refused() {
    let c = case("size");
    let m = c.layer(Tar::default().file(e("f"), b"data").bytes());
    let _ = m;
    // Rewrite the manifest with the layer's size off by one.
    let oci = c.dir.join("oci");
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.join("index.json")).unwrap()).unwrap();
    let md = idx["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let mut man: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.join("blobs/sha256").join(&md)).unwrap())
            .unwrap();
    let size = man["layers"][0]["size"].as_u64().unwrap();
    man["layers"][0]["size"] = (size - 1).into();
    let mb = serde_json::to_vec(&man).unwrap();
    let d = put_blob(&oci, &mb);
    write_index(
        &oci,
        &[
            serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{d}"), "size": mb.len()}),
        ],
    );
    let err = c.run(&Limits::default()).unwrap_err();
    assert!(err.contains("bytes its descriptor says"), "{err}");
}

#[test]
fn a_digest_mismatch_is_refused() {
    let c = case("digest");
    c.layer(Tar::default().file(e("f"), b"data").bytes());
    // Damage one layer blob in place (same size).
    let blobs = c.dir.join("oci/blobs/sha256");
    for f in std::fs::read_dir(&blobs).unwrap() {
        let p = f.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        if b.len() > 1024 {
            b[600] ^= 1;
            std::fs::write(&p, b).unwrap();
        }
    }
    let err = c.run(&Limits::default()).unwrap_err();
    assert!(err.contains("does not match its digest"), "{err}");
}

#[test]
fn an_arm64_only_index_is_refused() {
    let c = case("arm");
    let oci = c.dir.join("oci");
    let m = oci_layout(
        &oci,
        &[(Tar::default().file(e("f"), b"x").bytes(), TAR)],
        "arm64",
        "latest",
    );
    let md = sha(&m);
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{md}"), "size": m.len(),
                       "platform": {"architecture": "arm64", "os": "linux"}}]}))
    .unwrap();
    let id = put_blob(&oci, &index);
    write_index(
        &oci,
        &[
            serde_json::json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": format!("sha256:{id}"), "size": index.len()}),
        ],
    );
    let err = c.run(&Limits::default()).unwrap_err();
    assert_eq!(
        err,
        "image is linux/arm64: mvm runs linux/amd64 images only"
    );
}

#[test]
fn a_huge_sparse_file_converts_sparsely() {
    let c = case("sparse");
    let size = 10u64 << 30;
    let tar = Tar::default()
        .sparse("big", size, 5 << 30, &[0xabu8; 4096])
        .bytes();
    let t = Instant::now();
    let r = c.layer(tar).run(&Limits::default()).unwrap();
    eprintln!(
        "10 GiB sparse file: converted in {:.2?}, image {} bytes on disk",
        t.elapsed(),
        r.bytes
    );
    assert!(
        r.bytes < 4 << 20,
        "the image keeps the holes: {} bytes",
        r.bytes
    );
    fsck(&r.path);
    let Some(m) = Mount::new(&r.path) else { return };
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(m.dir.join("big")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size);
    let mut buf = [0u8; 8192];
    f.seek(SeekFrom::Start((5 << 30) - 4096)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf[..4096].iter().all(|b| *b == 0) && buf[4096..].iter().all(|b| *b == 0xab));
}

#[test]
fn a_limit_refuses_with_one_line() {
    let c = case("limit");
    let limits = Limits {
        max_file_bytes: 1000,
        ..Limits::default()
    };
    let err = c
        .layer(Tar::default().file(e("f"), &[1u8; 1001]).bytes())
        .run(&limits)
        .unwrap_err();
    assert!(err.contains("max_file_bytes"), "{err}");
    let limits = Limits {
        max_entries: 3,
        ..Limits::default()
    };
    let err = c
        .layer(
            Tar::default()
                .file(e("a"), b"")
                .file(e("b"), b"")
                .file(e("c"), b"")
                .file(e("d"), b"")
                .bytes(),
        )
        .run(&limits)
        .unwrap_err();
    assert!(err.contains("max_entries"), "{err}");
    let limits = Limits {
        max_layer_bytes: 4096,
        ..Limits::default()
    };
    let bomb = gzip(&Tar::default().file(e("z"), &vec![0u8; 1 << 20]).bytes());
    oci_layout(&c.dir.join("oci"), &[(bomb, GZ)], "amd64", "latest");
    let err = c.run(&limits).unwrap_err();
    assert!(err.contains("max_layer_bytes"), "{err}");
}

#[test]
fn a_million_empty_files() {
    let c = case("million");
    let n = 1_000_000;
    let mut t = Tar::default();
    for i in 0..n {
        t.file(e(&format!("d{}/f{i}", i % 1000)), b"");
    }
    let tar = t.bytes();
    let start = Instant::now();
    let r = c.layer(tar).run(&Limits::default());
    let took = start.elapsed();
    let r = r.unwrap();
    eprintln!(
        "a million empty files: import and conversion {took:.2?}, {} entries, image {} bytes",
        r.entries, r.bytes
    );
    assert_eq!(r.entries, n + 1000 + 1);
    fsck(&r.path);
}

#[test]
fn store_errors_are_one_line() {
    let c = case("errors");
    let err = c.store.find("nope").unwrap_err();
    assert!(matches!(err, Error::NotInStore { .. }));
    assert_eq!(err.to_string(), "image 'nope' is not in the store: import it with `mvm image import oci:DIR` (see `mvm image ls`)");
}
