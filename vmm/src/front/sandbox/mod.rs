//! Named sandboxes (docs/sandboxes.md): `mvm create` starts a machine that
//! outlives the command, run by a supervisor process of its own (no
//! central daemon); `exec` runs commands in it; `ls`, `stop`, `start`,
//! `rm` and `logs` manage it. Where each one's files live and how its
//! state is told is `crate::sandboxes`.

mod create;
mod exec;
mod manage;
mod supervise;

use std::fs;
use std::path::Path;

use clap::{Args, Parser};

use super::run::RunArgs;
use super::{setup_failure, Failure, VmArgs};
use crate::sandboxes;

pub use create::{create, start};
pub use exec::{exec, ExecArgs};
pub use manage::{logs, ls, rm, stop, LsArgs, RmArgs};
pub use supervise::supervise;

/// `--disk`'s default.
pub const DEFAULT_DISK: &str = "4G";
/// The smallest disk `--disk` takes.
const MIN_DISK: u64 = 64 << 20;

/// `--disk SIZE` in bytes: at least 64M, whole 512-byte sectors.
fn disk_bytes(text: &str) -> Result<u64, Failure> {
    match crate::config::parse_size(text) {
        Ok(n) if n >= MIN_DISK => Ok(n - n % 512),
        _ => Err(setup_failure(format!(
            "--disk '{text}' is not a size of at least 64M (e.g. 4G or 20G)"
        ))),
    }
}

/// `mvm create`'s options after the name: those of `mvm run`, which
/// become the sandbox's machine and every exec's defaults.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The sandbox's disk: everything written to its root (packages,
    /// files under /usr, /home, ...) lives there and is kept across stop
    /// and start. A sparse file: it takes host space only as it fills.
    /// With an image root only (not --image none)
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_DISK)]
    pub disk: String,
    #[command(flatten)]
    pub vm: VmArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The stored words (the name, then the options) parsed again by the
/// supervisor.
#[derive(Parser, Debug)]
#[command(name = "mvm create", no_binary_name = true)]
struct Stored {
    #[arg(value_name = "NAME")]
    _name: String,
    #[command(flatten)]
    options: CreateArgs,
}

/// The options a record keeps, parsed.
fn parse_stored(record: &sandboxes::Record) -> Result<CreateArgs, Failure> {
    Stored::try_parse_from(&record.args)
        .map(|s| s.options)
        .map_err(|e| {
            setup_failure(format!(
                "sandbox '{}': its stored options no longer parse ({}); remove it with mvm rm",
                record.name,
                e.kind()
            ))
        })
}

/// The supervisor's last `mvm: ` line, without the prefix: why it ended,
/// when it ended with an error.
fn last_error(log: &Path) -> Option<String> {
    let text = fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("mvm: ")
                .filter(|m| !m.starts_with("warning:"))
        })
        .map(str::to_string)
}

fn sandbox_failure(err: sandboxes::Error) -> Failure {
    setup_failure(err.to_string())
}

/// Options that mean something for one command only are refused for a
/// sandbox, with what to do instead.
fn refuse_one_shot_options(args: &CreateArgs) -> Result<(), Failure> {
    let refused = [
        (
            args.run.command.interactive,
            "-i/--interactive: give it to mvm exec",
        ),
        (args.run.command.tty, "-t/--tty: give it to mvm exec"),
        (
            args.vm.timeout.is_some(),
            "--timeout: a sandbox runs until mvm stop",
        ),
        (
            args.run.console,
            "--console: the console goes to the log (mvm logs NAME)",
        ),
    ];
    match refused.iter().find(|(given, _)| *given) {
        Some((_, why)) => Err(setup_failure(format!("mvm create does not take {why}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_mvm_line_is_the_error() {
        let path = std::env::temp_dir().join(format!("mvm-suplog-{}", std::process::id()));
        fs::write(
            &path,
            "mvm: warning: something\nnoise\nmvm: cannot share /x: gone\nmore noise\n",
        )
        .unwrap();
        assert_eq!(last_error(&path).as_deref(), Some("cannot share /x: gone"));
        fs::remove_file(&path).unwrap();
    }
}
