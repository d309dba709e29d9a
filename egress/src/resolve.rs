//! Host names resolved on the host, by the proxy itself, without libc:
//! getaddrinfo in a static glibc binary loads NSS modules at run time, and
//! once confined the proxy can open no file at all. So the configuration
//! (`/etc/resolv.conf`'s nameservers, `/etc/hosts`, `--resolve` entries)
//! is read at start, before confinement, and lookups are DNS over UDP to
//! those nameservers (A and AAAA, no search list, no cache: one lookup per
//! request, and the proxy connects to the address it checked).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::FromRawFd;
use std::time::Duration;

use crate::dns_wire::{self, Answer, TYPE_A, TYPE_AAAA};

#[derive(Debug, Default, Clone)]
pub struct Resolver {
    /// `--resolve NAME=ADDR` and /etc/hosts, in that order of precedence.
    pub fixed: HashMap<String, Vec<IpAddr>>,
    pub nameservers: Vec<SocketAddr>,
    pub timeout: Duration,
}

/// glibc's default when resolv.conf names none.
const DEFAULT_NAMESERVER: &str = "127.0.0.1:53";
const MAX_NAMESERVERS: usize = 3;

/// `nameserver` lines of a resolv.conf.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        })
        // A zone index (fe80::1%eth0) cannot be used here; such lines are skipped.
        .filter_map(|w| w.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .take(MAX_NAMESERVERS)
        .collect();
    if out.is_empty() {
        out.push(DEFAULT_NAMESERVER.parse().expect("a valid address"));
    }
    out
}

/// An /etc/hosts file: name → addresses, in file order.
pub fn parse_hosts(text: &str) -> HashMap<String, Vec<IpAddr>> {
    let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(Ok(ip)) = words.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        for name in words {
            if let Some(name) = crate::pattern::host_name(name) {
                let v = map.entry(name).or_default();
                if !v.contains(&ip) {
                    v.push(ip);
                }
            }
        }
    }
    map
}

impl Resolver {
    /// IPv4 first (a host without IPv6 routes fails fast on v6 anyway).
    pub async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        if let Some(addrs) = self.fixed.get(name) {
            return Ok(addrs.clone());
        }
        let lookup = async {
            let mut last = format!("no DNS server answered for {name}");
            for &ns in &self.nameservers {
                let (a, aaaa) = tokio::join!(ask(ns, name, TYPE_A), ask(ns, name, TYPE_AAAA));
                match (a, aaaa) {
                    (Ok(Answer::NoSuchName), _) | (_, Ok(Answer::NoSuchName)) => {
                        return Err(format!("{name}: no such host"))
                    }
                    (Ok(Answer::Addrs(mut v4)), Ok(Answer::Addrs(v6))) => {
                        v4.extend(v6);
                        if v4.is_empty() {
                            return Err(format!("{name} has no address"));
                        }
                        return Ok(v4);
                    }
                    (Ok(Answer::Addrs(v)), _) | (_, Ok(Answer::Addrs(v))) if !v.is_empty() => {
                        return Ok(v)
                    }
                    (Ok(Answer::Failed(e)), _) | (_, Ok(Answer::Failed(e))) => last = e,
                    (Err(e), _) | (_, Err(e)) => last = format!("DNS server {ns}: {e}"),
                }
            }
            Err(format!("cannot resolve {name}: {last}"))
        };
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "cannot resolve {name}: no DNS answer within {:?}",
                self.timeout
            )),
        }
    }
}

/// One question to one server over UDP, the reply matched by id.
async fn ask(ns: SocketAddr, name: &str, qtype: u16) -> io::Result<Answer> {
    let socket = tokio::net::UdpSocket::from_std(udp_socket(ns)?)?;
    let id = random_id();
    socket.send(&dns_wire::query(id, name, qtype)).await?;
    let mut buf = vec![0u8; 1500];
    loop {
        let n = socket.recv(&mut buf).await?;
        if let Some(answer) = dns_wire::parse(&buf[..n], id, qtype) {
            return Ok(answer);
        }
    }
}

/// A UDP socket connected to `ns`, made without bind(2) (connect picks
/// the local port), which the proxy's seccomp filter does not allow.
fn udp_socket(ns: SocketAddr) -> io::Result<UdpSocket> {
    let family = if ns.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and nothing else owns it.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    socket.connect(ns)?;
    Ok(socket)
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom(2) into a local buffer of the length given.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    u16::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns_wire::tests::reply;

    #[test]
    fn resolv_conf_and_hosts_are_read_as_libc_does() {
        let ns = parse_resolv_conf("# c\nsearch example.org\nnameserver 10.0.0.2\nnameserver ::1\nnameserver fe80::1%eth0\noptions ndots:2\n");
        assert_eq!(
            ns,
            vec!["10.0.0.2:53".parse().unwrap(), "[::1]:53".parse().unwrap()]
        );
        assert_eq!(parse_resolv_conf(""), vec!["127.0.0.1:53".parse().unwrap()]);
        let hosts = parse_hosts("127.0.0.1 localhost\n::1 localhost ip6-localhost # x\n# 1.2.3.4 gone\n10.0.0.9 Db.Internal db\nbad line\n");
        assert_eq!(
            hosts["localhost"],
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(
            hosts["db.internal"],
            vec!["10.0.0.9".parse::<IpAddr>().unwrap()]
        );
        assert!(!hosts.contains_key("gone"));
    }

    /// A DNS server on 127.0.0.1 answering `a.test` and NXDOMAIN otherwise.
    fn fake_server() -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let q = &buf[..n];
                let known = q.windows(7).any(|w| w == b"\x01a\x04test");
                let r = if known {
                    reply(
                        q,
                        0,
                        &["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()],
                    )
                } else {
                    reply(q, 3, &[])
                };
                let _ = s.send_to(&r, from);
            }
        });
        addr
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn lookups_go_to_the_nameserver_and_fixed_entries_win() {
        let mut r = Resolver {
            nameservers: vec![fake_server()],
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        r.fixed
            .insert("b.test".into(), vec!["127.0.0.1".parse().unwrap()]);
        let rt = runtime();
        let got = rt.block_on(r.resolve("a.test")).unwrap();
        assert_eq!(
            got,
            vec![
                "192.0.2.7".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        let e = rt.block_on(r.resolve("nope.test")).unwrap_err();
        assert_eq!(e, "nope.test: no such host");
        assert_eq!(
            rt.block_on(r.resolve("b.test")).unwrap(),
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn a_silent_nameserver_is_a_timeout_not_a_hang() {
        // Bound but never answering.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = Resolver {
            nameservers: vec![silent.local_addr().unwrap()],
            timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let start = std::time::Instant::now();
        let e = runtime().block_on(r.resolve("a.test")).unwrap_err();
        assert!(e.contains("no DNS answer within"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
