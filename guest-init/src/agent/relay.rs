//! The relay between the host (vsock) and the running command: one
//! single-threaded poll loop over the vsock, the command's stdin, stdout and
//! stderr (or its pty master) and the SIGCHLD signalfd.
//!
//! Guarantees (docs/protocol.md):
//! - stdout and stderr travel as separate messages (on a pty they are one
//!   stream, sent as `Stdout`);
//! - nothing the command wrote is lost: after its exit both streams are
//!   read to end of file (see `drain.rs` for when a background process
//!   holding them open is given up on) before `Exit` is queued;
//! - memory is bounded: output is read only while less than `OUT_LIMIT` is
//!   queued for the host, and the vsock is read only while less than
//!   `STDIN_LIMIT` is queued for a command that is slow to read its stdin;
//! - the vsock is always read: the host sends stdin only as far as the
//!   `StdinCredit` it was given (`STDIN_WINDOW`, then what the command
//!   took), so a command that does not read its stdin never holds a
//!   `Signal` back behind it.
//!
//! Guest-only as PID 1; `tests/relay.rs` runs it on the host against real
//! processes.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use mvm_protocol::{Decoder, ErrorReport, Exit, Message, StdinCredit, MAX_DATA, STDIN_WINDOW};

use super::child::{Child, ChildIo};
use super::drain::Drain;
use super::fd;
use super::inbound::{self, Action};
use super::pty;
use super::queue::ByteQueue;
use super::signals::{self, ChildSignals};
use crate::status;

/// Output queued for the host above which the command's output is not read.
pub const OUT_LIMIT: usize = 256 * 1024;
/// Stdin queued for the command above which the vsock is not read. A host
/// that keeps to its credit never has more than `STDIN_WINDOW` queued; this
/// bounds the memory a host that does not keep to it can take.
pub const STDIN_LIMIT: usize = 2 * STDIN_WINDOW as usize;
/// Stdin taken by the command that is given back to the host at once;
/// smaller amounts wait until the queue is empty.
const CREDIT_BATCH: u64 = MAX_DATA as u64;
/// Bytes read from the vsock at once.
const READ_CHUNK: usize = 64 * 1024;
/// `Error` messages sent at most, so bad frames cannot fill the queue.
const MAX_REPORTS: usize = 16;
/// Longest `Error` message text, so that it always fits a frame.
const MAX_REPORT_LEN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The host closed the connection before `Exit` was sent.
    #[error("the host closed the connection before the command's exit")]
    HostClosed,
    /// The connection broke before `Exit` was sent.
    #[error("connection to the host lost: {0}")]
    HostGone(#[source] io::Error),
    #[error("cannot set up the relay: {0}")]
    Setup(#[source] io::Error),
    #[error("poll: {0}")]
    Poll(#[source] io::Error),
}

/// The command's stdin as the relay feeds it.
struct StdinSink {
    fd: OwnedFd,
    queue: ByteQueue,
    /// On a pty, end of input is the VEOF character, not a close.
    pty: bool,
    /// Pipe: close once `queue` is written out.
    close_when_drained: bool,
}

/// One output stream of the command.
struct Output {
    fd: OwnedFd,
    stderr: bool,
}

pub struct Relay<'a> {
    conn: BorrowedFd<'a>,
    signals: &'a ChildSignals,
    /// The command's pid and process group.
    pid: libc::pid_t,
    decoder: Decoder,
    to_host: ByteQueue,
    /// False after the host's stream became undecodable.
    host_readable: bool,
    stdin: Option<StdinSink>,
    stdin_eof_seen: bool,
    /// Stdin bytes the command took (or that were dropped) and that the
    /// host has not been given back as credit yet.
    credit_owed: u64,
    outputs: Vec<Output>,
    /// A pty master for resizing; `None` without a tty.
    pty_master: Option<OwnedFd>,
    exit: Option<Exit>,
    drain: Option<Drain>,
    exit_queued: bool,
    /// Runs once, after the last output is queued and before `Exit`.
    before_exit: Option<&'a mut dyn FnMut(&mut Exit)>,
    reports: usize,
    buf: Vec<u8>,
}

impl<'a> Relay<'a> {
    /// `conn` must be non-blocking. Messages in `first` (a spawn failure)
    /// go to the host before anything else.
    pub fn new(
        conn: BorrowedFd<'a>,
        signals: &'a ChildSignals,
        child: Child,
        first: &[Message],
    ) -> io::Result<Relay<'a>> {
        let (stdin, outputs, pty_master) = match child.io {
            ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => (
                sink(stdin, false),
                vec![
                    Output {
                        fd: stdout,
                        stderr: false,
                    },
                    Output {
                        fd: stderr,
                        stderr: true,
                    },
                ],
                None,
            ),
            ChildIo::Pty { master } => {
                let input = fd::duplicate(master.as_fd())?;
                let resize = fd::duplicate(master.as_fd())?;
                let output = Output {
                    fd: master,
                    stderr: false,
                };
                (sink(input, true), vec![output], Some(resize))
            }
        };
        let mut relay = Relay {
            conn,
            signals,
            pid: child.pid,
            decoder: Decoder::new(),
            to_host: ByteQueue::new(),
            host_readable: true,
            stdin: Some(stdin),
            stdin_eof_seen: false,
            credit_owed: 0,
            outputs,
            pty_master,
            exit: None,
            drain: None,
            exit_queued: false,
            before_exit: None,
            reports: 0,
            buf: vec![0; READ_CHUNK.max(MAX_DATA)],
        };
        for message in first {
            relay.send(message);
        }
        relay.send(&Message::StdinCredit(StdinCredit {
            bytes: STDIN_WINDOW,
        }));
        Ok(relay)
    }

    /// Has `f` run once the command's output is all queued, just before
    /// its `Exit`, which it may add to: the agent reports an OOM kill
    /// there, and for `mvm run` syncs, because the VMM stops the machine
    /// as soon as `Exit` arrives.
    pub fn before_exit(mut self, f: &'a mut dyn FnMut(&mut Exit)) -> Self {
        self.before_exit = Some(f);
        self
    }

    /// Runs until the command has exited, its output is drained and `Exit`
    /// is written to the vsock; returns that `Exit`.
    pub fn run(&mut self) -> Result<Exit, RelayError> {
        loop {
            if let Some(exit) = self.finished() {
                return Ok(exit);
            }
            self.step()?;
        }
    }

    /// Queues `Exit` once everything before it is queued; returns it once
    /// it is written.
    fn finished(&mut self) -> Option<Exit> {
        if !self.outputs.is_empty() {
            return None;
        }
        let mut exit = self.exit.clone()?;
        if !self.exit_queued {
            if let Some(f) = self.before_exit.take() {
                f(&mut exit);
                self.exit = Some(exit.clone());
            }
            self.send(&Message::Exit(exit.clone()));
            self.exit_queued = true;
        }
        self.to_host.is_empty().then_some(exit)
    }

    /// One poll and everything it reported.
    fn step(&mut self) -> Result<(), RelayError> {
        let now = Instant::now();
        let read_output = self.to_host.len() < OUT_LIMIT;
        if !read_output {
            // Output not being read is not output being quiet.
            if let Some(drain) = &mut self.drain {
                drain.activity(now);
            }
        }

        let mut polls = Polls::default();
        let conn = polls.add(Some(self.conn), self.conn_events());
        let sig = polls.add(Some(self.signals.fd().as_fd()), libc::POLLIN);
        let stdin = polls.add(
            self.stdin
                .as_ref()
                .filter(|s| !s.queue.is_empty())
                .map(|s| s.fd.as_fd()),
            libc::POLLOUT,
        );
        let outputs: Vec<usize> = self
            .outputs
            .iter()
            .map(|o| polls.add(read_output.then(|| o.fd.as_fd()), libc::POLLIN))
            .collect();
        let timeout = match (&self.drain, self.outputs.is_empty()) {
            (Some(drain), false) => Some(drain.deadline().saturating_duration_since(now)),
            _ => None,
        };
        match fd::poll(&mut polls.fds, timeout) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(RelayError::Poll(e)),
        }

        if polls.ready(sig) {
            self.on_sigchld();
        }
        // Output first: it frees the pipes the command may be blocked on.
        for (index, slot) in outputs.into_iter().enumerate().rev() {
            if polls.ready(slot) {
                self.read_output(index);
            }
        }
        if polls.ready(conn) {
            self.on_conn(polls.revents(conn))?;
        }
        if polls.ready(stdin) {
            self.write_stdin();
        }
        if self.drain.is_some_and(|d| d.expired(Instant::now())) {
            // Whatever still holds the output open is not the command.
            self.outputs.clear();
        }
        self.give_credit();
        Ok(())
    }

    /// Gives the host back the stdin the command took: in batches while
    /// the command reads, the rest once the queue is empty. Not after end
    /// of stdin (the host sends no more) nor after `Exit` (the last
    /// message).
    fn give_credit(&mut self) {
        if self.credit_owed == 0 || self.stdin_eof_seen || self.exit_queued {
            return;
        }
        let queue_empty = self.stdin.as_ref().is_none_or(|s| s.queue.is_empty());
        if self.credit_owed >= CREDIT_BATCH || queue_empty {
            let bytes = std::mem::take(&mut self.credit_owed);
            self.send(&Message::StdinCredit(StdinCredit { bytes }));
        }
    }

    /// The command closed its stdin while it runs on: what was queued for
    /// it is dropped and given back as credit, so the host's stdin drains
    /// as into a pipe whose reader is gone. (On the command's exit nothing
    /// is given back: `Exit` follows.)
    fn drop_stdin(&mut self) {
        if let Some(sink) = self.stdin.take() {
            self.credit_owed += sink.queue.len() as u64;
        }
    }

    fn conn_events(&self) -> libc::c_short {
        // RDHUP always: the host closing is noticed even while its stdin
        // is not being read.
        let mut events = libc::POLLRDHUP;
        if self.wants_host_input() {
            events |= libc::POLLIN;
        }
        if !self.to_host.is_empty() {
            events |= libc::POLLOUT;
        }
        events
    }

    /// Backpressure: stop taking stdin from the host while the command is
    /// not taking it from us.
    fn wants_host_input(&self) -> bool {
        self.host_readable
            && self
                .stdin
                .as_ref()
                .is_none_or(|s| s.queue.len() < STDIN_LIMIT)
    }

    fn on_conn(&mut self, revents: libc::c_short) -> Result<(), RelayError> {
        if revents & libc::POLLOUT != 0 {
            self.write_host()?;
        }
        let hangup = revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
        if self.wants_host_input() && (revents & libc::POLLIN != 0 || hangup) {
            // Read even on a hangup: what the host sent before it still
            // counts, and the read then returns end of file or the error.
            self.read_host()?;
        } else if hangup {
            // Not reading (backpressure): the hangup alone says it.
            return Err(if revents & libc::POLLERR != 0 {
                RelayError::HostGone(io::Error::other("error on the vsock connection"))
            } else {
                RelayError::HostClosed
            });
        }
        Ok(())
    }

    fn write_host(&mut self) -> Result<(), RelayError> {
        match fd::write(self.conn, self.to_host.pending()) {
            Ok(n) => self.to_host.consume(n),
            Err(e) if retry(&e) => {}
            Err(e) => return Err(RelayError::HostGone(e)),
        }
        Ok(())
    }

    fn read_host(&mut self) -> Result<(), RelayError> {
        let n = match fd::read(self.conn, &mut self.buf[..READ_CHUNK]) {
            Ok(0) => return Err(RelayError::HostClosed),
            Ok(n) => n,
            Err(e) if retry(&e) => return Ok(()),
            Err(e) => return Err(RelayError::HostGone(e)),
        };
        self.decoder.push(&self.buf[..n]);
        while let Some(frame) = self.decoder.next() {
            self.apply(inbound::action(frame));
        }
        Ok(())
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Stdin(data) => {
                if self.stdin_eof_seen {
                    self.report("stdin data after end of stdin".into());
                } else if let Some(sink) = &mut self.stdin {
                    sink.queue.push(&data);
                } else {
                    // No sink: the command closed its stdin or exited; like
                    // a pipe whose reader is gone, the data has nowhere to
                    // go, and the host may send the next.
                    self.credit_owed += data.len() as u64;
                }
            }
            Action::StdinEof => self.on_stdin_eof(),
            Action::Signal(signal) => self.signal(signal),
            Action::Resize { rows, cols } => {
                if let Some(master) = &self.pty_master {
                    let _ = pty::set_size(master.as_fd(), rows, cols);
                }
            }
            Action::Reject(message) => self.report(message),
            Action::Fatal(message) => {
                self.report(format!("{message}; killing the command"));
                self.host_readable = false;
                self.signal(libc::SIGKILL);
            }
        }
    }

    fn on_stdin_eof(&mut self) {
        if self.stdin_eof_seen {
            return;
        }
        self.stdin_eof_seen = true;
        if let Some(sink) = &mut self.stdin {
            if sink.pty {
                let eof = pty::eof_char(sink.fd.as_fd());
                sink.queue.push(&[eof]);
            } else {
                sink.close_when_drained = true;
                if sink.queue.is_empty() {
                    self.stdin = None;
                }
            }
        }
    }

    /// Signals the command's process group (it is a session leader, so its
    /// pid is the group id), which also reaches its children.
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: plain syscall; a group that is gone is not an error here.
        unsafe { libc::kill(-self.pid, signal) };
    }

    fn write_stdin(&mut self) {
        let Some(sink) = &mut self.stdin else { return };
        match fd::write(sink.fd.as_fd(), sink.queue.pending()) {
            Ok(n) => {
                sink.queue.consume(n);
                self.credit_owed += n as u64;
            }
            Err(e) if retry(&e) => return,
            // EPIPE: the command closed its stdin; drop what it won't read.
            Err(_) => {
                self.drop_stdin();
                return;
            }
        }
        if sink.close_when_drained && sink.queue.is_empty() {
            self.stdin = None;
        }
    }

    fn read_output(&mut self, index: usize) {
        let output = &self.outputs[index];
        let stderr = output.stderr;
        match fd::read(output.fd.as_fd(), &mut self.buf[..MAX_DATA]) {
            Ok(0) => {
                self.outputs.remove(index);
            }
            Ok(n) => {
                let data = self.buf[..n].to_vec();
                let message = if stderr {
                    Message::Stderr(data)
                } else {
                    Message::Stdout(data)
                };
                self.send(&message);
                if let Some(drain) = &mut self.drain {
                    drain.activity(Instant::now());
                }
            }
            Err(e) if retry(&e) => {}
            // EIO is how a pty master reports that the terminal's last
            // user closed it: end of file.
            Err(_) => {
                self.outputs.remove(index);
            }
        }
    }

    fn on_sigchld(&mut self) {
        self.signals.drain();
        let Some(raw) = signals::reap(self.pid) else {
            return;
        };
        if let Some(exit) = status::exit_message(raw) {
            self.exit = Some(exit);
            self.drain = Some(Drain::start(Instant::now()));
            // Nobody reads the command's stdin any more (and the host
            // needs no credit for what is dropped: `Exit` is coming).
            self.stdin = None;
        }
    }

    /// Queues a message for the host. Messages are built here and always
    /// fit a frame; one that did not would be dropped, never panic.
    fn send(&mut self, message: &Message) {
        if let Ok(frame) = message.to_frame() {
            self.to_host.push(&frame);
        }
    }

    fn report(&mut self, mut message: String) {
        if self.reports >= MAX_REPORTS {
            return;
        }
        self.reports += 1;
        truncate(&mut message, MAX_REPORT_LEN);
        self.send(&Message::Error(ErrorReport { message }));
    }
}

fn sink(fd: OwnedFd, pty: bool) -> StdinSink {
    StdinSink {
        fd,
        queue: ByteQueue::new(),
        pty,
        close_when_drained: false,
    }
}

/// Errors after which the same call simply has to be tried again later.
fn retry(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The poll set of one iteration. A slot without an fd (nothing to wait
/// for) is -1, which poll skips: a closed pipe or a hung-up socket we
/// are not reading would otherwise report POLLHUP forever and spin.
#[derive(Default)]
struct Polls {
    fds: Vec<libc::pollfd>,
}

impl Polls {
    fn add(&mut self, fd: Option<BorrowedFd>, events: libc::c_short) -> usize {
        self.fds.push(libc::pollfd {
            fd: fd.map_or(-1, |fd| fd.as_raw_fd()),
            events,
            revents: 0,
        });
        self.fds.len() - 1
    }

    fn revents(&self, slot: usize) -> libc::c_short {
        self.fds[slot].revents
    }

    fn ready(&self, slot: usize) -> bool {
        self.revents(slot) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_at_char_boundary() {
        let mut s = "aé".to_string(); // 'é' is two bytes
        truncate(&mut s, 2);
        assert_eq!(s, "a");
        let mut s = "abc".to_string();
        truncate(&mut s, 5);
        assert_eq!(s, "abc");
    }
}
