//! Topic decisions (pure): validate a create, delete, partition add or config
//! change against the image and return the records that carry it out.
//!
//! Nothing here mutates state; the controller proposes what these return.

use std::collections::BTreeMap;

use strom_raft::{ConfigResource, MetadataImage, MetadataRecord, TopicId};

use super::placement::{place_replicas, Racks};
use crate::config::{topic_def, validate};
use crate::error::{ApiError, ErrorCode};

/// Kafka's limit on topic name length.
pub const TOPIC_NAME_MAX_CHARS: usize = 249;
/// More partitions than this in one topic is refused.
pub const PARTITIONS_MAX: i64 = 10_000;

/// Kafka's topic name rules: `[a-zA-Z0-9._-]`, 1–249 chars, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), ApiError> {
    let bad = |why: String| Err(ApiError::new(ErrorCode::InvalidTopicException, why));
    if name.is_empty() {
        return bad("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return bad(format!("topic name cannot be `{name}`"));
    }
    if name.len() > TOPIC_NAME_MAX_CHARS {
        return bad(format!("topic name is {} characters long, the limit is {TOPIC_NAME_MAX_CHARS}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return bad(format!("topic name `{name}` has the illegal character {c:?}; only [a-zA-Z0-9._-] are allowed"));
    }
    Ok(())
}

/// Validates topic config overrides; returns them normalized.
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ApiError> {
    configs
        .iter()
        .map(|(k, v)| {
            let def = topic_def(k)
                .ok_or_else(|| ApiError::new(ErrorCode::InvalidConfig, format!("unknown topic config `{k}`")))?;
            let v = validate(def, k, v).map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
            Ok((k.clone(), v))
        })
        .collect()
}

/// What a topic create needs besides the request: the caller's random choices.
#[derive(Debug, Clone, Copy)]
pub struct Randomness {
    pub topic_id: TopicId,
    pub placement_start: usize,
}

pub fn create_topic(
    image: &MetadataImage,
    name: &str,
    partitions: i64,
    replication_factor: i64,
    configs: &BTreeMap<String, String>,
    random: Randomness,
) -> Result<Vec<MetadataRecord>, ApiError> {
    validate_topic_name(name)?;
    if image.topics.contains_key(name) {
        return Err(ApiError::new(ErrorCode::TopicAlreadyExists, format!("topic `{name}` already exists")));
    }
    if !(1..=PARTITIONS_MAX).contains(&partitions) {
        return Err(ApiError::new(
            ErrorCode::InvalidPartitions,
            format!("partitions must be between 1 and {PARTITIONS_MAX}, got {partitions}"),
        ));
    }
    let brokers = image.active_brokers();
    if replication_factor < 1 || replication_factor as usize > brokers.len() {
        return Err(ApiError::new(
            ErrorCode::InvalidReplicationFactor,
            format!("replication factor {replication_factor} is not possible with {} active broker(s)", brokers.len()),
        ));
    }
    let configs = validate_configs(configs)?;
    let placed = place_replicas(
        &brokers,
        &Racks::of_image(image),
        0,
        partitions as i32,
        replication_factor as usize,
        random.placement_start,
    );
    Ok(topic_records(image, name, random.topic_id, placed, configs))
}

/// A topic's records: the topic, each partition led by its first active
/// replica with the active ones in sync, and its configs.
fn topic_records(
    image: &MetadataImage,
    name: &str,
    topic_id: TopicId,
    placed: Vec<Vec<i32>>,
    configs: BTreeMap<String, String>,
) -> Vec<MetadataRecord> {
    let mut records = vec![MetadataRecord::Topic { name: name.to_string(), topic_id }];
    records.extend(placed.into_iter().enumerate().map(|(p, replicas)| {
        let isr: Vec<i32> = replicas.iter().copied().filter(|b| image.is_active(*b)).collect();
        MetadataRecord::Partition { topic_id, partition: p as i32, leader: isr.first().copied(), isr, replicas }
    }));
    records.extend(configs.into_iter().map(|(key, value)| MetadataRecord::Config {
        resource: ConfigResource::Topic(name.to_string()),
        key,
        value: Some(value),
    }));
    records
}

/// A topic create with the replicas of every partition given (CreateTopics'
/// manual assignment), checked as Kafka's controller checks it: partitions
/// 0..n in order, each with a non-empty list of distinct registered brokers
/// at least one of which is active, all of one length. Each partition is led
/// by its first active replica; the active ones are its ISR.
pub fn create_topic_assigned(
    image: &MetadataImage,
    name: &str,
    assignment: &[Vec<i32>],
    configs: &BTreeMap<String, String>,
    topic_id: TopicId,
) -> Result<Vec<MetadataRecord>, ApiError> {
    validate_topic_name(name)?;
    if image.topics.contains_key(name) {
        return Err(ApiError::new(ErrorCode::TopicAlreadyExists, format!("topic `{name}` already exists")));
    }
    if assignment.is_empty() || assignment.len() as i64 > PARTITIONS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidPartitions,
            format!("partitions must be between 1 and {PARTITIONS_MAX}, got {}", assignment.len()),
        ));
    }
    let bad = |m: String| ApiError::new(ErrorCode::InvalidReplicaAssignment, m);
    for (p, replicas) in assignment.iter().enumerate() {
        if replicas.is_empty() {
            return Err(bad(format!("partition {p} has an empty replica list")));
        }
        if replicas.len() != assignment[0].len() {
            return Err(bad(format!(
                "partition {p} has {} replica(s), but partition 0 has {}: every partition needs the same number",
                replicas.len(),
                assignment[0].len()
            )));
        }
        if let Some(b) = replicas.iter().find(|b| replicas.iter().filter(|x| x == b).count() > 1) {
            return Err(bad(format!("partition {p} names broker {b} twice")));
        }
        if let Some(b) = replicas.iter().find(|b| !image.brokers.contains_key(b)) {
            return Err(bad(format!("partition {p} names broker {b}, which is not registered")));
        }
        if !replicas.iter().any(|b| image.is_active(*b)) {
            return Err(bad(format!("every broker named for partition {p} is fenced")));
        }
    }
    let configs = validate_configs(configs)?;
    Ok(topic_records(image, name, topic_id, assignment.to_vec(), configs))
}

fn unknown_topic(name: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic `{name}` does not exist"))
}

pub fn delete_topic(image: &MetadataImage, name: &str) -> Result<Vec<MetadataRecord>, ApiError> {
    let topic = image.topics.get(name).ok_or_else(|| unknown_topic(name))?;
    Ok(vec![MetadataRecord::RemoveTopic { topic_id: topic.topic_id }])
}

pub fn create_partitions(
    image: &MetadataImage,
    name: &str,
    count: i64,
    placement_start: usize,
) -> Result<Vec<MetadataRecord>, ApiError> {
    let topic = image.topics.get(name).ok_or_else(|| unknown_topic(name))?;
    let current = topic.partitions.len() as i64;
    if count <= current {
        return Err(ApiError::new(
            ErrorCode::InvalidPartitions,
            format!("topic `{name}` has {current} partitions; the new count {count} must be larger"),
        ));
    }
    if count > PARTITIONS_MAX {
        return Err(ApiError::new(ErrorCode::InvalidPartitions, format!("at most {PARTITIONS_MAX} partitions")));
    }
    let rf = topic.partitions.values().next().map_or(1, |p| p.replicas.len());
    let brokers = image.active_brokers();
    if rf > brokers.len() {
        return Err(ApiError::new(
            ErrorCode::InvalidReplicationFactor,
            format!("the topic's replication factor {rf} is more than the {} active broker(s)", brokers.len()),
        ));
    }
    let placed = place_replicas(
        &brokers,
        &Racks::of_image(image),
        current as i32,
        (count - current) as i32,
        rf,
        placement_start,
    );
    Ok(placed
        .into_iter()
        .enumerate()
        .map(|(i, replicas)| MetadataRecord::Partition {
            topic_id: topic.topic_id,
            partition: current as i32 + i as i32,
            leader: replicas.first().copied(),
            isr: replicas.clone(),
            replicas,
        })
        .collect())
}

pub fn alter_configs(
    image: &MetadataImage,
    name: &str,
    changes: &BTreeMap<String, Option<String>>,
) -> Result<Vec<MetadataRecord>, ApiError> {
    if !image.topics.contains_key(name) {
        return Err(unknown_topic(name));
    }
    let mut records = Vec::new();
    for (key, value) in changes {
        let def = topic_def(key)
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidConfig, format!("unknown topic config `{key}`")))?;
        let value = match value {
            Some(v) => Some(validate(def, key, v).map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?),
            None => None,
        };
        records.push(MetadataRecord::Config {
            resource: ConfigResource::Topic(name.to_string()),
            key: key.clone(),
            value,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::image_with_brokers;

    fn cluster(brokers: i32) -> MetadataImage {
        let all: Vec<i32> = (1..=brokers).collect();
        image_with_brokers(all.clone(), &all)
    }

    const R: Randomness = Randomness { topic_id: TopicId(9), placement_start: 0 };

    #[test]
    fn topic_names() {
        for ok in ["a", "orders.v1", "A_b-c", &"x".repeat(249)] {
            assert!(validate_topic_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "has space", "slash/", "ü", &"x".repeat(250)] {
            assert_eq!(validate_topic_name(bad).expect_err(bad).code, ErrorCode::InvalidTopicException);
        }
    }

    #[test]
    fn a_manual_assignment_is_kept_and_checked_as_kafka_checks_it() {
        // 1, 2, 3 registered; 3 fenced.
        let mut img = image_with_brokers([1, 2, 3], &[1, 2]);
        let none = BTreeMap::new();
        let records = create_topic_assigned(&img, "m", &[vec![3, 1], vec![2, 3]], &none, TopicId(5)).expect("create");
        for r in &records {
            img.apply(r).expect("apply");
        }
        let t = &img.topics["m"];
        let (p0, p1) = (&t.partitions[&0], &t.partitions[&1]);
        assert_eq!((p0.replicas.clone(), p0.leader, p0.isr.clone()), (vec![3, 1], Some(1), vec![1]));
        assert_eq!((p1.replicas.clone(), p1.leader, p1.isr.clone()), (vec![2, 3], Some(2), vec![2]));
        let code = |a: &[Vec<i32>]| create_topic_assigned(&img, "n", a, &none, TopicId(6)).expect_err("bad").code;
        assert_eq!(code(&[vec![]]), ErrorCode::InvalidReplicaAssignment, "empty");
        assert_eq!(code(&[vec![1, 1]]), ErrorCode::InvalidReplicaAssignment, "twice");
        assert_eq!(code(&[vec![1, 4]]), ErrorCode::InvalidReplicaAssignment, "not registered");
        assert_eq!(code(&[vec![3]]), ErrorCode::InvalidReplicaAssignment, "all fenced");
        assert_eq!(code(&[vec![1, 2], vec![1]]), ErrorCode::InvalidReplicaAssignment, "replica counts differ");
        assert_eq!(code(&[]), ErrorCode::InvalidPartitions);
        assert_eq!(
            create_topic_assigned(&img, "m", &[vec![1]], &none, TopicId(7)).expect_err("dup").code,
            ErrorCode::TopicAlreadyExists
        );
    }

    #[test]
    fn create_builds_topic_partitions_and_configs() {
        let mut img = cluster(3);
        let configs = BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]);
        let records = create_topic(&img, "t", 3, 2, &configs, R).expect("create");
        for r in &records {
            img.apply(r).expect("apply");
        }
        let t = &img.topics["t"];
        assert_eq!(t.partitions.len(), 3);
        assert!(t.partitions.values().all(|p| p.replicas.len() == 2 && p.isr == p.replicas));
        assert_eq!(t.configs["retention.ms"], "60000");
        assert_eq!(
            create_topic(&img, "t", 1, 1, &BTreeMap::new(), R).expect_err("dup").code,
            ErrorCode::TopicAlreadyExists
        );
    }

    #[test]
    fn create_rejects_bad_requests() {
        let img = cluster(2);
        let none = BTreeMap::new();
        assert_eq!(create_topic(&img, "t", 0, 1, &none, R).expect_err("0").code, ErrorCode::InvalidPartitions);
        assert_eq!(create_topic(&img, "t", -3, 1, &none, R).expect_err("-3").code, ErrorCode::InvalidPartitions);
        assert_eq!(create_topic(&img, "t", 1, 3, &none, R).expect_err("rf").code, ErrorCode::InvalidReplicationFactor);
        assert_eq!(create_topic(&img, "t", 1, 0, &none, R).expect_err("rf0").code, ErrorCode::InvalidReplicationFactor);
        let bad = BTreeMap::from([("retention.ms".to_string(), "soon".to_string())]);
        assert_eq!(create_topic(&img, "t", 1, 1, &bad, R).expect_err("cfg").code, ErrorCode::InvalidConfig);
        let unknown = BTreeMap::from([("colour".to_string(), "red".to_string())]);
        let e = create_topic(&img, "t", 1, 1, &unknown, R).expect_err("unknown");
        assert!(e.message.contains("colour"));
    }

    #[test]
    fn partitions_only_grow() {
        let mut img = cluster(3);
        for r in create_topic(&img, "t", 2, 3, &BTreeMap::new(), R).expect("create") {
            img.apply(&r).expect("apply");
        }
        assert_eq!(create_partitions(&img, "t", 2, 0).expect_err("same").code, ErrorCode::InvalidPartitions);
        for r in create_partitions(&img, "t", 5, 0).expect("grow") {
            img.apply(&r).expect("apply");
        }
        assert_eq!(img.topics["t"].partitions.len(), 5);
        assert!(img.topics["t"].partitions.values().all(|p| p.replicas.len() == 3));
        assert_eq!(
            create_partitions(&img, "nope", 5, 0).expect_err("unknown").code,
            ErrorCode::UnknownTopicOrPartition
        );
    }

    #[test]
    fn config_changes_set_and_reset() {
        let mut img = cluster(1);
        for r in create_topic(&img, "t", 1, 1, &BTreeMap::new(), R).expect("create") {
            img.apply(&r).expect("apply");
        }
        let set = BTreeMap::from([("flush.ms".to_string(), Some("100".to_string()))]);
        for r in alter_configs(&img, "t", &set).expect("set") {
            img.apply(&r).expect("apply");
        }
        assert_eq!(img.topics["t"].configs["flush.ms"], "100");
        let reset = BTreeMap::from([("flush.ms".to_string(), None)]);
        for r in alter_configs(&img, "t", &reset).expect("reset") {
            img.apply(&r).expect("apply");
        }
        assert!(img.topics["t"].configs.is_empty());
        let bad = BTreeMap::from([("flush.ms".to_string(), Some("-5".to_string()))]);
        assert_eq!(alter_configs(&img, "t", &bad).expect_err("bad").code, ErrorCode::InvalidConfig);
    }
}
