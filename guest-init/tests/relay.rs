//! The agent's spawn and relay, run on the host against real processes: a
//! socketpair stands in for the vsock and a thread for the VMM. Everything
//! else the agent does (listen on vsock, PID 1 reaping orphans, reboot)
//! only happens in a guest.
//!
//! `harness = false`: the relay relies on process-wide signal state
//! (SIGCHLD blocked in every thread, for its signalfd), which libtest's
//! threads would not share. The child drops privileges with setgroups and
//! setuid, which needs root: without it the tests fail, or skip with
//! `MVM_ALLOW_SKIPS=1` (docs/testing.md), noted for `make test`'s summary.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use mvm_guest_init::agent::relay::{Relay, RelayError};
use mvm_guest_init::agent::signals::ChildSignals;
use mvm_guest_init::agent::{child, fd, request, signals};
use mvm_protocol::{ExecRequest, Exit, FrameReader, Message, Resize, Signal, MAX_DATA};

/// A step of the fake host's script.
enum Step {
    Send(Message),
    /// Wait until this text has arrived on stdout.
    WaitFor(&'static str),
    /// Close the connection (the host went away).
    Hangup,
    /// As mvm's stdin pump does: send up to this many bytes of stdin, only
    /// as far as the agent's `StdinCredit` allows; go on once no credit
    /// has come for 500 ms.
    StdinWithinCredit(usize),
}

/// What the fake host received.
#[derive(Default)]
struct Received {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    errors: Vec<String>,
    exit: Option<Exit>,
    /// Every message, in order.
    kinds: Vec<mvm_protocol::Kind>,
    /// `StdinCredit` granted in all.
    credit: u64,
    /// Stdin bytes sent by `StdinWithinCredit`.
    stdin_sent: u64,
    /// `credit` when the script sent its first `Signal`: once the command
    /// is gone the agent gives back what it dropped, racing its `Exit`.
    credit_at_signal: Option<u64>,
}

struct Outcome {
    result: Result<Exit, RelayError>,
    received: Received,
    elapsed: Duration,
}

fn request(argv: &[&str]) -> ExecRequest {
    ExecRequest::new(argv.iter().map(|a| a.to_string()).collect())
}

/// Spawns `req`, relays it against a host thread running `script`, and
/// returns once the host saw the end (or the relay failed).
fn run(signals: &ChildSignals, req: ExecRequest, script: Vec<Step>, slow_reader: bool) -> Outcome {
    run_hooked(signals, req, script, slow_reader, None)
}

/// As `run`, with the agent's hook before `Exit`.
fn run_hooked(
    signals: &ChildSignals,
    req: ExecRequest,
    script: Vec<Step>,
    slow_reader: bool,
    before_exit: Option<&mut dyn FnMut(&mut Exit)>,
) -> Outcome {
    let (agent_end, host_end) = UnixStream::pair().unwrap();
    let agent_end = OwnedFd::from(agent_end);
    fd::set_nonblocking(agent_end.as_fd()).unwrap();
    let prepared = request::prepare(&req).unwrap();
    let start = Instant::now();
    let child = child::spawn(&prepared).unwrap();
    let pid = child.pid;
    let first = child.failure_reports(&prepared);

    let received = Arc::new(Mutex::new(Received::default()));
    let reader = {
        let stream = host_end.try_clone().unwrap();
        let received = Arc::clone(&received);
        thread::spawn(move || read_all(stream, &received, slow_reader))
    };
    let writer = {
        let stream = host_end.try_clone().unwrap();
        let received = Arc::clone(&received);
        thread::spawn(move || play(stream, script, &received))
    };
    drop(host_end);

    let mut relay = Relay::new(agent_end.as_fd(), signals, child, &first).unwrap();
    if let Some(f) = before_exit {
        relay = relay.before_exit(f);
    }
    let result = relay.run();
    // As the agent does: the command must not outlive its host.
    // SAFETY: plain syscall on the group we started.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    drop(agent_end);
    let elapsed = start.elapsed();
    writer.join().unwrap();
    reader.join().unwrap();
    let received = Arc::try_unwrap(received)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap();
    Outcome {
        result,
        received,
        elapsed,
    }
}

fn read_all(stream: UnixStream, received: &Mutex<Received>, slow: bool) {
    let mut reader = FrameReader::new(stream);
    while let Ok(Some(message)) = reader.read_message() {
        if slow {
            thread::sleep(Duration::from_millis(2));
        }
        let mut r = received.lock().unwrap();
        r.kinds.push(message.kind());
        match message {
            Message::Stdout(d) => {
                assert!(d.len() <= MAX_DATA);
                r.stdout.extend(d)
            }
            Message::Stderr(d) => r.stderr.extend(d),
            Message::Error(e) => r.errors.push(e.message),
            Message::StdinCredit(c) => r.credit += c.bytes,
            Message::Exit(e) => {
                r.exit = Some(e);
                break;
            }
            other => panic!("unexpected {other:?} from the agent"),
        }
    }
    // Like the host: close after Exit (or when the agent is gone).
    let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
}

fn play(mut stream: UnixStream, script: Vec<Step>, received: &Mutex<Received>) {
    for step in script {
        match step {
            // The agent may be gone already; the outcome shows it.
            Step::Send(m) => {
                if matches!(m, Message::Signal(_)) {
                    let mut r = received.lock().unwrap();
                    r.credit_at_signal = r.credit_at_signal.or(Some(r.credit));
                }
                if m.encode(&mut stream).is_err() {
                    return;
                }
            }
            Step::WaitFor(text) => {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !String::from_utf8_lossy(&received.lock().unwrap().stdout).contains(text) {
                    assert!(Instant::now() < deadline, "no {text:?} on stdout");
                    thread::sleep(Duration::from_millis(10));
                }
            }
            Step::Hangup => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
            Step::StdinWithinCredit(total) => {
                let mut quiet_since = Instant::now();
                loop {
                    let (credit, sent) = {
                        let r = received.lock().unwrap();
                        (r.credit, r.stdin_sent)
                    };
                    let room = (credit - sent).min((total as u64 - sent).min(MAX_DATA as u64));
                    if sent == total as u64 || quiet_since.elapsed() > Duration::from_millis(500) {
                        break;
                    }
                    if room == 0 {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    if Message::Stdin(vec![b'x'; room as usize])
                        .encode(&mut stream)
                        .is_err()
                    {
                        return;
                    }
                    received.lock().unwrap().stdin_sent += room;
                    quiet_since = Instant::now();
                }
            }
        }
    }
}

fn stdin(data: &[u8]) -> Vec<Step> {
    data.chunks(MAX_DATA)
        .map(|c| Step::Send(Message::Stdin(c.to_vec())))
        .chain([Step::Send(Message::StdinEof)])
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn separate_streams_and_exit_code(signals: &ChildSignals) {
    let req = request(&["sh", "-c", "echo out; echo err >&2; exit 3"]);
    let o = run(signals, req, vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(3));
    assert_eq!(text(&o.received.stdout), "out\n");
    assert_eq!(text(&o.received.stderr), "err\n");
    assert_eq!(o.received.exit, Some(Exit::exited(3)));
    assert_eq!(o.received.kinds.last(), Some(&mvm_protocol::Kind::Exit));
}

fn environment_is_exact(signals: &ChildSignals) {
    let mut req = request(&["env"]);
    req.env = vec![("FOO".into(), "bar baz".into())];
    let o = run(signals, req, vec![], false);
    let mut lines: Vec<String> = text(&o.received.stdout).lines().map(String::from).collect();
    lines.sort();
    let expected = [
        "FOO=bar baz",
        "HOME=/root",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ];
    // A shell may add PWD/SHLVL; `env` run directly adds nothing.
    assert_eq!(lines, expected);
}

fn output_written_just_before_exit_is_not_lost(signals: &ChildSignals) {
    // More than the pipe holds and more than OUT_LIMIT, read by a slow host:
    // the relay must stop and go on, and deliver all of it before Exit.
    let req = request(&["sh", "-c", "head -c 3000000 /dev/zero; echo tail >&2"]);
    let o = run(signals, req, vec![], true);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert_eq!(o.received.stdout.len(), 3_000_000);
    assert_eq!(text(&o.received.stderr), "tail\n");
}

fn stdin_round_trip_with_backpressure(signals: &ChildSignals) {
    // 2 MB into a command that reads slowly at first (sleep), so the stdin
    // queue and the host's socket fill up and the relay has to wait.
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let req = request(&["sh", "-c", "sleep 0.3; cat"]);
    let o = run(signals, req, stdin(&data), false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert!(o.received.stdout == data, "stdin came back changed");
}

fn command_that_ignores_stdin(signals: &ChildSignals) {
    // `true` exits without reading; the relay drops its stdin instead of
    // blocking on it.
    let o = run(signals, request(&["true"]), stdin(&[7; 500_000]), false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
}

fn signal_reaches_the_command(signals: &ChildSignals) {
    let req = request(&["sh", "-c", "echo ready; exec sleep 100"]);
    // `exec` leaves no shell between the marker and sleep, and a signal to
    // the shell before it gets there ends it the same way: no need to wait
    // after the marker.
    let script = vec![
        Step::WaitFor("ready"),
        Step::Send(Message::Signal(Signal { signal: 15 })),
    ];
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::signaled(15));
    assert_eq!(o.received.exit.unwrap().status, 143);
}

fn signal_is_not_held_behind_stdin_the_command_does_not_read(signals: &ChildSignals) {
    // Issue 16 point 2: the host keeps to its credit, so of 4 MiB of stdin
    // a command that reads none gets the window plus what its pipe holds,
    // the stream stays clear and the SIGTERM after it reaches the command.
    let req = request(&["sh", "-c", "echo ready; exec sleep 100"]);
    let script = vec![
        Step::WaitFor("ready"),
        Step::StdinWithinCredit(4 << 20),
        Step::Send(Message::Signal(Signal { signal: 15 })),
    ];
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::signaled(15));
    let (credit, sent) = (o.received.credit_at_signal.unwrap(), o.received.stdin_sent);
    assert_eq!(
        sent, credit,
        "the host used all its credit before the signal"
    );
    assert!(
        (mvm_protocol::STDIN_WINDOW..(1 << 20)).contains(&credit),
        "credit {credit}: the window plus a pipe's worth at most"
    );
}

fn credit_comes_back_as_the_command_reads(signals: &ChildSignals) {
    // The control: a command that reads its stdin gets credit for all of
    // it, and every byte arrives.
    let total = 3 * mvm_protocol::STDIN_WINDOW as usize + 12345;
    let req = request(&["sh", "-c", "sleep 0.2; wc -c"]);
    let script = vec![
        Step::StdinWithinCredit(total),
        Step::Send(Message::StdinEof),
    ];
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert_eq!(o.received.stdin_sent, total as u64);
    assert_eq!(text(&o.received.stdout).trim(), total.to_string());
    assert!(o.received.credit >= total as u64);
}

fn the_hook_before_exit_runs_once_and_marks_the_exit(signals: &ChildSignals) {
    // How the agent adds `oom_kill` (and, for `mvm run`, syncs) before the
    // VMM sees `Exit`: once, with the command's status, the frame sent
    // carrying what it set.
    let mut calls = Vec::new();
    let mut hook = |exit: &mut Exit| {
        calls.push(exit.status);
        exit.oom_kill = true;
    };
    let req = request(&["sh", "-c", "head -c 200000 /dev/zero; exit 137"]);
    let o = run_hooked(signals, req, vec![], false, Some(&mut hook));
    assert_eq!(calls, [137]);
    let exit = o.received.exit.unwrap();
    assert!(exit.oom_kill, "the frame lacks what the hook set");
    assert_eq!(exit.status, 137);
    assert!(o.result.unwrap().oom_kill);
    assert_eq!(o.received.stdout.len(), 200_000);
    assert_eq!(o.received.kinds.last(), Some(&mvm_protocol::Kind::Exit));
}

fn bad_signal_is_reported_not_fatal(signals: &ChildSignals) {
    let req = request(&["sh", "-c", "read x; echo got $x"]);
    let mut script = vec![Step::Send(Message::Signal(Signal { signal: 99 }))];
    script.extend(stdin(b"it\n"));
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert_eq!(o.received.errors, ["invalid signal number 99"]);
    assert_eq!(text(&o.received.stdout), "got it\n");
}

fn not_found_is_127_with_a_message(signals: &ChildSignals) {
    let o = run(signals, request(&["/nonexistent/cmd"]), vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(127));
    assert_eq!(
        o.received.errors,
        ["cannot run '/nonexistent/cmd': No such file or directory"]
    );
    let kinds = &o.received.kinds;
    assert_eq!(kinds.first(), Some(&mvm_protocol::Kind::Error));
}

fn not_executable_is_126(signals: &ChildSignals) {
    let o = run(signals, request(&["/"]), vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(126));
    assert_eq!(o.received.errors, ["cannot run '/': Permission denied"]);
}

fn bad_cwd_is_125(signals: &ChildSignals) {
    let mut req = request(&["true"]);
    req.cwd = "/nonexistent-dir".into();
    let o = run(signals, req, vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(125));
    assert_eq!(
        o.received.errors,
        ["cannot change to directory '/nonexistent-dir': No such file or directory"]
    );
}

fn background_process_holding_the_pipe_is_given_up_on(signals: &ChildSignals) {
    let req = request(&["sh", "-c", "sleep 30 & echo early"]);
    let o = run(signals, req, vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert_eq!(text(&o.received.stdout), "early\n");
    assert!(
        o.elapsed < Duration::from_secs(3),
        "took {:?}: the quiet timeout did not end the drain",
        o.elapsed
    );
}

fn late_output_of_a_background_process_is_kept(signals: &ChildSignals) {
    // Within the quiet time after the exit: still part of the run. The
    // background process writes as soon as the command is gone (it polls
    // for that), not after a fixed time that a loaded machine could
    // stretch past the quiet time.
    let req = request(&[
        "sh",
        "-c",
        "parent=$$; (while kill -0 $parent 2>/dev/null; do sleep 0.01; done; echo late) & echo early",
    ]);
    let o = run(signals, req, vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert_eq!(text(&o.received.stdout), "early\nlate\n");
}

fn host_gone_is_reported(signals: &ChildSignals) {
    let req = request(&["sh", "-c", "echo ready; exec sleep 100"]);
    let script = vec![Step::WaitFor("ready"), Step::Hangup];
    let o = run(signals, req, script, false);
    assert!(
        matches!(o.result, Err(RelayError::HostClosed)),
        "{:?}",
        o.result
    );
    assert!(o.elapsed < Duration::from_secs(5));
}

fn tty_with_size_term_and_eof(signals: &ChildSignals) {
    let mut req = request(&["sh", "-c", "tty; stty size; echo $TERM; cat; echo done"]);
    req.tty = true;
    req.rows = 33;
    req.cols = 77;
    let mut script = vec![Step::WaitFor("xterm")];
    script.extend(stdin(b"typed\n"));
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    let out = text(&o.received.stdout);
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("33 77\r\n"), "{out:?}");
    assert!(out.contains("xterm-256color\r\n"), "{out:?}");
    assert!(out.ends_with("done\r\n"), "VEOF ended cat: {out:?}");
    assert!(o.received.stderr.is_empty(), "a pty has one stream");
}

fn tty_resize(signals: &ChildSignals) {
    let mut req = request(&[
        "sh",
        "-c",
        "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done",
    ]);
    req.tty = true;
    req.rows = 10;
    req.cols = 20;
    let script = vec![
        Step::WaitFor("ready"),
        Step::Send(Message::Resize(Resize {
            rows: 40,
            cols: 100,
        })),
    ];
    let o = run(signals, req, script, false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    assert!(text(&o.received.stdout).contains("40 100"));
}

fn max_procs_is_applied(signals: &ChildSignals) {
    // Root is exempt from RLIMIT_NPROC, so only check that it is set.
    let mut req = request(&["grep", "Max processes", "/proc/self/limits"]);
    req.max_procs = 77;
    let o = run(signals, req, vec![], false);
    assert_eq!(o.result.unwrap(), Exit::exited(0));
    let fields: Vec<String> = text(&o.received.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(fields, ["Max", "processes", "77", "77", "processes"]);
}

/// `(name, test)` pairs of the functions given.
macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), $name as fn(&ChildSignals))),*]
    };
}

fn main() {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        let why = "relay tests: the child's setgroups/setuid need root";
        if std::env::var("MVM_ALLOW_SKIPS").as_deref() != Ok("1") {
            eprintln!("{why} (set MVM_ALLOW_SKIPS=1 to skip them explicitly)");
            std::process::exit(1);
        }
        println!("SKIP: {why}");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-events");
        let _ = std::fs::create_dir_all(&dir);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("skip.log"))
        {
            let _ = writeln!(f, "{why}");
        }
        return;
    }
    // A hung relay must fail the test run, not hang it.
    // SAFETY: plain syscall; SIGALRM's default action ends the process.
    unsafe { libc::alarm(120) };
    // Before any thread exists, so that every thread blocks SIGCHLD.
    let signals = signals::setup().unwrap();
    let tests = tests![
        separate_streams_and_exit_code,
        environment_is_exact,
        output_written_just_before_exit_is_not_lost,
        stdin_round_trip_with_backpressure,
        command_that_ignores_stdin,
        signal_reaches_the_command,
        signal_is_not_held_behind_stdin_the_command_does_not_read,
        credit_comes_back_as_the_command_reads,
        the_hook_before_exit_runs_once_and_marks_the_exit,
        bad_signal_is_reported_not_fatal,
        not_found_is_127_with_a_message,
        not_executable_is_126,
        bad_cwd_is_125,
        background_process_holding_the_pipe_is_given_up_on,
        late_output_of_a_background_process_is_kept,
        host_gone_is_reported,
        tty_with_size_term_and_eof,
        tty_resize,
        max_procs_is_applied,
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        print!("test {name} ... ");
        let _ = std::io::stdout().flush();
        test(&signals);
        println!("ok");
    }
}
