//! What the guest kernel said during one `mvm exec`: the sandbox's
//! console log is the supervisor's, shared by every command, so an exec
//! marks where it stood when its command started and reads only what came
//! after.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use crate::console::OOM_BANNER;

/// Where the sandbox's console log stood when the command started: what
/// the guest kernel printed after that, the OOM killer's report for one,
/// happened in the command's time. The log keeps the first 4 MiB of a
/// sandbox's console (`mvm logs`); past that nothing new is seen.
pub struct ConsoleMark {
    path: PathBuf,
    at: u64,
}

impl ConsoleMark {
    pub fn at_end_of(path: PathBuf) -> ConsoleMark {
        let at = fs::metadata(&path).map_or(0, |m| m.len());
        ConsoleMark { path, at }
    }

    /// Whether the guest's OOM killer has struck since the mark.
    fn oom_since(&self) -> bool {
        let mut text = Vec::new();
        let read = File::open(&self.path).and_then(|mut f| {
            f.seek(SeekFrom::Start(self.at))?;
            f.read_to_end(&mut text)
        });
        read.is_ok() && text.windows(OOM_BANNER.len()).any(|w| w == OOM_BANNER)
    }

    /// Says so, as `mvm run` does, when the guest ran out of memory
    /// during the command. The kernel's report reaches the log through the
    /// serial console, which can trail the exit status on the exec
    /// channel: a command killed by SIGKILL (status 137) gets a second.
    pub fn report_oom(&self, name: &str, status: Option<u8>) {
        let patience = if status == Some(137) { 10 } else { 0 };
        for tries in 0..=patience {
            if self.oom_since() {
                eprintln!(
                    "mvm: the sandbox's guest ran out of memory during the command: its kernel killed a process (mvm logs {name})"
                );
                return;
            }
            if tries < patience {
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use vmm_sys_util::tempfile::TempFile;

    use super::*;

    #[test]
    fn only_an_oom_report_after_the_mark_counts() {
        let log = TempFile::new().unwrap();
        let path = log.as_path().to_path_buf();
        let mut file = log.as_file();
        writeln!(file, "[ 1.0] Out of memory: Killed process 7 (old)").unwrap();
        let mark = ConsoleMark::at_end_of(path);
        assert!(!mark.oom_since(), "a report from before the mark");
        writeln!(file, "[ 9.0] something else").unwrap();
        assert!(!mark.oom_since());
        writeln!(file, "[ 9.1] Out of memory: Killed process 42 (eat)").unwrap();
        assert!(mark.oom_since());
    }
}
