//! Unit tests of `front::first_pages`: one run records, the others wait
//! for it or use what it wrote, and a file left half-written goes.

use super::*;

const MIB: u64 = 1 << 20;

/// One range, as a list (clippy reads `vec![a..b]` as a mistake).
fn one(range: std::ops::Range<u64>) -> Vec<std::ops::Range<u64>> {
    vec![range]
}

fn template_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mvm-first-pages-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn set() -> WorkingSet {
    WorkingSet {
        mem_size: 64 * MIB,
        written: one(0..4096),
        mapped: one(MIB..MIB + 8192),
    }
}

#[test]
fn the_first_run_records_and_the_next_map_ahead() {
    let dir = template_dir("record");
    let FirstPages::Record(recorder) = for_restore(&dir, 64 * MIB, true) else {
        panic!("no file: this run records");
    };
    // While it records, the others neither record nor remove its file.
    assert!(matches!(
        for_restore(&dir, 64 * MIB, true),
        FirstPages::Neither
    ));
    assert!(dir.join(PAGES_FILE).exists());
    assert_eq!(recorder.write(set()).unwrap(), 3 * 4096);
    match for_restore(&dir, 64 * MIB, true) {
        FirstPages::Ahead(read) => assert_eq!(read, set()),
        _ => panic!("the recorded set is not read back"),
    }
    // A machine of another size does not use it (and is not keyed to it).
    assert!(matches!(
        for_restore(&dir, 128 * MIB, true),
        FirstPages::Neither
    ));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_nobody_finished_goes_and_is_recorded_again() {
    let dir = template_dir("stale");
    let FirstPages::Record(recorder) = for_restore(&dir, 64 * MIB, true) else {
        panic!("no file: this run records");
    };
    // The run ended before its marker: an empty file, no lock.
    drop(recorder);
    assert!(matches!(
        for_restore(&dir, 64 * MIB, true),
        FirstPages::Neither
    ));
    assert!(!dir.join(PAGES_FILE).exists(), "the stale file stayed");
    assert!(matches!(
        for_restore(&dir, 64 * MIB, true),
        FirstPages::Record(_)
    ));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_that_sends_no_marker_records_nothing() {
    let dir = template_dir("no-marker");
    assert!(matches!(
        for_restore(&dir, 64 * MIB, false),
        FirstPages::Neither
    ));
    assert!(!dir.join(PAGES_FILE).exists());
    fs::remove_dir_all(&dir).unwrap();
}
