//! Whether the guest kernel's OOM killer struck while a command ran, read
//! from the kernel's log buffer (`/dev/kmsg`), not from the console: the
//! record is stored when the kernel kills, while its console copy can
//! trail the command's `Exit` (and with `mvm run` the machine is stopped
//! on that `Exit`). The agent reports it in `Exit.oom_kill`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;

/// What the kernel logs for each process its OOM killer kills: the global
/// killer ("Out of memory: Killed process N (comm) ...") and a memory
/// cgroup's ("Memory cgroup out of memory: Killed process ...").
const KILL_RECORD: &[u8] = b"out of memory: Killed process ";

/// The log from where it stood when the command started.
pub struct KernelLog(Option<File>);

impl KernelLog {
    /// Marks the end of the log. Without `/dev/kmsg` (a kernel without
    /// printk) nothing is ever seen.
    pub fn mark() -> KernelLog {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/kmsg")
            .and_then(|mut f| f.seek(SeekFrom::End(0)).map(|_| f));
        KernelLog(opened.ok())
    }

    /// Reads the records logged since the mark (or since the last call)
    /// and says whether one of them is an OOM kill.
    pub fn oom_kill_since(&mut self) -> bool {
        let Some(file) = self.0.as_mut() else {
            return false;
        };
        // One record per read; a record is at most about 1 KiB of text.
        let mut record = vec![0u8; 8192];
        let mut seen = false;
        loop {
            match file.read(&mut record) {
                Ok(0) => return seen,
                Ok(n) => seen |= is_oom_kill(&record[..n]),
                // Records overwritten before we read them: go on with the
                // oldest still there.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return seen,
            }
        }
    }
}

/// Where the kernel put its DMA bounce pool, from the record it logged
/// when it made it (`mvm_protocol::boot::bounce_pool_from_log`), read
/// from the oldest record on; None without that record.
pub fn bounce_pool() -> Option<std::ops::Range<u64>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/kmsg")
        .ok()?;
    let mut record = vec![0u8; 8192];
    loop {
        match file.read(&mut record) {
            Ok(0) => return None,
            Ok(n) => {
                let text = String::from_utf8_lossy(&record[..n]);
                if let Some(pool) = mvm_protocol::boot::bounce_pool_from_log(&text) {
                    return Some(pool);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Whether a `/dev/kmsg` record ("PRI,SEQ,USEC,FLAGS;TEXT\n" and
/// continuation lines) is an OOM kill.
fn is_oom_kill(record: &[u8]) -> bool {
    let Some(semi) = record.iter().position(|&b| b == b';') else {
        return false;
    };
    let text = &record[semi + 1..];
    let text = text.split(|&b| b == b'\n').next().unwrap_or_default();
    text.windows(KILL_RECORD.len())
        .any(|w| w.eq_ignore_ascii_case(KILL_RECORD))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_records_of_both_killers_count_and_nothing_else() {
        assert!(is_oom_kill(
            b"3,812,38001234,-;Out of memory: Killed process 211 (eat) total-vm:240000kB, anon-rss:229000kB\n"
        ));
        assert!(is_oom_kill(
            b"3,90,1200,-;Memory cgroup out of memory: Killed process 77 (python3) total-vm:1kB\n"
        ));
        // The header and the dump before the kill are not the kill.
        assert!(!is_oom_kill(
            b"4,800,38000000,-;eat invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0\n"
        ));
        assert!(!is_oom_kill(b"4,801,38000001,-;Mem-Info:\n"));
        // A command can write to the log (as root): only the text after
        // the prefix counts, and a continuation line is not the text.
        assert!(!is_oom_kill(
            b"6,5,1,-;hello\n SUBSYSTEM=Out of memory: Killed process 1\n"
        ));
        assert!(!is_oom_kill(b"no prefix Out of memory: Killed process 1"));
    }
}
