//! The options of one command in the guest, which `mvm run` and `mvm
//! exec` share (for `mvm create` they are every exec's defaults).

use clap::Args;

#[derive(Args, Debug)]
pub struct CommandArgs {
    /// Forward stdin to the command (otherwise it reads end-of-file)
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a pseudo-terminal in the guest (with -i: an
    /// interactive shell; the window size follows this terminal)
    #[arg(short, long)]
    pub tty: bool,
    /// Set an environment variable for the command (repeatable)
    #[arg(short, long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory of the command in the guest [default: /workspace,
    /// or with --no-workspace the image's WorkingDir or /]
    #[arg(short, long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// Run the command as root in the guest (default: your own uid and gid)
    #[arg(long, conflicts_with = "user")]
    pub root: bool,
    /// Run the command as USER[:GROUP] of the guest's root: names are
    /// looked up in its /etc/passwd and /etc/group (e.g. an image's own
    /// user), numbers taken as they are [default: your own uid and gid]
    #[arg(short, long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
}
