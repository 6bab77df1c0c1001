//! Network namespaces for tests: create one with a unique name (loopback up), run `ip`
//! inside it, start processes in it, create sockets in it from a thread, connect it to
//! another namespace (or the host) with a veth pair, and serve HTTP or UDP inside it.
//! Everything is removed on Drop, also when the test fails.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique across concurrently running test processes: `<prefix><pid>x<n>`.
/// Interface names allow 15 bytes, so keep `prefix` to 3 characters where that matters.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a command, panicking with its stderr if it fails (fixtures have no way to go on).
pub fn must(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace (`ip netns add`), deleted on Drop unless it was made with
/// [`NetNs::create_kept`] or opened with [`NetNs::open`].
pub struct NetNs {
    name: String,
    file: File,
    kept: bool,
}

impl NetNs {
    /// A new namespace named `<prefix><unique>` with loopback up.
    pub fn new(prefix: &str) -> NetNs {
        let name = unique_name(prefix);
        must(Command::new("ip").args(["netns", "add", &name]));
        let file = File::open(format!("/run/netns/{name}"))
            .unwrap_or_else(|e| panic!("opening /run/netns/{name}: {e}"));
        let ns = NetNs {
            name,
            file,
            kept: false,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// A namespace named exactly `name` (loopback up) that outlives this handle: a cluster's
    /// node stays when the command that made it exits. Fails if it exists already.
    pub fn create_kept(name: &str) -> std::io::Result<NetNs> {
        let out = Command::new("ip").args(["netns", "add", name]).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let ns = NetNs::open(name)?;
        skiff_netlink::Netlink::open_in(&ns.file)?
            .set_up("lo")
            .map_err(|e| std::io::Error::other(format!("{name}: {e}")))?;
        Ok(ns)
    }

    /// An existing namespace, left in place on Drop.
    pub fn open(name: &str) -> std::io::Result<NetNs> {
        let file = File::open(format!("/run/netns/{name}"))?;
        Ok(NetNs {
            name: name.to_string(),
            file,
            kept: true,
        })
    }

    /// Deletes the namespace `name` if it exists (what [`NetNs::create_kept`] made).
    pub fn delete(name: &str) {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's file (for setns, or netlink requests that name a namespace).
    pub fn fd(&self) -> &File {
        &self.file
    }

    /// `ip -n <ns> <args>`; panics on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        must(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs inside the namespace. Unlike `ip netns exec` it enters only the
    /// network namespace (no /sys remount), so cgroup paths stay visible.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.enter_before_exec(&mut cmd);
        cmd
    }

    /// Makes an existing command enter the namespace before it executes.
    /// The command owns a duplicate of the namespace's fd, so it may outlive this handle.
    pub fn enter_before_exec(&self, cmd: &mut Command) {
        let owned = self
            .file
            .try_clone()
            .unwrap_or_else(|e| panic!("duplicating the fd of netns {}: {e}", self.name));
        // SAFETY: setns is async-signal-safe; the closure owns the fd, open until exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(owned.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Runs `f` on a new thread inside the namespace and returns its result. Sockets made
    /// there belong to the namespace and can be used from any thread afterwards.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.file.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: changes only this (short-lived) thread's network namespace.
                let r = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("thread in netns panicked")
        })
    }
}

impl NetNs {
    /// Turns transmit checksum offload off on `dev` (in this namespace): its packets then
    /// carry complete checksums, as packets from a wire do (what XDP programs see on a
    /// physical NIC; a veth otherwise passes the sender's partial checksums along).
    pub fn full_checksums(&self, dev: &str) {
        let dev = dev.to_string();
        self.run(move || {
            #[repr(C)]
            struct EthtoolValue {
                cmd: u32,
                data: u32,
            }
            const ETHTOOL_STXCSUM: u32 = 0x17;
            let mut v = EthtoolValue {
                cmd: ETHTOOL_STXCSUM,
                data: 0,
            };
            // SAFETY: a zeroed ifreq is valid; the name fits (interface names < 16 bytes).
            let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
                *d = s as libc::c_char;
            }
            ifr.ifr_ifru.ifru_data = (&mut v as *mut EthtoolValue).cast();
            // SAFETY: a datagram socket for the ioctl, closed below.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            assert!(fd >= 0);
            // SAFETY: SIOCETHTOOL with a valid ifreq pointing at a valid ethtool_value.
            let r = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) };
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            assert_eq!(r, 0, "ETHTOOL_STXCSUM: {}", std::io::Error::last_os_error());
        });
    }

    /// A real HTTP/1.0 server on `addr` inside the namespace, answering every request with
    /// `body` (with Content-Length; `{peer}` in it becomes the client's address as the
    /// server sees it), on `threads` accepting threads. It lets the client
    /// close first, as curl and [`http_get`] do (a client reading to end of stream waits
    /// for the server's 2 s idle timeout). Stops on Drop.
    pub fn http_server(&self, addr: SocketAddr, body: &str, threads: usize) -> Server {
        let listener = self
            .run(|| TcpListener::bind(addr))
            .expect("binding server");
        // A deep accept queue: a client outrunning a briefly descheduled server must not
        // see a dropped SYN (a one-second retransmit). listen() again only resizes it.
        // SAFETY: a listening socket we own.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        let listener = Arc::new(listener);
        let served = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..threads.max(1))
            .map(|_| {
                let (l, n, st, body) = (
                    listener.clone(),
                    served.clone(),
                    stop.clone(),
                    body.to_string(),
                );
                std::thread::spawn(move || {
                    while let Ok((conn, peer)) = l.accept() {
                        if st.load(Ordering::Relaxed) {
                            break;
                        }
                        answer_http(conn, &body.replace("{peer}", &peer.ip().to_string()));
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Server {
            addr,
            served,
            stop,
            threads: handles,
            netns: self.name.clone(),
            tcp: true,
        }
    }

    /// A UDP server on `addr` inside the namespace answering every datagram with `body`.
    pub fn udp_server(&self, addr: SocketAddr, body: &str) -> Server {
        let sock = self.run(|| UdpSocket::bind(addr)).expect("binding server");
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("socket option");
        let served = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, st, body) = (served.clone(), stop.clone(), body.to_string());
        let handle = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !st.load(Ordering::Relaxed) {
                if let Ok((_, from)) = sock.recv_from(&mut buf) {
                    n.fetch_add(1, Ordering::Relaxed);
                    let _ = sock.send_to(body.as_bytes(), from);
                }
            }
        });
        Server {
            addr,
            served,
            stop,
            threads: vec![handle],
            netns: self.name.clone(),
            tcp: false,
        }
    }
}

/// Reads a request head (or until the client goes away) and answers with `body`.
fn answer_http(mut conn: TcpStream, body: &str) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    if write!(
        conn,
        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .is_err()
    {
        return;
    }
    // The client closes first (it reads Content-Length bytes): TIME_WAIT then sits with
    // the client, where loopback reuses it, not with the server, where thousands of them
    // would stall new connections that happen to reuse a port.
    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
}

/// An HTTP/1.0 GET to `addr`; returns the body, read by its Content-Length, and closes
/// first.
pub fn http_get(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    http_get_path(addr, "/", timeout)
}

/// [`http_get`] of `path`.
pub fn http_get_path(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: skiff\r\n\r\n")?;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let len: Option<usize> = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok());
            if let Some(len) = len {
                if data.len() >= end + 4 + len {
                    return Ok(String::from_utf8_lossy(&data[end + 4..end + 4 + len]).into_owned());
                }
            }
        }
        match s.read(&mut buf)? {
            0 => break,
            n => data.extend_from_slice(&buf[..n]),
        }
    }
    // No Content-Length: the body runs to the end of the stream.
    let text = String::from_utf8_lossy(&data);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP reply"))
}

/// A server started by [`NetNs::http_server`] or [`NetNs::udp_server`].
pub struct Server {
    pub addr: SocketAddr,
    served: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    netns: String,
    tcp: bool,
}

impl Server {
    /// Connections (HTTP) or datagrams (UDP) served so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if self.tcp {
            // One connection per thread from inside the namespace unblocks accept().
            if let Ok(f) = File::open(format!("/run/netns/{}", self.netns)) {
                let (fd, addr, n) = (f.as_raw_fd(), self.addr, self.threads.len());
                std::thread::scope(|s| {
                    s.spawn(move || {
                        // SAFETY: changes only this short-lived thread's namespace.
                        if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 {
                            for _ in 0..n {
                                let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
                            }
                        }
                    });
                });
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A veth pair: one end in the host namespace (or in `host_ns`), the other in `peer_ns`.
/// Deleting one end deletes both, on Drop.
pub struct Veth {
    pub host: String,
    pub peer: String,
    host_ns: Option<String>,
}

impl Veth {
    /// Creates `<host>` (in `host_ns`, or the test's namespace if `None`) paired with
    /// `<peer>` inside `peer_ns`; both ends up.
    pub fn new(host_ns: Option<&NetNs>, peer_ns: &NetNs) -> Veth {
        let host = unique_name("vh");
        let peer = unique_name("vp");
        let mut add = Command::new("ip");
        if let Some(ns) = host_ns {
            add.arg("-n").arg(ns.name());
        }
        add.args([
            "link", "add", &host, "type", "veth", "peer", "name", &peer, "netns",
        ])
        .arg(peer_ns.name());
        must(&mut add);
        let veth = Veth {
            host,
            peer,
            host_ns: host_ns.map(|n| n.name().to_string()),
        };
        let mut up = Command::new("ip");
        if let Some(ns) = &veth.host_ns {
            up.arg("-n").arg(ns);
        }
        must(up.args(["link", "set", &veth.host, "up"]));
        peer_ns.ip(&["link", "set", &veth.peer, "up"]);
        veth
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let mut del = Command::new("ip");
        if let Some(ns) = &self.host_ns {
            del.arg("-n").arg(ns);
        }
        let _ = del.args(["link", "del", &self.host]).output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_and_processes_live_in_the_namespace() {
        let ns = NetNs::new("nst");
        ns.ip(&["addr", "add", "10.250.255.1/32", "dev", "lo"]);
        // A listener made inside the namespace...
        let l = ns.run(|| std::net::TcpListener::bind("10.250.255.1:0").unwrap());
        let port = l.local_addr().unwrap().port();
        // ...is reachable from a process in it, and not from the host.
        let out = ns
            .command("ip")
            .args(["-o", "addr", "show", "lo"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("10.250.255.1"));
        assert!(ns
            .run(|| std::net::TcpStream::connect(("10.250.255.1", port)))
            .is_ok());
        let server = ns.http_server("10.250.255.1:8080".parse().unwrap(), "hello", 2);
        let body = ns.run(|| http_get(server.addr, Duration::from_secs(5)).unwrap());
        assert_eq!(body, "hello");
        // Counted once the client has closed.
        crate::wait_until(
            "the request is counted",
            Duration::from_secs(5),
            || match server.served() {
                1 => Ok(()),
                n => Err(n),
            },
        );
        drop(server);
        let name = ns.name().to_string();
        drop(ns);
        assert!(!std::path::Path::new(&format!("/run/netns/{name}")).exists());
    }

    #[test]
    fn veth_connects_two_namespaces_and_goes_away() {
        let a = NetNs::new("nsa");
        let b = NetNs::new("nsb");
        let v = Veth::new(Some(&a), &b);
        a.ip(&["addr", "add", "10.250.254.1/30", "dev", &v.host]);
        b.ip(&["addr", "add", "10.250.254.2/30", "dev", &v.peer]);
        let l = b.run(|| std::net::TcpListener::bind("10.250.254.2:0").unwrap());
        let port = l.local_addr().unwrap().port();
        assert!(a
            .run(|| std::net::TcpStream::connect(("10.250.254.2", port)))
            .is_ok());
        let host = v.host.clone();
        drop(v);
        let out = Command::new("ip")
            .args(["-n", a.name(), "link", "show", &host])
            .output()
            .unwrap();
        assert!(!out.status.success());
    }
}
