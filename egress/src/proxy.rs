//! One run's proxy: the accept loop (bounded in connections at once and
//! per second) and, per connection, read the request head, check it,
//! resolve, connect to the checked address, then tunnel or forward,
//! counting bytes, and log one line. Every failure is an HTTP answer with
//! a reason (403 policy, 4xx bad request, 502 DNS or connect, 504 timeout),
//! never a silent close or a hang.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{timeout, Instant};

use crate::audit::{self, Audit, Record};
use crate::intercept::{self, Intercept, Upstream};
use crate::limits::{Bucket, Limits};
use crate::policy::{self, Denial, Policy};
use crate::request::{self, Host, Request};
use crate::resolve::Resolver;
use crate::response;
use crate::tunnel::End;

pub struct Proxy {
    pub policy: Policy,
    pub resolver: Resolver,
    pub limits: Limits,
    pub audit: Arc<Audit>,
    /// Secrets and the TLS to swap them in, when the run has any.
    pub intercept: Option<Arc<Intercept>>,
    pub(crate) used: Arc<AtomicU64>,
    seq: AtomicU64,
    /// Set once by `end` (mvm's SIGTERM when the run is over).
    ending: watch::Sender<bool>,
}

/// How an exchange ended early: what the client is told and logged.
struct Refusal {
    /// 0: nothing to answer (the client went away).
    status: u16,
    decision: &'static str,
    rule: String,
    message: String,
}

fn denied(d: Denial) -> Refusal {
    Refusal {
        status: 403,
        decision: "denied",
        rule: d.rule(),
        message: d.to_string(),
    }
}

fn error(status: u16, rule: &str, message: String) -> Refusal {
    Refusal {
        status,
        decision: "error",
        rule: rule.into(),
        message,
    }
}

/// The reason logged for a connection cut by the run's end.
pub(crate) const RUN_OVER: &str = "still open when the run ended: cut";

/// How long `serve` waits, after `end`, for open connections to be cut
/// and logged (each is cut at once; this only bounds a stuck write).
const END_GRACE: Duration = Duration::from_secs(2);

impl Proxy {
    pub fn new(
        policy: Policy,
        resolver: Resolver,
        limits: Limits,
        audit: Audit,
        intercept: Option<Intercept>,
    ) -> Proxy {
        Proxy {
            policy,
            resolver,
            limits,
            audit: Arc::new(audit),
            intercept: intercept.map(Arc::new),
            used: Arc::new(AtomicU64::new(0)),
            seq: AtomicU64::new(0),
            ending: watch::channel(false).0,
        }
    }

    /// The run is over: accept nothing more, cut what is still open, and
    /// let `serve` return once each open connection has its log line.
    pub fn end(&self) {
        self.ending.send_replace(true);
    }

    /// Resolves once `end` was called.
    pub(crate) async fn ended(&self) {
        let mut rx = self.ending.subscribe();
        let _ = rx.wait_for(|&e| e).await;
    }

    /// `work`, or an error once the run ended first (a request still being
    /// read, resolved or connected when the VM was gone).
    async fn until_end<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, Refusal>>,
    ) -> Result<T, Refusal> {
        tokio::select! {
            r = work => r,
            () = self.ended() => Err(error(
                0,
                "run ended",
                "the run ended before the request was through".into(),
            )),
        }
    }

    /// Serves until `end`, then waits (at most `END_GRACE`) for every open
    /// connection to be cut and logged.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        let permits = Arc::new(Semaphore::new(self.limits.max_connections));
        let mut bucket = Bucket::new(self.limits.conn_rate);
        loop {
            // Past either limit nothing is accepted: further connections
            // wait in the listen backlog, then in the guest.
            let next = async {
                let permit = permits.clone().acquire_owned().await.ok()?;
                bucket.take().await;
                Some((permit, listener.accept().await))
            };
            let (permit, accepted) = tokio::select! {
                n = next => match n {
                    Some(n) => n,
                    None => return,
                },
                () = self.ended() => break,
            };
            let client = match accepted {
                Ok((c, _)) => c,
                Err(_) => {
                    // Out of fds or the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let proxy = self.clone();
            tokio::spawn(async move {
                proxy.handle(client).await;
                drop(permit);
            });
        }
        // Every permit back: every connection task has written its line.
        let all = u32::try_from(self.limits.max_connections).unwrap_or(u32::MAX);
        let _ = timeout(END_GRACE, permits.acquire_many(all)).await;
    }

    async fn handle(&self, mut client: UnixStream) {
        let start = Instant::now();
        let mut rec = Record {
            time: audit::now(),
            run_id: self.audit.run_id().to_string(),
            conn: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            decision: "allowed",
            ..Default::default()
        };
        match self.exchange(&mut client, &mut rec).await {
            Ok(None) => {}
            Ok(Some((upstream, leftover))) => {
                self.intercepted(client, upstream, leftover, &mut rec).await;
            }
            Err(r) => {
                if r.status != 0 {
                    let answer = response::refusal(r.status, &r.message);
                    // A client that does not read cannot hold the task.
                    let _ = timeout(Duration::from_secs(5), client.write_all(&answer)).await;
                    let _ = timeout(Duration::from_secs(1), client.shutdown()).await;
                    rec.status = Some(r.status);
                }
                rec.decision = r.decision;
                rec.rule = r.rule;
                rec.reason = Some(r.message);
            }
        }
        rec.duration_ms = start.elapsed().as_millis() as u64;
        self.audit.record(&rec);
    }

    /// Reads, checks and carries out one request. A CONNECT to a host a
    /// secret is bound to ends here with the verified upstream (and any
    /// bytes the client sent early), for `intercepted`.
    async fn exchange(
        &self,
        client: &mut UnixStream,
        rec: &mut Record,
    ) -> Result<Option<(Upstream, Vec<u8>)>, Refusal> {
        let (req, read, head_len) = self.until_end(self.read_head(client)).await?;
        let (host, port) = req.host_port();
        let host = host.clone();
        rec.method = Some(req.method().to_string());
        rec.host = Some(host.text());
        rec.port = Some(port);
        if let Request::Forward { path, .. } = &req {
            rec.path = Some(path.split('?').next().unwrap_or("/").to_string());
        }
        // After the record has the request: the audit line says where the
        // placeholder was headed.
        if let Some(name) = self.leak_in(&read) {
            return Err(Refusal {
                status: 403,
                decision: "denied",
                rule: "placeholder leak".into(),
                message: format!(
                    "the placeholder of secret {name} was sent in a request the proxy does not intercept (plain HTTP, or a CONNECT line); it is replaced only in the headers of HTTPS requests to the hosts it is bound to"
                ),
            });
        }
        let leftover = read[head_len..].to_vec();
        if self.used.load(Ordering::Relaxed) >= self.limits.max_bytes {
            return Err(self.budget_refusal());
        }
        let (candidates, rule) = self.until_end(self.check(&host, port, rec)).await?;
        rec.rule = rule;
        let (mut upstream, addr) = self
            .until_end(self.connect(&host, port, &candidates))
            .await?;
        rec.address = Some(addr.ip().to_string());
        let target = policy::target(&host.text(), port);
        if let (Request::Connect { .. }, Some(i)) = (&req, &self.intercept) {
            if i.secrets.bound(&target) {
                // The real server is verified before the guest hears 200:
                // one that does not verify is a 502 with the reason.
                let name = host.text();
                let verified = intercept::verify_upstream(
                    i,
                    upstream,
                    &name,
                    port,
                    self.limits.connect_timeout,
                );
                let up = self
                    .until_end(async {
                        verified
                            .await
                            .map_err(|m| error(502, "upstream certificate", m))
                    })
                    .await?;
                client
                    .write_all(response::ESTABLISHED)
                    .await
                    .map_err(|_| error(0, "client went away", "client went away".into()))?;
                rec.status = Some(200);
                rec.intercepted = true;
                return Ok(Some((up, leftover)));
            }
        }
        let forward = match &req {
            Request::Connect { .. } => {
                client
                    .write_all(response::ESTABLISHED)
                    .await
                    .map_err(|_| error(0, "client went away", "client went away".into()))?;
                rec.status = Some(200);
                false
            }
            Request::Forward { head, .. } => {
                self.spend(head.len() as u64)
                    .map_err(|_| self.budget_refusal())?;
                upstream
                    .write_all(head)
                    .await
                    .map_err(|e| self.upstream_error(&host, port, addr, &e))?;
                rec.bytes_up += head.len() as u64;
                true
            }
        };
        if !leftover.is_empty() {
            // Bytes the client sent after the head (a TLS hello, a body).
            self.spend(leftover.len() as u64)
                .map_err(|_| self.budget_refusal())?;
            upstream
                .write_all(&leftover)
                .await
                .map_err(|e| self.upstream_error(&host, port, addr, &e))?;
            rec.bytes_up += leftover.len() as u64;
        }
        let (up, down, end) = self.pump(client, &mut upstream, forward).await;
        rec.bytes_up += up;
        rec.bytes_down += down;
        match end {
            None | Some(End::Io) => Ok(None),
            Some(End::Leak(name)) => Err(Refusal {
                status: 0,
                decision: "denied",
                rule: "placeholder leak".into(),
                message: format!(
                    "the placeholder of secret {name} was sent through the tunnel to {target}, which it is not bound to: the connection was cut before it left"
                ),
            }),
            Some(End::Idle) if forward && down == 0 => Err(error(
                504,
                "upstream timeout",
                format!(
                    "{} sent no response within {:?}",
                    policy::target(&host.text(), port),
                    self.limits.idle_timeout
                ),
            )),
            Some(End::Idle) => {
                rec.reason = Some(format!("idle for {:?}: closed", self.limits.idle_timeout));
                Ok(None)
            }
            Some(End::Budget) => {
                rec.reason = Some(self.budget_refusal().message);
                Ok(None)
            }
            Some(End::RunOver) => {
                rec.reason = Some(RUN_OVER.into());
                Ok(None)
            }
        }
    }

    /// The secret whose placeholder is in `bytes`, if any.
    fn leak_in(&self, bytes: &[u8]) -> Option<String> {
        let i = self.intercept.as_ref()?;
        i.secrets.leaked_in(bytes).map(str::to_string)
    }

    fn budget_refusal(&self) -> Refusal {
        Refusal {
            status: 403,
            decision: "denied",
            rule: "byte limit".into(),
            message: format!(
                "this run's egress limit of {} bytes is used up; raise it with --max-bytes",
                self.limits.max_bytes
            ),
        }
    }

    pub(crate) fn spend(&self, n: u64) -> Result<(), ()> {
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before + n > self.limits.max_bytes {
            Err(())
        } else {
            Ok(())
        }
    }

    fn upstream_error(
        &self,
        host: &Host,
        port: u16,
        addr: SocketAddr,
        e: &std::io::Error,
    ) -> Refusal {
        error(
            502,
            "upstream error",
            format!(
                "{} ({}): {e}",
                policy::target(&host.text(), port),
                addr.ip()
            ),
        )
    }

    /// The request head, within the size and time limits: the request,
    /// every byte read (the head and what the client sent after it) and
    /// the head's length.
    async fn read_head(
        &self,
        client: &mut UnixStream,
    ) -> Result<(Request, Vec<u8>, usize), Refusal> {
        let max = self.limits.max_header_bytes;
        let read = async {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = vec![0u8; 4096];
            loop {
                if buf.len() >= max {
                    return Err(error(
                        431,
                        "bad request",
                        format!("the request head is larger than {max} bytes"),
                    ));
                }
                let want = chunk.len().min(max - buf.len());
                let n = match client.read(&mut chunk[..want]).await {
                    Ok(0) | Err(_) => {
                        return Err(error(
                            0,
                            "no request",
                            "closed before a complete request head".into(),
                        ))
                    }
                    Ok(n) => n,
                };
                let early = buf.len() < 64;
                buf.extend_from_slice(&chunk[..n]);
                // Parsing again only when a line ended (or early, to
                // refuse garbage at once) keeps a byte-at-a-time client
                // from costing a parse per byte.
                if !early && !chunk[..n].contains(&b'\n') {
                    continue;
                }
                match request::parse(&buf) {
                    Ok(None) => {}
                    Ok(Some((req, len))) => return Ok((req, buf, len)),
                    Err(bad) => return Err(error(bad.status, "bad request", bad.message)),
                }
            }
        };
        match timeout(self.limits.header_timeout, read).await {
            Ok(r) => r,
            Err(_) => Err(error(
                408,
                "bad request",
                format!(
                    "no complete request head within {:?}",
                    self.limits.header_timeout
                ),
            )),
        }
    }

    /// The addresses the request may go to, and the rules that allowed it.
    async fn check(
        &self,
        host: &Host,
        port: u16,
        rec: &mut Record,
    ) -> Result<(Vec<SocketAddr>, String), Refusal> {
        match host {
            Host::Ip(ip) => {
                rec.address = Some(ip.to_string());
                let rule = self.policy.check_addr(*ip, port, None).map_err(denied)?;
                let rule = rule.map(|r| format!("allow {r}")).unwrap_or_default();
                Ok((vec![SocketAddr::new(*ip, port)], rule))
            }
            Host::Name(name) => {
                let name_rule = self.policy.check_name(name, port).map_err(denied)?;
                let addrs = self
                    .resolver
                    .resolve(name)
                    .await
                    .map_err(|e| error(502, "DNS", e))?;
                let mut ok = Vec::new();
                let mut addr_rule = None;
                let mut first_denial: Option<(IpAddr, Denial)> = None;
                for ip in addrs {
                    let ip = crate::net::canonical(ip);
                    match self.policy.check_addr(ip, port, Some(name)) {
                        Ok(r) => {
                            addr_rule = addr_rule.or(r);
                            ok.push(SocketAddr::new(ip, port));
                        }
                        Err(d) => {
                            first_denial.get_or_insert((ip, d));
                        }
                    }
                }
                if ok.is_empty() {
                    return Err(match first_denial {
                        Some((ip, d)) => {
                            rec.address = Some(ip.to_string());
                            denied(d)
                        }
                        None => error(502, "DNS", format!("{name} has no address")),
                    });
                }
                let mut rule = format!("allow {name_rule}");
                if let Some(r) = addr_rule {
                    rule.push_str(&format!(" + allow {r}"));
                }
                Ok((ok, rule))
            }
        }
    }

    /// The first checked address that answers, within the connect timeout.
    async fn connect(
        &self,
        host: &Host,
        port: u16,
        candidates: &[SocketAddr],
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let target = policy::target(&host.text(), port);
        let deadline = Instant::now() + self.limits.connect_timeout;
        let mut last = String::new();
        for &addr in candidates {
            match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, addr));
                }
                Ok(Err(e)) => last = format!("cannot connect to {target} ({}): {e}", addr.ip()),
                Err(_) => {
                    return Err(error(
                        504,
                        "connect timeout",
                        format!(
                            "cannot connect to {target} ({}): no answer within {:?}",
                            addr.ip(),
                            self.limits.connect_timeout
                        ),
                    ))
                }
            }
        }
        Err(error(502, "connect failed", last))
    }
}
