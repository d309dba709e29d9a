//! Secrets by placeholder end to end (docs/network.md, "Secrets"): the
//! default image's curl (HTTP/1.1 and HTTP/2), Python, Node and git through the
//! proxy's interception to a real HTTPS server on the test host (the peer
//! root's Python, tests/e2e/peers), which logs what it receives and
//! answers only a hash of its Authorization header, so that the real
//! value reaches the server but never the guest.
//!
//! The value is planted where mvm runs: in mvm's own environment in the
//! test host (`MVM_TEST_TOKEN`). Inside the guest, as root, every process's
//! environ, command line and readable memory, the kernel command line and
//! log are searched for it; the same search finds a value given with
//! `--env` (the control), so it can see what it looks for.

use mvm_e2e::{field, mvm_with, sha256_hex, Options, PEER_SECRET_ARGS};

/// The secret's value and the control's. The guest is given only their
/// halves, never joined, so that its search cannot find its own copy.
const REAL: (&str, &str) = ("mvm-e2e-real-", "value-7c1d9e");
const CONTROL: (&str, &str) = ("mvm-e2e-control-", "value-3f8a2b");

/// The peers, and a watcher of the live session directory on the test
/// host: every 0.2 s each of its files is searched for the value, and for
/// the run's CA certificate (its control: the watcher sees the files).
const SETUP: &str =
    "sh tests/e2e/peers/start.sh || exit 1; rm -f /run/tmp/net.log /run/tmp/watch.txt; \
    (while :; do for f in /run/tmp/mvm-*/*/*; do [ -f \"$f\" ] || continue; \
        grep -q 'BEGIN CERTIFICATE' \"$f\" && echo \"certificate ${f##*/}\"; \
        grep -qF \"$MVM_TEST_TOKEN\" \"$f\" && echo \"value ${f##*/}\"; \
     done; sleep 0.2; done >>/run/tmp/watch.txt 2>/dev/null) </dev/null >/dev/null 2>&1 &";

/// The guest's search (tests/e2e/peers/scan.py): argv holds the two
/// halves of each needle.
const SCAN: &str = include_str!("peers/scan.py");

/// A plain tunnel to the sink carrying the placeholder in clear.
const TUNNEL: &str = r#"
import os, socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT sink.test:9000 HTTP/1.1\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode(), end="; ")
s.sendall(b"token " + os.environ["TOKEN"].encode())
s.shutdown(socket.SHUT_WR)
try:
    answer = repr(s.recv(100))
except OSError as e:
    answer = "reset (" + type(e).__name__ + ")"
print("sink answered:", answer)
"#;

/// Node's own fetch(). Debian's Node 18 does not read the proxy variables
/// (`NODE_USE_ENV_PROXY`, which mvm sets, is a later Node's), so its
/// global dispatcher is undici's ProxyAgent, as Node's docs say; the
/// request itself is plain `fetch`.
const NODE: &str = r#"
const { setGlobalDispatcher, ProxyAgent } = require("undici");
setGlobalDispatcher(new ProxyAgent(process.env.HTTPS_PROXY));
fetch("https://api.test:8443/echo", { headers: { Authorization: "Bearer " + process.env.TOKEN } })
  .then((r) => r.text())
  .then((t) => console.log(t.trim()), (e) => console.log("failed:", String(e.cause || e)));
"#;

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_real_value_reaches_the_bound_server_and_nowhere_in_the_guest() {
    let real = format!("{}{}", REAL.0, REAL.1);
    let control = format!("{}{}", CONTROL.0, CONTROL.1);
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let script = format!(
        "cd /tmp; A='Authorization: Bearer'; \
         echo \"curl: $(curl -sS -H \"$A $TOKEN\" https://api.test:8443/echo 2>&1)\"; \
         echo \"h2: $(curl -sS --http2 -o /dev/null -w '%{{http_version}}' -H \"$A $TOKEN\" https://api.test:8443/echo 2>&1)\"; \
         echo \"urllib: $(python3 -c 'import os, urllib.request as u; \
            r = u.Request(\"https://api.test:8443/echo\", headers={{\"Authorization\": \"Bearer \" + os.environ[\"TOKEN\"]}}); \
            print(u.urlopen(r).read().decode().strip())' 2>&1)\"; \
         echo \"node: $(node --no-warnings -e {node} 2>&1)\"; \
         git -c http.extraHeader=\"$A $TOKEN\" clone -q https://api.test:8443/git/probe.git probe 2>&1; \
         echo \"git: $(cat probe/README 2>&1)\"; \
         echo \"body: $(curl -sS -d \"body $TOKEN\" https://api.test:8443/echo 2>&1)\"; \
         echo \"url: $(curl -sS \"https://api.test:8443/echo?k=$TOKEN\" 2>&1)\"; \
         echo \"plain header: $(curl -sS -H \"$A $TOKEN\" http://plain.test:8080/echo 2>&1)\"; \
         echo \"plain url: $(curl -sS \"http://plain.test:8080/echo?k=$TOKEN\" 2>&1)\"; \
         echo \"tunnel: $(python3 -c {tunnel} 2>&1)\"; \
         echo \"token: $TOKEN\"; \
         echo \"ca: $(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/mvm-run-ca.pem) certificate, $(cat /etc/ssl/certs/mvm-run-ca.pem /etc/ssl/certs/ca-certificates.crt | grep -c 'PRIVATE KEY') key lines\"; \
         echo \"ca sum: $(sha256sum </etc/ssl/certs/mvm-run-ca.pem | cut -c1-64)\"; \
         dmesg >/tmp/dmesg.txt 2>&1; \
         python3 -c {scan} {} {} {} {}",
        quote(REAL.0),
        quote(REAL.1),
        quote(CONTROL.0),
        quote(CONTROL.1),
        tunnel = quote(TUNNEL),
        node = quote(NODE),
        scan = quote(SCAN),
    );
    // After the run: what the server got, the net log, a host-side search
    // (with its control), and a second run: its own CA, and a server
    // that does not verify without --upstream-ca.
    let after = format!(
        "echo \"requests: $(grep -ci '^authorization: Bearer {real}$' /run/tmp/peers/requests.log)\"; \
         echo \"body arrived: $(grep -c '^body: body mvm-secret-' /run/tmp/peers/requests.log)\"; \
         echo \"net log holds it: $(grep -c '{real}' /run/tmp/net.log)\"; \
         echo \"host control: $(grep -rl hello-over-tls /run/tmp | head -n 1)\"; \
         echo \"host holds it: $(grep -rl '{real}' /run/tmp /run/home 2>/dev/null | grep -v -e /peers/requests.log -e /watch.txt | head -n 3 | paste -sd' ')\"; \
         echo \"session dir: $(sort -u /run/tmp/watch.txt | paste -sd' ')\"; \
         cat /run/tmp/net.log; \
         /mvm/bin/mvm run --image default --no-workspace --secret TOKEN=env:MVM_TEST_TOKEN@api.test:8443 \
            --upstream-ca /run/peer/etc/ssl/certs/ca-certificates.crt \
            --allow 127.0.0.1:8443 -- sh -c 'echo \"second ca sum: $(sha256sum </etc/ssl/certs/mvm-run-ca.pem | cut -c1-64)\"; \
            echo \"unverified: $(curl -sS -v https://api.test:8443/echo 2>&1 | grep -i \"^< x-mvm-error\" | tr -d \"\\r\")\"'"
    );
    let control_env = format!("CONTROL={control}");
    let mut args = vec![
        "run",
        "--image",
        "default",
        "--no-workspace",
        "--root",
        "--console",
        "--mount",
        "/run/tmp/peers/pub:/peers:ro",
    ];
    args.extend_from_slice(PEER_SECRET_ARGS);
    args.extend_from_slice(&[
        "--env",
        &control_env,
        "--net-log",
        "/run/tmp/net.log",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let r = mvm_with(
        &Options {
            setup: Some(SETUP),
            after: Some(&after),
            testhost_timeout: Some(400),
            env: &[("MVM_TEST_TOKEN", &real)],
            ..Options::default()
        },
        &args,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = r.stdout.as_str();
    let want = format!("ok {}", sha256_hex(&format!("Bearer {real}")));
    let placeholder = field(out, "token");
    assert!(placeholder.starts_with("mvm-secret-"), "{out}");

    // The bound host got the real value, over HTTP/1.1 and HTTP/2, from
    // curl, Python and git; the guest got only its hash back.
    assert_eq!(field(out, "curl"), want, "{out}");
    assert_eq!(field(out, "h2"), "2", "{out}");
    assert_eq!(field(out, "urllib"), want, "{out}");
    assert_eq!(field(out, "node"), want, "{out}");
    assert_eq!(field(out, "git"), "cloned-over-https", "{out}");
    // Bodies are never rewritten: the body arrives with the placeholder.
    assert_eq!(
        field(out, "body"),
        format!("ok {}", sha256_hex("")),
        "{out}"
    );

    // Leaks: the URL (even to the bound host), a plain-HTTP header and
    // URL to another allowed host, a plain tunnel's bytes.
    assert!(
        field(out, "url").contains("secret TOKEN was sent in the URL"),
        "{out}"
    );
    for key in ["plain header", "plain url"] {
        assert!(
            field(out, key)
                .contains("secret TOKEN was sent in a request the proxy does not intercept"),
            "{key}: {out}"
        );
    }
    let tunnel = field(out, "tunnel");
    assert!(
        // Cut: end of stream, or a reset (a connection closed with bytes
        // unread is reset); never the sink's count.
        tunnel.starts_with("HTTP/1.1 200")
            && (tunnel.ends_with("sink answered: b''")
                || tunnel.contains("sink answered: reset (")),
        "the sink never answered a count: {out}"
    );

    // The guest holds only the certificate of the run's CA, never a key.
    assert_eq!(field(out, "ca"), "1 certificate, 0 key lines", "{out}");

    // The search: the control is found, the real value nowhere.
    assert_ne!(
        field(out, "control"),
        "none",
        "the search cannot see: {out}"
    );
    assert!(field(out, "control").contains(":environ"), "{out}");
    assert_eq!(
        field(out, "real"),
        "none",
        "the real value is in the guest: {out}"
    );
    let scanned: u32 = field(out, "scanned").parse().unwrap();
    assert!(scanned >= 3, "{out}");
    // Nor in anything mvm printed, the guest console included.
    assert!(!r.stdout.contains(&real) && !r.stderr.contains(&real));

    let after = r.after_lines().join("\n");
    // curl, curl --http2, urllib and Node sent it to /echo once each
    // (git's requests, to /git/, are in the net log below).
    assert_eq!(field(&after, "requests"), "4", "{after}");
    assert_eq!(field(&after, "body arrived"), "1", "{after}");
    assert_eq!(field(&after, "net log holds it"), "0", "{after}");
    assert!(
        field(&after, "host control").ends_with("index.html"),
        "the host-side search cannot see: {after}"
    );
    assert_eq!(field(&after, "host holds it"), "", "{after}");
    // The live session directory, watched during the run: its CA file
    // was seen (the control), the value never.
    let session = field(&after, "session dir");
    assert!(session.contains("certificate egress-ca.pem"), "{after}");
    assert!(
        !session.contains("value "),
        "the value is in the session directory: {after}"
    );
    let log: Vec<serde_json::Value> = r
        .after_lines()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let substituted = log
        .iter()
        .filter(|e| e["secrets"] == serde_json::json!(["TOKEN in authorization"]))
        .count();
    // The four above, and git's at least twice (info/refs, upload-pack).
    assert!(substituted >= 6, "{log:?}");
    let leaks = log
        .iter()
        .filter(|e| e["rule"] == "placeholder leak" && e["decision"] == "denied")
        .count();
    assert_eq!(leaks, 4, "URL, plain header, plain URL, tunnel: {log:?}");

    // The second run: another CA; trusting Debian's public roots only
    // (the test host has no bundle of its own), the peer's certificate
    // does not verify, and the client is told why.
    assert_ne!(
        field(&after, "second ca sum"),
        field(out, "ca sum"),
        "{after}"
    );
    let unverified = field(&after, "unverified");
    assert!(
        unverified.contains("TLS with the real server failed: invalid peer certificate"),
        "{after}"
    );
}
