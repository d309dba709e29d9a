//! The boot path end to end: our kernel and guest-init, booted by the real
//! `mvm`, through the test host where this machine's /dev/kvm cannot run
//! Linux.

use mvm_e2e::{guest_kernel_release, mvm, mvm_with, Options};

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
fn the_guest_kernel_boots_without_a_warning() {
    // The whole kernel log, as root (dmesg may be restricted), then the
    // XSAVE flags the guest kernel kept.
    let run = mvm(
        &[
            "run",
            "--root",
            "--",
            "sh",
            "-c",
            "dmesg; echo \"flags: $(grep -o -w -E 'xsave|avx' /proc/cpuinfo | sort -u | paste -sd' ')\"",
        ],
        b"",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let log = run.stdout.as_str();
    // The control: this is the kernel's log from its first line.
    assert!(log.contains("Linux version "), "{log}");
    for bad in [
        "WARNING:",
        "Call Trace",
        "XSAVE consistency problem",
        "BUG:",
    ] {
        assert!(!log.contains(bad), "the boot log holds {bad:?}:\n{log}");
    }
    // A kernel that found XSAVE kept it on (a failed size check turns it
    // off, and the guest loses AVX with it).
    if log.contains("x86/fpu: Supporting XSAVE feature") {
        let flags = log.lines().find_map(|l| l.strip_prefix("flags: "));
        assert!(
            flags.is_some_and(|f| f.split(' ').any(|x| x == "xsave")),
            "XSAVE was turned off: {flags:?}"
        );
    }
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn run_sees_the_guest_kernel_not_the_hosts() {
    // The release alone cannot tell the guest from the test host: both run
    // a kernel built from the same source. A boot id is per kernel
    // instance, so the command's must differ from the one of the machine
    // mvm ran on (its setup script reads it) and from this machine's.
    const BOOT_ID: &str = "cat /proc/sys/kernel/random/boot_id";
    let run = mvm_with(
        &Options {
            setup: Some(BOOT_ID),
            ..Options::default()
        },
        &["run", "--", "sh", "-c", &format!("uname -r; {BOOT_ID}")],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let release = guest_kernel_release();
    let out: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(out.len(), 2, "uname -r and a boot id: {out:?}");
    assert_eq!(out[0], release, "guest uname -r should print {release}");
    let guest_boot = out[1];
    let host_boot = run.setup_lines().first().copied().unwrap_or_default();
    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(guest_boot.len(), 36, "a boot id: {guest_boot:?}");
    assert_eq!(host_boot.len(), 36, "the host's boot id: {host_boot:?}");
    assert_ne!(
        guest_boot, host_boot,
        "the command ran on the host mvm ran on, not in a guest"
    );
    assert_ne!(
        guest_boot,
        this_boot.trim(),
        "the command ran on this machine, not in a guest"
    );
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
    // stops the VM as after any command. Were the request ignored, the
    // shell would read on, and with `exit 0` typed next end the VM with 0
    // all the same: so the line in between, which must never run, prints a
    // marker after a pause long enough for the request to have ended the
    // VM (the tty echoes the line itself, hence the arithmetic: only
    // running it prints 42-lingered).
    for command in ["poweroff", "reboot"] {
        let input = format!("{command}\nsleep 20; echo $((6 * 7))-lingered\nexit 0\n");
        // `quiet`: a kernel warning printed while the line is typed (the
        // clocksource watchdog's, which the test host's emulated timing
        // provokes now and then) would split the shell's echo of it.
        let run = mvm(
            &["boot", "--timeout", "60", "--cmdline", "quiet"],
            input.as_bytes(),
        );
        let mut from = run.stdout.len().saturating_sub(2000);
        while !run.stdout.is_char_boundary(from) {
            from += 1;
        }
        let tail = &run.stdout[from..];
        // The shell's line editor shows each line it reads after its
        // prompt: without this the request might never have been typed.
        assert!(
            run.stdout.contains(&format!("# {command}")),
            "the shell never read the {command} line: ...{tail}"
        );
        assert!(
            !run.stdout.contains("42-lingered"),
            "the guest kept running after {command}: ...{tail}"
        );
        assert_eq!(run.code, Some(0), "{command} ends the VM with 0");
        assert!(
            run.stdout.contains("mvm-init: ready"),
            "the shell was reached: {}",
            run.stdout
        );
    }
}
