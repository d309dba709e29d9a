//! `mvm snapshot ls|rm|prune`: the templates `mvm run` keeps in the
//! user's cache (docs/snapshots.md).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use clap::Subcommand;

use super::first_pages;
use super::template::{self, TemplateInfo};
use super::{setup_failure, Failure};

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// List the templates: key, memory and vCPUs, devices, size on disk,
    /// last use, and whether the kernel and mvm it was made with are still
    /// the current ones
    Ls,
    /// Remove templates by key (a unique prefix is enough), each with
    /// the pages its machine's boots touch first; or all of both
    Rm {
        #[arg(long, conflicts_with = "keys")]
        all: bool,
        #[arg(value_name = "KEY")]
        keys: Vec<String>,
    },
    /// Remove templates no run can use any more (made by another mvm
    /// binary or from a kernel or initramfs since rebuilt), damaged ones,
    /// anything left by an interrupted write, and the pages machines'
    /// boots touch first (the next cold boot of each records them again)
    Prune,
}

pub fn command(cmd: &SnapshotCommand) -> Result<i32, Failure> {
    let store = template::store_dir()
        .ok_or_else(|| setup_failure("no template directory: set MVM_TEMPLATES or HOME"))?;
    match cmd {
        SnapshotCommand::Ls => ls(&store),
        SnapshotCommand::Rm { all, keys } => rm(&store, *all, keys),
        SnapshotCommand::Prune => prune(&store),
    }
}

/// One template found in the store.
struct Entry {
    key: String,
    info: Option<TemplateInfo>,
}

fn entries(store: &Path) -> Vec<Entry> {
    let Ok(dir) = fs::read_dir(store) else {
        return Vec::new();
    };
    let mut out: Vec<Entry> = dir
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| template::is_key(name))
        .map(|key| Entry {
            info: fs::read(template::info_path(store, &key))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok()),
            key,
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// Bytes the directory's files take on disk (a template's memory file is
/// sparse: its length says little).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

fn ls(store: &Path) -> Result<i32, Failure> {
    let list = entries(store);
    if list.is_empty() {
        println!("no templates in {}", store.display());
    } else {
        table(store, list);
    }
    let sets = first_pages::count_boot_sets(store);
    if sets > 0 {
        println!(
            "boot pages: the pages {sets} machines' boots touch first, in {} (docs/snapshots.md)",
            store.join(first_pages::BOOT_PAGES_DIR).display()
        );
    }
    Ok(0)
}

fn table(store: &Path, list: Vec<Entry>) {
    println!(
        "{:<32}  {:>7}  {:>4}  {:<5}  {:>6}  {:>9}  {:<8}  KERNEL",
        "KEY", "MEMORY", "CPUS", "ROOT", "SHARES", "ON DISK", "USED"
    );
    for Entry { key, info } in list {
        let size = format!(
            "{:.1}M",
            disk_usage(&store.join(&key)) as f64 / (1 << 20) as f64
        );
        let used = fs::metadata(template::info_path(store, &key))
            .and_then(|m| m.modified())
            .ok()
            .map(ago)
            .unwrap_or_else(|| "?".into());
        match info {
            Some(i) => println!(
                "{key:<32}  {:>6}M  {:>4}  {:<5}  {:>6}  {size:>9}  {used:<8}  {}{}",
                i.mem_mib,
                i.vcpus,
                if i.root_disk { "image" } else { "none" },
                i.shares,
                i.kernel.path.display(),
                if i.is_current() {
                    ""
                } else {
                    " (stale: mvm prune removes it)"
                },
            ),
            None => println!(
                "{key:<32}  {:>7}  {:>4}  {:<5}  {:>6}  {size:>9}  {used:<8}  (no description: mvm snapshot prune removes it)",
                "?", "?", "?", "?"
            ),
        }
    }
}

fn ago(at: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(at)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

fn rm(store: &Path, all: bool, keys: &[String]) -> Result<i32, Failure> {
    let list = entries(store);
    if !all && keys.is_empty() {
        return Err(setup_failure(
            "snapshot rm: name a KEY (from mvm snapshot ls) or pass --all",
        ));
    }
    let mut chosen = Vec::new();
    if all {
        chosen.extend(list.iter().map(|e| e.key.clone()));
    }
    for wanted in keys {
        let matching: Vec<&Entry> = list.iter().filter(|e| e.key.starts_with(wanted)).collect();
        match matching[..] {
            [one] => chosen.push(one.key.clone()),
            [] => {
                return Err(setup_failure(format!(
                    "snapshot rm: no template {wanted} (see mvm snapshot ls)"
                )))
            }
            _ => {
                return Err(setup_failure(format!(
                    "snapshot rm: {wanted} matches {} templates: give more of the key",
                    matching.len()
                )))
            }
        }
    }
    for key in chosen {
        template::remove(store, &key);
        println!("removed {key}");
    }
    if all {
        let sets = first_pages::remove_boot_sets(store);
        if sets > 0 {
            println!("removed the pages {sets} machines' boots touch first");
        }
    }
    Ok(0)
}

fn prune(store: &Path) -> Result<i32, Failure> {
    let mut removed = 0;
    for Entry { key, info } in entries(store) {
        if template::is_locked(store, &key) {
            continue; // being written by a run right now
        }
        let keep = info
            .as_ref()
            .is_some_and(|i| i.is_current() && i.key() == key)
            && crate::machine::snapshot::read(&store.join(&key)).is_ok();
        if !keep {
            template::remove(store, &key);
            println!("removed {key}");
            removed += 1;
        }
    }
    // What interrupted writes leave: temporary directories and files, and
    // locks and descriptions without a template.
    for path in leftovers(store) {
        let _ = fs::remove_dir_all(&path).or_else(|_| fs::remove_file(&path));
        removed += 1;
    }
    // The pages machines' boots touch first: a set says not whose files
    // it was recorded with, and the next cold boot records it again.
    let sets = first_pages::remove_boot_sets(store);
    if sets > 0 {
        println!("removed the pages {sets} machines' boots touch first");
    }
    removed += sets;
    println!("{removed} removed");
    Ok(0)
}

fn leftovers(store: &Path) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(store) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.split('.').find(|s| !s.is_empty())?.to_string();
            let orphan = [".lock", ".json", ".checked"]
                .iter()
                .any(|x| name.ends_with(x))
                && !store.join(&stem).is_dir()
                && !template::is_locked(store, &stem);
            let tmp = name.contains(".tmp-") && !template::is_locked(store, &stem);
            (orphan || tmp).then(|| e.path())
        })
        .collect()
}
