//! Check 6: escalating privileges. The command runs as a non-root uid (a
//! root caller's command as guest uid 1000), with no_new_privs and no
//! capabilities; shares are nosuid; a setuid binary of another user in the
//! workspace gives nothing, though the same binary does switch uids on the
//! host.

use std::os::unix::fs::PermissionsExt;

use mvm_e2e::{caller_uid, repo_root, Options, Run};

use crate::battery::{
    attack, attack_scripted, attacker, code, control, excerpt, script, Check, Source, Verdict,
};

/// A setuid copy of the attacker, owned by `SUID_OWNER` where the battery
/// runs as root (the test host sees this machine's owner and mode through
/// 9p).
const SUID: &str = "target/containment/attacker-suid";

/// A uid the share does not translate: for a root caller virtiofsd shows
/// only the caller's own files as the guest user's (host 0 becomes 1000),
/// so a root-owned binary would look like the user's own and its setuid
/// bit could not change anything with or without protection. A file of
/// 4242 stays 4242, and running it setuid would make the euid 4242.
const SUID_OWNER: u32 = 4242;

/// Plants the setuid binary; its owner, which is `SUID_OWNER` only where
/// the battery may chown (root).
fn plant_suid() -> (&'static str, u32) {
    let root = repo_root();
    let source = root.join(attacker());
    let target = root.join(SUID);
    let _ = std::fs::remove_file(&target);
    std::fs::copy(&source, &target).expect("copy the attacker");
    let owner = if caller_uid() == 0 {
        std::os::unix::fs::chown(&target, Some(SUID_OWNER), Some(SUID_OWNER))
            .expect("chown the setuid attacker");
        SUID_OWNER
    } else {
        caller_uid()
    };
    // After the chown, which clears the setuid bit.
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o4755))
        .expect("chmod 4755 the setuid attacker");
    (SUID, owner)
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
    suid_owner: Option<u32>,
    suid_mode: String,
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
    let file = line("suid file: ");
    let mut file = file.split_whitespace();
    let suid_owner = file.next().and_then(|n| n.parse().ok());
    let suid_mode = file.next().unwrap_or("").to_string();
    Seen {
        suid_owner,
        suid_mode,
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

/// `owner`: the owner the guest must see on the setuid binary, or `None`
/// where the share may show it as the user's own (an unprivileged
/// virtiofsd maps no other uid): there running it could not change the
/// euid with or without protection, so the probe claims nothing unless the
/// guest does see `SUID_OWNER`.
fn require_unprivileged(v: &mut Verdict, s: &Seen, want_uid: u32, owner: Option<u32>) {
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
        "setuid binary seen in the guest as owner {:?} mode {}, ran with euid {:?}",
        s.suid_owner, s.suid_mode, s.suid_euid
    ));
    v.require(
        s.suid_mode.starts_with('4'),
        format!(
            "the guest does not see the setuid bit (mode {:?})",
            s.suid_mode
        ),
    );
    if let Some(owner) = owner.or(Some(SUID_OWNER).filter(|o| s.suid_owner == Some(*o))) {
        v.require(
            s.suid_owner == Some(owner),
            format!("the guest sees owner {:?}, not {owner}", s.suid_owner),
        );
        v.require(
            s.suid_euid == Some(want_uid),
            format!(
                "the setuid binary ran with euid {:?}, not the user's {want_uid}",
                s.suid_euid
            ),
        );
    } else {
        v.saw(format!(
            "the share shows the setuid binary as owner {:?}: the setuid probe cannot tell here and claims nothing",
            s.suid_owner
        ));
        v.require(s.suid_euid.is_some(), "the setuid binary did not run");
    }
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
        "escalate as the default user (the caller is root in CI): check uid, no_new_privs and capabilities, run a setuid binary of uid 4242 (a uid the share does not translate) from the workspace, mount, write a sysctl",
        "a non-root uid (1000 for a root caller), NoNewPrivs 1, no capabilities; the guest sees the binary's owner 4242 and its setuid bit, yet it runs with the user's euid; mount and sysctl refused, the share nosuid,nodev; the same binary run on the host as nobody gets euid 4242 (control)",
    )
    .evidence(Source::Guest, "the command's own uid, NoNewPrivs, capabilities, the setuid binary's owner, mode and euid, and its mount and sysctl attempts")
    .control(Source::Host, "the same setuid binary run on the test host as nobody does switch to its owner's euid (after script)");
    let (suid, owner) = plant_suid();
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
    let skip_why = "needs a root caller: to plant a setuid binary of another uid, and to run it on the host as nobody";
    if owner != SUID_OWNER {
        v.skip("6a", skip_why);
    }
    require_unprivileged(&mut v, &s, want, Some(owner).filter(|o| *o == SUID_OWNER));
    if caller == 0 {
        let host = host_suid_euid(&run);
        v.saw(format!(
            "control: on the host, nobody running it gets euid {host:?}"
        ));
        v.require(
            host == Some(SUID_OWNER),
            "the setuid binary does not switch uids on the host",
        );
    }
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6b_an_unprivileged_caller_is_itself_in_the_guest() {
    let mut check = Check::new(
        "6b",
        "the same escalation as an unprivileged caller (nobody, 65534), the setuid binary still owned by 4242",
        "uid 65534, NoNewPrivs 1, no capabilities, mount and sysctl refused; the setuid binary runs with euid 65534 (an unprivileged virtiofsd shows other owners as the overflow uid 65534, so there the setuid probe claims nothing: the row says which)",
    )
    .evidence(Source::Guest, "the command's own uid, NoNewPrivs, capabilities, the setuid binary's owner and euid, and its mount and sysctl attempts")
    .control(Source::Guest, "check 6c: the same probes with --root do report uid 0, capabilities, mount and sysctl allowed");
    if caller_uid() != 0 {
        let mut v = Verdict::new();
        v.skip(
            "6b",
            "needs a root caller to switch to nobody (6a then ran unprivileged)",
        );
        return check.finish(v);
    }
    let (suid, _) = plant_suid();
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
    require_unprivileged(&mut v, &seen(&run), 65534, None);
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_6c_root_only_with_root_positive_control() {
    let mut check = Check::new(
        "6c",
        "positive control for 6a: the same probes with --root",
        "uid 0 with capabilities, mount and sysctl allowed: the probes do detect privilege",
    )
    .evidence(Source::Guest, "the same probes' report")
    .control(
        Source::Guest,
        "itself the positive control of checks 6a and 6b",
    );
    let (suid, _) = plant_suid();
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
    )
    .evidence(Source::Host, "the planted file's owner and mode on the host, and a run of it there as nobody (after script)")
    .control(Source::Host, "the file did reach the host (its mode is read there)");
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
