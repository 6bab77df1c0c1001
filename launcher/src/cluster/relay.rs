//! A TCP relay: the local registry listens on loopback only (it has no authentication), and
//! nodes in their own network namespaces reach it at the host bridge's address through the
//! relay, which keeps it off every other interface of the machine. The relay copies bytes.
//! A forward may name several targets (the API servers of a cluster with several control
//! planes, for the host's kubectl): a connection goes to the target that took the last one,
//! or to the next one that accepts within [`CONNECT_TIMEOUT`] when that one does not.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a connection to one target may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// `listen` forwarded to one of `to` (tried in turn from the last that answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub listen: SocketAddr,
    pub to: Vec<SocketAddr>,
}

impl Forward {
    pub fn new(listen: SocketAddr, to: SocketAddr) -> Forward {
        Forward {
            listen,
            to: vec![to],
        }
    }
}

impl std::str::FromStr for Forward {
    type Err = String;

    /// `LISTEN=TO[,TO...]`, e.g. `10.249.0.1:6443=127.0.0.1:6443`.
    fn from_str(s: &str) -> Result<Forward, String> {
        let (l, t) = s
            .split_once('=')
            .ok_or_else(|| format!("{s}: expected LISTEN=TO[,TO...]"))?;
        Ok(Forward {
            listen: l.parse().map_err(|e| format!("{l}: {e}"))?,
            to: t
                .split(',')
                .map(|t| t.parse().map_err(|e| format!("{t}: {e}")))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl std::fmt::Display for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to: Vec<String> = self.to.iter().map(ToString::to_string).collect();
        write!(f, "{}={}", self.listen, to.join(","))
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
            let (stop, to) = (stop.clone(), f.to.clone());
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

fn accept_loop(listener: TcpListener, to: Vec<SocketAddr>, stop: &AtomicBool) {
    let targets = Arc::new((to, AtomicUsize::new(0)));
    for inbound in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(inbound) = inbound else { continue };
        let targets = targets.clone();
        std::thread::spawn(move || {
            super::process::raise_thread_priority();
            // No target answering closes the client's connection: it retries.
            if let Some(outbound) = connect(&targets.0, &targets.1) {
                pipe(inbound, outbound);
            }
        });
    }
}

/// A connection to the first of `to` that accepts, from `current` on (which then names it).
fn connect(to: &[SocketAddr], current: &AtomicUsize) -> Option<TcpStream> {
    let start = current.load(Ordering::Relaxed);
    (0..to.len()).find_map(|k| {
        let i = (start + k) % to.len();
        let s = match to.len() {
            1 => TcpStream::connect(to[i]),
            _ => TcpStream::connect_timeout(&to[i], CONNECT_TIMEOUT),
        };
        let s = s.ok()?;
        current.store(i, Ordering::Relaxed);
        Some(s)
    })
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
        let relay = Relay::start(&[Forward::new("127.0.0.1:0".parse().unwrap(), to)]).unwrap();
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
        let f: Forward = "10.0.0.1:6443=10.0.0.2:6443,10.0.0.3:6443".parse().unwrap();
        assert_eq!(f.to.len(), 2);
        assert_eq!(f.to_string(), "10.0.0.1:6443=10.0.0.2:6443,10.0.0.3:6443");
    }

    #[test]
    fn fails_over_to_the_next_target_and_stays_there() {
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let current = AtomicUsize::new(0);
        let s = connect(&[gone, live.local_addr().unwrap()], &current).expect("the live one");
        assert_eq!(s.peer_addr().unwrap(), live.local_addr().unwrap());
        assert_eq!(current.load(Ordering::Relaxed), 1);
        assert!(connect(&[gone], &AtomicUsize::new(0)).is_none());
    }
}
