//! A guest flooding the proxy slows itself, not the host: connections past
//! the limit wait, thousands of attempts all get their answer, a 200 MB
//! upload goes through a tunnel, and the proxy's memory stays small.
//! Prints its figures (run with --nocapture; --release for throughput).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{sink_server, Egress};

const UPLOAD: u64 = 200 << 20;

fn upload(mut w: impl Write) {
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..UPLOAD >> 20 {
        w.write_all(&chunk).unwrap();
    }
}

#[test]
fn a_flood_and_a_big_upload_leave_the_proxy_bounded_and_responsive() {
    let sink = sink_server();
    let allow = format!("127.0.0.1:{}", sink.port());
    let mut e = Egress::start(&[
        "--allow",
        &allow,
        "--max-connections",
        "32",
        "--conn-rate",
        "100000",
        "--header-timeout",
        "1s",
    ]);
    // 200 connections that never send anything: 32 are taken, and hold
    // their slots until the header timeout; the rest wait in the backlog.
    let idle: Vec<_> = (0..200).map(|_| e.connect()).collect();
    let start = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let sock = e.sock.clone();
            std::thread::spawn(move || {
                let mut refused = 0;
                for _ in 0..200 {
                    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    s.write_all(b"CONNECT blocked.example.org:443 HTTP/1.1\r\n\r\n")
                        .unwrap();
                    let mut r = String::new();
                    let _ = s.read_to_string(&mut r);
                    if r.starts_with("HTTP/1.1 403") {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    let refused: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let flood_time = start.elapsed();
    assert_eq!(refused, 3200, "every attempt got its 403");
    drop(idle);
    assert!(e.alive());
    let after_flood = e.vm_hwm_kib();

    // 200 MB up through a tunnel, the sink's count back.
    let start = Instant::now();
    let mut s = e.connect();
    write!(s, "CONNECT {allow} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    upload(&mut s);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut count = String::new();
    s.read_to_string(&mut count).unwrap();
    let tunnel = start.elapsed();
    assert_eq!(count, UPLOAD.to_string());

    // The same directly.
    let start = Instant::now();
    let mut d = TcpStream::connect(sink).unwrap();
    upload(&mut d);
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut count = String::new();
    d.read_to_string(&mut count).unwrap();
    let direct = start.elapsed();
    assert_eq!(count, UPLOAD.to_string());

    let hwm = e.vm_hwm_kib();
    let mbps = |t: Duration| UPLOAD as f64 / 1048576.0 / t.as_secs_f64();
    eprintln!(
        "flood: 3200 refused connections and 200 idle ones in {flood_time:?}; proxy VmHWM {after_flood} KiB after the flood, {hwm} KiB after 200 MiB through a tunnel"
    );
    eprintln!(
        "throughput: tunnel {:.0} MiB/s, direct {:.0} MiB/s, ratio {:.2}",
        mbps(tunnel),
        mbps(direct),
        mbps(tunnel) / mbps(direct)
    );
    assert!(hwm < 64 * 1024, "VmHWM {hwm} KiB");
    let log = e.log_lines(3200 + 200 + 1);
    let last = log.last().unwrap();
    assert_eq!(last["bytes_up"], UPLOAD);
    assert_eq!(last["decision"], "allowed");
    let sum = e.summary();
    assert_eq!(sum["denied"], 3200);
    // The summary's own peak (getrusage) is the same figure as VmHWM,
    // read from outside, give or take what it grew since the last write.
    let peak = sum["peak_rss_kib"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= hwm,
        "summary peak {peak} KiB, VmHWM {hwm} KiB"
    );
    assert_eq!(
        sum["denied_hosts"],
        serde_json::json!(["blocked.example.org:443"])
    );
}

#[test]
fn the_connection_rate_is_paced() {
    let e = Egress::start(&["--conn-rate", "20"]);
    // Let the bucket fill, then 40 connections: 20 at once, 20 at 20/s.
    std::thread::sleep(Duration::from_millis(1100));
    let start = Instant::now();
    for _ in 0..40 {
        let r = e.exchange(b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    }
    let t = start.elapsed();
    assert!(t >= Duration::from_millis(900), "not paced: {t:?}");
    assert!(t < Duration::from_secs(5), "{t:?}");
}

#[test]
fn the_byte_limit_ends_a_tunnel_and_refuses_the_next() {
    let sink = sink_server();
    let allow = format!("127.0.0.1:{}", sink.port());
    let e = Egress::start(&["--allow", &allow, "--max-bytes", "1M"]);
    let mut s = e.connect();
    write!(s, "CONNECT {allow} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut sent = 0u64;
    while s.write_all(&chunk).is_ok() && sent < 8 << 20 {
        sent += chunk.len() as u64;
    }
    assert!(sent < 8 << 20, "the tunnel was not cut at 1 MiB");
    let line = &e.log_lines(1)[0];
    assert!(line["bytes_up"].as_u64().unwrap() <= 1 << 20, "{line}");
    assert!(
        line["reason"].as_str().unwrap().contains("--max-bytes"),
        "{line}"
    );
    let r = e.exchange(format!("CONNECT {allow} HTTP/1.1\r\n\r\n").as_bytes());
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert!(
        common::header(&r, "X-Mvm-Blocked")
            .unwrap()
            .contains("raise it with --max-bytes"),
        "{r}"
    );
}
