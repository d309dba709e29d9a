//! Check 9: a separate kernel. The guest's kernel is another instance
//! than the host's (boot id, version string, modules), and crashing or
//! rebooting it ends only that VM, with exit code 121, while the host
//! keeps its boot and can run the next VM at once; the command cannot
//! speak for guest-init on the VMM's status port (9d); and even the
//! guest's root has no way to the virtio rings behind its kernel (9e).

use mvm_e2e::{Options, Run};

use crate::battery::{
    attack, attack_scripted, attacker, code, control, excerpt, mvm_says, script, value, Check,
    Source, Verdict,
};

/// The kernel's identity, as `key=value` lines, on whichever side runs it.
const IDENTITY: &str = r#"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
echo "release=$(uname -r)"
echo "version=$(cat /proc/version)"
echo "modules=$(cat /proc/modules 2>/dev/null | wc -l) loaded$([ -e /proc/modules ] || echo ', no /proc/modules')"
echo "cmdline=$(cat /proc/cmdline)"
echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
"#;

/// This machine's kernel (the outermost host: the same as the test host's
/// host, or mvm's host itself on hardware KVM): `key=value` like IDENTITY.
fn this_machine() -> Vec<String> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let modules = match std::fs::read_to_string("/proc/modules") {
        Ok(m) => format!("{} loaded", m.lines().count()),
        Err(_) => "0 loaded, no /proc/modules".into(),
    };
    vec![
        format!("boot_id={}", read("/proc/sys/kernel/random/boot_id")),
        format!("release={}", read("/proc/sys/kernel/osrelease")),
        format!("version={}", read("/proc/version")),
        format!("modules={modules}"),
        format!("cmdline={}", read("/proc/cmdline")),
    ]
}

/// After a guest crash: the host's identity and uptime again (the same
/// boot, its clock run on through the VM's run: the host did not go down
/// with it), its kernel log's count of panics and oopses, then the next VM
/// on the same host.
fn host_survives() -> String {
    script(&format!(
        r#"
{IDENTITY}
echo "host_oopses=$(dmesg 2>/dev/null | grep -ciE 'kernel panic|oops|BUG:' || true)"
$MVM run --no-workspace -- echo next-vm-ok 2>/run/tmp/next.err
echo "next_status=$?"
sed 's/^/next stderr: /' /run/tmp/next.err | tail -n 3
leftovers | sed 's/^/left behind: /'
"#
    ))
}

fn host_identity_before() -> String {
    script(IDENTITY)
}

/// The host from setup and from after: the same boot, its uptime having
/// run on (a host that had gone down could not run the after script at
/// all: QEMU's test host ends at a reset, and a hardware host takes the
/// test with it; what the after script adds is that its clock ran on from
/// before mvm to after it), its kernel log free of panics, the next VM.
fn require_host_survived(v: &mut Verdict, run: &Run) {
    let before = run.setup_lines();
    let after = run.after_lines();
    let (b, a) = (value(&before, "boot_id"), value(&after, "boot_id"));
    v.saw(format!("host boot id unchanged: {}", b.is_some() && b == a));
    v.require(
        b.is_some() && b == a,
        format!("host boot id {b:?} then {a:?}"),
    );
    let uptime = |lines: &[&str]| value(lines, "uptime").and_then(|u| u.trim().parse::<f64>().ok());
    let (ub, ua) = (uptime(&before), uptime(&after));
    v.saw(format!(
        "host uptime {} s before mvm, {} s after",
        ub.map_or("?".into(), |u| format!("{u:.2}")),
        ua.map_or("?".into(), |u| format!("{u:.2}"))
    ));
    v.require(
        matches!((ub, ua), (Some(b), Some(a)) if a > b),
        "the host's uptime did not run on through the VM's run",
    );
    let oopses = value(&after, "host_oopses").unwrap_or("?");
    v.saw(format!(
        "panics or oopses in the host's kernel log: {oopses}"
    ));
    v.require(oopses == "0", "the host's kernel log shows a panic or oops");
    let next = value(&after, "next_status");
    v.saw(format!(
        "next VM on the same host: exit {}",
        next.unwrap_or("?")
    ));
    v.require(next == Some("0"), "the next mvm run failed");
    let left: Vec<&&str> = after
        .iter()
        .filter(|l| l.starts_with("left behind: "))
        .collect();
    v.require(left.is_empty(), format!("left behind: {left:?}"));
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_9a_the_guest_kernel_is_not_the_hosts() {
    let mut check = Check::new(
        "9a",
        "compare the guest kernel's identity (boot id, release, /proc/version, /proc/modules, command line) with the host mvm ran on and with this machine's kernel",
        "a boot id of its own (another kernel instance) and a command line of its own; a /proc/version other than this machine's; the test host, a kernel built from the same source by the same script, may share release and version (reported)",
    )
    .evidence(Source::Guest, "the boot id, version and command line the command printed")
    .evidence(Source::Host, "the host's own identity read by its setup script, and this machine's")
    .control(Source::Host, "a command run on the host itself would print the host's identity, read the same way by the setup script");
    let setup = host_identity_before();
    let run = check.run(|| {
        attack(
            &Options {
                setup: Some(&setup),
                ..Options::default()
            },
            &["--no-workspace", "--", "sh", "-c", IDENTITY],
        )
    });
    let mut v = Verdict::new();
    let host = run.setup_lines();
    let guest: Vec<&str> = run.stdout.lines().collect();
    let machine = this_machine();
    let machine: Vec<&str> = machine.iter().map(String::as_str).collect();
    v.saw(format!("exit {}", code(&run)));
    for key in ["boot_id", "release", "version", "modules", "cmdline"] {
        let (h, g, m) = (value(&host, key), value(&guest, key), value(&machine, key));
        v.saw(format!(
            "{key}: guest '{}', host '{}', this machine '{}'",
            excerpt(g.unwrap_or("?"), 50),
            excerpt(h.unwrap_or("?"), 50),
            excerpt(m.unwrap_or("?"), 50)
        ));
        let differs = |other: Option<&str>| g.is_some() && other.is_some() && g != other;
        match key {
            "boot_id" => v.require(
                differs(h) && differs(m),
                "the guest shares a boot id with a host kernel",
            ),
            "cmdline" => v.require(differs(h), "the guest has the host's command line"),
            "version" => v.require(differs(m), "the guest reports this machine's kernel"),
            _ => {}
        }
    }
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_9b_a_guest_kernel_panic_ends_only_that_vm() {
    let mut check = Check::new(
        "9b",
        "crash the guest kernel as guest root: echo c > /proc/sysrq-trigger",
        "exit 121 with 'the guest kernel panicked'; the host's boot id unchanged, its uptime run on, no panic in its kernel log, and the next VM runs",
    )
    .evidence(Source::Mvm, "exit 121, mvm's message and the guest console's panic it shows")
    .evidence(Source::Host, "the host's boot id, uptime and kernel log before and after, and the next VM run there (setup and after scripts)")
    .control(Source::Mvm, "the panic on the guest console mvm shows: the crash did happen");
    let (setup, after) = (host_identity_before(), host_survives());
    let run = check.run(|| {
        attack_scripted(
            &setup,
            &after,
            &[
                "--root",
                "--no-workspace",
                "--",
                "sh",
                "-c",
                "echo c > /proc/sysrq-trigger; echo still-running",
            ],
        )
    });
    let mut v = Verdict::new();
    let said = mvm_says(&run);
    v.saw(format!("exit {}: {}", code(&run), excerpt(&said, 100)));
    v.require(run.code == Some(121), "not exit 121");
    v.require(
        said.contains("panicked"),
        "mvm did not say the guest panicked",
    );
    // The control that a panic really happened: the console tail mvm shows.
    let sysrq = run.mvm_stderr().contains("Kernel panic");
    v.saw(format!("console tail shows the panic: {sysrq}"));
    v.require(sysrq, "no panic on the guest console");
    require_host_survived(&mut v, &run);
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_9c_a_guest_reboot_ends_only_that_vm() {
    let mut check = Check::new(
        "9c",
        "reboot the guest from the command: reboot(2) (the attacker's `reboot`, what `reboot -f` calls) as guest root; the same as the default user",
        "exit 121 ('stopped without reporting'), the host's boot id unchanged, its uptime run on, no panic in its kernel log, the next VM runs; as the default user reboot -f fails with EPERM ('Operation not permitted', exit 1) and the VM goes on to its own end",
    )
    .evidence(Source::Mvm, "exit 121 and the command's output stopping at the reboot")
    .evidence(Source::Host, "the host's boot id, uptime and kernel log before and after, and the next VM runs there (setup and after scripts)")
    .control(Source::Mvm, "the default user's reboot -f, refused with EPERM, lets its VM end with the command's own status");
    let (setup, after) = (host_identity_before(), host_survives());
    let attacker = attacker();
    let after = format!(
        "{after}\n$MVM run -- /workspace/{attacker} reboot >/run/tmp/user.err 2>&1; \
         echo user_reboot_status=$?; sed 's/^/user reboot: /' /run/tmp/user.err | head -n 2"
    );
    let run = check.run(|| {
        attack_scripted(
            &setup,
            &after,
            &[
                "--root",
                "--",
                "sh",
                "-c",
                &format!("/workspace/{attacker} reboot; sleep 30; echo still-running"),
            ],
        )
    });
    let mut v = Verdict::new();
    let said = mvm_says(&run);
    v.saw(format!("exit {}: {}", code(&run), excerpt(&said, 100)));
    v.require(run.code == Some(121), "not exit 121");
    v.require(
        !run.stdout.contains("still-running"),
        "the reboot did not happen",
    );
    require_host_survived(&mut v, &run);
    let after_lines = run.after_lines();
    let user = value(&after_lines, "user_reboot_status");
    v.saw(format!(
        "as the default user: exit {} ({})",
        user.unwrap_or("?"),
        after_lines
            .iter()
            .find_map(|l| l.strip_prefix("user reboot: "))
            .map(|l| excerpt(l, 60))
            .unwrap_or_default()
    ));
    let eperm = after_lines
        .iter()
        .any(|l| l.starts_with("user reboot: ") && l.contains("Operation not permitted"));
    v.require(
        user == Some("1") && eperm,
        format!(
            "an unprivileged reboot -f did not fail with EPERM and exit 1 (exit {})",
            user.unwrap_or("?")
        ),
    );
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_9d_the_command_cannot_forge_its_exit_status_on_the_status_port() {
    let mut check = Check::new(
        "9d",
        "forge the exit status: as the default user, write 42 to the VMM's status port that guest-init reports on (0x444), without asking and after ioperm(2)",
        "the plain write faults (SIGSEGV, status 139), ioperm is refused (EPERM, status 1), nothing is written, and mvm exits with the command's own status (0), not 42",
    )
    .evidence(Source::Guest, "the attacker's lines and the shell's statuses")
    .evidence(Source::Mvm, "mvm's exit status")
    .control(
        Source::Guest,
        "with --root, ioperm is granted and the same write goes through ('port: wrote'): the probe does tell an open port",
    );
    let attacker = attacker();
    let run = check.run(|| {
        attack(
            &Options::default(),
            &[
                "--",
                "sh",
                "-c",
                &format!(
                    "/workspace/{attacker} port 42; echo plain=$?; \
                     /workspace/{attacker} port 42 enable; echo asked=$?"
                ),
            ],
        )
    });
    let root = control(
        &Options::default(),
        &[
            "--root",
            "--",
            &format!("/workspace/{attacker}"),
            "port",
            "42",
            "enable",
        ],
    );
    let mut v = Verdict::new();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let (plain, asked) = (value(&lines, "plain"), value(&lines, "asked"));
    v.saw(format!(
        "exit {}; plain write: status {}; after ioperm: status {} ({}); with --root: {}",
        code(&run),
        plain.unwrap_or("?"),
        asked.unwrap_or("?"),
        lines
            .iter()
            .find(|l| l.starts_with("port: ioperm"))
            .map(|l| excerpt(l, 60))
            .unwrap_or_default(),
        excerpt(&root.stdout, 80)
    ));
    v.require(run.code == Some(0), "mvm did not exit with the command's 0");
    v.require(plain == Some("139"), "the plain write did not fault");
    v.require(
        asked == Some("1") && run.stdout.contains("Operation not permitted"),
        "ioperm was not refused with EPERM",
    );
    v.require(!run.stdout.contains("port: wrote"), "a write got through");
    v.require(
        root.stdout.contains("port: wrote"),
        "the control: with --root the write did not get through",
    );
    check.finish(v);
}

/// The ways `attacker memory` tries, each a line of its own.
const MEMORY_ROUTES: [&str; 11] = [
    "dev-mem",
    "dev-kmem",
    "dev-port",
    "node-mem",
    "node-kmem",
    "node-port",
    "kcore",
    "init-module",
    "finit-module",
    "kexec-load",
    "kexec-file-load",
];

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_9e_guest_root_cannot_reach_the_virtio_rings_behind_its_kernel() {
    let mut check = Check::new(
        "9e",
        "as guest root (--root, every capability), reach guest memory and so the virtio rings behind the guest kernel, as issue 16 point 1's attack needs: /dev/mem, /dev/kmem and /dev/port (the nodes, and nodes made with mknod), /proc/kcore, a kernel module (init_module, finit_module), kexec (kexec_load, kexec_file_load)",
        "all eleven refused: the nodes absent, the made nodes ENXIO (no driver), kcore absent, the four system calls ENOSYS (the kernel has none of them); what a guest kernel could do with the rings is the hostile-driver test's (vmm/tests/hostile_driver.rs)",
    )
    .evidence(Source::Guest, "the attacker's line for each route, with its errno")
    .control(
        Source::Guest,
        "the same mknod and open for /dev/zero (1:5) work and read a zero (same call): the probe tells an open node, and the command is root",
    );
    let attacker = attacker();
    let run = check.run(|| {
        attack(
            &Options::default(),
            &[
                "--root",
                "--",
                &format!("/workspace/{attacker}"),
                "memory",
                // Not /tmp: it is nodev, where no node opens at all.
                "/dev",
            ],
        )
    });
    let mut v = Verdict::new();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let said = |route: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(route).and_then(|r| r.strip_prefix(": ")))
            .unwrap_or("(no line)")
    };
    v.saw(format!("exit {}", code(&run)));
    for route in MEMORY_ROUTES {
        let got = said(route);
        v.saw(format!("{route}: {got}"));
        let want = match route {
            "dev-mem" | "dev-kmem" | "dev-port" | "kcore" => "No such file or directory",
            "node-mem" | "node-kmem" | "node-port" => "No such device or address",
            _ => "Function not implemented",
        };
        v.require(
            got == format!("refused ({want})"),
            format!("{route}: '{got}', not refused with '{want}'"),
        );
    }
    let control = lines.contains(&"control: zero read 0");
    v.saw(format!("control (/dev/zero made and read): {control}"));
    v.require(
        control,
        "the control: a /dev/zero node could not be made and read",
    );
    check.finish(v);
}
