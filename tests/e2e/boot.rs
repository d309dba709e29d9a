//! The boot path end to end: our kernel and guest-init, booted by the real
//! `mvm`, through the test host where this machine's /dev/kvm cannot run
//! Linux.

use mvm_e2e::{guest_kernel_release, mvm};

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn boot_reaches_guest_init_and_powers_off_cleanly() {
    // No command on the kernel command line: guest-init runs a shell on the
    // console, which reads our stdin and exits with it.
    let run = mvm(
        &[
            "boot",
            "--kernel",
            "build/share/mvm/vmlinux",
            "--initrd",
            "build/share/mvm/initramfs.cpio",
            "--print-stats",
        ],
        b"echo $((6 * 7))-from-the-shell\nexit 0\n",
    );
    assert_eq!(run.code, Some(0), "clean power-off exits 0");
    let ready = format!("mvm-init: ready (kernel {})", guest_kernel_release());
    assert!(run.stdout.contains(&ready), "no '{ready}' on the console");
    // The tty echoes the input line; only the shell prints the product.
    assert!(
        run.stdout.contains("42-from-the-shell"),
        "the shell ran our input"
    );
    assert!(
        run.stderr.contains("mvm: boot to init: "),
        "boot marker timed"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn run_exits_with_the_commands_status() {
    let run = mvm(&["run", "--", "sh", "-c", "exit 3"], b"");
    assert_eq!(run.code, Some(3));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn run_sees_the_guest_kernel_not_the_hosts() {
    let run = mvm(&["run", "--", "uname", "-r"], b"");
    assert_eq!(run.code, Some(0));
    let release = guest_kernel_release();
    assert!(
        run.stdout.lines().any(|l| l.trim() == release),
        "guest uname -r should print {release}"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(host.trim(), release, "host and guest kernels must differ");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn guest_kernel_panic_has_its_own_exit_code() {
    let run = mvm(
        &[
            "run",
            "--root",
            "--",
            "sh",
            "-c",
            "echo c > /proc/sysrq-trigger",
        ],
        b"",
    );
    assert_eq!(run.code, Some(121), "documented code for a guest crash");
    assert!(run.stderr.contains("mvm: the guest kernel panicked"));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn missing_command_is_127() {
    let run = mvm(&["run", "--", "no-such-command-here"], b"");
    assert_eq!(run.code, Some(127));
    assert!(
        run.stderr.contains("no-such-command-here") || run.stdout.contains("no-such-command-here")
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn cpus_and_memory_reach_the_guest() {
    let run = mvm(
        &[
            "run",
            "--cpus",
            "2",
            "--memory",
            "256M",
            "--",
            "sh",
            "-c",
            "echo cpus=$(grep -c ^processor /proc/cpuinfo); grep MemTotal /proc/meminfo",
        ],
        b"",
    );
    assert_eq!(run.code, Some(0));
    assert!(
        run.stdout.contains("cpus=2"),
        "both vCPUs came up (MP table)"
    );
    let kib: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("MemTotal line");
    assert!(
        (150 * 1024..=256 * 1024).contains(&kib),
        "MemTotal {kib} KiB for a 256 MiB guest"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn poweroff_and_reboot_in_the_guest_end_the_vm_cleanly() {
    // busybox signals PID 1 for these; guest-init ends the command and
    // stops the VM as after any command.
    for command in ["poweroff", "reboot"] {
        let input = format!("{command}\n");
        let run = mvm(&["boot", "--timeout", "60"], input.as_bytes());
        assert_eq!(run.code, Some(0), "{command} ends the VM with 0");
    }
}
