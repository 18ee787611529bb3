//! DescribeLogDirs (KIP-113, KIP-827): the one log directory of this broker,
//! the size of every partition replica it holds and how far each is behind
//! the high watermark, and (v4) the file system's total and usable bytes, so
//! `kafka-log-dirs --describe` works.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::node::NodeContext;

/// `(total, usable)` bytes of the file system holding `dir`; `(-1, -1)`
/// when it cannot be read.
fn file_system_bytes(dir: &std::path::Path) -> (i64, i64) {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => {
            let bytes = |blocks: u64| i64::try_from(blocks.saturating_mul(s.fragment_size())).unwrap_or(i64::MAX);
            (bytes(s.blocks()), bytes(s.blocks_available()))
        }
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot read the file system's size");
            (-1, -1)
        }
    }
}

pub fn handle(ctx: &NodeContext, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    // None: every partition; else the named ones this broker holds.
    let wanted: Option<HashSet<(String, i32)>> = request.topics.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.0.to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect()
    });
    let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for p in ctx.replicas.all() {
        if wanted.as_ref().is_some_and(|w| !w.contains(&(p.topic.clone(), p.index))) {
            continue;
        }
        let offsets = p.offsets();
        topics.entry(p.topic.clone()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(p.index)
                .with_partition_size(i64::try_from(p.size_bytes()).unwrap_or(i64::MAX))
                // Kafka's: how far the log end is behind the high watermark.
                .with_offset_lag((offsets.high_watermark - offsets.log_end_offset).max(0))
                .with_is_future_key(false),
        );
    }
    let dir = ctx.replicas.logs_dir();
    let (total, usable) = file_system_bytes(dir);
    let result = DescribeLogDirsResult::default()
        .with_log_dir(StrBytes::from_string(dir.display().to_string()))
        .with_total_bytes(total)
        .with_usable_bytes(usable)
        .with_topics(
            topics
                .into_iter()
                .map(|(name, mut partitions)| {
                    partitions.sort_by_key(|p| p.partition_index);
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        );
    DescribeLogDirsResponse::default().with_results(vec![result])
}
