//! What to run, as the VMM encodes it on the kernel command line (see
//! docs/protocol.md; the parameter names and encodings are the boot
//! contract in `mvm_protocol::boot`). Pure functions, unit-tested on the
//! host.
//!
//! `mvm.cmd=<hex>`: lowercase hex of argv joined with NUL bytes. Hex keeps
//! arbitrary bytes (spaces, quotes, `=`) away from the kernel's own parser.
//! `mvm.workdir=<hex>`: hex of the working directory, default `/`.
//! `mvm.agent=1`: the VMM gave the guest a vsock device; serve the exec
//! channel (docs/protocol.md, version 2) instead of running `mvm.cmd`.
//! `mvm.mount=<tag>,<ro|rw>,<hex>`, once per virtio-fs share, in mount
//! order: the device tag, the access mode and the hex of the guest path.

use std::ffi::{CStr, CString};

use mvm_protocol::boot::MountParam;
pub use mvm_protocol::boot::{
    decode_hex, HexError, MountProblem, RootLower, RootParam, RootProblem, AGENT_PARAM, CMD_PARAM,
    MAX_READY_DELAY_MS, MAX_TAG_LEN, MOUNT_PARAM, READY_DELAY_PARAM, ROOT_PARAM, WORKDIR_PARAM,
};

/// Run when the VMM passes no command: an interactive shell on the console.
pub const DEFAULT_COMMAND: &CStr = c"/bin/sh";
pub const DEFAULT_WORKDIR: &CStr = c"/";

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{param}: {source}")]
    Hex {
        param: &'static str,
        source: HexError,
    },
    #[error("{CMD_PARAM}: empty command")]
    EmptyCommand,
    /// Cannot happen (arguments are split on NUL), but PID 1 must not panic.
    #[error("{CMD_PARAM}: argument contains a NUL byte")]
    NulInArgument,
    #[error("{WORKDIR_PARAM}: must be a non-empty path without NUL bytes")]
    BadWorkdir,
    #[error("{MOUNT_PARAM}={value}: {problem}")]
    Mount {
        value: String,
        problem: MountProblem,
    },
    #[error("{ROOT_PARAM}={value}: {problem}")]
    Root { value: String, problem: RootProblem },
}

/// One virtio-fs share to mount, from `mvm.mount`.
#[derive(Debug, PartialEq, Eq)]
pub struct Share {
    /// The virtio-fs device's tag: the mount source.
    pub tag: CString,
    /// Absolute guest path, neither `/` nor with `..` components.
    pub path: CString,
    pub read_only: bool,
}

/// The command init should run.
#[derive(Debug, PartialEq, Eq)]
pub struct Launch {
    pub argv: Vec<CString>,
    pub workdir: CString,
    /// No command was given: the default shell runs for a person at the
    /// console, who wants job control and Ctrl-C.
    pub interactive: bool,
}

/// Reads the launch request out of a whole kernel command line.
pub fn parse(cmdline: &str) -> Result<Launch, ParseError> {
    let (argv, interactive) = match param(cmdline, CMD_PARAM) {
        Some(hex) => (decode_argv(&hex)?, false),
        None => (vec![DEFAULT_COMMAND.to_owned()], true),
    };
    let workdir = match param(cmdline, WORKDIR_PARAM) {
        Some(hex) => {
            let bytes = decode_hex(&hex).map_err(|source| ParseError::Hex {
                param: WORKDIR_PARAM,
                source,
            })?;
            if bytes.is_empty() {
                return Err(ParseError::BadWorkdir);
            }
            CString::new(bytes).map_err(|_| ParseError::BadWorkdir)?
        }
        None => DEFAULT_WORKDIR.to_owned(),
    };
    Ok(Launch {
        argv,
        workdir,
        interactive,
    })
}

/// Whether the VMM asked for the exec agent (`mvm.agent=1`). Any other
/// value means no, so that `mvm.agent=0` on a user's `--cmdline` turns it off.
pub fn agent_requested(cmdline: &str) -> bool {
    param(cmdline, AGENT_PARAM).as_deref() == Some("1")
}

/// Whether the VMM booted the kernel with every DMA buffer bounced
/// through its pool (`mvm_protocol::boot::BOUNCE_PARAM`), whose place
/// guest-init then reports.
pub fn bounce_requested(cmdline: &str) -> bool {
    cmdline
        .split_ascii_whitespace()
        .any(|p| p == mvm_protocol::boot::BOUNCE_PARAM)
}

/// How long to wait before the ready marker (`mvm.ready_delay_ms`, a
/// testing aid); a value that is not a number is no wait.
pub fn ready_delay(cmdline: &str) -> std::time::Duration {
    let ms = param(cmdline, READY_DELAY_PARAM)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    std::time::Duration::from_millis(ms.min(MAX_READY_DELAY_MS))
}

/// The shares to mount, in command-line order (a later one may lie inside
/// an earlier one).
pub fn shares(cmdline: &str) -> Result<Vec<Share>, ParseError> {
    params(cmdline, MOUNT_PARAM)
        .into_iter()
        .map(|value| decode_share(&value).map_err(|problem| ParseError::Mount { value, problem }))
        .collect()
}

/// The image root, if the VMM attached one (`mvm.root`; the last wins).
pub fn root(cmdline: &str) -> Result<Option<RootParam>, ParseError> {
    param(cmdline, ROOT_PARAM)
        .map(|value| {
            RootParam::decode(&value).map_err(|problem| ParseError::Root { value, problem })
        })
        .transpose()
}

/// Decodes one `mvm.mount` value: `<tag>,<ro|rw>,<hex of the path>`
/// (the format and its checks are the boot contract's, in mvm-protocol).
pub fn decode_share(value: &str) -> Result<Share, MountProblem> {
    share_from(MountParam::decode(value)?)
}

/// A decoded (and so checked) share as guest-init mounts it.
pub fn share_from(param: MountParam) -> Result<Share, MountProblem> {
    let MountParam {
        tag,
        read_only,
        path,
    } = param;
    Ok(Share {
        tag: CString::new(tag).map_err(|_| MountProblem::Tag)?,
        path: CString::new(path).map_err(|_| MountProblem::Nul)?,
        read_only,
    })
}

/// Value of `name=value` on the command line; the last one wins, as in the
/// kernel. Tokens are split like the kernel does: on whitespace outside
/// double quotes, with the quotes removed.
pub fn param(cmdline: &str, name: &str) -> Option<String> {
    params(cmdline, name).pop()
}

/// Every value of `name=value` on the command line, in order.
pub fn params(cmdline: &str, name: &str) -> Vec<String> {
    tokens(cmdline)
        .into_iter()
        .filter_map(|token| Some(token.strip_prefix(name)?.strip_prefix('=')?.to_owned()))
        .collect()
}

fn tokens(cmdline: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    for c in cmdline.chars() {
        match c {
            '"' => in_quotes = !in_quotes,
            c if c.is_whitespace() && !in_quotes => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Decodes `mvm.cmd`: hex of the arguments joined with NUL bytes.
pub fn decode_argv(hex: &str) -> Result<Vec<CString>, ParseError> {
    let bytes = decode_hex(hex).map_err(|source| ParseError::Hex {
        param: CMD_PARAM,
        source,
    })?;
    if bytes.is_empty() {
        return Err(ParseError::EmptyCommand);
    }
    let argv = bytes
        .split(|&b| b == 0)
        .map(|arg| CString::new(arg).map_err(|_| ParseError::NulInArgument))
        .collect::<Result<Vec<_>, _>>()?;
    if argv[0].is_empty() {
        return Err(ParseError::EmptyCommand);
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn args(list: &[&str]) -> Vec<CString> {
        list.iter().map(|a| CString::new(*a).unwrap()).collect()
    }

    #[test]
    fn hex_good() {
        assert_eq!(decode_hex("736800"), Ok(b"sh\0".to_vec()));
        assert_eq!(decode_hex("00ffA0"), Ok(vec![0x00, 0xff, 0xa0]));
    }

    #[test]
    fn hex_odd_length() {
        assert_eq!(decode_hex("736"), Err(HexError::OddLength(3)));
    }

    #[test]
    fn hex_bad_digit() {
        let err = HexError::BadDigit {
            offset: 3,
            digit: 'g',
        };
        assert_eq!(decode_hex("736g"), Err(err));
        assert!(decode_hex("+1").is_err());
    }

    #[test]
    fn hex_empty() {
        assert_eq!(decode_hex(""), Ok(vec![]));
        assert_eq!(decode_argv(""), Err(ParseError::EmptyCommand));
    }

    #[test]
    fn argv_split_on_nul() {
        let encoded = hex(b"sh\0-c\0exit 3");
        assert_eq!(encoded, "7368002d6300657869742033");
        assert_eq!(decode_argv(&encoded), Ok(args(&["sh", "-c", "exit 3"])));
        // Empty arguments survive; only an empty argv[0] is rejected.
        assert_eq!(
            decode_argv(&hex(b"echo\0\0x")),
            Ok(args(&["echo", "", "x"]))
        );
        assert_eq!(decode_argv(&hex(b"\0x")), Err(ParseError::EmptyCommand));
    }

    #[test]
    fn argv_bad_hex_names_param() {
        let err = decode_argv("7").unwrap_err();
        assert_eq!(err.to_string(), "mvm.cmd: odd number of hex digits (1)");
    }

    #[test]
    fn param_among_others() {
        let line = format!("console=ttyS0 reboot=k mvm.cmd={} quiet", hex(b"true"));
        assert_eq!(param(&line, CMD_PARAM), Some(hex(b"true")));
    }

    #[test]
    fn param_at_start_and_end() {
        assert_eq!(
            param("mvm.cmd=6869 quiet", CMD_PARAM).as_deref(),
            Some("6869")
        );
        assert_eq!(
            param("quiet mvm.cmd=6869\n", CMD_PARAM).as_deref(),
            Some("6869")
        );
        assert_eq!(param("mvm.cmd=6869", CMD_PARAM).as_deref(), Some("6869"));
    }

    #[test]
    fn param_missing_or_lookalike() {
        assert_eq!(param("console=ttyS0 quiet", CMD_PARAM), None);
        assert_eq!(param("mvm.cmdx=61 xmvm.cmd=61 mvm.cmd", CMD_PARAM), None);
        assert_eq!(param("", CMD_PARAM), None);
    }

    #[test]
    fn param_last_wins_and_quotes() {
        assert_eq!(
            param("mvm.cmd=61 mvm.cmd=62", CMD_PARAM).as_deref(),
            Some("62")
        );
        // A quoted value of another param must not be mistaken for ours.
        assert_eq!(param("foo=\"a mvm.cmd=61\"", CMD_PARAM), None);
        assert_eq!(param("mvm.cmd=\"61\"", CMD_PARAM).as_deref(), Some("61"));
    }

    #[test]
    fn agent_param() {
        assert!(agent_requested("console=ttyS0 mvm.agent=1 quiet"));
        assert!(!agent_requested("console=ttyS0 quiet"));
        assert!(!agent_requested("mvm.agent=0"));
        assert!(!agent_requested("mvm.agent"));
        assert!(!agent_requested("mvm.agent=1 mvm.agent=0"), "last one wins");
        assert!(!agent_requested("xmvm.agent=1"));
    }

    #[test]
    fn ready_delay_param() {
        use std::time::Duration;
        assert_eq!(ready_delay("quiet"), Duration::ZERO);
        assert_eq!(
            ready_delay("mvm.ready_delay_ms=2500 quiet"),
            Duration::from_millis(2500)
        );
        assert_eq!(ready_delay("mvm.ready_delay_ms=soon"), Duration::ZERO);
        assert_eq!(
            ready_delay("mvm.ready_delay_ms=99999999"),
            Duration::from_secs(10),
            "capped"
        );
    }

    #[test]
    fn parse_defaults() {
        let launch = parse("console=ttyS0").unwrap();
        assert_eq!(launch.argv, args(&["/bin/sh"]));
        assert_eq!(launch.workdir.as_bytes(), b"/");
        assert!(launch.interactive);
    }

    #[test]
    fn parse_command_and_workdir() {
        let line = format!(
            "console=ttyS0 mvm.cmd={} mvm.workdir={}",
            hex(b"ls\0-l"),
            hex(b"/tmp")
        );
        let launch = parse(&line).unwrap();
        assert_eq!(launch.argv, args(&["ls", "-l"]));
        assert_eq!(launch.workdir.as_bytes(), b"/tmp");
    }

    #[test]
    fn parse_bad_workdir() {
        assert_eq!(parse("mvm.workdir="), Err(ParseError::BadWorkdir));
        assert_eq!(parse("mvm.workdir=2f00"), Err(ParseError::BadWorkdir));
        assert!(matches!(
            parse("mvm.workdir=2"),
            Err(ParseError::Hex {
                param: WORKDIR_PARAM,
                ..
            })
        ));
    }

    fn share(tag: &str, path: &str, read_only: bool) -> Share {
        Share {
            tag: CString::new(tag).unwrap(),
            path: CString::new(path).unwrap(),
            read_only,
        }
    }

    fn mount_value(tag: &str, mode: &str, path: &[u8]) -> String {
        format!("{tag},{mode},{}", hex(path))
    }

    #[test]
    fn share_good() {
        assert_eq!(
            decode_share(&mount_value("data", "rw", b"/mnt/data")),
            Ok(share("data", "/mnt/data", false))
        );
        assert_eq!(
            decode_share(&mount_value("A-z_09", "ro", b"/srv/my dir/")),
            Ok(share("A-z_09", "/srv/my dir/", true))
        );
        // Upper-case hex, like `decode_hex`; a 36-byte tag.
        let tag = "t".repeat(MAX_TAG_LEN);
        assert_eq!(
            decode_share(&format!("{tag},ro,2F78")),
            Ok(share(&tag, "/x", true))
        );
        // `...` and `.` are ordinary components.
        assert_eq!(
            decode_share(&mount_value("t", "rw", b"/a/.../b/./c")),
            Ok(share("t", "/a/.../b/./c", false))
        );
    }

    #[test]
    fn share_bad_fields() {
        for value in ["", "t", "t,rw", "t,rw,2f78,", "t,rw,2f78,x", ",,,"] {
            assert_eq!(decode_share(value), Err(MountProblem::Fields), "{value}");
        }
    }

    #[test]
    fn share_bad_tag() {
        let long = "t".repeat(MAX_TAG_LEN + 1);
        for tag in ["", long.as_str(), "a b", "a.b", "a/b", "tág", "a=b"] {
            assert_eq!(
                decode_share(&mount_value(tag, "rw", b"/x")),
                Err(MountProblem::Tag),
                "{tag}"
            );
        }
    }

    #[test]
    fn share_bad_mode() {
        for mode in ["", "RO", "r", "wr", "rw ", "readonly"] {
            assert_eq!(
                decode_share(&mount_value("t", mode, b"/x")),
                Err(MountProblem::Mode),
                "{mode}"
            );
        }
    }

    #[test]
    fn share_bad_hex() {
        assert_eq!(
            decode_share("t,rw,2f7"),
            Err(MountProblem::Hex(HexError::OddLength(3)))
        );
        assert_eq!(
            decode_share("t,rw,2fxx"),
            Err(MountProblem::Hex(HexError::BadDigit {
                offset: 2,
                digit: 'x'
            }))
        );
        // Not hex at all: the path given in plain text.
        assert!(matches!(
            decode_share("t,rw,/mnt"),
            Err(MountProblem::Hex(_))
        ));
    }

    #[test]
    fn share_bad_path() {
        let cases: [(&[u8], MountProblem); 12] = [
            (b"", MountProblem::NotAbsolute),
            (b"mnt", MountProblem::NotAbsolute),
            (b"./mnt", MountProblem::NotAbsolute),
            (b"/mnt\0x", MountProblem::Nul),
            (b"/\0", MountProblem::Nul),
            (b"/..", MountProblem::DotDot),
            (b"/mnt/../etc", MountProblem::DotDot),
            (b"/mnt/..", MountProblem::DotDot),
            (b"/mnt/../", MountProblem::DotDot),
            (b"/", MountProblem::Root),
            (b"//", MountProblem::Root),
            (b"/./", MountProblem::Root),
        ];
        for (path, problem) in cases {
            assert_eq!(
                decode_share(&mount_value("t", "rw", path)),
                Err(problem),
                "{path:?}"
            );
        }
    }

    #[test]
    fn root_absent_present_and_bad() {
        assert_eq!(root("console=ttyS0 mvm.agent=1"), Ok(None));
        assert_eq!(
            root("quiet mvm.root=vda,erofs,1048576 mvm.agent=1"),
            Ok(Some(RootParam {
                lower: RootLower::Disk,
                scratch_bytes: 1 << 20
            }))
        );
        assert!(matches!(
            root("mvm.root=vda,squashfs,1"),
            Err(ParseError::Root {
                problem: RootProblem::Fstype,
                ..
            })
        ));
    }

    #[test]
    fn shares_none() {
        assert_eq!(shares("console=ttyS0 mvm.agent=1"), Ok(vec![]));
        assert_eq!(shares(""), Ok(vec![]));
        assert_eq!(
            shares("mvm.mountx=t,rw,2f78 xmvm.mount=t,rw,2f78"),
            Ok(vec![])
        );
    }

    #[test]
    fn shares_repeated_in_order() {
        let line = format!(
            "console=ttyS0 mvm.mount={} mvm.agent=1 mvm.mount={} mvm.mount={} quiet",
            mount_value("outer", "ro", b"/work"),
            mount_value("inner", "rw", b"/work/out"),
            mount_value("outer", "rw", b"/a"),
        );
        assert_eq!(
            shares(&line),
            Ok(vec![
                share("outer", "/work", true),
                share("inner", "/work/out", false),
                share("outer", "/a", false),
            ])
        );
        // The other params are unaffected.
        assert!(agent_requested(&line));
        assert_eq!(parse(&line).unwrap().workdir.as_bytes(), b"/");
    }

    #[test]
    fn shares_one_bad_value_fails_all() {
        let line = format!(
            "mvm.mount={} mvm.mount=t,rx,2f78",
            mount_value("t", "rw", b"/x")
        );
        let err = shares(&line).unwrap_err();
        assert_eq!(
            err,
            ParseError::Mount {
                value: "t,rx,2f78".into(),
                problem: MountProblem::Mode
            }
        );
        assert_eq!(
            err.to_string(),
            "mvm.mount=t,rx,2f78: the mode must be ro or rw"
        );
    }

    #[test]
    fn params_all_in_order() {
        assert_eq!(
            params("a=1 b=2 a=3 a \"a=4 5\"", "a"),
            vec!["1".to_owned(), "3".into(), "4 5".into()]
        );
        assert_eq!(params("b=2", "a"), Vec::<String>::new());
    }
}
