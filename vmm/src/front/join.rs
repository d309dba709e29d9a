//! One command joined to a machine that is already running, through its
//! vsock socket, from a client process of its own: the exec channel with
//! what `mvm run` offers (stdin, a pty, signals forwarded, a time limit,
//! the exact exit status). `mvm exec` joins a named sandbox this way,
//! `mvm oci exec` a container's `mvm run --serve-exec`; each puts how it
//! ended in its own words.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use mvm_protocol::{ExecRequest, Exit, Message, Resize, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
use signal_hook::iterator::Signals;

use crate::session::client::{self, Writer};
use crate::session::signals::TERMINATE_GRACE;
use crate::session::terminal;

/// `Ended::Cut`'s `by` when the time limit cut the channel (a signal's
/// number otherwise).
pub const CUT_BY_TIMEOUT: i32 = -1;

/// The command to join, and how.
pub struct Call {
    pub request: ExecRequest,
    /// Forward this process's stdin (else the command reads EOF at once).
    pub interactive: bool,
    /// Put this process's terminal in raw mode while the command runs.
    pub raw_terminal: bool,
    /// Cut the channel after this long (the agent kills the command).
    pub timeout: Option<Duration>,
}

/// How the joined command ended.
pub enum Ended {
    /// Its own exit status came back.
    Exited(Exit),
    /// This client cut the channel: `by` the time limit or a signal's
    /// grace (the agent killed the command).
    Cut { by: i32 },
    /// The channel broke or carried what it must not.
    Lost(client::Error),
}

/// Runs `call` over `stream` (connected to the agent's port) to its end.
/// `started` is called once the agent took the command. Errs only when
/// this process cannot do its part (threads, signal handlers).
pub fn run(stream: UnixStream, call: Call, started: impl FnOnce()) -> Result<Ended, String> {
    let writer: Writer = Arc::new(Mutex::new(
        stream
            .try_clone()
            .map_err(|e| format!("cannot use the exec channel: {e}"))?,
    ));
    let mut reader = match client::start(&stream, &writer, call.request) {
        Ok((reader, _)) => reader,
        Err(e) => return Ok(Ended::Lost(e)),
    };
    started();
    let raw_mode = call.raw_terminal.then(terminal::RawMode::enter);
    let cut_by = Arc::new(AtomicI32::new(0));
    forward_signals(writer.clone(), &stream, cut_by.clone())?;
    if let Some(limit) = call.timeout {
        cut_after(limit, &stream, cut_by.clone(), CUT_BY_TIMEOUT)?;
    }
    let window = Arc::new(client::StdinWindow::default());
    if call.interactive {
        client::pump_stdin(writer, window.clone());
    } else if let Err(e) = client::send(&writer, &Message::StdinEof) {
        return Ok(Ended::Lost(e));
    }
    let exit = client::relay_output(&mut reader, &window);
    drop(raw_mode);
    let _ = stream.shutdown(Shutdown::Both);
    Ok(match exit {
        Ok(exit) => Ended::Exited(exit),
        Err(e) => match cut_by.load(Ordering::SeqCst) {
            0 => Ended::Lost(e),
            by => Ended::Cut { by },
        },
    })
}

/// Cuts the channel after `wait` unless the command ended first (the
/// agent then kills the command), noting `why` in `cut_by`.
fn cut_after(
    wait: Duration,
    stream: &UnixStream,
    cut_by: Arc<AtomicI32>,
    why: i32,
) -> Result<(), String> {
    let cut = stream
        .try_clone()
        .map_err(|e| format!("cannot use the exec channel: {e}"))?;
    thread::spawn(move || {
        thread::sleep(wait);
        let _ = cut_by.compare_exchange(0, why, Ordering::SeqCst, Ordering::SeqCst);
        let _ = cut.shutdown(Shutdown::Both);
    });
    Ok(())
}

/// Ctrl-C, SIGQUIT, SIGTERM and SIGHUP go to the command; SIGWINCH
/// resizes its terminal. After SIGTERM or SIGHUP the command gets the
/// grace period, then the channel is cut (the agent kills the command)
/// and `cut_by` says by which signal.
fn forward_signals(
    writer: Writer,
    stream: &UnixStream,
    cut_by: Arc<AtomicI32>,
) -> Result<(), String> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let cut = stream
        .try_clone()
        .map_err(|e| format!("cannot use the exec channel: {e}"))?;
    thread::Builder::new()
        .name("mvm-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let msg = match sig {
                    SIGWINCH => {
                        let (rows, cols) = terminal::size();
                        Message::Resize(Resize { rows, cols })
                    }
                    _ => Message::Signal(Signal { signal: sig }),
                };
                if sig == SIGTERM || sig == SIGHUP {
                    let _ = cut_after(TERMINATE_GRACE, &cut, cut_by.clone(), sig);
                }
                let writer = writer.clone();
                // Off this thread: a send may wait for the guest's credit.
                thread::spawn(move || {
                    let _ = client::send(&writer, &msg);
                });
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}
