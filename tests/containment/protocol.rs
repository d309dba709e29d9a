//! Check 11: bad input to the host side of the exec channel.
//!
//! Two levels. In process: mvm's real exec client (`mvm::session::client`:
//! `connect`, `start`, `relay_output`, what the session thread runs)
//! against a fake agent behind a Unix socket, the way the vsock device
//! presents the guest, fed every kind of bad frame. End to end: a guest
//! root that owns the guest takes the agent's own vsock connection out of
//! PID 1 (`pidfd_getfd`) and writes bad frames to the real VMM, whose
//! reaction is observed from the host.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use mvm::session::client;
use mvm_e2e::Options;
use mvm_protocol::{ExecRequest, FrameError, FrameReader, Hello, Message, AGENT_PORT, MAX_DATA};

use crate::battery::{
    attack, attacker, code, control, excerpt, mvm_says, peak_rss, Check, Source, Verdict,
};

/// One frame on the wire: u32 LE length of kind + payload, kind, payload.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(payload);
    f
}

/// What the fake agent sends, and when.
struct Case {
    name: &'static str,
    /// Sent instead of the agent's `Hello` (else after the handshake and
    /// the `Exec`, in place of the command's output).
    in_handshake: bool,
    bytes: Vec<u8>,
    /// Close the connection after `bytes` (else hold it open, so that only
    /// the bytes themselves can end the client's read).
    close: bool,
    /// The client's result the case wants: the start of its `name`.
    want: &'static str,
}

fn cases() -> Vec<Case> {
    let hello99 = frame(1, br#"{"version":99}"#);
    let mut noise = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push(x as u8);
    }
    let case = |name, in_handshake, bytes, close, want| Case {
        name,
        in_handshake,
        bytes,
        close,
        want,
    };
    vec![
        case(
            "well-formed output and exit 7 (control)",
            false,
            [
                frame(17, b"ok\n"),
                frame(19, br#"{"code":7,"signal":null,"status":7}"#),
            ]
            .concat(),
            false,
            "exit 7",
        ),
        case(
            "guest Hello version 99",
            true,
            hello99.clone(),
            false,
            "Version",
        ),
        case(
            "garbage instead of Hello",
            true,
            noise.clone(),
            true,
            "Frame",
        ),
        case(
            "4 GiB frame instead of Hello",
            true,
            vec![0xff; 4],
            false,
            "Frame: too large",
        ),
        case(
            "output before Hello",
            true,
            frame(17, b"early"),
            false,
            "Unexpected",
        ),
        case(
            "4 GiB frame length",
            false,
            [vec![0xff; 4], vec![b'A'; 4096]].concat(),
            false,
            "Frame: too large",
        ),
        case(
            "zero frame length",
            false,
            vec![0; 4],
            false,
            "Frame: empty",
        ),
        case(
            "unknown kind 0x7f",
            false,
            frame(0x7f, b"x"),
            false,
            "Frame: bad message",
        ),
        case(
            "Exit with bad JSON",
            false,
            frame(19, b"{not json"),
            false,
            "Frame: bad message",
        ),
        case(
            "Stdout over MAX_DATA (1 MiB)",
            false,
            frame(17, &vec![b'D'; (1 << 20) - 8]),
            false,
            "Frame: bad message",
        ),
        case(
            "Hello version 99 mid-stream",
            false,
            hello99,
            false,
            "Unexpected",
        ),
        case(
            "host-to-guest Stdin from the guest",
            false,
            frame(3, b"x"),
            false,
            "Unexpected",
        ),
        case("garbage mid-stream", false, noise, true, "Frame"),
        case(
            "frame cut short, then end",
            false,
            frame(17, b"0123456789")[..8].to_vec(),
            true,
            "Frame: truncated",
        ),
        case("end of stream before Exit", false, Vec::new(), true, "Lost"),
    ]
}

/// The name of the client's result, for comparing with `Case::want`.
fn name(result: &Result<u8, client::Error>) -> String {
    match result {
        Ok(status) => format!("exit {status}"),
        Err(client::Error::Frame(FrameError::FrameTooLarge { .. })) => "Frame: too large".into(),
        Err(client::Error::Frame(FrameError::EmptyFrame)) => "Frame: empty".into(),
        Err(client::Error::Frame(FrameError::Truncated { .. })) => "Frame: truncated".into(),
        Err(client::Error::Frame(FrameError::Message(_))) => "Frame: bad message".into(),
        Err(client::Error::Frame(_)) => "Frame: other".into(),
        Err(client::Error::Version(_)) => "Version".into(),
        Err(client::Error::Unexpected(_)) => "Unexpected".into(),
        Err(client::Error::Lost) => "Lost".into(),
        Err(other) => format!("other: {other}"),
    }
}

/// Peak RSS of this process in KiB, reset to the current RSS first when
/// `reset` (writing 5 to clear_refs resets VmHWM).
fn peak_rss_kib(reset: bool) -> u64 {
    if reset {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

struct Played {
    result: String,
    message: String,
    elapsed: Duration,
    peak_growth_kib: u64,
}

/// Runs the real client against a fake agent playing `case`.
fn play(case: &Case, index: usize) -> Played {
    let dir = std::env::temp_dir().join(format!("mvm-battery-{}-{index}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("vsock.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let (release, released) = mpsc::channel::<()>();
    let (bytes, in_handshake, close) = (case.bytes.clone(), case.in_handshake, case.close);
    let agent = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // The device's half of the hybrid handshake, then the agent's.
        let mut byte = [0u8];
        while s.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {}
        s.write_all(b"OK 1024\n").unwrap();
        let mut reader = FrameReader::new(s.try_clone().unwrap());
        let _ = reader.read_message(); // the host's Hello
        if !in_handshake {
            Message::Hello(Hello::current()).encode(&mut s).unwrap();
            let _ = reader.read_message(); // Exec
            let _ = reader.read_message(); // StdinEof
        }
        let _ = s.write_all(&bytes);
        if !close {
            let _ = released.recv_timeout(Duration::from_secs(20));
        }
    });
    let before = peak_rss_kib(true);
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let path = sock.clone();
    let client_thread = thread::spawn(move || {
        let run = || -> Result<u8, client::Error> {
            let stream = client::connect(&path, AGENT_PORT, &|| false)?;
            let writer = Arc::new(Mutex::new(
                stream.try_clone().map_err(client::Error::Write)?,
            ));
            let request = ExecRequest::new(vec!["true".into()]);
            let (mut reader, _) = client::start(&stream, &writer, request)?;
            client::send(&writer, &Message::StdinEof)?;
            client::relay_output(&mut reader, &client::StdinWindow::default())
                .map(|exit| exit.status)
        };
        let result = run();
        let _ = tx.send((name(&result), result.err().map(|e| e.to_string())));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(10));
    let elapsed = started.elapsed();
    let peak_growth_kib = peak_rss_kib(false).saturating_sub(before);
    let _ = release.send(());
    let _ = agent.join();
    let (result, message) = match outcome {
        Ok((result, message)) => (result, message.unwrap_or_default()),
        // The thread dropped its sender without a word: it panicked.
        Err(mpsc::RecvTimeoutError::Disconnected) => ("panicked".into(), String::new()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            ("hung (no result within 10 s)".into(), String::new())
        }
    };
    if client_thread.is_finished() && client_thread.join().is_err() {
        return Played {
            result: "panicked".into(),
            message,
            elapsed,
            peak_growth_kib,
        };
    }
    let _ = std::fs::remove_dir_all(&dir);
    Played {
        result,
        message,
        elapsed,
        peak_growth_kib,
    }
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_11a_the_host_client_refuses_every_bad_frame() {
    let mut check = Check::new(
        "11a",
        "mvm's exec client (the real connect/start/relay_output) against a fake guest agent: wrong Hello version, garbage and a 4 GiB length instead of Hello, output before Hello; after it a 4 GiB length, a zero length, an unknown kind, bad JSON, a 1 MiB Stdout, a Hello mid-stream, a host-to-guest kind, garbage, a truncated frame, end of stream before Exit",
        "each ends the run with its own error (no panic, no hang, no allocation of the claimed size: peak RSS grows < 8 MiB); the well-formed control relays its exit status 7",
    )
    .evidence(Source::InProcess, "the client's result for each case, its time and this process's peak RSS")
    .control(Source::InProcess, "a well-formed exchange, played the same way, relays its exit status 7");
    check.in_process();
    assert_eq!(MAX_DATA, 64 * 1024, "the 1 MiB case assumes 64 KiB data");
    let mut v = Verdict::new();
    for (i, case) in cases().iter().enumerate() {
        let played = play(case, i);
        let ok = played.result.starts_with(case.want)
            && played.elapsed < Duration::from_secs(5)
            && played.peak_growth_kib < 8 * 1024;
        v.saw(format!(
            "{}: {} in {} ms{}",
            case.name,
            played.result,
            played.elapsed.as_millis(),
            if played.message.is_empty() {
                String::new()
            } else {
                format!(" ('{}')", excerpt(&played.message, 70))
            }
        ));
        v.require(
            ok,
            format!(
                "{}: got {} (wanted {}), {} ms, peak RSS +{} KiB",
                case.name,
                played.result,
                case.want,
                played.elapsed.as_millis(),
                played.peak_growth_kib
            ),
        );
    }
    check.finish(v);
}

/// `--root` for pidfd_getfd and ptrace on PID 1; a small guest so that a
/// claimed 4 GiB frame would show in mvm's peak RSS (`--print-stats`, for
/// the attacks: the control's forged Exit ends its run by itself, and
/// without it the control also runs through a sandbox); a timeout, as
/// the attacker never exits and keeps the agent stopped: only the host
/// can end the run.
fn hijack(mode: &str, as_control: bool) -> mvm_e2e::Run {
    let attacker = format!("/workspace/{}", attacker());
    // The timeout is only a safety net: each check requires the host's
    // own end (42, or 121 with its reason). The test host's clock runs on
    // while `make test`'s other lane starves it of CPU, and 20 s once ran
    // out there (11b through a sandbox, cause not proven).
    let mut args = vec!["--root", "--memory", "128M", "--timeout", "60"];
    if !as_control {
        args.push("--print-stats");
    }
    args.extend(["--", attacker.as_str(), "hijack", mode]);
    if as_control {
        control(&Options::default(), &args)
    } else {
        attack(&Options::default(), &args)
    }
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_11b_frames_forged_on_the_agents_connection_reach_the_host() {
    let mut check = Check::new(
        "11b",
        "positive control for 11c-e: a compromised guest takes the agent's vsock connection out of the agent (PID 1; in a sandbox the agent's process for this command), stops that process (ptrace) and writes well-formed frames on it (Stdout 'FORGED-BY-THE-GUEST', Exit 42)",
        "the host relays them and exits 42: bytes written this way do reach the host's parser (and a guest can forge its own exit status, as expected of an untrusted guest)",
    )
    .evidence(Source::Mvm, "mvm's exit status 42 and the forged output it relayed")
    .control(Source::Mvm, "itself the positive control of checks 11c-e");
    let run = check.run(|| hijack("forge", true));
    let mut v = Verdict::new();
    let forged = run.stdout.contains("FORGED-BY-THE-GUEST");
    v.saw(format!(
        "exit {}, forged output relayed: {forged}",
        code(&run)
    ));
    v.require(
        run.code == Some(42) && forged,
        "the forged frames did not arrive",
    );
    check.finish(v);
}

/// `error`: what mvm must say for this case, its own error for what the
/// guest sent; the generic "closed the channel" of a guest that merely
/// hung up is not enough.
fn bad_frames(
    id: &'static str,
    mode: &'static str,
    tried: &'static str,
    expected: &'static str,
    error: &'static str,
) {
    let mut check = Check::new(id, tried, expected)
        .evidence(Source::Mvm, "mvm's exit status, its own error message and its peak RSS")
        .control(Source::Mvm, "check 11b: well-formed frames forged the same way do reach the host; the attacker's lines that it reached the connection and stopped the agent");
    let started = Instant::now();
    let run = check.run(|| hijack(mode, false));
    let mut v = Verdict::new();
    let secs = started.elapsed().as_secs();
    let said = mvm_says(&run);
    v.saw(format!(
        "exit {} after {secs} s; mvm said: {}",
        code(&run),
        excerpt(&said, 160)
    ));
    let reached = run
        .stdout
        .contains("hijack: freezing the agent, then writing");
    v.saw(format!(
        "the attacker found and wrote on the agent's connection: {reached}"
    ));
    v.require(reached, "the attack never reached the channel (control)");
    // The attacker's own Stderr frame, written on the stolen connection.
    let stopped = run.stderr.contains("hijack: the agent is stopped");
    v.saw(format!("the agent stopped by the attacker: {stopped}"));
    v.require(stopped, "the attacker could not stop the agent");
    // 121: the guest stopped without a status of its own (docs: exit codes).
    v.require(
        run.code == Some(121),
        format!("exit {}, not 121", code(&run)),
    );
    v.require(!run.stderr.contains("panicked"), "mvm panicked");
    // Its own words for what this guest did wrong.
    v.require(said.contains(error), format!("mvm did not say '{error}'"));
    let peak = peak_rss(&run.stderr).map(|k| k / 1024.0);
    v.saw(format!("peak RSS {:.0} MiB", peak.unwrap_or(-1.0)));
    v.require(
        peak.is_some_and(|p| p < 128.0 + 96.0),
        "mvm's memory grew past the guest's size",
    );
    check.finish(v);
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_11c_an_oversized_frame_from_the_guest() {
    bad_frames(
        "11c",
        "oversized",
        "a compromised guest (agent stopped, as in 11b) writes a frame length of 4 GiB - 1 on the agent's connection, then 64 KiB of it",
        "mvm ends the run by itself (not by --timeout 20: the guest will not) with exit 121, saying the frame is larger than its limit, no panic, peak RSS within the 128 MiB guest plus 96 MiB",
        "the exec channel broke: frame of 4294967295 bytes is larger than",
    );
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_11d_garbage_from_the_guest() {
    bad_frames(
        "11d",
        "garbage",
        "a compromised guest (agent stopped) writes an unknown kind, an Exit with bad JSON and 4 KiB of noise on the agent's connection",
        "mvm ends the run by itself with exit 121, saying the first bad frame's kind is unknown, no panic, peak RSS within the 128 MiB guest plus 96 MiB",
        "the exec channel broke: unknown message kind 127",
    );
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_11e_a_wrong_version_hello_from_the_guest() {
    bad_frames(
        "11e",
        "version",
        "a compromised guest (agent stopped) writes a Hello with protocol version 99 on the agent's connection mid-run",
        "mvm ends the run by itself with exit 121, saying the guest sent a message it must not send there, no panic, peak RSS within the 128 MiB guest plus 96 MiB",
        "the guest agent sent a host-to-guest message where it must not",
    );
}
