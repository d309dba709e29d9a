//! Secrets by placeholder through the real binary: an HTTPS server of the
//! test's own (rustls, a CA made here and given with --upstream-ca) that
//! echoes the request head it got, and a guest side speaking TLS to the
//! proxy with the run's CA (--ca-cert). Checked: the real value arrives in
//! the header and only there; the URL, a header to an unbound host, a
//! plain tunnel and another SNI are leaks, refused and logged; bodies pass
//! unchanged; a server that does not verify is a 502 before any tunnel.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use common::{echo_server, scratch, Egress};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

const P: &str = "mvm-secret-00112233445566778899aabbccddeeff";
const REAL: &str = "real-token-value-42";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTPS server for api.test on 127.0.0.1 (HTTP/1.1), answering each
/// request with its head and body as the response body. Returns its
/// address and its CA's PEM.
fn echo_https(names: &[&str]) -> (SocketAddr, String) {
    let (config, ca_pem) = server_config(names, b"http/1.1");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                loop {
                    let mut reader = BufReader::new(&mut tls);
                    let mut head = String::new();
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; length];
                    reader.read_exact(&mut body).unwrap();
                    let answer = format!("{head}{}", String::from_utf8_lossy(&body));
                    let out = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if tls.write_all(out.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, ca_pem)
}

/// A server configuration for `names` from a CA of its own (its PEM is
/// what the proxy is told to trust), offering `alpn`.
fn server_config(names: &[&str], alpn: &[u8]) -> (rustls::ServerConfig, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    config.alpn_protocols = vec![alpn.to_vec()];
    (config, ca.pem())
}

struct Run {
    egress: Egress,
    ca: Vec<CertificateDer<'static>>,
    port: u16,
    /// The secrets and CA files: removed with the run.
    dir: std::path::PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A proxy with TOKEN bound to api.test:PORT, api.test and other.test
/// resolving to 127.0.0.1 and allowed; `server_ca` is what it trusts.
fn start(port: u16, server_ca: &str) -> Run {
    let dir = scratch("intercept");
    let upstream = dir.join("upstream-ca.pem");
    std::fs::write(&upstream, server_ca).unwrap();
    let secrets = dir.join("secrets.json");
    std::fs::write(
        &secrets,
        format!(
            r#"[{{"name":"TOKEN","placeholder":"{P}","value":"{REAL}","hosts":["api.test:{port}"]}}]"#
        ),
    )
    .unwrap();
    let ca_out = dir.join("run-ca.pem");
    let allow = |h: &str| format!("{h}:{port}");
    let egress = Egress::start(&[
        "--resolve",
        "api.test=127.0.0.1",
        "--resolve",
        "other.test=127.0.0.1",
        "--allow",
        &allow("api.test"),
        "--allow",
        &allow("other.test"),
        "--allow",
        &allow("127.0.0.1"),
        "--secrets-file",
        secrets.to_str().unwrap(),
        "--upstream-ca",
        upstream.to_str().unwrap(),
        "--ca-cert",
        ca_out.to_str().unwrap(),
    ]);
    let ca = CertificateDer::pem_file_iter(&ca_out)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert_eq!(ca.len(), 1);
    Run {
        egress,
        ca,
        port,
        dir,
    }
}

/// What a hostile guest's TLS client does: takes any certificate (so
/// that a handshake with another SNI completes, and the proxy's own
/// check is what stops it).
#[derive(Debug)]
struct TakesAnything(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for TakesAnything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl Run {
    /// CONNECT `target` through the proxy, then TLS with SNI `sni`,
    /// trusting only the run's CA; sends `request`, returns the answer
    /// (or the error, as text).
    fn https(&self, target: &str, sni: &str, request: &str) -> String {
        self.https_with(target, sni, request, false)
    }

    /// As `https`; `hostile`: take any certificate.
    fn https_with(&self, target: &str, sni: &str, request: &str, hostile: bool) -> String {
        let mut s = self.egress.connect();
        write!(s, "CONNECT {target}:{} HTTP/1.1\r\n\r\n", self.port).unwrap();
        let mut head = [0u8; 39];
        if s.read_exact(&mut head).is_err() || !head.starts_with(b"HTTP/1.1 200") {
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            return format!(
                "no tunnel: {}{}",
                String::from_utf8_lossy(&head),
                String::from_utf8_lossy(&rest)
            );
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.ca {
            roots.add(c.clone()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        if hostile {
            config
                .dangerous()
                .set_certificate_verifier(Arc::new(TakesAnything(provider())));
        }
        let conn = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from(sni.to_string()).unwrap(),
        )
        .unwrap();
        let mut tls = rustls::StreamOwned::new(conn, s);
        if let Err(e) = tls.write_all(request.as_bytes()) {
            return format!("TLS error: {e}");
        }
        let mut out = Vec::new();
        match tls.read_to_end(&mut out) {
            Ok(_) => String::from_utf8_lossy(&out).into_owned(),
            Err(e) if !out.is_empty() => {
                // The server's answer came; the close was not TLS's own.
                let _ = e;
                String::from_utf8_lossy(&out).into_owned()
            }
            Err(e) => format!("TLS error: {e}"),
        }
    }
}

fn get(host: &str, port: u16, path: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn the_real_value_goes_into_the_bound_hosts_headers_and_nowhere_else() {
    let (server, server_ca) = echo_https(&["api.test", "other.test"]);
    let port = server.port();
    let run = start(port, &server_ca);

    // The bound host: the header arrives with the real value; the body's
    // placeholder arrives unchanged (bodies are never rewritten).
    let ok = run.https(
        "api.test",
        "api.test",
        &get(
            "api.test",
            port,
            "/v1",
            &format!("Authorization: Bearer {P}\r\nx-api-key: {P}\r\n"),
            &format!("body {P}"),
        ),
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.contains(&format!("authorization: Bearer {REAL}")),
        "{ok}"
    );
    assert!(ok.contains(&format!("x-api-key: {REAL}")), "{ok}");
    assert!(
        ok.contains(&format!("body {P}")),
        "the body is untouched: {ok}"
    );
    assert_eq!(ok.matches(REAL).count(), 2, "{ok}");

    // In the URL, even to the bound host: refused before the server.
    let url = run.https(
        "api.test",
        "api.test",
        &get("api.test", port, &format!("/v1?key={P}"), "", ""),
    );
    assert!(url.starts_with("HTTP/1.1 403"), "{url}");
    assert!(url.contains("secret TOKEN was sent in the URL"), "{url}");
    assert!(!url.contains(REAL));

    // A Host header naming another host on the bound connection: nothing
    // is replaced, the placeholder is a leak.
    let host = run.https(
        "api.test",
        "api.test",
        &get(
            "other.test",
            port,
            "/",
            &format!("Authorization: {P}\r\n"),
            "",
        ),
    );
    assert!(host.starts_with("HTTP/1.1 403"), "{host}");
    assert!(host.contains("request for other.test"), "{host}");

    // Another SNI on a connection to the bound host: cut at once.
    let sni = run.https_with(
        "api.test",
        "other.test",
        &get(
            "other.test",
            port,
            "/",
            &format!("Authorization: {P}\r\n"),
            "",
        ),
        true,
    );
    assert!(!sni.contains(REAL) && !sni.contains("200 OK"), "{sni}");

    // A plain tunnel to a host the secret is not bound to: the proxy
    // cannot read TLS there, but the placeholder in plain bytes is seen
    // and the tunnel cut before they leave.
    let mut s = run.egress.connect();
    write!(s, "CONNECT other.test:{port} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nAuthorization: {P}\r\n\r\n").as_bytes())
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));

    // A plain-HTTP request carrying it: 403 before anything is sent.
    let plain = run.egress.exchange(
        format!("GET http://other.test:{port}/ HTTP/1.1\r\nHost: other.test\r\nAuthorization: {P}\r\n\r\n")
            .as_bytes(),
    );
    assert!(plain.starts_with("HTTP/1.1 403"), "{plain}");
    assert!(plain.contains("secret TOKEN"), "{plain}");

    // The log: the substitution by header name, every leak, never the value.
    let log = run.egress.log_lines(9);
    let text = std::fs::read_to_string(&run.egress.log).unwrap();
    assert!(!text.contains(REAL), "the value is in the log: {text}");
    let substituted = log
        .iter()
        .find(|l| l["method"] == "POST" && l["path"] == "/v1" && l["status"] == 200)
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        substituted["secrets"],
        serde_json::json!(["TOKEN in authorization", "TOKEN in x-api-key"])
    );
    assert_eq!(substituted["intercepted"], true);
    let leaks = log
        .iter()
        .filter(|l| l["rule"] == "placeholder leak" && l["decision"] == "denied")
        .count();
    assert_eq!(leaks, 4, "URL, Host, tunnel, plain HTTP: {text}");
    // Each says where the placeholder was headed, the plain request too.
    let plain_leak = log
        .iter()
        .find(|l| {
            l["rule"] == "placeholder leak"
                && l["status"] == 403
                && l["method"] == "GET"
                && l["path"] == "/"
                && l["host"] == "other.test"
        })
        .unwrap_or_else(|| panic!("no leak line for the plain request to other.test: {text}"));
    assert_eq!(plain_leak["port"], port, "{text}");
    assert!(log.iter().any(|l| l["rule"] == "SNI mismatch"), "{text}");
}

/// An HTTPS server for api.test offering only HTTP/2 (ALPN h2, hyper),
/// answering each request with its version and Authorization header.
fn h2_https() -> (SocketAddr, String) {
    use http_body_util::Full;
    let (config, ca_pem) = server_config(&["api.test"], b"h2");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        |req: hyper::Request<hyper::body::Incoming>| async move {
                            let auth = req
                                .headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            let text =
                                format!("version {:?} authorization {auth}\n", req.version());
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                bytes::Bytes::from(text),
                            )))
                        },
                    );
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
    });
    (addr, ca_pem)
}

#[test]
fn an_http2_server_gets_the_value_from_an_http1_client() {
    let (server, ca) = h2_https();
    let run = start(server.port(), &ca);
    let answer = run.https(
        "api.test",
        "api.test",
        &get(
            "api.test",
            server.port(),
            "/v1",
            &format!("Authorization: Bearer {P}\r\n"),
            "",
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(&format!("version HTTP/2.0 authorization Bearer {REAL}")),
        "{answer}"
    );
}

#[test]
fn a_server_that_does_not_verify_is_a_502_before_any_tunnel() {
    let (server, _its_ca) = echo_https(&["api.test"]);
    // The proxy trusts another CA than the server's.
    let (_, wrong_ca) = echo_https(&["api.test"]);
    let run = start(server.port(), &wrong_ca);
    let answer = run
        .egress
        .exchange(format!("CONNECT api.test:{} HTTP/1.1\r\n\r\n", server.port()).as_bytes());
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(
        answer.contains("TLS with the real server failed"),
        "{answer}"
    );
    assert!(answer.contains("invalid peer certificate"), "{answer}");
    let log = run.egress.log_lines(1);
    assert_eq!(log[0]["rule"], "upstream certificate");
    // A plain tunnel elsewhere is still a tunnel (the echo server).
    let _ = echo_server();
}

#[test]
fn each_run_has_its_own_ca() {
    let (server, ca) = echo_https(&["api.test"]);
    let a = start(server.port(), &ca);
    let b = start(server.port(), &ca);
    assert_ne!(a.ca, b.ca);
    // And the CA's key is nowhere in what the proxy writes.
    for run in [&a, &b] {
        for entry in std::fs::read_dir(&run.egress.dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            assert!(!text.contains("PRIVATE KEY"), "{text}");
        }
    }
}
