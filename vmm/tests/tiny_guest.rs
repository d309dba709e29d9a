//! The whole machine (boot, devices, vCPU threads and their pause and
//! resume, event loop, device save and restore) on
//! this machine's own /dev/kvm, with a hand-written 64-bit guest of a few
//! instructions instead of Linux.
//!
//! Why not Linux: on the project's machines /dev/kvm is PVM-backed and
//! emulates guest kernel code at ~2 us per instruction, so a Linux guest
//! cannot boot here (docs/testing.md); a guest of twenty instructions runs
//! fine. The Linux boot is covered by the end-to-end tests through the
//! test host. Where /dev/kvm cannot be opened these tests fail, or skip
//! with `MVM_ALLOW_SKIPS=1` (docs/testing.md).

use std::io::{self, Write};
use std::time::{Duration, Instant};

mod common;

use common::{asm, elf_image, kvm_or_skip, Captured};
use mvm::config::{VmConfig, VsockConfig};
use mvm::console::ConsoleOutput;
use mvm::machine::{self, boot, Outcome, StopReason};

fn config(kernel: &vmm_sys_util::tempfile::TempFile, vcpus: u8) -> VmConfig {
    VmConfig {
        kernel: kernel.as_path().to_owned(),
        initrd: None,
        cmdline: "console=ttyS0".into(),
        vcpus,
        mem_size: 64 << 20,
        vsock: None,
        shares: Vec::new(),
        root_disk: None,
        root_dir: None,
        sandbox_disk: None,
        free_page_reporting: false,
        fs_bounce_pool: false,
    }
}

fn kernel_file(code: &[u8]) -> vmm_sys_util::tempfile::TempFile {
    let kernel = vmm_sys_util::tempfile::TempFile::new().unwrap();
    kernel.as_file().write_all(&elf_image(code)).unwrap();
    kernel
}

fn run_guest(code: &[u8], vcpus: u8, timeout: Option<Duration>) -> (Outcome, String, bool) {
    let kernel = kernel_file(code);
    let out = Captured::default();
    let mut machine = boot::boot(
        &config(&kernel, vcpus),
        ConsoleOutput::new(Box::new(out.clone())),
    )
    .unwrap();
    let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(60));
    machine.start().unwrap();
    let ended = machine.wait(Some(deadline)).unwrap();
    assert_eq!(ended.vcpus_left_behind, 0, "every vCPU thread was joined");
    (ended.outcome, out.text(), !ended.markers.is_empty())
}

/// Prints "x\n" forever.
fn chatty_guest() -> Vec<u8> {
    let mut code = asm::print(b"x\n");
    let back = -(code.len() as i8) - 2;
    code.extend([0xeb, back as u8]); // jmp to the start
    code
}

/// Polls `cond` for up to 20 s (a loaded machine is slow, never this slow).
fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_paused_machine_runs_no_guest_code_until_resumed_and_is_joined_at_the_end() {
    let Some(()) =
        kvm_or_skip("a_paused_machine_runs_no_guest_code_until_resumed_and_is_joined_at_the_end")
    else {
        return;
    };
    let kernel = kernel_file(&chatty_guest());
    let out = Captured::default();
    let mut machine = boot::boot(
        &config(&kernel, 2),
        ConsoleOutput::new(Box::new(out.clone())),
    )
    .unwrap();
    machine.start().unwrap();
    assert!(eventually(|| out.len() > 100), "the guest prints");
    assert!(
        matches!(machine.save_devices(), Err(machine::Error::NotPaused)),
        "devices are not saved under a running guest"
    );

    machine.pause().unwrap();
    assert!(machine.is_paused());
    let paused_at = out.len();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(out.len(), paused_at, "no output while paused");
    machine.save_devices().expect("paused devices save");

    machine.resume();
    assert!(
        eventually(|| out.len() > paused_at + 100),
        "output again after resume"
    );
    assert!(!machine.is_paused());

    // A guest that never stops by itself: the host ends it, and every vCPU
    // thread (one of them in KVM_RUN, one parked by the guest's BSP-only
    // code) is kicked out and joined.
    machine.stop_handle().stop(StopReason::Host);
    let ended = machine.wait(None).unwrap();
    assert_eq!(ended.outcome, Outcome::Stopped);
    assert_eq!(ended.vcpus_left_behind, 0);
    let stopped_at = out.len();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(out.len(), stopped_at, "no output after the end");
}

#[test]
fn saved_devices_rebuild_an_identical_device_set_and_a_foreign_one_is_refused() {
    let Some(()) =
        kvm_or_skip("saved_devices_rebuild_an_identical_device_set_and_a_foreign_one_is_refused")
    else {
        return;
    };
    let dir =
        vmm_sys_util::tempdir::TempDir::new_with_prefix(std::env::temp_dir().join("mvm-save-"))
            .unwrap();
    let kernel = kernel_file(&common::parked_guest_code());
    let mut cfg = config(&kernel, 1);
    cfg.vsock = Some(VsockConfig {
        cid: 3,
        uds_path: dir.as_path().join("a.sock"),
        guest_ports: Vec::new(),
    });
    let out = Captured::default();
    let mut machine = boot::boot(&cfg, ConsoleOutput::new(Box::new(out.clone()))).unwrap();
    assert_eq!(
        machine.device_ids(),
        ["serial0", "i8042", "status", "vsock-3"]
    );
    machine.start().unwrap();
    assert!(eventually(|| out.text() == "hi\n"));
    machine.pause().unwrap();
    let saved = machine.save_devices().unwrap();
    // Through a serialised form, as a snapshot file would carry it.
    let json = serde_json::to_string(&saved).unwrap();
    let saved: machine::registry::DeviceStates = serde_json::from_str(&json).unwrap();
    match saved.get("status") {
        Some(mvm_devices::state::DeviceState::StatusPort(s)) => assert_eq!(s.markers, [1]),
        other => panic!("status port state: {other:?}"),
    }

    cfg.vsock.as_mut().unwrap().uds_path = dir.as_path().join("b.sock");
    let restored =
        machine::with_saved_devices(&cfg, ConsoleOutput::new(Box::new(io::sink())), &saved)
            .unwrap();
    assert_eq!(
        restored.save_devices().unwrap(),
        saved,
        "save(restore(s)) == s"
    );

    let mut no_vsock = cfg.clone();
    no_vsock.vsock = None;
    let err =
        machine::with_saved_devices(&no_vsock, ConsoleOutput::new(Box::new(io::sink())), &saved)
            .err()
            .expect("a machine without the saved vsock device is refused");
    assert!(err.to_string().contains("vsock-3"), "{err}");

    let mut other_cid = cfg.clone();
    other_cid.vsock = Some(VsockConfig {
        cid: 4,
        uds_path: dir.as_path().join("c.sock"),
        guest_ports: Vec::new(),
    });
    assert!(
        machine::with_saved_devices(&other_cid, ConsoleOutput::new(Box::new(io::sink())), &saved)
            .is_err(),
        "a vsock device of another CID is not the saved one"
    );
    machine.stop_handle().stop(StopReason::Host);
    assert_eq!(machine.wait(None).unwrap().vcpus_left_behind, 0);
}

#[test]
fn guest_prints_reports_status_and_resets() {
    let Some(()) = kvm_or_skip("guest_prints_reports_status_and_resets") else {
        return;
    };
    let mut code = asm::print(b"hello from the guest\n");
    code.extend(asm::out_byte(0x440, 1)); // boot marker
    code.extend(asm::out_dword(0x444, 42)); // exit status
    code.extend(asm::RESET);
    code.extend(asm::PARK);
    let (outcome, console, marker) = run_guest(&code, 1, None);
    assert_eq!(outcome, Outcome::Exited(42));
    assert_eq!(console, "hello from the guest\n");
    assert!(marker, "the boot marker write was recorded");
}

#[test]
fn reset_without_status_is_a_stop_not_an_exit() {
    let Some(()) = kvm_or_skip("reset_without_status_is_a_stop_not_an_exit") else {
        return;
    };
    let mut code = asm::print(b"bye\n");
    code.extend(asm::RESET);
    code.extend(asm::PARK);
    let (outcome, console, marker) = run_guest(&code, 2, None);
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(console, "bye\n");
    assert!(!marker);
}

#[test]
fn panic_banner_then_reset_is_a_panic() {
    let Some(()) = kvm_or_skip("panic_banner_then_reset_is_a_panic") else {
        return;
    };
    let mut code = asm::print(b"Kernel panic - not syncing: test\n");
    code.extend(asm::RESET);
    let (outcome, _, _) = run_guest(&code, 1, None);
    assert_eq!(outcome, Outcome::Panicked);
}

#[test]
fn triple_fault_stops_the_vm() {
    let Some(()) = kvm_or_skip("triple_fault_stops_the_vm") else {
        return;
    };
    let (outcome, _, _) = run_guest(&asm::TRIPLE_FAULT, 1, None);
    assert_eq!(outcome, Outcome::Stopped);
}

#[test]
fn timeout_ends_a_guest_that_never_stops() {
    let Some(()) = kvm_or_skip("timeout_ends_a_guest_that_never_stops") else {
        return;
    };
    let started = Instant::now();
    let (outcome, _, _) = run_guest(&asm::PARK, 1, Some(Duration::from_millis(300)));
    assert_eq!(outcome, Outcome::TimedOut);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
}

/// Counts through the alphabet in guest memory (at 5 MiB) and prints each
/// letter on a line of its own: 'a' once, then 'b' to 'z' over and over.
/// Its state is in memory and in RIP, so a restored copy that continues
/// the sequence had both restored; one that prints 'a' started over.
fn alphabet_guest() -> Vec<u8> {
    let mut code = vec![0xc6, 0x04, 0x25, 0x00, 0x00, 0x50, 0x00, b'a']; // mov byte [0x500000], 'a'
    code.extend(asm::mov_dx(0x3f8));
    let body: [u8; 28] = [
        0x8a,
        0x04,
        0x25,
        0x00,
        0x00,
        0x50,
        0x00, // mov al, [0x500000]
        0xee, // out dx, al
        0xfe,
        0xc0, // inc al
        0x3c,
        b'z' + 1, // cmp al, 'z' + 1
        0x75,
        0x02, // jne +2
        0xb0,
        b'b', // mov al, 'b'
        0x88,
        0x04,
        0x25,
        0x00,
        0x00,
        0x50,
        0x00, // mov [0x500000], al
        0xb0,
        b'\n', // mov al, '\n'
        0xee,  // out dx, al
        0xeb,
        0xe4, // jmp -28: the loop
    ];
    code.extend(body);
    code
}

fn letters(out: &Captured) -> Vec<u8> {
    out.text()
        .lines()
        .map(|l| l.as_bytes().first().copied().unwrap_or(b'?'))
        .collect()
}

/// 'a', then 'b'..='z' repeating.
fn successor(letter: u8) -> u8 {
    if letter == b'z' {
        b'b'
    } else {
        letter + 1
    }
}

#[test]
fn a_snapshot_restores_into_a_new_machine_that_carries_on_where_the_old_one_was_paused() {
    let Some(()) = kvm_or_skip(
        "a_snapshot_restores_into_a_new_machine_that_carries_on_where_the_old_one_was_paused",
    ) else {
        return;
    };
    let dir =
        vmm_sys_util::tempdir::TempDir::new_with_prefix(std::env::temp_dir().join("mvm-snap-"))
            .unwrap();
    let snap = dir.as_path().join("snap");
    let kernel = kernel_file(&alphabet_guest());
    let mut cfg = config(&kernel, 1);
    cfg.vsock = Some(VsockConfig {
        cid: 3,
        uds_path: dir.as_path().join("a.sock"),
        guest_ports: Vec::new(),
    });

    let out_a = Captured::default();
    let mut a = boot::boot(&cfg, ConsoleOutput::new(Box::new(out_a.clone()))).unwrap();
    a.start().unwrap();
    assert!(
        eventually(|| letters(&out_a).len() > 60),
        "the guest counts"
    );
    a.pause().unwrap();
    a.snapshot(&snap).unwrap();
    let before = letters(&out_a);
    // The machine resumes after a snapshot, then the host ends it.
    a.resume();
    assert!(eventually(|| letters(&out_a).len() > before.len() + 10));
    a.stop_handle().stop(StopReason::Host);
    assert_eq!(a.wait(None).unwrap().vcpus_left_behind, 0);
    drop(a);

    // Owner-only, and sparse: a 64 MiB guest that touched a few pages.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(&snap).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let memory = std::fs::metadata(snap.join("memory")).unwrap();
    assert_eq!(memory.len(), 64 << 20);
    assert_eq!(memory.permissions().mode() & 0o777, 0o600);
    assert!(
        memory.blocks() * 512 < 8 << 20,
        "{} blocks",
        memory.blocks()
    );

    cfg.vsock.as_mut().unwrap().uds_path = dir.as_path().join("b.sock");
    let out_b = Captured::default();
    let mut b = machine::restore(&cfg, ConsoleOutput::new(Box::new(out_b.clone())), &snap).unwrap();
    b.start().unwrap();
    assert!(
        eventually(|| letters(&out_b).len() > 30),
        "the restored guest counts on"
    );
    b.stop_handle().stop(StopReason::Host);
    assert_eq!(b.wait(None).unwrap().vcpus_left_behind, 0);
    let mut after = letters(&out_b);
    assert_eq!(before[0], b'a', "{before:?}");
    let last = *before.last().unwrap();
    // The console passes on whole lines only. If the pause fell between a
    // letter and its newline, that letter was already out of the guest
    // (in the old machine's line buffer): the restored guest then starts
    // with the newline, and its first full line is the letter after that.
    let expected = if after[0] == b'?' {
        after.remove(0);
        successor(successor(last))
    } else {
        successor(last)
    };
    assert_eq!(
        after[0],
        expected,
        "the restored guest goes on from where the old one was paused, not from the start: before {:?}, after {:?}",
        String::from_utf8_lossy(&before[before.len() - 5..]),
        String::from_utf8_lossy(&after[..5])
    );
    for pair in after.windows(2) {
        assert_eq!(pair[1], successor(pair[0]), "{after:?}");
    }
}

#[test]
fn a_damaged_or_foreign_snapshot_is_refused_with_its_reason() {
    let Some(()) = kvm_or_skip("a_damaged_or_foreign_snapshot_is_refused_with_its_reason") else {
        return;
    };
    let dir =
        vmm_sys_util::tempdir::TempDir::new_with_prefix(std::env::temp_dir().join("mvm-snap-"))
            .unwrap();
    let snap = dir.as_path().join("snap");
    let kernel = kernel_file(&common::parked_guest_code());
    let cfg = config(&kernel, 1);
    let mut m = boot::boot(&cfg, ConsoleOutput::new(Box::new(io::sink()))).unwrap();
    m.start().unwrap();
    m.pause().unwrap();
    m.snapshot(&snap).unwrap();
    let again = m.snapshot(&snap).unwrap_err().to_string();
    assert!(again.contains("exists already"), "{again}");
    m.stop_handle().stop(StopReason::Host);
    m.wait(None).unwrap();

    let restore_err = |cfg: &VmConfig| {
        machine::restore(cfg, ConsoleOutput::new(Box::new(io::sink())), &snap)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    machine::restore(&cfg, ConsoleOutput::new(Box::new(io::sink())), &snap)
        .expect("the intact snapshot restores (control)");

    let mut bigger = cfg.clone();
    bigger.mem_size = 128 << 20;
    assert!(
        restore_err(&bigger).contains("64 MiB"),
        "{}",
        restore_err(&bigger)
    );

    let state = snap.join("state.json");
    let original = std::fs::read(&state).unwrap();
    let mut flipped = original.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x01;
    std::fs::write(&state, &flipped).unwrap();
    let e = restore_err(&cfg);
    assert!(e.contains("state.json does not match its checksum"), "{e}");
    std::fs::write(&state, &original).unwrap();

    let memory = snap.join("memory");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&memory)
        .unwrap();
    f.set_len((64 << 20) - 4096).unwrap();
    let e = restore_err(&cfg);
    assert!(e.contains("bytes"), "{e}");
    f.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"x", 1 << 20).unwrap();
    let e = restore_err(&cfg);
    assert!(e.contains("memory does not match its checksum"), "{e}");
    // A read that checks the memory file's length only (for a file the
    // caller verified before, and knows unchanged: templates) does not
    // hash it, so it cannot see this; a full read does.
    use machine::snapshot::{read_with, MemoryCheck};
    assert!(read_with(&snap, MemoryCheck::LengthOnly).is_ok());
    assert!(read_with(&snap, MemoryCheck::Full).is_err());

    let manifest = snap.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let format = format!("\"format\": {}", machine::snapshot::FORMAT_VERSION);
    assert!(text.contains(&format), "{text}");
    std::fs::write(&manifest, text.replace(&format, "\"format\": 99")).unwrap();
    let e = restore_err(&cfg);
    assert!(e.contains("format 99"), "{e}");
}
