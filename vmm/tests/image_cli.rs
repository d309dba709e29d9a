//! `mvm image` and `--image` when something is wrong: one line on stderr
//! that says what to do, exit 125, and the store left as it was. These
//! run the real binary on images written here; none needs a VM.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

mod common;

const SETUP_FAILED: i32 = 125;

fn mvm(store: &Path, args: &[&str]) -> Output {
    // `run` checks that the kernel and initramfs are readable before it
    // looks at the image: any readable file passes that check.
    let readable = env!("CARGO_MANIFEST_DIR").to_string() + "/Cargo.toml";
    Command::new(env!("CARGO_BIN_EXE_mvm"))
        .args(args)
        .env("MVM_IMAGES", store)
        .env("MVM_KERNEL", &readable)
        .env("MVM_INITRD", &readable)
        .env("MVM_ALLOW_SOFTWARE_KVM", "1")
        .output()
        .expect("run mvm")
}

/// `mvm run ...` answers after the KVM check: without a usable /dev/kvm
/// it cannot reach the image, which only excuses a skip here.
fn kvm_blocks(out: &Output) -> bool {
    if out.status.code() != Some(122) {
        return false;
    }
    common::skip_or_fail(
        "unknown_images_and_sources",
        "no usable /dev/kvm: `mvm run` stops at the KVM check before the image",
    );
    true
}

fn one_line(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(SETUP_FAILED), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(
        stderr.starts_with("mvm: ") && stderr.contains(needle),
        "expected {needle:?} in: {stderr}"
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mvm-image-cli-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every file under `dir`, relative, sorted: what "unchanged" compares.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// An OCI layout with one layer of `zero_blocks` 512-byte zero blocks (an
/// empty tar; the count makes the digest differ); `corrupt` stores the
/// layer under its digest with one byte changed.
fn layout(dir: &Path, zero_blocks: usize, corrupt: bool) {
    let layer = vec![0u8; 512 * zero_blocks];
    layout_with_layer(dir, &layer);
    if corrupt {
        let mut stored = layer.clone();
        stored[0] = 1;
        fs::write(dir.join("blobs/sha256").join(sha(&layer)), stored).unwrap();
    }
}

#[test]
fn a_damaged_layer_is_one_line_and_leaves_the_store_as_it_was() {
    let dir = scratch("damaged");
    let store = dir.join("store");
    // Positive control: the same layout undamaged imports and converts.
    layout(&dir.join("good"), 2, false);
    let good = format!("oci:{}:t", dir.join("good").display());
    let out = mvm(&store, &["image", "import", &good, "--name", "good"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = files(&store);
    assert!(
        before.iter().any(|f| f.starts_with("rootfs/")),
        "{before:?}"
    );

    // Another layer (a blob the store has is not read again, rightly).
    layout(&dir.join("bad"), 3, true);
    let bad = format!("oci:{}:t", dir.join("bad").display());
    let out = mvm(&store, &["image", "import", &bad, "--name", "bad"]);
    one_line(&out, "digest");
    assert_eq!(files(&store), before, "the store changed");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn unknown_images_and_sources() {
    let dir = scratch("unknown");
    let store = dir.join("store");
    one_line(&mvm(&store, &["image", "rm", "nosuch"]), "nosuch");
    one_line(
        &mvm(&store, &["image", "import", "oci:/nonexistent/layout"]),
        "/nonexistent/layout",
    );
    one_line(&mvm(&store, &["image", "import", "nosuch"]), "oci:DIR");
    let run = mvm(&store, &["run", "--image", "nosuch", "--", "true"]);
    if kvm_blocks(&run) {
        return;
    }
    one_line(&run, "nosuch");
    one_line(
        &mvm(
            &store,
            &["run", "--rootfs", "/nonexistent.erofs", "--", "true"],
        ),
        "--rootfs",
    );
    one_line(
        &mvm(
            &store,
            &["run", "--image", "none", "--scratch", "1G", "--", "true"],
        ),
        "--image or --rootfs",
    );
    one_line(
        &mvm(&store, &["run", "--image", "none"]),
        "no command given",
    );
    // The test binary has no default image beside it, and this store none.
    one_line(
        &mvm(&store, &["run", "--", "true"]),
        "the default image is not built",
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_is_one_line_and_leaves_nothing_half_written() {
    let dir = scratch("full");
    let disk = dir.join("disk");
    fs::create_dir_all(&disk).unwrap();
    // A 2 MiB tmpfs for the store: only root may mount one.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2M", "tmpfs"])
        .arg(&disk)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        let _ = fs::remove_dir_all(&dir);
        return common::skip_or_fail(
            "a_full_disk_is_one_line_and_leaves_nothing_half_written",
            "cannot mount a small tmpfs for the store (needs root)",
        );
    }
    let store = disk.join("store");
    // Control: a small image fits.
    layout(&dir.join("small"), 2, false);
    let small = format!("oci:{}:t", dir.join("small").display());
    let out = mvm(&store, &["image", "import", &small, "--name", "small"]);
    let fits = out.status.code() == Some(0);
    let before = files(&store);
    // A 4 MiB layer cannot fit.
    layout(&dir.join("big"), 8192, false);
    let big = format!("oci:{}:t", dir.join("big").display());
    let full = mvm(&store, &["image", "import", &big, "--name", "big"]);
    let after = files(&store);
    let _ = Command::new("umount").arg(&disk).status();
    let _ = fs::remove_dir_all(&dir);
    assert!(fits, "{}", String::from_utf8_lossy(&out.stderr));
    one_line(&full, "no space left");
    assert_eq!(after, before, "the store changed");
}

/// An OCI layout around one given (uncompressed tar) layer.
fn layout_with_layer(dir: &Path, layer: &[u8]) {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha(bytes);
        fs::write(blobs.join(&d), bytes).unwrap();
        (d, bytes.len())
    };
    let (ld, ls) = put(layer);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["sha256:{ld}"]}}}}"#
    );
    let (cd, cs) = put(config.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{cd}","size":{cs}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:{ld}","size":{ls}}}]}}"#
    );
    let (md, ms) = put(manifest.as_bytes());
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{md}","size":{ms},"annotations":{{"org.opencontainers.image.ref.name":"t"}}}}]}}"#
        ),
    )
    .unwrap();
}

#[test]
fn an_unprivileged_user_converts_an_image_of_many_owners() {
    const TEST: &str = "an_unprivileged_user_converts_an_image_of_many_owners";
    // Root is needed only to become nobody and to mount the result.
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return common::skip_or_fail(
            TEST,
            "needs root to run the conversion as nobody and to mount its result",
        );
    }
    let dir = scratch("nobody");
    // The layer, written by Python's tarfile (a real tar writer): owners
    // nobody could never create files as, a setuid bit, a root-only file,
    // a device node and a file capability.
    let layer = dir.join("layer.tar");
    let script = r##"
import io, sys, tarfile
out = tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT)
def add(name, data=b"", **kw):
    ti = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(ti, k, v)
    ti.size = len(data)
    out.addfile(ti, io.BytesIO(data))
add("bin", type=tarfile.DIRTYPE, mode=0o755)
add("bin/suid", b"#!/bin/sh\n", uid=4242, gid=4343, mode=0o4755)
add("etc", type=tarfile.DIRTYPE, mode=0o755)
add("etc/secret", b"root-only\n", uid=0, gid=0, mode=0o600)
add("dev", type=tarfile.DIRTYPE, mode=0o755)
add("dev/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
ti = tarfile.TarInfo("bin/ping")
ti.size = 4
ti.mode = 0o755
ti.pax_headers = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}
out.addfile(ti, io.BytesIO(b"ping"))
out.close()
"##;
    let made = Command::new("python3")
        .args(["-c", script])
        .arg(&layer)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "python3 could not write the test layer");
    layout_with_layer(&dir.join("oci"), &fs::read(&layer).unwrap());
    let store = dir.join("store");
    fs::create_dir_all(&store).unwrap();
    let out_dir = dir.join("out");
    fs::create_dir_all(&out_dir).unwrap();
    for d in [&store, &out_dir] {
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    // Everything on the way readable by nobody.
    use std::os::unix::fs::PermissionsExt;
    for d in [
        dir.as_path(),
        &dir.join("oci"),
        &dir.join("oci/blobs"),
        &dir.join("oci/blobs/sha256"),
    ] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let root_file = out_dir.join("root.erofs");
    let source = format!("oci:{}:t", dir.join("oci").display());
    let converted = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_mvm"))
        .args(["image", "export-root", &source])
        .arg(&root_file)
        .env("MVM_IMAGES", &store)
        .output()
        .expect("run setpriv");
    assert!(
        converted.status.success(),
        "as nobody: {}",
        String::from_utf8_lossy(&converted.stderr)
    );
    // Read back through the kernel's own EROFS driver.
    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "loop,ro", "-t", "erofs"])
        .arg(&root_file)
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        let _ = fs::remove_dir_all(&dir);
        return common::skip_or_fail(TEST, "cannot loop-mount an EROFS image here");
    }
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = |p: &str| fs::symlink_metadata(mnt.join(p)).unwrap();
    let suid = meta("bin/suid");
    let secret = meta("etc/secret");
    let null = meta("dev/null");
    let secret_text = fs::read_to_string(mnt.join("etc/secret")).unwrap_or_default();
    let mut cap = [0u8; 64];
    let path = std::ffi::CString::new(mnt.join("bin/ping").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let cap_len = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            cap.as_mut_ptr().cast(),
            cap.len(),
        )
    };
    let _ = Command::new("umount").arg(&mnt).status();
    let _ = fs::remove_dir_all(&dir);
    assert_eq!(
        (suid.uid(), suid.gid(), suid.mode() & 0o7777),
        (4242, 4343, 0o4755)
    );
    assert_eq!((secret.uid(), secret.mode() & 0o777), (0, 0o600));
    assert_eq!(secret_text, "root-only\n");
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), libc::makedev(1, 3));
    assert_eq!(cap_len, 20, "the file capability did not survive");
    assert_eq!(cap[0..4], [1, 0, 0, 2]);
}
