//! How a check's VM is made: by `mvm run` (the default), or through a
//! named sandbox (`MVM_BATTERY_VIA=sandbox`, `make battery`'s second
//! pass), so that `mvm exec` is held to the same checks as `mvm run`.
//!
//! Through a sandbox, a check's `mvm run FLAGS -- CMD` becomes, in the
//! same test-host call: `mvm create NAME FLAGS` at the end of its setup
//! script, `mvm exec [EXEC FLAGS] NAME -- CMD` as the call itself (its
//! stdout, stderr, exit status and signals are the check's evidence, as
//! mvm run's are), and `mvm rm -f NAME` as the teardown script, before the
//! test host's leftover check, so a supervisor or virtiofsd that `rm`
//! does not end is left behind and fails the call. The flags that choose
//! a command's user, environment, directory, streams, time limit and
//! statistics go to `exec`; everything else (shares, image, size, egress,
//! secrets, the red runs' weakening flags) to `create`. A check that needs
//! what only `mvm run` prints (the console) cannot run this way and says
//! so instead of passing without its evidence. A check's
//! scripts make their own runs through [`nested`] the same way.

use std::sync::atomic::{AtomicUsize, Ordering};

use mvm_e2e::{mvm_with, Options, Run};

/// How the battery's calls make their VM.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Run,
    Sandbox,
}

impl Via {
    /// `MVM_BATTERY_VIA`: `run` (or unset) or `sandbox`.
    pub fn current() -> Via {
        match std::env::var("MVM_BATTERY_VIA").as_deref() {
            Err(_) | Ok("") | Ok("run") => Via::Run,
            Ok("sandbox") => Via::Sandbox,
            Ok(other) => panic!("MVM_BATTERY_VIA must be 'run' or 'sandbox', not '{other}'"),
        }
    }

    /// For the report row.
    pub fn name(self) -> &'static str {
        match self {
            Via::Run => "run",
            Via::Sandbox => "sandbox",
        }
    }
}

/// `mvm exec`'s own flags that take a value.
const EXEC_VALUE_FLAGS: [&str; 7] = [
    "-e",
    "--env",
    "-w",
    "--workdir",
    "-u",
    "--user",
    "--timeout",
];
/// `mvm exec`'s own flags without one (its `--print-stats` gives its own
/// peak RSS and its sandbox's: `battery::peak_rss`).
const EXEC_FLAGS: [&str; 6] = [
    "-i",
    "--interactive",
    "-t",
    "--tty",
    "--root",
    "--print-stats",
];
/// `mvm run` flags whose output `mvm exec` does not give: the sandbox's
/// supervisor would print it into its log, not to the check.
const RUN_ONLY: [&str; 3] = ["--console", "-q", "--quiet"];

/// `mvm run ARGS` (the flags after `run`, `--`, the command) the way
/// [`Via::current`] says.
pub fn call(options: &Options, args: &[&str]) -> Run {
    match Via::current() {
        Via::Run => {
            let mut full = vec!["run"];
            full.extend_from_slice(args);
            mvm_with(options, &full)
        }
        Via::Sandbox => through_sandbox(options, args),
    }
}

fn through_sandbox(options: &Options, args: &[&str]) -> Run {
    let split = Split::of(args);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "battery-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    );
    let setup = format!(
        "MVM=/mvm/bin/mvm; [ -x \"$MVM\" ] || MVM=build/bin/mvm\n\
         ( {}\n) || exit $?\n\
         $MVM create {} {name} 2>&1 || {{ echo \"mvm create failed with status $?\"; exit 1; }}",
        options.setup.unwrap_or(":"),
        shell_words(&split.create),
    );
    // The attacker's own console notes (a hijack's progress once the
    // agent relays its output no more) come back as teardown lines, shown
    // with a failed check's output.
    let teardown = format!(
        "MVM=/mvm/bin/mvm; [ -x \"$MVM\" ] || MVM=build/bin/mvm\n\
         {}\n$MVM logs {name} 2>/dev/null | grep -a 'attacker: ' | tail -n 8\n\
         $MVM rm -f {name}",
        options.teardown.unwrap_or(":"),
    );
    let mut exec = vec!["exec"];
    exec.extend(split.exec.iter().copied());
    exec.push(&name);
    exec.push("--");
    exec.extend(split.command.iter().copied());
    mvm_with(
        &Options {
            setup: Some(&setup),
            teardown: Some(&teardown),
            ..*options
        },
        &exec,
    )
}

/// A check's own `mvm run` in one of its scripts, as shell: `create`
/// before it and `remove` after it (empty for `mvm run`), and `call`, one
/// simple command to which the script adds its redirections, `&` or pipe.
pub struct Nested {
    pub create: String,
    pub call: String,
    pub remove: String,
}

/// `mvm run ARGS` in a check's script, the way [`Via::current`] says;
/// `name` tells its sandbox from the script's others (a word of a-z).
pub fn nested(name: &str, args: &[&str]) -> Nested {
    match Via::current() {
        Via::Run => Nested {
            create: String::new(),
            call: format!("$MVM run {}", shell_words(args)),
            remove: String::new(),
        },
        Via::Sandbox => {
            let split = Split::of(args);
            let sandbox = format!("battery-{name}");
            let mut exec = split.exec.clone();
            exec.push(&sandbox);
            exec.push("--");
            exec.extend(split.command.iter().copied());
            Nested {
                create: format!(
                    "$MVM create {} {sandbox} >/run/tmp/{sandbox}.create 2>&1 || sed 's/^/{name}: create: /' /run/tmp/{sandbox}.create",
                    shell_words(&split.create)
                ),
                call: format!("$MVM exec {}", shell_words(&exec)),
                remove: format!("$MVM rm -f {sandbox}"),
            }
        }
    }
}

/// A run's arguments sorted into `create`'s, `exec`'s and the command.
struct Split<'a> {
    create: Vec<&'a str>,
    exec: Vec<&'a str>,
    command: Vec<&'a str>,
}

impl<'a> Split<'a> {
    fn of(args: &[&'a str]) -> Split<'a> {
        let dashes = args
            .iter()
            .position(|a| *a == "--")
            .expect("a battery call puts its command after --");
        let (flags, command) = (&args[..dashes], &args[dashes + 1..]);
        let mut split = Split {
            create: Vec::new(),
            exec: Vec::new(),
            command: command.to_vec(),
        };
        let mut i = 0;
        while i < flags.len() {
            let flag = flags[i];
            let name = flag.split_once('=').map_or(flag, |(n, _)| n);
            assert!(
                !RUN_ONLY.contains(&name),
                "this check needs {flag}, which only mvm run prints (not mvm exec): it cannot run through a sandbox"
            );
            if EXEC_VALUE_FLAGS.contains(&flag) {
                split.exec.extend_from_slice(&flags[i..i + 2]);
                i += 2;
                continue;
            }
            if EXEC_FLAGS.contains(&name) || EXEC_VALUE_FLAGS.contains(&name) {
                split.exec.push(flag);
            } else {
                split.create.push(flag);
            }
            i += 1;
        }
        split
    }
}

/// `words` for `sh`, each single-quoted.
fn shell_words(words: &[&str]) -> String {
    words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_go_to_create_or_exec_and_the_command_stays_whole() {
        let split = Split::of(&[
            "--root",
            "--memory",
            "128M",
            "-e",
            "A=1",
            "--workdir=/tmp",
            "--write",
            "--timeout",
            "20",
            "--timeout=30",
            "--",
            "sh",
            "-c",
            "echo -e x",
        ]);
        assert_eq!(split.create, ["--memory", "128M", "--write"]);
        assert_eq!(
            split.exec,
            [
                "--root",
                "-e",
                "A=1",
                "--workdir=/tmp",
                "--timeout",
                "20",
                "--timeout=30"
            ]
        );
        assert_eq!(split.command, ["sh", "-c", "echo -e x"]);
    }

    #[test]
    #[should_panic(expected = "only mvm run prints")]
    fn a_check_that_needs_run_only_output_is_refused() {
        Split::of(&["--console", "--", "true"]);
    }

    #[test]
    fn words_are_quoted_for_sh() {
        assert_eq!(shell_words(&["a b", "it's"]), r#"'a b' 'it'\''s'"#);
    }
}
