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

/// A template store of the caller's alone, as mvm makes it.
fn boot_store(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let store = template_dir(name);
    fs::set_permissions(&store, fs::Permissions::from_mode(0o700)).unwrap();
    store
}

/// Where the boot set of template `key`'s machine is kept.
fn set_path(store: &Path, key: &str) -> std::path::PathBuf {
    store.join(BOOT_PAGES_DIR).join(key)
}

/// A machine of 64 MiB whose kernel is a file in `dir`.
fn machine(dir: &Path, cmdline: &str) -> VmConfig {
    VmConfig {
        cmdline: cmdline.into(),
        mem_size: 64 * MIB,
        ..template::tests::config(dir)
    }
}

#[test]
fn a_boot_records_its_machines_set_and_the_next_boots_map_it_ahead() {
    use std::os::unix::fs::PermissionsExt;
    let store = boot_store("boot");
    let config = machine(&store, "panic=-1");
    let path = set_path(&store, &TemplateInfo::of(&config).unwrap().key());
    let FirstPages::Record(recorder) = for_boot(&store, &config, true) else {
        panic!("no set: this boot records");
    };
    assert!(path.exists(), "recorded under the machine's template key");
    let dir_mode = fs::metadata(store.join(BOOT_PAGES_DIR))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    assert!(matches!(
        for_boot(&store, &config, true),
        FirstPages::Neither
    ));
    recorder.write(set()).unwrap();
    match for_boot(&store, &config, true) {
        FirstPages::Ahead(read) => assert_eq!(read, set()),
        _ => panic!("the recorded set is not read back"),
    }
    // Another machine (another command line) has none, and a boot that
    // may not record (a served run's) leaves none.
    let other = machine(&store, "panic=-1 quiet");
    let other_path = set_path(&store, &TemplateInfo::of(&other).unwrap().key());
    assert!(matches!(
        for_boot(&store, &other, false),
        FirstPages::Neither
    ));
    assert!(!other_path.exists());
    // A directory not the caller's alone is neither read nor written.
    fs::set_permissions(
        store.join(BOOT_PAGES_DIR),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    for may_record in [false, true] {
        assert!(matches!(
            for_boot(&store, &config, may_record),
            FirstPages::Neither
        ));
    }
    // Nor is a link to a directory of the caller's, and `prune` removes
    // nothing through it.
    let elsewhere = boot_store("boot-elsewhere");
    let key = TemplateInfo::of(&config).unwrap().key();
    fs::write(elsewhere.join(&key), b"not a set").unwrap();
    fs::remove_dir_all(store.join(BOOT_PAGES_DIR)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, store.join(BOOT_PAGES_DIR)).unwrap();
    for may_record in [false, true] {
        assert!(matches!(
            for_boot(&store, &config, may_record),
            FirstPages::Neither
        ));
    }
    assert_eq!(remove_boot_sets(&store), 0);
    assert!(elsewhere.join(&key).exists());
    fs::remove_dir_all(&elsewhere).unwrap();
    fs::remove_dir_all(&store).unwrap();
}

#[test]
fn boot_sets_go_with_prune_unless_being_written_and_with_their_template() {
    let store = boot_store("boot-prune");
    let config = machine(&store, "panic=-1");
    let key = TemplateInfo::of(&config).unwrap().key();
    let FirstPages::Record(recorder) = for_boot(&store, &config, true) else {
        panic!("no set: this boot records");
    };
    recorder.write(set()).unwrap();
    let busy_config = machine(&store, "panic=-1 quiet");
    let FirstPages::Record(busy) = for_boot(&store, &busy_config, true) else {
        panic!("no set: this boot records");
    };
    assert!(set_path(&store, &key).exists());
    assert_eq!(remove_boot_sets(&store), 1);
    assert!(!set_path(&store, &key).exists());
    drop(busy);
    assert_eq!(remove_boot_sets(&store), 1, "once no run writes it");
    // `mvm snapshot rm KEY` takes the machine's set with its template.
    let FirstPages::Record(recorder) = for_boot(&store, &config, true) else {
        panic!("no set: this boot records");
    };
    recorder.write(set()).unwrap();
    assert!(set_path(&store, &key).exists());
    template::remove(&store, &key);
    assert!(!set_path(&store, &key).exists());
    fs::remove_dir_all(&store).unwrap();
}
