//! What containerd's runc shim does with a runtime, for one container:
//! it becomes a child subreaper, runs `RUNTIME create` with its own pipes
//! as the container's stdout and stderr, reads the pid file, `start`s the
//! container, waits for that pid (its child now, as the shim's is) and
//! reads the container's exit status and output, then `delete`s it.
//! Built with rustc alone (std, statically linked) by tests/e2e/oci.rs and
//! run in the test host, which has no shell tools for this.
//!
//!     oci-shim RUNTIME ROOT BUNDLE ID [SIGNAL]
//!
//! With `tty` for SIGNAL, the container and an exec run on ptys whose
//! controlling ends come over console sockets (`tty` below).
//! With SIGNAL, a process is run in the container with `exec --detach`,
//! then `kill ID SIGNAL` is sent, once the container printed a line
//! `ready`. Prints `key=value` lines, the container's output as
//! `out:LINE` and the exec's as `exec-out:LINE` and `exec-err:LINE`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};

extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn recvmsg(fd: i32, msg: *mut MsgHdr, flags: i32) -> isize;
}

/// struct iovec and struct msghdr of x86_64 Linux.
#[repr(C)]
struct IoVec {
    base: *mut u8,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    namelen: u32,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: i32,
}

const PR_SET_CHILD_SUBREAPER: i32 = 36;

fn runtime(rt: &str, root: &str, args: &[&str]) -> (i32, String, String) {
    let log = format!("{root}/log.json");
    let out = Command::new(rt)
        .args(["--root", root, "--log", &log, "--log-format", "json"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the runtime");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

fn status_field(state: &str) -> String {
    // "status": "created", as runc and mvm print it.
    state
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"status\": \""))
        .map(|s| s.trim_end_matches([',', '"']).to_string())
        .unwrap_or_else(|| "none".into())
}

/// `exec --detach` as the shim runs it: the exec's output comes through
/// the runtime's own stdout and stderr (the detached process holds them),
/// and the pid file's process, reparented to us, ends with its status.
fn exec(rt: &str, root: &str, id: &str, process: &str) {
    let pid_file = format!("{root}/{id}.exec.pid");
    let (code, out, err) = runtime(
        rt,
        root,
        &["exec", "--process", process, "--detach", "--pid-file", &pid_file, id],
    );
    println!("exec={code}");
    for line in out.lines() {
        println!("exec-out:{line}");
    }
    for line in err.lines() {
        println!("exec-err:{line}");
    }
    let Ok(pid) = std::fs::read_to_string(&pid_file).map(|p| p.trim().parse::<i32>().unwrap_or(0)) else {
        println!("exec-pid-file=missing");
        return;
    };
    let mut status = 0;
    // SAFETY: waits for the exec's process, reparented to us.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    println!("exec-waited={}", waited == pid);
    println!("exec-exit={}", (status >> 8) & 0xff);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, rt, root, bundle, id, rest @ ..] = &args[..] else {
        eprintln!("usage: oci-shim RUNTIME ROOT BUNDLE ID [SIGNAL]");
        std::process::exit(2);
    };
    let signal = rest.first();
    // SAFETY: a plain prctl on this process.
    assert_eq!(unsafe { prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }, 0);
    if signal.is_some_and(|s| s == "tty") {
        return tty(rt, root, bundle, id);
    }
    let pid_file = format!("{root}/{id}.pid");
    let log = format!("{root}/log.json");
    std::fs::create_dir_all(root).unwrap();
    let mut create = Command::new(rt)
        .args(["--root", root, "--log", &log, "--log-format", "json"])
        .args(["create", "--bundle", bundle, "--pid-file", &pid_file, id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run create");
    let stdout = create.stdout.take().unwrap();
    let mut stderr = create.stderr.take().unwrap();
    let created = create.wait().unwrap();
    println!("create={}", created.code().unwrap_or(-1));
    if !created.success() {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        println!("create-stderr={}", text.trim());
        return;
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    println!("pid-file={pid}");
    let (_, state, _) = runtime(rt, root, &["state", id]);
    println!("state-before-start={}", status_field(&state));
    println!(
        "state-pid-matches={}",
        state.contains(&format!("\"pid\": {pid}"))
    );
    // An exec's process, run with `exec --process` as the shim does.
    let process = format!("{bundle}/process.json");
    std::fs::write(
        &process,
        r#"{"args": ["sh", "-c", "cat /etc/marker; echo exec-env=$FROM_EXEC; cat /proc/sys/kernel/hostname; echo exec-err >&2; exit 6"],
            "env": ["PATH=/bin", "FROM_EXEC=yes"], "cwd": "/", "user": {"uid": 0, "gid": 0}}"#,
    )
    .unwrap();
    let (code, _, err) = runtime(rt, root, &["exec", "--process", &process, id]);
    println!("exec-before-start={code} {err}");
    let (code, _, err) = runtime(rt, root, &["start", id]);
    println!("start={code} {err}");
    let (code, _, err) = runtime(rt, root, &["start", id]);
    println!("start-again={code} {err}");
    let (_, state, _) = runtime(rt, root, &["state", id]);
    println!("state-after-start={}", status_field(&state));
    let (code, out, _) = runtime(rt, root, &["ps", "--format", "json", id]);
    println!("ps={code} {}", out.trim());
    let mut lines = BufReader::new(stdout).lines();
    if let Some(signal) = signal {
        for line in lines.by_ref() {
            let line = line.unwrap_or_default();
            println!("out:{line}");
            if line == "ready" {
                exec(rt, root, id, &process);
                let (code, _, err) = runtime(rt, root, &["kill", id, signal]);
                println!("kill={code} {err}");
                break;
            }
        }
    }
    for line in lines {
        println!("out:{}", line.unwrap_or_default());
    }
    let mut text = String::new();
    let _ = stderr.read_to_string(&mut text);
    for line in text.lines() {
        println!("err:{line}");
    }
    let mut status = 0;
    // SAFETY: waits for the container's process, reparented to us.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    println!("waited={}", waited == pid);
    if status & 0x7f == 0 {
        println!("exit={}", (status >> 8) & 0xff);
    } else {
        println!("signal={}", status & 0x7f);
    }
    let (_, state, _) = runtime(rt, root, &["state", id]);
    println!("state-after-exit={}", status_field(&state));
    let (code, _, err) = runtime(rt, root, &["delete", id]);
    println!("delete={code} {err}");
    let (code, _, err) = runtime(rt, root, &["state", id]);
    println!("state-after-delete={code} {err}");
    println!(
        "dir-after-delete={}",
        std::path::Path::new(&format!("{root}/{id}")).exists()
    );
}

/// The pty's controlling end a runtime sends over a console socket
/// (SCM_RIGHTS, one fd), as the shim receives it.
fn receive_console(listener: &UnixListener) -> File {
    let (conn, _) = listener.accept().expect("accept the console socket");
    let mut byte = [0u8; 64];
    let mut iov = IoVec {
        base: byte.as_mut_ptr(),
        len: byte.len(),
    };
    // cmsghdr (len, level, type: 16 bytes) and one fd, 8-byte aligned.
    let mut control = [0u64; 4];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: control.as_mut_ptr().cast(),
        controllen: 24,
        flags: 0,
    };
    // SAFETY: every pointer in msg is valid for the sizes given.
    let n = unsafe { recvmsg(conn.as_raw_fd(), &mut msg, 0) };
    assert!(n > 0, "nothing on the console socket");
    let level = (control[1] & 0xffff_ffff) as i32;
    let kind = (control[1] >> 32) as i32;
    assert!(level == 1 && kind == 1, "no SCM_RIGHTS on the console socket");
    // SAFETY: the kernel just installed this fd for us.
    unsafe { File::from_raw_fd((control[2] & 0xffff_ffff) as i32) }
}

/// Lines from a pty's controlling end (without the tty's \r) until
/// `last` or the other end's close; each printed as `PREFIX:LINE`.
fn pty_lines(master: &mut BufReader<File>, prefix: &str, last: Option<&str>) {
    let mut line = String::new();
    loop {
        line.clear();
        match master.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = line.trim_end_matches(['\r', '\n']);
        println!("{prefix}:{text}");
        if last == Some(text) {
            return;
        }
    }
}

/// `process.terminal`: `create --console-socket`, the container's
/// process on a pty whose controlling end came over the socket; an
/// `exec --tty` the same way with a size of its own; then a line typed
/// on the container's pty ends it.
fn tty(rt: &str, root: &str, bundle: &str, id: &str) {
    std::fs::create_dir_all(root).unwrap();
    let log = format!("{root}/log.json");
    let pid_file = format!("{root}/{id}.pid");
    let socket = format!("{root}/{id}.console");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let created = Command::new(rt)
        .args(["--root", root, "--log", &log, "--log-format", "json"])
        .args(["create", "--bundle", bundle, "--pid-file", &pid_file])
        .args(["--console-socket", &socket, id])
        .stdin(Stdio::null())
        .output()
        .expect("run create");
    println!("create={}", created.status.code().unwrap_or(-1));
    if !created.status.success() {
        println!("create-stderr={}", String::from_utf8_lossy(&created.stderr).trim());
        return;
    }
    let master = receive_console(&listener);
    let mut input = master.try_clone().unwrap();
    let mut main = BufReader::new(master);
    let (code, _, err) = runtime(rt, root, &["start", id]);
    println!("start={code} {err}");
    pty_lines(&mut main, "main", Some("main-waits"));
    let process = format!("{bundle}/process-tty.json");
    std::fs::write(
        &process,
        r#"{"args": ["sh", "-c", "stty size; [ -t 0 ] && [ -t 1 ] && echo exec-on-tty; exit 5"],
            "env": ["PATH=/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0},
            "terminal": true, "consoleSize": {"height": 30, "width": 100}}"#,
    )
    .unwrap();
    let exec_socket = format!("{root}/{id}.exec-console");
    let _ = std::fs::remove_file(&exec_socket);
    let exec_listener = UnixListener::bind(&exec_socket).unwrap();
    let exec_pid_file = format!("{root}/{id}.exec.pid");
    let (code, _, err) = runtime(
        rt,
        root,
        &[
            "exec", "--process", &process, "--detach", "--pid-file", &exec_pid_file,
            "--console-socket", &exec_socket, id,
        ],
    );
    println!("exec={code} {err}");
    if code == 0 {
        let mut exec_master = BufReader::new(receive_console(&exec_listener));
        pty_lines(&mut exec_master, "exec", None);
        let pid: i32 = std::fs::read_to_string(&exec_pid_file).unwrap().trim().parse().unwrap();
        let mut status = 0;
        // SAFETY: waits for the exec's process, reparented to us.
        let waited = unsafe { waitpid(pid, &mut status, 0) };
        println!("exec-waited={}", waited == pid);
        println!("exec-exit={}", (status >> 8) & 0xff);
    }
    input.write_all(b"typed\n").unwrap();
    pty_lines(&mut main, "main", None);
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let mut status = 0;
    // SAFETY: waits for the container's process, reparented to us.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    println!("waited={}", waited == pid);
    println!("exit={}", (status >> 8) & 0xff);
    let (code, _, err) = runtime(rt, root, &["delete", id]);
    println!("delete={code} {err}");
}
