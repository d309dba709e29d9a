//! The proxy's own confinement, applied once its socket, log and summary
//! are open and its configuration read: Landlock with no filesystem
//! access at all, and a seccomp filter that leaves what proxying needs
//! (IPv4/IPv6 sockets, accept, connect, reads and writes, epoll, memory,
//! time). A compromised proxy can still reach what the proxy reaches on
//! the network; it cannot open a file, exec, bind or listen, or create a
//! Unix socket. A forbidden call ends the process with a one-line message.

use std::collections::BTreeMap;

use landlock::{Access, AccessFs, Ruleset, RulesetAttr, RulesetStatus, ABI};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the host kernel does not enforce Landlock (Linux 5.13 or later, with landlock in the lsm= list): pass --no-landlock to run without it")]
    LandlockUnsupported,
    #[error("cannot set up Landlock: {0}")]
    Landlock(String),
    #[error("cannot build or install the seccomp filter: {0}")]
    Seccomp(String),
}

/// No filesystem access from now on, for this thread and all it starts.
pub fn landlock() -> Result<(), Error> {
    let err = |e: landlock::RulesetError| Error::Landlock(e.to_string());
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI::V5))
        .map_err(err)?
        .create()
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    match status.ruleset {
        RulesetStatus::NotEnforced => Err(Error::LandlockUnsupported),
        _ => Ok(()),
    }
}

/// The filter, on every thread of the process (there is one: the
/// runtime is single-threaded).
pub fn seccomp() -> Result<(), Error> {
    let err = |e: &dyn std::fmt::Display| Error::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    let one_of = |arg: u8, values: &[u64]| -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        values
            .iter()
            .map(|&v| {
                SeccompRule::new(vec![SeccompCondition::new(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    v,
                )?])
            })
            .collect()
    };
    let families = [libc::AF_INET as u64, libc::AF_INET6 as u64];
    rules.insert(libc::SYS_socket, one_of(0, &families).map_err(|e| err(&e))?);
    // Memory, never executable.
    for (nr, arg) in [(libc::SYS_mmap, 2), (libc::SYS_mprotect, 2)] {
        let no_exec = SeccompRule::new(vec![SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )
        .map_err(|e| err(&e))?])
        .map_err(|e| err(&e))?;
        rules.insert(nr, vec![no_exec]);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| err(&e))?;
    let program: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(&e))?;
    install_reporter();
    seccompiler::apply_filter_all_threads(&program).map_err(|e| err(&e))
}

/// Everything else the proxy does after start.
const ALLOWED: &[i64] = &[
    // Sockets (socket(2) itself: IPv4 and IPv6 only, above).
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    // Socket flags (non-blocking, close-on-exec) as tokio sets them.
    libc::SYS_fcntl,
    // The summary file, rewritten in place.
    libc::SYS_pwrite64,
    libc::SYS_ftruncate,
    // The event loop.
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_ctl,
    // Memory (mmap and mprotect: above), locks, time, randomness.
    libc::SYS_brk,
    libc::SYS_munmap,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_getrandom,
    // The summary's peak memory (getrusage of its own process).
    libc::SYS_getrusage,
    // Signals' return path, and the end.
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

fn install_reporter() {
    // SAFETY: sigaction with a zeroed struct, a valid extern "C" handler
    // and flags; the handler only calls async-signal-safe functions.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = report_and_die as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut());
    }
}

/// "mvm-egress: seccomp: forbidden system call N (a bug: ...)", exit 159.
extern "C" fn report_and_die(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SIGSYS's siginfo: signo, errno, code, padding, then the call
    // address (8 bytes) and the system call number.
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let nr = unsafe { *(info as *const u8).add(24).cast::<i32>() };
    let mut buf = [0u8; 160];
    let mut len = 0;
    let mut digits = [0u8; 12];
    let mut i = digits.len();
    let mut v = nr.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for part in [
        b"mvm-egress: seccomp: forbidden system call ".as_slice(),
        &digits[i..],
        b" (a bug: please report it; --no-seccomp runs without the filter)\n",
    ] {
        let n = part.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&part[..n]);
        len += n;
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe and allowed.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), len);
        libc::_exit(128 + libc::SIGSYS);
    }
}
