//! Whatever a guest sends, the proxy answers with a 4xx and a reason, and
//! stays up: bad CONNECT lines, origin-form and https:// requests, odd
//! methods, a huge head, a slow head, binary garbage.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{header, Egress};

#[test]
fn every_bad_request_gets_a_4xx_and_the_proxy_survives() {
    let mut e = Egress::start(&["--allow", "example.org", "--header-timeout", "2s"]);
    let huge = format!(
        "GET http://example.org/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let long_line = format!(
        "GET http://example.org/{} HTTP/1.1\r\n\r\n",
        "b".repeat(20_000)
    );
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"CONNECT example.org HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"CONNECT example.org:99999 HTTP/1.1\r\n\r\n".to_vec(), 400),
        (
            b"CONNECT user@example.org:443 HTTP/1.1\r\n\r\n".to_vec(),
            400,
        ),
        (b"CONNECT  HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"CONNECT example.org:443\r\n\r\n".to_vec(), 400),
        (b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n".to_vec(), 400),
        (b"GET https://example.org/ HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"TRACE http://example.org/ HTTP/1.1\r\n\r\n".to_vec(), 405),
        (
            b"GET http://example.org/ HTTP/1.1\r\nNo colon here\r\n\r\n".to_vec(),
            400,
        ),
        (huge.into_bytes(), 431),
        (long_line.into_bytes(), 431),
        (
            vec![
                0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0xff, 0x00, 0x00,
            ],
            400,
        ),
        ((0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(), 400),
        (vec![0u8; 20_000], 400),
        // Leading empty lines are skipped (RFC 9112 2.2): a head never comes.
        (b"\r\n\r\n\r\n\r\n".to_vec(), 408),
    ];
    for (raw, status) in &cases {
        let mut s = e.connect();
        // The proxy may answer and close before all of a huge head is
        // written; that write failing is fine.
        let _ = s.write_all(raw);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let r = String::from_utf8_lossy(&out);
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        assert!(
            r.starts_with(&format!("HTTP/1.1 {status} ")),
            "{shown:?}: {r}"
        );
        assert!(
            header(&r, "X-Mvm-Error").is_some_and(|v| !v.is_empty()),
            "{shown:?}: {r}"
        );
        assert!(e.alive(), "the proxy died on {shown:?}");
    }
    let log = e.log_lines(cases.len());
    for (line, (_, status)) in log.iter().zip(&cases) {
        assert_eq!(line["status"], *status, "{line}");
        assert_eq!(line["decision"], "error", "{line}");
        assert_eq!(line["rule"], "bad request", "{line}");
    }
    // Still serving: a good request gets its policy answer.
    let r = e.exchange(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    // Memory stayed small while refusing heads of up to 100 KB.
    let hwm = e.vm_hwm_kib();
    eprintln!("malformed: proxy VmHWM {hwm} KiB");
    assert!(hwm < 32 * 1024, "VmHWM {hwm} KiB");
}

#[test]
fn a_slow_head_is_cut_off_at_the_header_timeout() {
    let e = Egress::start(&["--allow", "example.org", "--header-timeout", "500ms"]);
    let mut s = e.connect();
    let start = Instant::now();
    // Slowloris: one byte every 100 ms, forever.
    let mut answer = Vec::new();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    for b in b"GET http://example.org/ HTTP/1.1\r\nX-Slow: "
        .iter()
        .cycle()
    {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never cut off");
    }
    let _ = s.read_to_end(&mut answer);
    let r = String::from_utf8_lossy(&answer);
    assert!(r.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{r}");
    assert!(
        start.elapsed() >= Duration::from_millis(450),
        "{:?}",
        start.elapsed()
    );
    // A client that connects and says nothing is cut off the same way.
    let mut s = e.connect();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
}
