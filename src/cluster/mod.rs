//! `strom cluster`: starts N nodes as child processes of this binary, waits
//! until every node is registered and a controller is elected, writes
//! `DIR/cluster.json` atomically and prints the same table, then stays in the
//! foreground. SIGINT/SIGTERM stops every node gracefully; a node that dies is
//! reported, not restarted. Re-running on an existing DIR restarts the same
//! nodes (the `argv` recorded in cluster.json) with their data; with a larger
//! `--nodes` it also starts the new nodes, which join the cluster as
//! observers and brokers. Nodes still running (the cluster's first `strom
//! cluster` still up) are left to their supervisor.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::process::{Child, Command};

mod secure;

/// How long the cluster may take to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long nodes get to stop after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Number of nodes.
    #[arg(long)]
    pub nodes: u16,
    /// Directory for node data and cluster.json.
    #[arg(long)]
    pub dir: PathBuf,
    /// Voters are nodes 1..K (default: min(N, 3)); the rest are observers.
    #[arg(long)]
    pub voters: Option<u16>,
    /// Node i's Kafka listener is on this port + i - 1.
    #[arg(long, default_value_t = 9092)]
    pub kafka_base: u16,
    /// Node i's admin API is on this port + i - 1.
    #[arg(long, default_value_t = 9644)]
    pub admin_base: u16,
    /// Node i's quorum RPC is on this port + i - 1.
    #[arg(long, default_value_t = 19092)]
    pub raft_base: u16,
    /// KEY=VALUE setting passed to every node; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Secure in one step: SASL_SSL Kafka listeners, TLS between nodes, an
    /// HTTPS admin API with authentication, ACLs, and a super user `admin`
    /// whose credentials go to DIR/credentials.json.
    #[arg(long)]
    pub secure: bool,
    /// With --secure: the first port of the nodes' SSL inter-broker listeners.
    #[arg(long, default_value_t = 29092)]
    pub inter_broker_base: u16,
    /// Print cluster.json once the cluster is up instead of a summary (the
    /// default when stdout is not a terminal, so scripts get the JSON).
    #[arg(long)]
    pub json: bool,
}

impl ClusterArgs {
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("--nodes: must be at least 1".into());
        }
        let voters = self.voters();
        if voters == 0 || voters > self.nodes {
            return Err(format!("--voters: must be between 1 and --nodes ({}), got {voters}", self.nodes));
        }
        for (flag, base) in [
            ("--kafka-base", self.kafka_base),
            ("--admin-base", self.admin_base),
            ("--raft-base", self.raft_base),
            ("--inter-broker-base", self.inter_broker_base),
        ] {
            if base as u32 + self.nodes as u32 - 1 > u16::MAX as u32 {
                return Err(format!("{flag}: {base} + {} nodes runs past port 65535", self.nodes));
            }
        }
        let mut settings = crate::config::Settings::default();
        for pair in &self.set {
            settings.set_pair(pair).map_err(|e| format!("--set {e}"))?;
        }
        Ok(())
    }

    fn voters(&self) -> u16 {
        self.voters.unwrap_or(self.nodes.min(3))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: u16,
    pub pid: u32,
    pub kafka: String,
    pub admin: String,
    pub raft: String,
    pub data_dir: PathBuf,
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    pub bootstrap: String,
    pub nodes: Vec<NodeEntry>,
    /// Started with --secure: `kafka` is each node's SASL_SSL listener and
    /// the admin API is HTTPS with authentication.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure: bool,
}

fn node_entries(args: &ClusterArgs, exe: &Path, dir: &Path) -> Vec<NodeEntry> {
    let addr = |base: u16, i: u16| format!("127.0.0.1:{}", base + i - 1);
    let quorum: Vec<String> = (1..=args.voters()).map(|i| format!("{i}@{}", addr(args.raft_base, i))).collect();
    (1..=args.nodes)
        .map(|i| {
            let data_dir = dir.join(format!("node-{i}"));
            let (kafka, admin, raft) = (addr(args.kafka_base, i), addr(args.admin_base, i), addr(args.raft_base, i));
            let mut argv = vec![
                exe.display().to_string(),
                "serve".into(),
                "--node-id".into(),
                i.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
            ];
            match args.secure {
                false => argv.extend(["--kafka".into(), kafka.clone()]),
                true => {
                    let internal = addr(args.inter_broker_base, i);
                    argv.extend(["--set".into(), format!("listeners=SASL_SSL://{kafka},SSL://{internal}")]);
                    for pair in secure::node_settings(dir) {
                        argv.extend(["--set".into(), pair]);
                    }
                }
            }
            argv.extend([
                "--admin".into(),
                admin.clone(),
                "--raft".into(),
                raft.clone(),
                "--quorum".into(),
                quorum.join(","),
            ]);
            for pair in &args.set {
                argv.push("--set".into());
                argv.push(pair.clone());
            }
            NodeEntry { id: i, pid: 0, kafka, admin, raft, data_dir, argv }
        })
        .collect()
}

/// The node list: a new cluster's, or an existing cluster.json's, grown by
/// the nodes a larger `--nodes` adds.
fn plan(args: &ClusterArgs, dir: &Path) -> Result<Vec<NodeEntry>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let path = dir.join("cluster.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(node_entries(args, &exe, dir)) };
    let existing: ClusterFile =
        serde_json::from_str(&text).map_err(|e| format!("{} is not a valid cluster file: {e}", path.display()))?;
    let have = existing.nodes.len();
    if have > args.nodes as usize {
        return Err(format!(
            "{} describes {have} nodes, more than --nodes {}; retire nodes with `strom broker decommission`, or use another --dir",
            path.display(),
            args.nodes
        ));
    }
    if have == args.nodes as usize {
        tracing::info!(dir = %dir.display(), "restarting the existing cluster with its data");
        return Ok(existing.nodes);
    }
    let mut nodes = existing.nodes;
    nodes.extend(added_nodes(args, &exe, dir, &nodes)?);
    tracing::info!(dir = %dir.display(), from = have, to = nodes.len(), "growing the existing cluster");
    Ok(nodes)
}

/// The nodes a larger `--nodes` adds to `existing`: ids after the last one,
/// ports from this run's bases (`base + id - 1`, as at creation), and the
/// existing nodes' `--quorum` and `--set` arguments, so they join as
/// observers of the same cluster and register as brokers.
fn added_nodes(args: &ClusterArgs, exe: &Path, dir: &Path, existing: &[NodeEntry]) -> Result<Vec<NodeEntry>, String> {
    let first = existing.first().ok_or("cluster.json lists no node")?;
    let flag = |name: &str| first.argv.iter().position(|a| a == name).and_then(|i| first.argv.get(i + 1)).cloned();
    let quorum = flag("--quorum").ok_or("node 1's argv in cluster.json has no --quorum")?;
    let generated: Vec<String> = secure::node_settings(dir);
    let sets: Vec<String> = first
        .argv
        .windows(2)
        .filter(|w| w[0] == "--set")
        .map(|w| w[1].clone())
        .filter(|s| !s.starts_with("listeners=") && !generated.contains(s))
        .collect();
    let taken: Vec<&str> =
        existing.iter().flat_map(|n| [n.kafka.as_str(), n.admin.as_str(), n.raft.as_str()]).collect();
    let next_id = existing.iter().map(|n| n.id).max().unwrap_or(0) + 1;
    let mut grown = args.clone();
    grown.set = sets;
    grown.secure = first.argv.iter().any(|a| a.starts_with("listeners=SASL_SSL://"));
    let mut added = Vec::new();
    for mut node in node_entries(&grown, exe, dir).into_iter().filter(|n| n.id >= next_id) {
        for addr in [&node.kafka, &node.admin, &node.raft] {
            if taken.contains(&addr.as_str()) {
                return Err(format!(
                    "node {} would listen on {addr}, which an existing node uses; pick free ranges with --kafka-base, --admin-base and --raft-base",
                    node.id
                ));
            }
        }
        if let Some(i) = node.argv.iter().position(|a| a == "--quorum") {
            node.argv[i + 1] = quorum.clone();
        }
        added.push(node);
    }
    Ok(added)
}

/// Whether the node recorded in cluster.json still runs (a cluster grown
/// while its first `strom cluster` is still up): its pid runs this node.
fn already_running(node: &NodeEntry) -> bool {
    if node.pid == 0 {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", node.pid)) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let data_dir = node.data_dir.display().to_string();
    let id = node.id.to_string();
    args.windows(2).any(|w| w[0] == b"--node-id" && w[1] == id.as_bytes())
        && args.windows(2).any(|w| w[0] == b"--data-dir" && w[1] == data_dir.as_bytes())
}

fn spawn(node: &NodeEntry, dir: &Path) -> Result<Child, String> {
    let log_path = dir.join(format!("node-{}.log", node.id));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let err_log = log.try_clone().map_err(|e| e.to_string())?;
    Command::new(&node.argv[0])
        .args(&node.argv[1..])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .spawn()
        .map_err(|e| format!("cannot start node {}: {e}", node.id))
}

async fn cluster_view(http: &AdminHttp, admin: &str) -> Option<Value> {
    let mut request = http.client.get(format!("{}://{admin}/v1/cluster", http.scheme));
    if let Some(c) = &http.credentials {
        request = request.basic_auth(&c.user, Some(&c.password));
    }
    request.send().await.ok()?.json().await.ok()
}

/// How this process reaches the nodes' admin APIs.
struct AdminHttp {
    client: reqwest::Client,
    scheme: &'static str,
    credentials: Option<crate::admin::auth::ClientCredentials>,
}

impl AdminHttp {
    fn new(dir: &Path, secure: bool) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(2));
        let credentials = match secure {
            false => None,
            true => {
                let c = crate::admin::auth::read_credentials(&dir.join(secure::CREDENTIALS).display().to_string())?;
                let pem = std::fs::read(dir.join(secure::CA)).map_err(|e| e.to_string())?;
                builder =
                    builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).map_err(|e| e.to_string())?);
                Some(c)
            }
        };
        let client = builder.build().map_err(|e| e.to_string())?;
        Ok(Self { client, scheme: if secure { "https" } else { "http" }, credentials })
    }
}

/// Every node answers, agrees on a controller and sees every broker active.
async fn is_up(http: &AdminHttp, nodes: &[NodeEntry]) -> bool {
    for node in nodes {
        let Some(view) = cluster_view(http, &node.admin).await else { return false };
        let active = view["brokers"].as_array().map_or(0, |b| b.iter().filter(|b| b["state"] == "active").count());
        if view["controller_id"].is_null() || active < nodes.len() {
            return false;
        }
    }
    true
}

fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path))
        .and_then(|_| match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
            _ => Ok(()),
        })
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Sends `sig` to a child we started; an already-exited child is fine.
fn signal(pid: u32, sig: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

pub async fn run(args: ClusterArgs) -> Result<(), String> {
    // Before any node exists: a SIGTERM during startup must stop the nodes
    // too, not kill this process with the default action and orphan them.
    let mut stop = StopSignals::install()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir).map_err(|e| e.to_string())?;
    let mut nodes = plan(&args, &dir)?;
    let secure = nodes.first().is_some_and(|n| n.argv.iter().any(|a| a.starts_with("listeners=SASL_SSL://")));
    if secure && !dir.join(secure::CREDENTIALS).exists() {
        secure::prepare(&dir, &nodes)?;
    }
    let mut children = Vec::new();
    for node in &mut nodes {
        if already_running(node) {
            // Its own supervisor (an earlier `strom cluster`) keeps it.
            tracing::info!(node = node.id, pid = node.pid, "node already running");
            children.push(None);
            continue;
        }
        let child = spawn(node, &dir)?;
        node.pid = child.id().unwrap_or(0);
        children.push(Some(child));
    }
    let http = AdminHttp::new(&dir, secure)?;
    let started = Instant::now();
    while !is_up(&http, &nodes).await {
        if started.elapsed() > STARTUP_TIMEOUT {
            stop_all(&nodes, &mut children).await;
            return Err(format!(
                "the cluster did not come up within {STARTUP_TIMEOUT:?}; see {}/node-*.log",
                dir.display()
            ));
        }
        for (node, child) in nodes.iter().zip(children.iter_mut()) {
            if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
                stop_all(&nodes, &mut children).await;
                return Err(format!(
                    "node {} exited during startup ({status}); see {}/node-{}.log",
                    node.id,
                    dir.display(),
                    node.id
                ));
            }
        }
        tokio::select! {
            _ = stop.recv() => {
                stop_all(&nodes, &mut children).await;
                return Err("stopped by a signal during startup".to_string());
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    let file = ClusterFile {
        bootstrap: nodes.iter().map(|n| n.kafka.clone()).collect::<Vec<_>>().join(","),
        nodes: nodes.clone(),
        secure,
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
    write_atomically(&dir.join("cluster.json"), &text)?;
    if args.json || !std::io::stdout().is_terminal() {
        println!("{text}");
        println!(
            "cluster up in {:.1}s: {} nodes, bootstrap {}",
            started.elapsed().as_secs_f64(),
            nodes.len(),
            file.bootstrap
        );
    } else {
        print!("{}", summary(&file, &dir, secure, started.elapsed()));
    }
    if secure {
        secure::write_client_files(&dir, &file.bootstrap)?;
        println!("{}", secure::how_to_connect(&dir, &file.bootstrap, &nodes[0].admin));
    }
    supervise(&nodes, &mut children, &mut stop).await;
    stop_all(&nodes, &mut children).await;
    Ok(())
}

/// What a person at a terminal needs once the cluster is up: where to point
/// clients and the admin CLI, where the data is, and how to stop and restart.
fn summary(file: &ClusterFile, dir: &Path, secure: bool, took: Duration) -> String {
    use std::fmt::Write as _;
    let scheme = if secure { "https" } else { "http" };
    let d = dir.display();
    let mut out = String::new();
    let _ = writeln!(out, "Strom cluster up in {:.1} s: {} nodes", took.as_secs_f64(), file.nodes.len());
    let _ = writeln!(out, "  bootstrap   {}", file.bootstrap);
    if let Some(first) = file.nodes.first() {
        let _ = writeln!(out, "  admin API   {scheme}://{} (any node's works)", first.admin);
    }
    let _ = writeln!(out, "  data        {d} (cluster.json has every node's addresses and argv)");
    let _ = writeln!(out);
    let _ = writeln!(out, "  {:<5} {:<8} {:<22} {:<22} QUORUM", "NODE", "PID", "KAFKA", "ADMIN");
    for n in &file.nodes {
        let _ = writeln!(out, "  {:<5} {:<8} {:<22} {:<22} {}", n.id, n.pid, n.kafka, n.admin, n.raft);
    }
    let _ = writeln!(out);
    if let Some(first) = file.nodes.first() {
        if !secure {
            let strom = this_binary();
            let url = if first.admin == "127.0.0.1:9644" {
                String::new()
            } else {
                format!(" --admin-url {scheme}://{}", first.admin)
            };
            let _ = writeln!(out, "Try:   {strom} topic create demo --partitions 3 --replication-factor 3{url}");
            let _ = writeln!(out, "       echo hello | {strom} topic produce demo{url}");
            let _ = writeln!(out, "       {strom} topic consume demo --from-beginning --count 1{url}");
            let _ = writeln!(out, "       {strom} cluster-info{url}");
        }
    }
    let _ = writeln!(out, "Stop:  Ctrl-C stops every node gracefully.");
    let _ = writeln!(out, "Again: the same command restarts this cluster with its data; a larger --nodes grows it.");
    out
}

/// This binary as the user can type it: relative to the working directory
/// when it is under it (`./target/release/strom`), else its full path.
fn this_binary() -> String {
    let Ok(exe) = std::env::current_exe() else { return "strom".into() };
    match std::env::current_dir().ok().and_then(|cwd| exe.strip_prefix(cwd).ok().map(Path::to_path_buf)) {
        Some(relative) => format!("./{}", relative.display()),
        None => exe.display().to_string(),
    }
}

/// SIGINT and SIGTERM, caught from the start.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<Self, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).map_err(|e| format!("cannot catch SIGTERM: {e}"))?;
        let int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot catch SIGINT: {e}"))?;
        Ok(StopSignals { term, int })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Waits for SIGINT/SIGTERM, reporting nodes that exit on their own.
async fn supervise(nodes: &[NodeEntry], children: &mut [Option<Child>], stop: &mut StopSignals) {
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = stop.recv() => return,
            _ = poll.tick() => {}
        }
        for (node, slot) in nodes.iter().zip(children.iter_mut()) {
            if let Some(child) = slot {
                if let Ok(Some(status)) = child.try_wait() {
                    println!(
                        "node {} (pid {}) exited: {status}; not restarting it (argv in cluster.json)",
                        node.id, node.pid
                    );
                    *slot = None;
                }
            }
        }
    }
}

async fn stop_all(nodes: &[NodeEntry], children: &mut [Option<Child>]) {
    for (node, child) in nodes.iter().zip(children.iter()) {
        if let Some(pid) = child.as_ref().and_then(Child::id) {
            tracing::info!(node = node.id, pid, "stopping node");
            signal(pid, Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for child in children.iter_mut().flatten() {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u16) -> NodeEntry {
        NodeEntry {
            id,
            pid: 4000 + u32::from(id),
            kafka: format!("127.0.0.1:{}", 9091 + id),
            admin: format!("127.0.0.1:{}", 9643 + id),
            raft: format!("127.0.0.1:{}", 19091 + id),
            data_dir: PathBuf::from(format!("/d/node-{id}")),
            argv: Vec::new(),
        }
    }

    #[test]
    fn the_summary_says_where_to_connect_and_how_to_stop() {
        let file = ClusterFile {
            bootstrap: "127.0.0.1:9092,127.0.0.1:9093".into(),
            nodes: vec![node(1), node(2)],
            secure: false,
        };
        let text = summary(&file, Path::new("/d"), false, Duration::from_millis(2500));
        assert!(text.starts_with("Strom cluster up in 2.5 s: 2 nodes\n"), "{text}");
        assert!(text.contains("bootstrap   127.0.0.1:9092,127.0.0.1:9093"), "{text}");
        assert!(text.contains("admin API   http://127.0.0.1:9644"), "{text}");
        assert!(text.contains("data        /d"), "{text}");
        assert!(text.contains("4002") && text.contains("127.0.0.1:19093"), "{text}");
        assert!(text.contains("Ctrl-C stops every node") && text.contains("restarts this cluster"), "{text}");
        assert!(text.contains("topic produce demo\n"), "default admin URL: no flag needed\n{text}");
        let secure = summary(&ClusterFile { secure: true, ..file }, Path::new("/d"), true, Duration::ZERO);
        assert!(secure.contains("https://127.0.0.1:9644") && !secure.contains("Try:"), "{secure}");
    }
}
