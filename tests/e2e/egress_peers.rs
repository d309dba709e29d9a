//! Controlled egress against real servers (docs/network.md): the default
//! image's curl, Python, git and pip through the guest's forwarder, the
//! vsock device and the host proxy to servers on the test host's loopback.
//!
//! The test host is busybox only, so `tests/e2e/peers/start.sh` runs the
//! servers from a peer root, the default image's own EROFS file mounted
//! there: Debian's python3 (HTTPS with a test CA that openssl makes, a PEP
//! 503 package index, a TCP sink) and git http-backend (smart HTTP). The
//! guest gets the test CA through `--mount`, never the CA's key.

use mvm_e2e::{field, mvm_with, Options, Run};

/// The peers, the net log's place, and a policy file in TOML allowing the
/// peers' names and, since they resolve to 127.0.0.1, that address too
/// (docs/network.md, DNS rebinding).
const SETUP: &str = "sh tests/e2e/peers/start.sh && rm -f /run/tmp/net.log && \
    printf '%s\\n' '# the suite s peers' \
        'allow = [\"*.test:8443\", \"sink.test:9000\", \"127.0.0.1:8443\", \"127.0.0.1:9000\"]' \
        'deny = [\"other.test:8443\"]' >/run/tmp/peers/policy.toml";

fn run(script: &str, extra: &[&str], after: Option<&str>, timeout: u32) -> Run {
    let mut args = vec![
        "run",
        "--image",
        "default",
        "--no-workspace",
        "--mount",
        "/run/tmp/peers/pub:/peers:ro",
        "--policy",
        "/run/tmp/peers/policy.toml",
        "--net-log",
        "/run/tmp/net.log",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    mvm_with(
        &Options {
            setup: Some(SETUP),
            after,
            testhost_timeout: Some(timeout),
            ..Options::default()
        },
        &args,
    )
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn curl_python_git_and_pip_reach_real_https_servers_through_the_proxy() {
    let r = run(
        "cd /tmp; \
         echo \"curl: $(curl -sS --cacert /peers/ca.pem https://secure.test:8443/index.html 2>&1)\"; \
         echo \"curl without the CA: $(curl -sS https://secure.test:8443/index.html 2>&1 | head -n 1)\"; \
         echo \"urllib: $(python3 -c 'import ssl, urllib.request as u; \
            c = ssl.create_default_context(cafile=\"/peers/ca.pem\"); \
            print(u.urlopen(\"https://secure.test:8443/index.html\", context=c).read().decode().strip())' 2>&1)\"; \
         GIT_SSL_CAINFO=/peers/ca.pem git clone -q https://git.test:8443/git/probe.git probe 2>&1; \
         echo \"git: $(cat probe/README 2>&1) $(git -C probe log --format=%an 2>&1)\"; \
         pip download -q --disable-pip-version-check --no-deps --cert /peers/ca.pem \
            --index-url https://pypi.test:8443/simple/ -d dl mvmprobe==1.0 2>&1 | tail -n 3; \
         echo \"pip: $(sha256sum dl/mvmprobe-1.0-py3-none-any.whl 2>&1 | cut -d' ' -f1)\"; \
         echo \"wheel: $(cat /peers/wheel.sha256)\"; \
         echo \"denied: $(curl -sS -v --cacert /peers/ca.pem https://other.test:8443/index.html 2>&1 | \
            grep -i '^< x-mvm-blocked:' | tr -d '\\r')\"",
        &[],
        Some("cat /run/tmp/net.log"),
        300,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = r.stdout.as_str();
    assert_eq!(field(out, "curl"), "hello-over-tls", "{out}");
    // The tunnel is the server's TLS end to end, not intercepted: without
    // the test CA curl refuses the server's certificate.
    assert!(
        field(out, "curl without the CA").contains("certificate"),
        "{out}"
    );
    assert_eq!(field(out, "urllib"), "hello-over-tls", "{out}");
    assert_eq!(field(out, "git"), "cloned-over-https peer", "{out}");
    let wheel = field(out, "wheel");
    assert_eq!(wheel.len(), 64, "{out}");
    assert_eq!(
        field(out, "pip"),
        wheel,
        "pip fetched the index's wheel: {out}"
    );
    // The policy file's deny rule (TOML) is the proxy's: a 403 with the
    // flag that would allow it, before any tunnel.
    assert!(
        field(out, "denied").contains("other.test:8443 is denied by --deny other.test:8443"),
        "{out}"
    );

    let log: Vec<serde_json::Value> = r
        .after_lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let tunnels = |host: &str| {
        log.iter()
            .filter(|e| e["method"] == "CONNECT" && e["host"] == host && e["decision"] == "allowed")
            .count()
    };
    assert_eq!(tunnels("secure.test"), 3, "curl twice and urllib: {log:?}");
    assert!(tunnels("git.test") >= 1, "{log:?}");
    assert!(tunnels("pypi.test") >= 1, "{log:?}");
    assert!(
        log.iter()
            .filter(|e| e["decision"] == "allowed")
            .all(|e| e["address"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1"))
                && e["bytes_down"].as_u64().is_some_and(|b| b > 0)),
        "{log:?}"
    );
    assert_eq!(
        log.iter()
            .filter(|e| e["decision"] == "denied" && e["host"] == "other.test")
            .count(),
        1,
        "{log:?}"
    );
}

/// The guest's flood: `N` connection attempts to a denied host, 100 at a
/// time (over the vsock device's 64 streams, so some are reset), each
/// answered (a status) or failed visibly (an error name); then `MIB` MiB
/// uploaded through a tunnel to the sink, which answers the count.
const FLOOD: &str = r#"
import asyncio, collections, socket, sys, time
N, MIB = int(sys.argv[1]), int(sys.argv[2])
seen = collections.Counter()
async def attempt(sem):
    async with sem:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", 3128), 60)
            w.write(b"CONNECT flood.test:9000 HTTP/1.1\r\nHost: flood.test:9000\r\n\r\n")
            line = await asyncio.wait_for(r.readline(), 60)
            seen[line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"] += 1
            w.close()
        except Exception as e:
            seen[type(e).__name__] += 1
async def flood():
    sem = asyncio.Semaphore(100)
    await asyncio.gather(*(attempt(sem) for _ in range(N)))
t = time.monotonic()
asyncio.run(flood())
print("flood:", " ".join(f"{k}={v}" for k, v in sorted(seen.items())), f"in {time.monotonic() - t:.1f} s", flush=True)
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT sink.test:9000 HTTP/1.1\r\nHost: sink.test:9000\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
print("tunnel:", head.split(b"\r\n")[0].decode(), flush=True)
block = bytes(1 << 20)
t = time.monotonic()
for _ in range(MIB):
    s.sendall(block)
s.shutdown(socket.SHUT_WR)
count = s.makefile().readline().strip()
took = time.monotonic() - t
print(f"upload: {count} bytes in {took:.1f} s ({MIB / took:.1f} MiB/s)", flush=True)
"#;

/// The flood's size: 2,000 attempts and 256 MiB in `make test`; 10,000 and
/// 1 GiB (issue 12's figures) with `MVM_E2E_FULL_FLOOD=1`. The full size
/// trips a livelock of the test host's own kernel (nested SVM under TCG:
/// QEMU busy, the test host silent) in 6 of 8 calls here
/// (docs/testing.md, "Known test-host hangs"); what is asserted is the same.
fn flood_size() -> (u32, u64) {
    if std::env::var_os("MVM_E2E_FULL_FLOOD").is_some_and(|v| v == "1") {
        (10_000, 1024)
    } else {
        (2_000, 256)
    }
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_flood_and_a_large_upload_leave_the_proxy_bounded() {
    let (attempts, mib) = flood_size();
    let script = format!(
        "python3 -c '{}' {attempts} {mib}; echo \"after: $(curl -sS --cacert /peers/ca.pem https://secure.test:8443/index.html 2>&1)\"",
        FLOOD.replace('\'', "'\\''")
    );
    let r = run(
        &script,
        // Pacing is the proxy's: at the default 100 a second the flood
        // alone would take 100 s of the suite.
        &["--net-rate", "1000", "--print-stats"],
        None,
        600,
    );
    assert_eq!(r.code, Some(0), "mvm exits normally: {}", r.stderr);
    let out = r.stdout.as_str();
    eprintln!("{out}");
    let flood = field(out, "flood");
    let counts: std::collections::HashMap<&str, u64> = flood
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    assert_eq!(
        counts.values().sum::<u64>(),
        u64::from(attempts),
        "every attempt ended: {flood}"
    );
    let refused = counts.get("403").copied().unwrap_or(0);
    assert!(refused > 0, "{flood}");
    assert_eq!(
        field(out, "tunnel"),
        "HTTP/1.1 200 Connection established",
        "{out}"
    );
    assert!(
        field(out, "upload").starts_with(&format!("{} bytes", mib << 20)),
        "the sink got every byte: {out}"
    );
    assert_eq!(
        field(out, "after"),
        "hello-over-tls",
        "the way out still works: {out}"
    );

    // The proxy's own figures: every 403 the guest saw is a logged denial,
    // and its peak memory stayed bounded.
    let stats = r
        .mvm_stderr()
        .lines()
        .find(|l| l.starts_with("mvm: network: ") && l.contains(" requests, "))
        .unwrap_or_else(|| panic!("no network stats line: {}", r.stderr))
        .to_string();
    eprintln!("{stats}");
    let denied: u64 = stats
        .split(", ")
        .find_map(|p| p.strip_suffix(" denied"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert_eq!(denied, refused, "{stats} / {flood}");
    let peak: f64 = stats
        .split("proxy peak memory ")
        .nth(1)
        .and_then(|s| s.strip_suffix(" MiB"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(peak > 0.0 && peak < 64.0, "proxy peak memory {peak} MiB");
}
