//! `machine::vsock::attach_vsock` against this machine's /dev/kvm: the
//! slot, the kernel parameter, the registers on the MMIO bus, the Unix
//! socket and its errors. What the guest's driver does with the device is
//! covered by the device's unit tests (mvm-devices) and, with a Linux
//! guest, by the end-to-end tests through the test host. Where /dev/kvm
//! cannot be opened these tests fail, or skip with `MVM_ALLOW_SKIPS=1`.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use mvm::arch::x86_64::layout::VIRTIO_MMIO_BASE;
use mvm::machine::attach::{DeviceEnv, Error, Subscriber};
use mvm::machine::{kvm as vm, memory, vsock};
use mvm_devices::bus::Bus;
use vmm_sys_util::tempdir::TempDir;

/// What attaching vsock devices left behind.
struct Attached {
    /// One per device, in order.
    results: Vec<Result<(), Error>>,
    cmdline: Vec<String>,
    mmio: Bus,
    subscribers: Vec<Subscriber>,
}

/// Attaches one vsock device per (CID, socket path) to a fresh VM; None
/// when /dev/kvm cannot be used here.
fn attach(devices: &[(u64, &Path)]) -> Option<Attached> {
    common::kvm_or_skip("vsock_attach")?;
    let kvm = vm::open_kvm().unwrap();
    let vm = vm::create_vm(&kvm).unwrap();
    let mem = memory::create(64 << 20, memory::Backing::Private).unwrap();
    vm::register_memory(&vm, &mem).unwrap();
    let mut env = DeviceEnv::new(&vm, &mem, None);
    let results = devices
        .iter()
        .map(|(cid, path)| vsock::attach_vsock(&mut env, *cid, path, &[]).map(|_| ()))
        .collect();
    Some(Attached {
        results,
        cmdline: env.cmdline_extra,
        mmio: env.mmio,
        subscribers: env.subscribers,
    })
}

fn temp_dir() -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join("mvm-vsock-")).unwrap()
}

fn read32(bus: &Bus, addr: u64) -> u32 {
    let mut data = [0u8; 4];
    assert!(bus.read(addr, &mut data), "nothing at {addr:#x}");
    u32::from_le_bytes(data)
}

#[test]
fn vsock_takes_a_virtio_slot_and_listens() {
    let dir = temp_dir();
    let (a_path, b_path) = (dir.as_path().join("a.sock"), dir.as_path().join("b.sock"));
    let Some(a) = attach(&[(3, &a_path), (4, &b_path)]) else {
        return;
    };
    assert!(a.results.iter().all(Result::is_ok), "{:?}", a.results);
    assert_eq!(
        a.cmdline,
        vec![
            "virtio_mmio.device=4K@0xd0000000:5",
            "virtio_mmio.device=4K@0xd0001000:6"
        ]
    );
    for (i, cid) in [(0, 3), (1, 4)] {
        let base = VIRTIO_MMIO_BASE + i * 0x1000;
        assert_eq!(read32(&a.mmio, base), 0x7472_6976, "magic");
        assert_eq!(read32(&a.mmio, base + 4), 2, "version");
        assert_eq!(read32(&a.mmio, base + 8), 19, "vsock");
        assert_eq!(read32(&a.mmio, base + 0x100), cid, "guest CID");
    }
    assert!(!a.mmio.read(VIRTIO_MMIO_BASE + 0x2000, &mut [0u8; 4]));
    assert_eq!(a.subscribers.len(), 2);
    for path in [&a_path, &b_path] {
        assert!(std::fs::metadata(path).unwrap().file_type().is_socket());
        UnixStream::connect(path).expect("the VMM listens on the socket");
    }
}

#[test]
fn an_existing_socket_path_is_refused_and_kept() {
    let dir = temp_dir();
    let path = dir.as_path().join("v.sock");
    std::fs::write(&path, b"not ours").unwrap();
    let Some(a) = attach(&[(3, &path)]) else {
        return;
    };
    let msg = a.results[0].as_ref().unwrap_err().to_string();
    assert!(msg.contains("already exists"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(!msg.contains('\n'));
    assert_eq!(std::fs::read(&path).unwrap(), b"not ours");
    assert!(a.cmdline.is_empty(), "no slot taken: {:?}", a.cmdline);
}

#[test]
fn a_failed_attach_leaves_no_socket_behind() {
    let dir = temp_dir();
    let path = dir.as_path().join("v.sock");
    let Some(a) = attach(&[(2, &path)]) else {
        return;
    };
    assert!(
        matches!(
            a.results[0],
            Err(Error::Vsock(mvm_devices::virtio::vsock::Error::InvalidCid(
                2
            )))
        ),
        "{:?}",
        a.results
    );
    assert!(!path.exists(), "socket file left behind");
}
