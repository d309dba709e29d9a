//! Per-thread seccomp filters, built with seccompiler from the allow-lists
//! (`seccomp/lists.rs`) and installed by each thread on itself before it does any work
//! for the guest (vCPU threads before their first KVM_RUN).
//!
//! The two thread kinds that handle what the guest controls get the
//! tightest lists: vCPU threads (MMIO and port I/O, device activation) and
//! the main thread (the event loop with the vsock device's queues, then
//! teardown). Neither may create threads or processes, map executable
//! memory, or issue an ioctl other than the few named. The exec client
//! threads and the signal thread see only the host side of the vsock
//! socket and the user's terminal.
//!
//! A forbidden call traps (SIGSYS): a handler names the call and the
//! thread kind on stderr, then makes the process die of SIGSYS (the
//! handler is one-shot, so its own forbidden call takes the default
//! action). docs/security.md explains every entry.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::snapshot_calls;
use lists::{
    own_calls, COMMON, PR_SET_VMA, TERMINAL_IOCTLS, THREAD_START, VCPU_IOCTLS, VMM_IOCTLS,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the {0} seccomp filter: {1}")]
    Build(&'static str, String),
    #[error("cannot install the {0} seccomp filter: {1} (a host kernel without seccomp filtering? --no-seccomp runs without it)")]
    Install(&'static str, seccompiler::Error),
}

/// Which allow-list a thread gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread: event loop, device event handlers, teardown.
    Vmm,
    /// A vCPU thread: KVM_RUN and the device register files.
    Vcpu,
    /// The exec client and its stdin pump.
    Session,
    /// The signal thread and its grace timers.
    Signals,
    /// Writes a template a first run copied (front/template_save.rs), while
    /// the run goes on: files below the template store only (Landlock).
    Writer,
}

impl ThreadKind {
    pub const ALL: [ThreadKind; 5] = [
        Self::Vmm,
        Self::Vcpu,
        Self::Session,
        Self::Signals,
        Self::Writer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Vmm => "vmm",
            Self::Vcpu => "vcpu",
            Self::Session => "session",
            Self::Signals => "signals",
            Self::Writer => "writer",
        }
    }

    /// Whether the thread creates files (openat with O_CREAT), so it
    /// cannot have [`refuse_open`] first.
    fn opens_files(self) -> bool {
        matches!(self, Self::Vmm | Self::Writer)
    }
}

/// Set by `confine::process` (on unless --no-seccomp). Off until then, so
/// code that runs unconfined (unit tests, the library's users) never
/// filters a thread it does not own.
static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
}

/// The process groups of the helpers (virtiofsd) the vmm thread may end:
/// the only `kill` it is allowed, `kill(-group, SIGKILL)`. Set before the
/// filters are built (before confinement).
static HELPER_GROUPS: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// The helpers (mvm-egress) the vmm thread may also ask to finish, with
/// `kill(-group, SIGTERM)`: the proxy then logs what is still open.
static ENDING_GROUPS: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// This run saves a snapshot: the vcpu and vmm filters get the calls that
/// takes (`snapshot_calls.rs`). Set before confinement.
static SNAPSHOTS: AtomicBool = AtomicBool::new(false);

pub fn allow_snapshots() {
    SNAPSHOTS.store(true, Ordering::SeqCst);
}

/// This run serves guest-initiated vsock connections (a guest port, e.g.
/// the egress proxy's): the vmm thread connects one Unix socket per
/// connection. Unix sockets only, never another family. Set before
/// confinement.
static GUEST_CONNECTIONS: AtomicBool = AtomicBool::new(false);

pub fn allow_guest_connections() {
    GUEST_CONNECTIONS.store(true, Ordering::SeqCst);
}

pub fn allow_killing_groups(groups: &[libc::pid_t]) {
    if let Ok(mut g) = HELPER_GROUPS.lock() {
        g.extend_from_slice(groups);
    }
}

pub fn allow_ending_groups(groups: &[libc::pid_t]) {
    if let Ok(mut g) = ENDING_GROUPS.lock() {
        g.extend_from_slice(groups);
    }
}

thread_local! {
    /// This thread's kind, for the SIGSYS report (0: none installed).
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// Installs `kind`'s filter on the calling thread (unless --no-seccomp).
/// The process must already have no_new_privs (`confine::process`).
pub fn install(kind: ThreadKind) -> Result<(), Error> {
    if !ENABLED.load(Ordering::SeqCst) {
        return Ok(());
    }
    let program = program(kind)?;
    let refuse_open = refuse_open().map_err(|e| Error::Build(kind.name(), e.to_string()))?;
    install_reporter();
    KIND.with(|k| k.set(kind as u8 + 1));
    if !kind.opens_files() {
        seccompiler::apply_filter(&refuse_open).map_err(|e| Error::Install(kind.name(), e))?;
    }
    seccompiler::apply_filter(&program).map_err(|e| Error::Install(kind.name(), e))?;
    test_hook::forbidden_syscall(kind);
    Ok(())
}

/// For a thread started by a thread of the same kind: seccomp filters are
/// inherited on clone, so it already has its creator's; this only records
/// the kind for the SIGSYS report. (Installing again would need
/// `prctl` and `seccomp`, which the inherited filter does not allow.)
pub fn inherited(kind: ThreadKind) {
    if ENABLED.load(Ordering::SeqCst) {
        KIND.with(|k| k.set(kind as u8 + 1));
    }
}

/// As [`install`], for threads that cannot hand an error back: a thread
/// that cannot be confined must not run, so the process ends (exit 123).
pub fn install_or_exit(kind: ThreadKind) {
    if let Err(e) = install(kind) {
        eprintln!("mvm: {e}");
        std::process::exit(crate::exit_code::VMM_FAILED);
    }
}

/// The signals mvm forwards, which must reach only the signal thread (the
/// handler signal-hook installs needs a call the others do not get).
pub const FORWARDED: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGWINCH,
];

/// Blocks [`FORWARDED`] in the calling thread.
pub fn block_forwarded_signals() {
    // SAFETY: a zeroed sigset filled by sigemptyset/sigaddset, then
    // pthread_sigmask on the calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// A first filter for every thread but the main one: `openat` fails with
/// EACCES instead of trapping. glibc's malloc opens
/// /proc/sys/vm/overcommit_memory when it trims a thread's heap (seen in
/// the session thread under a large stdin); such a thread must get an
/// error, not die. The allow-lists then let `openat` through to
/// this filter (of two verdicts the kernel applies the stricter).
fn refuse_open() -> Result<BpfProgram, seccompiler::BackendError> {
    SeccompFilter::new(
        BTreeMap::from([(libc::SYS_openat, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )?
    .try_into()
}

/// `kind`'s allow-list compiled to BPF.
pub fn program(kind: ThreadKind) -> Result<BpfProgram, Error> {
    let build = |e: seccompiler::BackendError| Error::Build(kind.name(), e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    if !kind.opens_files() {
        // Answered with EACCES by `refuse_open`, installed first.
        rules.insert(libc::SYS_openat, Vec::new());
    }
    let starts_threads: &[i64] = match kind {
        ThreadKind::Session | ThreadKind::Signals => THREAD_START,
        ThreadKind::Vmm | ThreadKind::Vcpu | ThreadKind::Writer => &[],
    };
    for &nr in COMMON.iter().chain(own_calls(kind)).chain(starts_threads) {
        rules.insert(nr, Vec::new());
    }
    rules.insert(libc::SYS_mmap, vec![no_exec(2).map_err(build)?]);
    rules.insert(libc::SYS_mprotect, vec![no_exec(2).map_err(build)?]);
    let mut ioctls = match kind {
        ThreadKind::Vmm => VMM_IOCTLS,
        ThreadKind::Vcpu => VCPU_IOCTLS,
        ThreadKind::Session | ThreadKind::Signals => TERMINAL_IOCTLS,
        ThreadKind::Writer => &[],
    }
    .to_vec();
    if SNAPSHOTS.load(Ordering::SeqCst) {
        match kind {
            ThreadKind::Vcpu => ioctls.extend(snapshot_calls::vcpu_ioctls()),
            ThreadKind::Vmm => {
                ioctls.extend(snapshot_calls::vm_ioctls());
                for &nr in snapshot_calls::FILE_CALLS {
                    rules.insert(nr, Vec::new());
                }
            }
            ThreadKind::Session | ThreadKind::Signals | ThreadKind::Writer => {}
        }
    }
    if kind == ThreadKind::Writer {
        // It exists only to write a snapshot's files.
        for &nr in snapshot_calls::FILE_CALLS {
            rules.insert(nr, Vec::new());
        }
    }
    // No rule at all would allow every ioctl: a thread without any has
    // none in the filter.
    if !ioctls.is_empty() {
        rules.insert(libc::SYS_ioctl, arg_is_one_of(1, &ioctls).map_err(build)?);
    }
    if kind == ThreadKind::Vmm {
        // Kicking a vCPU thread out of KVM_RUN (pause, stop): only this
        // process's threads, only with the kick signal.
        rules.insert(libc::SYS_tgkill, vec![own_kick().map_err(build)?]);
        // Ending the helpers: SIGKILL to their process groups, SIGTERM to
        // those that finish on it, nothing else (not -1, not another
        // process of the user's).
        let kill = HELPER_GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
        let term = ENDING_GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
        let kills = kill
            .iter()
            .map(|&g| kill_group(g, libc::SIGKILL))
            .chain(term.iter().map(|&g| kill_group(g, libc::SIGTERM)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(build)?;
        if !kills.is_empty() {
            rules.insert(libc::SYS_kill, kills);
        }
    }
    if kind == ThreadKind::Vmm && GUEST_CONNECTIONS.load(Ordering::SeqCst) {
        // The vsock device connecting a guest's connection to its port's
        // Unix socket (devices/src/virtio/vsock/unix_connect.rs).
        rules.insert(
            libc::SYS_socket,
            arg_is_one_of(0, &[libc::AF_UNIX as u64]).map_err(build)?,
        );
        rules.insert(libc::SYS_connect, Vec::new());
    }
    if kind == ThreadKind::Session {
        // The exec client reaches the guest through socket pairs it hands
        // to the vsock device (vsock::Dialer): Unix ones only. It has no
        // `socket` and no `connect`, so nothing else is within its reach.
        rules.insert(
            libc::SYS_socketpair,
            arg_is_one_of(0, &[libc::AF_UNIX as u64]).map_err(build)?,
        );
    }
    if matches!(kind, ThreadKind::Session | ThreadKind::Signals) {
        // Threads started from these name themselves (and their stacks).
        let options = [libc::PR_SET_NAME as u64, PR_SET_VMA];
        rules.insert(libc::SYS_prctl, arg_is_one_of(0, &options).map_err(build)?);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(build)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Build(kind.name(), e.to_string()))
}

/// Argument `arg` equal to one of `values`: one rule each.
fn arg_is_one_of(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    values
        .iter()
        .map(|&v| {
            SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect()
}

/// The real-time signal that gets a vCPU thread out of `KVM_RUN` (its
/// handler does nothing; machine/vcpu.rs). Firecracker uses SIGRTMIN + 0
/// too; nothing else in mvm uses real-time signals.
pub fn vcpu_kick_signal() -> i32 {
    vmm_sys_util::signal::SIGRTMIN()
}

/// `kill(-group, SIGKILL)`.
fn kill_group(
    group: libc::pid_t,
    signal: libc::c_int,
) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::from((-group) as u32),
        )?,
        SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, signal as u64)?,
    ])
}

/// `tgkill(getpid(), _, kick signal)`.
fn own_kick() -> Result<SeccompRule, seccompiler::BackendError> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    SeccompRule::new(vec![
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pid)?,
        SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            vcpu_kick_signal() as u64,
        )?,
    ])
}

/// Argument `arg` (a `prot`) without PROT_EXEC: no new executable memory.
fn no_exec(arg: u8) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
        0,
    )?])
}

/// A call no list allows, used to die of SIGSYS.
const NEVER_ALLOWED: i64 = libc::SYS_getppid;

/// One SIGSYS handler for the process (installed once; SA_RESETHAND makes
/// it one-shot).
fn install_reporter() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: sigaction with a zeroed struct, a valid extern "C" handler
    // and flags; the handler only calls async-signal-safe functions.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = report_and_die as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut());
    }
}

/// "mvm: seccomp: forbidden system call N in a KIND thread (a bug: please
/// report it; --no-seccomp runs without the filters)", then SIGSYS.
extern "C" fn report_and_die(
    _sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SIGSYS's siginfo: signo, errno, code (3 ints + padding), then the
    // union: call address (8 bytes), syscall number (int), arch.
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let nr = unsafe { *(info as *const u8).add(24).cast::<i32>() };
    let kind = KIND.with(|k| k.get());
    let kind = ThreadKind::ALL
        .get(usize::from(kind).wrapping_sub(1))
        .map_or("unconfined", |k| k.name());
    let mut buf = [0u8; 192];
    let mut len = 0;
    for part in [
        b"mvm: seccomp: forbidden system call ".as_slice(),
        digits(nr, &mut [0u8; 12]),
        b" in a ",
        kind.as_bytes(),
        b" thread (a bug: please report it; --no-seccomp runs without the filters)\n",
    ] {
        let n = part.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&part[..n]);
        len += n;
    }
    // SAFETY: write(2) and a raw system call are async-signal-safe; the
    // disposition is back to default (SA_RESETHAND), so the trapped call
    // below kills the process with SIGSYS.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), len);
        libc::syscall(NEVER_ALLOWED);
        libc::_exit(128 + libc::SIGSYS);
    }
}

fn digits(n: i32, out: &mut [u8; 12]) -> &[u8] {
    let mut v = n.unsigned_abs();
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if n < 0 {
        i -= 1;
        out[i] = b'-';
    }
    &out[i..]
}

/// Debug builds only: `MVM_TEST_FORBIDDEN_SYSCALL=<kind>` makes that
/// thread kind try a forbidden call right after its filter is in, so a
/// test can see the process die of SIGSYS.
#[cfg(debug_assertions)]
pub(crate) mod test_hook {
    use super::{ThreadKind, NEVER_ALLOWED};
    use std::sync::OnceLock;

    static WANTED: OnceLock<Option<String>> = OnceLock::new();

    /// Read before the environment is cleared.
    pub fn read_env() {
        WANTED.get_or_init(|| std::env::var("MVM_TEST_FORBIDDEN_SYSCALL").ok());
    }

    pub fn forbidden_syscall(kind: ThreadKind) {
        if WANTED.get().and_then(|w| w.as_deref()) == Some(kind.name()) {
            // SAFETY: a system call without arguments or side effects.
            unsafe { libc::syscall(NEVER_ALLOWED) };
        }
    }
}

#[cfg(not(debug_assertions))]
pub(crate) mod test_hook {
    use super::ThreadKind;
    pub fn read_env() {}
    pub fn forbidden_syscall(_kind: ThreadKind) {}
}

mod lists;

#[cfg(test)]
mod tests;
