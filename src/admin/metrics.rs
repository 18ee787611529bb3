//! Node metrics in Prometheus text format: the quorum (term, commit index,
//! leader changes), brokers by state, topics and partitions by state, and
//! admin API request counts and latencies per route.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use strom_raft::image::PartitionState;
use strom_raft::{BrokerState, Quorum};

/// Latency histogram bucket bounds, seconds.
const BUCKETS_S: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub leader_changes: AtomicU64,
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
}

impl Metrics {
    /// Records one admin API request.
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((method.to_string(), route.to_string(), status)).or_insert(0) += 1;
        drop(requests);
        let mut latency = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        let h = latency.entry(route.to_string()).or_default();
        let s = elapsed.as_secs_f64();
        for (i, bound) in BUCKETS_S.iter().enumerate() {
            if s <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum_s += s;
    }

    /// Renders every metric.
    pub fn render(&self, quorum: &Quorum) -> String {
        let mut out = String::new();
        let m = quorum.metrics();
        let image = quorum.image();
        let gauge = |out: &mut String, name: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        gauge(&mut out, "strom_quorum_term", "Current metadata quorum term.", m.current_term.to_string());
        gauge(
            &mut out,
            "strom_quorum_commit_index",
            "Metadata log index applied on this node.",
            m.last_applied.map_or(0, |l| l.index).to_string(),
        );
        gauge(
            &mut out,
            "strom_quorum_last_log_index",
            "Last metadata log index stored here.",
            m.last_log_index.unwrap_or(0).to_string(),
        );
        gauge(&mut out, "strom_quorum_is_leader", "1 on the controller.", u8::from(quorum.is_leader()).to_string());
        let _ = writeln!(
            out,
            "# HELP strom_quorum_leader_changes_total Leader changes seen by this node.\n# TYPE strom_quorum_leader_changes_total counter\nstrom_quorum_leader_changes_total {}",
            self.leader_changes.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP strom_brokers Registered brokers by state.\n# TYPE strom_brokers gauge");
        for state in [BrokerState::Active, BrokerState::Fenced, BrokerState::ShuttingDown] {
            let n = image.brokers.values().filter(|b| b.state == state).count();
            let _ = writeln!(out, "strom_brokers{{state=\"{}\"}} {n}", state.as_str());
        }
        gauge(&mut out, "strom_topics", "Topics.", image.topics.len().to_string());
        let _ = writeln!(out, "# HELP strom_partitions Partitions by state.\n# TYPE strom_partitions gauge");
        for state in [PartitionState::New, PartitionState::Online, PartitionState::Offline] {
            let n = image
                .topics
                .values()
                .flat_map(|t| t.partitions.values())
                .filter(|p| image.partition_state(p) == state)
                .count();
            let _ = writeln!(out, "strom_partitions{{state=\"{}\"}} {n}", state.as_str());
        }
        self.render_http(&mut out);
        out
    }

    fn render_http(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP strom_http_requests_total Admin API requests.\n# TYPE strom_http_requests_total counter"
        );
        for ((method, route, status), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "strom_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP strom_http_request_duration_seconds Admin API latency.\n# TYPE strom_http_request_duration_seconds histogram"
        );
        for (route, h) in self.latency.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            for (bound, n) in BUCKETS_S.iter().zip(h.counts) {
                let _ =
                    writeln!(out, "strom_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "strom_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "strom_http_request_duration_seconds_sum{{route=\"{route}\"}} {}", h.sum_s);
            let _ = writeln!(out, "strom_http_request_duration_seconds_count{{route=\"{route}\"}} {}", h.count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe("GET", "/v1/topics", 200, Duration::from_millis(3));
        m.observe("GET", "/v1/topics", 200, Duration::from_millis(30));
        let mut out = String::new();
        m.render_http(&mut out);
        assert!(
            out.contains("strom_http_requests_total{method=\"GET\",route=\"/v1/topics\",status=\"200\"} 2"),
            "{out}"
        );
        assert!(out.contains("le=\"0.005\"} 1"), "{out}");
        assert!(out.contains("le=\"0.05\"} 2"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 2"), "{out}");
    }
}
