//! A tunnel or a forwarded request once its head is through: bytes copied
//! both ways, counted against the run's budget, the guest's side searched
//! for secrets' placeholders, until both ends close, it goes idle, or the
//! run ends.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::{Duration, Instant};

use crate::limits::COPY_BUFFER;
use crate::proxy::Proxy;

/// How a copy stopped before both ends closed.
pub(crate) enum End {
    Io,
    Idle,
    Budget,
    /// `Proxy::end`: the run is over.
    RunOver,
    /// A secret's placeholder (this name) was about to go where it is not
    /// bound.
    Leak(String),
}

impl Proxy {
    /// Copies both ways until done: a tunnel until both sides closed, a
    /// forwarded request until the server's side closed (one request per
    /// connection); or until idle too long, or the run's bytes are spent.
    pub(crate) async fn pump(
        &self,
        client: &mut UnixStream,
        upstream: &mut TcpStream,
        forward: bool,
    ) -> (u64, u64, Option<End>) {
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let base = Instant::now();
        let last = AtomicU64::new(0);
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = upstream.split();
        // What the guest sends is searched for placeholders (a plain
        // tunnel or request is never where a secret may go).
        let scan = self.intercept.as_deref().map(|i| &i.secrets);
        let to_server = copy(&mut cr, &mut uw, &up, &last, base, self, scan);
        let to_client = copy(&mut ur, &mut cw, &down, &last, base, self, None);
        let work = async {
            if forward {
                tokio::pin!(to_server);
                tokio::pin!(to_client);
                let mut client_done = false;
                loop {
                    tokio::select! {
                        r = &mut to_client => return r,
                        r = &mut to_server, if !client_done => {
                            r?;
                            client_done = true;
                        }
                    }
                }
            } else {
                tokio::try_join!(to_server, to_client).map(|_| ())
            }
        };
        let idle = self.limits.idle_timeout;
        let watchdog = async {
            loop {
                let quiet = base
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                if quiet >= idle {
                    return End::Idle;
                }
                tokio::time::sleep(idle - quiet).await;
            }
        };
        let end = tokio::select! {
            r = work => r.err(),
            e = watchdog => Some(e),
            () = self.ended() => Some(End::RunOver),
        };
        (up.into_inner(), down.into_inner(), end)
    }
}

async fn copy<R, W>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
    last: &AtomicU64,
    base: Instant,
    proxy: &Proxy,
    scan: Option<&crate::secrets::Secrets>,
) -> Result<(), End>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut tail = Vec::new();
    loop {
        let n = r.read(&mut buf).await.map_err(|_| End::Io)?;
        if n == 0 {
            // Half-close: the other side sees the end, and may still answer.
            let _ = w.shutdown().await;
            return Ok(());
        }
        if let Some(secrets) = scan.filter(|s| !s.is_empty()) {
            // With the previous read's tail: a placeholder split across
            // two reads is seen too.
            tail.extend_from_slice(&buf[..n]);
            if let Some(name) = secrets.leaked_in(&tail) {
                return Err(End::Leak(name.to_string()));
            }
            let keep = secrets.longest().saturating_sub(1).min(tail.len());
            tail.drain(..tail.len() - keep);
        }
        proxy.spend(n as u64).map_err(|_| End::Budget)?;
        w.write_all(&buf[..n]).await.map_err(|_| End::Io)?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        last.store(base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}
