//! The user's terminal for `mvm run -t`: raw mode while the guest's pty
//! owns the screen (restored on drop, whatever ends the run), and its size.

use std::io::{self, IsTerminal};

use vmm_sys_util::terminal::Terminal;

pub struct RawMode {
    active: bool,
}

impl RawMode {
    /// Puts stdin in raw mode if it is a terminal; a no-op otherwise.
    pub fn enter() -> Self {
        let stdin = io::stdin();
        let active = stdin.is_terminal() && stdin.lock().set_raw_mode().is_ok();
        Self { active }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if self.active {
            let _ = io::stdin().lock().set_canon_mode();
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
