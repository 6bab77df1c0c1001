//! A TCP relay: the local registry listens on loopback only (it has no authentication), and
//! nodes in their own network namespaces reach it at the host bridge's address through the
//! relay, which keeps it off every other interface of the machine. The relay copies bytes.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `listen` forwarded to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward {
    pub listen: SocketAddr,
    pub to: SocketAddr,
}

impl std::str::FromStr for Forward {
    type Err = String;

    /// `LISTEN=TO`, e.g. `10.249.0.1:6443=127.0.0.1:6443`.
    fn from_str(s: &str) -> Result<Forward, String> {
        let (l, t) = s
            .split_once('=')
            .ok_or_else(|| format!("{s}: expected LISTEN=TO"))?;
        Ok(Forward {
            listen: l.parse().map_err(|e| format!("{l}: {e}"))?,
            to: t.parse().map_err(|e| format!("{t}: {e}"))?,
        })
    }
}

impl std::fmt::Display for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.listen, self.to)
    }
}

/// Relays running on threads of this process; they stop on Drop.
pub struct Relay {
    /// The bound address of each forward (port 0 resolved).
    pub bound: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    /// The listening sockets, shut down on Drop to wake their accept().
    listeners: Vec<TcpListener>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    pub fn start(forwards: &[Forward]) -> io::Result<Relay> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut bound = Vec::new();
        let mut threads = Vec::new();
        let mut listeners = Vec::new();
        for f in forwards {
            let listener = TcpListener::bind(f.listen)?;
            bound.push(listener.local_addr()?);
            listeners.push(listener.try_clone()?);
            let (stop, to) = (stop.clone(), f.to);
            threads.push(std::thread::spawn(move || accept_loop(listener, to, &stop)));
        }
        Ok(Relay {
            bound,
            stop,
            listeners,
            threads,
        })
    }

    /// Runs until the process is killed (the relay as a process of its own).
    pub fn run_forever(forwards: &[Forward]) -> io::Result<()> {
        let mut relay = Relay::start(forwards)?;
        for t in std::mem::take(&mut relay.threads) {
            let _ = t.join();
        }
        Ok(())
    }
}

fn accept_loop(listener: TcpListener, to: SocketAddr, stop: &AtomicBool) {
    for inbound in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(inbound) = inbound else { continue };
        std::thread::spawn(move || {
            super::process::raise_thread_priority();
            // A refused or unreachable target closes the client's connection: it retries.
            if let Ok(outbound) = TcpStream::connect(to) {
                pipe(inbound, outbound);
            }
        });
    }
}

/// Copies both ways until each side has closed its half.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || copy_half(a2, b2));
    copy_half(b, a);
    let _ = up.join();
}

fn copy_half(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Shutting a listening socket down makes a blocked accept() return (on Linux), so
        // its thread sees the flag, even when the address it listens on is already gone
        // (the bridge removed first).
        for l in &self.listeners {
            // SAFETY: shutdown on a socket fd this struct owns.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn forwards_both_ways_and_stops() {
        let target = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = target.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut c, _) = target.accept().unwrap();
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).unwrap();
            c.write_all(&buf).unwrap();
        });
        let relay = Relay::start(&[Forward {
            listen: "127.0.0.1:0".parse().unwrap(),
            to,
        }])
        .unwrap();
        let mut c = TcpStream::connect(relay.bound[0]).unwrap();
        c.write_all(b"hello").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = String::new();
        c.read_to_string(&mut back).unwrap();
        assert_eq!(back, "hello");
        echo.join().unwrap();
        let addr = relay.bound[0];
        drop(relay);
        assert!(TcpStream::connect(addr).is_err(), "listener closed");
    }

    #[test]
    fn parses_forwards() {
        let f: Forward = "10.0.0.1:6443=127.0.0.1:7000".parse().unwrap();
        assert_eq!(f.to_string(), "10.0.0.1:6443=127.0.0.1:7000");
        assert!("10.0.0.1:6443".parse::<Forward>().is_err());
    }
}
