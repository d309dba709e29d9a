//! The proxy as the guest sees it: tunnels, forwarded requests, refusals
//! that say what to allow, the rebinding rule, upstream failures, and the
//! log and summary, field by field.

mod common;

use std::io::{Read, Write};

use common::{echo_server, header, http_server, silent_server, Egress};

#[test]
fn connect_tunnels_to_an_allowed_address_and_refuses_the_rest() {
    let echo = echo_server();
    let allow = format!("127.0.0.1:{}", echo.port());
    let e = Egress::start(&["--allow", &allow]);
    let mut s = e.connect();
    write!(
        s,
        "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: x\r\n\r\n",
        echo.port()
    )
    .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection established\r\n\r\n");
    s.write_all(b"ping through the tunnel").unwrap();
    let mut back = [0u8; 23];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping through the tunnel");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    // Another port on the same address is not allowed.
    let r =
        e.exchange(format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port() + 1).as_bytes());
    assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");
    let want = format!(
        "127.0.0.1:{p} is a loopback address; allow it with --allow 127.0.0.1:{p}",
        p = echo.port() + 1
    );
    assert_eq!(header(&r, "X-Mvm-Blocked"), Some(want.as_str()), "{r}");
    assert!(
        r.ends_with(&format!("\r\n\r\nmvm: network: {want}\n")),
        "{r}"
    );
    let r = e.exchange(b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");
    assert_eq!(
        header(&r, "X-Mvm-Blocked"),
        Some("example.org:443 is not allowed; allow it with --allow example.org"),
        "{r}"
    );

    let log = e.log_lines(3);
    let first = &log[0];
    assert_eq!(first["run_id"], "run-1");
    assert_eq!(first["conn"], 1);
    assert_eq!(first["method"], "CONNECT");
    assert_eq!(first["host"], "127.0.0.1");
    assert_eq!(first["port"], echo.port());
    assert_eq!(first["address"], "127.0.0.1");
    assert_eq!(first["decision"], "allowed");
    assert_eq!(first["rule"], format!("allow {allow}"));
    assert_eq!(first["status"], 200);
    assert_eq!(first["bytes_up"], 23);
    assert_eq!(first["bytes_down"], 23);
    assert!(first["path"].is_null());
    assert!(first["duration_ms"].as_u64().is_some());
    let t = first["time"].as_str().unwrap();
    assert!(
        t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
        "{t}"
    );
    let denied = &log[2];
    assert_eq!(denied["decision"], "denied");
    assert_eq!(denied["rule"], "no allow rule");
    assert_eq!(denied["status"], 403);
    assert_eq!(denied["host"], "example.org");
    assert!(
        denied["address"].is_null(),
        "a name no rule allows is not even resolved"
    );
    assert_eq!(denied["bytes_up"], 0);
    assert_eq!(log[1]["rule"], "loopback address");

    let sum = e.summary();
    assert_eq!(sum["requests"], 3);
    assert_eq!(sum["allowed"], 1);
    assert_eq!(sum["denied"], 2);
    assert_eq!(sum["denied_hosts"][1], "example.org:443");
    assert_eq!(sum["bytes_up"], 23);
}

#[test]
fn a_name_resolving_to_loopback_needs_the_address_allowed_too() {
    let echo = echo_server();
    let name_rule = format!("api.test:{}", echo.port());
    let connect = format!("CONNECT api.test:{} HTTP/1.1\r\n\r\n", echo.port());
    // The name is allowed, its address (loopback) is not: refused.
    let e = Egress::start(&["--allow", &name_rule, "--resolve", "api.test=127.0.0.1"]);
    let r = e.exchange(connect.as_bytes());
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let want = format!(
        "api.test resolves to 127.0.0.1, a loopback address; allow that address with --allow 127.0.0.1:{}",
        echo.port()
    );
    assert_eq!(header(&r, "X-Mvm-Blocked"), Some(want.as_str()));
    let line = &e.log_lines(1)[0];
    assert_eq!(line["address"], "127.0.0.1");
    assert_eq!(line["rule"], "loopback address");
    drop(e);

    // The control: with the address allowed, the same request tunnels.
    let addr_rule = format!("127.0.0.1:{}", echo.port());
    let e = Egress::start(&[
        "--allow",
        &name_rule,
        "--allow",
        &addr_rule,
        "--resolve",
        "api.test=127.0.0.1",
    ]);
    let mut s = e.connect();
    s.write_all(connect.as_bytes()).unwrap();
    s.write_all(b"x").unwrap();
    let mut got = [0u8; 40];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"HTTP/1.1 200 Connection established\r\n\r\nx");
    drop(s);
    let line = &e.log_lines(1)[0];
    assert_eq!(
        line["rule"],
        format!("allow {name_rule} + allow {addr_rule}")
    );
    assert_eq!(line["decision"], "allowed");

    // A wide range is not an explicit allow of loopback.
    let e = Egress::start(&[
        "--allow",
        &name_rule,
        "--allow",
        "0.0.0.0/0:*",
        "--resolve",
        "api.test=127.0.0.1",
    ]);
    assert!(e.exchange(connect.as_bytes()).starts_with("HTTP/1.1 403"));
}

#[test]
fn localhost_from_the_hosts_file_is_loopback_too() {
    let echo = echo_server();
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    assert!(
        hosts.contains("localhost"),
        "this test needs localhost in /etc/hosts"
    );
    let rule = format!("localhost:{}", echo.port());
    let connect = format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", echo.port());
    let e = Egress::start_with_hosts_file(&["--allow", &rule]);
    let r = e.exchange(connect.as_bytes());
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert!(
        header(&r, "X-Mvm-Blocked")
            .unwrap()
            .starts_with("localhost resolves to "),
        "{r}"
    );
}

#[test]
fn plain_http_is_forwarded_in_origin_form() {
    let (srv, seen) = http_server();
    let e = Egress::start(&[
        "--allow",
        &format!("web.test:{}", srv.port()),
        "--allow",
        &format!("127.0.0.1:{}", srv.port()),
        "--resolve",
        "web.test=127.0.0.1",
    ]);
    let r = e.exchange(
        format!(
            "GET http://web.test:{}/a/b?token=secret HTTP/1.1\r\nHost: web.test\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nUser-Agent: t\r\n\r\n",
            srv.port()
        )
        .as_bytes(),
    );
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.ends_with("hello from upstream\n"), "{r}");
    let head = seen.lock().unwrap()[0].clone();
    assert_eq!(
        head,
        format!(
            "GET /a/b?token=secret HTTP/1.1\r\nHost: web.test:{}\r\nUser-Agent: t\r\nConnection: close\r\n\r\n",
            srv.port()
        )
    );
    let line = &e.log_lines(1)[0];
    assert_eq!(line["method"], "GET");
    assert_eq!(line["host"], "web.test");
    assert_eq!(line["path"], "/a/b", "no query string in the log");
    assert!(line["status"].is_null());
    assert_eq!(line["bytes_up"], head.len());
    assert_eq!(line["bytes_down"], r.len());
    assert_eq!(line["decision"], "allowed");

    // A denied plain request: 403, never reaching the server.
    let r = e.exchange(b"GET http://example.org/x HTTP/1.1\r\nHost: example.org\r\n\r\n");
    assert_eq!(
        header(&r, "X-Mvm-Blocked"),
        Some("example.org:80 is not allowed; allow it with --allow example.org")
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn deny_beats_allow_end_to_end() {
    let e = Egress::start(&["--allow", "**.example.org", "--deny", "secret.example.org"]);
    let r = e.exchange(b"CONNECT secret.example.org:443 HTTP/1.1\r\n\r\n");
    assert_eq!(
        header(&r, "X-Mvm-Blocked"),
        Some("secret.example.org:443 is denied by --deny secret.example.org")
    );
    assert_eq!(e.log_lines(1)[0]["rule"], "deny secret.example.org");
}

#[test]
fn a_policy_file_works_like_the_flags() {
    let echo = echo_server();
    let dir = common::scratch("policy");
    let file = dir.join("policy.json");
    std::fs::write(
        &file,
        format!(r#"{{"allow": ["127.0.0.1:{}"], "deny": []}}"#, echo.port()),
    )
    .unwrap();
    let e = Egress::start(&["--policy", file.to_str().unwrap()]);
    let mut s = e.connect();
    write!(s, "CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn upstream_failures_are_502_and_504_with_a_reason() {
    // A port nothing listens on: 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let silent = silent_server();
    let e = Egress::start(&[
        "--allow",
        "127.0.0.1:*",
        "--allow",
        "nowhere.test",
        "--idle-timeout",
        "500ms",
        "--dns-timeout",
        "300ms",
    ]);
    let r = e.exchange(format!("CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n").as_bytes());
    assert!(r.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{r}");
    let why = header(&r, "X-Mvm-Error").unwrap();
    assert!(
        why.starts_with(&format!(
            "cannot connect to 127.0.0.1:{closed} (127.0.0.1): Connection refused"
        )),
        "{why}"
    );
    // A server that accepts and never answers: 504 after the idle timeout.
    let start = std::time::Instant::now();
    let r =
        e.exchange(format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", silent.port()).as_bytes());
    assert!(r.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"), "{r}");
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // DNS that does not answer (the test's nameserver is 127.0.0.1:9): 502.
    let r = e.exchange(b"CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 502"), "{r}");
    assert!(
        header(&r, "X-Mvm-Error")
            .unwrap()
            .starts_with("cannot resolve nowhere.test"),
        "{r}"
    );
    let log = e.log_lines(3);
    assert_eq!(log[0]["decision"], "error");
    assert_eq!(log[0]["rule"], "connect failed");
    assert_eq!(log[1]["rule"], "upstream timeout");
    assert_eq!(log[2]["rule"], "DNS");
    assert_eq!(e.summary()["errors"], 3);
}

#[test]
fn confinement_leaves_no_filesystem_and_no_stray_system_calls() {
    let probe = |extra: &[&str]| {
        let dir = common::scratch("probe");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mvm-egress"))
            .arg("--listen")
            .arg(dir.join("s"))
            .arg("--log")
            .arg(dir.join("log"))
            .args(["--confinement-probe", "/etc/hosts"])
            .args(extra)
            .env_clear()
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(dir);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The control: unconfined, the file opens.
    let (code, err) = probe(&["--no-landlock", "--no-seccomp"]);
    assert_eq!(code, Some(0));
    assert!(err.contains("probe: open /etc/hosts: ok"), "{err}");
    // Landlock alone: refused.
    let (code, err) = probe(&["--no-seccomp"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("probe: open /etc/hosts: Permission denied"),
        "{err}"
    );
    // Seccomp: openat is not on the list; the process ends with a message.
    let (code, err) = probe(&[]);
    assert_eq!(code, Some(159), "{err}");
    assert!(
        err.contains("mvm-egress: seccomp: forbidden system call 257"),
        "{err}"
    );
}

#[test]
fn at_sigterm_open_connections_are_cut_logged_with_their_bytes_and_the_proxy_exits() {
    let echo = echo_server();
    let allow = format!("127.0.0.1:{}", echo.port());
    let mut e = Egress::start(&["--allow", &allow]);
    // One tunnel carrying bytes, one request still half sent.
    let mut tunnel = e.connect();
    write!(tunnel, "CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut head = [0u8; 39];
    tunnel.read_exact(&mut head).unwrap();
    tunnel.write_all(b"hello").unwrap();
    let mut back = [0u8; 5];
    tunnel.read_exact(&mut back).unwrap();
    let mut half = e.connect();
    half.write_all(b"CONNECT 127.0.0.1").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));

    // SAFETY: signals the proxy this test started.
    unsafe { libc::kill(e.child.id() as libc::pid_t, libc::SIGTERM) };
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = e.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Exit 0, not a seccomp kill: the signal's delivery is in the filter.
    assert!(status.success(), "{status:?}");
    let log = e.log_lines(2);
    let cut = log
        .iter()
        .find(|l| l["method"] == "CONNECT")
        .unwrap_or_else(|| panic!("{log:?}"));
    assert_eq!(cut["decision"], "allowed");
    assert_eq!(cut["reason"], "still open when the run ended: cut");
    assert_eq!(
        (cut["bytes_up"].as_u64(), cut["bytes_down"].as_u64()),
        (Some(5), Some(5))
    );
    let partial = log
        .iter()
        .find(|l| l["method"].is_null())
        .unwrap_or_else(|| panic!("{log:?}"));
    assert_eq!(partial["decision"], "error");
    assert_eq!(partial["rule"], "run ended");
    assert_eq!(e.summary()["requests"], 2);
    // Both clients see their connection closed.
    let mut rest = Vec::new();
    assert!(tunnel
        .read_to_end(&mut rest)
        .map(|_| rest.is_empty())
        .unwrap_or(true));
}
