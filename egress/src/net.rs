//! An address range (`10.0.0.0/8`, `fc00::/7`, one address as /32 or /128)
//! and the canonical form every address is checked in: an IPv4-mapped IPv6
//! address (`::ffff:127.0.0.1`) is the IPv4 address it carries, so no rule
//! or range can be stepped around by spelling an address the other way.

use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    pub addr: IpAddr,
    pub prefix: u8,
}

pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

impl Net {
    /// `addr/prefix`, the host bits cleared; None where the prefix is too long.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Net> {
        let addr = canonical(addr);
        let (value, width) = bits(addr);
        if prefix > width {
            return None;
        }
        let masked = value & mask(prefix, width);
        let addr = match addr {
            IpAddr::V4(_) => IpAddr::V4((masked as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(masked.into()),
        };
        Some(Net { addr, prefix })
    }

    pub fn host(addr: IpAddr) -> Net {
        let addr = canonical(addr);
        Net {
            addr,
            prefix: bits(addr).1,
        }
    }

    /// Parses `ADDR` or `ADDR/PREFIX`.
    pub fn parse(s: &str) -> Option<Net> {
        match s.split_once('/') {
            None => s.parse().ok().map(Net::host),
            Some((a, p)) => {
                let prefix: u8 = p.parse().ok()?;
                if p.starts_with('+') || (p.len() > 1 && p.starts_with('0')) {
                    return None;
                }
                Net::new(a.parse().ok()?, prefix)
            }
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        let (value, width) = bits(ip);
        let (base, base_width) = bits(self.addr);
        width == base_width && value & mask(self.prefix, width) == base
    }

    /// Every address of `other` is in this range.
    pub fn covers(&self, other: &Net) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    pub fn is_single(&self) -> bool {
        self.prefix == bits(self.addr).1
    }
}

fn mask(prefix: u8, width: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        let all = if width == 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        all & !((1u128 << (width - prefix)) - 1) & all
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if self.is_single() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_contain_what_they_should() {
        let ten = Net::parse("10.0.0.0/8").unwrap();
        assert!(ten.contains("10.255.1.2".parse().unwrap()));
        assert!(!ten.contains("11.0.0.1".parse().unwrap()));
        assert!(ten.contains("::ffff:10.1.1.1".parse().unwrap()), "mapped");
        assert!(!ten.contains("::a01:101".parse().unwrap()), "not mapped");
        let ula = Net::parse("fc00::/7").unwrap();
        assert!(ula.contains("fd00:ec2::254".parse().unwrap()));
        assert!(!ula.contains("fe80::1".parse().unwrap()));
        assert_eq!(Net::parse("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
        assert!(Net::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!(!Net::parse("0.0.0.0/0")
            .unwrap()
            .contains("::1".parse().unwrap()));
        assert!(Net::parse("::/0").unwrap().contains("::1".parse().unwrap()));
        assert!(Net::parse("10.0.0.0/33").is_none());
        assert!(Net::parse("10.0.0.0/08").is_none());
        assert!(Net::parse("10.0.0/8").is_none());
        assert!(ten.covers(&Net::parse("10.1.0.0/16").unwrap()));
        assert!(!Net::parse("10.1.0.0/16").unwrap().covers(&ten));
    }
}
