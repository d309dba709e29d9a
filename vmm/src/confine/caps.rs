//! No capabilities and no way to gain any: the bounding set emptied (where
//! the caller has CAP_SETPCAP to do so), the effective, permitted,
//! inheritable and ambient sets cleared, and no_new_privs set.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot drop capabilities: {0}")]
    Drop(io::Error),
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(io::Error),
}

/// `struct __user_cap_header_struct` / `__user_cap_data_struct`, version 3.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn drop_all() -> Result<(), Error> {
    // SAFETY: prctl and capset with valid arguments; they change only
    // this thread's credentials.
    unsafe {
        if libc::prctl(libc::PR_CAPBSET_READ, 0) >= 0 {
            // Dropping from the bounding set needs CAP_SETPCAP; without it
            // (an ordinary caller) nothing can be gained back anyway once
            // no_new_privs is set, so EPERM is fine.
            let mut cap = 0;
            while libc::prctl(libc::PR_CAPBSET_READ, cap) >= 0 {
                libc::prctl(libc::PR_CAPBSET_DROP, cap);
                cap += 1;
            }
        }
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
            .into(),
        )
        .map_err(Error::Drop)?;
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        check(libc::syscall(libc::SYS_capset, &header, data.as_ptr())).map_err(Error::Drop)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())
            .map_err(Error::NoNewPrivs)?;
    }
    Ok(())
}
