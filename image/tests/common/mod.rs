//! Test helpers: layer tarballs written in code, OCI layouts and docker
//! save archives made from them, and the host checks (fsck.erofs, a loop
//! mount) that verify what the crate wrote.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A layer tarball built entry by entry. Names go into the header as
/// given (no checks), so hostile names can be written too.
pub struct Tar {
    b: tar::Builder<Vec<u8>>,
}

pub struct E<'a> {
    pub path: &'a str,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    pub xattrs: &'a [(&'a str, &'a [u8])],
}

pub fn e(path: &str) -> E<'_> {
    E {
        path,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: 1_700_000_000,
        xattrs: &[],
    }
}

impl Default for Tar {
    fn default() -> Self {
        Tar {
            b: tar::Builder::new(Vec::new()),
        }
    }
}

impl Tar {
    fn pax(&mut self, recs: &[(String, Vec<u8>)]) {
        if recs.is_empty() {
            return;
        }
        let mut data = Vec::new();
        for (k, v) in recs {
            let body_len = 1 + k.len() + 1 + v.len() + 1;
            let mut len = body_len + 1;
            while format!("{len}").len() + body_len != len {
                len = format!("{len}").len() + body_len;
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..9].copy_from_slice(b"PaxHeader");
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        self.b.append(&h, &data[..]).unwrap();
    }

    fn add(&mut self, e: &E, t: tar::EntryType, link: &str, data: &[u8], dev: (u32, u32)) {
        let mut recs: Vec<(String, Vec<u8>)> = e
            .xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.to_vec()))
            .collect();
        if e.path.len() > 100 {
            recs.push(("path".into(), e.path.as_bytes().to_vec()));
        }
        if e.uid > 0o7777777 {
            recs.push(("uid".into(), e.uid.to_string().into_bytes()));
        }
        self.pax(&recs);
        let mut h = tar::Header::new_ustar();
        let n = e.path.len().min(100);
        h.as_old_mut().name[..n].copy_from_slice(&e.path.as_bytes()[..n]);
        h.set_entry_type(t);
        h.set_mode(e.mode);
        h.set_uid(e.uid.min(0o7777777));
        h.set_gid(e.gid);
        h.set_mtime(e.mtime);
        h.set_size(data.len() as u64);
        if !link.is_empty() {
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_device_major(dev.0).unwrap();
        h.set_device_minor(dev.1).unwrap();
        h.set_cksum();
        self.b.append(&h, data).unwrap();
    }

    pub fn file(&mut self, e: E, data: &[u8]) -> &mut Self {
        self.add(&e, tar::EntryType::Regular, "", data, (0, 0));
        self
    }
    pub fn dir(&mut self, mut e: E) -> &mut Self {
        if e.mode == 0o644 {
            e.mode = 0o755;
        }
        self.add(&e, tar::EntryType::Directory, "", b"", (0, 0));
        self
    }
    pub fn symlink(&mut self, e: E, target: &str) -> &mut Self {
        self.add(&e, tar::EntryType::Symlink, target, b"", (0, 0));
        self
    }
    pub fn hardlink(&mut self, e: E, target: &str) -> &mut Self {
        self.add(&e, tar::EntryType::Link, target, b"", (0, 0));
        self
    }
    pub fn dev(&mut self, e: E, t: tar::EntryType, major: u32, minor: u32) -> &mut Self {
        self.add(&e, t, "", b"", (major, minor));
        self
    }
    /// A GNU sparse file: `size` apparent bytes, `data` at offset `at`.
    pub fn sparse(&mut self, path: &str, size: u64, at: u64, data: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        let g = h.as_gnu_mut().unwrap();
        let oct = |dst: &mut [u8; 12], v: u64| {
            // 12 octal digits, no terminator: 10 GiB needs all of them.
            dst.copy_from_slice(format!("{v:012o}").as_bytes());
        };
        oct(&mut g.sparse[0].offset, at);
        oct(&mut g.sparse[0].numbytes, data.len() as u64);
        // A final empty segment at the end marks the real size.
        oct(&mut g.sparse[1].offset, size);
        oct(&mut g.sparse[1].numbytes, 0);
        oct(&mut g.realsize, size);
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn bytes(&mut self) -> Vec<u8> {
        self.b.finish().unwrap();
        std::mem::take(self.b.get_mut())
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    g.write_all(bytes).unwrap();
    g.finish().unwrap()
}

pub const GZ: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";

pub fn config(diff_ids: &[String], arch: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux",
        "created": "2024-01-02T03:04:05Z",
        "config": {"Env": ["PATH=/bin", "A=b"], "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"],
                   "WorkingDir": "/w", "User": "1000:1000"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids.iter().map(|d| format!("sha256:{d}")).collect::<Vec<_>>()},
    }))
    .unwrap()
}

pub fn put_blob(dir: &Path, bytes: &[u8]) -> String {
    let d = sha(bytes);
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("blobs/sha256").join(&d), bytes).unwrap();
    d
}

/// An OCI layout with one image of `layers` (uncompressed tar, media
/// type); returns the manifest bytes.
pub fn oci_layout(dir: &Path, layers: &[(Vec<u8>, &str)], arch: &str, tag: &str) -> Vec<u8> {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|(t, mt)| {
            if mt.ends_with("gzip") {
                sha(&gunzip(t).unwrap_or_default())
            } else {
                sha(t)
            }
        })
        .collect();
    let cfg = config(&diff_ids, arch);
    let cd = put_blob(dir, &cfg);
    let ls: Vec<_> = layers
        .iter()
        .map(|(b, mt)| serde_json::json!({"mediaType": mt, "digest": format!("sha256:{}", put_blob(dir, b)), "size": b.len()}))
        .collect();
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{cd}"), "size": cfg.len()},
        "layers": ls,
    }))
    .unwrap();
    let md = put_blob(dir, &m);
    write_index(
        dir,
        &[serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": format!("sha256:{md}"), "size": m.len(),
        "annotations": {"org.opencontainers.image.ref.name": tag}})],
    );
    m
}

pub fn write_index(dir: &Path, manifests: &[serde_json::Value]) {
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// None for a damaged stream (tests give those on purpose).
pub fn gunzip(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(b), &mut out).ok()?;
    Some(out)
}

/// A classic `docker save` archive of plain layers.
pub fn docker_archive(file: &Path, layers: &[Vec<u8>], tag: &str) {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let cfg = config(&diff_ids, "amd64");
    let mut b = tar::Builder::new(std::fs::File::create(file).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    let cfg_name = format!("{}.json", sha(&cfg));
    add(&cfg_name, &cfg);
    let mut names = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let n = format!("{i:064x}/layer.tar");
        add(&n, l);
        names.push(n);
    }
    let manifest = serde_json::json!([{"Config": cfg_name, "RepoTags": [tag], "Layers": names}]);
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    b.finish().unwrap();
}

pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mvm-image-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The project's rule: a check that cannot run fails, unless
/// MVM_ALLOW_SKIPS=1, and then says why it skipped.
pub fn skip(why: &str) {
    if std::env::var("MVM_ALLOW_SKIPS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {why}");
    } else {
        panic!("cannot run this check: {why} (set MVM_ALLOW_SKIPS=1 to skip)");
    }
}

/// fsck.erofs must accept the image; false if it could not run (skipped).
pub fn fsck(img: &Path) -> bool {
    match Command::new("fsck.erofs").arg(img).output() {
        Ok(o) => {
            assert!(
                o.status.success(),
                "fsck.erofs rejects {}: {}{}",
                img.display(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            true
        }
        Err(e) => {
            skip(&format!("fsck.erofs: {e} (apt-get install erofs-utils)"));
            false
        }
    }
}

/// A read-only loop mount of an EROFS image, unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    pub fn new(img: &Path) -> Option<Mount> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("mounting an EROFS image needs root");
            return None;
        }
        let dir = img.with_extension("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let o = Command::new("mount")
            .args(["-o", "loop,ro", "-t", "erofs"])
            .arg(img)
            .arg(&dir)
            .output()
            .unwrap();
        if !o.status.success() {
            skip(&format!(
                "mount -t erofs: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return None;
        }
        Some(Mount { dir })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Files under the store's tmp/, blobs/ and rootfs/ (for "nothing left").
pub fn store_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["tmp", "blobs/sha256", "rootfs"] {
        if let Ok(rd) = std::fs::read_dir(root.join(sub)) {
            out.extend(rd.map(|e| e.unwrap().path()));
        }
    }
    out.sort();
    out
}

pub fn lgetxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated and live across the call;
    // buf is writable for its full length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}
