//! The VMM's own confinement, the second boundary (docs/security.md): if a
//! guest escapes into the VMM process it should find no capabilities, no
//! way to gain any, no view of the host filesystem, no inherited file
//! descriptors or environment, and per thread only the system calls that
//! thread needs.
//!
//! Order: inherited fds are closed first thing; everything the VMM needs
//! is opened while the VM is built (and virtiofsd started); then, before
//! any other thread exists, [`process`] clears the environment, applies
//! Landlock and drops capabilities (all three are per thread and inherited
//! by threads started afterwards), and each thread installs its own seccomp
//! filter as it starts ([`seccomp::install`]); a thread started by an
//! already filtered thread of the same kind inherits its creator's.

pub mod caps;
pub mod landlock;
pub mod seccomp;
mod snapshot_calls;

use std::io;

pub use seccomp::ThreadKind;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Landlock(#[from] landlock::Error),
    #[error(transparent)]
    Caps(#[from] caps::Error),
}

/// What the user switched off (each with a warning).
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub seccomp: bool,
    pub landlock: bool,
}

impl Options {
    /// The warnings for what is off, one line each.
    pub fn warnings(&self) -> Vec<&'static str> {
        let mut w = Vec::new();
        if !self.seccomp {
            w.push("mvm: warning: --no-seccomp: the VMM runs without system call filters (for debugging only)");
        }
        if !self.landlock {
            w.push("mvm: warning: --no-landlock: the VMM keeps your view of the host filesystem");
        }
        w
    }
}

/// Closes every fd above stderr that the caller passed down: the VMM
/// holds only what it opened itself.
pub fn close_inherited_fds() -> io::Result<()> {
    // SAFETY: close_range on fds this process owns; nothing else holds
    // them yet (called first thing in main).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if ret == 0 {
        return Ok(());
    }
    // Before Linux 5.9: one by one.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: as above; a stale entry (the read_dir's own fd) fails
        // harmlessly with EBADF.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Environment, filesystem view, capabilities: for the calling thread and
/// all it starts. Call with no other thread running.
pub fn process(opts: Options, writable: Option<landlock::Writable>) -> Result<(), Error> {
    seccomp::test_hook::read_env();
    test_hook::read_env();
    seccomp::set_enabled(opts.seccomp);
    clear_environment();
    if opts.landlock {
        landlock::restrict(writable)?;
    }
    caps::drop_all()?;
    test_hook::try_open();
    Ok(())
}

/// Empties the environment and wipes the strings it started with (they
/// stay in memory, and in /proc/PID/environ, after a mere clearenv).
fn clear_environment() {
    // Fields 50 and 51 of /proc/self/stat, counted after the ")" that ends
    // the command name (which may itself hold spaces).
    let block = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let start: usize = fields.get(50 - 3)?.parse().ok()?;
            let end: usize = fields.get(51 - 3)?.parse().ok()?;
            (end > start).then_some((start, end - start))
        });
    // SAFETY: no other thread exists yet, so nothing reads the environment
    // while it is cleared; [start, start + len) is the kernel-reported
    // initial environment block on this process's stack, mapped
    // read-write, and after clearenv nothing refers to it any more.
    unsafe {
        libc::clearenv();
        if let Some((start, len)) = block {
            std::ptr::write_bytes(start as *mut u8, 0, len);
        }
    }
}

/// Debug builds only: `MVM_TEST_OPEN=<path>` makes the main thread try to
/// open PATH once confined and say what happened, so a test can see that
/// the host filesystem is out of reach.
#[cfg(debug_assertions)]
mod test_hook {
    use std::sync::OnceLock;

    static PATH: OnceLock<Option<String>> = OnceLock::new();

    pub fn read_env() {
        PATH.get_or_init(|| std::env::var("MVM_TEST_OPEN").ok());
    }

    pub fn try_open() {
        if let Some(path) = PATH.get().and_then(|p| p.as_deref()) {
            match std::fs::File::open(path) {
                Ok(_) => eprintln!("mvm: test hook: opened {path}"),
                Err(e) => eprintln!("mvm: test hook: cannot open {path}: {e}"),
            }
        }
    }
}

#[cfg(not(debug_assertions))]
mod test_hook {
    pub fn read_env() {}
    pub fn try_open() {}
}
