//! Check 3: phoning home. The guest has no network device and its kernel
//! no IP stack; the only host/guest channel is vsock, opened by the host,
//! and the VMM refuses every connection the guest starts.

use crate::battery::{attack_scripted, attacker, code, excerpt, script, Check, Verdict};

/// vsock ports the guest tries on the host (CID 2): the agent's own port,
/// its neighbours, and some a host might serve.
const VSOCK_PORTS: [u32; 8] = [1, 22, 80, 1023, 1024, 1025, 2049, 9999];

#[test]
#[ignore = "containment battery: run by `make battery`"]
fn check_3_no_network_and_no_guest_initiated_vsock() {
    let mut check = Check::new(
        "3",
        "phone home: list network interfaces and routes, TCP connect to a listener on the host (127.0.0.1:7777, and 10.0.2.2:80), vsock connect to the host (CID 2) on 8 ports including the agent's 1024",
        "no interface but lo (or none), no route, the TCP socket cannot even be made, every vsock connect refused; the host's listener counts only the host's own control connection",
    );
    let attacker = attacker();
    // On the test host: loopback up (it boots with it down), a listener
    // logging each connection, and one connection from the host itself:
    // the control that a connection would have been counted.
    let setup = script(&format!(
        r#"
(ifconfig lo 127.0.0.1 up || ip link set lo up) 2>/dev/null
{attacker} listen 7777 >/run/tmp/listener.log 2>&1 </dev/null &
sleep 0.5
echo "host control: $({attacker} inet 127.0.0.1 7777)"
"#
    ));
    let after = script(
        r#"
sleep 0.5
echo "accepted=$(grep -c accepted /run/tmp/listener.log)"
for p in /proc/[0-9]*; do
    [ "$(cat $p/comm 2>/dev/null)" = attacker ] && kill ${p#/proc/}
done
"#,
    );
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
wget -q -T 3 -O - http://10.0.2.2/ 2>&1 | head -n 1 | sed 's/^/wget: /'
{}
true
"#,
        vsock.join("\n")
    );
    let run = check.run(|| attack_scripted(&setup, &after, &["--", "sh", "-c", &guest]));
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
        inet.len() == 2 && inet.iter().all(|l| l.contains(": socket: ")),
        "a TCP socket could be created in the guest",
    );
    let vsock: Vec<&str> = out.lines().filter(|l| l.starts_with("vsock ")).collect();
    let refused = vsock
        .iter()
        .filter(|l| l.contains(": connect: ") && !l.ends_with("connected"))
        .count();
    v.saw(format!(
        "vsock to the host: {refused} of {} refused ({})",
        VSOCK_PORTS.len(),
        excerpt(vsock.first().unwrap_or(&""), 60)
    ));
    v.require(
        vsock.len() == VSOCK_PORTS.len() && refused == VSOCK_PORTS.len(),
        format!(
            "a vsock connection was not refused: {}",
            excerpt(&vsock.join("\n"), 300)
        ),
    );
    let setup_lines = run.setup_lines();
    let host_control = setup_lines
        .iter()
        .any(|l| l.starts_with("host control:") && l.ends_with("connected"));
    let accepted = run
        .after_lines()
        .iter()
        .find_map(|l| l.strip_prefix("accepted="))
        .unwrap_or("?")
        .trim()
        .to_string();
    v.saw(format!(
        "host listener accepted {accepted} (the host's own control connected: {host_control})"
    ));
    v.require(host_control, "the host-side control could not connect");
    v.require(
        accepted == "1",
        format!("the host listener accepted {accepted} connections, not only the control's"),
    );
    check.finish(v);
}
