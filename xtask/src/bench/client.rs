//! The benchmark's client, run as `xtask bench-client ...` inside the bench's network
//! namespace and cgroup (so the proxy's hooks or rules apply to it). Prints one JSON line.

use anyhow::{bail, Result};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Subcommand)]
pub enum ClientCmd {
    /// Serves measurement chunks: for each line "go" on stdin runs `chunk` connects (or
    /// HTTP GETs with `--http`) and prints their latencies as one JSON line.
    /// Two such clients, driven in turn, see the same machine load. Several addresses
    /// (comma-separated) are taken in turn, one per operation.
    Chunks {
        #[arg(value_delimiter = ',', required = true)]
        addrs: Vec<SocketAddr>,
        chunk: usize,
        #[arg(long)]
        http: bool,
    },
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
    skiff_launcher::netns::http_get(addr, TIMEOUT)
}

pub fn run(cmd: ClientCmd) -> Result<()> {
    match cmd {
        ClientCmd::Chunks { addrs, chunk, http } => {
            let mut next = addrs.iter().cycle();
            let mut line = String::new();
            let stdin = std::io::stdin();
            while {
                line.clear();
                stdin.read_line(&mut line)? > 0
            } {
                let mut lat = Vec::with_capacity(chunk);
                for _ in 0..chunk {
                    let addr = *next.next().expect("at least one address");
                    let t = Instant::now();
                    if http {
                        if get(addr)?.is_empty() {
                            bail!("empty reply from {addr}");
                        }
                    } else {
                        drop(connect(addr)?);
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                println!("{}", serde_json::json!({ "lat_us": lat }));
                std::io::stdout().flush()?;
            }
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
