//! The user's terminal for `mvm run -t`: raw mode while the guest's pty
//! owns the screen (restored on drop, whatever ends the run), and its size.

use std::io::{self, IsTerminal};

/// The terminal on stdin in raw mode, its settings as they were put back
/// on drop. It works on fd 0 itself, never through `io::stdin().lock()`:
/// the stdin pump holds that lock while it waits for input, so a restore
/// that took it would wait for the user's next key after the command
/// ended.
pub struct RawMode {
    saved: Option<libc::termios>,
}

impl RawMode {
    /// Puts stdin in raw mode if it is a terminal; a no-op otherwise.
    pub fn enter() -> Self {
        if !io::stdin().is_terminal() {
            return Self { saved: None };
        }
        // SAFETY: termios is plain old data; all-zero is a valid value.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes a termios into the valid pointer given.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return Self { saved: None };
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only changes the termios given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: tcsetattr reads the valid termios given.
        match unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } {
            0 => Self { saved: Some(saved) },
            _ => Self { saved: None },
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            // SAFETY: tcsetattr reads the valid termios given.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved) };
        }
    }
}

/// Rows and columns of the terminal on stdout (or stdin); 24x80 if neither
/// is one.
pub fn size() -> (u16, u16) {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO] {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes a winsize into the valid pointer given.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
            return (ws.ws_row, ws.ws_col);
        }
    }
    (24, 80)
}
