//! The hybrid-vsock handshake a host client speaks on the Unix socket
//! before any data (Firecracker's convention): it writes `CONNECT <port>\n`,
//! the device asks the guest for a connection to `<port>`, and answers
//! `OK <host port>\n` once the guest accepted. A refusal closes the socket.

use std::io::{ErrorKind, Read};

use super::defs::MAX_CONNECT_LINE;

/// Where reading the CONNECT line stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// No full line yet; wait for the socket to be readable again.
    Pending,
    /// The client asked for this guest port.
    Port(u32),
    /// Not a CONNECT line, too long, or the client went away.
    Invalid,
}

#[derive(Debug, Default)]
pub(super) struct LineReader {
    line: Vec<u8>,
}

impl LineReader {
    /// Reads one byte at a time, so none of the data that may follow the
    /// line is taken out of the socket: it belongs to the guest.
    pub(super) fn read_from(&mut self, stream: &mut impl Read) -> Progress {
        let mut byte = [0u8];
        loop {
            match stream.read(&mut byte) {
                Ok(0) => return Progress::Invalid,
                Ok(_) if byte[0] == b'\n' => {
                    return parse_connect(&self.line).map_or(Progress::Invalid, Progress::Port)
                }
                Ok(_) if self.line.len() + 1 >= MAX_CONNECT_LINE => return Progress::Invalid,
                Ok(_) => self.line.push(byte[0]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Pending,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Progress::Invalid,
            }
        }
    }
}

/// `CONNECT <port>` (without the newline) to the port.
fn parse_connect(line: &[u8]) -> Option<u32> {
    let digits = line.strip_prefix(b"CONNECT ")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The reply to a client whose connection the guest accepted.
pub(super) fn ok_line(host_port: u32) -> String {
    format!("OK {host_port}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_well_formed_lines() {
        assert_eq!(parse_connect(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT 4294967295"), Some(u32::MAX));
        assert_eq!(parse_connect(b"CONNECT 4294967296"), None);
        assert_eq!(parse_connect(b"CONNECT "), None);
        assert_eq!(parse_connect(b"CONNECT -1"), None);
        assert_eq!(parse_connect(b"CONNECT +1"), None);
        assert_eq!(parse_connect(b"connect 1"), None);
        assert_eq!(parse_connect(b"CONNECT 1 2"), None);
    }

    #[test]
    fn reads_up_to_the_newline_only() {
        let mut input: &[u8] = b"CONNECT 52\nhello";
        let mut r = LineReader::default();
        assert_eq!(r.read_from(&mut input), Progress::Port(52));
        assert_eq!(input, b"hello");
    }

    #[test]
    fn refuses_long_lines_and_early_eof() {
        let mut long: &[u8] = b"CONNECT 000000000000001\n";
        assert_eq!(
            LineReader::default().read_from(&mut long),
            Progress::Invalid
        );
        let mut short: &[u8] = b"CONNECT 5";
        assert_eq!(
            LineReader::default().read_from(&mut short),
            Progress::Invalid
        );
    }
}
