//! Check 6: escalating to root. The command runs as a non-root uid (a
//! root caller's command as guest uid 1000), with no_new_privs and no
//! capabilities; shares are nosuid; a setuid-root binary in the workspace
//! gives nothing, though the same binary does give root on the host.

use std::os::unix::fs::PermissionsExt;

use mvm_e2e::{caller_uid, repo_root, Options, Run};

use crate::battery::{
    attack, attack_scripted, attacker, code, control, excerpt, script, Check, Verdict,
};

/// A setuid copy of the attacker, owned by root where the battery runs as
/// root (the test host sees this machine's owner and mode through 9p).
const SUID: &str = "target/containment/attacker-suid";

fn plant_suid() -> &'static str {
    let root = repo_root();
    let source = root.join(attacker());
    let target = root.join(SUID);
    let _ = std::fs::remove_file(&target);
    std::fs::copy(&source, &target).expect("copy the attacker");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o4755))
        .expect("chmod 4755 the setuid attacker");
    SUID
}

/// The guest's view of its own privileges, one `key: value` line each.
fn probes(suid: &str) -> String {
    format!(
        r#"
echo "id: $(id -u) $(id -g) groups: $(id -G)"
grep -E '^(NoNewPrivs|CapEff|CapPrm|CapAmb|CapBnd):' /proc/self/status | tr -s '\t ' '  '
echo "suid file: $(stat -c '%u %a' /workspace/{suid})"
echo "suid: $(/workspace/{suid} id)"
mkdir -p /tmp/m
if mount -t tmpfs none /tmp/m 2>/dev/null; then echo "mount: allowed"; else echo "mount: refused"; fi
if echo 0 >/proc/sys/kernel/sysrq 2>/dev/null; then echo "sysctl: written"; else echo "sysctl: refused"; fi
grep -E ' /workspace ' /proc/mounts | sed 's/^/share: /'
"#
    )
}

/// What `probes` printed.
struct Seen {
    uid: Option<u32>,
    no_new_privs: String,
    cap_eff: String,
    cap_prm: String,
    suid_euid: Option<u32>,
    mount: String,
    sysctl: String,
    share_opts: String,
}

fn seen(run: &Run) -> Seen {
    let line = |key: &str| {
        run.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let euid = line("suid: ")
        .split_whitespace()
        .find_map(|w| w.strip_prefix("euid="))
        .and_then(|n| n.parse().ok());
    Seen {
        uid: line("id: ")
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok()),
        no_new_privs: line("NoNewPrivs: "),
        cap_eff: line("CapEff: "),
        cap_prm: line("CapPrm: "),
        suid_euid: euid,
        mount: line("mount: "),
        sysctl: line("sysctl: "),
        share_opts: line("share: "),
    }
}

const NO_CAPS: &str = "0000000000000000";

fn require_unprivileged(v: &mut Verdict, s: &Seen, want_uid: u32) {
    v.saw(format!(
        "uid {:?}, NoNewPrivs {}, CapEff {}, CapPrm {}",
        s.uid, s.no_new_privs, s.cap_eff, s.cap_prm
    ));
    v.require(
        s.uid == Some(want_uid),
        format!("uid {:?}, not {want_uid}", s.uid),
    );
    v.require(s.uid != Some(0), "the command runs as root");
    v.require(s.no_new_privs == "1", "no_new_privs is not set");
    v.require(
        s.cap_eff == NO_CAPS && s.cap_prm == NO_CAPS,
        "the command has capabilities",
    );
    v.saw(format!(
        "setuid binary in the workspace ran with euid {:?}",
        s.suid_euid
    ));
    v.require(
        s.suid_euid.is_some() && s.suid_euid != Some(0),
        "the setuid binary gave root (or did not run)",
    );
    v.saw(format!("mount {}, sysctl {}", s.mount, s.sysctl));
    v.require(s.mount == "refused", "mount was allowed");
    v.require(s.sysctl == "refused", "a sysctl was written");
    let nosuid = s.share_opts.contains("nosuid") && s.share_opts.contains("nodev");
    v.saw(format!("workspace mounted nosuid,nodev: {nosuid}"));
    v.require(nosuid, format!("workspace mount options: {}", s.share_opts));
}

/// On the test host, as nobody: the same setuid binary, where setuid is
/// honoured (needs a root caller to switch users).
fn host_suid_control(suid: &str) -> String {
    script(&format!(
        r#"
if [ "$(id -u)" = 0 ]; then
    echo "host suid: $(nsenter -S 65534 -G 65534 -F -- ./{suid} id)"
else
    echo "host suid: $(./{suid} id)"
fi
"#
    ))
}

fn host_suid_euid(run: &Run) -> Option<u32> {
    run.after_lines()
        .iter()
        .find_map(|l| l.strip_prefix("host suid: "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("euid="))
                .and_then(|n| n.parse().ok())
        })
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6a_the_command_is_not_root_and_cannot_become_it() {
    let mut check = Check::new(
        "6a",
        "escalate as the default user (the caller is root in CI): check uid, no_new_privs and capabilities, run a setuid-root binary from the workspace, mount, write a sysctl",
        "a non-root uid (1000 for a root caller), NoNewPrivs 1, no capabilities, the setuid binary runs as that uid, mount and sysctl refused, the share nosuid,nodev; the same binary gives root on the host (control)",
    );
    let suid = plant_suid();
    let after = host_suid_control(suid);
    let run = check.run(|| {
        attack(
            &Options {
                after: Some(&after),
                ..Options::default()
            },
            &["--", "sh", "-c", &probes(suid)],
        )
    });
    let mut v = Verdict::new();
    v.saw(format!("exit {}", code(&run)));
    let s = seen(&run);
    let caller = caller_uid();
    let want = if caller == 0 { 1000 } else { caller };
    require_unprivileged(&mut v, &s, want);
    if caller == 0 {
        let host = host_suid_euid(&run);
        v.saw(format!(
            "control: on the host, nobody running it gets euid {host:?}"
        ));
        v.require(
            host == Some(0),
            "the setuid binary does not work on the host",
        );
    } else {
        v.saw("control on the host skipped: needs a root caller to switch to nobody");
    }
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6b_an_unprivileged_caller_is_itself_in_the_guest() {
    let mut check = Check::new(
        "6b",
        "the same escalation as an unprivileged caller (nobody, 65534)",
        "uid 65534, NoNewPrivs 1, no capabilities, setuid binary without root, mount and sysctl refused",
    );
    if caller_uid() != 0 {
        let mut v = Verdict::new();
        v.saw("not run: the battery is not root, so 6a already ran unprivileged");
        return check.finish(v);
    }
    let suid = plant_suid();
    let run = check.run(|| {
        attack(
            &Options {
                as_nobody: true,
                ..Options::default()
            },
            &["--", "sh", "-c", &probes(suid)],
        )
    });
    let mut v = Verdict::new();
    v.saw(format!("exit {}", code(&run)));
    require_unprivileged(&mut v, &seen(&run), 65534);
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6c_root_only_with_root_positive_control() {
    let mut check = Check::new(
        "6c",
        "positive control for 6a: the same probes with --root",
        "uid 0 with capabilities, mount and sysctl allowed: the probes do detect privilege",
    );
    let suid = plant_suid();
    let run = check.run(|| {
        control(
            &Options::default(),
            &["--root", "--", "sh", "-c", &probes(suid)],
        )
    });
    let mut v = Verdict::new();
    let s = seen(&run);
    v.saw(format!(
        "exit {}, uid {:?}, CapEff {}, mount {}, sysctl {}",
        code(&run),
        s.uid,
        s.cap_eff,
        s.mount,
        s.sysctl
    ));
    v.require(s.uid == Some(0), "not uid 0 with --root");
    v.require(
        !s.cap_eff.is_empty() && s.cap_eff != NO_CAPS,
        "no capabilities with --root",
    );
    v.require(s.mount == "allowed", "mount refused even with --root");
    v.require(s.sysctl == "written", "sysctl refused even with --root");
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6d_no_setuid_file_reaches_the_host_through_write() {
    let mut check = Check::new(
        "6d",
        "plant a setuid binary on the host: with --write, copy the attacker into the workspace and chmod 6755, then run it on the host as nobody",
        "the host copy has no setuid/setgid bit, so another host user running it stays itself",
    );
    let attacker = attacker();
    let setup =
        format!("rm -rf /run/tmp/ws && mkdir -p /run/tmp/ws && cp {attacker} /run/tmp/ws/tool");
    let after = script(
        r#"
echo "host file: $(stat -c '%u %g %a' /run/tmp/ws/planted)"
if [ "$(id -u)" = 0 ]; then
    echo "host run: $(nsenter -S 65534 -G 65534 -F -- /run/tmp/ws/planted id)"
fi
"#,
    );
    let run = check.run(|| {
        attack_scripted(
            &setup,
            &after,
            &[
                "--workspace",
                "/run/tmp/ws",
                "--write",
                "--",
                "sh",
                "-c",
                "cp tool planted && chmod 6755 planted && stat -c 'guest file: %u %g %a' planted",
            ],
        )
    });
    let mut v = Verdict::new();
    v.saw(format!("exit {}", code(&run)));
    let guest = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("guest file: "))
        .unwrap_or("(missing)");
    v.saw(format!("guest sees {guest}"));
    let after = run.after_lines();
    let host = after
        .iter()
        .find_map(|l| l.strip_prefix("host file: "))
        .unwrap_or("(missing)")
        .trim();
    v.saw(format!("host file uid gid mode: {host}"));
    let mode = host
        .split_whitespace()
        .nth(2)
        .and_then(|m| u32::from_str_radix(m, 8).ok());
    v.require(mode.is_some(), "the file did not reach the host (control)");
    v.require(
        mode.is_some_and(|m| m & 0o6000 == 0),
        "the host file is setuid/setgid",
    );
    if let Some(ran) = after.iter().find_map(|l| l.strip_prefix("host run: ")) {
        v.saw(format!("nobody running it on the host: {ran}"));
        v.require(
            !ran.contains("euid=0"),
            "nobody got root on the host through it",
        );
    }
    v.saw(format!("mvm stderr: {}", excerpt(&run.mvm_stderr(), 80)));
    check.finish(v);
}
