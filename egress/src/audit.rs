//! What the proxy did, for the caller: one JSON line per request in the
//! log, and a summary file rewritten after each request (so it is current
//! even if the proxy is killed, which is how a run ends), from which mvm
//! prints `mvm: network: N requests denied: host1, host2 (see --net-log)`.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// One request, as logged.
#[derive(Debug, Default, Serialize)]
pub struct Record {
    pub time: String,
    pub run_id: String,
    /// The connection's number in this run, from 1.
    pub conn: u64,
    /// `CONNECT`, an HTTP method, or null when no request head was read.
    pub method: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// The address connected to (or refused), null if none.
    pub address: Option<String>,
    /// `allowed`, `denied` (policy or limits) or `error` (bad request,
    /// DNS or upstream failure).
    pub decision: &'static str,
    /// The rule that decided: `allow PATTERN`, `deny PATTERN`, `no allow
    /// rule`, `loopback address`, ...; for errors what failed.
    pub rule: String,
    /// The status the proxy answered with (200 for an established tunnel;
    /// null for a forwarded request: its status is the server's, not parsed).
    pub status: Option<u16>,
    /// The one-line reason sent to the client, for refusals and errors.
    pub reason: Option<String>,
    /// Plain HTTP only: the path, without the query string (which may
    /// carry secrets).
    pub path: Option<String>,
    /// Guest to server, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// A connection (its CONNECT line) or request (its own line) to a
    /// host a secret is bound to, relayed by the proxy itself.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub intercepted: bool,
    /// Which secret went into which header (`TOKEN in authorization`),
    /// never a value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub run_id: String,
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    /// Distinct `host:port` targets refused by policy, first ones first.
    pub denied_hosts: Vec<String>,
    /// How many more distinct ones there were beyond the list.
    pub denied_hosts_more: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Log lines that could not be written (disk full, ...).
    pub log_errors: u64,
    /// The proxy's own peak resident memory so far (getrusage's
    /// ru_maxrss), in KiB: what a flooding guest costs the host.
    pub peak_rss_kib: u64,
}

/// Distinct denied targets listed in the summary.
const MAX_DENIED_HOSTS: usize = 50;

pub struct Audit {
    run_id: String,
    inner: Mutex<Inner>,
}

struct Inner {
    log: File,
    summary_file: Option<File>,
    summary: Summary,
}

impl Audit {
    pub fn new(run_id: String, log: File, summary_file: Option<File>) -> Audit {
        let audit = Audit {
            inner: Mutex::new(Inner {
                log,
                summary_file,
                summary: Summary {
                    run_id: run_id.clone(),
                    ..Default::default()
                },
            }),
            run_id,
        };
        // An empty run has a summary too.
        if let Ok(mut inner) = audit.inner.lock() {
            inner.write_summary();
        }
        audit
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn record(&self, rec: &Record) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let mut line = serde_json::to_vec(rec).unwrap_or_default();
        line.push(b'\n');
        // One write per line: with O_APPEND lines never interleave.
        if inner.log.write_all(&line).is_err() {
            inner.summary.log_errors += 1;
        }
        let s = &mut inner.summary;
        s.requests += 1;
        s.bytes_up += rec.bytes_up;
        s.bytes_down += rec.bytes_down;
        match rec.decision {
            "allowed" => s.allowed += 1,
            "denied" => {
                s.denied += 1;
                if let (Some(h), Some(p)) = (&rec.host, rec.port) {
                    let t = crate::policy::target(h, p);
                    if !s.denied_hosts.contains(&t) {
                        if s.denied_hosts.len() < MAX_DENIED_HOSTS {
                            s.denied_hosts.push(t);
                        } else {
                            s.denied_hosts_more += 1;
                        }
                    }
                }
            }
            _ => s.errors += 1,
        }
        inner.write_summary();
    }

    pub fn summary(&self) -> String {
        self.inner
            .lock()
            .map(|i| serde_json::to_string(&i.summary).unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Inner {
    /// In place: the new text first, then the length. The text never gets
    /// shorter (counts and the list only grow), so a kill between the two
    /// leaves a complete summary.
    fn write_summary(&mut self) {
        let Some(f) = &self.summary_file else { return };
        self.summary.peak_rss_kib = peak_rss_kib();
        let mut text = serde_json::to_vec(&self.summary).unwrap_or_default();
        text.push(b'\n');
        let ok = f.write_all_at(&text, 0).is_ok() && f.set_len(text.len() as u64).is_ok();
        if !ok {
            self.summary.log_errors += 1;
        }
    }
}

/// This process's peak resident set size in KiB (0 if unknown).
fn peak_rss_kib() -> u64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer to that struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    u64::try_from(usage.ru_maxrss).unwrap_or(0)
}

/// RFC 3339 in UTC with milliseconds, e.g. `2025-01-31T12:00:00.123Z`.
pub fn now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_time(d.as_secs() as i64, d.subsec_millis())
}

fn format_time(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(format_time(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_time(1_735_689_599, 999), "2024-12-31T23:59:59.999Z");
        assert_eq!(format_time(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    }
}
