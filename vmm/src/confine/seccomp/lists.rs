//! The allow-lists themselves: what every thread may call, what each
//! kind adds, and the ioctls each may issue (docs/security.md explains
//! every entry). `seccomp.rs` compiles them, with the argument checks.

use super::ThreadKind;

/// Every thread: memory (malloc, thread stacks going away), locks, its
/// own end, time, and what a signal handler needs to return.
pub(super) const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_futex,
    libc::SYS_brk,
    libc::SYS_munmap,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_getrandom,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Starting a thread (and the new thread's first steps before it names
/// itself): the session thread starts the stdin pump, the signal thread
/// SIGTERM's grace timer. Never the vmm or vcpu threads.
pub(super) const THREAD_START: &[i64] = &[
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_gettid,
    libc::SYS_sched_getaffinity,
];

pub(super) fn own_calls(kind: ThreadKind) -> &'static [i64] {
    match kind {
        ThreadKind::Vmm => &[
            // The event loop and the vsock device's sockets.
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_epoll_ctl,
            libc::SYS_accept4,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_shutdown,
            libc::SYS_close,
            libc::SYS_fcntl,
            libc::SYS_getsockopt,
            // The root disk's reads (virtio-blk), at positions in the
            // image file opened before confinement; a sandbox's disk's
            // writes and flushes.
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_fdatasync,
            // Stats (--print-stats).
            libc::SYS_getrusage,
            libc::SYS_mincore,
            // Teardown: reaping the helpers (killing them: below), the
            // session directory (Landlock limits which files), the console
            // tail.
            libc::SYS_wait4,
            libc::SYS_openat,
            libc::SYS_newfstatat,
            libc::SYS_fstat,
            libc::SYS_statx,
            libc::SYS_getdents64,
            libc::SYS_unlinkat,
            libc::SYS_lseek,
            libc::SYS_getpid,
            libc::SYS_clock_nanosleep,
        ],
        ThreadKind::Vcpu => &[
            // Device activation talks vhost-user to virtiofsd (messages
            // with fds), and a vCPU stopping writes the stop eventfd.
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            // A device dropping an fd it held (e.g. a console writer).
            libc::SYS_close,
        ],
        ThreadKind::Session => &[
            // Talking to the agent over a socket pair the vsock device
            // holds the other end of, retrying (socketpair: Unix only,
            // below); the read timeout on the device's answer.
            libc::SYS_setsockopt,
            libc::SYS_fcntl,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_shutdown,
            libc::SYS_close,
            libc::SYS_clock_nanosleep,
            libc::SYS_poll,
        ],
        ThreadKind::Writer => &[
            // The template's files (Landlock: below the store only), and
            // removing a half-written one; its lock file closed at the
            // end. The snapshot's own calls: `snapshot_calls::FILE_CALLS`.
            libc::SYS_openat,
            libc::SYS_close,
            // Closing a file: the standard library's debug builds check
            // the fd first (F_GETFD).
            libc::SYS_fcntl,
            libc::SYS_newfstatat,
            libc::SYS_fstat,
            libc::SYS_statx,
            libc::SYS_getdents64,
            libc::SYS_unlinkat,
            // The temporary names carry the process id.
            libc::SYS_getpid,
        ],
        ThreadKind::Signals => &[
            // signal-hook's handler and its self-pipe.
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_poll,
            libc::SYS_close,
            libc::SYS_clock_nanosleep,
        ],
    }
}

/// `PR_SET_VMA` (naming anonymous memory, e.g. a new thread's stack).
pub(super) const PR_SET_VMA: u64 = 0x5356_4d41;

/// KVM_RUN, as `_IO(KVMIO, 0x80)`.
pub(super) const KVM_RUN: u64 = 0xae80;
pub(super) const VCPU_IOCTLS: &[u64] = &[KVM_RUN];
/// The terminal: its size, and raw mode off again (the main thread
/// restores it at the end); FIONBIO is `set_nonblocking` on vsock clients.
pub(super) const TERMINAL_IOCTLS: &[u64] = &[libc::TIOCGWINSZ];
pub(super) const VMM_IOCTLS: &[u64] = &[
    libc::FIONBIO,
    libc::TIOCGWINSZ,
    libc::TCGETS,
    libc::TCSETS,
    libc::TCSETSW,
    libc::TCSETSF,
];
