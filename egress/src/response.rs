//! The answers the proxy itself gives: a refusal carries its one line in
//! `X-Mvm-Blocked` (policy) or `X-Mvm-Error` (anything else) and in the
//! body, so curl, pip, npm and git show what happened and what to change.

pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A complete response; `message` is reduced to printable ASCII so it is
/// always a valid header value.
pub fn refusal(status: u16, message: &str) -> Vec<u8> {
    let message = crate::request::clean_long(message);
    let header = if status == 403 {
        "X-Mvm-Blocked"
    } else {
        "X-Mvm-Error"
    };
    let body = format!("mvm: network: {message}\n");
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\n{header}: {message}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: CONNECT, GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_well_formed_and_say_why() {
        let r = String::from_utf8(refusal(
            403,
            "a.test:443 is not allowed; allow it with --allow a.test",
        ))
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");
        assert!(
            r.contains(
                "\r\nX-Mvm-Blocked: a.test:443 is not allowed; allow it with --allow a.test\r\n"
            ),
            "{r}"
        );
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{r}"
        );
        assert_eq!(
            body,
            "mvm: network: a.test:443 is not allowed; allow it with --allow a.test\n"
        );
        let r = String::from_utf8(refusal(502, "x\r\nSet-Cookie: y")).unwrap();
        assert!(
            r.contains("X-Mvm-Error: x??Set-Cookie: y\r\n"),
            "no header injection: {r}"
        );
    }
}
