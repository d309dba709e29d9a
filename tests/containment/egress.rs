//! Check 3b: a guest root against controlled egress (docs/network.md).
//! With one host allowed, root in the guest kills the forwarder, talks to
//! the host proxy's vsock port itself, and tries every other vsock port:
//! it reaches the allowed host (the positive control: the way out works
//! without the forwarder too), a denied host gets the proxy's 403, and no
//! other port takes a connection.

use crate::battery::{attack_scripted, code, excerpt, script, Check, Source, Verdict};

/// vsock ports around and far from the proxy's (1080).
const OTHER_PORTS: [u32; 6] = [1, 22, 1024, 1079, 1081, 8080];

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_3b_guest_root_cannot_widen_the_egress_policy() {
    let mut check = Check::new(
        "3b",
        "egress as guest root (--root --allow web.test:8080 --allow 127.0.0.1:8080, a web server on the test host): kill the forwarder, then send requests straight to the proxy's vsock port 1080 (to the allowed host, and to other.test, which is not allowed) and vsock connects to 6 other host ports",
        "the forwarder dies and nothing comes back up in its place; the direct request to the allowed host gets its page (control: the way out is the proxy's, not the forwarder's); other.test gets the proxy's 403 with X-Mvm-Blocked and never the page; every other vsock port is reset (ECONNRESET); the host's net log holds the denial",
    )
    .evidence(Source::Guest, "the answers the guest's own vsock sockets got (Python, AF_VSOCK), and whether anything listens on 127.0.0.1:3128 after the kill")
    .evidence(Source::Host, "the proxy's audit log on the test host (--net-log)")
    .control(Source::Guest, "the same direct vsock request to the allowed host returns the page, so a refusal is the policy's");
    let setup = script(
        "rm -f /run/tmp/net3b.log; mkdir -p /run/tmp/www3b && echo page-3b > /run/tmp/www3b/index.html && \
         (busybox httpd -p 127.0.0.1:8080 -h /run/tmp/www3b) && \
         printf '127.0.0.1 web.test other.test\\n' >> /etc/hosts",
    );
    let ports = OTHER_PORTS
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let guest = format!(
        r#"
# The forwarder is the one process of nobody's (pkill -f would match this
# very script).
kill -KILL $(ps -eo pid=,user= | awk '$2 == "nobody" {{print $1}}') 2>/dev/null
sleep 0.5
python3 - <<'PY'
import socket
def direct(host):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect((2, 1080))
    s.sendall(("GET http://%s:8080/index.html HTTP/1.1\r\nHost: %s:8080\r\n\r\n" % (host, host)).encode())
    out = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        out += b
    return out.decode(errors="replace").replace("\r", "").replace("\n", " | ")
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=2)
    print("forwarder: still listening")
except OSError as e:
    print("forwarder: gone (%s)" % e.strerror)
print("allowed: " + direct("web.test"))
print("denied: " + direct("other.test"))
for port in [{ports}]:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect((2, port))
        print("vsock %d: connected" % port)
    except OSError as e:
        print("vsock %d: %s" % (port, e.strerror))
PY
"#
    );
    let run = check.run(|| {
        attack_scripted(
            &setup,
            "cat /run/tmp/net3b.log",
            &[
                "--root",
                "--no-workspace",
                "--allow",
                "web.test:8080",
                "--allow",
                "127.0.0.1:8080",
                "--net-log",
                "/run/tmp/net3b.log",
                "--",
                "sh",
                "-c",
                &guest,
            ],
        )
    });
    let mut v = Verdict::new();
    let out = &run.stdout;
    v.saw(format!("exit {}", code(&run)));
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("(missing)")
            .to_string()
    };
    let forwarder = field("forwarder: ");
    v.saw(format!("forwarder after the kill: {forwarder}"));
    v.require(
        forwarder.starts_with("gone"),
        format!("the forwarder survived: {forwarder}"),
    );
    let allowed = field("allowed: ");
    v.saw(format!("direct to web.test: {}", excerpt(&allowed, 60)));
    v.require(
        allowed.starts_with("HTTP/1.1 200") && allowed.contains("page-3b"),
        format!(
            "control: the allowed host was not reached directly: {}",
            excerpt(&allowed, 200)
        ),
    );
    let denied = field("denied: ");
    v.saw(format!("direct to other.test: {}", excerpt(&denied, 80)));
    v.require(
        denied.starts_with("HTTP/1.1 403")
            && denied.contains("X-Mvm-Blocked")
            && !denied.contains("page-3b"),
        format!(
            "other.test was not refused by the proxy: {}",
            excerpt(&denied, 200)
        ),
    );
    let vsock: Vec<&str> = out.lines().filter(|l| l.starts_with("vsock ")).collect();
    let reset = vsock
        .iter()
        .filter(|l| l.ends_with("Connection reset by peer"))
        .count();
    v.saw(format!(
        "other vsock ports: {reset} of {} reset",
        OTHER_PORTS.len()
    ));
    v.require(
        vsock.len() == OTHER_PORTS.len() && reset == OTHER_PORTS.len(),
        format!(
            "a vsock port other than the proxy's answered: {}",
            excerpt(&vsock.join("; "), 300)
        ),
    );
    let log = run.after_lines();
    let denials = log
        .iter()
        .filter(|l| l.contains("\"decision\":\"denied\"") && l.contains("other.test"))
        .count();
    v.saw(format!(
        "net log: {} lines, {denials} denial of other.test",
        log.len()
    ));
    v.require(
        denials == 1,
        format!(
            "the host's log misses the denial: {}",
            excerpt(&log.join("\n"), 300)
        ),
    );
    check.finish(v);
}
