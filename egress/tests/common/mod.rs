//! A real mvm-egress process on a Unix socket in a fresh directory, and
//! real servers on 127.0.0.1 behind it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Egress {
    pub child: Child,
    pub dir: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub summary: PathBuf,
}

pub fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mvm-egress-test-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Egress {
    /// A proxy with `args`, which neither reads the host's /etc/hosts
    /// nor reaches a real name server: every name a test uses is given.
    pub fn start(args: &[&str]) -> Egress {
        Egress::spawn(args, false)
    }

    /// The same, reading the host's /etc/hosts as the proxy does by
    /// default.
    pub fn start_with_hosts_file(args: &[&str]) -> Egress {
        Egress::spawn(args, true)
    }

    /// Starts the proxy and returns once it serves: its summary is
    /// written when it is confined and about to accept (the socket alone
    /// exists from bind(), before listen()).
    fn spawn(args: &[&str], hosts_file: bool) -> Egress {
        let dir = scratch("proxy");
        let sock = dir.join("egress.sock");
        let log = dir.join("net.jsonl");
        let summary = dir.join("summary.json");
        let child = Command::new(env!("CARGO_BIN_EXE_mvm-egress"))
            .arg("--listen")
            .arg(&sock)
            .arg("--log")
            .arg(&log)
            .arg("--summary")
            .arg(&summary)
            .args(["--run-id", "run-1", "--nameserver", "127.0.0.1:9"])
            .args(if hosts_file {
                &[][..]
            } else {
                &["--no-hosts-file"][..]
            })
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut e = Egress {
            child,
            dir,
            sock,
            log,
            summary,
        };
        let start = Instant::now();
        // The summary is written once the proxy is confined and about to serve.
        while !(e.sock.exists()
            && std::fs::metadata(&e.summary)
                .map(|m| m.len() > 0)
                .unwrap_or(false))
        {
            if let Some(status) = e.child.try_wait().unwrap() {
                let mut err = String::new();
                e.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("mvm-egress exited ({status}): {err}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "mvm-egress did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        e
    }

    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Sends `raw`, returns everything until the proxy closes.
    pub fn exchange(&self, raw: &[u8]) -> String {
        let mut s = self.connect();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The log's lines once there are at least `n`.
    pub fn log_lines(&self, n: usize) -> Vec<serde_json::Value> {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "log has {} lines, not {n}: {text}",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The summary once it counts every line in the log: the proxy
    /// writes a record's line, then the summary, so a summary read right
    /// after the line was seen can be one record behind.
    pub fn summary(&self) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&self.summary).unwrap()).unwrap();
            let logged = std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .count() as u64;
            if summary["requests"].as_u64() >= Some(logged) {
                return summary;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the summary counts {} requests, the log has {logged} lines: {summary}",
                summary["requests"]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Peak resident memory of the proxy process, in KiB.
    pub fn vm_hwm_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Echoes every byte back until EOF.
pub fn echo_server() -> SocketAddr {
    serve(|mut s| {
        let mut buf = [0u8; 65536];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    })
}

/// Reads to EOF, then answers with the byte count as text.
pub fn sink_server() -> SocketAddr {
    serve(|mut s| {
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let _ = s.write_all(total.to_string().as_bytes());
    })
}

/// An HTTP server answering 200 with a fixed body; the heads it got are
/// kept in the returned list.
pub fn http_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let addr = serve(move |mut s| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        kept.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&head).into_owned());
        let body = "hello from upstream\n";
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    (addr, seen)
}

/// Accepts and never answers.
pub fn silent_server() -> SocketAddr {
    serve(|s| {
        std::thread::sleep(Duration::from_secs(30));
        drop(s);
    })
}

fn serve(f: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let f = Arc::new(f);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let f = f.clone();
            std::thread::spawn(move || f(s));
        }
    });
    addr
}

/// The value of header `name` in a response.
pub fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next()?;
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}
