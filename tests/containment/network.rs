//! Check 3: phoning home. The guest has no network device: its kernel
//! has IPv4 and IPv6 with only `lo`, so a connect to any address but its
//! own loopback fails at once; the only host/guest channel is vsock,
//! opened by the host, and the VMM refuses every connection the guest
//! starts.

use crate::battery::{attack_scripted, attacker, code, excerpt, script, Check, Source, Verdict};

/// vsock ports the guest tries on the host (CID 2): the agent's own port,
/// its neighbours, and some a host might serve.
const VSOCK_PORTS: [u32; 8] = [1, 22, 80, 1023, 1024, 1025, 2049, 9999];

/// Addresses outside the guest: the usual NAT gateway, a public resolver,
/// a private LAN, the test host's own QEMU user network, IPv6 documentation
/// and global addresses.
const OUTSIDE: [(&str, u16); 6] = [
    ("10.0.2.2", 80),
    ("1.1.1.1", 443),
    ("192.168.1.1", 80),
    ("172.17.0.1", 2375),
    ("2001:db8::1", 80),
    ("2606:4700:4700::1111", 443),
];

/// What a connect to an address with no route gets from the guest kernel.
const UNREACHABLE: &str = ": connect: Network is unreachable";

/// "At once": a connect that waited for an answer would take seconds (a
/// SYN timeout, minutes); failing for want of a route takes no time. The
/// bound is generous for the emulated test host.
const AT_ONCE_MS: u64 = 1000;

/// The port the test host listens on (control) and the guest's loopback
/// does not: the guest's 127.0.0.1 is its own.
const HOST_PORT: u16 = 7777;
/// The port the command itself listens on in the guest (loopback works).
const GUEST_PORT: u16 = 7778;

/// What a guest-initiated vsock connect gets: the VMM answers the request
/// with a reset (a connect the VMM ignored would time out instead, and one
/// to a CID nobody serves would be unreachable).
const VSOCK_RESET: &str = ": connect: Connection reset by peer";

/// The milliseconds at the end of an attacker `inet` failure line.
fn connect_ms(line: &str) -> Option<u64> {
    line.rsplit_once(" (")?.1.strip_suffix(" ms)")?.parse().ok()
}

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_3_no_network_and_no_guest_initiated_vsock() {
    let mut check = Check::new(
        "3",
        "phone home: list network interfaces and routes, TCP connect to 6 addresses outside the VM (IPv4 and IPv6) and to 127.0.0.1:7777, where the test host listens; vsock connect to the host (CID 2) on 8 ports including the agent's 1024",
        "no interface but lo, no route; every outside connect fails at once (ENETUNREACH within 1 s); 127.0.0.1:7777 is refused (the guest's loopback is its own); a server the command starts on 127.0.0.1:7778 is reached (loopback works, so the refusals are not a broken stack); every vsock connect is reset by the VMM (ECONNRESET); the same attacker connects to the test host's 127.0.0.1:7777 (control)",
    )
    .evidence(Source::Guest, "the guest's interface and route lists, and the error and time each connect call returned to the command")
    .control(Source::Host, "the same attacker run on the test host connects to the listener there, so the guest's refusal is the VM's boundary, not the probe (setup script)");
    let attacker = attacker();
    // On the test host a listener on HOST_PORT, which the host control
    // reaches and the guest must not.
    let setup = script(&format!(
        r#"
{attacker} listen {HOST_PORT} >/dev/null 2>&1 &
sleep 0.3
echo "host control: $({attacker} inet 127.0.0.1 {HOST_PORT})"
"#
    ));
    let vsock: Vec<String> = VSOCK_PORTS
        .iter()
        .map(|p| format!("/workspace/{attacker} vsock 2 {p}"))
        .collect();
    let outside: Vec<String> = OUTSIDE
        .iter()
        .map(|(a, p)| format!("/workspace/{attacker} inet {a} {p}"))
        .collect();
    let guest = format!(
        r#"
echo "interfaces: $(ls -A /sys/class/net 2>&1 | tr '\n' ' ')"
echo "routes: $(tail -n +2 /proc/net/route 2>&1 | tr '\n' ' ')"
echo "routes6: $(grep -v ' lo$' /proc/net/ipv6_route 2>&1 | tr '\n' ' ')"
{outside}
/workspace/{attacker} inet 127.0.0.1 {HOST_PORT}
/workspace/{attacker} listen {GUEST_PORT} >/dev/null 2>&1 &
sleep 0.5
echo "guest loopback: $(/workspace/{attacker} inet 127.0.0.1 {GUEST_PORT})"
{vsock}
true
"#,
        outside = outside.join("\n"),
        vsock = vsock.join("\n")
    );
    let run = check.run(|| attack_scripted(&setup, "true", &["--", "sh", "-c", &guest]));
    let mut v = Verdict::new();
    let out = &run.stdout;
    v.saw(format!("exit {}", code(&run)));
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("(missing)")
            .trim()
            .to_string()
    };
    let interfaces = field("interfaces: ");
    v.saw(format!("interfaces: [{interfaces}]"));
    v.require(
        interfaces == "lo",
        format!("interfaces other than lo alone: {interfaces}"),
    );
    let (routes, routes6) = (field("routes: "), field("routes6: "));
    v.saw(format!(
        "routes: [{}] [{}]",
        excerpt(&routes, 60),
        excerpt(&routes6, 60)
    ));
    v.require(
        routes.is_empty() && routes6.is_empty(),
        format!("a route not through lo: {routes} {routes6}"),
    );
    let inet: Vec<&str> = out.lines().filter(|l| l.starts_with("inet ")).collect();
    let out_lines: Vec<&str> = OUTSIDE
        .iter()
        .filter_map(|(a, p)| {
            inet.iter()
                .find(|l| l.starts_with(&format!("inet {a}:{p}:")))
                .copied()
        })
        .collect();
    let slowest = out_lines.iter().filter_map(|l| connect_ms(l)).max();
    v.saw(format!(
        "outside: {} of {} unreachable, slowest {} ms ({})",
        out_lines.iter().filter(|l| l.contains(UNREACHABLE)).count(),
        OUTSIDE.len(),
        slowest.map_or("?".into(), |ms| ms.to_string()),
        excerpt(out_lines.first().unwrap_or(&""), 60)
    ));
    v.require(
        out_lines.len() == OUTSIDE.len()
            && out_lines.iter().all(|l| {
                l.contains(UNREACHABLE) && connect_ms(l).is_some_and(|ms| ms < AT_ONCE_MS)
            }),
        format!(
            "a connect outside the VM did not fail at once as unreachable: {}",
            excerpt(&out_lines.join("\n"), 300)
        ),
    );
    let host_port = inet
        .iter()
        .find(|l| l.starts_with(&format!("inet 127.0.0.1:{HOST_PORT}:")))
        .copied()
        .unwrap_or("(missing)");
    v.saw(format!(
        "guest to 127.0.0.1:{HOST_PORT}: {}",
        excerpt(host_port, 60)
    ));
    v.require(
        host_port.contains(": connect: Connection refused"),
        format!("the guest reached 127.0.0.1:{HOST_PORT} or failed otherwise: {host_port}"),
    );
    let own = field("guest loopback: ");
    v.saw(format!("guest's own server: {own}"));
    v.require(
        own.ends_with(": connected"),
        format!("the command could not reach its own server on 127.0.0.1:{GUEST_PORT}: {own}"),
    );
    let vsock: Vec<&str> = out.lines().filter(|l| l.starts_with("vsock ")).collect();
    let reset = vsock.iter().filter(|l| l.ends_with(VSOCK_RESET)).count();
    v.saw(format!(
        "vsock to the host: {reset} of {} reset by the VMM ({})",
        VSOCK_PORTS.len(),
        excerpt(vsock.first().unwrap_or(&""), 60)
    ));
    v.require(
        vsock.len() == VSOCK_PORTS.len() && reset == VSOCK_PORTS.len(),
        format!(
            "a vsock connect was not reset by the VMM: {}",
            excerpt(&vsock.join("\n"), 300)
        ),
    );
    let setup_lines = run.setup_lines();
    let host = setup_lines
        .iter()
        .find_map(|l| l.strip_prefix("host control: "))
        .unwrap_or("(missing)");
    v.saw(format!("control on the test host: {host}"));
    v.require(
        host.ends_with(": connected"),
        "the attacker could not connect to the test host's own listener (control)",
    );
    check.finish(v);
}

#[test]
fn connect_times_are_read_from_the_attackers_line() {
    assert_eq!(
        connect_ms("inet 1.1.1.1:443: connect: Network is unreachable (0 ms)"),
        Some(0)
    );
    assert_eq!(
        connect_ms("inet ::1:9: connect: Connection refused (12 ms)"),
        Some(12)
    );
    assert_eq!(connect_ms("inet 1.1.1.1:443: connected"), None);
}
