//! The host end of the exec channel (docs/protocol.md, version 2): connect
//! through the vsock device's Unix socket, shake hands with the guest
//! agent, send the command, and relay its stdin, stdout and stderr until it
//! exits. Blocking I/O on a dedicated thread: a slow stdout reader makes
//! this thread write slowly, which stops it reading the socket, which
//! (through vsock credit) stops the guest: memory stays bounded end to end.
//! Stdin goes out only as far as the agent's `StdinCredit` allows
//! (`StdinWindow`), so the stream never fills with stdin a command does not
//! read, and a `Signal` is never held behind it.

use crate::confine::{seccomp, ThreadKind};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use mvm_devices::virtio::vsock::Dialer;
use mvm_protocol::{
    check_guest_version, ExecRequest, Exit, FrameError, FrameReader, Hello, Message, MAX_DATA,
};

/// How long to wait between attempts while the guest agent is not yet
/// listening (the VM is still booting).
const CONNECT_RETRY: Duration = Duration::from_millis(10);
/// How long one attempt waits for the device's answer to `CONNECT` (the
/// guest's, in truth: the device forwards the request); then it asks again.
const CONNECT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the VM stopped before its agent accepted the command")]
    VmGone,
    #[error("cannot reach the guest agent through {path}: {source}")]
    Connect { path: String, source: io::Error },
    #[error("the exec channel broke: {0}")]
    Frame(#[from] FrameError),
    #[error("cannot write to the guest: {0}")]
    Write(io::Error),
    #[error("{0}")]
    Version(#[from] mvm_protocol::VersionError),
    #[error("the guest agent refused the command: {0}")]
    Refused(String),
    #[error("the guest agent sent {0} where it must not")]
    Unexpected(&'static str),
    #[error("the guest agent closed the channel before the command's exit status")]
    Lost,
}

/// The writing half, shared by the stdin pump and the signal forwarder.
pub type Writer = Arc<Mutex<UnixStream>>;

/// How many more bytes of stdin the agent has room for: the output relay
/// adds each `StdinCredit`, the stdin pump takes from it before each send
/// and waits while there is none. Closed when the relay ends, which lets a
/// waiting pump go.
#[derive(Default)]
pub struct StdinWindow {
    state: Mutex<WindowState>,
    changed: Condvar,
}

#[derive(Default)]
struct WindowState {
    bytes: u64,
    closed: bool,
}

impl StdinWindow {
    pub fn grant(&self, bytes: u64) {
        if let Ok(mut state) = self.state.lock() {
            state.bytes = state.bytes.saturating_add(bytes);
            self.changed.notify_all();
        }
    }

    pub fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
            self.changed.notify_all();
        }
    }

    /// Waits for room and takes up to `want` bytes of it (at least one);
    /// `None` once the window is closed.
    fn take(&self, want: usize) -> Option<usize> {
        let mut state = self.state.lock().ok()?;
        while state.bytes == 0 && !state.closed {
            state = self.changed.wait(state).ok()?;
        }
        if state.closed {
            return None;
        }
        let n = state.bytes.min(want as u64);
        state.bytes -= n;
        Some(n as usize)
    }
}

pub fn send(writer: &Writer, msg: &Message) -> Result<(), Error> {
    let mut w = writer
        .lock()
        .map_err(|_| Error::Write(io::Error::other("writer lock poisoned")))?;
    msg.encode(&mut *w).map_err(|e| match e {
        FrameError::Io(io) => Error::Write(io),
        other => Error::Frame(other),
    })
}

/// Connects to guest `port` through the device's hybrid Unix socket at
/// `uds` (a client in another process, or a test's fake device),
/// retrying while the guest is still booting; `vm_gone` ends the wait.
pub fn connect(uds: &Path, port: u32, vm_gone: &dyn Fn() -> bool) -> Result<UnixStream, Error> {
    let shown = uds.display().to_string();
    connect_waiting(
        &|| UnixStream::connect(uds),
        &shown,
        port,
        vm_gone,
        CONNECT_REPLY_TIMEOUT,
    )
    .map(|(stream, _)| stream)
}

/// [`connect`] for the VMM's own exec client: each attempt is a socket
/// pair handed to the device (`Dialer`), so the confined session thread
/// needs neither `socket` nor `connect`.
pub fn connect_dialing(
    dialer: &Dialer,
    port: u32,
    vm_gone: &dyn Fn() -> bool,
) -> Result<UnixStream, Error> {
    connect_dialing_counted(dialer, port, vm_gone).map(|(stream, _)| stream)
}

/// [`connect_dialing`], also saying how many attempts it took (1: the
/// agent was listening at the first).
pub fn connect_dialing_counted(
    dialer: &Dialer,
    port: u32,
    vm_gone: &dyn Fn() -> bool,
) -> Result<(UnixStream, u32), Error> {
    connect_waiting(
        &|| dialer.dial(),
        "the vsock device",
        port,
        vm_gone,
        CONNECT_REPLY_TIMEOUT,
    )
}

/// A fresh stream to the device, one per attempt.
type Dial<'a> = &'a dyn Fn() -> io::Result<UnixStream>;

/// The retry loop, with each attempt's wait for the device's answer
/// given; returns the stream and the number of attempts.
fn connect_waiting(
    dial: Dial,
    shown: &str,
    port: u32,
    vm_gone: &dyn Fn() -> bool,
    reply_timeout: Duration,
) -> Result<(UnixStream, u32), Error> {
    let mut tries = 0u32;
    loop {
        if vm_gone() {
            return Err(Error::VmGone);
        }
        tries = tries.saturating_add(1);
        match try_connect(dial, port, reply_timeout) {
            Ok(Some(stream)) => return Ok((stream, tries)),
            // Refused by the guest (no listener yet: the device closes or
            // resets our socket) or the socket not yet bound: the agent
            // comes up a moment later.
            Ok(None) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound
                        | io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::BrokenPipe
                        // No answer in time: a guest kernel that has not got
                        // to its vsock queues yet (ten machines booting on
                        // one CPU took longer than that); it is still
                        // booting, the VM is alive, so ask again.
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) => {}
            Err(source) => {
                return Err(Error::Connect {
                    path: shown.to_string(),
                    source,
                })
            }
        }
        thread::sleep(CONNECT_RETRY);
    }
}

fn try_connect(dial: Dial, port: u32, reply_timeout: Duration) -> io::Result<Option<UnixStream>> {
    let mut stream = dial()?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    stream.set_read_timeout(Some(reply_timeout))?;
    // Byte by byte: whatever follows the newline already belongs to the
    // guest's stream and must not be swallowed by a buffer.
    let mut line = Vec::new();
    let mut byte = [0u8];
    loop {
        match stream.read(&mut byte)? {
            0 => return Ok(None),
            _ if byte[0] == b'\n' => break,
            _ => line.push(byte[0]),
        }
    }
    stream.set_read_timeout(None)?;
    Ok(line.starts_with(b"OK ").then_some(stream))
}

/// Hello both ways, then the command. Returns the reader for the relay
/// and the guest's hello.
pub fn start(
    stream: &UnixStream,
    writer: &Writer,
    request: ExecRequest,
) -> Result<(FrameReader<UnixStream>, Hello), Error> {
    let greeted = greet(stream, writer)?;
    send(writer, &Message::Exec(request))?;
    Ok(greeted)
}

/// Hello both ways; returns the reader for what follows and the guest's
/// hello.
pub fn greet(
    stream: &UnixStream,
    writer: &Writer,
) -> Result<(FrameReader<UnixStream>, Hello), Error> {
    let read_half = stream.try_clone().map_err(Error::Write)?;
    let mut reader = FrameReader::new(read_half);
    send(writer, &Message::Hello(Hello::current()))?;
    let hello = match reader.read_message()? {
        Some(Message::Hello(hello)) => hello,
        Some(Message::Error(e)) => return Err(Error::Refused(e.message)),
        Some(_) => return Err(Error::Unexpected("a data message before its Hello")),
        None => return Err(Error::Lost),
    };
    check_guest_version(hello.version)?;
    Ok((reader, hello))
}

/// Copies this process's stdin to the guest until EOF, then says so, on a
/// thread of its own.
pub fn pump_stdin(writer: Writer, window: Arc<StdinWindow>) {
    thread::Builder::new()
        .name("mvm-stdin".into())
        .spawn(move || {
            // Started by the session thread, whose filter it inherits.
            seccomp::inherited(ThreadKind::Session);
            pump(io::stdin().lock(), &writer, &window);
        })
        .map(|_| ())
        .unwrap_or_else(|e| eprintln!("mvm: cannot start the stdin thread: {e}"));
}

/// Sends what `input` holds as `Stdin`, never more than `window` allows,
/// then `StdinEof`. Ends early when the channel or the window closes.
fn pump(mut input: impl Read, writer: &Writer, window: &StdinWindow) {
    let mut buf = vec![0u8; MAX_DATA];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut sent = 0;
        while sent < n {
            let Some(room) = window.take(n - sent) else {
                return;
            };
            if send(writer, &Message::Stdin(buf[sent..sent + room].to_vec())).is_err() {
                return;
            }
            sent += room;
        }
    }
    let _ = send(writer, &Message::StdinEof);
}

/// Relays the command's output until its `Exit`, and the agent's stdin
/// credit into `window` (closed when this returns).
pub fn relay_output(
    reader: &mut FrameReader<UnixStream>,
    window: &StdinWindow,
) -> Result<Exit, Error> {
    let result = relay(reader, window);
    window.close();
    result
}

fn relay(reader: &mut FrameReader<UnixStream>, window: &StdinWindow) -> Result<Exit, Error> {
    let stdout = io::stdout();
    let stderr = io::stderr();
    loop {
        match reader.read_message()? {
            Some(Message::Stdout(data)) => write_out(&mut stdout.lock(), &data),
            Some(Message::Stderr(data)) => write_out(&mut stderr.lock(), &data),
            Some(Message::Error(e)) => eprintln!("mvm: {}", e.message),
            Some(Message::StdinCredit(credit)) => window.grant(credit.bytes),
            Some(Message::Exit(exit)) => return Ok(exit),
            Some(_) => return Err(Error::Unexpected("a host-to-guest message")),
            None => return Err(Error::Lost),
        }
    }
}

/// A closed stdout (`mvm run ... | head`) must not stop the relay: the
/// command's exit status still has to come back.
fn write_out(out: &mut impl Write, data: &[u8]) {
    let _ = out.write_all(data).and_then(|_| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;
    use mvm_protocol::{Hello, StdinCredit};
    use std::os::unix::net::UnixListener;

    /// A stand-in for the vsock device plus guest agent on the other end
    /// of the hybrid socket: refuses the first connection (agent not
    /// listening yet), then accepts and plays `script`.
    fn fake_guest(
        path: &Path,
        script: impl FnOnce(&mut UnixStream, &mut FrameReader<UnixStream>) + Send + 'static,
    ) -> thread::JoinHandle<()> {
        let listener = UnixListener::bind(path).unwrap();
        thread::spawn(move || {
            let (first, _) = listener.accept().unwrap();
            drop(first);
            let (mut s, _) = listener.accept().unwrap();
            let mut line = Vec::new();
            let mut b = [0u8];
            while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                line.push(b[0]);
            }
            assert_eq!(line, b"CONNECT 1024");
            s.write_all(b"OK 1073741824\n").unwrap();
            let mut reader = FrameReader::new(s.try_clone().unwrap());
            script(&mut s, &mut reader);
        })
    }

    fn request() -> ExecRequest {
        ExecRequest {
            uid: 1000,
            gid: 1000,
            ..ExecRequest::new(vec!["true".into()])
        }
    }

    fn sock(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("mvm-client-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn retries_until_the_agent_listens_then_relays_to_exit() {
        let path = sock("ok");
        let guest = fake_guest(&path, |s, r| {
            assert!(matches!(r.read_message().unwrap(), Some(Message::Hello(_))));
            Message::Hello(Hello::current()).encode(s).unwrap();
            let Some(Message::Exec(req)) = r.read_message().unwrap() else {
                panic!("no exec")
            };
            assert_eq!(req.uid, 1000);
            assert_eq!(r.read_message().unwrap(), Some(Message::StdinEof));
            Message::StdinCredit(StdinCredit { bytes: 5 })
                .encode(s)
                .unwrap();
            Message::Stdout(b"out".to_vec()).encode(s).unwrap();
            Message::Exit(Exit::exited(7)).encode(s).unwrap();
        });
        let stream = connect(&path, 1024, &|| false).unwrap();
        let writer = Arc::new(Mutex::new(stream.try_clone().unwrap()));
        let (mut reader, _) = start(&stream, &writer, request()).unwrap();
        send(&writer, &Message::StdinEof).unwrap();
        let window = StdinWindow::default();
        assert_eq!(relay(&mut reader, &window).unwrap().status, 7);
        // The credit reached the window; closing it (as relay_output does)
        // lets a waiting pump go.
        assert_eq!(window.take(100), Some(5));
        window.close();
        assert_eq!(window.take(100), None);
        guest.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_connect_nobody_answers_in_time_is_asked_again_not_a_failure() {
        let path = sock("slow");
        let listener = UnixListener::bind(&path).unwrap();
        let device = thread::spawn(move || {
            // The first request is left unanswered (a guest still booting,
            // its device not yet served); the second is answered.
            let (silent, _) = listener.accept().unwrap();
            let (mut s, _) = listener.accept().unwrap();
            let mut b = [0u8];
            while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {}
            s.write_all(b"OK 1073741824\n").unwrap();
            drop(silent);
            s
        });
        let stream = connect_waiting(
            &|| UnixStream::connect(&path),
            "test",
            1024,
            &|| false,
            Duration::from_millis(200),
        );
        let (_, tries) = stream.expect("the second attempt is answered");
        assert_eq!(tries, 2, "the unanswered attempt and the answered one");
        device.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_guest_speaking_another_version_is_refused() {
        let path = sock("version");
        let guest = fake_guest(&path, |s, r| {
            let _ = r.read_message();
            Message::Hello(Hello {
                version: 99,
                ..Hello::current()
            })
            .encode(s)
            .unwrap();
        });
        let stream = connect(&path, 1024, &|| false).unwrap();
        let writer = Arc::new(Mutex::new(stream.try_clone().unwrap()));
        let err = start(&stream, &writer, request()).err().unwrap();
        assert!(matches!(err, Error::Version(_)), "{err}");
        guest.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_channel_closed_before_exit_is_lost_not_success() {
        let path = sock("lost");
        let guest = fake_guest(&path, |s, r| {
            let _ = r.read_message();
            Message::Hello(Hello::current()).encode(s).unwrap();
            let _ = r.read_message();
            Message::Stdout(b"partial".to_vec()).encode(s).unwrap();
        });
        let stream = connect(&path, 1024, &|| false).unwrap();
        let writer = Arc::new(Mutex::new(stream.try_clone().unwrap()));
        let (mut reader, _) = start(&stream, &writer, request()).unwrap();
        guest.join().unwrap();
        let window = StdinWindow::default();
        assert!(matches!(
            relay_output(&mut reader, &window),
            Err(Error::Lost)
        ));
        assert_eq!(window.take(1), None, "the window is closed");
        std::fs::remove_file(&path).unwrap();
    }

    /// Reads the next frame, or `None` when nothing comes within 300 ms.
    fn next_within(r: &mut FrameReader<UnixStream>) -> Option<Message> {
        r.get_ref()
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        r.read_message().ok().flatten()
    }

    #[test]
    fn stdin_goes_out_only_as_far_as_the_credit_allows() {
        let (host, guest) = UnixStream::pair().unwrap();
        let writer: Writer = Arc::new(Mutex::new(host));
        let window = Arc::new(StdinWindow::default());
        let input = [7u8; 100];
        let pump_thread = {
            let (writer, window) = (writer.clone(), window.clone());
            thread::spawn(move || pump(&input[..], &writer, &window))
        };
        let mut r = FrameReader::new(guest);
        assert_eq!(next_within(&mut r), None, "stdin sent with no credit");
        window.grant(10);
        assert_eq!(next_within(&mut r), Some(Message::Stdin(vec![7u8; 10])));
        assert_eq!(next_within(&mut r), None, "stdin sent past the credit");
        window.grant(1000);
        assert_eq!(next_within(&mut r), Some(Message::Stdin(vec![7u8; 90])));
        assert_eq!(next_within(&mut r), Some(Message::StdinEof));
        pump_thread.join().unwrap();
    }

    #[test]
    fn a_pump_waiting_for_credit_ends_when_the_window_closes() {
        let (host, guest) = UnixStream::pair().unwrap();
        let writer: Writer = Arc::new(Mutex::new(host));
        let window = Arc::new(StdinWindow::default());
        let pump_thread = {
            let (writer, window) = (writer.clone(), window.clone());
            thread::spawn(move || pump(&b"never sent"[..], &writer, &window))
        };
        thread::sleep(Duration::from_millis(100));
        window.close();
        pump_thread.join().unwrap();
        let mut r = FrameReader::new(guest);
        assert_eq!(next_within(&mut r), None, "nothing is sent after the end");
    }

    #[test]
    fn gives_up_when_the_vm_is_gone() {
        let path = sock("gone");
        assert!(matches!(connect(&path, 1024, &|| true), Err(Error::VmGone)));
    }
}
