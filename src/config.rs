//! Settings by their Kafka names: the broker settings of CONTRACT §4, their
//! topic-level overrides, and validation with errors that name the key.
//!
//! A setting comes from (lowest first) its default, the `--config` TOML file,
//! then `--set KEY=VALUE`. Unknown keys and bad values are rejected with a
//! [`SettingError`] naming the key; the CLI turns that into exit code 2.

use std::collections::BTreeMap;
use std::path::Path;

/// What values a setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Int { min: i64, max: i64 },
    Bool,
    Choice(&'static [&'static str]),
}

/// One known setting.
#[derive(Debug, Clone, Copy)]
pub struct SettingDef {
    pub name: &'static str,
    /// `None`: unset unless given (for example no forced flush).
    pub default: Option<&'static str>,
    pub kind: Kind,
    pub doc: &'static str,
}

const I32_MAX: i64 = i32::MAX as i64;

const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

/// Every broker setting Strom knows, Kafka's names and (unless stated) defaults.
pub const BROKER_SETTINGS: &[SettingDef] = &[
    SettingDef {
        name: "num.partitions",
        default: Some("1"),
        kind: int(1, 10_000),
        doc: "partitions of auto-created topics",
    },
    SettingDef {
        name: "default.replication.factor",
        default: Some("1"),
        kind: int(1, 32),
        doc: "replication factor of auto-created topics",
    },
    SettingDef { name: "min.insync.replicas", default: Some("1"), kind: int(1, 32), doc: "ISR size acks=all needs" },
    SettingDef {
        name: "unclean.leader.election.enable",
        default: Some("false"),
        kind: Kind::Bool,
        doc: "elect out-of-sync replicas when no ISR member lives",
    },
    SettingDef {
        name: "auto.create.topics.enable",
        default: Some("true"),
        kind: Kind::Bool,
        doc: "create topics on first Metadata/Produce",
    },
    SettingDef {
        name: "auto.leader.rebalance.enable",
        default: Some("true"),
        kind: Kind::Bool,
        doc: "move leadership back to preferred replicas",
    },
    SettingDef {
        name: "leader.imbalance.check.interval.seconds",
        default: Some("300"),
        kind: int(1, i64::MAX),
        doc: "how often leaders move back to preferred replicas",
    },
    SettingDef {
        name: "message.max.bytes",
        default: Some("1048588"),
        kind: int(0, I32_MAX),
        doc: "largest record batch accepted",
    },
    SettingDef {
        name: "log.segment.bytes",
        default: Some("1073741824"),
        kind: int(14, I32_MAX),
        doc: "segment size before rolling",
    },
    SettingDef {
        name: "log.roll.ms",
        default: Some("604800000"),
        kind: int(1, i64::MAX),
        doc: "segment age before rolling",
    },
    SettingDef {
        name: "log.retention.ms",
        default: Some("604800000"),
        kind: int(-1, i64::MAX),
        doc: "retention by time (-1: forever)",
    },
    SettingDef {
        name: "log.retention.bytes",
        default: Some("-1"),
        kind: int(-1, i64::MAX),
        doc: "retention by size per partition (-1: unlimited)",
    },
    SettingDef {
        name: "log.retention.check.interval.ms",
        default: Some("300000"),
        kind: int(1, i64::MAX),
        doc: "how often retention runs",
    },
    SettingDef {
        name: "log.flush.interval.messages",
        default: None,
        kind: int(1, i64::MAX),
        doc: "fsync after this many records (unset: no forced flush)",
    },
    SettingDef {
        name: "log.flush.interval.ms",
        default: None,
        kind: int(0, i64::MAX),
        doc: "fsync after this long (unset: no forced flush)",
    },
    SettingDef {
        name: "log.index.interval.bytes",
        default: Some("4096"),
        kind: int(0, I32_MAX),
        doc: "bytes between offset index entries",
    },
    SettingDef {
        name: "replica.lag.time.max.ms",
        default: Some("10000"),
        kind: int(1, I32_MAX),
        doc: "a follower lagging longer leaves the ISR",
    },
    SettingDef {
        name: "replica.fetch.wait.max.ms",
        default: Some("500"),
        kind: int(0, I32_MAX),
        doc: "follower fetch long-poll",
    },
    SettingDef {
        name: "broker.heartbeat.interval.ms",
        default: Some("500"),
        kind: int(10, I32_MAX),
        doc: "broker to controller heartbeat period",
    },
    SettingDef {
        name: "broker.session.timeout.ms",
        default: Some("3000"),
        kind: int(50, I32_MAX),
        doc: "a broker silent this long is fenced",
    },
    SettingDef {
        name: "offsets.topic.num.partitions",
        default: Some("50"),
        kind: int(1, 10_000),
        doc: "partitions of __consumer_offsets",
    },
    SettingDef {
        name: "offsets.topic.replication.factor",
        default: None,
        kind: int(1, 32),
        doc: "replication of __consumer_offsets (unset: min(3, brokers))",
    },
    SettingDef {
        name: "offsets.topic.segment.bytes",
        default: Some("104857600"),
        kind: int(14, I32_MAX),
        doc: "segment size of __consumer_offsets (compacted segment by segment)",
    },
    SettingDef {
        name: "group.initial.rebalance.delay.ms",
        default: Some("3000"),
        kind: int(0, I32_MAX),
        doc: "wait for more members before the first rebalance",
    },
    SettingDef {
        name: "group.min.session.timeout.ms",
        default: Some("6000"),
        kind: int(1, I32_MAX),
        doc: "shortest session timeout a group member may ask for",
    },
    SettingDef {
        name: "group.max.session.timeout.ms",
        default: Some("1800000"),
        kind: int(1, I32_MAX),
        doc: "longest session timeout a group member may ask for",
    },
    SettingDef {
        name: "group.max.size",
        default: Some("2147483647"),
        kind: int(1, I32_MAX),
        doc: "most members in one consumer group",
    },
    SettingDef {
        name: "offset.metadata.max.bytes",
        default: Some("4096"),
        kind: int(0, I32_MAX),
        doc: "largest metadata string of an offset commit",
    },
    SettingDef {
        name: "offsets.retention.minutes",
        default: Some("10080"),
        kind: int(1, I32_MAX),
        doc: "committed offsets of an empty group are dropped after this",
    },
    SettingDef {
        name: "offsets.retention.check.interval.ms",
        default: Some("600000"),
        kind: int(100, I32_MAX),
        doc: "how often expired offsets are looked for",
    },
    SettingDef {
        name: "offsets.commit.timeout.ms",
        default: Some("5000"),
        kind: int(1, I32_MAX),
        doc: "an offset commit waits this long for its replicas",
    },
    SettingDef {
        name: "socket.request.max.bytes",
        default: Some("104857600"),
        kind: int(1, I32_MAX),
        doc: "largest Kafka request frame",
    },
    SettingDef {
        name: "connections.max.idle.ms",
        default: Some("600000"),
        kind: int(1, i64::MAX),
        doc: "idle Kafka connections are closed after this",
    },
    SettingDef {
        name: "request.timeout.ms",
        default: Some("30000"),
        kind: int(1, I32_MAX),
        doc: "bound on parked acks=all requests",
    },
    // Strom's own (Kafka has no direct equivalent or a different default).
    SettingDef {
        name: "controller.quorum.election.timeout.ms",
        default: Some("500"),
        kind: int(50, 60_000),
        doc: "metadata quorum election timeout; the leader lease adds as much again (Kafka: 1000)",
    },
    SettingDef {
        name: "metadata.snapshot.interval.entries",
        default: Some("1000"),
        kind: int(2, i64::MAX),
        doc: "metadata log entries between snapshots",
    },
    SettingDef {
        name: "metadata.snapshot.keep.entries",
        default: Some("100"),
        kind: int(0, i64::MAX),
        doc: "metadata log entries kept behind a snapshot",
    },
];

/// Topic-level overrides and the broker setting each one overrides.
pub const TOPIC_SETTINGS: &[(&str, &str)] = &[
    ("retention.ms", "log.retention.ms"),
    ("retention.bytes", "log.retention.bytes"),
    ("segment.bytes", "log.segment.bytes"),
    ("segment.ms", "log.roll.ms"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("cleanup.policy", "cleanup.policy"),
    ("flush.messages", "log.flush.interval.messages"),
    ("flush.ms", "log.flush.interval.ms"),
    ("max.message.bytes", "message.max.bytes"),
    ("unclean.leader.election.enable", "unclean.leader.election.enable"),
];

const CLEANUP_POLICY: SettingDef = SettingDef {
    name: "cleanup.policy",
    default: Some("delete"),
    kind: Kind::Choice(&["delete", "compact", "compact,delete", "delete,compact"]),
    doc: "retention policy (compaction is accepted and stored, segments are deleted by retention)",
};

/// A setting that is unknown or has a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting `{key}`: {reason}")]
pub struct SettingError {
    pub key: String,
    pub reason: String,
}

fn err(key: &str, reason: impl Into<String>) -> SettingError {
    SettingError { key: key.to_string(), reason: reason.into() }
}

pub fn broker_def(name: &str) -> Option<&'static SettingDef> {
    BROKER_SETTINGS.iter().find(|d| d.name == name)
}

/// The definition behind a topic-level key (validated like its broker setting).
pub fn topic_def(name: &str) -> Option<&'static SettingDef> {
    if name == "cleanup.policy" {
        return Some(&CLEANUP_POLICY);
    }
    TOPIC_SETTINGS.iter().find(|(t, _)| *t == name).and_then(|(_, b)| broker_def(b))
}

/// Checks `value` against `def`; returns it normalized (trimmed, lowercased bools).
pub fn validate(def: &SettingDef, key: &str, value: &str) -> Result<String, SettingError> {
    let v = value.trim();
    match def.kind {
        Kind::Int { min, max } => {
            let n: i64 = v.parse().map_err(|_| err(key, format!("must be an integer, got `{value}`")))?;
            if n < min || n > max {
                return Err(err(key, format!("must be between {min} and {max}, got {n}")));
            }
            Ok(n.to_string())
        }
        Kind::Bool => match v.to_ascii_lowercase().as_str() {
            "true" => Ok("true".into()),
            "false" => Ok("false".into()),
            _ => Err(err(key, format!("must be true or false, got `{value}`"))),
        },
        Kind::Choice(choices) => {
            if choices.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(err(key, format!("must be one of {}, got `{value}`", choices.join(" | "))))
            }
        }
    }
}

/// A node's broker settings: defaults plus what the file and flags set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    explicit: BTreeMap<String, String>,
}

impl Settings {
    /// Sets one key, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingError> {
        let def = broker_def(key).ok_or_else(|| err(key, "unknown setting"))?;
        let v = validate(def, key, value)?;
        self.explicit.insert(key.to_string(), v);
        Ok(())
    }

    /// Parses `KEY=VALUE`.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), SettingError> {
        let (k, v) = pair.split_once('=').ok_or_else(|| err(pair, "expected KEY=VALUE"))?;
        self.set(k.trim(), v)
    }

    /// Loads a TOML file of `key = value` pairs (nested tables join with dots).
    pub fn load_file(&mut self, path: &Path) -> Result<(), SettingError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| err("--config", format!("cannot read {shown}: {e}")))?;
        let table: toml::Table =
            text.parse().map_err(|e| err("--config", format!("{shown} is not valid TOML: {e}")))?;
        self.load_table("", &table)
    }

    fn load_table(&mut self, prefix: &str, table: &toml::Table) -> Result<(), SettingError> {
        for (k, v) in table {
            let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                toml::Value::Table(t) => self.load_table(&key, t)?,
                toml::Value::String(s) => self.set(&key, s)?,
                toml::Value::Integer(i) => self.set(&key, &i.to_string())?,
                toml::Value::Boolean(b) => self.set(&key, &b.to_string())?,
                other => return Err(err(&key, format!("unsupported value {other}"))),
            }
        }
        Ok(())
    }

    /// The value in force, or `None` for an unset optional setting.
    pub fn get(&self, key: &str) -> Option<String> {
        self.explicit.get(key).cloned().or_else(|| broker_def(key).and_then(|d| d.default.map(str::to_string)))
    }

    /// An integer setting; the definitions guarantee it parses.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(|v| v.parse().ok())
    }

    pub fn bool(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| v == "true")
    }

    /// An integer setting that has a default, as milliseconds or a count.
    pub fn u64(&self, key: &str) -> u64 {
        self.int(key).map_or(0, |v| v.max(0) as u64)
    }

    /// Every setting with its value in force (unset ones omitted).
    pub fn all(&self) -> BTreeMap<String, String> {
        BROKER_SETTINGS.iter().filter_map(|d| self.get(d.name).map(|v| (d.name.to_string(), v))).collect()
    }

    /// A topic's effective configs: its overrides over the broker settings.
    pub fn topic_effective(&self, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (topic_key, broker_key) in TOPIC_SETTINGS {
            let v = overrides.get(*topic_key).cloned().or_else(|| {
                if *topic_key == "cleanup.policy" {
                    CLEANUP_POLICY.default.map(str::to_string)
                } else {
                    self.get(broker_key)
                }
            });
            if let Some(v) = v {
                out.insert(topic_key.to_string(), v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let mut s = Settings::default();
        assert_eq!(s.u64("broker.session.timeout.ms"), 3000);
        assert_eq!(s.get("log.flush.interval.ms"), None);
        s.set_pair("broker.session.timeout.ms=1500").expect("set");
        assert_eq!(s.u64("broker.session.timeout.ms"), 1500);
        s.set("unclean.leader.election.enable", "TRUE").expect("set");
        assert!(s.bool("unclean.leader.election.enable"));
    }

    #[test]
    fn bad_settings_name_the_key() {
        let mut s = Settings::default();
        let e = s.set_pair("no.such.key=1").expect_err("unknown");
        assert_eq!(e.key, "no.such.key");
        let e = s.set("log.segment.bytes", "ten").expect_err("not a number");
        assert!(e.to_string().contains("log.segment.bytes"), "{e}");
        let e = s.set("log.segment.bytes", "3").expect_err("too small");
        assert!(e.reason.contains("between 14"), "{e}");
        assert!(s.set_pair("novalue").is_err());
    }

    #[test]
    fn topic_configs_validate_like_their_broker_setting() {
        let def = topic_def("retention.ms").expect("known");
        assert_eq!(validate(def, "retention.ms", " 1000 ").expect("valid"), "1000");
        assert!(validate(def, "retention.ms", "-2").is_err());
        assert!(topic_def("bogus").is_none());
        let cp = topic_def("cleanup.policy").expect("known");
        assert!(validate(cp, "cleanup.policy", "compact").is_ok());
        assert!(validate(cp, "cleanup.policy", "shred").is_err());
    }

    #[test]
    fn toml_file_nested_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "num.partitions = 3\n[log.retention]\nms = 1000\n").expect("write");
        let mut s = Settings::default();
        s.load_file(&path).expect("load");
        assert_eq!(s.int("num.partitions"), Some(3));
        assert_eq!(s.int("log.retention.ms"), Some(1000));
        std::fs::write(&path, "num.partitions = \"x\"").expect("write");
        assert_eq!(Settings::default().load_file(&path).expect_err("bad").key, "num.partitions");
    }

    #[test]
    fn effective_topic_configs() {
        let s = Settings::default();
        let o = BTreeMap::from([("retention.ms".to_string(), "5".to_string())]);
        let eff = s.topic_effective(&o);
        assert_eq!(eff["retention.ms"], "5");
        assert_eq!(eff["segment.bytes"], "1073741824");
        assert_eq!(eff["cleanup.policy"], "delete");
        assert!(!eff.contains_key("flush.ms"));
    }
}
