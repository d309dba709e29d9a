//! One tar entry's metadata: type, mode, owner, time and xattrs, with PAX
//! records taking precedence over the ustar header fields they extend.

use tar::{Entry, EntryType};

use crate::erofs::xattr;
use crate::flatten::tree::{Meta, Xattr};

pub(crate) struct Header {
    pub entry_type: EntryType,
    pub meta: Meta,
    pub size: u64,
    pub major: u32,
    pub minor: u32,
}

pub(crate) fn read<R: std::io::Read>(entry: &mut Entry<'_, R>) -> Result<Header, String> {
    let h = entry.header();
    let entry_type = h.entry_type();
    let num = |r: std::io::Result<u64>, what: &str| r.map_err(|e| format!("bad {what} field: {e}"));
    let perm = (num(h.mode().map(u64::from), "mode")? & 0o7777) as u16;
    let mut uid = num(h.uid(), "uid")?;
    let mut gid = num(h.gid(), "gid")?;
    let mut mtime = num(h.mtime(), "mtime")?;
    let mut mtime_nsec = 0u32;
    let major = h.device_major().ok().flatten().unwrap_or(0);
    let minor = h.device_minor().ok().flatten().unwrap_or(0);
    let size = entry.size();
    let mut xattrs: Vec<Xattr> = Vec::new();
    if let Some(pax) = entry
        .pax_extensions()
        .map_err(|e| format!("bad PAX header: {e}"))?
    {
        for ext in pax {
            let ext = ext.map_err(|e| format!("bad PAX record: {e}"))?;
            let key = ext.key_bytes();
            let value = ext.value_bytes();
            let int = |v: &[u8]| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
            };
            match key {
                b"uid" => uid = int(value).ok_or("bad PAX uid")?,
                b"gid" => gid = int(value).ok_or("bad PAX gid")?,
                b"mtime" => (mtime, mtime_nsec) = pax_time(value).ok_or("bad PAX mtime")?,
                _ => {
                    if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                        // Namespaces EROFS cannot index are dropped (see
                        // erofs::xattr); the ones images use are kept.
                        if xattr::encodable(name, value) {
                            xattrs.retain(|(n, _)| &n[..] != name);
                            xattrs.push((name.into(), value.into()));
                        }
                    }
                }
            }
        }
    }
    xattrs.sort();
    let uid = u32::try_from(uid).map_err(|_| format!("uid {uid} does not fit 32 bits"))?;
    let gid = u32::try_from(gid).map_err(|_| format!("gid {gid} does not fit 32 bits"))?;
    Ok(Header {
        entry_type,
        meta: Meta {
            perm,
            uid,
            gid,
            mtime,
            mtime_nsec,
            xattrs,
        },
        size,
        major,
        minor,
    })
}

/// A PAX time "SECONDS[.FRACTION]"; times before 1970 become 0.
fn pax_time(v: &[u8]) -> Option<(u64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if secs.starts_with('-') {
        return Some((0, 0));
    }
    let secs = secs.parse::<u64>().ok()?;
    let digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nsec = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}").parse::<u32>().ok()?
    };
    Some((secs, nsec))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pax_times() {
        assert_eq!(
            super::pax_time(b"1700000000.5"),
            Some((1700000000, 500_000_000))
        );
        assert_eq!(super::pax_time(b"12"), Some((12, 0)));
        assert_eq!(super::pax_time(b"-5.1"), Some((0, 0)));
        assert_eq!(super::pax_time(b"x"), None);
    }
}
