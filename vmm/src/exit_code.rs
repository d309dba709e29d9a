//! The exit codes of `mvm`, documented in `mvm --help` and README.md.
//!
//! `mvm run` exits with the guest command's own status (0-255; 128 + N when
//! the command was killed by signal N). The codes below are mvm's own; they
//! follow `docker run` and coreutils `timeout`, whose users already script
//! around them. A command can exit with the same numbers itself; mvm's own
//! failures always print a line starting with `mvm:` on stderr.

/// The guest ended without reporting a status: kernel panic, oops, or a
/// reboot that did not come from guest-init.
pub const GUEST_CRASHED: i32 = 121;
/// KVM is missing or not accessible.
pub const KVM_UNAVAILABLE: i32 = 122;
/// The VMM failed while the guest ran (KVM error, emulation failure).
pub const VMM_FAILED: i32 = 123;
/// The guest did not finish within --timeout.
pub const TIMEOUT: i32 = 124;
/// mvm could not start the VM: bad flag, missing or invalid kernel,
/// initramfs or size (the message says which).
pub const SETUP_FAILED: i32 = 125;
/// Guest-init found the command but could not execute it.
pub const NOT_EXECUTABLE: i32 = 126;
/// Guest-init could not find the command.
pub const NOT_FOUND: i32 = 127;

/// The table printed at the end of `mvm --help`.
pub const HELP: &str = "\
Exit status:
  N     mvm run, mvm exec: the command's own exit status (128+N if killed
        by signal N)
  0     mvm boot: the guest powered off or rebooted cleanly
  121   the guest crashed: kernel panic, oops, or an unexpected reboot
  122   KVM is unavailable: no /dev/kvm, or no permission to open it
  123   the VMM failed while the guest was running
  124   the command did not finish within --timeout
  125   mvm could not start the VM (bad flag, missing kernel, memory too
        small, a shared directory missing or unreadable, no virtiofsd, an
        image that is unknown, damaged or cannot be converted), or
        guest-init could not (a share or the image root it could not mount)
  126   the command was found in the guest but could not be executed
  127   the command was not found in the guest";
