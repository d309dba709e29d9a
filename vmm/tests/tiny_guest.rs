//! The whole VMM (builder, devices, vCPU threads, event loop, runner) on
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{asm, elf_image, kvm_or_skip};
use mvm::builder;
use mvm::config::VmConfig;
use mvm::console::ConsoleOutput;
use mvm::runner::{self, Outcome, RunOptions};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, d: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(d);
        Ok(d.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn run_guest(code: &[u8], vcpus: u8, timeout: Option<Duration>) -> (Outcome, String, bool) {
    let kernel = vmm_sys_util::tempfile::TempFile::new().unwrap();
    kernel.as_file().write_all(&elf_image(code)).unwrap();
    let config = VmConfig {
        kernel: kernel.as_path().to_owned(),
        initrd: None,
        cmdline: "console=ttyS0".into(),
        vcpus,
        mem_size: 64 << 20,
        vsock: None,
        shares: Vec::new(),
    };
    let out = Captured::default();
    let started = Instant::now();
    let vmm = builder::build(&config, ConsoleOutput::new(Box::new(out.clone()))).unwrap();
    let report = runner::run(
        vmm,
        RunOptions {
            started,
            timeout: Some(timeout.unwrap_or(Duration::from_secs(60))),
            forward_stdin: false,
            measure: false,
        },
    )
    .unwrap();
    let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    (report.outcome, text, report.boot_to_init.is_some())
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
