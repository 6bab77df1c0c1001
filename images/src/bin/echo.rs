//! The echo image's one binary. With no arguments (or `serve`) it is an HTTP server on $PORT
//! (default 8080) answering with its pod's identity; the other subcommands are small tools
//! that tests, probes and demos run inside pods (`kubectl exec`, init containers).

use skiff_images::http::{self, ReadError, Url};
use skiff_images::identity::Identity;
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const USAGE: &str = "usage: echo [serve]
       echo fetch URL [--count N]     GET URL N times on fresh connections, print each body
       echo cat FILE...               print files (-: standard input, line by line)
       echo write FILE TEXT           write TEXT to FILE
       echo exists FILE               exit 0 if FILE exists, 1 if not
       echo env                       print the environment
       echo alloc MIB                 allocate and touch MIB MiB, then sleep
       echo sleep SECONDS             sleep (0: forever)
       echo exit CODE                 exit with CODE
       echo incluster                 as an in-cluster client (KUBERNETES_SERVICE_HOST/PORT, the
                                      service account's token and ca.crt): GET /apis and the
                                      secrets of its namespace, print each HTTP status
       echo webhook --cert FILE --key FILE --sidecar-image IMAGE [--port 8443]
                                      a mutating admission webhook (HTTPS) that adds a sidecar
                                      container `sidecar` (IMAGE, `serve` on PORT 9090) to pods
serve: GET / (who answers, and the client address it sees), /healthz, /readyz, /env/NAME, /control/{healthy,unhealthy,ready,unready},
       /control/alloc/MIB (allocate and hold MIB MiB),
       /control/burn/MILLICORES (one thread busy that share of each 100 ms, at most 1000; 0 stops)
env: PORT (8080), POD_NAME (default: the host name), POD_NAMESPACE (default: the service
     account's namespace), POD_IP (default: the interface's address), NODE_NAME (downward API),
     IGNORE_SIGTERM=1 (only SIGKILL stops the server)";

static HEALTHY: AtomicBool = AtomicBool::new(true);
static READY: AtomicBool = AtomicBool::new(true);
/// The CPU `/control/burn/` asked for, in millicores (0: none).
static BURN: AtomicU64 = AtomicU64::new(0);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        [] | ["serve"] => serve(),
        ["fetch", url, rest @ ..] => fetch(url, rest),
        ["cat", files @ ..] if !files.is_empty() => files.iter().try_for_each(|f| {
            if *f == "-" {
                // Line by line, so an attached client sees each line as it comes.
                let mut out = std::io::stdout();
                for line in std::io::stdin().lines() {
                    let line = line.map_err(|e| format!("stdin: {e}"))?;
                    writeln!(out, "{line}").map_err(|e| format!("stdout: {e}"))?;
                    out.flush().map_err(|e| format!("stdout: {e}"))?;
                }
                return Ok(());
            }
            let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
            print!("{text}");
            Ok(())
        }),
        ["write", file, text] => std::fs::write(file, text).map_err(|e| format!("{file}: {e}")),
        ["exists", file] => {
            return if std::path::Path::new(file).exists() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        ["env"] => {
            std::env::vars().for_each(|(k, v)| println!("{k}={v}"));
            Ok(())
        }
        ["alloc", mib] => alloc(mib),
        ["sleep", secs] => sleep(secs),
        ["webhook", rest @ ..] => webhook(rest),
        ["incluster"] => incluster(),
        ["exit", code] => {
            return code
                .parse::<u8>()
                .map(ExitCode::from)
                .unwrap_or(ExitCode::FAILURE)
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve() -> Result<(), String> {
    if std::env::var("IGNORE_SIGTERM").is_ok_and(|v| v == "1") {
        skiff_images::signals::ignore_term();
    } else {
        skiff_images::signals::exit_on_term();
    }
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".into());
    let listener =
        TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| format!("bind :{port}: {e}"))?;
    eprintln!("echo: serving on :{port}");
    for conn in listener.incoming().flatten() {
        std::thread::spawn(move || connection(conn));
    }
    Ok(())
}

fn connection(conn: TcpStream) {
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let client = conn.peer_addr().ok();
    let remote = client.map(|a| a.ip().to_string()).unwrap_or_default();
    let mut r = BufReader::new(conn);
    let mut w = BufWriter::new(write_half);
    loop {
        let req = match http::read_request(&mut r) {
            Ok(req) => req,
            Err(ReadError::Malformed(why)) => {
                let _ = http::write_response(&mut w, 400, &format!("{why}\n"), true);
                return;
            }
            Err(ReadError::Eof | ReadError::Io(_)) => return,
        };
        let (status, body) = match req.path.as_str() {
            // The client address as this pod sees it (what a proxy kept or translated).
            "/remote" => (
                200,
                format!("{} remote={remote}\n", identity().line(client).trim_end()),
            ),
            path => answer(path).unwrap_or_else(|| (200, identity().line(client))),
        };
        if http::write_response(&mut w, status, &body, req.close).is_err() || req.close {
            return;
        }
    }
}

/// The response to one request path; None for the identity (it needs the connection).
fn answer(path: &str) -> Option<(u16, String)> {
    let flag = |f: &AtomicBool, name: &str| {
        if f.load(Ordering::Relaxed) {
            (200, "ok\n".to_string())
        } else {
            (503, format!("not {name}\n"))
        }
    };
    Some(match path {
        "/healthz" => flag(&HEALTHY, "healthy"),
        "/readyz" => flag(&READY, "ready"),
        "/control/healthy" | "/control/unhealthy" => {
            HEALTHY.store(path == "/control/healthy", Ordering::Relaxed);
            (200, "ok\n".into())
        }
        "/control/ready" | "/control/unready" => {
            READY.store(path == "/control/ready", Ordering::Relaxed);
            (200, "ok\n".into())
        }
        _ if path.starts_with("/control/alloc/") => {
            match path["/control/alloc/".len()..].parse::<usize>() {
                // Held for the rest of the process's life.
                Ok(mib) => {
                    std::mem::forget(touch(mib));
                    (200, format!("allocated {mib} MiB\n"))
                }
                Err(_) => (400, "usage: /control/alloc/<MiB>\n".into()),
            }
        }
        _ if path.starts_with("/control/burn/") => {
            match path["/control/burn/".len()..].parse::<u64>() {
                Ok(milli) if milli <= 1000 => {
                    burn(milli);
                    (200, format!("burning {milli}m\n"))
                }
                _ => (400, "usage: /control/burn/<millicores, 0 to 1000>\n".into()),
            }
        }
        _ => match path.strip_prefix("/env/") {
            Some(name) => match std::env::var(name) {
                Ok(v) => (200, format!("{v}\n")),
                Err(_) => (404, format!("{name} is not set\n")),
            },
            None => return None,
        },
    })
}

/// Sets the load of the one burner thread (started by the first call): busy `milli` / 1000
/// of every 100 ms, idle the rest; 0 makes it idle.
fn burn(milli: u64) {
    static STARTED: OnceLock<()> = OnceLock::new();
    BURN.store(milli, Ordering::Relaxed);
    STARTED.get_or_init(|| {
        std::thread::spawn(|| loop {
            let period = Duration::from_millis(100);
            let busy = period * BURN.load(Ordering::Relaxed) as u32 / 1000;
            let start = std::time::Instant::now();
            while start.elapsed() < busy {
                std::hint::spin_loop();
            }
            std::thread::sleep(period.saturating_sub(start.elapsed()));
        });
    });
}

/// Computed once: the environment and the pod's host name and address do not change.
fn identity() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(Identity::discover)
}

fn fetch(url: &str, rest: &[&str]) -> Result<(), String> {
    let count: u64 = match rest {
        [] => 1,
        ["--count", n] => n.parse().map_err(|_| format!("bad count {n}"))?,
        _ => return Err(USAGE.to_string()),
    };
    let url = Url::parse(url)?;
    let mut failures = 0;
    for _ in 0..count {
        match http::get(&url, Duration::from_secs(5)) {
            Ok(r) if r.status == 200 => print!("{}", r.body),
            Ok(r) => {
                failures += 1;
                print!("status {}: {}", r.status, r.body)
            }
            Err(e) => {
                failures += 1;
                println!("error: {e}")
            }
        }
    }
    match failures {
        0 => Ok(()),
        n => Err(format!("{n} of {count} requests failed")),
    }
}

fn webhook(args: &[&str]) -> Result<(), String> {
    let mut flags = std::collections::HashMap::new();
    for pair in args.chunks(2) {
        match pair {
            [k, v] if k.starts_with("--") => {
                flags.insert(&k[2..], *v);
            }
            _ => return Err(USAGE.to_string()),
        }
    }
    let need = |k: &str| {
        flags
            .get(k)
            .copied()
            .ok_or_else(|| format!("--{k} is required"))
    };
    let read = |k: &str| {
        let path = need(k)?;
        std::fs::read(path).map_err(|e| format!("{path}: {e}"))
    };
    let tls = skiff_images::webhook::tls_config(&read("cert")?, &read("key")?)?;
    let sidecar = skiff_images::webhook::Sidecar {
        name: "sidecar".into(),
        image: need("sidecar-image")?.to_string(),
        args: vec!["serve".into()],
        env: vec![("PORT".into(), "9090".into())],
    };
    let port = flags.get("port").copied().unwrap_or("8443");
    let listener =
        TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| format!("bind :{port}: {e}"))?;
    skiff_images::signals::exit_on_term();
    eprintln!("echo: admission webhook serving on :{port}");
    skiff_images::webhook::serve(listener, tls, sidecar);
    Ok(())
}

/// Discovery (any service account may) and the namespace's secrets (none may, by default):
/// one line per request, `GET <path> <status>`; fails only when a request got no answer.
fn incluster() -> Result<(), String> {
    use skiff_images::incluster::{InCluster, SERVICE_ACCOUNT_DIR};
    let api = InCluster::load(
        |k| std::env::var(k).ok(),
        std::path::Path::new(SERVICE_ACCOUNT_DIR),
    )?;
    let secrets = format!("/api/v1/namespaces/{}/secrets", api.namespace());
    for path in ["/apis", secrets.as_str()] {
        let r = api.get(path, Duration::from_secs(10))?;
        println!("GET {path} {}", r.status);
    }
    Ok(())
}

fn alloc(mib: &str) -> Result<(), String> {
    let mib: usize = mib.parse().map_err(|_| format!("bad size {mib}"))?;
    let _held = touch(mib);
    println!("allocated {mib} MiB");
    sleep("0")
}

/// `mib` MiB with every page touched, so the memory is really charged to the cgroup.
fn touch(mib: usize) -> Vec<Vec<u8>> {
    (0..mib).map(|_| vec![1u8; 1 << 20]).collect()
}

fn sleep(secs: &str) -> Result<(), String> {
    skiff_images::signals::exit_on_term();
    let secs: u64 = secs.parse().map_err(|_| format!("bad seconds {secs}"))?;
    if secs == 0 {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    std::thread::sleep(Duration::from_secs(secs));
    Ok(())
}
