//! One block request: the chain parsed and checked, then served from the
//! disk file. Firecracker's `devices/virtio/block/virtio/request.rs` is
//! the model: a device-readable header, then the data buffers, then one
//! device-writable status byte; any length the guest gives that does not
//! add up is answered with IOERR before the file is touched.
//!
//! virtio-queue's `Reader` and `Writer` walk the chain and check every
//! descriptor against guest memory; this file checks what they cannot
//! know: the sector range, whole sectors, the per-request bound.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::GuestMemoryMmap;

use super::defs::{
    HEADER_LEN, ID_BYTES, MAX_REQUEST_BYTES, READ_CHUNK, SECTOR_SIZE, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};

/// `struct virtio_blk_outhdr`, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u32,
    sector: u64,
}

fn read_header(reader: &mut Reader) -> Option<Header> {
    if reader.available_bytes() < HEADER_LEN {
        return None;
    }
    let mut raw = [0u8; HEADER_LEN];
    reader.read_exact(&mut raw).ok()?;
    // Bytes 4..8 are the I/O priority, which a single-queue device ignores.
    Some(Header {
        kind: u32::from_le_bytes(raw[0..4].try_into().ok()?),
        sector: u64::from_le_bytes(raw[8..16].try_into().ok()?),
    })
}

/// The (disk position, length) pieces of at most READ_CHUNK bytes that
/// cover `len` bytes from `start`: a request costs no more host memory
/// than the buffer, whatever its length.
fn chunks(start: u64, len: usize) -> impl Iterator<Item = (u64, usize)> {
    (0..len)
        .step_by(READ_CHUNK)
        .map(move |off| (start + off as u64, (len - off).min(READ_CHUNK)))
}

/// The disk a request is served from: `file_len` bytes of the file, then
/// zeros up to the capacity of `sectors`.
pub(super) struct Disk {
    file: File,
    id: [u8; ID_BYTES],
    /// The file's length when the device was made, at most the capacity.
    file_len: u64,
    /// The capacity the guest sees.
    sectors: u64,
    /// OUT and FLUSH reach the file (else OUT is an I/O error).
    writable: bool,
    buf: Vec<u8>,
}

impl Disk {
    pub(super) fn new(file: File, id: &str, file_len: u64, sectors: u64, writable: bool) -> Self {
        let mut padded = [0u8; ID_BYTES];
        let len = id.len().min(ID_BYTES);
        padded[..len].copy_from_slice(&id.as_bytes()[..len]);
        Self {
            file,
            id: padded,
            file_len,
            sectors,
            writable,
            buf: vec![0; READ_CHUNK],
        }
    }

    /// Serves one request chain; returns how many bytes the device wrote
    /// into it (the used length). A chain with no writable byte has nowhere
    /// to put a status: it is returned unserved with length 0.
    pub(super) fn serve(
        &mut self,
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
    ) -> u32 {
        let (Ok(mut reader), Ok(mut data)) = (chain.clone().reader(mem), chain.writer(mem)) else {
            return 0;
        };
        let Some(status_at) = data.available_bytes().checked_sub(1) else {
            return 0;
        };
        let Ok(mut status) = data.split_at(status_at) else {
            return 0;
        };
        let code = match read_header(&mut reader) {
            None => VIRTIO_BLK_S_IOERR,
            Some(h) => match h.kind {
                VIRTIO_BLK_T_IN => self.read(h.sector, &mut data),
                VIRTIO_BLK_T_OUT if self.writable => self.write(h.sector, &mut reader),
                // A read-only disk (VIRTIO_BLK_F_RO): a driver that writes
                // anyway gets an I/O error, as from Firecracker.
                VIRTIO_BLK_T_OUT => VIRTIO_BLK_S_IOERR,
                VIRTIO_BLK_T_FLUSH if self.writable => match self.file.sync_data() {
                    Ok(()) => VIRTIO_BLK_S_OK,
                    Err(_) => VIRTIO_BLK_S_IOERR,
                },
                // Nothing is ever written, so nothing is ever unflushed.
                VIRTIO_BLK_T_FLUSH => VIRTIO_BLK_S_OK,
                VIRTIO_BLK_T_GET_ID => self.get_id(&mut data),
                _ => VIRTIO_BLK_S_UNSUPP,
            },
        };
        if status.write_all(&[code as u8]).is_err() {
            return data.bytes_written() as u32;
        }
        (data.bytes_written() + 1) as u32
    }

    /// Where a request of `len` bytes at `sector` starts on the disk, if
    /// it is whole sectors, at most MAX_REQUEST_BYTES and inside the
    /// capacity.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        if !len.is_multiple_of(SECTOR_SIZE as usize) || len > MAX_REQUEST_BYTES {
            return None;
        }
        let start = sector.checked_mul(SECTOR_SIZE)?;
        let end = start.checked_add(len as u64)?;
        (end <= self.sectors * SECTOR_SIZE).then_some(start)
    }

    /// VIRTIO_BLK_T_IN: whole sectors inside the disk's capacity, at most
    /// MAX_REQUEST_BYTES, read in READ_CHUNK pieces; the part of a chunk
    /// past the file's end is zeros, not read.
    fn read(&mut self, sector: u64, data: &mut Writer) -> u32 {
        let len = data.available_bytes();
        let Some(start) = self.range(sector, len) else {
            return VIRTIO_BLK_S_IOERR;
        };
        for (at, n) in chunks(start, len) {
            let chunk = &mut self.buf[..n];
            // At most n, so it fits in usize.
            let from_file = self.file_len.saturating_sub(at).min(n as u64) as usize;
            let (file_part, zeros) = chunk.split_at_mut(from_file);
            // A short read inside the file's length means the file shrank
            // under the VM: an error, never stale or zero bytes passed off
            // as the disk's. Only bytes past the length it had are zeros.
            if self.file.read_exact_at(file_part, at).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
            zeros.fill(0);
            if data.write_all(chunk).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
        }
        VIRTIO_BLK_S_OK
    }

    /// VIRTIO_BLK_T_OUT on a writable disk: the same bounds as a read,
    /// the data copied from the guest in READ_CHUNK pieces and written at
    /// its place in the file (a writable disk's file is its whole
    /// capacity, so no zeros lie past it).
    fn write(&mut self, sector: u64, data: &mut Reader) -> u32 {
        let len = data.available_bytes();
        let Some(start) = self.range(sector, len) else {
            return VIRTIO_BLK_S_IOERR;
        };
        for (at, n) in chunks(start, len) {
            let chunk = &mut self.buf[..n];
            if data.read_exact(chunk).is_err() || self.file.write_all_at(chunk, at).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
        }
        VIRTIO_BLK_S_OK
    }

    /// VIRTIO_BLK_T_GET_ID: the id, zero-padded to 20 bytes (or as much of
    /// it as the driver gave room for).
    fn get_id(&self, data: &mut Writer) -> u32 {
        let n = data.available_bytes().min(ID_BYTES);
        match data.write_all(&self.id[..n]) {
            Ok(()) => VIRTIO_BLK_S_OK,
            Err(_) => VIRTIO_BLK_S_IOERR,
        }
    }
}
