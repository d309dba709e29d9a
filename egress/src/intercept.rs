//! The intercepted connection (docs/network.md, "Secrets"): a CONNECT to
//! a host a secret is bound to. The proxy verifies the real server first
//! (so a server that does not verify is the client's 502, before any
//! tunnel), answers 200, then is the server to the guest with a
//! certificate from the run's CA, checks that the guest's SNI names the
//! bound host, and relays HTTP/1.1 or HTTP/2 requests one by one (hyper
//! on both sides, each side's protocol from its own ALPN), replacing
//! placeholders in request headers only. Bodies pass unchanged.
//!
//! Each request gets its own log line (method, path, status, which
//! secret went into which header, never a value); a request that carries
//! a placeholder where it must not (the URL, a header whose secret is
//! bound elsewhere, a Host that is not the bound host) is answered 403
//! and logged as a leak, and never reaches the server.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use crate::audit::{self, Audit, Record};
use crate::proxy::{Proxy, RUN_OVER};
use crate::secrets::{Found, Secrets};
use crate::tls::Tls;

/// What interception needs, made before confinement.
pub struct Intercept {
    pub secrets: Secrets,
    pub tls: Tls,
}

/// The upstream side, verified, with the protocol it agreed to.
pub struct Upstream {
    pub tls: TlsStream<TcpStream>,
    pub host: String,
    pub port: u16,
}

/// Why an intercepted connection ended early (logged on its CONNECT line).
pub struct Cut {
    pub decision: &'static str,
    pub rule: String,
    pub reason: String,
}

type Body = BoxBody<Bytes, hyper::Error>;

enum Sender {
    H1(Mutex<hyper::client::conn::http1::SendRequest<Incoming>>),
    H2(hyper::client::conn::http2::SendRequest<Incoming>),
}

/// Shared by every request of one intercepted connection.
struct Conn {
    audit: Arc<Audit>,
    secrets: Arc<Intercept>,
    conn: u64,
    host: String,
    port: u16,
    target: String,
    address: String,
    sender: Sender,
    upstream_h2: bool,
}

/// Verifies the real server: TLS with the host's roots (and
/// --upstream-ca), with the bound name.
pub async fn verify_upstream(
    intercept: &Intercept,
    tcp: TcpStream,
    host: &str,
    port: u16,
    deadline: Duration,
) -> Result<Upstream, String> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} is not a name TLS can verify: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(intercept.tls.client.clone());
    match tokio::time::timeout(deadline, connector.connect(name, tcp)).await {
        Ok(Ok(tls)) => Ok(Upstream {
            tls,
            host: host.to_string(),
            port,
        }),
        Ok(Err(e)) => Err(format!(
            "{host}:{port}: TLS with the real server failed: {e}"
        )),
        Err(_) => Err(format!(
            "{host}:{port}: the real server did not finish TLS within {deadline:?}"
        )),
    }
}

/// Byte counts, the run's budget and the last activity, for one stream.
pub struct Meter {
    pub up: AtomicU64,
    pub down: AtomicU64,
    pub used: Arc<AtomicU64>,
    pub max: u64,
    pub base: Instant,
    pub last_ms: AtomicU64,
}

impl Meter {
    fn add(&self, counter: &AtomicU64, n: usize) -> io::Result<()> {
        let n = n as u64;
        counter.fetch_add(n, Ordering::Relaxed);
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
        if self.used.fetch_add(n, Ordering::Relaxed) + n > self.max {
            return Err(io::Error::other("byte limit"));
        }
        Ok(())
    }
}

/// The guest's stream, counted (TLS bytes, as a tunnel's would be), with
/// what the guest sent along with its CONNECT read first.
pub struct Metered {
    pub inner: UnixStream,
    pub early: Vec<u8>,
    pub meter: Arc<Meter>,
}

impl AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.early.is_empty() {
            let n = self.early.len().min(buf.remaining());
            buf.put_slice(&self.early[..n]);
            self.early.drain(..n);
            self.meter.add(&self.meter.up, n)?;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = buf.filled().len() - before;
            if n > 0 {
                self.meter.add(&self.meter.up, n)?;
            }
        }
        r
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.meter.add(&self.meter.down, n)?;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Proxy {
    /// An intercepted connection (intercept.rs), to its end: cut like a
    /// tunnel when idle or when the run ends; its line gets the bytes.
    pub(crate) async fn intercepted(
        &self,
        client: UnixStream,
        upstream: Upstream,
        early: Vec<u8>,
        rec: &mut Record,
    ) {
        let Some(i) = self.intercept.clone() else {
            return;
        };
        let meter = Arc::new(Meter {
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            used: self.used.clone(),
            max: self.limits.max_bytes,
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        });
        let guest = Metered {
            inner: client,
            early,
            meter: meter.clone(),
        };
        let idle = self.limits.idle_timeout;
        let watchdog = async {
            loop {
                let quiet = meter
                    .base
                    .elapsed()
                    .saturating_sub(Duration::from_millis(meter.last_ms.load(Ordering::Relaxed)));
                if quiet >= idle {
                    return;
                }
                tokio::time::sleep(idle - quiet).await;
            }
        };
        let work = serve(
            i,
            self.audit.clone(),
            guest,
            upstream,
            rec.conn,
            rec.address.clone().unwrap_or_default(),
        );
        tokio::select! {
            r = work => if let Err(cut) = r {
                rec.decision = cut.decision;
                rec.rule = cut.rule;
                rec.reason = Some(cut.reason);
            },
            () = watchdog => rec.reason = Some(format!("idle for {idle:?}: closed")),
            () = self.ended() => rec.reason = Some(RUN_OVER.into()),
        }
        rec.bytes_up = meter.up.load(Ordering::Relaxed);
        rec.bytes_down = meter.down.load(Ordering::Relaxed);
    }
}

/// Serves one intercepted connection to its end. `guest` has had its 200.
pub async fn serve(
    intercept: Arc<Intercept>,
    audit: Arc<Audit>,
    guest: Metered,
    upstream: Upstream,
    conn: u64,
    address: String,
) -> Result<(), Cut> {
    let cut = |rule: &str, reason: String| Cut {
        decision: "error",
        rule: rule.into(),
        reason,
    };
    let config = intercept
        .tls
        .server(&upstream.host)
        .ok_or_else(|| cut("interception", "no certificate for the bound host".into()))?;
    let guest = tokio_rustls::TlsAcceptor::from(config)
        .accept(guest)
        .await
        .map_err(|e| cut("guest TLS", format!("TLS with the guest failed: {e}")))?;
    // The name the guest's TLS asked for must be the bound host: a
    // placeholder may only go where the CONNECT, the SNI and the Host
    // header all say.
    let sni = guest.get_ref().1.server_name().map(str::to_ascii_lowercase);
    if sni.as_deref() != Some(upstream.host.as_str()) {
        return Err(Cut {
            decision: "denied",
            rule: "SNI mismatch".into(),
            reason: format!(
                "the guest's TLS named {} on a connection to {}:{}",
                sni.as_deref().unwrap_or("no host"),
                upstream.host,
                upstream.port
            ),
        });
    }
    let upstream_h2 = upstream.tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(upstream.tls);
    let sender = if upstream_h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| {
                cut(
                    "upstream error",
                    format!("HTTP/2 with the real server: {e}"),
                )
            })?;
        tokio::spawn(conn);
        Sender::H2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| {
                cut(
                    "upstream error",
                    format!("HTTP/1.1 with the real server: {e}"),
                )
            })?;
        tokio::spawn(conn);
        Sender::H1(Mutex::new(sender))
    };
    let conn = Arc::new(Conn {
        audit,
        secrets: intercept,
        conn,
        target: crate::policy::target(&upstream.host, upstream.port),
        host: upstream.host,
        port: upstream.port,
        address,
        sender,
        upstream_h2,
    });
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, std::convert::Infallible>(conn.relay(req).await) }
    });
    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(guest), service)
        .await
        .map_err(|e| cut("guest error", format!("HTTP from the guest: {e}")))
}

impl Conn {
    /// One request: checked, its placeholders replaced, sent, answered.
    async fn relay(&self, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let mut rec = Record {
            time: audit::now(),
            run_id: self.audit.run_id().to_string(),
            conn: self.conn,
            method: Some(req.method().to_string()),
            host: Some(self.host.clone()),
            port: Some(self.port),
            address: Some(self.address.clone()),
            decision: "allowed",
            rule: format!("secret bound to {}", self.target),
            path: Some(req.uri().path().to_string()),
            intercepted: true,
            ..Default::default()
        };
        let answer = match self.prepare(req, &mut rec) {
            Ok(req) => self.send(req, &mut rec).await,
            Err(why) => refusal(StatusCode::FORBIDDEN, &why),
        };
        rec.status = Some(answer.status().as_u16());
        rec.duration_ms = start.elapsed().as_millis() as u64;
        self.audit.record(&rec);
        answer
    }

    /// The request as it goes upstream, or why it is a leak (its 403).
    fn prepare(
        &self,
        mut req: Request<Incoming>,
        rec: &mut Record,
    ) -> Result<Request<Incoming>, String> {
        let secrets = &self.secrets.secrets;
        let leak = |rec: &mut Record, name: &str, place: &str| {
            rec.decision = "denied";
            rec.rule = "placeholder leak".into();
            let why = format!(
                "the placeholder of secret {name} was sent {place}; it is replaced only in the headers of requests to the hosts it is bound to"
            );
            rec.reason = Some(why.clone());
            why
        };
        if let Some(name) = secrets.leaked_in(req.uri().to_string().as_bytes()) {
            return Err(leak(rec, name, "in the URL"));
        }
        // The Host header (HTTP/1.1) or :authority (HTTP/2) must name the
        // bound host; otherwise nothing is replaced and any placeholder is
        // a leak.
        let named = req
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default();
        let named_host = named
            .rsplit_once(':')
            .filter(|(_, p)| p.parse::<u16>().is_ok())
            .map_or(named.as_str(), |(h, _)| h)
            .to_ascii_lowercase();
        let target = if named_host == self.host {
            self.target.as_str()
        } else {
            ""
        };
        let mut replaced = Vec::new();
        for (name, value) in req.headers_mut().iter_mut() {
            match secrets.substitute(target, value.as_bytes()) {
                Found::None => {}
                Found::Leak(secret) => {
                    let place = if target.is_empty() {
                        format!("in header {name} of a request for {named_host}")
                    } else {
                        format!("in header {name}")
                    };
                    return Err(leak(rec, secret, &place));
                }
                Found::Substituted(new, secrets) => {
                    // from_bytes only fails on bytes the value had not
                    // (checked when the secrets were read).
                    if let Ok(v) = HeaderValue::from_bytes(&new) {
                        *value = v;
                        value.set_sensitive(true);
                    }
                    replaced.extend(secrets.iter().map(|s| format!("{s} in {name}")));
                }
            }
        }
        rec.secrets = replaced;
        Ok(req)
    }

    async fn send(&self, req: Request<Incoming>, rec: &mut Record) -> Response<Body> {
        let version = req.version();
        let req = self.for_upstream(req);
        let result = match &self.sender {
            Sender::H1(sender) => {
                let mut sender = sender.lock().await;
                match sender.ready().await {
                    Ok(()) => sender.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Sender::H2(sender) => {
                let mut sender = sender.clone();
                match sender.ready().await {
                    Ok(()) => sender.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(mut resp) => {
                if resp.version() != version {
                    strip_hop_by_hop(resp.headers_mut());
                    *resp.version_mut() = version;
                }
                resp.map(BodyExt::boxed)
            }
            Err(e) => {
                rec.decision = "error";
                rec.rule = "upstream error".into();
                let why = format!("{}: {e}", self.target);
                rec.reason = Some(why.clone());
                refusal(StatusCode::BAD_GATEWAY, &why)
            }
        }
    }

    /// The request in the form the upstream's protocol wants.
    fn for_upstream(&self, mut req: Request<Incoming>) -> Request<Incoming> {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let authority = if self.port == 443 {
            self.host.clone()
        } else {
            self.target.clone()
        };
        let h2_from_h1 = self.upstream_h2 && req.version() != Version::HTTP_2;
        let h1_from_h2 = !self.upstream_h2 && req.version() == Version::HTTP_2;
        if h2_from_h1 || h1_from_h2 {
            strip_hop_by_hop(req.headers_mut());
        }
        if self.upstream_h2 {
            *req.version_mut() = Version::HTTP_2;
            if let Ok(uri) = format!("https://{authority}{path}").parse::<Uri>() {
                *req.uri_mut() = uri;
            }
            req.headers_mut().remove(HOST);
        } else {
            *req.version_mut() = Version::HTTP_11;
            if let Ok(uri) = path.parse::<Uri>() {
                *req.uri_mut() = uri;
            }
            if !req.headers().contains_key(HOST) {
                if let Ok(v) = HeaderValue::from_str(&authority) {
                    req.headers_mut().insert(HOST, v);
                }
            }
        }
        req
    }
}

/// Headers that belong to one HTTP/1.1 hop and that HTTP/2 forbids.
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(HeaderName::from_static(name));
    }
}

/// The proxy's own answer inside an intercepted connection: the same
/// shape as its refusals outside (X-Mvm-Blocked and a one-line body).
fn refusal(status: StatusCode, why: &str) -> Response<Body> {
    let body = format!("mvm: network: {why}\n");
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(why) {
        resp.headers_mut()
            .insert(HeaderName::from_static("x-mvm-blocked"), v);
    }
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
