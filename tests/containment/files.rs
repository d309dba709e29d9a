//! Checks 1, 2, 2b, 7, 7b and 8: the host's files. Secrets planted
//! outside the workspace stay unreadable, host files outside it and a
//! read-only workspace stay unchanged, and in a writable workspace the
//! files the host runs later stay unchanged; the same scripts with
//! `--write`, `--write-hooks` or an unsafe `--mount` do reach the host,
//! which is what makes the first three mean something.

use mvm_e2e::{caller_uid, Options};

use crate::battery::{attack, code, control, excerpt, Check, Source, Verdict};

/// A fresh workspace on the test host's tmpfs, with a file, a symlink and
/// a file meant to be readable; secrets in the caller's home, its TMPDIR
/// and /tmp; a host file outside the workspace to aim writes at.
const PLANT: &str = r#"
rm -rf /run/tmp/ws /run/tmp/outside && mkdir -p /run/tmp/ws /run/tmp/outside &&
echo original >/run/tmp/ws/f &&
echo WORKSPACE-CONTROL >/run/tmp/ws/control &&
echo host-original >/run/tmp/outside/target &&
ln -s /run/tmp/outside/target /run/tmp/ws/escape &&
echo PLANTED-HOME-SECRET >"$HOME/.mvm-battery-secret" &&
echo host-original >"$HOME/.mvm-battery-profile" &&
echo PLANTED-TMPDIR-SECRET >/run/tmp/mvm-battery-secret &&
echo PLANTED-TMP-SECRET >/tmp/mvm-battery-secret-$(id -u)
"#;

/// The host's view after a run: the secrets still there (so there was
/// something to steal), then the files the writes aimed at.
const HOST_VIEW: &str = r#"
echo "secret: $(cat "$HOME/.mvm-battery-secret" /run/tmp/mvm-battery-secret /tmp/mvm-battery-secret-$(id -u) | tr '\n' ' ')"
echo "f: $(cat /run/tmp/ws/f | tr '\n' ' ')"
echo "outside: $(cat /run/tmp/outside/target)"
echo "profile: $(cat "$HOME/.mvm-battery-profile")"
echo "ws: $(ls /run/tmp/ws | tr '\n' ' ')"
echo "outside-dir: $(ls /run/tmp/outside | tr '\n' ' ')"
[ ! -e /run/tmp/ws/new ] || echo "new: $(stat -c '%u %g' /run/tmp/ws/new) $(cat /run/tmp/ws/new)"
rm -f "$HOME/.mvm-battery-secret" "$HOME/.mvm-battery-profile"
"#;

/// Every way the command might name a planted secret: the host paths
/// themselves (the guest's home is even at the same path as the test
/// host's), `..` out of the workspace, and a search of every file in the
/// guest (but /proc, /sys, /dev); then the workspace file as the control.
const READ_SECRETS: &str = r#"
for f in /run/home/.mvm-battery-secret "$HOME/.mvm-battery-secret" /root/.mvm-battery-secret \
         /run/tmp/mvm-battery-secret /tmp/mvm-battery-secret-0 /tmp/mvm-battery-secret-65534 \
         /workspace/../run/home/.mvm-battery-secret /workspace/../../run/tmp/mvm-battery-secret \
         /host/.mvm-battery-secret; do
    cat "$f" 2>/dev/null
done
find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -print 2>/dev/null |
    xargs grep -sh PLANTED-
echo "control: $(cat /workspace/control)"
"#;

/// Writes at the workspace (read-only unless --write), at a host file
/// through a symlink and `..`, and at the host's paths of the caller's
/// files, each reported as WROTE or refused with its error; the guest's
/// own /tmp as the control that writing works at all.
const WRITE_FILES: &str = r#"
w() {
    if sh -c "$1" 2>/tmp/err; then echo "WROTE: $1"; else echo "refused: $1: $(cat /tmp/err)"; fi
}
cd /workspace
w 'echo pwned > f'
w 'echo pwned >> f'
w 'echo pwned > new'
w 'echo pwned > /workspace/../run/tmp/outside/target'
w 'mkdir -p /run/tmp/outside && echo pwned > /run/tmp/outside/target'
w 'echo pwned > escape'
w 'echo pwned > /run/home/.mvm-battery-profile'
echo guest-tmp-ok > /tmp/control && echo "control: $(cat /tmp/control)"
"#;

/// A workspace that is a git repository as the host left it (the test
/// host has no git: its layout by hand), with an editor's task file, a
/// subdirectory, and one ordinary file.
const PLANT_HOOKS: &str = r#"
rm -rf /run/tmp/ws && mkdir -p /run/tmp/ws/.git/hooks /run/tmp/ws/.git/objects /run/tmp/ws/.vscode /run/tmp/ws/sub &&
cd /run/tmp/ws &&
printf '[core]\n\tbare = false\n' >.git/config &&
echo 'ref: refs/heads/main' >.git/HEAD &&
echo sample >.git/hooks/pre-commit.sample &&
echo '{"tasks": []}' >.vscode/tasks.json &&
echo original >f
"#;

/// The files the host runs later as the host sees them after the run,
/// then the ordinary writes (the controls).
const HOOKS_VIEW: &str = r#"
cd /run/tmp/ws
state() { if [ -L "$1" ] || [ -e "$1" ]; then echo "present $(cat "$1" 2>/dev/null | tr '\n' ' ')"; else echo absent; fi; }
echo "envrc: $(state .envrc)"
echo "sub-envrc: $(state sub/.envrc)"
echo "bashrc: $(state .bashrc)"
echo "hook: $(state .git/hooks/pre-commit)"
echo "hooks: $(ls -A .git/hooks | tr '\n' ' ')"
echo "config: $(cat .git/config | tr '\n\t' '  ')"
echo "moved-config: $(cat .git-old/config 2>/dev/null | tr '\n\t' '  ')"
echo "git: $(ls -A | tr '\n' ' ')"
echo "tasks: $(cat .vscode/tasks.json)"
echo "sub: $(ls -A sub | tr '\n' ' ')"
echo "f: $(cat f)"
echo "object: $(cat .git/objects/ab/cd 2>/dev/null)"
"#;

/// Plants what the host would run later, each way a command could: a
/// new file, an edit, a rename over it, moving the git directory aside
/// for a new one, a symbolic link, at the top and further down. Each is
/// reported WROTE or refused with its error; then what a command
/// legitimately writes (a workspace file, git's object store).
const WRITE_HOOKS: &str = r##"
w() {
    if sh -c "$1" 2>/tmp/err; then printf 'WROTE: %s\n' "$1"; else printf 'refused: %s: %s\n' "$1" "$(cat /tmp/err)"; fi
}
cd /workspace
w 'echo pwned > .envrc'
w 'echo pwned > sub/.envrc'
w 'ln -s /tmp/pwned .bashrc'
w 'printf "#!/bin/sh\necho pwned\n" > .git/hooks/pre-commit'
w 'printf "\tfsmonitor = pwned\n" >> .git/config'
w 'printf "[core]\n\tfsmonitor = pwned\n" > .git/config.new && mv .git/config.new .git/config'
w 'mv .git/hooks .git/hooks-old'
w 'mv .git .git-old && mkdir -p .git/hooks && echo pwned > .git/hooks/pre-commit'
w 'echo pwned > .vscode/tasks.json'
w 'mkdir -p sub/.git/hooks'
echo pwned > f && echo "control: f $(cat f)"
mkdir -p .git/objects/ab && echo blob > .git/objects/ab/cd && echo "control: object $(cat .git/objects/ab/cd)"
"##;

/// WRITE_HOOKS with --write (and `flags`) in a PLANT_HOOKS workspace, by
/// `call` (the battery's attack or control).
fn hooks_run(call: fn(&Options, &[&str]) -> mvm_e2e::Run, flags: &[&str]) -> mvm_e2e::Run {
    let mut args = vec!["--workspace", "/run/tmp/ws", "--write"];
    args.extend_from_slice(flags);
    args.extend(["--", "sh", "-c", WRITE_HOOKS]);
    let options = Options {
        setup: Some(PLANT_HOOKS),
        after: Some(HOOKS_VIEW),
        ..Options::default()
    };
    call(&options, &args)
}

/// The host's view by key: the after script's line that starts with it
/// (HOST_VIEW's, HOOKS_VIEW's), the rest of it trimmed.
fn host_view(run: &mvm_e2e::Run) -> impl Fn(&str) -> String + '_ {
    let after = run.after_lines();
    move |key: &str| {
        after
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or("(missing)")
            .trim()
            .to_string()
    }
}

/// How many of WRITE_HOOKS' attempts went through, and how many were
/// refused with "Read-only file system".
fn hook_writes(run: &mvm_e2e::Run) -> (usize, usize) {
    let lines = || run.stdout.lines();
    let wrote = lines().filter(|l| l.starts_with("WROTE: ")).count();
    let refused = lines()
        .filter(|l| l.starts_with("refused: ") && l.contains("Read-only file system"))
        .count();
    (wrote, refused)
}

fn planted(after: &'static str) -> Options<'static> {
    Options {
        setup: Some(PLANT),
        after: Some(after),
        ..Options::default()
    }
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_1_host_secrets_outside_the_workspace_are_unreachable() {
    let mut check = Check::new(
        "1",
        "read secrets planted on the host in the caller's home, TMPDIR and /tmp: their host paths, `..` out of /workspace, a search of every file in the guest",
        "no secret in anything the command printed; the workspace file (control) is read; the secrets exist on the host throughout",
    )
    .evidence(Source::Mvm, "no secret in all that came out of the VM (stdout and stderr through mvm)")
    .evidence(Source::Host, "the secrets still on the host after the run (after script)")
    .control(Source::Mvm, "the same script prints the workspace file it may read (same call); check 8: with an unsafe --mount it prints the home secret");
    let run = check.run(|| {
        attack(
            &planted(HOST_VIEW),
            &["--workspace", "/run/tmp/ws", "--", "sh", "-c", READ_SECRETS],
        )
    });
    let mut v = Verdict::new();
    let after = run.after_lines();
    let host_secrets = after
        .iter()
        .find_map(|l| l.strip_prefix("secret: "))
        .unwrap_or("");
    v.saw(format!("exit {}", code(&run)));
    v.saw(format!("host still holds: {}", host_secrets.trim()));
    let leaked = run.stdout.contains("PLANTED-") || run.mvm_stderr().contains("PLANTED-");
    v.saw(if leaked {
        "a secret came out".to_string()
    } else {
        "no secret in stdout or stderr".to_string()
    });
    v.require(!leaked, format!("leaked: {}", excerpt(&run.stdout, 200)));
    v.require(
        host_secrets.matches("PLANTED-").count() == 3,
        "the planted secrets were not all on the host",
    );
    let control = run.stdout.contains("control: WORKSPACE-CONTROL");
    v.saw(format!("control (workspace file read): {control}"));
    v.require(control, "the script could not read even the workspace");
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_2_host_files_and_the_read_only_workspace_are_not_written() {
    let mut check = Check::new(
        "2",
        "write to the read-only workspace (overwrite, append, create), to a host file through a workspace symlink and `..`, and to the host paths of the caller's files",
        "workspace writes fail with EROFS, visible to the command; on the host every file is unchanged and nothing new exists; the guest's own /tmp is writable (control)",
    )
    .evidence(Source::Host, "every file the writes aimed at, read back on the host (after script)")
    .evidence(Source::Guest, "the EROFS errors the command reports")
    .control(Source::Guest, "the script writes the guest's own /tmp (same call); check 7: with --write its writes do land on the host");
    let run = check.run(|| {
        attack(
            &planted(HOST_VIEW),
            &["--workspace", "/run/tmp/ws", "--", "sh", "-c", WRITE_FILES],
        )
    });
    let mut v = Verdict::new();
    let host = host_view(&run);
    v.saw(format!("exit {}", code(&run)));
    let erofs = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("refused: echo pwned >") && l.contains("Read-only file system"))
        .count();
    v.saw(format!(
        "{erofs} workspace writes refused with 'Read-only file system'"
    ));
    v.require(
        erofs >= 3,
        format!(
            "workspace writes not refused with EROFS: {}",
            excerpt(&run.stdout, 300)
        ),
    );
    for (key, want) in [
        ("f: ", "original"),
        ("outside: ", "host-original"),
        ("profile: ", "host-original"),
        ("ws: ", "control escape f"),
        ("outside-dir: ", "target"),
    ] {
        let got = host(key);
        v.saw(format!("host {}{got}", key.trim_end_matches(' ')));
        v.require(got == want, format!("host {key}'{got}', not '{want}'"));
    }
    let control = run.stdout.contains("control: guest-tmp-ok");
    v.saw(format!("control (guest /tmp written): {control}"));
    v.require(control, "the script could not write at all");
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_7_a_legitimate_write_with_write_lands_owned_by_the_caller() {
    let mut check = Check::new(
        "7",
        "positive control for 2: the same write script with --write",
        "the workspace writes land on the host, the new file owned by the caller; writes through the symlink and `..` still stay in the guest",
    )
    .evidence(Source::Host, "the files on the host and the new file's owner (after script)")
    .control(Source::Host, "itself the positive control of check 2");
    let uid = caller_uid();
    let run = check.run(|| {
        control(
            &planted(HOST_VIEW),
            &[
                "--workspace",
                "/run/tmp/ws",
                "--write",
                "--",
                "sh",
                "-c",
                WRITE_FILES,
            ],
        )
    });
    let mut v = Verdict::new();
    let host = host_view(&run);
    v.saw(format!("exit {}", code(&run)));
    let f = host("f: ");
    let new = host("new: ");
    v.saw(format!("host f: {f}"));
    v.saw(format!("host new (uid gid content): {new}"));
    v.require(f == "pwned pwned", format!("f on the host is '{f}'"));
    v.require(
        new.starts_with(&format!("{uid} ")) && new.ends_with(" pwned"),
        format!("new on the host is '{new}', not the caller's ({uid})"),
    );
    let outside = host("outside: ");
    v.saw(format!("host outside: {outside}"));
    v.require(
        outside == "host-original",
        "a write through the symlink reached the host file outside",
    );
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_2b_files_the_host_runs_later_stay_read_only_with_write() {
    let mut check = Check::new(
        "2b",
        "with --write, plant what the host runs later in a workspace that is a git repository: a new .envrc (top and in a subdirectory), a .bashrc symlink, a pre-commit hook, core.fsmonitor in .git/config (appended, and renamed over it), .git/hooks and .git itself moved aside for new ones, .vscode/tasks.json, a nested .git (issue 16 point 5)",
        "all ten refused with EROFS, visible to the command; on the host none of those files is new or changed and .git is where it was; the command's ordinary writes (a workspace file, an object in .git/objects) land",
    )
    .evidence(Source::Host, "the hooks, config, rc files and task file read back on the host (after script)")
    .evidence(Source::Guest, "the EROFS errors the command reports")
    .control(Source::Host, "the same run's ordinary writes reach the host (same call); check 7b: with --write-hooks the same script does plant them");
    let run = check.run(|| hooks_run(attack, &[]));
    let mut v = Verdict::new();
    let host = host_view(&run);
    let (wrote, refused) = hook_writes(&run);
    v.saw(format!("exit {}", code(&run)));
    v.saw(format!(
        "{refused} of 10 refused with 'Read-only file system', {wrote} went through"
    ));
    v.require(
        refused == 10 && wrote == 0,
        format!("not all refused: {}", excerpt(&run.stdout, 400)),
    );
    for (key, want) in [
        ("envrc: ", "absent"),
        ("sub-envrc: ", "absent"),
        ("bashrc: ", "absent"),
        ("hook: ", "absent"),
        ("hooks: ", "pre-commit.sample"),
        ("config: ", "[core]  bare = false"),
        ("git: ", ".git .vscode f sub"),
        ("tasks: ", r#"{"tasks": []}"#),
        ("sub: ", ""),
    ] {
        let got = host(key);
        v.saw(format!("host {}{got}", key.trim_end_matches(' ')));
        v.require(got == want, format!("host {key}'{got}', not '{want}'"));
    }
    // The controls: the share is writable, and git's own data too.
    let (f, object) = (host("f: "), host("object: "));
    v.saw(format!("control: host f '{f}', object '{object}'"));
    v.require(
        f == "pwned" && object == "blob",
        "the ordinary writes did not land",
    );
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_7b_with_write_hooks_the_same_script_plants_them() {
    let mut check = Check::new(
        "7b",
        "positive control for 2b: the same script with --write --write-hooks",
        "the writes go through and the host sees the new .envrc, the hook and the changed config",
    )
    .evidence(
        Source::Host,
        "the same files read back on the host (after script)",
    )
    .control(Source::Host, "itself the positive control of check 2b");
    let run = check.run(|| hooks_run(control, &["--write-hooks"]));
    let mut v = Verdict::new();
    let host = host_view(&run);
    let (wrote, refused) = hook_writes(&run);
    v.saw(format!("exit {}", code(&run)));
    v.saw(format!("{wrote} went through, {refused} refused"));
    v.require(
        wrote == 10,
        format!("not all went through: {}", excerpt(&run.stdout, 400)),
    );
    // .git was moved aside last but one: the changed config went with it.
    for key in ["envrc: ", "sub-envrc: ", "hook: ", "moved-config: "] {
        let got = host(key);
        v.saw(format!("host {}{got}", key.trim_end_matches(' ')));
        v.require(
            got.contains("pwned"),
            format!("host {key}'{got}': the write did not land"),
        );
    }
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_8_an_unsafe_mount_does_expose_the_secret() {
    let mut check = Check::new(
        "8",
        "baseline contrast for 1: the same secret-reading script with a deliberately unsafe --mount $HOME:/host:ro (the test host's HOME is /run/home)",
        "the script now prints the home secret: the controls, not the script, kept check 1 clean",
    )
    .evidence(Source::Mvm, "the home secret in what came out of the VM")
    .control(Source::Mvm, "itself the positive control of check 1");
    let run = check.run(|| {
        control(
            &planted(HOST_VIEW),
            &[
                "--workspace",
                "/run/tmp/ws",
                "--mount",
                "/run/home:/host:ro",
                // mvm refuses to share the home directory unless told.
                "--allow-home-share",
                "--",
                "sh",
                "-c",
                READ_SECRETS,
            ],
        )
    });
    let mut v = Verdict::new();
    v.saw(format!("exit {}", code(&run)));
    let read = run.stdout.contains("PLANTED-HOME-SECRET");
    v.saw(format!("home secret printed: {read}"));
    v.require(
        read,
        format!(
            "the unsafe mount did not expose it: {}",
            excerpt(&run.stdout, 200)
        ),
    );
    // Only what was mounted: the other secrets stay out even now.
    let others = run.stdout.contains("PLANTED-TMP");
    v.saw(format!("unmounted secrets printed: {others}"));
    v.require(!others, "a secret that was not mounted came out");
    check.finish(v);
}
