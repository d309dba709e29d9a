//! What the tests on this machine's own /dev/kvm share: a guest of a few
//! hand-assembled instructions in a minimal ELF (a Linux guest cannot boot
//! on the PVM-backed /dev/kvm, docs/testing.md), and the KVM check.

#![allow(dead_code)] // each test file uses its own part

pub const LOAD_ADDR: u64 = 0x10_0000;

/// A minimal ELF64 executable: one PT_LOAD segment holding `code`, loaded
/// and entered at LOAD_ADDR.
pub fn elf_image(code: &[u8]) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    let offset = (EHDR + PHDR) as u64;
    let mut f = Vec::new();
    f.extend(b"\x7fELF");
    f.extend([2, 1, 1, 0]); // 64-bit, little endian, version 1, SysV
    f.extend([0u8; 8]);
    f.extend(2u16.to_le_bytes()); // ET_EXEC
    f.extend(0x3eu16.to_le_bytes()); // x86-64
    f.extend(1u32.to_le_bytes());
    f.extend(LOAD_ADDR.to_le_bytes()); // e_entry
    f.extend((EHDR as u64).to_le_bytes()); // e_phoff
    f.extend(0u64.to_le_bytes()); // e_shoff
    f.extend(0u32.to_le_bytes()); // e_flags
    f.extend((EHDR as u16).to_le_bytes());
    f.extend((PHDR as u16).to_le_bytes());
    f.extend(1u16.to_le_bytes()); // e_phnum
    f.extend([0u8; 6]); // shentsize, shnum, shstrndx
    assert_eq!(f.len(), EHDR);
    f.extend(1u32.to_le_bytes()); // PT_LOAD
    f.extend(5u32.to_le_bytes()); // R+X
    f.extend(offset.to_le_bytes());
    f.extend(LOAD_ADDR.to_le_bytes()); // p_vaddr
    f.extend(LOAD_ADDR.to_le_bytes()); // p_paddr
    f.extend((code.len() as u64).to_le_bytes());
    f.extend((code.len() as u64).to_le_bytes());
    f.extend(0x1000u64.to_le_bytes());
    assert_eq!(f.len(), EHDR + PHDR);
    f.extend(code);
    f
}

/// x86-64 machine code, assembled by hand; each helper is one instruction.
pub mod asm {
    pub fn mov_dx(port: u16) -> Vec<u8> {
        let mut v = vec![0x66, 0xba];
        v.extend(port.to_le_bytes());
        v
    }
    pub fn out_byte(port: u16, value: u8) -> Vec<u8> {
        let mut v = mov_dx(port);
        v.extend([0xb0, value, 0xee]); // mov al, imm8; out dx, al
        v
    }
    pub fn out_dword(port: u16, value: u32) -> Vec<u8> {
        let mut v = mov_dx(port);
        v.push(0xb8); // mov eax, imm32
        v.extend(value.to_le_bytes());
        v.push(0xef); // out dx, eax
        v
    }
    pub fn print(text: &[u8]) -> Vec<u8> {
        text.iter().flat_map(|b| out_byte(0x3f8, *b)).collect()
    }
    pub const RESET: [u8; 7] = [0x66, 0xba, 0x64, 0x00, 0xb0, 0xfe, 0xee];
    /// cli; hlt: parked for good, costing the host nothing.
    pub const PARK: [u8; 2] = [0xfa, 0xf4];
    /// ud2 with an empty IDT: #UD -> #GP -> #DF -> triple fault.
    pub const TRIPLE_FAULT: [u8; 2] = [0x0f, 0x0b];
}

/// The variable that lets a test that cannot run here pass as skipped
/// instead of failing (docs/testing.md).
pub const ALLOW_SKIPS: &str = "MVM_ALLOW_SKIPS";

/// A test that cannot run here fails, unless `MVM_ALLOW_SKIPS=1` says a
/// skip is acceptable: then the skip is said on the real stderr (libtest
/// hides `eprintln!` of a passing test) and noted in
/// `target/test-events/skip.log` for `make test`'s summary, and the caller
/// returns. The same rule as `mvm_e2e::skip_or_fail`.
pub fn skip_or_fail(test: &str, why: &str) {
    use std::io::Write;
    if std::env::var(ALLOW_SKIPS).as_deref() != Ok("1") {
        panic!("{test} cannot run here: {why} (set {ALLOW_SKIPS}=1 to skip it explicitly)");
    }
    let line = format!("{test}: {why}");
    let _ = writeln!(std::io::stderr(), "SKIP: {line}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-events");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("skip.log"))
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Why /dev/kvm cannot be used here, if it cannot.
pub fn kvm_unusable() -> Option<String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .err()
        .map(|e| format!("/dev/kvm unusable ({e})"))
}

/// Some(()) where /dev/kvm can be used; otherwise `skip_or_fail` and None.
pub fn kvm_or_skip(test: &str) -> Option<()> {
    match kvm_unusable() {
        None => Some(()),
        Some(why) => {
            skip_or_fail(test, &format!("{why}; these tests need KVM"));
            None
        }
    }
}

/// Whether a root caller can run `binary` as `nobody` (setpriv present,
/// the binary reachable for 65534): asked before a check that needs it, so
/// that the check itself never has to guess from mvm's output.
pub fn nobody_can_run(binary: &str) -> Result<(), String> {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(binary)
        .arg("--help")
        .output()
        .map_err(|e| format!("setpriv cannot be run ({e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nobody cannot execute {binary} here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The code of [`parked_guest`].
pub fn parked_guest_code() -> Vec<u8> {
    let mut code = asm::print(b"hi\n");
    code.extend(asm::out_byte(0x440, 1));
    code.extend(asm::PARK);
    code
}

/// An ELF guest that prints "hi", writes the boot marker and parks
/// forever (cli; hlt), written to a temporary file.
pub fn parked_guest() -> vmm_sys_util::tempfile::TempFile {
    use std::io::Write;
    let code = parked_guest_code();
    let file = vmm_sys_util::tempfile::TempFile::new().unwrap();
    file.as_file().write_all(&elf_image(&code)).unwrap();
    file
}

/// A console sink the test reads back: everything the guest printed.
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, d: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(d);
        Ok(d.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Bytes printed so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}
