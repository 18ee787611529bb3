//! The metadata quorum, the controller and the admin API on real clusters:
//! agreement, placement, controller failover, full restarts, observers and
//! snapshot catch-up, fencing of a stopped broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{wait_for, Cluster, FAST};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

fn leaders(topic: &Value) -> Vec<i64> {
    topic["partitions"].as_array().expect("partitions").iter().map(|p| p["leader"].as_i64().unwrap_or(-1)).collect()
}

/// The parts of a topic every node must agree on (offsets and liveness aside).
fn topic_metadata(topic: &Value) -> Value {
    let partitions: Vec<Value> = topic["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| json!([p["partition"], p["replicas"], p["leader"], p["isr"], p["leader_epoch"]]))
        .collect();
    json!({"name": topic["name"], "id": topic["topic_id"], "configs": topic["configs"], "partitions": partitions})
}

#[test]
fn three_nodes_agree_and_spread_a_topic() {
    let cluster = Cluster::start(3, 3, FAST);
    let controller = cluster.wait_active(3, Duration::from_secs(10));
    for id in 1..=3 {
        let view = cluster.cluster_view(id).expect("cluster view");
        assert_eq!(view["controller_id"].as_u64(), Some(controller));
        assert_eq!(view["quorum"]["voters"], json!([1, 2, 3]));
        let brokers = cluster.get(id, "/v1/brokers").expect("brokers").body;
        assert_eq!(brokers.as_array().expect("array").len(), 3);
        assert_eq!(brokers.as_array().expect("array").iter().filter(|b| b["is_controller"] == true).count(), 1);
    }

    let created = cluster.create_topic(2, "orders", 6, 2);
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["partitions"].as_array().expect("partitions").len(), 6);
    let on3 = wait_for("the topic on node 3", Duration::from_secs(5), || cluster.topic(3, "orders"));
    assert_eq!(topic_metadata(&on3), topic_metadata(&created.body));
    let mut led: BTreeMap<i64, usize> = BTreeMap::new();
    for l in leaders(&on3) {
        *led.entry(l).or_default() += 1;
    }
    assert_eq!(led, BTreeMap::from([(1, 2), (2, 2), (3, 2)]), "leaders spread evenly");
    for p in on3["partitions"].as_array().expect("partitions") {
        let replicas: BTreeSet<i64> = p["replicas"].as_array().expect("r").iter().filter_map(Value::as_i64).collect();
        assert_eq!(replicas.len(), 2);
        assert_eq!(p["state"], "online");
        assert_eq!(p["isr"], p["replicas"]);
    }
    // Each partition's offsets come from its leader, on whichever node that is.
    wait_for("offsets reported by every leader", Duration::from_secs(5), || {
        let t = cluster.topic(1, "orders")?;
        t["partitions"].as_array()?.iter().all(|p| p["high_watermark"] == 0 && p["log_end_offset"] == 0).then_some(())
    });
    let ready = cluster.get(1, "/ready").expect("ready");
    assert_eq!(ready.status, 200, "{}", ready.body);
    let metrics = cluster.get(1, "/metrics").expect("metrics").body;
    let text = metrics.as_str().expect("text");
    assert!(text.contains("strom_brokers{state=\"active\"} 3"), "{text}");
    assert!(text.contains("strom_quorum_term"), "{text}");
    assert!(text.contains("strom_http_requests_total{method=\"GET\""), "{text}");
    let spec = cluster.get(3, "/v1/openapi.json").expect("openapi").body;
    assert_eq!(spec["openapi"], "3.0.3");
    assert!(spec["paths"]["/v1/partitions/{topic}/{partition}/elect-leader"]["post"].is_object());
    assert_eq!(cluster.get(2, "/v1/groups").expect("groups").body, json!([]));
}

#[test]
fn controller_failover_after_sigkill() {
    let mut cluster = Cluster::start(3, 3, FAST);
    let old = cluster.wait_active(3, Duration::from_secs(10));
    let survivor = (1..=3).find(|&i| i != old).expect("another node");
    assert_eq!(cluster.create_topic(survivor, "before", 3, 3).status, 201);

    let killed_at = Instant::now();
    cluster.kill(old);
    let new =
        wait_for("a new controller", Duration::from_secs(10), || cluster.controller(survivor).filter(|c| *c != old));
    let failover = killed_at.elapsed();
    eprintln!("controller failover: {} -> {} in {:?}", old, new, failover);
    assert!(failover < Duration::from_secs(5), "failover took {failover:?}");

    let before = cluster.topic(survivor, "before").expect("topic survived");
    assert_eq!(before["partitions"].as_array().expect("p").len(), 3);
    // The dead broker is fenced and leads nothing once its session expires.
    wait_for("the killed broker fenced with no leaderships", Duration::from_secs(10), || {
        let t = cluster.topic(survivor, "before")?;
        let fenced = cluster
            .get(survivor, "/v1/brokers")?
            .body
            .as_array()?
            .iter()
            .any(|b| b["id"] == old && b["state"] == "fenced");
        (fenced && !leaders(&t).contains(&(old as i64))).then_some(())
    });
    let created = cluster.create_topic(survivor, "after", 2, 2);
    assert_eq!(created.status, 201, "{}", created.body);

    cluster.launch(old);
    cluster.wait_active(3, Duration::from_secs(20));
    let caught_up =
        wait_for("the restarted node to see the new topic", Duration::from_secs(10), || cluster.topic(old, "after"));
    assert_eq!(topic_metadata(&caught_up), topic_metadata(&cluster.topic(survivor, "after").expect("after")));
    assert_eq!(cluster.get(old, "/ready").expect("ready").status, 200);
}

#[test]
fn whole_cluster_restart_recovers_metadata_from_sled() {
    let mut cluster = Cluster::start(3, 3, FAST);
    assert_eq!(cluster.create_topic(1, "keep-1", 4, 3).status, 201);
    assert_eq!(cluster.create_topic(2, "keep-2", 1, 1).status, 201);
    let patched = cluster
        .send(
            3,
            "PATCH",
            "/v1/topics/keep-1/configs",
            Some(json!({"retention.ms": "3600000", "cleanup.policy": "compact"})),
        )
        .expect("patch");
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(cluster.create_topic(1, "gone", 1, 1).status, 201);
    assert_eq!(cluster.send(1, "DELETE", "/v1/topics/gone", None).expect("delete").status, 204);
    let cluster_id = cluster.cluster_view(1).expect("view")["cluster_id"].clone();
    let before: Vec<Value> =
        ["keep-1", "keep-2"].iter().map(|t| topic_metadata(&cluster.topic(1, t).expect("t"))).collect();

    for id in 1..=3 {
        assert!(cluster.stop(id).success(), "node {id} exits 0 on SIGTERM");
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    cluster.wait_active(3, Duration::from_secs(30));
    for id in 1..=3 {
        let view = cluster.cluster_view(id).expect("view");
        assert_eq!(view["cluster_id"], cluster_id);
        assert_eq!(cluster.topic_names(id).expect("names"), vec!["keep-1".to_string(), "keep-2".to_string()]);
        let t = cluster.topic(id, "keep-1").expect("keep-1");
        assert_eq!(t["configs"]["retention.ms"], "3600000");
        assert_eq!(t["configs"]["cleanup.policy"], "compact");
        assert_eq!(topic_metadata(&t)["id"], before[0]["id"]);
        assert_eq!(topic_metadata(&cluster.topic(id, "keep-2").expect("keep-2"))["id"], before[1]["id"]);
        // Every partition has a leader again once all brokers are back.
        wait_for("leaders after restart", Duration::from_secs(10), || {
            let t = cluster.topic(id, "keep-1")?;
            (!leaders(&t).contains(&-1)).then_some(())
        });
    }
}

#[test]
fn observers_follow_and_catch_up_through_a_snapshot() {
    let settings = [FAST, &["metadata.snapshot.interval.entries=20", "metadata.snapshot.keep.entries=2"]].concat();
    let mut cluster = Cluster::start(5, 3, &settings);
    let view = cluster.cluster_view(5).expect("view");
    assert_eq!(view["quorum"]["voters"], json!([1, 2, 3]));
    assert_eq!(view["quorum"]["observers"], json!([4, 5]));
    assert_eq!(
        cluster.create_topic(4, "via-observer", 2, 3).status,
        201,
        "writes through an observer reach the controller"
    );
    wait_for("the topic on observer 5", Duration::from_secs(5), || cluster.topic(5, "via-observer"));

    cluster.kill(5);
    for i in 0..40 {
        let r = cluster.create_topic(1 + (i % 4), &format!("bulk-{i}"), 1, 1);
        assert_eq!(r.status, 201, "{}", r.body);
    }
    cluster.launch(5);
    let names = wait_for("observer 5 to catch up", Duration::from_secs(30), || {
        cluster.topic_names(5).filter(|n| n.len() == 41)
    });
    assert!(names.contains(&"bulk-39".to_string()));
    wait_for("a snapshot installed on node 5", Duration::from_secs(10), || {
        cluster.node(5).log_text().contains("metadata snapshot installed").then_some(())
    });
    cluster.wait_active(5, Duration::from_secs(20));
}

#[test]
fn a_stopped_broker_is_fenced_and_comes_back() {
    let cluster = Cluster::start(3, 3, FAST);
    let controller = cluster.wait_active(3, Duration::from_secs(10));
    let victim = (1..=3).find(|&i| i != controller).expect("a non-controller");
    let watcher = (1..=3).find(|&i| i != victim).expect("a watcher");
    assert_eq!(cluster.create_topic(watcher, "fence-me", 6, 2).status, 201);
    let before = cluster.topic(watcher, "fence-me").expect("topic");
    assert!(leaders(&before).contains(&(victim as i64)), "the victim leads something");

    cluster.signal(victim, Signal::SIGSTOP);
    let after = wait_for("the stopped broker fenced and its partitions re-led", Duration::from_secs(10), || {
        let brokers = cluster.get(watcher, "/v1/brokers")?.body;
        let fenced = brokers.as_array()?.iter().any(|b| b["id"] == victim && b["state"] == "fenced");
        let t = cluster.topic(watcher, "fence-me")?;
        (fenced && !leaders(&t).contains(&(victim as i64))).then_some(t)
    });
    for (p_before, p_after) in
        before["partitions"].as_array().expect("p").iter().zip(after["partitions"].as_array().expect("p"))
    {
        assert!(!p_after["isr"].as_array().expect("isr").contains(&json!(victim)), "{p_after}");
        if p_before["leader"] == victim {
            assert_eq!(p_after["leader_epoch"].as_i64(), p_before["leader_epoch"].as_i64().map(|e| e + 1));
            assert_eq!(p_after["state"], "online");
        }
        if p_after["replicas"].as_array().expect("replicas").contains(&json!(victim)) {
            assert_eq!(p_after["replica_states"][victim.to_string()], "offline");
        }
    }
    cluster.signal(victim, Signal::SIGCONT);
    wait_for("the broker unfenced", Duration::from_secs(10), || {
        let brokers = cluster.get(watcher, "/v1/brokers")?.body;
        brokers.as_array()?.iter().any(|b| b["id"] == victim && b["state"] == "active").then_some(())
    });
}

#[test]
fn controlled_shutdown_moves_leadership_first() {
    let mut cluster = Cluster::start(3, 3, FAST);
    assert_eq!(cluster.create_topic(1, "moving", 3, 3).status, 201);
    let leaving: i64 = 2;
    assert!(cluster.stop(leaving as u64).success());
    let watcher = 1;
    let t = wait_for("leaderships moved off node 2", Duration::from_secs(10), || {
        let t = cluster.topic(watcher, "moving")?;
        (!leaders(&t).contains(&leaving)).then_some(t)
    });
    assert!(!leaders(&t).contains(&-1), "every partition still has a leader: {t}");
    // The preferred-leader election brings it back once the broker returns.
    cluster.launch(leaving as u64);
    cluster.wait_active(3, Duration::from_secs(20));
    let p = t["partitions"]
        .as_array()
        .expect("p")
        .iter()
        .find(|p| p["replicas"][0] == leaving)
        .expect("preferred 2")
        .clone();
    let path = format!("/v1/partitions/moving/{}/elect-leader", p["partition"]);
    let r = cluster.send(3, "POST", &path, Some(json!({"type": "preferred"}))).expect("elect");
    // Broker 2 left every ISR on shutdown: until it is back in one, the
    // election is refused with a reason; once it is, the balancer
    // (continuous mode) may have elected it already, and then none is needed.
    assert!(r.status == 200 || r.status == 409, "{} {}", r.status, r.body);
    if r.status == 409 && r.body["error"] == "ELECTION_NOT_NEEDED" {
        let now = cluster.topic(3, "moving").expect("topic");
        let led = now["partitions"].as_array().expect("p").iter().find(|q| q["partition"] == p["partition"]).cloned();
        assert_eq!(led.expect("partition")["leader"], leaving, "not needed: 2 leads it already");
    } else if r.status == 409 {
        assert_eq!(r.body["error"], "ELIGIBLE_LEADERS_NOT_AVAILABLE");
    } else {
        assert_eq!(r.body["leader"], leaving);
    }
}
