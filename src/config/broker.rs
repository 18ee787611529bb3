//! The broker settings table: every broker setting Strom knows, by Kafka's
//! name, with Kafka's default (unless stated), type and bounds, and whether
//! Kafka lets it change at runtime (a dynamic broker config, KIP-226).
//!
//! Dynamic settings can be changed cluster-wide through AlterConfigs /
//! IncrementalAlterConfigs on the default broker resource; the change is a
//! metadata Config record, so every broker applies it. The `log.*`
//! synonyms of topic configs are the defaults topics inherit.

use super::{def, int, Kind, SettingDef, I32_MAX};

const I64_MAX: i64 = i64::MAX;
/// Kafka's "no limit" for timestamp bounds and compaction lag (Long.MAX_VALUE).
const LONG_MAX_TEXT: &str = "9223372036854775807";

/// Why a setting is accepted but has no effect, shared by several rows.
const NO_THREAD_POOLS: &str = "accepted, not used: Strom runs on one async runtime, not thread pools";

pub const BROKER_SETTINGS: &[SettingDef] = &[
    def(
        "listeners",
        None,
        Kind::Custom(crate::security::listeners::validate_endpoints),
        "Kafka listeners, NAME://HOST:PORT,... (unset: one PLAINTEXT listener on --kafka)",
    ),
    def(
        "advertised.listeners",
        None,
        Kind::Custom(crate::security::listeners::validate_endpoints),
        "what Metadata advertises per listener name (unset: the bound address)",
    ),
    def(
        "listener.security.protocol.map",
        Some("PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"),
        Kind::Custom(crate::security::listeners::validate_protocol_map),
        "the security protocol of each listener name",
    ),
    def(
        "inter.broker.listener.name",
        None,
        Kind::Custom(listener_name),
        "the listener followers fetch from (unset: the first PLAINTEXT one); it must be PLAINTEXT",
    ),
    def(
        "quorum.security.protocol",
        Some("PLAINTEXT"),
        Kind::Choice(&["PLAINTEXT", "SSL"]),
        "the quorum port (--raft): SSL is mutual TLS with the keystore and truststore",
    ),
    def(
        "sasl.enabled.mechanisms",
        Some("SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
        Kind::List(&["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
        "SASL mechanisms of SASL_PLAINTEXT and SASL_SSL listeners (PLAIN checks the SCRAM credentials)",
    ),
    def("ssl.keystore.type", Some("PEM"), Kind::Choice(&["PEM"]), "format of ssl.keystore.location"),
    def(
        "ssl.keystore.location",
        None,
        Kind::Custom(path),
        "PEM file with the private key and certificate chain of SSL and SASL_SSL listeners; reloaded when it changes",
    ),
    def("ssl.truststore.type", Some("PEM"), Kind::Choice(&["PEM"]), "format of ssl.truststore.location"),
    def(
        "ssl.truststore.location",
        None,
        Kind::Custom(path),
        "PEM file of the CAs client certificates must chain to",
    ),
    def(
        "ssl.client.auth",
        Some("none"),
        Kind::Choice(&["none", "requested", "required"]),
        "whether TLS listeners ask clients for a certificate (its subject becomes the principal)",
    ),
    def(
        "authorizer.class.name",
        Some(""),
        Kind::Custom(crate::security::acl::validate_authorizer),
        "turns ACLs on: org.apache.kafka.metadata.authorizer.StandardAuthorizer (empty: no authorizer)",
    ),
    def(
        "super.users",
        None,
        Kind::Custom(crate::security::acl::validate_super_users),
        "principals the ACLs do not apply to, User:NAME;User:OTHER",
    ),
    def(
        "allow.everyone.if.no.acl.found",
        Some("false"),
        Kind::Bool,
        "with the authorizer on: whether a resource no ACL names is open to all",
    ),
    def("admin.tls.enabled", Some("false"), Kind::Bool, "serve the admin API over HTTPS with ssl.keystore.location"),
    def(
        "admin.authentication.enabled",
        Some("false"),
        Kind::Bool,
        "the admin API needs HTTP Basic (a SCRAM user) or a client certificate, but /health and /ready",
    ),
    def("admin.metrics.public", Some("false"), Kind::Bool, "with admin authentication on: /metrics stays open"),
    def(
        "admin.client.credentials",
        None,
        Kind::Custom(path),
        "a credentials.json ({user, password, ca}) this node presents to other nodes' admin APIs",
    ),
    def(
        "sasl.server.max.receive.size",
        Some("524288"),
        int(1, I32_MAX),
        "largest frame a SASL listener reads before the client has authenticated",
    ),
    def("quota.window.num", Some("11"), int(2, 1000), "windows client quota rates are measured over"),
    def("quota.window.size.seconds", Some("1"), int(1, 3600), "length of one client quota window"),
    def(
        "connection.failed.authentication.delay.ms",
        Some("100"),
        int(0, I32_MAX),
        "delay before a failed SASL authentication is answered and the connection closed",
    ),
    def("num.partitions", Some("1"), int(1, 10_000), "partitions of auto-created topics"),
    def("default.replication.factor", Some("1"), int(1, 32), "replication factor of auto-created topics"),
    def("min.insync.replicas", Some("1"), int(1, 32), "ISR size acks=all needs").dynamic(),
    def(
        "unclean.leader.election.enable",
        Some("false"),
        Kind::Bool,
        "elect out-of-sync replicas when no ISR member lives",
    )
    .dynamic(),
    def("auto.create.topics.enable", Some("true"), Kind::Bool, "create topics on first Metadata/Produce"),
    def(
        "max.request.partition.size.limit",
        Some("2000"),
        int(1, I32_MAX),
        "most partitions in one DescribeTopicPartitions answer (the client pages on with a cursor)",
    ),
    def("auto.leader.rebalance.enable", Some("true"), Kind::Bool, "move leadership back to preferred replicas"),
    def(
        "leader.imbalance.check.interval.seconds",
        Some("300"),
        int(1, I64_MAX),
        "how often leaders move back to preferred replicas",
    ),
    def("message.max.bytes", Some("1048588"), int(0, I32_MAX), "largest record batch accepted").dynamic(),
    def("log.segment.bytes", Some("1073741824"), int(14, I32_MAX), "segment size before rolling").dynamic(),
    def("log.roll.ms", Some("604800000"), int(1, I64_MAX), "segment age before rolling").dynamic(),
    def("log.retention.ms", Some("604800000"), int(-1, I64_MAX), "retention by time (-1: forever)").dynamic(),
    def("log.retention.bytes", Some("-1"), int(-1, I64_MAX), "retention by size per partition (-1: unlimited)")
        .dynamic(),
    def("log.retention.check.interval.ms", Some("300000"), int(1, I64_MAX), "how often retention runs"),
    def("log.flush.interval.messages", None, int(1, I64_MAX), "fsync after this many records (unset: no forced flush)")
        .dynamic(),
    def("log.flush.interval.ms", None, int(0, I64_MAX), "fsync after this long (unset: no forced flush)").dynamic(),
    def("log.index.interval.bytes", Some("4096"), int(0, I32_MAX), "bytes between offset index entries").dynamic(),
    def(
        "log.index.size.max.bytes",
        Some("10485760"),
        int(4, I32_MAX),
        "largest offset or time index; a full index rolls the segment",
    )
    .dynamic(),
    def("log.cleanup.policy", Some("delete"), Kind::List(&["compact", "delete"]), "default cleanup.policy").dynamic(),
    def(
        "log.message.timestamp.type",
        Some("CreateTime"),
        Kind::Choice(&["CreateTime", "LogAppendTime"]),
        "default message.timestamp.type",
    )
    .dynamic(),
    def(
        "log.message.timestamp.before.max.ms",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "default message.timestamp.before.max.ms",
    )
    .dynamic(),
    def(
        "log.message.timestamp.after.max.ms",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "default message.timestamp.after.max.ms",
    )
    .dynamic(),
    def(
        "log.message.timestamp.difference.max.ms",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "default message.timestamp.difference.max.ms (deprecated by the before/after pair)",
    )
    .dynamic(),
    def(
        "compression.type",
        Some("producer"),
        Kind::Choice(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        "default compression.type (batches are stored as the producer compressed them)",
    )
    .dynamic(),
    def("compression.gzip.level", Some("-1"), Kind::Custom(gzip_level), "default compression.gzip.level").dynamic(),
    def("compression.lz4.level", Some("9"), int(1, 17), "default compression.lz4.level").dynamic(),
    def("compression.zstd.level", Some("3"), int(-131_072, 22), "default compression.zstd.level").dynamic(),
    def("log.cleaner.delete.retention.ms", Some("86400000"), int(0, I64_MAX), "default delete.retention.ms").dynamic(),
    def(
        "log.cleaner.min.cleanable.ratio",
        Some("0.5"),
        Kind::Double { min: 0.0, max: 1.0 },
        "default min.cleanable.dirty.ratio",
    )
    .dynamic(),
    def("log.cleaner.min.compaction.lag.ms", Some("0"), int(0, I64_MAX), "default min.compaction.lag.ms").dynamic(),
    def("log.cleaner.max.compaction.lag.ms", Some(LONG_MAX_TEXT), int(1, I64_MAX), "default max.compaction.lag.ms")
        .dynamic(),
    def(
        "log.cleaner.io.max.bytes.per.second",
        Some("1.7976931348623157E308"),
        Kind::Double { min: 0.0, max: f64::MAX },
        "bytes per second the log cleaner reads and writes, all partitions together (Kafka's default: no bound)",
    )
    .dynamic(),
    def("log.segment.delete.delay.ms", Some("60000"), int(0, I64_MAX), "default file.delete.delay.ms").dynamic(),
    def("log.preallocate", Some("false"), Kind::Bool, "default preallocate").dynamic(),
    def("log.roll.jitter.ms", Some("0"), int(0, I64_MAX), "default segment.jitter.ms").dynamic(),
    def("log.message.downconversion.enable", Some("true"), Kind::Bool, "default message.downconversion.enable")
        .dynamic(),
    def(
        "log.message.format.version",
        Some("3.0-IV1"),
        Kind::Custom(message_format_version),
        "default message.format.version (deprecated in Kafka)",
    ),
    def("log.local.retention.ms", Some("-2"), int(-2, I64_MAX), "default local.retention.ms").dynamic(),
    def("log.local.retention.bytes", Some("-2"), int(-2, I64_MAX), "default local.retention.bytes").dynamic(),
    def("replica.lag.time.max.ms", Some("10000"), int(1, I32_MAX), "a follower lagging longer leaves the ISR"),
    def("replica.fetch.wait.max.ms", Some("500"), int(0, I32_MAX), "follower fetch long-poll"),
    def("replica.fetch.max.bytes", Some("1048576"), int(0, I32_MAX), "follower fetch bytes per partition"),
    def(
        "max.incremental.fetch.session.cache.slots",
        Some("1000"),
        int(0, I32_MAX),
        "incremental fetch sessions (KIP-227) a broker keeps; 0: none",
    ),
    def(
        "replica.fetch.response.max.bytes",
        Some("10485760"),
        int(0, I32_MAX),
        "follower fetch bytes per response, all partitions together",
    ),
    def(
        "leader.replication.throttled.rate",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "bytes/s a leader sends to replicas a reassignment adds (Long.MAX: unlimited)",
    )
    .dynamic(),
    def(
        "follower.replication.throttled.rate",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "bytes/s a replica a reassignment adds fetches (Long.MAX: unlimited)",
    )
    .dynamic(),
    // kafka-reassign-partitions --verify deletes it with the two rates above.
    def(
        "replica.alter.log.dirs.io.max.bytes.per.second",
        Some(LONG_MAX_TEXT),
        int(0, I64_MAX),
        "accepted, not used: Strom has one log directory per broker, so nothing moves between them",
    )
    .dynamic(),
    def(
        "storage.min.free.bytes",
        Some("67108864"),
        int(0, I64_MAX),
        "below this much free space in the data directory the broker takes no produce requests and followers pause, so logs never fill the disk",
    ),
    def(
        "unsafe.ack.before.commit",
        Some("false"),
        Kind::Bool,
        "TESTING ONLY, loses data: acks=all is answered when the leader appended, before the high watermark passes it (a negative control for tests/chaos)",
    ),
    def("broker.rack", None, Kind::Custom(rack), "this broker's rack: replicas of a partition go to different racks"),
    def(
        "balancer.mode",
        Some("continuous"),
        Kind::Choice(&["off", "node_add", "continuous"]),
        "what the controller changes by itself: continuous re-creates the replicas of brokers gone longer than balancer.node.unavailable.timeout.ms",
    ),
    def(
        "balancer.node.unavailable.timeout.ms",
        Some("900000"),
        int(0, I64_MAX),
        "a broker fenced this long has its replicas re-created on live brokers (balancer.mode=continuous)",
    ),
    def(
        "balancer.max.concurrent.moves",
        Some("4"),
        int(1, 10_000),
        "reassignments the controller itself runs at once (drains, healing)",
    ),
    def("broker.heartbeat.interval.ms", Some("500"), int(10, I32_MAX), "broker to controller heartbeat period"),
    def("broker.session.timeout.ms", Some("3000"), int(50, I32_MAX), "a broker silent this long is fenced"),
    def("offsets.topic.num.partitions", Some("50"), int(1, 10_000), "partitions of __consumer_offsets"),
    def(
        "offsets.topic.replication.factor",
        None,
        int(1, 32),
        "replication of __consumer_offsets (unset: min(3, brokers))",
    ),
    def(
        "offsets.topic.segment.bytes",
        Some("104857600"),
        int(14, I32_MAX),
        "segment size of __consumer_offsets (compacted segment by segment)",
    ),
    def("transaction.state.log.num.partitions", Some("50"), int(1, 10_000), "partitions of __transaction_state"),
    def(
        "transaction.state.log.replication.factor",
        None,
        int(1, 32),
        "replication of __transaction_state (unset: min(3, brokers))",
    ),
    def(
        "transaction.state.log.min.isr",
        Some("2"),
        int(1, 32),
        "min.insync.replicas of __transaction_state (at most its replication factor)",
    ),
    def(
        "transaction.state.log.segment.bytes",
        Some("104857600"),
        int(14, I32_MAX),
        "segment size of __transaction_state",
    ),
    def(
        "transaction.max.timeout.ms",
        Some("900000"),
        int(1, I32_MAX),
        "the longest transaction.timeout.ms a producer may ask for",
    ),
    def(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        Some("10000"),
        int(1, I32_MAX),
        "how often transactions open past their timeout are looked for and aborted",
    ),
    def(
        "transactional.id.expiration.ms",
        Some("604800000"),
        int(1, I32_MAX),
        "a transactional id with no transaction open and no request for this long is forgotten",
    ),
    def(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        Some("3600000"),
        int(1, I32_MAX),
        "how often expired transactional ids are looked for and removed",
    ),
    def(
        "group.initial.rebalance.delay.ms",
        Some("3000"),
        int(0, I32_MAX),
        "wait for more members before the first rebalance",
    ),
    def(
        "group.min.session.timeout.ms",
        Some("6000"),
        int(1, I32_MAX),
        "shortest session timeout a group member may ask for",
    ),
    def(
        "group.max.session.timeout.ms",
        Some("1800000"),
        int(1, I32_MAX),
        "longest session timeout a group member may ask for",
    ),
    def("group.max.size", Some("2147483647"), int(1, I32_MAX), "most members in one consumer group"),
    def(
        "group.consumer.session.timeout.ms",
        Some("45000"),
        int(1, I32_MAX),
        "a member of a consumer-protocol group (KIP-848) silent this long is removed",
    ),
    def(
        "group.consumer.heartbeat.interval.ms",
        Some("5000"),
        int(1, I32_MAX),
        "how often consumer-protocol members heartbeat (every 200 ms at most while their group settles)",
    ),
    def(
        "group.consumer.assignors",
        Some("uniform,range"),
        Kind::List(&["uniform", "range"]),
        "the broker-side assignors of consumer-protocol groups; the first is the default",
    ),
    def(
        "group.consumer.max.size",
        Some("2147483647"),
        int(1, I32_MAX),
        "most members in one consumer-protocol group",
    ),
    def(
        "group.consumer.migration.policy",
        Some("bidirectional"),
        Kind::Choice(&["bidirectional", "upgrade", "downgrade", "disabled"]),
        "online migration: a live classic group converts when a consumer-protocol member joins (upgrade), and back when the last one leaves (downgrade)",
    ),
    def("offset.metadata.max.bytes", Some("4096"), int(0, I32_MAX), "largest metadata string of an offset commit"),
    def(
        "offsets.retention.minutes",
        Some("10080"),
        int(1, I32_MAX),
        "committed offsets of an empty group are dropped after this",
    ),
    def(
        "offsets.retention.check.interval.ms",
        Some("600000"),
        int(100, I32_MAX),
        "how often expired offsets are looked for",
    ),
    def(
        "offsets.commit.timeout.ms",
        Some("5000"),
        int(1, I32_MAX),
        "an offset commit waits this long for its replicas",
    ),
    def("socket.request.max.bytes", Some("104857600"), int(1, I32_MAX), "largest Kafka request frame"),
    def(
        "queued.max.request.bytes",
        Some("104857600"),
        int(-1, I32_MAX),
        "Kafka request bytes read and not yet handled, all connections together; past it connections \
         stop reading (-1: no bound)",
    ),
    def(
        "socket.listen.backlog.size",
        Some("1024"),
        int(1, I32_MAX),
        "connections the kernel completes before the node accepts them, per Kafka and admin listener \
         (Kafka's default is 50; the kernel caps it at net.core.somaxconn)",
    ),
    def("connections.max.idle.ms", Some("600000"), int(1, I64_MAX), "idle Kafka connections are closed after this"),
    def("request.timeout.ms", Some("30000"), int(1, I32_MAX), "bound on parked acks=all requests"),
    // Kafka's dynamic thread-pool and connection-quota settings: accepted
    // (and validated) so scripts written for Kafka work, but Strom has no
    // such pools or quotas.
    def("num.io.threads", Some("8"), int(1, I32_MAX), NO_THREAD_POOLS).dynamic(),
    def("num.network.threads", Some("3"), int(1, I32_MAX), NO_THREAD_POOLS).dynamic(),
    def("num.replica.fetchers", Some("1"), int(1, I32_MAX), NO_THREAD_POOLS).dynamic(),
    def("background.threads", Some("10"), int(1, I32_MAX), NO_THREAD_POOLS).dynamic(),
    def("log.cleaner.threads", Some("1"), int(0, I32_MAX), NO_THREAD_POOLS).dynamic(),
    def("max.connections", Some("2147483647"), int(0, I32_MAX), "accepted, not used: Strom has no connection quotas")
        .dynamic(),
    def(
        "max.connections.per.ip",
        Some("2147483647"),
        int(0, I32_MAX),
        "accepted, not used: Strom has no connection quotas",
    )
    .dynamic(),
    // Strom's own (Kafka has no direct equivalent or a different default).
    def(
        "controller.quorum.election.timeout.ms",
        Some("500"),
        int(50, 60_000),
        "metadata quorum election timeout; the leader lease adds as much again (Kafka: 1000)",
    ),
    def("metadata.snapshot.interval.entries", Some("1000"), int(2, I64_MAX), "metadata log entries between snapshots"),
    def("metadata.snapshot.keep.entries", Some("100"), int(0, I64_MAX), "metadata log entries kept behind a snapshot"),
];

/// Kafka's gzip level: -1 (the codec's default) or 1 to 9.
/// `broker.rack`: what Kafka takes, a non-empty name of printable characters.
pub fn listener_name(value: &str) -> Result<String, String> {
    if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("`{value}` is not a listener name (letters, digits, _ and -)"));
    }
    Ok(value.to_string())
}

pub fn path(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Err("must be a file path".into());
    }
    Ok(value.trim().to_string())
}

pub fn rack(value: &str) -> Result<String, String> {
    if value.is_empty() || value.len() > 255 || value.chars().any(|c| c.is_control()) {
        return Err("a rack is 1 to 255 printable characters".into());
    }
    Ok(value.to_string())
}

pub fn gzip_level(value: &str) -> Result<String, String> {
    match value.parse::<i64>() {
        Ok(n) if n == -1 || (1..=9).contains(&n) => Ok(n.to_string()),
        _ => Err(format!("must be -1 or between 1 and 9, got `{value}`")),
    }
}

/// A Kafka release or metadata version such as `2.8`, `3.0-IV1` or
/// `0.10.0-IV1` (Kafka's MetadataVersionValidator).
pub fn message_format_version(value: &str) -> Result<String, String> {
    let (release, iv) = value.split_once("-IV").map_or((value, None), |(r, iv)| (r, Some(iv)));
    let parts: Vec<&str> = release.split('.').collect();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let release_ok = (2..=3).contains(&parts.len()) && parts.iter().all(|p| numeric(p));
    if release_ok && iv.is_none_or(numeric) {
        Ok(value.to_string())
    } else {
        Err(format!("must be a Kafka version such as 3.0-IV1 or 2.8, got `{value}`"))
    }
}
