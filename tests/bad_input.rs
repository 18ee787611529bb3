//! Bad input gets a clear error: HTTP 4xx with a Kafka-style code and a
//! sentence, 503 in bounded time without a quorum, exit 2 for bad flags and
//! settings, a clear startup error for a corrupt or missing store.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_ports, Cluster, BIN, FAST};
use serde_json::json;

fn assert_error(r: &common::Response, status: u16, code: &str, needle: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.body["error"], code, "{}", r.body);
    let message = r.body["message"].as_str().expect("a message");
    assert!(message.contains(needle), "message {message:?} should mention {needle:?}");
}

#[test]
fn admin_api_rejects_bad_requests_with_codes() {
    let cluster = Cluster::start(1, 1, FAST);
    let post = |body: serde_json::Value| cluster.send(1, "POST", "/v1/topics", Some(body)).expect("answer");
    for name in ["", ".", "..", "bad name", "slash/topic", &"x".repeat(250)] {
        let r = post(json!({"name": name, "partitions": 1, "replication_factor": 1}));
        assert_error(&r, 400, "INVALID_TOPIC_EXCEPTION", "topic name");
    }
    assert_error(&post(json!({"name": "t", "partitions": 0, "replication_factor": 1})), 400, "INVALID_PARTITIONS", "0");
    assert_error(
        &post(json!({"name": "t", "partitions": -2, "replication_factor": 1})),
        400,
        "INVALID_PARTITIONS",
        "-2",
    );
    assert_error(
        &post(json!({"name": "t", "partitions": 1, "replication_factor": 3})),
        400,
        "INVALID_REPLICATION_FACTOR",
        "1 active broker",
    );
    assert_error(
        &post(json!({"name": "t", "partitions": 1, "replication_factor": 1, "configs": {"colour": "red"}})),
        400,
        "INVALID_CONFIG",
        "colour",
    );
    assert_error(
        &post(json!({"name": "t", "partitions": 1, "replication_factor": 1, "configs": {"retention.ms": "soon"}})),
        400,
        "INVALID_CONFIG",
        "retention.ms",
    );
    assert_error(&cluster.send_raw(1, "POST", "/v1/topics", "{\"name\": "), 400, "INVALID_REQUEST", "JSON");
    assert_error(&cluster.send_raw(1, "POST", "/v1/topics", "{\"nam\": \"x\"}"), 400, "INVALID_REQUEST", "JSON");

    assert_eq!(post(json!({"name": "t", "partitions": 2, "replication_factor": 1})).status, 201);
    assert_error(
        &post(json!({"name": "t", "partitions": 1, "replication_factor": 1})),
        409,
        "TOPIC_ALREADY_EXISTS",
        "t",
    );
    let grow =
        |count: i64| cluster.send(1, "POST", "/v1/topics/t/partitions", Some(json!({"count": count}))).expect("answer");
    assert_error(&grow(2), 400, "INVALID_PARTITIONS", "larger");
    assert_eq!(grow(4).status, 200);
    let patch = |body| cluster.send(1, "PATCH", "/v1/topics/t/configs", Some(body)).expect("answer");
    assert_error(&patch(json!({"segment.bytes": "1"})), 400, "INVALID_CONFIG", "segment.bytes");
    assert_error(&patch(json!({"nope": "1"})), 400, "INVALID_CONFIG", "nope");
    let elect = |body| cluster.send(1, "POST", "/v1/partitions/t/0/elect-leader", Some(body)).expect("answer");
    assert_error(&elect(json!({"type": "preferred"})), 409, "ELECTION_NOT_NEEDED", "already leads");
    assert_error(&elect(json!({"type": "sideways"})), 400, "INVALID_REQUEST", "preferred");
    let missing = cluster
        .send(1, "POST", "/v1/partitions/t/99/elect-leader", Some(json!({"type": "preferred"})))
        .expect("answer");
    assert_error(&missing, 404, "UNKNOWN_TOPIC_OR_PARTITION", "99");

    assert_error(
        &cluster.send(1, "DELETE", "/v1/topics/nope", None).expect("answer"),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
        "nope",
    );
    assert_error(&cluster.get(1, "/v1/topics/nope").expect("answer"), 404, "UNKNOWN_TOPIC_OR_PARTITION", "nope");
    assert_error(&cluster.get(1, "/v1/groups/g").expect("answer"), 404, "GROUP_ID_NOT_FOUND", "g");
    // Nothing invalid was created.
    assert_eq!(cluster.topic_names(1).expect("names"), vec!["t".to_string()]);
}

#[test]
fn no_quorum_is_503_in_bounded_time() {
    let mut cluster = Cluster::start(3, 3, FAST);
    cluster.kill(2);
    cluster.kill(3);
    let started = Instant::now();
    let r = cluster.create_topic(1, "stuck", 1, 1);
    let took = started.elapsed();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(["NOT_CONTROLLER", "REQUEST_TIMED_OUT"].contains(&r.body["error"].as_str().expect("code")), "{}", r.body);
    assert!(took < Duration::from_secs(12), "answered after {took:?}");
    // Reads are still served from the local image.
    assert_eq!(cluster.get(1, "/v1/topics").expect("reads").status, 200);
}

fn serve(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("serve").args(args).output().expect("run strom")
}

#[test]
fn bad_flags_and_settings_exit_2_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let cases: &[(&[&str], &str)] = &[
        (&["--node-id", "0", "--data-dir", d], "--node-id"),
        (&["--data-dir", d], "--node-id"),
        (&["--node-id", "1", "--data-dir", d, "--set", "no.such.setting=1"], "no.such.setting"),
        (&["--node-id", "1", "--data-dir", d, "--set", "broker.session.timeout.ms=soon"], "broker.session.timeout.ms"),
        (&["--node-id", "1", "--data-dir", d, "--quorum", "1@nowhere"], "--quorum"),
        (&["--node-id", "1", "--data-dir", d, "--kafka", "localhost"], "--kafka"),
        (&["--node-id", "1", "--data-dir", d, "--config", "/nonexistent/strom.toml"], "--config"),
    ];
    for (args, needle) in cases {
        let out = serve(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: stderr {stderr:?} should name {needle}");
    }
    let out = Command::new(BIN).args(["cluster", "--nodes", "0", "--dir", d]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nodes"));
}

fn start_error(data_dir: &std::path::Path) -> String {
    let ports = free_ports(3);
    let out = Command::new(BIN)
        .args(["serve", "--node-id", "1", "--data-dir"])
        .arg(data_dir)
        .args(["--kafka", &format!("127.0.0.1:{}", ports[0])])
        .args(["--admin", &format!("127.0.0.1:{}", ports[1])])
        .args(["--raft", &format!("127.0.0.1:{}", ports[2])])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn corrupt_or_missing_store_is_a_clear_startup_error() {
    let mut cluster = Cluster::start(1, 1, FAST);
    assert_eq!(cluster.create_topic(1, "x", 1, 1).status, 201);
    assert!(cluster.stop(1).success());
    let data_dir = cluster.node(1).data_dir.clone();

    let copy = cluster.path().join("copy");
    std::fs::create_dir(&copy).expect("mkdir");
    std::fs::copy(data_dir.join("meta.properties"), copy.join("meta.properties")).expect("copy");
    let stderr = start_error(&copy);
    assert!(stderr.contains("metadata store `meta/` is missing"), "{stderr}");

    // Overwrite sled's data files with garbage.
    for entry in walk(&data_dir.join("meta")) {
        std::fs::write(&entry, vec![0xA5u8; 4096]).expect("corrupt");
    }
    let stderr = start_error(&data_dir);
    assert!(stderr.contains("metadata store"), "{stderr}");

    std::fs::write(data_dir.join("meta.properties"), "node.id=7\n").expect("write");
    let stderr = start_error(&data_dir);
    assert!(stderr.contains("belongs to node 7"), "{stderr}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}
