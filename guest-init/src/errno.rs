//! Error numbers as the user should read them.

use std::ffi::CStr;
use std::io;

/// The C library's message for `errno`, without Rust's "(os error N)".
pub fn strerror(errno: i32) -> String {
    let mut buf = [0 as libc::c_char; 128];
    // SAFETY: buf is writable for its full length; the XSI strerror_r the
    // libc crate binds always NUL-terminates on success.
    if unsafe { libc::strerror_r(errno, buf.as_mut_ptr(), buf.len()) } != 0 {
        return format!("error {errno}");
    }
    // SAFETY: strerror_r succeeded, so buf holds a NUL-terminated string.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// An I/O error as the user should read it: the C library's message when
/// it carries an errno.
pub fn message(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(errno) => strerror(errno),
        None => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        assert_eq!(strerror(libc::ENOENT), "No such file or directory");
        assert_eq!(strerror(libc::EACCES), "Permission denied");
        let err = io::Error::from_raw_os_error(libc::EROFS);
        assert_eq!(message(&err), "Read-only file system");
        assert_eq!(message(&io::Error::other("odd")), "odd");
    }
}
