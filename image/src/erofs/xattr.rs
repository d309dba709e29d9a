//! Inline xattrs: an ibody header and entries right after the inode. A
//! name is stored as a prefix index plus the rest of the name, so only the
//! namespaces EROFS has an index for can be stored (without the long-prefix
//! feature): user., trusted., security. (security.capability included) and
//! the two POSIX ACLs. Other namespaces are dropped (see `encodable`).

use super::format::XATTR_HEADER;
use crate::flatten::tree::Xattr;

const INDEX_USER: u8 = 1;
const INDEX_ACL_ACCESS: u8 = 2;
const INDEX_ACL_DEFAULT: u8 = 3;
const INDEX_TRUSTED: u8 = 4;
const INDEX_SECURITY: u8 = 6;

/// The prefix index and the rest of the name, or None for a namespace
/// EROFS cannot index.
fn split(name: &[u8]) -> Option<(u8, &[u8])> {
    match name {
        b"system.posix_acl_access" => return Some((INDEX_ACL_ACCESS, b"")),
        b"system.posix_acl_default" => return Some((INDEX_ACL_DEFAULT, b"")),
        _ => {}
    }
    for (prefix, index) in [
        (&b"user."[..], INDEX_USER),
        (b"trusted.", INDEX_TRUSTED),
        (b"security.", INDEX_SECURITY),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return Some((index, rest));
        }
    }
    None
}

/// Whether an xattr can go into the image: an indexed namespace, a name
/// rest of 1..=255 bytes (the ACLs have an empty rest) and a value that
/// fits e_value_size.
pub(crate) fn encodable(name: &[u8], value: &[u8]) -> bool {
    match split(name) {
        Some((i, rest)) => {
            let rest_ok = if i == INDEX_ACL_ACCESS || i == INDEX_ACL_DEFAULT {
                rest.is_empty()
            } else {
                !rest.is_empty() && rest.len() <= 255
            };
            rest_ok && value.len() <= u16::MAX as usize
        }
        None => false,
    }
}

fn entry_size(rest: &[u8], value: &[u8]) -> u64 {
    (4 + rest.len() as u64 + value.len() as u64).next_multiple_of(4)
}

/// Bytes of the ibody (header and entries), 0 without xattrs. Callers only
/// pass encodable xattrs.
pub(crate) fn ibody_size(xattrs: &[Xattr]) -> u64 {
    if xattrs.is_empty() {
        return 0;
    }
    XATTR_HEADER
        + xattrs
            .iter()
            .map(|(n, v)| entry_size(split(n).map_or(&[][..], |s| s.1), v))
            .sum::<u64>()
}

/// i_xattr_icount for an ibody of `size` bytes: one for the header, then
/// one per 4 bytes.
pub(crate) fn icount(size: u64) -> u16 {
    if size == 0 {
        0
    } else {
        (1 + (size - XATTR_HEADER) / 4) as u16
    }
}

pub(crate) fn encode(out: &mut Vec<u8>, xattrs: &[Xattr]) {
    if xattrs.is_empty() {
        return;
    }
    // h_name_filter 0 (the filter feature is off), no shared xattrs.
    out.extend_from_slice(&[0u8; XATTR_HEADER as usize]);
    for (name, value) in xattrs {
        let (index, rest) = split(name).expect("only encodable xattrs reach the writer");
        let start = out.len();
        out.push(rest.len() as u8);
        out.push(index);
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(rest);
        out.extend_from_slice(value);
        let size = entry_size(rest, value) as usize;
        out.resize(start + size, 0);
    }
}
