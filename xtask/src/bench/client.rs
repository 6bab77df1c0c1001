//! The benchmark's client, run as `xtask bench-client ...` inside the bench's network
//! namespace and cgroup (so the proxy's hooks or rules apply to it). Prints one JSON line.

use anyhow::{bail, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Subcommand)]
pub enum ClientCmd {
    /// `count` sequential connect()+close: rate and connect() latency percentiles.
    Connect { addr: SocketAddr, count: usize },
    /// `count` sequential HTTP/1.0 GETs over fresh connections.
    Http { addr: SocketAddr, count: usize },
    /// GET until the body is `expect`; prints the wall-clock time of the first such reply.
    Switch {
        addr: SocketAddr,
        expect: String,
        timeout_ms: u64,
    },
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    // Close with RST: no TIME_WAIT piling up over hundreds of thousands of connections.
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

fn get(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    Ok(resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn run(cmd: ClientCmd) -> Result<()> {
    match cmd {
        ClientCmd::Connect { addr, count } | ClientCmd::Http { addr, count } => {
            let http = matches!(cmd, ClientCmd::Http { .. });
            let mut lat = Vec::with_capacity(count);
            let start = Instant::now();
            for _ in 0..count {
                let t = Instant::now();
                if http {
                    let body = get(addr)?;
                    if body.is_empty() {
                        bail!("empty reply from {addr}");
                    }
                } else {
                    drop(connect(addr)?);
                }
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let secs = start.elapsed().as_secs_f64();
            lat.sort_by(f64::total_cmp);
            println!(
                "{}",
                serde_json::json!({
                    "count": count,
                    "rate": count as f64 / secs,
                    "p50_us": percentile(&lat, 0.5),
                    "p99_us": percentile(&lat, 0.99),
                    "max_us": lat.last().copied().unwrap_or(0.0),
                    "over_100ms": lat.iter().filter(|l| **l > 100_000.0).count(),
                })
            );
        }
        ClientCmd::Switch {
            addr,
            expect,
            timeout_ms,
        } => {
            let deadline = Instant::now() + Duration::from_millis(timeout_ms);
            let mut ready = false;
            loop {
                let body = get(addr);
                if !ready && body.as_ref().is_ok_and(|b| *b != expect) {
                    // Polling the old state: the caller may now make the change.
                    println!("{}", serde_json::json!({ "ready": true }));
                    std::io::stdout().flush()?;
                    ready = true;
                }
                if ready && body.is_ok_and(|b| b == expect) {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
                    println!("{}", serde_json::json!({ "at_ns": now as u64 }));
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("{addr} never answered {expect}");
                }
            }
        }
    }
    Ok(())
}
