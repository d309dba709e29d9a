//! virtio-vsock protocol numbers (virtio 1.2 section 5.10) and the limits
//! mvm's device keeps to.

/// The host's address: every packet the guest sends to the VMM goes here.
pub const HOST_CID: u64 = 2;
/// VMADDR_CID_ANY: never a valid guest CID. CIDs 0-2 are reserved.
pub const CID_ANY: u64 = u32::MAX as u64;

/// Queue indexes.
pub const RXQ: usize = 0;
pub const TXQ: usize = 1;
pub const EVQ: usize = 2;
pub const QUEUE_COUNT: usize = 3;
/// The transmit and event queues' maximum size; Linux uses what it is
/// offered up to this.
pub const QUEUE_SIZE: u16 = 256;
/// The receive queue's. Linux fills every entry of it with a buffer of
/// about 8 KiB (4 KiB of data in an skb) as the device is probed: 256 of
/// them are 2 MiB of guest memory touched at every boot (about 44 ms of a
/// test-host boot, docs/benchmarks.md) and kept for the VM's life. 64 keep
/// 256 KiB on the way to the guest, as much as one of its sockets buffers
/// by default.
pub const RX_QUEUE_SIZE: u16 = 64;
/// Every queue's maximum size, by index.
pub const QUEUE_SIZES: [u16; QUEUE_COUNT] = [RX_QUEUE_SIZE, QUEUE_SIZE, QUEUE_SIZE];

pub const TYPE_STREAM: u16 = 1;

pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// OP_SHUTDOWN flags: the sender will receive / send no more data.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// Largest payload accepted in one guest packet (Linux sends at most 64 KiB).
pub const MAX_PKT_DATA: u32 = 64 * 1024;
/// What each connection advertises as buf_alloc: the most guest data it
/// holds for a host client that reads slowly. Flow control keeps the guest
/// within it, so this bounds the VMM's memory per connection.
pub const CONN_BUF_SIZE: u32 = 64 * 1024;
/// Once the guest's idea of our free space drops below this, every byte the
/// client reads is worth a credit update (one roughly per half buffer).
pub const CREDIT_UPDATE_THRESHOLD: u32 = CONN_BUF_SIZE / 2;
/// Host-side ports of host-initiated connections start here, well above
/// anything a guest service listens on (Firecracker's convention).
pub const FIRST_HOST_PORT: u32 = 1 << 30;
/// Host clients connected at once (including those still sending their
/// CONNECT line); more are accepted and closed at once.
pub const MAX_CONNECTIONS: usize = 64;
/// RSTs owed to the guest for packets that match no connection, while it
/// has no RX buffer to take them; beyond this they are dropped (the guest
/// times out instead).
pub const MAX_STRAY_REPLIES: usize = 64;
/// The longest `CONNECT <port>\n` line: "CONNECT " + 10 digits + "\n".
pub const MAX_CONNECT_LINE: usize = 19;
