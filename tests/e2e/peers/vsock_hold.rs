//! A host client that holds a connection to a guest's vsock port while a
//! template is taken (tests/e2e/template.rs): it waits for the one
//! session socket under BASE (`BASE/<session>/vsock.sock`), asks it for
//! guest PORT (`CONNECT PORT`, the hybrid protocol of docs/protocol.md)
//! until the guest accepts, prints the reply, then keeps the connection
//! until RELEASE (a template store) holds a whole template, and closes
//! it. Exits 1 with a line on stderr if SECS pass first.
//!
//! Usage: vsock_hold BASE PORT RELEASE SECS. Std only, built static by
//! the test (the test host has no libc of its own).

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
    let [_, base, port, release, secs] = &args[..] else {
        eprintln!("usage: vsock_hold BASE PORT RELEASE SECS");
        std::process::exit(2);
    };
    let deadline = Instant::now() + Duration::from_secs(secs.parse().expect("SECS"));
    let give_up = |what: &str| -> ! {
        eprintln!("vsock_hold: {what} within {secs} s");
        std::process::exit(1)
    };
    let (stream, reply) = loop {
        if let Some(held) = session_socket(Path::new(base)).and_then(|s| try_connect(&s, port)) {
            break held;
        }
        if Instant::now() > deadline {
            give_up("no connection accepted");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("held: {reply}");
    while !has_template(Path::new(release)) {
        if Instant::now() > deadline {
            give_up("no release");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stream);
    println!("released");
}
