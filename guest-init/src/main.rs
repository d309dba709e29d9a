//! `mvm-init`: PID 1 of an mvm guest. All logic lives in the library; see
//! `init.rs` for the boot sequence.

// std's normal entry point reopens closed fds 0-2 on /dev/null and aborts
// when it cannot. Our PID 1 starts with no fds and no /dev/null (devtmpfs is
// not mounted yet), so that abort would panic the kernel. Taking `main`
// ourselves skips that runtime setup; std itself still works.
#![cfg_attr(not(test), no_main)]

/// C entry point, called by the C runtime of the static binary.
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    mvm_guest_init::init::run()
}
