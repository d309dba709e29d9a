//! What a user sees when `mvm` cannot start a VM: one line on stderr that
//! says what to do, a documented exit code, and nothing on stdout. These run
//! the real binary; none of them needs a bootable guest.

mod common;

use std::io::Write;
use std::process::{Command, Output};

use common::{kvm_unusable, nobody_can_run, skip_or_fail};

const SETUP_FAILED: i32 = 125;
const KVM_UNAVAILABLE: i32 = 122;

fn mvm(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mvm"));
    cmd.args(args)
        .env_remove("MVM_KERNEL")
        .env_remove("MVM_INITRD")
        // The busybox root: these checks are about what comes before
        // any image (tests/image_cli.rs has the image's).
        .env("MVM_IMAGE", "none")
        // These checks are about other errors; the one that refuses a
        // PVM-backed /dev/kvm (this project's machines) has its own test.
        .env("MVM_ALLOW_SOFTWARE_KVM", "1")
        // Session directories under the target directory, not /tmp
        // (`/tmp/mvm-<uid>` would outlive the tests).
        .env("XDG_RUNTIME_DIR", env!("CARGO_TARGET_TMPDIR"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run mvm")
}

/// Exactly one line on stderr, starting with `mvm:`, containing `needle`.
fn assert_one_line_error(out: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(stderr.starts_with("mvm: "), "{stderr}");
    assert!(stderr.contains(needle), "expected '{needle}' in: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

#[test]
fn missing_kernel_names_the_file_and_the_fix() {
    let out = mvm(
        &[
            "run",
            "--kernel",
            "/nonexistent/vmlinux",
            "--initrd",
            "/nonexistent/initramfs.cpio",
            "--",
            "true",
        ],
        &[],
    );
    // Without KVM here the KVM error comes first; both are one line. Only
    // a /dev/kvm this test cannot open either excuses that.
    if out.status.code() == Some(KVM_UNAVAILABLE) {
        if let Some(why) = kvm_unusable() {
            return skip_or_fail("missing_kernel_names_the_file_and_the_fix", &why);
        }
    }
    assert_one_line_error(&out, SETUP_FAILED, "/nonexistent/vmlinux' does not exist");
}

#[test]
fn a_failed_run_leaves_no_session_directory() {
    let runtime = std::env::temp_dir().join(format!("mvm-cli-rt-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    let rt = runtime.to_str().unwrap();
    // A file that exists but is no kernel fails in the VM build, after the
    // session directory was made (a missing one fails before).
    let not_a_kernel = runtime.join("not-a-kernel");
    std::fs::write(&not_a_kernel, b"not a kernel").unwrap();
    let out = mvm(
        &[
            "run",
            "--no-workspace",
            "--kernel",
            not_a_kernel.to_str().unwrap(),
            "--initrd",
            not_a_kernel.to_str().unwrap(),
            "--",
            "true",
        ],
        &[("XDG_RUNTIME_DIR", rt)],
    );
    if out.status.code() == Some(KVM_UNAVAILABLE) {
        if let Some(why) = kvm_unusable() {
            std::fs::remove_dir_all(&runtime).unwrap();
            return skip_or_fail("a_failed_run_leaves_no_session_directory", &why);
        }
    }
    assert_eq!(out.status.code(), Some(SETUP_FAILED));
    let base = runtime.join("mvm");
    assert!(base.is_dir(), "the run created its session base");
    let left: Vec<_> = std::fs::read_dir(&base).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    std::fs::remove_dir_all(&runtime).unwrap();
}

#[test]
fn a_file_that_is_not_a_kernel_is_refused() {
    let f = vmm_sys_util::tempfile::TempFile::new().unwrap();
    f.as_file().write_all(b"not a kernel at all").unwrap();
    let path = f.as_path().to_str().unwrap();
    let out = mvm(&["boot", "--kernel", path, "--memory", "64M"], &[]);
    if out.status.code() == Some(KVM_UNAVAILABLE) {
        if let Some(why) = kvm_unusable() {
            return skip_or_fail("a_file_that_is_not_a_kernel_is_refused", &why);
        }
    }
    assert_one_line_error(&out, SETUP_FAILED, "is not a loadable x86-64 Linux kernel");
}

#[test]
fn memory_too_small() {
    let out = mvm(&["run", "--memory", "16M", "--", "true"], &[]);
    assert_one_line_error(&out, SETUP_FAILED, "too small");
}

#[test]
fn bad_memory_size_and_cpu_count() {
    let out = mvm(&["run", "--memory", "lots", "--", "true"], &[]);
    assert_one_line_error(&out, SETUP_FAILED, "not a size");
    let out = mvm(&["run", "--cpus", "99", "--", "true"], &[]);
    assert_one_line_error(&out, SETUP_FAILED, "--cpus must be between 1 and 32");
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = mvm(&["run", "--no-such-flag", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(SETUP_FAILED));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--no-such-flag"), "{stderr}");
}

#[test]
fn no_kvm_device() {
    let out = mvm(
        &["run", "--", "true"],
        &[("MVM_KVM_DEVICE", "/nonexistent/kvm")],
    );
    assert_one_line_error(&out, KVM_UNAVAILABLE, "/nonexistent/kvm does not exist");
}

#[test]
fn kvm_device_without_permission() {
    // Root opens any file regardless of its mode, so the check drops to
    // the `nobody` user where it can; otherwise it runs as the caller.
    let f = vmm_sys_util::tempfile::TempFile::new().unwrap();
    let path = f.as_path().to_str().unwrap().to_string();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let is_root = current_uid() == 0;
    let out = if is_root {
        // Whether nobody can run mvm at all is asked first, so that
        // whatever mvm then says is checked, never taken as a reason to
        // skip.
        if let Err(why) = nobody_can_run(env!("CARGO_BIN_EXE_mvm")) {
            return skip_or_fail("kvm_device_without_permission", &why);
        }
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_mvm"))
            .args(["run", "--", "true"])
            .env("MVM_KVM_DEVICE", &path)
            .output()
            .expect("run setpriv")
    } else {
        mvm(&["run", "--", "true"], &[("MVM_KVM_DEVICE", &path)])
    };
    assert_one_line_error(&out, KVM_UNAVAILABLE, "no permission to open");
}

fn current_uid() -> u32 {
    // /proc/self/status "Uid:" line, real uid first: avoids unsafe libc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

#[test]
fn help_documents_exit_codes() {
    let out = mvm(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for code in ["121", "122", "123", "124", "125", "126", "127"] {
        assert!(help.contains(code), "exit code {code} missing from --help");
    }
}

#[test]
fn shared_directories_are_checked_before_the_vm_starts() {
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let base = dir.as_path().to_str().unwrap().to_string();
    let file = format!("{base}/file");
    std::fs::write(&file, b"x").unwrap();
    let missing = format!("{base}/missing");
    let cases: [(&[&str], &str); 6] = [
        (&["--workspace", &missing], "does not exist"),
        (&["--workspace", &file], "is not a directory"),
        (&["--mount", &format!("{missing}:/data")], "does not exist"),
        (&["--mount", &base], "is not HOST:GUEST"),
        (
            &["--mount", &format!("{base}:/etc")],
            "guest system directory",
        ),
        (&["--mount", &format!("{base}:data")], "must be absolute"),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["--", "true"]);
        // A missing /dev/kvm must not be what fails: these come first.
        let out = mvm(&args, &[("MVM_KVM_DEVICE", "/nonexistent/kvm")]);
        assert_one_line_error(&out, SETUP_FAILED, needle);
    }
}

#[test]
fn a_kvm_that_cannot_boot_linux_is_refused_up_front() {
    // The check comes once /dev/kvm has opened: without one, this test
    // cannot see it.
    if let Some(why) = kvm_unusable() {
        return skip_or_fail("a_kvm_that_cannot_boot_linux_is_refused_up_front", &why);
    }
    // A stand-in /sys/module: kvm_pvm alone is PVM; with kvm_amd (or
    // kvm_intel) beside it, hardware virtualization is there too.
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let modules = dir.as_path().to_str().unwrap().to_string();
    std::fs::create_dir(dir.as_path().join("kvm")).unwrap();
    std::fs::create_dir(dir.as_path().join("kvm_pvm")).unwrap();
    let kernel = dir.as_path().join("vmlinux");
    std::fs::write(&kernel, b"not run").unwrap();
    let kernel = kernel.to_str().unwrap();
    let pvm = [
        ("MVM_SYS_MODULE", modules.as_str()),
        ("MVM_ALLOW_SOFTWARE_KVM", "0"),
    ];
    for sub in ["run", "boot"] {
        let mut args = vec![sub, "--kernel", kernel, "--initrd", kernel];
        if sub == "run" {
            args.extend(["--no-workspace", "--", "true"]);
        }
        let out = mvm(&args, &pvm);
        assert_one_line_error(&out, KVM_UNAVAILABLE, "PVM-backed");
        assert!(String::from_utf8_lossy(&out.stderr).contains("tests/testhost/mvm"));
    }
    // Control: with a hardware module loaded, the same call gets past the
    // check (to the kernel, which is not one).
    std::fs::create_dir(dir.as_path().join("kvm_amd")).unwrap();
    {
        let out = mvm(
            &[
                "run",
                "--kernel",
                kernel,
                "--initrd",
                kernel,
                "--no-workspace",
                "--",
                "true",
            ],
            &pvm,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("PVM-backed"), "{stderr}");
        assert_eq!(out.status.code(), Some(SETUP_FAILED), "{stderr}");
    }
}

#[test]
fn the_home_directory_and_what_lies_above_it_are_not_shared_by_accident() {
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let home = dir.as_path().join("home/user");
    let project = home.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let home = home.to_str().unwrap().to_string();
    let above = dir.as_path().join("home").to_str().unwrap().to_string();
    let env = [
        ("HOME", home.as_str()),
        ("MVM_KVM_DEVICE", "/nonexistent/kvm"),
    ];
    for (flags, needle) in [
        (vec!["--workspace", "/"], "is the root directory"),
        (
            vec!["--workspace", &home, "--write"],
            "is your home directory",
        ),
        (vec!["--workspace", &above], "above your home directory"),
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(&flags);
        args.extend(["--", "true"]);
        let out = mvm(&args, &env);
        assert_one_line_error(&out, SETUP_FAILED, needle);
        assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-home-share"));
    }
    let mount = format!("{home}:/h:ro");
    let out = mvm(
        &[
            "run",
            "--workspace",
            project.to_str().unwrap(),
            "--mount",
            &mount,
            "--",
            "true",
        ],
        &env,
    );
    assert_one_line_error(&out, SETUP_FAILED, "is your home directory");
    // Control: with the flag, and for a project inside home, the share
    // check passes and the run gets as far as KVM (which is missing here).
    for args in [
        vec![
            "run",
            "--workspace",
            &home,
            "--allow-home-share",
            "--",
            "true",
        ],
        vec![
            "run",
            "--workspace",
            project.to_str().unwrap(),
            "--",
            "true",
        ],
    ] {
        let out = mvm(&args, &env);
        assert_one_line_error(&out, KVM_UNAVAILABLE, "does not exist");
    }
}

#[test]
fn an_unreadable_workspace_is_refused() {
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let locked = dir.as_path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    // The check is the caller's access; root has it regardless of modes,
    // so the test drops to nobody where it can.
    let args = ["run", "--workspace", locked.to_str().unwrap(), "--", "true"];
    let out = if current_uid() == 0 {
        std::fs::set_permissions(
            dir.as_path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        if let Err(why) = nobody_can_run(env!("CARGO_BIN_EXE_mvm")) {
            return skip_or_fail("an_unreadable_workspace_is_refused", &why);
        }
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_mvm"))
            .args(args)
            .output()
            .expect("run setpriv")
    } else {
        mvm(&args, &[])
    };
    assert_one_line_error(&out, SETUP_FAILED, "not readable by you");
}
