//! Test harness: real `strom serve` processes on loopback ports chosen at
//! runtime, driven over the HTTP admin API. Every process a test starts is
//! killed when the [`Cluster`] is dropped, also when the test fails.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_strom");

/// Settings that make failure detection quick in tests.
pub const FAST: &[&str] = &["broker.heartbeat.interval.ms=200", "broker.session.timeout.ms=1500"];

/// The lowest port of the kernel's ephemeral range (`ip_local_port_range`).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Free loopback ports, bound once to learn they are free, then released.
/// Chosen at random below the kernel's ephemeral range: a port from that
/// range, once its node is killed, can be taken by the local end of any
/// outgoing connection (another test's client) before the node restarts on
/// it ("Address already in use", seen in CI).
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let low = 10_000u16;
    let high = ephemeral_low().max(low + 1000);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 32;
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ seed;
    let mut held: Vec<TcpListener> = Vec::with_capacity(n);
    while held.len() < n {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let port = low + (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u16 % (high - low);
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    held.iter().map(|l| l.local_addr().expect("local addr").port()).collect()
}

/// Polls `f` until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct Node {
    pub id: u64,
    pub kafka: String,
    pub admin: String,
    pub raft: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub argv: Vec<String>,
    pub child: Option<Child>,
}

impl Node {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).expect("node is running")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
}

pub struct Response {
    pub status: u16,
    pub body: Value,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build()
}

fn into_response(result: Result<ureq::Response, ureq::Error>) -> Option<Response> {
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(_) => return None,
    };
    let status = resp.status();
    let text = resp.into_string().unwrap_or_default();
    let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    Some(Response { status, body })
}

impl Cluster {
    /// Starts `n` nodes, the first `voters` of them voters, and waits until
    /// every node sees a controller and all `n` brokers active.
    pub fn start(n: usize, voters: usize, settings: &[&str]) -> Cluster {
        let cluster = Self::spawn(n, voters, settings);
        cluster.wait_active(n, Duration::from_secs(30));
        cluster
    }

    pub fn spawn(n: usize, voters: usize, settings: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = free_ports(3 * n);
        let raft = |i: usize| format!("127.0.0.1:{}", ports[3 * i + 2]);
        let quorum: Vec<String> = (0..voters).map(|i| format!("{}@{}", i + 1, raft(i))).collect();
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = (i + 1) as u64;
            let data_dir = dir.path().join(format!("node-{id}"));
            let kafka = format!("127.0.0.1:{}", ports[3 * i]);
            let admin = format!("127.0.0.1:{}", ports[3 * i + 1]);
            let mut argv: Vec<String> = vec![
                "serve".into(),
                "--node-id".into(),
                id.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--kafka".into(),
                kafka.clone(),
                "--admin".into(),
                admin.clone(),
                "--raft".into(),
                raft(i),
                "--quorum".into(),
                quorum.join(","),
            ];
            for s in settings {
                argv.push("--set".into());
                argv.push(s.to_string());
            }
            let log = dir.path().join(format!("node-{id}.log"));
            nodes.push(Node { id, kafka, admin, raft: raft(i), data_dir, log, argv, child: None });
        }
        let mut cluster = Cluster { dir, nodes };
        for id in 1..=n as u64 {
            cluster.launch(id);
        }
        cluster
    }

    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    /// Starts node `id` from its argv (again), appending to its log.
    pub fn launch(&mut self, id: u64) {
        let node = &mut self.nodes[(id - 1) as usize];
        assert!(node.child.is_none(), "node {id} is already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&node.log).expect("open log");
        let child = Command::new(BIN)
            .args(&node.argv)
            .env("RUST_LOG", "info,openraft=off")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn strom");
        node.child = Some(child);
    }

    pub fn signal(&self, id: u64, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.node(id).pid()), sig).expect("signal");
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self, id: u64) {
        let node = &mut self.nodes[(id - 1) as usize];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (controlled shutdown) and wait for a clean exit.
    pub fn stop(&mut self, id: u64) -> std::process::ExitStatus {
        self.signal(id, nix::sys::signal::Signal::SIGTERM);
        let node = &mut self.nodes[(id - 1) as usize];
        let mut child = node.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("node {id} did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn get(&self, id: u64, path: &str) -> Option<Response> {
        into_response(agent().get(&format!("http://{}{path}", self.node(id).admin)).call())
    }

    pub fn send(&self, id: u64, method: &str, path: &str, body: Option<Value>) -> Option<Response> {
        let req = agent().request(method, &format!("http://{}{path}", self.node(id).admin));
        into_response(match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        })
    }

    pub fn send_raw(&self, id: u64, method: &str, path: &str, body: &str) -> Response {
        let req = agent()
            .request(method, &format!("http://{}{path}", self.node(id).admin))
            .set("content-type", "application/json");
        into_response(req.send_string(body)).expect("admin API answers")
    }

    pub fn cluster_view(&self, id: u64) -> Option<Value> {
        self.get(id, "/v1/cluster").filter(|r| r.status == 200).map(|r| r.body)
    }

    /// Ids of the running nodes.
    pub fn running(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.child.is_some()).map(|n| n.id).collect()
    }

    /// Waits until every running node sees a controller and `n` active brokers.
    pub fn wait_active(&self, n: usize, timeout: Duration) -> u64 {
        wait_for(&format!("{n} active brokers and one controller on every node"), timeout, || {
            let mut controllers = Vec::new();
            for id in self.running() {
                let view = self.cluster_view(id)?;
                let active = view["brokers"].as_array()?.iter().filter(|b| b["state"] == "active").count();
                if active != n {
                    return None;
                }
                controllers.push(view["controller_id"].as_u64()?);
            }
            controllers.dedup();
            (controllers.len() == 1).then(|| controllers[0])
        })
    }

    pub fn controller(&self, via: u64) -> Option<u64> {
        self.cluster_view(via)?["controller_id"].as_u64()
    }

    pub fn create_topic(&self, via: u64, name: &str, partitions: i64, rf: i64) -> Response {
        self.send(
            via,
            "POST",
            "/v1/topics",
            Some(serde_json::json!({"name": name, "partitions": partitions, "replication_factor": rf})),
        )
        .expect("admin API answers")
    }

    pub fn topic(&self, via: u64, name: &str) -> Option<Value> {
        self.get(via, &format!("/v1/topics/{name}")).filter(|r| r.status == 200).map(|r| r.body)
    }

    pub fn topic_names(&self, via: u64) -> Option<Vec<String>> {
        let r = self.get(via, "/v1/topics").filter(|r| r.status == 200)?;
        Some(r.body.as_array()?.iter().filter_map(|t| t["name"].as_str().map(str::to_string)).collect())
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                // A stopped (SIGSTOP) process still dies of SIGKILL.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            for node in &self.nodes {
                eprintln!("----- node {} log (tail) -----", node.id);
                let text = node.log_text();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
