//! What to run, as the VMM encodes it on the kernel command line (see
//! docs/protocol.md). Pure functions, unit-tested on the host.
//!
//! `mvm.cmd=<hex>`: lowercase hex of argv joined with NUL bytes. Hex keeps
//! arbitrary bytes (spaces, quotes, `=`) away from the kernel's own parser.
//! `mvm.workdir=<hex>`: hex of the working directory, default `/`.
//! `mvm.agent=1`: the VMM gave the guest a vsock device; serve the exec
//! channel (docs/protocol.md, version 1) instead of running `mvm.cmd`.

use std::ffi::{CStr, CString};

pub const CMD_PARAM: &str = "mvm.cmd";
pub const WORKDIR_PARAM: &str = "mvm.workdir";
pub const AGENT_PARAM: &str = "mvm.agent";
/// Run when the VMM passes no command: an interactive shell on the console.
pub const DEFAULT_COMMAND: &CStr = c"/bin/sh";
pub const DEFAULT_WORKDIR: &CStr = c"/";

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("odd number of hex digits ({0})")]
    OddLength(usize),
    #[error("bad hex digit {digit:?} at offset {offset}")]
    BadDigit { offset: usize, digit: char },
}

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

/// Value of `name=value` on the command line; the last one wins, as in the
/// kernel. Tokens are split like the kernel does: on whitespace outside
/// double quotes, with the quotes removed.
pub fn param(cmdline: &str, name: &str) -> Option<String> {
    tokens(cmdline)
        .into_iter()
        .rev()
        .find_map(|token| Some(token.strip_prefix(name)?.strip_prefix('=')?.to_owned()))
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

/// Decodes hex (either case accepted) into bytes.
pub fn decode_hex(hex: &str) -> Result<Vec<u8>, HexError> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(HexError::OddLength(digits.len()));
    }
    let nibble = |offset: usize| {
        let digit = char::from(digits[offset]);
        digit
            .to_digit(16)
            .map(|v| v as u8)
            .ok_or(HexError::BadDigit { offset, digit })
    };
    (0..digits.len())
        .step_by(2)
        .map(|i| Ok((nibble(i)? << 4) | nibble(i + 1)?))
        .collect()
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
}
