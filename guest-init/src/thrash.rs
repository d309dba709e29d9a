//! Thrashing prevention: a command that fills the guest's memory meets the
//! kernel's OOM killer instead of leaving the guest to thrash.
//!
//! The guest has no swap, so once the command's anonymous memory fills it
//! the only pages left to reclaim are file pages (the workspace's
//! binaries, a sandbox disk's cache). The command reads them straight
//! back, the classic reclaim counts each round as progress, and the OOM
//! killer never comes: a memory bomb in a sandbox ran into `--timeout`
//! after minutes instead of ending with 137. The multi-generational LRU
//! (CONFIG_LRU_GEN in guest-kernel/guest.config) calls the OOM killer when
//! the pages used in the last `MIN_TTL_MS` cannot be kept in memory (the
//! kernel's admin guide, "Thrashing prevention", recommends 1000 ms).
//! Guest-only, no unit tests: the containment battery's check 5 (through
//! `mvm run` and through a sandbox) is its test.

use std::io;

const MIN_TTL: &str = "/sys/kernel/mm/lru_gen/min_ttl_ms";
const MIN_TTL_MS: &str = "1000";

/// Turns the prevention on. A kernel without the multi-generational LRU
/// (a user's own `--kernel`) has no such file: the guest then runs
/// without it, as any Linux system does.
pub fn prevent() -> io::Result<()> {
    std::fs::write(MIN_TTL, MIN_TTL_MS)
}
