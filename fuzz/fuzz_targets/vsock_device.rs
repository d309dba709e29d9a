//! The vsock device (with its muxer and connections) fed by a hostile
//! guest: packets of any op, ports, lengths, flags and credit on the TX
//! queue, split across descriptors anyhow; RX buffers of any size or none;
//! the raw driver steps of `driver::Op` (register writes, resets
//! mid-traffic, rings anywhere, avail-index jumps); while host clients
//! connect (on the Unix socket or through the in-process Dialer), send,
//! read, half-close and hang up, and the guest connects to a port the VMM
//! serves. Findings: a panic, a hang, a
//! runaway allocation, or more connections than the device's bound.

#![no_main]

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use mvm_devices::virtio::vsock::{self, defs::*, GuestPort};
use mvm_fuzz::driver::{guest_memory, queue_events, Driver, Op};
use vm_memory::{Bytes, GuestAddress};

const GUEST_CID: u64 = 3;
/// The port the VMM serves for the guest (as it does the egress proxy's).
const SERVED_PORT: u32 = 1080;
const HDR_LEN: usize = 44;
const SLOTS: u16 = 32;
const SLOT_SIZE: u64 = 0x1100;
const TX_AREA: u64 = 0x4_0000;
const RX_AREA: u64 = 0x8_0000;
const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const MAX_OPS: usize = 256;
const MAX_DATA: usize = 4096;

#[derive(Arbitrary, Debug)]
enum Step {
    Raw(Op),
    /// One guest packet on the TX queue: header, then data, split at
    /// `split` bytes into a second descriptor (0: one descriptor).
    Send {
        src_port: u32,
        /// 0 picks the agent's port, 1 the served port, else as is.
        dst_port: u32,
        to_host: bool,
        op: u8,
        len: u32,
        flags: u32,
        buf_alloc: u32,
        fwd_cnt: u32,
        data: Vec<u8>,
        split: u16,
    },
    /// `count` RX buffers of `len` bytes each.
    GiveRx {
        count: u8,
        len: u16,
    },
    Connect {
        port: u32,
    },
    /// The same through the device's in-process Dialer (the VMM's own
    /// exec client's way in).
    Dial {
        port: u32,
    },
    HostSend {
        client: u8,
        data: Vec<u8>,
    },
    HostRead {
        client: u8,
    },
    HostShutdown {
        client: u8,
        write: bool,
    },
    HostClose {
        client: u8,
    },
}

/// The served port's socket, one per process: connections the device makes
/// to it queue in its backlog, and each input drains them.
fn served() -> &'static (PathBuf, UnixListener) {
    static SERVED: OnceLock<(PathBuf, UnixListener)> = OnceLock::new();
    SERVED.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("mvm-fuzz-vsock-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the served port's socket");
        listener.set_nonblocking(true).unwrap();
        (path, listener)
    })
}

/// Even numbers pick the agent's port (which the guest may accept), odd
/// ones are taken as they are.
fn agent_or(port: u32) -> u32 {
    if port.is_multiple_of(2) {
        mvm_protocol::AGENT_PORT
    } else {
        port
    }
}

fn unique_addr() -> SocketAddr {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "mvm-fuzz-vsock-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
}

struct Rig<H: event_manager::MutEventSubscriber> {
    driver: Driver<vsock::Vsock, H>,
    addr: SocketAddr,
    dialer: vsock::Dialer,
    clients: Vec<UnixStream>,
    tx_slot: u16,
    rx_slot: u16,
}

fuzz_target!(|steps: Vec<Step>| {
    let (path, served_listener) = served();
    let addr = unique_addr();
    let listener = UnixListener::bind_addr(&addr).expect("bind the vsock socket");
    let (evts, clones) = queue_events(QUEUE_COUNT);
    let ports = vec![GuestPort {
        port: SERVED_PORT,
        socket: path.clone(),
    }];
    let (device, handler) = vsock::new(GUEST_CID, listener, evts, ports).expect("the vsock device");
    let dialer = handler.dialer().expect("the vsock dialer");
    let mut rig = Rig {
        driver: Driver::new(guest_memory(), device, handler, clones),
        addr,
        dialer,
        clients: Vec::new(),
        tx_slot: 0,
        rx_slot: 0,
    };
    rig.driver.apply(&Op::Start { mask: 0 });
    for step in steps.iter().take(MAX_OPS) {
        rig.step(step);
        let open = rig.driver.handler().connection_count();
        assert!(open <= MAX_CONNECTIONS, "{open} connections open");
    }
    rig.driver.run();
    drop(rig);
    while served_listener.accept().is_ok() {}
});

impl<H: event_manager::MutEventSubscriber> Rig<H> {
    fn step(&mut self, step: &Step) {
        match step {
            Step::Raw(op) => self.driver.apply(op),
            Step::Send {
                src_port,
                dst_port,
                to_host,
                op,
                len,
                flags,
                buf_alloc,
                fwd_cnt,
                data,
                split,
            } => {
                let dst_port = match dst_port {
                    0 => mvm_protocol::AGENT_PORT,
                    1 => SERVED_PORT,
                    p => *p,
                };
                let mut hdr = [0u8; HDR_LEN];
                hdr[0..8].copy_from_slice(&GUEST_CID.to_le_bytes());
                let dst_cid = if *to_host {
                    HOST_CID
                } else {
                    u64::from(*src_port)
                };
                hdr[8..16].copy_from_slice(&dst_cid.to_le_bytes());
                hdr[16..20].copy_from_slice(&src_port.to_le_bytes());
                hdr[20..24].copy_from_slice(&dst_port.to_le_bytes());
                hdr[24..28].copy_from_slice(&len.to_le_bytes());
                hdr[28..30].copy_from_slice(&TYPE_STREAM.to_le_bytes());
                hdr[30..32].copy_from_slice(&u16::from(op % 9).to_le_bytes());
                hdr[32..36].copy_from_slice(&flags.to_le_bytes());
                hdr[36..40].copy_from_slice(&buf_alloc.to_le_bytes());
                hdr[40..44].copy_from_slice(&fwd_cnt.to_le_bytes());
                let data = &data[..data.len().min(MAX_DATA)];
                self.send(&hdr, data, usize::from(*split));
            }
            Step::GiveRx { count, len } => {
                for _ in 0..(count % 8) {
                    self.give_rx(u32::from(*len) % (SLOT_SIZE as u32 + 1));
                }
            }
            Step::Connect { port } => {
                if let Ok(mut c) = UnixStream::connect_addr(&self.addr) {
                    let _ = c.set_nonblocking(true);
                    let _ = c.write_all(format!("CONNECT {}\n", agent_or(*port)).as_bytes());
                    self.clients.push(c);
                }
            }
            Step::Dial { port } => {
                if let Ok(mut c) = self.dialer.dial() {
                    let _ = c.set_nonblocking(true);
                    let _ = c.write_all(format!("CONNECT {}\n", agent_or(*port)).as_bytes());
                    self.clients.push(c);
                }
            }
            Step::HostSend { client, data } => {
                if let Some(c) = self.client(*client) {
                    let _ = c.write(&data[..data.len().min(MAX_DATA)]);
                }
            }
            Step::HostRead { client } => {
                if let Some(c) = self.client(*client) {
                    let mut buf = [0u8; 4096];
                    let _ = c.read(&mut buf);
                }
            }
            Step::HostShutdown { client, write } => {
                if let Some(c) = self.client(*client) {
                    let how = if *write {
                        Shutdown::Write
                    } else {
                        Shutdown::Read
                    };
                    let _ = c.shutdown(how);
                }
            }
            Step::HostClose { client } => {
                if !self.clients.is_empty() {
                    let i = usize::from(*client) % self.clients.len();
                    self.clients.swap_remove(i);
                }
            }
        }
    }

    fn client(&mut self, i: u8) -> Option<&mut UnixStream> {
        let n = self.clients.len();
        if n == 0 {
            return None;
        }
        self.clients.get_mut(usize::from(i) % n)
    }

    /// Header (and data) in the next TX slot, made available and notified.
    fn send(&mut self, hdr: &[u8], data: &[u8], split: usize) {
        let slot = self.tx_slot;
        self.tx_slot = (slot + 1) % SLOTS;
        let at = TX_AREA + u64::from(slot) * SLOT_SIZE;
        let mem = self.driver.mem.clone();
        mem.write_slice(hdr, GuestAddress(at)).unwrap();
        mem.write_slice(data, GuestAddress(at + HDR_LEN as u64))
            .unwrap();
        let whole = (hdr.len() + data.len()) as u32;
        let first = if split == 0 || split >= whole as usize {
            whole
        } else {
            split as u32
        };
        let head = slot * 2;
        self.desc(1, head, at, first, first < whole, head + 1, false);
        if first < whole {
            self.desc(
                1,
                head + 1,
                at + u64::from(first),
                whole - first,
                false,
                0,
                false,
            );
        }
        self.driver.apply(&Op::Avail {
            queue: TXQ as u8,
            head,
            bump: 0,
        });
        self.driver.apply(&Op::Notify { queue: TXQ as u8 });
    }

    fn give_rx(&mut self, len: u32) {
        let slot = self.rx_slot;
        self.rx_slot = (slot + 1) % SLOTS;
        let at = RX_AREA + u64::from(slot) * SLOT_SIZE;
        self.desc(0, slot, at, len, false, 0, true);
        self.driver.apply(&Op::Avail {
            queue: RXQ as u8,
            head: slot,
            bump: 0,
        });
        self.driver.apply(&Op::Notify { queue: RXQ as u8 });
    }

    #[allow(clippy::too_many_arguments)]
    fn desc(
        &mut self,
        queue: u8,
        index: u16,
        addr: u64,
        len: u32,
        next: bool,
        to: u16,
        writable: bool,
    ) {
        let mut flags = if writable { VIRTQ_DESC_F_WRITE } else { 0 };
        if next {
            flags |= VIRTQ_DESC_F_NEXT;
        }
        self.driver.apply(&Op::Desc {
            queue,
            index: index as u8,
            addr: addr as u32,
            len,
            flags,
            next: to,
        });
    }
}
