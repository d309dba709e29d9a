//! Check 3: phoning home. The guest has no network device and its kernel
//! no IP stack; the only host/guest channel is vsock, opened by the host,
//! and the VMM refuses every connection the guest starts.

use crate::battery::{attack_scripted, attacker, code, excerpt, script, Check, Source, Verdict};

/// vsock ports the guest tries on the host (CID 2): the agent's own port,
/// its neighbours, and some a host might serve.
const VSOCK_PORTS: [u32; 8] = [1, 22, 80, 1023, 1024, 1025, 2049, 9999];

/// What the guest kernel says to an AF_INET socket(2) without an IPv4 stack.
const NO_INET: &str = ": socket: Address family not supported by protocol";

/// What a guest-initiated vsock connect gets: the VMM answers the request
/// with a reset (a connect the VMM ignored would time out instead, and one
/// to a CID nobody serves would be unreachable).
const VSOCK_RESET: &str = ": connect: Connection reset by peer";

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_3_no_network_and_no_guest_initiated_vsock() {
    let mut check = Check::new(
        "3",
        "phone home: list network interfaces and routes, make TCP sockets (to 127.0.0.1:7777 and 10.0.2.2:80), vsock connect to the host (CID 2) on 8 ports including the agent's 1024",
        "no interface but lo (or none), no route; socket(AF_INET) fails with EAFNOSUPPORT (the guest kernel has no IPv4 at all, so no listener anywhere could be reached); every vsock connect is reset by the VMM (ECONNRESET); the same attacker does make a TCP socket on the test host (control)",
    )
    .evidence(Source::Guest, "the guest's interface and route lists, and the error each socket and connect call returned to the command")
    .control(Source::Host, "the same attacker run on the test host gets past socket(AF_INET) to a connect error, so its report tells the two apart (setup script)");
    let attacker = attacker();
    // On the test host, nothing listening: the probe makes its socket and
    // is refused at connect, which is what "the socket cannot even be
    // made" in the guest is told apart from.
    let setup = script(&format!(
        r#"
echo "host control: $({attacker} inet 127.0.0.1 7777)"
"#
    ));
    let vsock: Vec<String> = VSOCK_PORTS
        .iter()
        .map(|p| format!("/workspace/{attacker} vsock 2 {p}"))
        .collect();
    let guest = format!(
        r#"
echo "interfaces: $(ls -A /sys/class/net 2>&1 | tr '\n' ' ')"
echo "routes: $(cat /proc/net/route 2>&1 | tr '\n' ' ')"
/workspace/{attacker} inet 127.0.0.1 7777
/workspace/{attacker} inet 10.0.2.2 80
{}
true
"#,
        vsock.join("\n")
    );
    let run = check.run(|| attack_scripted(&setup, "true", &["--", "sh", "-c", &guest]));
    let mut v = Verdict::new();
    let out = &run.stdout;
    v.saw(format!("exit {}", code(&run)));
    let interfaces = out
        .lines()
        .find_map(|l| l.strip_prefix("interfaces: "))
        .unwrap_or("(missing)")
        .trim();
    v.saw(format!("interfaces: [{interfaces}]"));
    v.require(
        interfaces.is_empty() || interfaces == "lo",
        format!("a network interface: {interfaces}"),
    );
    let routes = out
        .lines()
        .find_map(|l| l.strip_prefix("routes: "))
        .unwrap_or("");
    v.saw(format!("routes: {}", excerpt(routes, 60)));
    v.require(
        !routes.contains("Iface"),
        "a routing table exists in the guest",
    );
    let inet: Vec<&str> = out.lines().filter(|l| l.starts_with("inet ")).collect();
    v.saw(format!("tcp: {}", excerpt(&inet.join("\n"), 160)));
    v.require(
        inet.len() == 2 && inet.iter().all(|l| l.ends_with(NO_INET)),
        format!(
            "socket(AF_INET) did not fail with EAFNOSUPPORT: {}",
            excerpt(&inet.join("\n"), 200)
        ),
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
        host.contains(": connect: "),
        "the attacker could not make a TCP socket on the test host either (control)",
    );
    check.finish(v);
}
