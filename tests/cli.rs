//! `strom cluster` and the admin subcommands, as a user runs them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{wait_for, BIN};
use serde_json::Value;

/// A base port with `n` free consecutive ports above it, below the kernel's
/// ephemeral range (32768+): bind(0) hands out ports there, and client
/// connections hold ports next to them, so consecutive ports there were often taken.
fn free_range(n: u16, avoid: &[u16]) -> u16 {
    for _ in 0..500 {
        let base = 10_000 + rand::random::<u16>() % 20_000;
        if avoid.iter().any(|a| base.abs_diff(*a) < 16) {
            continue;
        }
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no free port range");
}

/// `strom cluster` running on `dir`.
struct Supervisor(Child, PathBuf);

/// `strom serve` processes whose command line names `dir` (the nodes of a cluster there), from /proc.
fn processes_in(dir: &Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .is_ok_and(|c| c.contains(" serve ") && c.contains(&needle))
        })
        .collect()
}

impl Supervisor {
    /// SIGTERM, then waits until the supervisor and every node of its cluster
    /// have exited; the supervisor's exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .expect("term");
        let status = wait_for("the supervisor to exit", Duration::from_secs(40), || self.0.try_wait().ok().flatten());
        wait_for("every node of the cluster to exit", Duration::from_secs(40), || {
            processes_in(&self.1).is_empty().then_some(())
        });
        status
    }
}

/// `strom cluster --nodes 3` on a fresh directory with three free port ranges:
/// (the temporary directory to keep, the cluster directory, the port bases, the supervisor).
fn fresh_cluster() -> (tempfile::TempDir, PathBuf, (u16, u16, u16), Supervisor) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("c");
    let kafka = free_range(3, &[]);
    let admin = free_range(3, &[kafka]);
    let raft = free_range(3, &[kafka, admin]);
    let sup = start_cluster(&dir, (kafka, admin, raft));
    (tmp, dir, (kafka, admin, raft), sup)
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // The supervisor stops its nodes on SIGTERM; if it is stuck, SIGKILL,
        // and then any node it left behind: a test leaves no process running.
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let exited = (0..400).any(|_| {
            let done = matches!(self.0.try_wait(), Ok(Some(_)));
            if !done {
                std::thread::sleep(Duration::from_millis(50));
            }
            done
        });
        if !exited {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        for pid in processes_in(&self.1) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn start_cluster(dir: &Path, bases: (u16, u16, u16)) -> Supervisor {
    let child = Command::new(BIN)
        .args(["cluster", "--nodes", "3", "--dir"])
        .arg(dir)
        .args([
            "--kafka-base",
            &bases.0.to_string(),
            "--admin-base",
            &bases.1.to_string(),
            "--raft-base",
            &bases.2.to_string(),
        ])
        .args(["--set", "broker.session.timeout.ms=1500"])
        .env("RUST_LOG", "info,openraft=off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strom cluster");
    Supervisor(child, dir.to_path_buf())
}

fn read_cluster_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).expect("cluster.json")).expect("json")
}

fn strom(admin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("STROM_ADMIN", format!("http://{admin}")).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn pid_alive(pid: i64) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[test]
fn cluster_command_writes_cluster_json_and_restarts_with_data() {
    let (_tmp, dir, bases, mut sup) = fresh_cluster();
    let (kafka, admin, _) = bases;
    let file = wait_for("cluster.json", Duration::from_secs(60), || {
        dir.join("cluster.json").exists().then(|| read_cluster_json(&dir))
    });
    let nodes = file["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 3);
    assert_eq!(file["bootstrap"], format!("127.0.0.1:{kafka},127.0.0.1:{},127.0.0.1:{}", kafka + 1, kafka + 2));
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["id"], i as u64 + 1);
        assert_eq!(n["admin"], format!("127.0.0.1:{}", admin + i as u16));
        assert!(pid_alive(n["pid"].as_i64().expect("pid")));
        let argv: Vec<&str> = n["argv"].as_array().expect("argv").iter().filter_map(Value::as_str).collect();
        assert!(Path::new(argv[0]).is_absolute());
        assert_eq!(argv[1], "serve");
        assert!(n["data_dir"].as_str().expect("dir").ends_with(&format!("node-{}", i + 1)));
    }
    let admin1 = nodes[0]["admin"].as_str().expect("admin").to_string();
    let admin3 = nodes[2]["admin"].as_str().expect("admin").to_string();

    // The admin subcommands against it.
    let (code, out, err) = strom(
        &admin1,
        &[
            "topic",
            "create",
            "cli-topic",
            "--partitions",
            "3",
            "--replication-factor",
            "2",
            "--config",
            "retention.ms=1000",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cli-topic") && out.contains("PARTITION"), "{out}");
    let (code, out, _) = strom(&admin3, &["topic", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("cli-topic") && l.split_whitespace().collect::<Vec<_>>() == ["cli-topic", "3", "2"]),
        "{out}"
    );
    let (code, out, _) = strom(&admin3, &["topic", "describe", "cli-topic", "--json"]);
    assert_eq!(code, 0);
    let described: Value = serde_json::from_str(&out).expect("--json is JSON");
    assert_eq!(described["configs"]["retention.ms"], "1000");
    let (code, out, _) = strom(&admin1, &["topic", "add-partitions", "cli-topic", "--count", "5"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).count(),
        5,
        "{out}"
    );
    let (code, _, err) =
        strom(&admin1, &["topic", "create", "cli-topic", "--partitions", "1", "--replication-factor", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("TOPIC_ALREADY_EXISTS"), "{err}");
    let (code, out, _) = strom(&admin1, &["cluster-info"]);
    assert_eq!(code, 0);
    assert!(out.contains("Controller:") && out.matches("active").count() == 3, "{out}");
    let (code, out, _) = strom(&admin1, &["cluster-info", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).expect("json")["brokers"].as_array().expect("b").len(), 3);
    let (code, out, _) = strom(&admin1, &["group", "list"]);
    assert_eq!((code, out.trim()), (0, "GROUP  STATE  MEMBERS  PROTOCOL"));
    let (code, _, err) = strom("127.0.0.1:1", &["topic", "list"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach"), "{err}");

    // Stop gracefully: every node exits.
    let pids: Vec<i64> = nodes.iter().map(|n| n["pid"].as_i64().expect("pid")).collect();
    let status = sup.terminate();
    assert!(status.success(), "{status}");
    assert!(pids.iter().all(|p| !pid_alive(*p)), "every node stopped");
    drop(sup);

    // Re-running on the same directory restarts the cluster with its data.
    std::fs::remove_file(dir.join("cluster.json.tmp")).ok();
    let mut sup = start_cluster(&dir, bases);
    let (code, out, _) = wait_for("the restarted cluster to serve the old topic", Duration::from_secs(60), || {
        let r = strom(&admin3, &["topic", "describe", "cli-topic", "--json"]);
        (r.0 == 0).then_some(r)
    });
    assert_eq!(code, 0);
    let described: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(described["partitions"].as_array().expect("p").len(), 5);
    let (code, _, err) = strom(&admin1, &["topic", "delete", "cli-topic"]);
    assert_eq!(code, 0, "{err}");

    // The restarted cluster stops as the first one did.
    sup.terminate();
}

#[test]
fn sigterm_during_startup_stops_the_nodes_too() {
    // SIGTERM as soon as the node processes exist, before the cluster is up: the
    // supervisor used to die of the signal then and leave its nodes running.
    let (_tmp, dir, _, mut sup) = fresh_cluster();
    wait_for("the nodes to start", Duration::from_secs(30), || (processes_in(&dir).len() == 3).then_some(()));
    sup.terminate();
}

#[test]
fn rerunning_cluster_with_more_nodes_grows_the_running_cluster() {
    let (_tmp, dir, bases, mut first) = fresh_cluster();
    wait_for("cluster.json", Duration::from_secs(60), || dir.join("cluster.json").exists().then_some(()));
    let admin1 = read_cluster_json(&dir)["nodes"][0]["admin"].as_str().expect("admin").to_string();

    // Nodes 4 and 5 take ports 3 and 4 above new bases (the first three are node 1-3's places).
    let avoid = [bases.0, bases.1, bases.2];
    let kafka = free_range(5, &avoid);
    let admin = free_range(5, &[bases.0, bases.1, bases.2, kafka]);
    let raft = free_range(5, &[bases.0, bases.1, bases.2, kafka, admin]);
    // Bases that put node 4's Kafka listener on node 1's admin port: refused, nothing started.
    let out = Command::new(BIN)
        .args(["cluster", "--nodes", "5", "--dir"])
        .arg(&dir)
        .args(["--kafka-base", &(bases.1 - 3).to_string(), "--admin-base", &admin.to_string()])
        .args(["--raft-base", &raft.to_string()])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("an existing node uses"), "{out:?}");
    let out = Command::new(BIN).args(["cluster", "--nodes", "2", "--dir"]).arg(&dir).output().expect("run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("decommission"), "shrinking is refused: {out:?}");

    let second = Command::new(BIN)
        .args(["cluster", "--nodes", "5", "--dir"])
        .arg(&dir)
        .args(["--kafka-base", &kafka.to_string(), "--admin-base", &admin.to_string()])
        .args(["--raft-base", &raft.to_string()])
        .env("RUST_LOG", "info,openraft=off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strom cluster");
    let mut second = Supervisor(second, dir.clone());
    let file = wait_for("cluster.json with 5 nodes", Duration::from_secs(60), || {
        let f = read_cluster_json(&dir);
        (f["nodes"].as_array().map_or(0, Vec::len) == 5).then_some(f)
    });
    let nodes = file["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes[3]["admin"], format!("127.0.0.1:{}", admin + 3));
    assert_eq!(nodes[4]["kafka"], format!("127.0.0.1:{}", kafka + 4));
    let (code, out, _) = strom(&admin1, &["cluster-info", "--json"]);
    assert_eq!(code, 0);
    let info: Value = serde_json::from_str(&out).expect("json");
    let active = info["brokers"].as_array().expect("brokers").iter().filter(|b| b["state"] == "active").count();
    assert_eq!(active, 5, "{info}");
    let observers: Vec<u64> =
        info["quorum"]["observers"].as_array().expect("o").iter().filter_map(Value::as_u64).collect();
    assert_eq!(observers, vec![4, 5], "{info}");

    // The second supervisor stops only the nodes it started.
    let pid = |i: usize| nodes[i]["pid"].as_i64().expect("pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(second.0.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("term");
    let status =
        wait_for("the second supervisor to exit", Duration::from_secs(40), || second.0.try_wait().ok().flatten());
    assert!(status.success(), "{status}");
    wait_for("nodes 4 and 5 to stop", Duration::from_secs(40), || {
        (!pid_alive(pid(3)) && !pid_alive(pid(4))).then_some(())
    });
    assert!((0..3).all(|i| pid_alive(pid(i))), "nodes 1-3 still run under the first supervisor");
    first.terminate();
}
