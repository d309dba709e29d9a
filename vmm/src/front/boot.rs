//! `mvm boot`: the console is the interface (stdout, and stdin once
//! guest-init is ready); the run ends when the guest powers off.

use std::time::Instant;

use super::{
    confine_vmm, outcome_failure, print_stats, vmm_failure, Failure, VmArgs, BASE_CMDLINE,
};
use crate::console::ConsoleOutput;
use crate::machine::{boot, Outcome};
use crate::timeline::Timeline;

pub fn boot(args: &VmArgs, started: Instant) -> Result<i32, Failure> {
    let config = args.vm_config(format!("{BASE_CMDLINE} {}", args.cmdline))?;
    let timeout = args.timeout()?;
    let console = ConsoleOutput::new(Box::new(std::io::stdout()));
    let mut front = Timeline::default();
    front.mark("arguments parsed");
    let mut machine = boot::boot(&config, console)?;
    confine_vmm(args.confinement(), None)?;
    front.mark("vmm confined");
    machine.forward_console_input();
    let deadline = timeout.map(|t| Instant::now() + t);
    machine.start().map_err(vmm_failure)?;
    let ended = machine.wait(deadline).map_err(vmm_failure)?;
    print_stats(args.print_stats, started, &front, &machine, &ended, None);
    match ended.outcome {
        Outcome::Exited(_) | Outcome::Stopped => Ok(0),
        other => Err(outcome_failure(other, args.timeout)),
    }
}
