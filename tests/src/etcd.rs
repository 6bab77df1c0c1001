//! Real etcd for tests (Debian's etcd-server): one member or a cluster of several on loopback
//! ports, each a process with its own data directory, healthy once its /health says so.
//! Members can be killed (SIGKILL), restarted and asked who leads. [`shared`] is one member
//! per test binary, started once: tests keep apart by a key prefix of their own
//! ([`unique_prefix`]), which keeps the etcd start-up out of every test's time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::wait::{try_wait_until, wait_until};

/// How long a member may take to report healthy on a loaded machine.
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// One member's addresses and process.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    data_dir: PathBuf,
    /// A cgroup v2 directory the member runs in (its sockets are matched by it: a test
    /// cuts its peer traffic with `iptables -m cgroup`).
    cgroup: Option<PathBuf>,
    child: Option<Child>,
}

impl Member {
    /// `127.0.0.1:<client port>`
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<peer port>`
    pub fn peer_url(&self) -> String {
        skiff_launcher::etcd::loopback_url(self.peer_port)
    }

    /// Where the member keeps its data.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// A cluster of etcd members on loopback, killed on Drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    dir: PathBuf,
    /// Elections in a tenth of etcd's default time (the default here: tests kill leaders).
    fast_elections: bool,
    /// Removed on Drop when the cluster made it.
    _tmp: Option<TempDir>,
}

/// A directory removed on Drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes what clusters of test processes that are gone left (a shared member's directory
/// outlives its process: statics are never dropped).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("skiff-etcd-"))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub use skiff_launcher::etcd::{free_port, health, revision};
use skiff_launcher::etcd::{is_leader, member_command, MemberSpec};

impl EtcdCluster {
    /// Starts `n` members under a fresh temporary directory and waits until all are healthy.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_timed(n, true)
    }

    /// As [`EtcdCluster::start`], with etcd's default election timing (heartbeat 100 ms,
    /// election 1 s), as a production cluster runs: what benchmarks measure.
    pub fn start_with_default_elections(n: usize) -> EtcdCluster {
        EtcdCluster::start_timed(n, false)
    }

    fn start_timed(n: usize, fast_elections: bool) -> EtcdCluster {
        remove_stale_dirs();
        let dir = std::env::temp_dir().join(format!(
            "skiff-etcd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the etcd directory");
        let mut c = EtcdCluster::plan_in(&dir, n);
        c.fast_elections = fast_elections;
        c.start_all();
        c._tmp = Some(TempDir(dir));
        c
    }

    /// Starts `n` members with their data directories under `dir`.
    pub fn start_in(dir: &Path, n: usize) -> EtcdCluster {
        let mut c = EtcdCluster::plan_in(dir, n);
        c.start_all();
        c
    }

    /// Chooses the members' names, ports and data directories under `dir` without starting
    /// them (a restore writes their data directories first).
    pub fn plan_in(dir: &Path, n: usize) -> EtcdCluster {
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.join(format!("m{i}")),
                cgroup: None,
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        EtcdCluster {
            members,
            initial_cluster,
            dir: dir.to_path_buf(),
            fast_elections: true,
            _tmp: None,
        }
    }

    /// Starts every member and waits until all are healthy.
    pub fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.spawn(i);
        }
        for i in 0..self.members.len() {
            self.wait_healthy(i);
        }
    }

    /// Member `i` runs in the cgroup v2 directory `dir` from its next start.
    pub fn set_cgroup(&mut self, i: usize, dir: &Path) {
        self.members[i].cgroup = Some(dir.to_path_buf());
    }

    /// `name=peer-url,...` of every member.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// The members, in order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// `host:port` of every member, for `--store etcd://...`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// `etcd://a,b,c`
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        std::fs::create_dir_all(&self.dir).expect("creating the etcd directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .expect("opening the etcd log");
        let token = format!("skiff-{}", self.dir.display());
        let mut cmd = member_command(&MemberSpec {
            name: &m.name,
            data_dir: &m.data_dir,
            client_port: m.client_port,
            peer_port: m.peer_port,
            initial_cluster: &self.initial_cluster,
            token: &token,
            tls: None,
            metrics_port: None,
            // Fast elections for tests (ENVIRONMENT.md: healthy in < 0.3 s).
            fast_elections: self.fast_elections,
        });
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        if let Some(dir) = &m.cgroup {
            skiff_launcher::cluster::process::Placement {
                cgroup: Some(dir),
                ..Default::default()
            }
            .apply(&mut cmd)
            .expect("joining the member's cgroup");
        }
        let child = spawn_tied_to_process(cmd);
        self.members[i].child = Some(child);
    }

    fn wait_healthy(&self, i: usize) {
        let m = &self.members[i];
        wait_until(
            &format!("etcd member {} is healthy", m.name),
            HEALTHY_WITHIN,
            || health(m.client_port),
        );
    }

    /// SIGKILL one member (its data stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member again on its data directory and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_healthy(i);
    }

    /// The index of the member that leads now (asked over the client API).
    pub fn leader(&self) -> Option<usize> {
        try_wait_until("an etcd leader", HEALTHY_WITHIN, || {
            for (i, m) in self.members.iter().enumerate() {
                if !m.is_running() {
                    continue;
                }
                if let Ok(true) = is_leader(m.client_port) {
                    return Ok(i);
                }
            }
            Err("no member says it leads")
        })
        .ok()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A key prefix no other test of this process (or of another process on this machine)
/// uses: `/t<pid>-<n>`.
pub fn unique_prefix() -> String {
    format!(
        "/t{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// One etcd member for the whole test binary, started by the first test that asks. Its
/// process dies with the test binary (it is started from a thread that lives as long).
pub fn shared() -> &'static EtcdCluster {
    static SHARED: OnceLock<EtcdCluster> = OnceLock::new();
    SHARED.get_or_init(|| EtcdCluster::start(1))
}

/// Starts `cmd` from a thread that lives until the process exits, with the kernel told to
/// kill the child when that thread (hence the process) is gone: statics are never dropped,
/// so this is what ends a shared member when the test binary exits.
fn spawn_tied_to_process(mut cmd: Command) -> Child {
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                // Runs until the process exits: the sender lives in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(2) is async-signal-safe; it only sets a flag of the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (reply, result) = std::sync::mpsc::channel();
    spawner
        .lock()
        .expect("the spawner lock")
        .send((cmd, reply))
        .expect("the spawner thread runs");
    result
        .recv()
        .expect("the spawner answers")
        .expect("starting etcd")
}
