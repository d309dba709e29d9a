//! Filling in the header of a packet for the guest (an RX buffer).

use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::bitmap::BitmapSlice;

use super::defs::{CONN_BUF_SIZE, HOST_CID};

/// Everything that varies between the packets the device sends; the source
/// CID is always the host's, buf_alloc always [`CONN_BUF_SIZE`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Reply {
    pub guest_cid: u64,
    pub host_port: u32,
    pub guest_port: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub len: u32,
    pub fwd_cnt: u32,
}

/// Writes `reply` as the header of `pkt`, starting from zeroes so nothing the
/// guest left in its buffer shows through.
pub(super) fn write<B: BitmapSlice>(pkt: &mut VsockPacket<'_, B>, reply: &Reply) {
    // The header slice is exactly PKT_HEADER_SIZE long (the packet parser
    // guarantees it), so this cannot fail.
    let _ = pkt.set_header_from_raw(&[0u8; PKT_HEADER_SIZE]);
    pkt.set_src_cid(HOST_CID)
        .set_dst_cid(reply.guest_cid)
        .set_src_port(reply.host_port)
        .set_dst_port(reply.guest_port)
        .set_type(reply.type_)
        .set_op(reply.op)
        .set_flags(reply.flags)
        .set_len(reply.len)
        .set_buf_alloc(CONN_BUF_SIZE)
        .set_fwd_cnt(reply.fwd_cnt);
}
