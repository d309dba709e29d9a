//! Where the guest's serial console goes, and the two things the VMM reads
//! from it: whether the guest kernel panicked, and whether its OOM killer
//! struck (a command killed for want of memory otherwise looks like any
//! SIGKILL, exit 137).
//!
//! A panic ends in a reset (`panic=-1 reboot=k`) just like a clean reboot,
//! and without ACPI or PCI there is no pvpanic device to tell them apart, so
//! the console is watched for the kernel's fixed panic banner. Guest-init
//! reports normal exits on the status port, never through this text.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The kernel's panic line (kernel/panic.c), printed at KERN_EMERG.
pub const PANIC_BANNER: &str = "Kernel panic - not syncing";
/// The OOM killer's report (mm/oom_kill.c), printed at KERN_ERR, so it
/// reaches the console even with `quiet`.
pub const OOM_BANNER: &[u8] = b"Out of memory: Killed process";
/// Past this much buffered output a line without a newline is flushed anyway.
const MAX_BUFFERED: usize = 4096;

pub struct ConsoleOutput {
    out: Box<dyn Write + Send>,
    buf: Vec<u8>,
    /// Unflushed tail kept for matching the banner across flushes.
    window: Vec<u8>,
    panic_seen: Arc<AtomicBool>,
    oom_seen: Arc<AtomicBool>,
}

impl ConsoleOutput {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            buf: Vec::with_capacity(MAX_BUFFERED),
            window: Vec::new(),
            panic_seen: Arc::new(AtomicBool::new(false)),
            oom_seen: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn oom_flag(&self) -> Arc<AtomicBool> {
        self.oom_seen.clone()
    }

    pub fn panic_flag(&self) -> Arc<AtomicBool> {
        self.panic_seen.clone()
    }

    fn scan(&mut self, data: &[u8]) {
        self.window.extend_from_slice(data);
        for (banner, flag) in [
            (PANIC_BANNER.as_bytes(), &self.panic_seen),
            (OOM_BANNER, &self.oom_seen),
        ] {
            if self.window.windows(banner.len()).any(|w| w == banner) {
                flag.store(true, Ordering::SeqCst);
            }
        }
        let keep = PANIC_BANNER.len().max(OOM_BANNER.len()) - 1;
        if self.window.len() > keep {
            self.window.drain(..self.window.len() - keep);
        }
    }

    /// Writes out whatever is buffered, newline or not. What a failing
    /// sink (a closed stdout) did not take is dropped, never kept: the
    /// guest must not be able to grow this buffer without bound.
    pub fn drain(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let written = self.out.write_all(&self.buf);
            self.buf.clear();
            written?;
        }
        self.out.flush()
    }
}

impl Write for ConsoleOutput {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.scan(data);
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    /// The UART flushes after every byte; passing that on would cost a
    /// syscall per byte, so output goes out a line at a time.
    fn flush(&mut self) -> io::Result<()> {
        if self.buf.last() == Some(&b'\n') || self.buf.len() >= MAX_BUFFERED {
            self.drain()?;
        }
        Ok(())
    }
}

/// A writer that keeps the first `limit` bytes and drops the rest, for the
/// console log file: a guest printing without end must not fill the host's
/// disk.
pub struct Capped<W: Write> {
    inner: W,
    left: u64,
}

impl<W: Write> Capped<W> {
    pub fn new(inner: W, limit: u64) -> Self {
        Self { inner, left: limit }
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let keep = data
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if keep > 0 {
            self.inner.write_all(&data[..keep])?;
            self.left -= keep as u64;
        }
        // Everything is accepted: the excess is dropped, not an error.
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_sink_does_not_let_the_buffer_grow() {
        let mut c = ConsoleOutput::new(Box::new(Broken));
        let line = [b'x'; 1000];
        for _ in 0..10_000 {
            c.write_all(&line).unwrap();
            let _ = c.flush();
            assert!(c.buf.len() <= MAX_BUFFERED + line.len(), "{}", c.buf.len());
        }
        c.write_all(b"Kernel panic - not syncing: x\n").unwrap();
        assert!(c.panic_flag().load(Ordering::SeqCst), "still watched");
    }
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, d: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(d);
            Ok(d.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn feed(c: &mut ConsoleOutput, text: &[u8]) {
        for b in text {
            c.write_all(&[*b]).unwrap();
            c.flush().unwrap();
        }
    }

    #[test]
    fn output_goes_out_by_line() {
        let sink = Shared::default();
        let mut c = ConsoleOutput::new(Box::new(sink.clone()));
        feed(&mut c, b"hello\npartial");
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello\n");
        c.drain().unwrap();
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello\npartial");
    }

    #[test]
    fn detects_panic_banner_split_across_bytes() {
        let mut c = ConsoleOutput::new(Box::new(io::sink()));
        let flag = c.panic_flag();
        feed(&mut c, b"[    1.0] Kernel panic - not synci");
        assert!(!flag.load(Ordering::SeqCst));
        feed(&mut c, b"ng: Attempted to kill init!\n");
        assert!(flag.load(Ordering::SeqCst));
    }

    #[test]
    fn detects_the_oom_killer_and_nothing_else() {
        let mut c = ConsoleOutput::new(Box::new(io::sink()));
        let (oom, panic) = (c.oom_flag(), c.panic_flag());
        feed(&mut c, b"[    3.1] Out of memory: Killed proc");
        assert!(!oom.load(Ordering::SeqCst));
        feed(&mut c, b"ess 57 (eat) total-vm:300000kB\n");
        assert!(oom.load(Ordering::SeqCst));
        assert!(!panic.load(Ordering::SeqCst));
    }

    #[test]
    fn capped_writer_keeps_the_head_and_drops_the_rest() {
        let sink = Shared::default();
        let mut w = Capped::new(sink.clone(), 5);
        w.write_all(b"abc").unwrap();
        w.write_all(b"defgh").unwrap();
        w.write_all(b"ij").unwrap();
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"abcde");
    }

    #[test]
    fn ordinary_output_is_not_a_panic() {
        let mut c = ConsoleOutput::new(Box::new(io::sink()));
        let flag = c.panic_flag();
        feed(&mut c, b"Kernel panic - not yet\nmvm-init: ready\n");
        assert!(!flag.load(Ordering::SeqCst));
    }
}
