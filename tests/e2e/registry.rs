//! `mvm image pull` and `--image HOST/NAME:TAG` against a real registry:
//! Debian's docker-registry (the distribution registry), started by each
//! test on 127.0.0.1 with its storage in a temp dir, and the suite's own
//! test image copied in by Debian's skopeo (a peer tool, not our code).
//! Request counts come from the registry's own access log. Pulls run on
//! this machine (`build/bin/mvm`, no VM needed); one run boots the pulled
//! image through the test host, which cannot reach this machine's
//! registry: it proves the stored image runs without the network.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mvm_e2e::{build_dir, mvm_with, repo_root, skip_or_fail, Options};

const USER: &str = "mvmtest";
const PASSWORD: &str = "mvm-test-password";
/// bcrypt of PASSWORD (`htpasswd -nbB`), so the test needs no htpasswd.
const HTPASSWD: &str = "mvmtest:$2y$05$lC.HhGTndYlnmTe5SeCnLeoyvRxvpYcsak4DKvAm1elBPwc9bqGYC\n";
const REPO: &str = "mvm-test/layers";

fn work_dir() -> PathBuf {
    repo_root().join("target/e2e-registry")
}

/// The test image's OCI layout, built once per test process.
fn test_image() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = work_dir().join("layers");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(work_dir()).unwrap();
        let status = Command::new(repo_root().join("tests/e2e/images/make-test-image.sh"))
            .arg(&dir)
            // Its stdout is the manifest digest, not wanted in the test log.
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run make-test-image.sh");
        assert!(status.success(), "make-test-image.sh failed");
        dir
    })
}

/// The tools the tests need, or a skip (a failure unless MVM_ALLOW_SKIPS=1).
fn have_tools(test: &str) -> bool {
    for tool in ["docker-registry", "skopeo"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            skip_or_fail(test, &format!("{tool} is not installed (make deps)"));
            return false;
        }
    }
    true
}

/// A port nobody listens on (bound, then let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One docker-registry on 127.0.0.1, killed when dropped.
struct Registry {
    child: Child,
    host: String,
    log: PathBuf,
    dir: PathBuf,
}

impl Registry {
    /// Starts a registry (with htpasswd auth if `auth`) in a temp dir of
    /// its own, and copies the test image in as REPO:1.
    fn start(name: &str, auth: bool) -> Registry {
        let port = free_port();
        let dir = work_dir().join(format!("{name}-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        if auth {
            std::fs::write(dir.join("htpasswd"), HTPASSWD).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: mvm-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        std::fs::write(dir.join("config.yml"), config).unwrap();
        // Its log (the access log among it) on stderr, stdout beside it.
        let log = dir.join("registry.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start docker-registry");
        let reg = Registry {
            child,
            host: format!("127.0.0.1:{port}"),
            log,
            dir,
        };
        reg.wait_up();
        let mut copy = Command::new("skopeo");
        copy.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if auth {
            copy.arg(format!("--dest-creds={USER}:{PASSWORD}"));
        }
        let status = copy
            .arg(format!("oci:{}:layers", test_image().join("oci").display()))
            .arg(format!("docker://{}/{REPO}:1", reg.host))
            .status()
            .expect("run skopeo");
        assert!(status.success(), "skopeo copy into the registry failed");
        reg
    }

    fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = TcpStream::connect(&self.host) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "docker-registry did not come up on {}: {}",
            self.host,
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// `name:tag` or `name@digest` on this registry.
    fn image(&self, tail: &str) -> String {
        format!("{}/{REPO}{tail}", self.host)
    }

    /// Access-log lines that contain all of `parts`, once the log has
    /// settled (the registry writes a line after it has answered).
    fn requests(&self, parts: &[&str]) -> usize {
        let count = || {
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("HTTP/1.1\"") && parts.iter().all(|p| l.contains(p)))
                .count()
        };
        let mut last = count();
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = count();
            if now == last {
                return now;
            }
            last = now;
        }
    }

    fn blob_gets(&self) -> usize {
        self.requests(&["\"GET /v2/", "/blobs/"])
    }

    /// The manifest digest skopeo reads from the registry.
    fn skopeo_digest(&self, tail: &str) -> String {
        let out = Command::new("skopeo")
            .args(["inspect", "--tls-verify=false"])
            .arg(format!("--creds={USER}:{PASSWORD}"))
            .arg(format!("docker://{}", self.image(tail)))
            .output()
            .expect("run skopeo inspect");
        assert!(out.status.success(), "skopeo inspect failed");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["Digest"].as_str().unwrap().to_string()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// `build/bin/mvm ARGS` here with the store `store` and extra `env`.
fn mvm_here(store: &Path, env: &[(&str, &str)], args: &[&str]) -> Out {
    let started = Instant::now();
    let out = Command::new(build_dir().join("bin/mvm"))
        .args(args)
        .env("MVM_IMAGES", store)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("MVM_INSECURE_REGISTRIES")
        .env_remove("MVM_REGISTRY_TIMEOUT")
        // No auth file of the caller's may answer for the test registries.
        .env("HOME", work_dir())
        .env_remove("XDG_RUNTIME_DIR")
        // `mvm run` here checks KVM before the image; this machine's
        // PVM-backed one is refused unless allowed, and the run ends at the
        // image anyway.
        .env("MVM_ALLOW_SOFTWARE_KVM", "1")
        .envs(env.iter().copied())
        .output()
        .expect("run build/bin/mvm");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let out = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        took: started.elapsed(),
    };
    eprintln!(
        "mvm {args:?} -> {} in {:?}\n{}{}",
        out.code, out.took, out.stdout, out.stderr
    );
    out
}

/// A fresh store of the test's own (under the repo root, which the test
/// host mounts at the same path).
fn fresh_store(name: &str) -> PathBuf {
    let dir = work_dir().join(format!("store-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Asserts a one-line `mvm: ...` failure with exit 125 that says `says`.
fn one_line_125(out: &Out, says: &str) {
    assert_eq!(out.code, 125, "{}", out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].starts_with("mvm: ") && lines[0].contains(says),
        "wanted '{says}' in: {}",
        out.stderr
    );
}

/// The store's names.json and tmp/ entries, to show a failure changed
/// neither.
fn store_state(store: &Path) -> (String, usize) {
    let names = std::fs::read_to_string(store.join("names.json")).unwrap_or_default();
    let tmp = std::fs::read_dir(store.join("tmp")).map_or(0, |d| d.count());
    (names, tmp)
}

/// The blobs a pull says it copied ("... (N blobs copied, ...").
fn blobs_copied(stdout: &str) -> Option<u32> {
    stdout
        .split_once(" (")?
        .1
        .split_once(" blobs copied")?
        .0
        .parse()
        .ok()
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_pull_is_verified_and_a_second_one_fetches_no_blob() {
    if !have_tools("a_pull_is_verified_and_a_second_one_fetches_no_blob") {
        return;
    }
    let reg = Registry::start("plain", false);
    let store = fresh_store("pull");
    let image = reg.image(":1");
    let insecure = ["--insecure-registry", reg.host.as_str()];

    // Without --insecure-registry it is HTTPS, which a plain registry
    // cannot answer: one line that names the flag.
    let tls = mvm_here(&store, &[], &["image", "pull", &image]);
    one_line_125(&tls, "--insecure-registry");

    // Before counting: skopeo's own requests are not the pull's.
    let digest = reg.skopeo_digest(":1");
    let before = reg.blob_gets();
    let first = mvm_here(
        &store,
        &[],
        &["image", "pull", &image, insecure[0], insecure[1]],
    );
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first.stdout.starts_with(&format!("{image} {digest} ")),
        "the pulled manifest is not the one skopeo reads ({digest}): {}",
        first.stdout
    );
    // Manifest, config and two layers; the manifest is not a blob GET.
    assert_eq!(blobs_copied(&first.stdout), Some(4), "{}", first.stdout);
    let after_first = reg.blob_gets();
    // Control: the count sees this pull's blob requests (config, layers).
    assert_eq!(after_first - before, 3, "blob GETs of the first pull");
    assert_eq!(store_state(&store).1, 0, "temp files left in the store");

    let manifests = reg.requests(&["/manifests/"]);
    let second = mvm_here(
        &store,
        &[],
        &["image", "pull", &image, insecure[0], insecure[1]],
    );
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(blobs_copied(&second.stdout), Some(0), "{}", second.stdout);
    assert_eq!(reg.blob_gets(), after_first, "a second pull fetched blobs");
    // Control: the second pull did ask the registry (the tag may move).
    assert!(reg.requests(&["/manifests/"]) > manifests);

    // By digest, with the host insecure through the environment: stored,
    // so no request at all, and no client either (mvm-pull made missing;
    // the control below needs it).
    let all = reg.requests(&["\""]);
    let pinned = reg.image(&format!("@{digest}"));
    let env = [("MVM_INSECURE_REGISTRIES", reg.host.as_str())];
    let no_client = [env[0], ("MVM_PULL", "/nonexistent/mvm-pull")];
    let by_digest = mvm_here(&store, &no_client, &["image", "pull", &pinned]);
    assert_eq!(by_digest.code, 0, "{}", by_digest.stderr);
    assert!(by_digest.stdout.contains(&digest), "{}", by_digest.stdout);
    assert_eq!(reg.requests(&["\""]), all, "a stored digest made requests");

    // Control: the same digest into an empty store does reach the
    // registry, and is verified against the digest it names.
    let empty = fresh_store("pull-digest");
    let fetched = mvm_here(&empty, &env, &["image", "pull", &pinned]);
    assert_eq!(fetched.code, 0, "{}", fetched.stderr);
    assert_eq!(blobs_copied(&fetched.stdout), Some(4), "{}", fetched.stdout);
    assert!(fetched.stdout.starts_with(&format!("<none> {digest} ")));
    assert!(reg.requests(&["\""]) > all);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn an_unknown_tag_is_404_and_leaves_the_store_as_it_was() {
    if !have_tools("an_unknown_tag_is_404_and_leaves_the_store_as_it_was") {
        return;
    }
    let reg = Registry::start("notfound", false);
    let store = fresh_store("notfound");
    let env = [("MVM_INSECURE_REGISTRIES", reg.host.as_str())];
    // Control: the known tag pulls, so the 404 below is the tag's.
    let ok = mvm_here(&store, &env, &["image", "pull", &reg.image(":1")]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let state = store_state(&store);
    assert!(state.0.contains(&reg.image(":1")), "{}", state.0);
    for tail in [":no-such-tag", "-missing:1"] {
        let out = mvm_here(&store, &env, &["image", "pull", &reg.image(tail)]);
        one_line_125(&out, "404 not found");
        assert_eq!(store_state(&store), state, "the store changed");
    }
    // `mvm run --image` pulls what is not stored, and fails the same way.
    let run = mvm_here(
        &store,
        &env,
        &["run", "--image", &reg.image(":no-such-tag"), "--", "true"],
    );
    one_line_125(&run, "404 not found");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn credentials_come_from_the_auth_file() {
    if !have_tools("credentials_come_from_the_auth_file") {
        return;
    }
    let reg = Registry::start("auth", true);
    let store = fresh_store("auth");
    let image = reg.image(":1");
    let insecure = ["--insecure-registry", reg.host.as_str()];
    let pull = |env: &[(&str, &str)]| {
        mvm_here(
            &store,
            env,
            &["image", "pull", &image, insecure[0], insecure[1]],
        )
    };

    let anonymous = pull(&[]);
    one_line_125(&anonymous, "401 unauthorized");
    assert!(
        anonymous.stderr.contains("docker login"),
        "{}",
        anonymous.stderr
    );
    assert_eq!(store_state(&store).0, "", "a refused pull named an image");

    let write = |file: &str, user_password: &str| {
        let path = work_dir().join(file);
        let auth = base64(user_password.as_bytes());
        let json = format!("{{\"auths\":{{\"{}\":{{\"auth\":\"{auth}\"}}}}}}", reg.host);
        std::fs::write(&path, json).unwrap();
        path.display().to_string()
    };
    let wrong = write("auth-wrong.json", &format!("{USER}:not-the-password"));
    let refused = pull(&[("REGISTRY_AUTH_FILE", &wrong)]);
    one_line_125(&refused, "refused the credentials from");
    assert!(
        !refused.stderr.contains("not-the-password"),
        "{}",
        refused.stderr
    );

    let helper = work_dir().join("auth-helper.json");
    let json = format!("{{\"credHelpers\":{{\"{}\":\"secretservice\"}}}}", reg.host);
    std::fs::write(&helper, json).unwrap();
    let helper = helper.display().to_string();
    let out = pull(&[("REGISTRY_AUTH_FILE", &helper)]);
    one_line_125(
        &out,
        "credential helper 'secretservice', which mvm does not run",
    );

    let good = write("auth.json", &format!("{USER}:{PASSWORD}"));
    let out = pull(&[("REGISTRY_AUTH_FILE", &good)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(blobs_copied(&out.stdout), Some(4), "{}", out.stdout);
    assert!(
        out.stdout.contains(&reg.skopeo_digest(":1")),
        "{}",
        out.stdout
    );
    assert!(!out.stderr.contains(PASSWORD), "{}", out.stderr);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn an_unreachable_registry_is_one_line_within_seconds() {
    let store = fresh_store("unreachable");
    let host = format!("127.0.0.1:{}", free_port());
    let out = mvm_here(
        &store,
        &[],
        &[
            "image",
            "pull",
            "--insecure-registry",
            &host,
            &format!("{host}/a/b:1"),
        ],
    );
    one_line_125(&out, "cannot connect");
    assert!(out.took < Duration::from_secs(5), "took {:?}", out.took);
    assert_eq!(store_state(&store), (String::new(), 0));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_registry_that_never_answers_times_out() {
    // The kernel completes the handshake (the backlog); nothing is read or
    // written, as with a hung registry.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let store = fresh_store("hang");
    let env = [("MVM_REGISTRY_TIMEOUT", "3")];
    let out = mvm_here(
        &store,
        &env,
        &[
            "image",
            "pull",
            "--insecure-registry",
            &host,
            &format!("{host}/a/b:1"),
        ],
    );
    one_line_125(&out, "sent nothing for 3 s");
    // Control: it did wait for the answer (so it had connected), and
    // stopped after the timeout, not after several.
    assert!(out.took >= Duration::from_secs(3), "took {:?}", out.took);
    assert!(out.took < Duration::from_secs(6), "took {:?}", out.took);
    drop(listener);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_rate_limiting_registry_is_one_line_and_the_store_unchanged() {
    // A peer that answers every request with 429, as a registry enforcing
    // a pull limit does; each connection gets the answer and is closed.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut buf);
            let _ = std::io::Write::write_all(
                &mut stream,
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let store = fresh_store("ratelimit");
    let out = mvm_here(
        &store,
        &[],
        &[
            "image",
            "pull",
            "--insecure-registry",
            &host,
            &format!("{host}/a/b:1"),
        ],
    );
    one_line_125(&out, "429");
    // Control: the registry was asked (the line is its answer, not ours).
    assert!(served.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    let names = std::fs::read_to_string(store.join("names.json")).unwrap_or_default();
    assert!(!names.contains("a/b"), "{names}");
    assert_eq!(
        std::fs::read_dir(store.join("tmp"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_pulled_image_runs_from_the_store_without_the_registry() {
    if !have_tools("a_pulled_image_runs_from_the_store_without_the_registry") {
        return;
    }
    let reg = Registry::start("run", false);
    let store = fresh_store("run");
    let image = reg.image(":1");
    let pulled = mvm_here(
        &store,
        &[],
        &["image", "pull", "--insecure-registry", &reg.host, &image],
    );
    assert_eq!(pulled.code, 0, "{}", pulled.stderr);
    // Gone now: the run below can only use the stored image.
    drop(reg);
    let store_text = store.display().to_string();
    let env = [("MVM_IMAGES", store_text.as_str())];
    let run = mvm_with(
        &Options {
            env: &env,
            ..Options::default()
        },
        &[
            "run",
            "--image",
            &image,
            "--no-workspace",
            "--",
            "cat",
            "/keep/new",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "new\n");
}

/// Standard base64, for the auth files (the test crate has no base64).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_the_standard() {
    assert_eq!(base64(b"me:s3cret:x"), "bWU6czNjcmV0Ong=");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(
        blobs_copied("h/x:1 sha256:ab (4 blobs copied, 10 bytes)"),
        Some(4)
    );
}

/// The registry client (HTTP, TLS, the distribution API) is in mvm-pull
/// alone: not in the binary every `mvm run` maps, whose process a guest
/// attacks. Read from the binaries' function names as Rust mangles them
/// (`_ZN10oci_client...`, each path component after its length; trait
/// impls and drop glue as `$LT$tokio..`) and from the source paths of
/// panic locations (`/tokio-1.`), not from the object file names, which
/// the linker lists for every crate it was given. The control: each
/// search finds each of the client's crates in mvm-pull.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_registry_client_is_in_mvm_pull_and_not_in_mvm() {
    let read =
        |binary: &str| std::fs::read(build_dir().join(binary)).expect("read a binary `make` built");
    let (mvm, pull) = (read("bin/mvm"), read("libexec/mvm/mvm-pull"));
    let has =
        |bytes: &[u8], needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    let has_source_path = |bytes: &[u8], dir: &str| {
        let needle = format!("/{dir}-");
        bytes
            .windows(needle.len() + 1)
            .any(|w| &w[..needle.len()] == needle.as_bytes() && w[needle.len()].is_ascii_digit())
    };
    for (krate, dir) in [
        ("oci_client", "oci-client"),
        ("rustls", "rustls"),
        ("reqwest", "reqwest"),
        ("hyper", "hyper"),
        ("tokio", "tokio"),
    ] {
        for mangled in [format!("{}{krate}", krate.len()), format!("{krate}..")] {
            assert!(has(&pull, &mangled), "mvm-pull lacks {mangled}");
            assert!(!has(&mvm, &mangled), "mvm holds {mangled}");
        }
        assert!(has_source_path(&pull, dir), "mvm-pull lacks /{dir}-");
        assert!(!has_source_path(&mvm, dir), "mvm holds /{dir}-");
    }
}

/// Without its helper, a pull is one line that says what to do; so is a
/// helper that ends without an answer.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_missing_or_silent_mvm_pull_is_one_line() {
    let store = fresh_store("helper");
    let args = ["image", "pull", "127.0.0.1:1/a/b:1"];
    let missing = work_dir().join("no-such-mvm-pull");
    let out = mvm_here(&store, &[("MVM_PULL", missing.to_str().unwrap())], &args);
    one_line_125(
        &out,
        "cannot find mvm-pull, the registry client: run 'make' or set MVM_PULL",
    );
    let out = mvm_here(&store, &[("MVM_PULL", "/bin/false")], &args);
    one_line_125(
        &out,
        "mvm-pull (/bin/false) ended without an answer (exit status: 1)",
    );
}

/// mvm-pull's stderr is mvm's (its progress line needs the terminal), and
/// its answer is its last line on stdout, whatever came before. A stand-in
/// helper, since the real one prints nothing before its answer and draws
/// progress only after a second.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn mvm_pull_speaks_on_mvms_stderr_and_answers_last() {
    let store = fresh_store("helper-stderr");
    std::fs::create_dir_all(work_dir()).unwrap();
    let fake = work_dir().join("fake-mvm-pull");
    std::fs::write(
        &fake,
        "#!/bin/sh\n\
         if [ -t 2 ]; then echo 'helper stderr: a terminal' >&2; else echo 'helper stderr: no terminal' >&2; fi\n\
         echo 'something a library printed'\n\
         echo '{\"failed\":\"registry 127.0.0.1:1: the stand-in refused\"}'\n\
         exit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let env = [("MVM_PULL", fake.to_str().unwrap())];
    let out = mvm_here(&store, &env, &["image", "pull", "127.0.0.1:1/a/b:1"]);
    assert_eq!(out.code, 125, "{}", out.stderr);
    assert_eq!(
        out.stderr.lines().collect::<Vec<_>>(),
        [
            "helper stderr: no terminal",
            "mvm: registry 127.0.0.1:1: the stand-in refused"
        ],
        "{}",
        out.stderr
    );
    // On a terminal (util-linux's script gives mvm a pty), so is the helper.
    let line = format!(
        "MVM_IMAGES={} MVM_PULL={} {} image pull 127.0.0.1:1/a/b:1",
        store.display(),
        fake.display(),
        build_dir().join("bin/mvm").display()
    );
    let tty = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .output()
        .expect("run script");
    let drawn = String::from_utf8_lossy(&tty.stdout);
    assert!(drawn.contains("helper stderr: a terminal"), "{drawn:?}");
    assert!(drawn.contains("the stand-in refused"), "{drawn:?}");
}
