//! `proxy probe`: a connectivity check through a service address, run from where a client
//! would be (`ip netns exec`, a pod's cgroup). It speaks HTTP/1.0 over TCP or sends UDP
//! datagrams and prints one JSON line per attempt: the reply, the peer the socket reports
//! (getpeername, or the source of a UDP reply) and the error if any.

use serde::Serialize;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Serialize)]
pub struct Attempt {
    pub ok: bool,
    /// Milliseconds since the probe started.
    pub at_ms: u64,
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
        match r {
            Ok((reply, peer)) => Attempt {
                ok: true,
                at_ms,
                reply: Some(reply),
                peer: Some(peer.to_string()),
                error: None,
                errno: None,
            },
            Err(e) => Attempt {
                ok: false,
                at_ms,
                reply: None,
                peer: None,
                errno: e.raw_os_error(),
                error: Some(e.to_string()),
            },
        }
    }
}

/// One HTTP/1.0 GET over a fresh TCP connection: the body, read by its Content-Length
/// (the client closes first, as browsers and curl do).
pub fn http_once(addr: SocketAddr) -> io::Result<(String, SocketAddr)> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    let peer = s.peer_addr()?;
    s.set_read_timeout(Some(TIMEOUT))?;
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
pub fn udp_once(addr: SocketAddr, payload: &[u8]) -> io::Result<(String, SocketAddr)> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(bind)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.send_to(payload, addr)?;
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf)?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Udp,
}

/// Runs `count` attempts (or, with `until_stdin_closes`, attempts until standard input
/// reaches EOF), printing each as JSON; returns (ok, failed).
pub fn run(
    proto: Protocol,
    addr: SocketAddr,
    count: u64,
    until_stdin_closes: bool,
    out: &mut impl Write,
) -> io::Result<(u64, u64)> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if until_stdin_closes {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = io::stdin().read_to_end(&mut sink);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let started = std::time::Instant::now();
    let (mut ok, mut failed) = (0, 0);
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
        let attempt = Attempt::from_result(
            match proto {
                Protocol::Http => http_once(addr),
                Protocol::Udp => udp_once(addr, b"probe"),
            },
            started.elapsed().as_millis() as u64,
        );
        if attempt.ok {
            ok += 1;
        } else {
            failed += 1;
        }
        // In loop mode only failures are worth a line each.
        if !until_stdin_closes || !attempt.ok {
            writeln!(
                out,
                "{}",
                serde_json::to_string(&attempt).map_err(io::Error::other)?
            )?;
        }
    }
    Ok((ok, failed))
}
