//! A seccomp filter mvm puts on virtiofsd before exec (filters survive
//! exec and stack under virtiofsd's own): the guest may not create a
//! setuid or setgid file on the host, nor add those bits to one.
//!
//! Without it a guest with `--write` could plant a set-user-ID program in
//! the workspace owned by the caller (by root, for a root caller) that any
//! host user could then run with the caller's rights. virtiofsd has no
//! option for this, so its calls that set a mode are refused with EPERM
//! when the mode carries S_ISUID or S_ISGID: chmod (fchmod, fchmodat,
//! fchmodat2), file creation (openat with O_CREAT) and mknodat. openat2
//! hides its mode in a struct seccomp cannot read, so it is reported
//! missing (ENOSYS): virtiofsd then falls back to openat (its sandbox,
//! pivot_root into the shared directory, still keeps lookups inside).

use std::collections::BTreeMap;

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

const SET_ID_BITS: u64 = (libc::S_ISUID | libc::S_ISGID) as u64;

/// A mode argument with S_ISUID, S_ISGID or both (one rule each: seccomp
/// compares a masked value for equality only).
fn set_id_mode(arg: u8, also: &[SeccompCondition]) -> Result<Vec<SeccompRule>, BackendError> {
    [libc::S_ISUID as u64, libc::S_ISGID as u64, SET_ID_BITS]
        .iter()
        .map(|&bits| {
            let mut conditions = also.to_vec();
            conditions.push(SeccompCondition::new(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(SET_ID_BITS),
                bits,
            )?);
            SeccompRule::new(conditions)
        })
        .collect()
}

/// The two programs, applied in this order in the child before exec.
pub fn programs() -> Result<[BpfProgram; 2], BackendError> {
    let created = SeccompCondition::new(
        2,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(libc::O_CREAT as u64),
        libc::O_CREAT as u64,
    )?;
    let mut set_id = BTreeMap::new();
    set_id.insert(libc::SYS_fchmod, set_id_mode(1, &[])?);
    set_id.insert(libc::SYS_chmod, set_id_mode(1, &[])?);
    set_id.insert(libc::SYS_fchmodat, set_id_mode(2, &[])?);
    set_id.insert(libc::SYS_fchmodat2, set_id_mode(2, &[])?);
    set_id.insert(libc::SYS_mknodat, set_id_mode(2, &[])?);
    set_id.insert(libc::SYS_openat, set_id_mode(3, &[created])?);
    let refuse_set_id = SeccompFilter::new(
        set_id,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )?;
    let no_openat2 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_openat2, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?;
    Ok([refuse_set_id.try_into()?, no_openat2.try_into()?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build() {
        let [a, b] = programs().unwrap();
        assert!(!a.is_empty() && !b.is_empty());
    }

    /// In a child process: the filter refuses a setuid chmod and a setuid
    /// create, allows plain ones, and hides openat2.
    #[test]
    fn set_id_modes_are_refused_plain_ones_are_not() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let file = dir.as_path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        let created = std::ffi::CString::new(dir.as_path().join("g").to_str().unwrap()).unwrap();
        let progs = programs().unwrap();
        // SAFETY: fork in a test; the child only makes system calls and
        // _exits, its status says which check failed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above, all in the forked child.
            unsafe {
                let errno = || *libc::__errno_location();
                let mut code = 0;
                if progs.iter().any(|p| seccompiler::apply_filter(p).is_err()) {
                    libc::_exit(10);
                }
                if libc::chmod(path.as_ptr(), 0o4755) != -1 || errno() != libc::EPERM {
                    code |= 1;
                }
                if libc::chmod(path.as_ptr(), 0o755) != 0 {
                    code |= 2;
                }
                let fd = libc::openat(
                    libc::AT_FDCWD,
                    created.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o2755,
                );
                if fd != -1 || errno() != libc::EPERM {
                    code |= 4;
                }
                if libc::syscall(
                    libc::SYS_openat2,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    0usize,
                    0usize,
                ) != -1
                    || errno() != libc::ENOSYS
                {
                    code |= 8;
                }
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "bits: 1 setuid chmod allowed, 2 plain chmod refused, 4 setgid create allowed, 8 openat2 not hidden, 10 no filter");
    }
}
