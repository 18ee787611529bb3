//! Topic configs: Kafka's whole list (`TopicConfig`, Kafka 3.x/4.x), each
//! either inherited from a broker setting (its synonym, so a dynamic broker
//! default changes it) or with a default of its own, and whether Strom acts
//! on it. A config Strom accepts but ignores says why, so DescribeConfigs
//! and the README can tell the user.
//!
//! Called by the controller (validation before proposing a Config record),
//! by the replica manager (a topic's log settings) and by DescribeConfigs.
//! List configs (`cleanup.policy`, the throttled-replica lists) also take
//! IncrementalAlterConfigs' APPEND and SUBTRACT, computed here.

use super::{broker_def, def, Kind, SettingDef};

/// Whether Strom acts on a topic config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Applied,
    /// Accepted, validated and stored, but not used; the reason why.
    Ignored(&'static str),
}

/// Where a topic config's type and default come from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// The broker setting it overrides (its synonym).
    Broker(&'static str),
    /// No broker synonym: the config's own definition.
    Own(SettingDef),
}

#[derive(Debug, Clone, Copy)]
pub struct TopicConfigDef {
    pub name: &'static str,
    pub source: Source,
    pub effect: Effect,
}

const fn applied(name: &'static str, broker: &'static str) -> TopicConfigDef {
    TopicConfigDef { name, source: Source::Broker(broker), effect: Effect::Applied }
}

const fn ignored(name: &'static str, broker: &'static str, why: &'static str) -> TopicConfigDef {
    TopicConfigDef { name, source: Source::Broker(broker), effect: Effect::Ignored(why) }
}

const fn own(def: SettingDef, effect: Effect) -> TopicConfigDef {
    TopicConfigDef { name: def.name, source: Source::Own(def), effect }
}

const NO_RECOMPRESSION: &str =
    "Strom stores batches as the producer compressed them (as with compression.type=producer); it never recompresses";
const NO_TIERED_STORAGE: &str = "Strom has no tiered storage";
const NO_THROTTLES: &str = "Strom has no replication quotas";

/// Kafka's topic configs, in `TopicConfig`'s order.
pub const TOPIC_CONFIGS: &[TopicConfigDef] = &[
    applied("cleanup.policy", "log.cleanup.policy"),
    ignored("compression.type", "compression.type", NO_RECOMPRESSION),
    ignored("compression.gzip.level", "compression.gzip.level", NO_RECOMPRESSION),
    ignored("compression.lz4.level", "compression.lz4.level", NO_RECOMPRESSION),
    ignored("compression.zstd.level", "compression.zstd.level", NO_RECOMPRESSION),
    applied("delete.retention.ms", "log.cleaner.delete.retention.ms"),
    ignored(
        "file.delete.delay.ms",
        "log.segment.delete.delay.ms",
        "Strom deletes a segment's files as soon as retention removes it",
    ),
    applied("flush.messages", "log.flush.interval.messages"),
    applied("flush.ms", "log.flush.interval.ms"),
    own(
        def(
            "follower.replication.throttled.replicas",
            Some(""),
            Kind::ThrottledReplicas,
            "replicas throttled on followers",
        ),
        Effect::Ignored(NO_THROTTLES),
    ),
    applied("index.interval.bytes", "log.index.interval.bytes"),
    own(
        def(
            "leader.replication.throttled.replicas",
            Some(""),
            Kind::ThrottledReplicas,
            "replicas throttled on leaders",
        ),
        Effect::Ignored(NO_THROTTLES),
    ),
    ignored("local.retention.bytes", "log.local.retention.bytes", NO_TIERED_STORAGE),
    ignored("local.retention.ms", "log.local.retention.ms", NO_TIERED_STORAGE),
    applied("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms"),
    applied("max.message.bytes", "message.max.bytes"),
    ignored(
        "message.downconversion.enable",
        "log.message.downconversion.enable",
        "Strom serves only v2 record batches (Fetch v4+) and never down-converts",
    ),
    ignored("message.format.version", "log.message.format.version", "Strom always writes the v2 record batch format"),
    applied("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms"),
    applied("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms"),
    applied("message.timestamp.difference.max.ms", "log.message.timestamp.difference.max.ms"),
    applied("message.timestamp.type", "log.message.timestamp.type"),
    applied("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio"),
    applied("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms"),
    applied("min.insync.replicas", "min.insync.replicas"),
    ignored("preallocate", "log.preallocate", "Strom's segment files grow as batches are written"),
    own(
        def("remote.storage.enable", Some("false"), Kind::Choice(&["false"]), "tiered storage for this topic"),
        Effect::Ignored("Strom has no tiered storage, so only false is accepted (Kafka refuses true without it too)"),
    ),
    applied("retention.bytes", "log.retention.bytes"),
    applied("retention.ms", "log.retention.ms"),
    applied("segment.bytes", "log.segment.bytes"),
    applied("segment.index.bytes", "log.index.size.max.bytes"),
    ignored("segment.jitter.ms", "log.roll.jitter.ms", "Strom rolls segments at exactly segment.ms"),
    applied("segment.ms", "log.roll.ms"),
    applied("unclean.leader.election.enable", "unclean.leader.election.enable"),
    own(
        def("remote.log.copy.disable", Some("false"), Kind::Bool, "stop copying segments to tiered storage"),
        Effect::Ignored(NO_TIERED_STORAGE),
    ),
    own(
        def("remote.log.delete.on.disable", Some("false"), Kind::Bool, "delete tiered segments when disabled"),
        Effect::Ignored(NO_TIERED_STORAGE),
    ),
];

pub fn topic_config(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

impl TopicConfigDef {
    /// The definition that validates this config and gives its default.
    pub fn setting(&'static self) -> Option<&'static SettingDef> {
        match &self.source {
            Source::Broker(b) => broker_def(b),
            Source::Own(d) => Some(d),
        }
    }

    /// The broker setting this config overrides, if any.
    pub fn synonym(&self) -> Option<&'static str> {
        match self.source {
            Source::Broker(b) => Some(b),
            Source::Own(_) => None,
        }
    }
}

/// The definition behind a topic-level key (validated like its broker setting).
pub fn topic_def(name: &str) -> Option<&'static SettingDef> {
    topic_config(name).and_then(TopicConfigDef::setting)
}

/// The items of a list value (`a,b`; blanks dropped).
pub fn list_items(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// IncrementalAlterConfigs APPEND: `current` plus the items of `value` it
/// does not hold yet (Kafka adds only missing items).
pub fn append_items(current: &str, value: &str) -> String {
    let mut items = list_items(current);
    for item in list_items(value) {
        if !items.contains(&item) {
            items.push(item);
        }
    }
    items.join(",")
}

/// IncrementalAlterConfigs SUBTRACT: `current` without the items of `value`.
pub fn subtract_items(current: &str, value: &str) -> String {
    let removed = list_items(value);
    list_items(current).into_iter().filter(|i| !removed.contains(i)).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate;

    /// Kafka 3.x/4.x `TopicConfig`, every name.
    const KAFKA_TOPIC_CONFIGS: &[&str] = &[
        "cleanup.policy",
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
    ];

    #[test]
    fn every_kafka_topic_config_is_known_with_a_default() {
        for name in KAFKA_TOPIC_CONFIGS {
            let d = topic_def(name).unwrap_or_else(|| panic!("{name} unknown"));
            let default = d.default.unwrap_or_else(|| match *name {
                "flush.messages" | "flush.ms" => "1",
                _ => panic!("{name} has no default"),
            });
            validate(d, name, default).unwrap_or_else(|e| panic!("{name} default {default}: {e}"));
        }
        assert_eq!(TOPIC_CONFIGS.len(), KAFKA_TOPIC_CONFIGS.len());
    }

    #[test]
    fn kafka_types_and_bounds() {
        let check = |k: &str, v: &str| validate(topic_def(k).expect("known"), k, v);
        assert_eq!(check("compression.type", "zstd").expect("ok"), "zstd");
        assert!(check("compression.type", "brotli").is_err());
        assert!(check("compression.gzip.level", "-1").is_ok());
        assert!(check("compression.gzip.level", "0").is_err());
        assert!(check("compression.gzip.level", "10").is_err());
        assert!(check("compression.lz4.level", "18").is_err());
        assert!(check("compression.zstd.level", "-131072").is_ok());
        assert!(check("message.timestamp.type", "LogAppendTime").is_ok());
        assert!(check("message.timestamp.type", "WallClock").is_err());
        assert!(check("min.cleanable.dirty.ratio", "0.25").is_ok());
        assert!(check("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(check("min.cleanable.dirty.ratio", "NaN").is_err());
        assert!(check("delete.retention.ms", "-1").is_err());
        assert!(check("segment.index.bytes", "3").is_err());
        assert!(check("local.retention.ms", "-2").is_ok());
        assert!(check("local.retention.ms", "-3").is_err());
        assert!(check("max.compaction.lag.ms", "0").is_err());
        assert!(check("preallocate", "yes").is_err());
        assert!(check("remote.storage.enable", "true").is_err());
        assert!(check("message.format.version", "3.0-IV1").is_ok());
        assert!(check("message.format.version", "2.8").is_ok());
        assert!(check("message.format.version", "latest").is_err());
        assert_eq!(check("cleanup.policy", " compact , delete").expect("ok"), "compact,delete");
        assert!(check("cleanup.policy", "compact,shred").is_err());
        assert!(check("cleanup.policy", "").is_err());
        assert!(check("leader.replication.throttled.replicas", "0:1, 1:2").is_ok());
        assert!(check("leader.replication.throttled.replicas", "*").is_ok());
        assert!(check("leader.replication.throttled.replicas", "").is_ok());
        assert!(check("follower.replication.throttled.replicas", "0-1").is_err());
    }

    #[test]
    fn append_and_subtract_lists() {
        assert_eq!(append_items("delete", "compact"), "delete,compact");
        assert_eq!(append_items("delete", "delete"), "delete");
        assert_eq!(append_items("", "0:1,1:2"), "0:1,1:2");
        assert_eq!(subtract_items("delete,compact", "delete"), "compact");
        assert_eq!(subtract_items("0:1,1:2", "0:1,7:7"), "1:2");
    }
}
