//! What one run's guest can make the proxy hold: connections at once, new
//! connections per second, bytes in all, and per connection the size and
//! time of its request head and how long it may sit idle. Past a limit the
//! proxy stops accepting (the guest's connects wait in the socket's
//! backlog) or refuses, so a flood slows the guest, not the host: memory
//! is at most about `max_connections` x 2 x the copy buffer.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    /// New connections per second (also the burst).
    pub conn_rate: u32,
    /// Bytes both ways, all connections of the run together.
    pub max_bytes: u64,
    pub max_header_bytes: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub dns_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 128,
            conn_rate: 100,
            max_bytes: 8 << 30,
            max_header_bytes: 16 << 10,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
        }
    }
}

/// Each direction of a connection copies through one buffer this big.
pub const COPY_BUFFER: usize = 64 << 10;

/// A token bucket for accepting: `rate` a second, bursts of `rate`.
pub struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(rate: u32) -> Bucket {
        let rate = f64::from(rate.max(1));
        Bucket {
            rate,
            tokens: rate,
            last: Instant::now(),
        }
    }

    /// Waits until a connection may be accepted, and takes its token.
    pub async fn take(&mut self) {
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            let wait = (1.0 - self.tokens) / self.rate;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

/// `500ms`, `10s`, `2m`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("bad duration '{s}': use e.g. 500ms, 10s or 2m");
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| err())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(err()),
    }
    .and_then(|d| if d.is_zero() { Err(err()) } else { Ok(d) })
}

/// `1000`, `64K`, `10M`, `8G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || format!("bad size '{s}': use e.g. 16K, 100M or 8G");
    let (num, shift) = match s.strip_suffix(['K', 'k']) {
        Some(n) => (n, 10),
        None => match s.strip_suffix(['M', 'm']) {
            Some(n) => (n, 20),
            None => match s.strip_suffix(['G', 'g']) {
                Some(n) => (n, 30),
                None => (s, 0),
            },
        },
    };
    let n: u64 = num.parse().map_err(|_| err())?;
    n.checked_mul(1 << shift).filter(|&v| v > 0).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "1h", "ms", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size("16K"), Ok(16384));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("123"), Ok(123));
        for bad in ["", "0", "1T", "K", "99999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_bucket_paces_accepts() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        rt.block_on(async {
            let mut b = Bucket::new(20);
            // 20 at once, then 10 more at 20 a second: about half a second.
            for _ in 0..30 {
                b.take().await;
            }
        });
        let t = start.elapsed();
        assert!(
            t >= Duration::from_millis(450) && t < Duration::from_secs(2),
            "{t:?}"
        );
    }
}
