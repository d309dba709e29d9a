//! Controlled egress end to end (docs/network.md): the guest's forwarder,
//! the vsock device's one guest port, the host proxy (mvm-egress) and a
//! real web server on the test host's loopback (busybox httpd; names from
//! the test host's /etc/hosts), with the default image's curl and python.
//! Every denial has an allowed request beside it as its control.

use mvm_e2e::{mvm_with, Options, Run};

/// A web server on the test host's 127.0.0.1:8080, named web.test and
/// other.test there (not in the guest, which has no resolver: names are
/// resolved by the host proxy).
const SERVER: &str =
    "mkdir -p /run/tmp/www && echo hello-from-the-host > /run/tmp/www/index.html && \
    (busybox httpd -p 127.0.0.1:8080 -h /run/tmp/www) && \
    printf '127.0.0.1 web.test other.test\\n' >> /etc/hosts";

fn run(allow: &[&str], after: Option<&str>, script: &str) -> Run {
    let mut args = vec![
        "run",
        "--image",
        "default",
        "--no-workspace",
        "--net-log",
        "/run/tmp/net.log",
    ];
    for a in allow {
        args.extend_from_slice(&["--allow", a]);
    }
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let setup = format!("rm -f /run/tmp/net.log; {SERVER}");
    mvm_with(
        &Options {
            setup: Some(&setup),
            after,
            ..Options::default()
        },
        &args,
    )
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn an_allowed_host_is_reached_through_the_proxy_by_curl_and_python() {
    let r = run(
        &["web.test:8080", "127.0.0.1:8080"],
        Some("cat /run/tmp/net.log"),
        "curl -sS http://web.test:8080/index.html; \
         curl -sS --proxytunnel http://web.test:8080/index.html; \
         python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://web.test:8080/index.html\").read().decode().strip())'",
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, "hello-from-the-host\n".repeat(3), "{}", r.stderr);
    // The host proxy logged each: two plain requests and one CONNECT.
    let log = r.after_lines();
    assert_eq!(log.len(), 3, "{log:?}");
    let entries: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(entries
        .iter()
        .all(|e| e["decision"] == "allowed" && e["host"] == "web.test" && e["port"] == 8080));
    assert!(entries
        .iter()
        .all(|e| e["address"].as_str().unwrap_or("").starts_with("127.0.0.1")));
    assert_eq!(
        entries.iter().filter(|e| e["method"] == "CONNECT").count(),
        1,
        "{log:?}"
    );
    assert!(entries
        .iter()
        .any(|e| e["method"] == "GET" && e["path"] == "/index.html"));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_denied_host_gets_a_visible_403_a_log_line_and_a_summary() {
    let r = run(
        &["web.test:8080", "127.0.0.1:8080"],
        Some("cat /run/tmp/net.log"),
        "curl -sS -f http://other.test:8080/index.html; echo denied-exit=$?; \
         curl -sS http://other.test:8080/index.html; \
         curl -sS http://web.test:8080/index.html",
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        out[0], "denied-exit=22",
        "curl -f fails on the 403: {}",
        r.stdout
    );
    assert!(
        out[1].contains("other.test:8080 is not allowed") && out[1].contains("--allow other.test"),
        "{}",
        r.stdout
    );
    // Control: the allowed host still works in the same run.
    assert_eq!(out.last(), Some(&"hello-from-the-host"));
    assert!(
        r.mvm_stderr()
            .contains("mvm: network: 2 requests denied: other.test:8080 (see /run/tmp/net.log)"),
        "{}",
        r.stderr
    );
    let denied = r
        .after_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["decision"] == "denied" && e["host"] == "other.test")
        .count();
    assert_eq!(denied, 2);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_name_that_resolves_to_loopback_needs_the_address_allowed_too() {
    // web.test resolves to 127.0.0.1 on the host: allowed by name alone it
    // is refused (DNS rebinding); the second run allows the address.
    let name_only = run(
        &["web.test:8080"],
        None,
        "curl -sS http://web.test:8080/index.html",
    );
    assert!(
        name_only
            .stdout
            .contains("web.test resolves to 127.0.0.1, a loopback address")
            && name_only.stdout.contains("--allow 127.0.0.1"),
        "{}",
        name_only.stdout
    );
    assert!(
        !name_only.stdout.contains("hello-from-the-host"),
        "{}",
        name_only.stdout
    );
    let both = run(
        &["web.test:8080", "127.0.0.1:8080"],
        None,
        "curl -sS http://web.test:8080/index.html",
    );
    assert_eq!(both.stdout, "hello-from-the-host\n", "{}", both.stderr);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn around_the_proxy_there_is_still_no_way_out() {
    // With egress allowed, a command that ignores the proxy has no route,
    // and a guest root that kills the forwarder reaches nothing more: the
    // vsock device still resets every other port.
    let r = run(
        &["web.test:8080", "127.0.0.1:8080"],
        None,
        "curl -sS --noproxy '*' --connect-timeout 5 http://10.0.2.2:8080/ 2>&1 | head -n 1; \
         curl -sS http://web.test:8080/index.html; \
         python3 -c 'import socket, time
t = time.monotonic()
for what, probe in [
    (\"dns\", lambda: socket.getaddrinfo(\"web.test\", 80)),
    (\"udp\", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"x\", (\"10.0.2.3\", 53))),
]:
    try:
        probe()
        print(what, \"got through\")
    except OSError as e:
        print(what, e)
print(\"seconds\", round(time.monotonic() - t, 1))'; \
         git clone -q ssh://git@web.test/x.git /tmp/x 2>&1 | head -n 1",
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out: Vec<&str> = r.stdout.lines().collect();
    assert!(
        out[0].contains("Network is unreachable") || out[0].contains("Couldn't connect"),
        "a raw connect got somewhere: {}",
        r.stdout
    );
    assert_eq!(out[1], "hello-from-the-host", "control: {}", r.stdout);
    // What does not use the proxy fails at once, with its own error: a
    // name lookup in the guest (no resolver), UDP (no route), git over
    // ssh (no ssh, and no way for it either: docs/network.md).
    assert!(
        out[2].starts_with("dns ") && !out[2].contains("got through"),
        "{}",
        r.stdout
    );
    assert!(out[3].contains("Network is unreachable"), "{}", r.stdout);
    let seconds: f64 = out[4]
        .strip_prefix("seconds ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(seconds < 5.0, "failed slowly: {}", r.stdout);
    assert!(out[5].contains("ssh"), "{}", r.stdout);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn without_allow_there_is_no_proxy_at_all() {
    let mut args = vec!["run", "--image", "default", "--no-workspace", "--"];
    args.extend_from_slice(&["sh", "-c", "env | grep -ci proxy; curl -sS --connect-timeout 5 http://127.0.0.1:3128/ 2>&1 | head -n 1"]);
    let r = mvm_with(&Options::default(), &args);
    let out: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        out.first(),
        Some(&"0"),
        "proxy variables without --allow: {}",
        r.stdout
    );
    assert!(
        out.get(1)
            .is_some_and(|l| l.contains("Couldn't connect") || l.contains("refused")),
        "{}",
        r.stdout
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_policy_the_proxy_cannot_read_is_one_line_before_the_command_runs() {
    let r = mvm_with(
        &Options::default(),
        &[
            "run",
            "--policy",
            "/nonexistent/policy.json",
            "--",
            "echo",
            "ran",
        ],
    );
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        !r.stdout.contains("ran"),
        "the command ran without its proxy"
    );
    let stderr = r.mvm_stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].starts_with("mvm: the egress proxy did not start")
            && lines[0].contains("/nonexistent/policy.json"),
        "{}",
        r.stderr
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_tunnel_still_open_when_the_run_ends_is_logged_with_its_bytes() {
    // The command holds a tunnel with half a request sent until --timeout
    // stops the VM (no guest-init to close it): the proxy is told the run
    // is over, cuts it and logs it, with the bytes, before mvm exits.
    let script = "python3 -c 'import socket, time
s = socket.create_connection((\"127.0.0.1\", 3128))
s.sendall(b\"CONNECT web.test:8080 HTTP/1.1\\r\\nHost: web.test:8080\\r\\n\\r\\n\")
print(s.recv(100).split(b\"\\r\\n\")[0].decode(), flush=True)
s.sendall(b\"GET /index.html HTTP/1.1\\r\\n\")
time.sleep(600)'";
    let setup = format!("rm -f /run/tmp/net.log; {SERVER}");
    let r = mvm_with(
        &Options {
            setup: Some(&setup),
            after: Some("cat /run/tmp/net.log"),
            ..Options::default()
        },
        &[
            "run",
            "--image",
            "default",
            "--no-workspace",
            "--timeout",
            "15",
            "--net-log",
            "/run/tmp/net.log",
            "--allow",
            "web.test:8080",
            "--allow",
            "127.0.0.1:8080",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(r.code, Some(124), "the timeout's status: {}", r.stderr);
    assert_eq!(
        r.stdout, "HTTP/1.1 200 Connection established\n",
        "{}",
        r.stderr
    );
    let log: Vec<serde_json::Value> = r
        .after_lines()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["method"], "CONNECT");
    assert_eq!(
        log[0]["reason"], "still open when the run ended: cut",
        "{log:?}"
    );
    assert_eq!(log[0]["bytes_up"], 26, "{log:?}");
}
