//! How `mvm run` hands the command to guest-init for now: the argv joined
//! with NUL bytes, hex-encoded into the `mvm.cmd=` kernel parameter (no
//! quoting problems, any byte allowed), read back by guest-init from
//! /proc/cmdline. Bounded by the 2 KiB command line; the vsock exec channel
//! replaces it.

use std::fmt::Write;

pub fn encode_argv(argv: &[String]) -> String {
    let joined = argv.join("\0");
    let mut hex = String::with_capacity(joined.len() * 2);
    for b in joined.bytes() {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// The kernel parameters that carry `argv` (and the working directory).
pub fn cmdline_params(argv: &[String], workdir: Option<&str>) -> String {
    let mut s = format!("mvm.cmd={}", encode_argv(argv));
    if let Some(dir) = workdir {
        s.push_str(&format!(" mvm.workdir={}", encode_argv(&[dir.to_string()])));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_argv_with_nul_separators() {
        let argv = ["sh", "-c", "exit 3"].map(String::from);
        assert_eq!(encode_argv(&argv), "7368002d6300657869742033");
        assert_eq!(
            cmdline_params(&["true".into()], Some("/")),
            "mvm.cmd=74727565 mvm.workdir=2f"
        );
    }

    #[test]
    fn quotes_and_spaces_survive() {
        let argv = ["echo".to_string(), "a \"b\" 'c'".to_string()];
        let hex = encode_argv(&argv);
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(hex.len(), (4 + 1 + 9) * 2);
    }
}
