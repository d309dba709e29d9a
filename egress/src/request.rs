//! The request head a client sends the proxy, parsed into what the proxy
//! acts on: `CONNECT host:port` (a tunnel) or an absolute-URI request
//! (`GET http://host/path HTTP/1.1`), forwarded in origin form with the
//! hop-by-hop headers dropped and `Connection: close` upstream (one
//! request per connection). Anything else is refused with a 4xx.

use std::net::IpAddr;

use crate::pattern::host_name;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// As shown in messages and the log (IPv6 without brackets).
    pub fn text(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Connect {
        host: Host,
        port: u16,
    },
    Forward {
        method: String,
        host: Host,
        port: u16,
        /// Path and query, as sent upstream.
        path: String,
        /// The head sent upstream, complete.
        head: Vec<u8>,
    },
}

impl Request {
    pub fn host_port(&self) -> (&Host, u16) {
        match self {
            Request::Connect { host, port } | Request::Forward { host, port, .. } => (host, *port),
        }
    }

    pub fn method(&self) -> &str {
        match self {
            Request::Connect { .. } => "CONNECT",
            Request::Forward { method, .. } => method,
        }
    }
}

/// A refusal before any policy check: status and one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    pub status: u16,
    pub message: String,
}

fn bad(status: u16, message: impl Into<String>) -> Bad {
    Bad {
        status,
        message: message.into(),
    }
}

/// Most headers a request may have.
const MAX_HEADERS: usize = 100;
/// Methods forwarded as plain HTTP (CONNECT is the tunnel).
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];
/// Never forwarded: they concern this hop (RFC 9110 7.6.1), or the
/// guest's credentials for the proxy, or Host (rewritten from the URI so
/// the server sees the host the policy checked).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Ok(None): the head is not complete yet. Ok(Some((request, n))): the
/// head was the first n bytes of `buf`.
pub fn parse(buf: &[u8]) -> Result<Option<(Request, usize)>, Bad> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(bad(431, format!("more than {MAX_HEADERS} request headers")))
        }
        Err(e) => return Err(bad(400, format!("malformed request: {e}"))),
    };
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let minor = req.version.unwrap_or(1);
    if method == "CONNECT" {
        let (host, port) = authority(target, None).ok_or_else(|| {
            bad(
                400,
                format!("bad CONNECT target '{}': expected host:port", clean(target)),
            )
        })?;
        return Ok(Some((Request::Connect { host, port }, len)));
    }
    let rest = strip_prefix_ignore_case(target, "http://").ok_or_else(|| {
        if strip_prefix_ignore_case(target, "https://").is_some() {
            bad(400, "https:// URLs go through the proxy as CONNECT, not as a request")
        } else {
            bad(400, format!(
                "'{}' is not a proxy request: this is an HTTP proxy; send absolute URLs (http://host/path) or CONNECT",
                clean(target)
            ))
        }
    })?;
    if !METHODS.contains(&method) {
        return Err(bad(
            405,
            format!("method {} is not forwarded", clean(method)),
        ));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    let (host, port) = authority(auth, Some(80))
        .ok_or_else(|| bad(400, format!("bad host in URL '{}'", clean(target))))?;
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    let head = origin_head(method, &path, minor, auth, req.headers);
    Ok(Some((
        Request::Forward {
            method: method.to_string(),
            host,
            port,
            path,
            head,
        },
        len,
    )))
}

fn origin_head(
    method: &str,
    path: &str,
    minor: u8,
    authority: &str,
    headers: &[httparse::Header],
) -> Vec<u8> {
    // Headers the client's Connection header names are hop-by-hop too.
    let named: Vec<String> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| t != "content-length" && t != "transfer-encoding")
        .collect();
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        format!(
            "{method} {path} HTTP/1.{minor}\r\nHost: {}\r\n",
            authority.to_ascii_lowercase()
        )
        .as_bytes(),
    );
    for h in headers {
        let lower = h.name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// `host[:port]` or `[v6][:port]`; the port is required where `default`
/// is None. No user info, no empty host.
fn authority(s: &str, default: Option<u16>) -> Option<(Host, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let ip: std::net::Ipv6Addr = inside.parse().ok()?;
        (Host::Ip(IpAddr::V6(ip)), after)
    } else {
        let (h, after) = match s.find(':') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let host = match h.parse::<std::net::Ipv4Addr>() {
            Ok(ip) => Host::Ip(IpAddr::V4(ip)),
            Err(_) => Host::Name(host_name(h)?),
        };
        (host, after)
    };
    let port = match port.strip_prefix(':') {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u16>().ok().filter(|&n| n > 0)?
        }
        Some(_) => return None,
        None if port.is_empty() => default?,
        None => return None,
    };
    let host = match host {
        Host::Ip(ip) => Host::Ip(crate::net::canonical(ip)),
        h => h,
    };
    Some((host, port))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len()
        && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes()))
    .then(|| &s[prefix.len()..])
}

/// At most 100 printable ASCII characters of what the client sent, for a
/// message that goes into a header.
pub fn clean(s: &str) -> String {
    clean_n(s, 100)
}

/// A whole message, at most 1000 printable ASCII characters.
pub fn clean_long(s: &str) -> String {
    clean_n(s, 1000)
}

fn clean_n(s: &str, n: usize) -> String {
    s.chars()
        .take(n)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (Request, usize) {
        parse(raw.as_bytes()).unwrap().unwrap()
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn connect_targets() {
        let cases = [
            (
                "CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n",
                name("example.org"),
                443,
            ),
            (
                "CONNECT Example.ORG:8443 HTTP/1.0\r\n\r\n",
                name("example.org"),
                8443,
            ),
            (
                "CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
                Host::Ip("127.0.0.1".parse().unwrap()),
                22,
            ),
            (
                "CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
                Host::Ip("::1".parse().unwrap()),
                443,
            ),
            (
                "CONNECT [::ffff:10.0.0.1]:443 HTTP/1.1\r\n\r\n",
                Host::Ip("10.0.0.1".parse().unwrap()),
                443,
            ),
        ];
        for (raw, host, port) in cases {
            let (req, n) = ok(raw);
            assert_eq!(req, Request::Connect { host, port }, "{raw:?}");
            assert_eq!(n, raw.len());
        }
    }

    #[test]
    fn bad_requests_get_a_4xx_with_a_reason() {
        let cases = [
            ("CONNECT example.org HTTP/1.1\r\n\r\n", 400),
            ("CONNECT example.org: HTTP/1.1\r\n\r\n", 400),
            ("CONNECT example.org:0 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT example.org:65536 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT example.org:44x3 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT user@example.org:443 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT :443 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT [::1:443 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT exa_mple..org:443 HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: example.org\r\n\r\n", 400),
            ("GET https://example.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET ftp://example.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://user:pw@example.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http:///x HTTP/1.1\r\n\r\n", 400),
            ("TRACE http://example.org/ HTTP/1.1\r\n\r\n", 405),
            ("BREW http://example.org/ HTTP/1.1\r\n\r\n", 405),
            ("GET http://example.org/ HTTP/2.0\r\n\r\n", 400),
            ("\x16\x03\x01\x02\x00\x01\x00\x01\x7f\x03\x03", 400),
            (
                "GET http://example.org/ HTTP/1.1\r\nBad Header\r\n\r\n",
                400,
            ),
            ("GET http://example.org/\0 HTTP/1.1\r\n\r\n", 400),
        ];
        for (raw, status) in cases {
            match parse(raw.as_bytes()) {
                Err(b) => {
                    assert_eq!(b.status, status, "{raw:?}: {}", b.message);
                    assert!(
                        b.message.chars().all(|c| c.is_ascii_graphic() || c == ' '),
                        "{:?}",
                        b.message
                    );
                }
                Ok(r) => panic!("{raw:?} parsed: {r:?}"),
            }
        }
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        let raw = format!("GET http://example.org/ HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(raw.as_bytes()).unwrap_err().status, 431);
    }

    #[test]
    fn incomplete_heads_wait_for_more() {
        for raw in [
            "",
            "CONN",
            "CONNECT example.org:443 HTTP/1.1\r\n",
            "GET http://a.test/ HTTP/1.1\r\nHost: a",
        ] {
            assert_eq!(parse(raw.as_bytes()), Ok(None), "{raw:?}");
        }
    }

    #[test]
    fn forwarded_requests_are_origin_form_without_hop_by_hop_headers() {
        let raw = "POST http://Example.org:8080/a/b?q=1 HTTP/1.1\r\n\
            Host: other.test\r\n\
            Proxy-Connection: keep-alive\r\n\
            Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
            Connection: keep-alive, X-Secret\r\n\
            X-Secret: 1\r\n\
            Keep-Alive: timeout=5\r\n\
            Upgrade: websocket\r\n\
            TE: trailers\r\n\
            Content-Length: 5\r\n\
            User-Agent: t\r\n\r\nhello";
        let (req, n) = ok(raw);
        assert_eq!(&raw[n..], "hello");
        let Request::Forward {
            method,
            host,
            port,
            path,
            head,
        } = req
        else {
            panic!()
        };
        assert_eq!(
            (method.as_str(), host, port, path.as_str()),
            ("POST", name("example.org"), 8080, "/a/b?q=1")
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /a/b?q=1 HTTP/1.1\r\nHost: example.org:8080\r\nContent-Length: 5\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );
        let (req, _) = ok("GET http://example.org HTTP/1.0\r\n\r\n");
        let Request::Forward {
            path, head, port, ..
        } = req
        else {
            panic!()
        };
        assert_eq!((path.as_str(), port), ("/", 80));
        assert!(head.starts_with(b"GET / HTTP/1.0\r\nHost: example.org\r\n"));
        let (req, _) = ok("GET http://example.org?x HTTP/1.1\r\n\r\n");
        assert!(matches!(req, Request::Forward { ref path, .. } if path == "/?x"));
        let (req, _) = ok("GET http://[::1]:8080/ HTTP/1.1\r\n\r\n");
        assert_eq!(req.host_port(), (&Host::Ip("::1".parse().unwrap()), 8080));
    }
}
