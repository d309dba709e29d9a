//! The DNS messages the resolver needs, and nothing more: one question
//! (A or AAAA) out, the addresses of the answer section back. Every read
//! of a reply is bounds-checked; a reply that does not fit is an error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// A recursive query for `name` (already a valid host name).
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00]); // RD
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Addrs(Vec<IpAddr>),
    NoSuchName,
    Failed(String),
}

/// Not a reply to query `id` (a stray or forged datagram): None.
pub fn parse(msg: &[u8], id: u16, qtype: u16) -> Option<Answer> {
    let mut r = Reader { msg, pos: 0 };
    if r.u16()? != id {
        return None;
    }
    let flags = r.u16()?;
    if flags & 0x8000 == 0 {
        return None;
    }
    let (qd, an) = (r.u16()?, r.u16()?);
    r.skip(4)?;
    let rcode = flags & 0x000f;
    if rcode == 3 {
        return Some(Answer::NoSuchName);
    }
    if rcode != 0 {
        return Some(Answer::Failed(format!(
            "the DNS server answered with error code {rcode}"
        )));
    }
    if flags & 0x0200 != 0 && an == 0 {
        return Some(Answer::Failed("the DNS answer was truncated".into()));
    }
    for _ in 0..qd {
        r.name()?;
        r.skip(4)?;
    }
    let mut addrs = Vec::new();
    for _ in 0..an {
        r.name()?;
        let (rtype, class) = (r.u16()?, r.u16()?);
        r.skip(4)?;
        let len = usize::from(r.u16()?);
        let data = r.take(len)?;
        // CNAMEs on the way are skipped: their targets' records follow.
        if class != CLASS_IN || rtype != qtype {
            continue;
        }
        match (rtype, data.len()) {
            (TYPE_A, 4) => addrs.push(IpAddr::V4(Ipv4Addr::new(
                data[0], data[1], data[2], data[3],
            ))),
            (TYPE_AAAA, 16) => {
                let b: [u8; 16] = data.try_into().ok()?;
                addrs.push(IpAddr::V6(Ipv6Addr::from(b)));
            }
            _ => return Some(Answer::Failed("a malformed address record".into())),
        }
    }
    Some(Answer::Addrs(addrs))
}

struct Reader<'a> {
    msg: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.msg.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    /// Skips a name: labels up to a zero, or up to a compression pointer.
    fn name(&mut self) -> Option<()> {
        for _ in 0..128 {
            let len = self.take(1)?[0];
            match len {
                0 => return Some(()),
                l if l & 0xc0 == 0xc0 => return self.skip(1),
                l if l & 0xc0 == 0 => self.skip(usize::from(l))?,
                _ => return None,
            }
        }
        None
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A reply to `q` with these address records (and a CNAME first, as
    /// recursive servers send for aliases), for this and other tests.
    pub fn reply(q: &[u8], rcode: u8, addrs: &[IpAddr]) -> Vec<u8> {
        let mut out = q.to_vec();
        out[2] = 0x81;
        out[3] = 0x80 | rcode;
        let qtype = u16::from_be_bytes([q[q.len() - 4], q[q.len() - 3]]);
        let records: Vec<&IpAddr> = addrs
            .iter()
            .filter(|a| (a.is_ipv4() && qtype == TYPE_A) || (a.is_ipv6() && qtype == TYPE_AAAA))
            .collect();
        out[6..8].copy_from_slice(&(records.len() as u16 + 1).to_be_bytes());
        // CNAME: name pointer to the question, target "x".
        out.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 3, 1, b'x', 0]);
        for a in records {
            out.extend_from_slice(&[0xc0, 12]);
            out.extend_from_slice(&qtype.to_be_bytes());
            out.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
            let data = match a {
                IpAddr::V4(v) => v.octets().to_vec(),
                IpAddr::V6(v) => v.octets().to_vec(),
            };
            out.extend_from_slice(&(data.len() as u16).to_be_bytes());
            out.extend_from_slice(&data);
        }
        out
    }

    #[test]
    fn queries_and_answers_round_trip() {
        let q = query(0x1234, "www.example.org", TYPE_A);
        assert_eq!(&q[12..17], b"\x03www\x07");
        let v4: IpAddr = "93.184.216.34".parse().unwrap();
        let v6: IpAddr = "2606:2800::1".parse().unwrap();
        let r = reply(&q, 0, &[v4, v6]);
        assert_eq!(parse(&r, 0x1234, TYPE_A), Some(Answer::Addrs(vec![v4])));
        let q6 = query(7, "www.example.org", TYPE_AAAA);
        assert_eq!(
            parse(&reply(&q6, 0, &[v4, v6]), 7, TYPE_AAAA),
            Some(Answer::Addrs(vec![v6]))
        );
        assert_eq!(
            parse(&reply(&q, 3, &[]), 0x1234, TYPE_A),
            Some(Answer::NoSuchName)
        );
        assert!(matches!(
            parse(&reply(&q, 2, &[]), 0x1234, TYPE_A),
            Some(Answer::Failed(_))
        ));
        assert_eq!(parse(&r, 0x4321, TYPE_A), None, "another id");
        assert_eq!(parse(&q, 0x1234, TYPE_A), None, "a query, not a reply");
    }

    #[test]
    fn truncated_or_hostile_replies_are_errors_not_panics() {
        let q = query(1, "a.test", TYPE_A);
        let r = reply(&q, 0, &["1.2.3.4".parse().unwrap()]);
        for n in 0..r.len() {
            let _ = parse(&r[..n], 1, TYPE_A);
        }
        // Every byte flipped, one at a time.
        for i in 0..r.len() {
            let mut m = r.clone();
            m[i] ^= 0xff;
            let _ = parse(&m, 1, TYPE_A);
        }
        // A name that never ends.
        let mut m = r[..12].to_vec();
        m[4..6].copy_from_slice(&[0, 1]);
        m.extend(std::iter::repeat_n([1u8, b'a'], 2000).flatten());
        assert_eq!(parse(&m, 1, TYPE_A), None);
    }
}
