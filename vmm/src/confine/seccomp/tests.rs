use super::*;

#[test]
fn every_filter_builds() {
    for kind in ThreadKind::ALL {
        let program = program(kind).unwrap();
        assert!(!program.is_empty(), "{kind:?}");
    }
}

#[test]
fn the_death_call_is_in_no_list() {
    for kind in ThreadKind::ALL {
        assert!(!COMMON.contains(&NEVER_ALLOWED));
        assert!(!own_calls(kind).contains(&NEVER_ALLOWED), "{kind:?}");
    }
}

/// Runs `probe` in a forked child under `kind`'s filter; its status.
fn under_filter(kind: ThreadKind, probe: impl FnOnce() -> i32) -> i32 {
    let prog = program(kind).unwrap();
    // SAFETY: fork in a test; the child only applies the filter, makes
    // the probe's system calls and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        if seccompiler::apply_filter(&prog).is_err() {
            // SAFETY: ends the forked child.
            unsafe { libc::_exit(100) };
        }
        let code = probe();
        // SAFETY: ends the forked child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

#[test]
fn the_vmm_thread_may_kill_only_the_helpers_groups() {
    // A group that cannot exist (above the kernel's PID maximum): the
    // allowed call then fails with ESRCH instead of killing anything.
    const HELPER: libc::pid_t = 9_999_999;
    allow_killing_groups(&[HELPER]);
    let sigsys = |status: i32| libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS;
    // SAFETY (each probe): plain system calls in the forked child.
    let allowed = under_filter(ThreadKind::Vmm, || unsafe {
        (libc::kill(-HELPER, libc::SIGKILL) == -1) as i32
    });
    assert!(
        libc::WIFEXITED(allowed) && libc::WEXITSTATUS(allowed) == 1,
        "{allowed:#x}"
    );
    // A helper that finishes on SIGTERM (mvm-egress): that one signal too.
    const ENDING: libc::pid_t = 9_999_998;
    allow_ending_groups(&[ENDING]);
    let allowed = under_filter(ThreadKind::Vmm, || unsafe {
        (libc::kill(-ENDING, libc::SIGTERM) == -1) as i32
    });
    assert!(
        libc::WIFEXITED(allowed) && libc::WEXITSTATUS(allowed) == 1,
        "{allowed:#x}"
    );
    for (target, sig) in [
        (-1, libc::SIGKILL),
        (1, libc::SIGKILL),
        (-HELPER, libc::SIGTERM),
        (-ENDING, libc::SIGINT),
        (ENDING, libc::SIGTERM),
    ] {
        let status = under_filter(ThreadKind::Vmm, || unsafe { libc::kill(target, sig) });
        assert!(
            sigsys(status),
            "kill({target}, {sig}) was let through: {status:#x}"
        );
    }
}

#[test]
fn the_session_thread_makes_socket_pairs_only_and_never_connects() {
    let sigsys = |status: i32| libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS;
    // The positive control: a Unix socket pair (what vsock::Dialer makes)
    // is let through.
    // SAFETY (each probe): plain system calls in the forked child.
    let pair = under_filter(ThreadKind::Session, || unsafe {
        let mut fds = [0i32; 2];
        (libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) < 0) as i32
    });
    assert!(
        libc::WIFEXITED(pair) && libc::WEXITSTATUS(pair) == 0,
        "a Unix socket pair was refused: {pair:#x}"
    );
    let inet_pair = under_filter(ThreadKind::Session, || unsafe {
        let mut fds = [0i32; 2];
        libc::socketpair(libc::AF_INET, libc::SOCK_STREAM, 0, fds.as_mut_ptr())
    });
    assert!(
        sigsys(inet_pair),
        "an AF_INET pair was let through: {inet_pair:#x}"
    );
    // No socket of any family: a new socket could connect to any Unix
    // socket of the user's (a D-Bus, an ssh-agent).
    for family in [libc::AF_UNIX, libc::AF_INET] {
        let made = under_filter(ThreadKind::Session, || unsafe {
            libc::socket(family, libc::SOCK_STREAM, 0)
        });
        assert!(sigsys(made), "socket({family}) was let through: {made:#x}");
    }
    // And no connect, even on an fd it already has.
    let connected = under_filter(ThreadKind::Session, || unsafe {
        let addr: libc::sockaddr_un = std::mem::zeroed();
        libc::connect(
            0,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    });
    assert!(sigsys(connected), "connect was let through: {connected:#x}");
}

#[test]
fn the_vmm_thread_makes_unix_sockets_only_when_guest_connections_are_served() {
    let sigsys = |status: i32| libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS;
    // SAFETY (each probe): plain system calls in the forked child.
    let unix = || unsafe { (libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0) as i32 };
    let before = under_filter(ThreadKind::Vmm, unix);
    assert!(
        sigsys(before),
        "the vmm thread made a socket unasked: {before:#x}"
    );
    allow_guest_connections();
    let after = under_filter(ThreadKind::Vmm, unix);
    assert!(
        libc::WIFEXITED(after) && libc::WEXITSTATUS(after) == 0,
        "{after:#x}"
    );
    // SAFETY: as above.
    let inet = under_filter(ThreadKind::Vmm, || unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0)
    });
    assert!(sigsys(inet), "an AF_INET socket was let through: {inet:#x}");
}

#[test]
fn only_side_threads_may_create_threads() {
    for kind in [ThreadKind::Vmm, ThreadKind::Vcpu] {
        for call in [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_execve,
            libc::SYS_fork,
        ] {
            assert!(!own_calls(kind).contains(&call), "{kind:?} {call}");
        }
    }
}

#[test]
fn the_open_refusal_builds() {
    assert!(!refuse_open().unwrap().is_empty());
}

#[test]
fn digits_are_written_without_allocating() {
    assert_eq!(digits(0, &mut [0; 12]), b"0");
    assert_eq!(digits(231, &mut [0; 12]), b"231");
    assert_eq!(digits(-38, &mut [0; 12]), b"-38");
}
