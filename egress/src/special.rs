//! Addresses a name must never quietly lead to: the host itself, its
//! private networks, link-local and the cloud metadata service. A public
//! name that resolves to one of these (DNS rebinding, or an internal name
//! in the host's DNS) is refused unless the address or a range inside the
//! class is allowed by an explicit IP rule; `--allow 0.0.0.0/0` does not
//! count, it means "the internet".

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use crate::net::{canonical, Net};

/// One class, most specific first (metadata before link-local).
pub struct Class {
    pub kind: &'static str,
    pub range: Net,
}

fn classes() -> &'static [Class] {
    static CLASSES: OnceLock<Vec<Class>> = OnceLock::new();
    CLASSES.get_or_init(|| {
        [
            ("cloud metadata", "169.254.169.254/32"),
            ("cloud metadata", "fd00:ec2::254/128"),
            ("loopback", "127.0.0.0/8"),
            ("loopback", "::1/128"),
            // Connecting to 0.0.0.0 or :: reaches the host itself on Linux.
            ("unspecified", "0.0.0.0/8"),
            ("unspecified", "::/128"),
            ("private", "10.0.0.0/8"),
            ("private", "172.16.0.0/12"),
            ("private", "192.168.0.0/16"),
            ("private", "fc00::/7"),
            ("CGNAT", "100.64.0.0/10"),
            ("link-local", "169.254.0.0/16"),
            ("link-local", "fe80::/10"),
            ("multicast or reserved", "224.0.0.0/3"),
        ]
        .iter()
        .map(|&(kind, range)| Class {
            kind,
            range: Net::parse(range).expect("a valid built-in range"),
        })
        .collect()
    })
}

/// The class `ip` is in, if any. NAT64 addresses (64:ff9b::/96) are
/// classed by the IPv4 address they embed, since a NAT64 gateway on the
/// host's network would deliver them there.
pub fn class_of(ip: IpAddr) -> Option<&'static Class> {
    let ip = match canonical(ip) {
        IpAddr::V6(v6) if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => {
            let o = v6.octets();
            IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        other => other,
    };
    classes().iter().find(|c| c.range.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_recognised() {
        let cases = [
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("0.0.0.0", Some("unspecified")),
            ("::", Some("unspecified")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("fd12::1", Some("private")),
            ("100.64.0.1", Some("CGNAT")),
            ("100.127.255.255", Some("CGNAT")),
            ("100.128.0.1", None),
            ("169.254.169.254", Some("cloud metadata")),
            ("fd00:ec2::254", Some("cloud metadata")),
            ("169.254.1.1", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("64:ff9b::a00:1", Some("private")),
            ("64:ff9b::808:808", None),
            ("239.1.1.1", Some("multicast or reserved")),
            ("93.184.216.34", None),
            ("8.8.8.8", None),
            ("2606:4700::1111", None),
        ];
        for (ip, want) in cases {
            let got = class_of(ip.parse().unwrap()).map(|c| c.kind);
            assert_eq!(got, want, "{ip}");
        }
    }
}
