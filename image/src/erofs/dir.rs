//! Directory contents: blocks of 12-byte dirents followed by their names,
//! entries sorted by name across the whole directory (the kernel finds a
//! name by binary search over blocks, then within one). A name's length is
//! the gap to the next name's offset; the last name of a block runs to the
//! end of the block's used bytes.

use super::format::{dirent, BLOCK, DIRENT_SIZE};

pub(crate) struct Entry<'a> {
    pub name: &'a [u8],
    pub nid: u64,
    pub file_type: u8,
}

/// Splits sorted names into blocks: the number of entries in each.
fn split<'a>(names: impl Iterator<Item = &'a [u8]>) -> Vec<(usize, u64)> {
    let mut blocks = Vec::new();
    let (mut count, mut used) = (0usize, 0u64);
    for name in names {
        let need = DIRENT_SIZE + name.len() as u64;
        if used + need > BLOCK {
            blocks.push((count, used));
            (count, used) = (0, 0);
        }
        count += 1;
        used += need;
    }
    if count > 0 {
        blocks.push((count, used));
    }
    blocks
}

/// The directory's i_size: whole blocks, then the used part of the last.
pub(crate) fn size<'a>(names: impl Iterator<Item = &'a [u8]>) -> u64 {
    let blocks = split(names);
    match blocks.last() {
        Some(&(_, used)) => (blocks.len() as u64 - 1) * BLOCK + used,
        None => 0,
    }
}

/// The directory's bytes, block by block; every block but the last is
/// padded with zeros to a full block.
pub(crate) fn encode(entries: &[Entry<'_>]) -> Vec<u8> {
    let blocks = split(entries.iter().map(|e| e.name));
    let mut out = Vec::new();
    let mut next = 0;
    let nblocks = blocks.len();
    for (i, (count, _)) in blocks.into_iter().enumerate() {
        let start = out.len();
        let these = &entries[next..next + count];
        next += count;
        let mut nameoff = DIRENT_SIZE * count as u64;
        for e in these {
            dirent(&mut out, e.nid, nameoff as u16, e.file_type);
            nameoff += e.name.len() as u64;
        }
        for e in these {
            out.extend_from_slice(e.name);
        }
        if i + 1 < nblocks {
            out.resize(start + BLOCK as usize, 0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_where_the_next_entry_would_not_fit() {
        let long = [b'a'; 200];
        let names: Vec<&[u8]> = (0..40).map(|_| &long[..]).collect();
        // 212 bytes an entry: 19 fit in a block (4028), the 20th would not.
        let blocks = split(names.iter().copied());
        assert_eq!(blocks.iter().map(|b| b.0).collect::<Vec<_>>(), [19, 19, 2]);
        assert_eq!(size(names.iter().copied()), 2 * 4096 + 2 * 212);
        let entries: Vec<Entry> = names
            .iter()
            .map(|n| Entry {
                name: n,
                nid: 7,
                file_type: 1,
            })
            .collect();
        assert_eq!(encode(&entries).len() as u64, 2 * 4096 + 2 * 212);
    }
}
