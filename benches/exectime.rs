//! exectime: runs one command and timestamps what it does, for
//! benches/bench.py (built statically by scripts/bundle-peers.sh, so that it
//! also runs in the test host's bare initramfs). Standard library only; the
//! few libc calls std does not wrap are declared here.
//!
//!   exectime [--label L] [--marker FD]... [--lines FD]...
//!            [--snapshot-at TEXT [--guest-kib N]] [--tree] [--timeout S]
//!            -- CMD ARGS...
//!
//! All times are milliseconds since just before the fork, from
//! CLOCK_MONOTONIC (std's Instant). Prints, each line starting with L:
//!
//!   L mark FD MS BYTE     every byte the command writes to fd FD (a pipe
//!                         set up for each --marker; e.g. QEMU's
//!                         isa-debugcon chardev on /proc/self/fd/FD)
//!   L line FD MS TEXT     every line the command writes to fd FD: its
//!                         stderr (2), and a pipe set up for each --lines
//!                         (e.g. QEMU's serial console)
//!   L snap MS guest_size_kib=N guest_rss_kib=N hwm_kib=N
//!                         with --snapshot-at TEXT: when a line containing
//!                         TEXT arrives, the command is stopped (SIGSTOP),
//!                         the size and Rss of its smallest anonymous
//!                         mapping of N KiB or more (a VMM's guest RAM)
//!                         and its VmHWM are read from /proc/PID/smaps and
//!                         status, and it is continued (SIGCONT). The run's
//!                         times then include the pause.
//!   L tree PEAK_KIB SAMPLES
//!                         with --tree: the highest sum, over the samples
//!                         taken every 20 ms while the command ran, of the
//!                         Pss (/proc/PID/smaps_rollup) of the command and
//!                         every process below it (a VMM and its helpers,
//!                         e.g. virtiofsd): its whole footprint, where
//!                         wait4's MAXRSS is one process's (or the largest
//!                         reaped child's) and double counts nothing only
//!                         by leaving the others out. Pss shares a page
//!                         among the processes mapping it, so memory the
//!                         VMM shares with a helper (guest RAM virtiofsd
//!                         maps) is counted once.
//!   L exit MS STATUS MAXRSS_KIB
//!                         the command reaped (wait4): its exit status
//!                         (128 + signal if killed) and peak RSS
//!
//! The command's stdin and stdout are /dev/null. --timeout kills it
//! (SIGKILL) after S seconds. exectime exits with the command's status (125
//! if it could not run it).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    maxrss: i64,
    rest: [i64; 13],
}

extern "C" {
    fn pipe2(fds: *mut i32, flags: i32) -> i32;
    fn dup2(old: i32, new: i32) -> i32;
    fn fcntl(fd: i32, cmd: i32, ...) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
}

const O_CLOEXEC: i32 = 0o2000000;
const F_SETFD: i32 = 2;
const F_DUPFD_CLOEXEC: i32 = 1030;
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

fn die(msg: &str) -> ! {
    eprintln!("exectime: {msg}");
    std::process::exit(125);
}

fn usage() -> ! {
    die("usage: exectime [--label L] [--marker FD]... [--lines FD]... [--snapshot-at TEXT [--guest-kib N]] [--timeout S] -- CMD ARGS...")
}

/// (read end, write end), both close-on-exec, numbered above 100 so that
/// putting the write end at FD in the child never clobbers another.
fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid out-array of two ints.
    if unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) } != 0 {
        die(&format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    fds.map(|fd| {
        // SAFETY: fd is ours; the duplicate is close-on-exec.
        let high = unsafe { fcntl(fd, F_DUPFD_CLOEXEC, 100) };
        if high < 0 {
            die(&format!("fcntl: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is ours and no longer used.
        drop(unsafe { File::from_raw_fd(fd) });
        high
    })
    .into()
}

/// Size and Rss (KiB) of the smallest anonymous mapping in smaps at least
/// `min_kib` large: a VMM's guest RAM (which may come with a guard page or
/// alignment slack), not a bigger buffer such as QEMU's TCG code cache.
fn guest_mapping(smaps: &str, min_kib: u64) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut anon = false;
    let mut size = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: "start-end perms offset dev inode [path]".
            anon = line.split_whitespace().nth(5).is_none();
            size = 0;
        } else if first == "Size:" {
            size = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        } else if first == "Rss:" && anon {
            let rss = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if size >= min_kib && best.is_none_or(|(s, _)| size < s) {
                best = Some((size, rss));
            }
        }
    }
    best
}

fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

enum Event {
    Byte(RawFd, f64, u8),
    Line(RawFd, f64, String),
    Snap(f64, String),
}

fn parse_fd(v: String) -> RawFd {
    match v.parse() {
        Ok(fd) if (3..100).contains(&fd) => fd,
        _ => usage(),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut label = String::from("-");
    let mut markers: Vec<RawFd> = Vec::new();
    let mut line_fds: Vec<RawFd> = Vec::new();
    let mut snapshot_at: Option<String> = None;
    let mut guest_kib: u64 = 0;
    let mut timeout: Option<f64> = None;
    let mut tree = false;
    let mut cmd: Vec<String> = Vec::new();
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--label" => label = value(),
            "--marker" => markers.push(parse_fd(value())),
            "--lines" => line_fds.push(parse_fd(value())),
            "--snapshot-at" => snapshot_at = Some(value()),
            "--guest-kib" => guest_kib = value().parse().unwrap_or_else(|_| usage()),
            "--timeout" => timeout = Some(value().parse().unwrap_or_else(|_| usage())),
            "--tree" => tree = true,
            "--" => {
                cmd = args.by_ref().collect();
                break;
            }
            _ => usage(),
        }
    }
    if cmd.is_empty() {
        usage();
    }

    // (fd in the child, read end, write end, line-wise)
    let pipes: Vec<(RawFd, RawFd, RawFd, bool)> = markers
        .iter()
        .map(|&fd| (fd, false))
        .chain(line_fds.iter().map(|&fd| (fd, true)))
        .map(|(fd, lines)| {
            let (r, w) = pipe();
            (fd, r, w, lines)
        })
        .collect();
    let child_ends: Vec<(RawFd, RawFd)> = pipes.iter().map(|&(fd, _, w, _)| (w, fd)).collect();
    let mut command = Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            for &(w, fd) in &child_ends {
                if dup2(w, fd) < 0 || fcntl(fd, F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }

    let t0 = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| die(&format!("cannot run {}: {e}", cmd[0])));
    let pid = child.id() as i32;
    let ms = move || t0.elapsed().as_secs_f64() * 1e3;
    let snapped = Arc::new(AtomicBool::new(false));

    let (tx, rx) = mpsc::channel::<Event>();
    let mut readers = Vec::new();
    let mut line_sources: Vec<(RawFd, Box<dyn Read + Send>)> = Vec::new();
    for &(fd, r, w, lines) in &pipes {
        // SAFETY: the write end is ours; the child has its own copy.
        drop(unsafe { File::from_raw_fd(w) });
        // SAFETY: the read end is ours and used only by its reader.
        let mut file = unsafe { File::from_raw_fd(r) };
        if lines {
            line_sources.push((fd, Box::new(file)));
            continue;
        }
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let at = ms();
                for &b in &buf[..n] {
                    let _ = tx.send(Event::Byte(fd, at, b));
                }
            }
        }));
    }
    line_sources.push((2, Box::new(child.stderr.take().expect("piped stderr"))));
    for (fd, source) in line_sources {
        let tx = tx.clone();
        let snapshot_at = snapshot_at.clone();
        let snapped = snapped.clone();
        readers.push(std::thread::spawn(move || {
            let mut lines = BufReader::new(source);
            let mut line = Vec::new();
            while let Ok(n) = lines.read_until(b'\n', &mut line) {
                if n == 0 {
                    break;
                }
                let at = ms();
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                if snapshot_at.as_deref().is_some_and(|t| text.contains(t))
                    && !snapped.swap(true, Ordering::SeqCst)
                {
                    let _ = tx.send(Event::Snap(at, snapshot(pid, guest_kib)));
                }
                let _ = tx.send(Event::Line(fd, at, text));
                line.clear();
            }
        }));
    }
    drop(tx);

    let done = Arc::new(AtomicBool::new(false));
    if let Some(secs) = timeout {
        let done = done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(secs));
            if !done.load(Ordering::SeqCst) {
                // SAFETY: pid is our unreaped child (done is set before reaping).
                unsafe { kill(pid, SIGKILL) };
            }
        });
    }

    let sampler = tree.then(|| {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut peak, mut samples) = (0u64, 0u64);
            while !done.load(Ordering::SeqCst) {
                peak = peak.max(tree_pss_kib(pid));
                samples += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (peak, samples)
        })
    });

    let mut status = 0i32;
    let mut usage = Rusage {
        utime: Timeval { sec: 0, usec: 0 },
        stime: Timeval { sec: 0, usec: 0 },
        maxrss: 0,
        rest: [0; 13],
    };
    // Not child.wait(): that would not give us the rusage.
    let reaped = loop {
        // SAFETY: valid out-pointers; pid is our child.
        let rc = unsafe { wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            break ms();
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            die(&format!("wait4: {}", std::io::Error::last_os_error()));
        }
    };
    done.store(true, Ordering::SeqCst);
    // Reaped above: dropping it would not wait again, but be explicit.
    std::mem::forget(child);
    // Readers end at EOF: when every process holding a write end is gone.
    for r in readers {
        let _ = r.join();
    }
    let code = if status & 0x7f == 0 {
        (status >> 8) & 0xff
    } else {
        128 + (status & 0x7f)
    };

    let mut out = std::io::stdout().lock();
    let mut events: Vec<Event> = rx.into_iter().collect();
    events.sort_by(|a, b| key(a).total_cmp(&key(b)));
    for e in events {
        let _ = match e {
            Event::Byte(fd, at, b) => writeln!(out, "{label} mark {fd} {at:.3} {b}"),
            Event::Line(fd, at, text) => writeln!(out, "{label} line {fd} {at:.3} {text}"),
            Event::Snap(at, text) => writeln!(out, "{label} snap {at:.3} {text}"),
        };
    }
    if let Some((peak, samples)) = sampler.and_then(|s| s.join().ok()) {
        let _ = writeln!(out, "{label} tree {peak} {samples}");
    }
    let _ = writeln!(out, "{label} exit {reaped:.3} {code} {}", usage.maxrss);
    let _ = out.flush();
    std::process::exit(code);
}

/// The sum of the Pss of `root` and of every process descending from it
/// (by /proc/PID/stat's ppid), in KiB; processes gone meanwhile count 0.
fn tree_pss_kib(root: i32) -> u64 {
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // "PID (COMM) STATE PPID ...": comm may hold spaces, not ')'.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok())
        {
            parent.insert(pid, ppid);
        }
    }
    let below_root = |mut pid: i32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parent.get(&pid) {
                Some(&p) if p > 0 => pid = p,
                _ => return false,
            }
        }
        false
    };
    parent
        .keys()
        .filter(|&&pid| below_root(pid))
        .map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
                .ok()
                .and_then(|s| status_field(&s, "Pss:"))
                .unwrap_or(0)
        })
        .sum()
}

fn key(e: &Event) -> f64 {
    match e {
        Event::Byte(_, at, _) | Event::Line(_, at, _) | Event::Snap(at, _) => *at,
    }
}

/// Stops the process, reads its guest mapping and VmHWM, continues it.
/// (`pid` is unreaped: the caller still reads a pipe it holds open.)
fn snapshot(pid: i32, guest_kib: u64) -> String {
    // SAFETY: pid is our unreaped child (we are still reading its pipe).
    unsafe { kill(pid, SIGSTOP) };
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    // SAFETY: as above.
    unsafe { kill(pid, SIGCONT) };
    match (
        guest_mapping(&smaps, guest_kib),
        status_field(&status, "VmHWM:"),
    ) {
        (Some((size, rss)), Some(hwm)) => {
            format!("guest_size_kib={size} guest_rss_kib={rss} hwm_kib={hwm}")
        }
        (None, Some(_)) => format!("unavailable (no anonymous mapping of {guest_kib} KiB or more)"),
        _ => "unavailable (the process had already exited)".into(),
    }
}
