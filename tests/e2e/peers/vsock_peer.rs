//! A host client of a guest's vsock port for tests (tests/e2e/template.rs):
//! it waits for the one session socket under BASE
//! (`BASE/<session>/vsock.sock`), asks it for guest PORT (`CONNECT PORT`,
//! the hybrid protocol of docs/protocol.md) until the guest accepts, and
//! prints the reply. Then, as told:
//!
//! - `hold STORE`: keeps the connection until STORE (a template store)
//!   holds a whole template, and closes it;
//! - `send FILE`: writes FILE's bytes (frames the test made) and prints
//!   what comes back until the guest closes, its printable characters.
//!
//! Exits 1 with a line on stderr if SECS pass first.
//!
//! Usage: vsock_peer BASE PORT SECS hold STORE | send FILE. Std only,
//! built static by the test (the test host has no libc of its own).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn session_socket(base: &Path) -> Option<PathBuf> {
    std::fs::read_dir(base)
        .ok()?
        .flatten()
        .map(|e| e.path().join("vsock.sock"))
        .find(|p| p.exists())
}

/// Whether `store` holds a whole template: a directory named by its
/// 32-hex-digit key (one being written has a temporary name).
fn has_template(store: &Path) -> bool {
    std::fs::read_dir(store).is_ok_and(|mut entries| {
        entries.any(|e| {
            e.is_ok_and(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
    })
}

/// The guest's reply to `CONNECT`: `OK <port>`, or None when it refused
/// (the socket closes) or nothing listens yet.
fn try_connect(socket: &Path, port: &str) -> Option<(UnixStream, String)> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes()).ok()?;
    let mut line = Vec::new();
    let mut byte = [0u8];
    while line.last() != Some(&b'\n') {
        match stream.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => return None,
        }
    }
    let line = String::from_utf8_lossy(&line).trim_end().to_string();
    line.starts_with("OK ").then_some((stream, line))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, base, port, secs, mode, what] = &args[..] else {
        eprintln!("usage: vsock_peer BASE PORT SECS hold STORE | send FILE");
        std::process::exit(2);
    };
    let deadline = Instant::now() + Duration::from_secs(secs.parse().expect("SECS"));
    let give_up = |what: &str| -> ! {
        eprintln!("vsock_peer: {what} within {secs} s");
        std::process::exit(1)
    };
    let (mut stream, reply) = loop {
        if let Some(held) = session_socket(Path::new(base)).and_then(|s| try_connect(&s, port)) {
            break held;
        }
        if Instant::now() > deadline {
            give_up("no connection accepted");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("held: {reply}");
    match mode.as_str() {
        "hold" => {
            while !has_template(Path::new(what)) {
                if Instant::now() > deadline {
                    give_up("no release");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(stream);
            println!("released");
        }
        "send" => {
            let frames = std::fs::read(what).expect("FILE");
            stream.write_all(&frames).expect("send");
            stream
                .set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))
                .unwrap();
            let mut answer = Vec::new();
            if stream.read_to_end(&mut answer).is_err() {
                give_up("no end of the answer");
            }
            let text: String = answer
                .iter()
                .map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' })
                .collect();
            println!("answer: {text}");
        }
        _ => {
            eprintln!("vsock_peer: the mode is hold or send, not {mode}");
            std::process::exit(2);
        }
    }
}
