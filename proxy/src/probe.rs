//! `proxy probe`: a connectivity check through a service address, run from where a client
//! would be (`ip netns exec`, a pod's cgroup). It speaks HTTP/1.0 over TCP or sends UDP
//! datagrams and prints one JSON line per attempt: the reply, the peer the socket reports
//! (getpeername, or the source of a UDP reply) and the error if any.

use serde::Serialize;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// The default time a connect or a read may take before the attempt counts as failed.
pub const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Serialize)]
pub struct Attempt {
    pub ok: bool,
    /// Milliseconds since the probe started.
    pub at_ms: u64,
    /// Milliseconds the attempt took, connect to reply (or to the error).
    pub took_ms: u64,
    /// The body of the HTTP reply, or the UDP reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

impl Attempt {
    fn from_result(r: io::Result<(String, SocketAddr)>, at_ms: u64) -> Self {
        Self::timed(r, None, at_ms, 0)
    }

    /// An attempt that started `at_ms` after the probe and took `took_ms`; `connected` is the
    /// peer a failed attempt had connected to (a read that timed out names its backend).
    fn timed(
        r: io::Result<(String, SocketAddr)>,
        connected: Option<SocketAddr>,
        at_ms: u64,
        took_ms: u64,
    ) -> Self {
        match r {
            Ok((reply, peer)) => Attempt {
                ok: true,
                at_ms,
                took_ms,
                reply: Some(reply),
                peer: Some(peer.to_string()),
                error: None,
                errno: None,
            },
            Err(e) => Attempt {
                ok: false,
                at_ms,
                took_ms,
                reply: None,
                peer: connected.map(|p| p.to_string()),
                errno: e.raw_os_error(),
                error: Some(e.to_string()),
            },
        }
    }
}

/// One HTTP/1.0 GET over a fresh TCP connection: the body, read by its Content-Length
/// (the client closes first, as browsers and curl do). `connected` is set to the peer once
/// the connection is up, so a later failure can name it.
pub fn http_once(
    addr: SocketAddr,
    timeout: Duration,
    connected: &mut Option<SocketAddr>,
) -> io::Result<(String, SocketAddr)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    let peer = s.peer_addr()?;
    *connected = Some(peer);
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: probe\r\n\r\n")?;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(body) = complete_body(&data) {
            return Ok((body, peer));
        }
        match s.read(&mut buf)? {
            0 => break,
            n => data.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&data);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP reply"))?;
    Ok((body, peer))
}

/// The body once headers and Content-Length bytes have arrived.
fn complete_body(data: &[u8]) -> Option<String> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    let body = data.get(end + 4..end + 4 + len)?;
    Some(String::from_utf8_lossy(body).into_owned())
}

/// One datagram from an unconnected socket, and its reply.
pub fn udp_once(
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<(String, SocketAddr)> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(bind)?;
    s.set_read_timeout(Some(timeout))?;
    s.send_to(payload, addr)?;
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf)?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
}

/// A bare TCP connect, closed with a reset (no TIME_WAIT): for connection churn.
pub fn connect_once(addr: SocketAddr, timeout: Duration) -> io::Result<(String, SocketAddr)> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    let peer = s.peer_addr()?;
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
        return Err(io::Error::last_os_error());
    }
    Ok((String::new(), peer))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Udp,
    Connect,
}

/// Holds one TCP connection: prints the peer the socket reports right after connect(),
/// then again for every line read on standard input, until it closes. A long-lived
/// connection's view of its peer, asked while other traffic comes and goes.
pub fn hold(addr: SocketAddr, out: &mut impl Write) -> io::Result<()> {
    let started = std::time::Instant::now();
    let s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    let report = |out: &mut dyn Write| -> io::Result<()> {
        let a = Attempt::from_result(
            s.peer_addr().map(|p| (String::new(), p)),
            started.elapsed().as_millis() as u64,
        );
        writeln!(
            out,
            "{}",
            serde_json::to_string(&a).map_err(io::Error::other)?
        )?;
        out.flush()
    };
    report(out)?;
    for line in io::stdin().lines() {
        line?;
        report(out)?;
    }
    Ok(())
}

/// A connected UDP socket that sends a datagram every 20 ms until standard input closes.
/// Prints a line when the answering backend changes and one per error; after an error (the
/// proxy destroyed the socket: its backend was removed) it connects again.
pub fn udp_connected(addr: SocketAddr, out: &mut impl Write) -> io::Result<()> {
    let stop = stdin_closed();
    let started = std::time::Instant::now();
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let open = || -> io::Result<UdpSocket> {
        let s = UdpSocket::bind(bind)?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        s.connect(addr)?;
        Ok(s)
    };
    let mut sock = open()?;
    let mut last: Option<String> = None;
    let mut buf = [0u8; 2048];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let r = sock
            .send(b"probe")
            .and_then(|_| sock.recv(&mut buf))
            .and_then(|n| {
                Ok((
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                    sock.peer_addr()?,
                ))
            });
        let at_ms = started.elapsed().as_millis() as u64;
        match r {
            Ok((reply, peer)) if last.as_deref() != Some(reply.as_str()) => {
                last = Some(reply.clone());
                let a = Attempt::from_result(Ok((reply, peer)), at_ms);
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&a).map_err(io::Error::other)?
                )?;
            }
            Ok(_) => {}
            Err(e) => {
                let a = Attempt::from_result(Err(e), at_ms);
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&a).map_err(io::Error::other)?
                )?;
                last = None;
                sock = open()?;
            }
        }
        out.flush()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A flag set once standard input reaches EOF.
fn stdin_closed() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = io::stdin().read_to_end(&mut sink);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    stop
}

/// Runs `count` attempts (or, with `until_stdin_closes`, attempts until standard input
/// reaches EOF), printing each as JSON (only failures when `failures_only`, or in the
/// loop); returns (ok, failed).
/// What [`run`] counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub ok: u64,
    pub failed: u64,
    /// The longest attempt that succeeded, in milliseconds.
    pub slowest_ok_ms: u64,
    /// Attempts that succeeded but took a second or more.
    pub slow: u64,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ok, {} failed, {} took 1 s or more, slowest {} ms",
            self.ok, self.failed, self.slow, self.slowest_ok_ms
        )
    }
}

pub fn run(
    proto: Protocol,
    addr: SocketAddr,
    count: u64,
    timeout: Duration,
    until_stdin_closes: bool,
    failures_only: bool,
    out: &mut impl Write,
) -> io::Result<Tally> {
    let stop = if until_stdin_closes {
        stdin_closed()
    } else {
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))
    };
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    let mut i = 0;
    loop {
        if until_stdin_closes {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
        } else if i >= count {
            break;
        }
        i += 1;
        let at = started.elapsed();
        let mut connected = None;
        let r = match proto {
            Protocol::Http => http_once(addr, timeout, &mut connected),
            Protocol::Udp => udp_once(addr, b"probe", timeout),
            Protocol::Connect => connect_once(addr, timeout),
        };
        let took_ms = (started.elapsed() - at).as_millis() as u64;
        let attempt = Attempt::timed(r, connected, at.as_millis() as u64, took_ms);
        if attempt.ok {
            tally.ok += 1;
            tally.slowest_ok_ms = tally.slowest_ok_ms.max(took_ms);
            if took_ms >= 1000 {
                tally.slow += 1;
            }
        } else {
            tally.failed += 1;
        }
        // In loop mode only failures are worth a line each.
        if !(until_stdin_closes || failures_only) || !attempt.ok {
            writeln!(
                out,
                "{}",
                serde_json::to_string(&attempt).map_err(io::Error::other)?
            )?;
        }
    }
    Ok(tally)
}
