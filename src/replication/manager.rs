//! The replica manager: the partitions this broker hosts, kept in step with
//! the applied metadata image.
//!
//! On every applied change it opens logs for partitions newly assigned to
//! this broker, makes each replica leader or follower by the image (with its
//! leader epoch and ISR), applies topic config changes, and closes and
//! deletes the logs of partitions that are gone. Timers flush
//! (`flush.ms`), apply retention and write the recovery-point checkpoint.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use strom_raft::state_machine::AppliedImage;
use strom_raft::MetadataImage;
use tokio::sync::watch;

use super::partition::Partition;
use super::throttle::{SharedBucket, UNLIMITED};
use crate::clock::wall_ms;
use crate::config::Settings;
use crate::log::checkpoint::OffsetCheckpointFile;
use crate::log::PartitionLog;
use crate::log::{LogConfig, TimestampType};

const RECOVERY_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
/// How often logs are checked for `flush.ms` and checkpoints written.
const FLUSH_CHECK: Duration = Duration::from_millis(200);
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

pub type PartitionKey = (String, i32);

/// The hosted replicas by topic, then index, so that a lookup by `&str`
/// builds no key (every fetch looks up each partition it names).
#[derive(Default)]
struct Hosted(HashMap<String, HashMap<i32, Arc<Partition>>>);

impl Hosted {
    fn get(&self, topic: &str, index: i32) -> Option<&Arc<Partition>> {
        self.0.get(topic)?.get(&index)
    }

    /// Registers `partition` unless one is there already; the registered one.
    fn insert_if_absent(&mut self, topic: &str, index: i32, partition: Arc<Partition>) -> Arc<Partition> {
        self.0.entry(topic.to_string()).or_default().entry(index).or_insert(partition).clone()
    }

    fn remove(&mut self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let partitions = self.0.get_mut(topic)?;
        let removed = partitions.remove(&index);
        if partitions.is_empty() {
            self.0.remove(topic);
        }
        removed
    }

    fn keys(&self) -> impl Iterator<Item = (&str, i32)> {
        self.0.iter().flat_map(|(t, ps)| ps.keys().map(move |i| (t.as_str(), *i)))
    }

    fn values(&self) -> impl Iterator<Item = &Arc<Partition>> {
        self.0.values().flat_map(HashMap::values)
    }
}

pub struct ReplicaManager {
    broker_id: i32,
    logs_dir: PathBuf,
    settings: Arc<Settings>,
    partitions: RwLock<Hosted>,
    recovery: OffsetCheckpointFile,
    /// Recovery points as checkpointed before this start.
    recovery_at_start: BTreeMap<PartitionKey, i64>,
    /// Bumped on every applied image, so waiters can re-check leadership.
    epoch_tx: watch::Sender<u64>,
    /// The metadata log index of the image the replicas follow.
    applied_tx: watch::Sender<u64>,
    /// Whether the logs left on disk by partitions this broker no longer
    /// hosts have been deleted (once, on the first image after start).
    strays_deleted: std::sync::atomic::AtomicBool,
    /// `leader.replication.throttled.rate`: what this broker, as leader,
    /// sends to replicas a reassignment adds.
    pub leader_throttle: SharedBucket,
    /// `follower.replication.throttled.rate`: what this broker fetches as a
    /// replica a reassignment adds.
    pub follower_throttle: SharedBucket,
    /// Wakes the ISR task at once when a follower outside the ISR caught up.
    isr_wake: tokio::sync::Notify,
    /// Free space in the log directory against `storage.min.free.bytes`.
    pub disk: super::disk::DiskGuard,
}

/// A topic's log settings and `min.insync.replicas`, from its effective
/// configs (`settings` already carries the dynamic broker configs).
pub fn topic_settings(settings: &Settings, configs: &BTreeMap<String, String>) -> (LogConfig, usize) {
    let eff = settings.topic_effective(configs);
    let int = |k: &str| eff.get(k).and_then(|v| v.parse::<i64>().ok());
    let positive = |k: &str| int(k).filter(|v| *v >= 0).map(|v| v as u64);
    // Kafka's "no bound" is Long.MAX_VALUE.
    let bound = |k: &str| positive(k).filter(|v| *v < i64::MAX as u64);
    let defaults = LogConfig::default();
    let min_insync = int("min.insync.replicas").filter(|v| *v >= 1).map_or(1, |v| v as usize);
    let policy = |name: &str| eff.get("cleanup.policy").is_some_and(|p| p.split(',').any(|i| i.trim() == name));
    let (compact_policy, delete_policy) = (policy("compact"), policy("delete"));
    // KIP-937: before/after, when left at "no bound", fall back to the
    // deprecated message.timestamp.difference.max.ms.
    let difference = bound("message.timestamp.difference.max.ms");
    let timestamp_type = match eff.get("message.timestamp.type").map(String::as_str) {
        Some("LogAppendTime") => TimestampType::LogAppendTime,
        _ => TimestampType::CreateTime,
    };
    let config = LogConfig {
        segment_bytes: positive("segment.bytes").unwrap_or(defaults.segment_bytes),
        segment_ms: positive("segment.ms").unwrap_or(defaults.segment_ms),
        // cleanup.policy=compact alone keeps every segment (Kafka's meaning);
        // compact,delete applies retention too.
        retention_ms: positive("retention.ms").filter(|_| delete_policy),
        retention_bytes: positive("retention.bytes").filter(|_| delete_policy),
        flush_messages: positive("flush.messages"),
        flush_ms: positive("flush.ms"),
        index_interval_bytes: positive("index.interval.bytes").unwrap_or(defaults.index_interval_bytes).max(1),
        // Kafka accepts 4; the smallest index Strom keeps holds one time index entry.
        segment_index_bytes: positive("segment.index.bytes").unwrap_or(defaults.segment_index_bytes).max(12),
        max_message_bytes: positive("max.message.bytes").unwrap_or(defaults.max_message_bytes),
        compact: compact_policy,
        min_cleanable_dirty_ratio: eff
            .get("min.cleanable.dirty.ratio")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(defaults.min_cleanable_dirty_ratio),
        min_compaction_lag_ms: positive("min.compaction.lag.ms").unwrap_or(defaults.min_compaction_lag_ms),
        max_compaction_lag_ms: bound("max.compaction.lag.ms"),
        delete_retention_ms: positive("delete.retention.ms").unwrap_or(defaults.delete_retention_ms),
        cleaner_io_max_bytes_per_second: settings
            .get("log.cleaner.io.max.bytes.per.second")
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|rate| *rate < f64::MAX / 2.0),
        keys_required: compact_policy,
        timestamp_type,
        timestamp_before_max_ms: bound("message.timestamp.before.max.ms").or(difference),
        timestamp_after_max_ms: bound("message.timestamp.after.max.ms").or(difference),
    };
    (config, min_insync)
}

impl ReplicaManager {
    pub fn new(broker_id: i32, data_dir: &std::path::Path, settings: Arc<Settings>) -> std::io::Result<Self> {
        let logs_dir = data_dir.join("logs");
        std::fs::create_dir_all(&logs_dir)?;
        let (epoch_tx, _) = watch::channel(0);
        let recovery = OffsetCheckpointFile::new(logs_dir.join(RECOVERY_CHECKPOINT));
        let recovery_at_start = recovery.read().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "recovery-point checkpoint unreadable; recovering every segment");
            BTreeMap::new()
        });
        let disk = super::disk::DiskGuard::new(logs_dir.clone(), settings.u64("storage.min.free.bytes"));
        Ok(Self {
            broker_id,
            disk,
            recovery,
            recovery_at_start,
            logs_dir,
            settings,
            partitions: RwLock::new(Hosted::default()),
            epoch_tx,
            applied_tx: watch::channel(0).0,
            strays_deleted: std::sync::atomic::AtomicBool::new(false),
            leader_throttle: SharedBucket::unlimited(),
            follower_throttle: SharedBucket::unlimited(),
            isr_wake: tokio::sync::Notify::new(),
        })
    }

    /// A follower outside a led partition's ISR has caught up: the ISR task
    /// asks for it to join now, not at its next tick (Kafka expands the ISR
    /// on the fetch that catches up).
    pub fn wake_isr(&self) {
        self.isr_wake.notify_one();
    }

    /// Resolves after [`Self::wake_isr`].
    pub async fn isr_woken(&self) {
        self.isr_wake.notified().await;
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        self.partitions.read().unwrap_or_else(|e| e.into_inner()).get(topic, partition).cloned()
    }

    /// The directory the partition logs live in (Kafka's one log dir).
    pub fn logs_dir(&self) -> &std::path::Path {
        &self.logs_dir
    }

    pub fn all(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Changes whenever the hosted partitions or their roles may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.epoch_tx.subscribe()
    }

    /// Waits, up to `max`, until the replicas follow a metadata image at
    /// least as new as log index `index`; whether they do. Before the
    /// replicas follow the metadata at all (the broker is still catching up)
    /// there is nothing to wait for.
    pub async fn wait_applied(&self, index: u64, max: Duration) -> bool {
        let current = *self.applied_tx.borrow();
        if current >= index {
            return true;
        }
        if current == 0 {
            return false;
        }
        let mut rx = self.applied_tx.subscribe();
        tokio::time::timeout(max, rx.wait_for(|i| *i >= index)).await.is_ok_and(|r| r.is_ok())
    }

    /// Brings the hosted replicas in line with the image applied at log index `index`.
    pub fn apply_applied(&self, applied: &AppliedImage) {
        self.apply_image(&applied.image);
        self.applied_tx.send_if_modified(|i| {
            let newer = applied.applied_index > *i;
            *i = (*i).max(applied.applied_index);
            newer
        });
    }

    /// Brings the hosted replicas in line with `image`.
    pub fn apply_image(&self, image: &MetadataImage) {
        let mut wanted: HashMap<&str, HashSet<i32>> = HashMap::new();
        let settings = self.settings.for_broker(image, self.broker_id);
        let rate = |key: &str| settings.int(key).map_or(UNLIMITED, |v| v.max(0) as u64);
        self.leader_throttle.set_rate(rate("leader.replication.throttled.rate"));
        self.follower_throttle.set_rate(rate("follower.replication.throttled.rate"));
        for topic in image.topics.values() {
            let (config, min_insync) = topic_settings(&settings, &topic.configs);
            for (&index, p) in &topic.partitions {
                if !p.replicas.contains(&self.broker_id) {
                    continue;
                }
                wanted.entry(topic.name.as_str()).or_default().insert(index);
                let partition = match self.get(&topic.name, index) {
                    Some(existing) => {
                        if let Err(e) = existing.set_config(config.clone(), min_insync) {
                            tracing::warn!(topic = %topic.name, partition = index, error = %e, "config change not applied");
                        }
                        existing
                    }
                    None => match self.open_partition(&(topic.name.clone(), index), config.clone(), min_insync) {
                        Some(partition) => partition,
                        None => continue,
                    },
                };
                if p.leader == Some(self.broker_id) {
                    partition.become_leader(p.leader_epoch, p.partition_epoch, &p.isr, &p.replicas);
                } else {
                    partition.become_follower(p.leader_epoch, p.partition_epoch);
                }
            }
        }
        let gone: Vec<PartitionKey> = {
            let map = self.partitions.read().unwrap_or_else(|e| e.into_inner());
            map.keys()
                .filter(|(t, i)| !wanted.get(t).is_some_and(|w| w.contains(i)))
                .map(|(t, i)| (t.to_string(), i))
                .collect()
        };
        for key in gone {
            let removed = self.partitions.write().unwrap_or_else(|e| e.into_inner()).remove(&key.0, key.1);
            if let Some(partition) = removed {
                partition.stop_serving();
                match Arc::try_unwrap(partition) {
                    Ok(p) => {
                        if let Err(e) = p.into_log().delete() {
                            tracing::warn!(topic = %key.0, partition = key.1, error = %e, "deleting the log failed");
                        } else {
                            tracing::info!(topic = %key.0, partition = key.1, "partition removed from this broker");
                        }
                    }
                    Err(_) => {
                        // A request still holds it (and now answers that this
                        // broker does not lead it); its files go now.
                        tracing::info!(topic = %key.0, partition = key.1, "partition removed from this broker");
                        let dir = self.logs_dir.join(crate::log::partition_log::partition_dir_name(&key.0, key.1));
                        if let Err(e) = std::fs::remove_dir_all(&dir) {
                            tracing::warn!(dir = %dir.display(), error = %e, "deleting the log failed");
                        }
                    }
                }
            }
        }
        if !self.strays_deleted.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.delete_strays(&wanted);
        }
        self.epoch_tx.send_modify(|e| *e += 1);
    }

    /// Opens (recovering it where needed) and registers one partition's log.
    fn open_partition(&self, key: &PartitionKey, config: LogConfig, min_insync: usize) -> Option<Arc<Partition>> {
        let (topic, index) = (&key.0, key.1);
        let point = self.recovery_at_start.get(key).copied().unwrap_or(0);
        let opened = PartitionLog::open(&self.logs_dir, topic, index, config.clone(), point, wall_ms())
            .and_then(|log| Partition::open(topic, index, self.broker_id, log));
        match opened {
            Ok(partition) => {
                if let Err(e) = partition.set_config(config, min_insync) {
                    tracing::warn!(topic = %topic, partition = index, error = %e, "config not applied");
                }
                let mut map = self.partitions.write().unwrap_or_else(|e| e.into_inner());
                Some(map.insert_if_absent(topic, index, partition))
            }
            Err(e) => {
                tracing::error!(topic = %topic, partition = index, error = %e, "cannot open partition log");
                None
            }
        }
    }

    /// Opens, on `threads` threads at once, every partition log on disk, so
    /// that a restarted broker registers, is unfenced and answers `/ready`
    /// only with its logs recovered. Each takes its configs from `image`
    /// (this node's copy of the metadata, which at start may lag its own
    /// log) where the topic is there, else the broker's defaults until the
    /// caught-up image is applied. Logs the image shows on other brokers
    /// are left to the stray cleanup. None takes a role until the caught-up
    /// image is applied. Returns the number opened.
    pub fn recover_logs(&self, image: &MetadataImage, threads: usize) -> usize {
        let settings = self.settings.for_broker(image, self.broker_id);
        let no_configs = BTreeMap::new();
        let mut todo: Vec<(PartitionKey, LogConfig, usize)> = Vec::new();
        for (key, _) in self.partition_dirs() {
            let (config, min_insync) = match image.topics.values().find(|t| t.name == key.0) {
                Some(t) => match t.partitions.get(&key.1) {
                    Some(p) if !p.replicas.contains(&self.broker_id) => continue,
                    _ => topic_settings(&settings, &t.configs),
                },
                None => topic_settings(&settings, &no_configs),
            };
            todo.push((key, config, min_insync));
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let opened = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..threads.clamp(1, todo.len().max(1)) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((key, config, min_insync)) = todo.get(i) else { break };
                    if self.open_partition(key, config.clone(), *min_insync).is_some() {
                        opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        opened.into_inner()
    }

    /// Deletes the logs of partitions this broker no longer hosts that are
    /// still on disk: moved away or deleted while it was down (Kafka's stray
    /// replicas). Called with the first image, which the broker has caught
    /// up to, so an assignment cannot be mistaken for a stray.
    fn delete_strays(&self, wanted: &HashMap<&str, HashSet<i32>>) {
        for ((topic, index), path) in self.partition_dirs() {
            if wanted.get(topic.as_str()).is_some_and(|w| w.contains(&index)) {
                continue;
            }
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!(
                    topic,
                    partition = index,
                    "deleted the log of a partition this broker no longer hosts"
                ),
                Err(e) => tracing::warn!(dir = %path.display(), error = %e, "deleting a stray log failed"),
            }
        }
    }

    /// The partition directories (`<topic>-<partition>`) in the logs directory.
    fn partition_dirs(&self) -> Vec<(PartitionKey, PathBuf)> {
        let entries = match std::fs::read_dir(&self.logs_dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %self.logs_dir.display(), error = %e, "cannot list the logs directory");
                return Vec::new();
            }
        };
        entries
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let (topic, index) = name.rsplit_once('-')?;
                Some(((topic.to_string(), index.parse::<i32>().ok()?), entry.path()))
            })
            .collect()
    }

    fn write_checkpoint(&self) {
        let points: BTreeMap<PartitionKey, i64> =
            self.all().iter().map(|p| ((p.topic.clone(), p.index), p.recovery_point())).collect();
        if let Err(e) = self.recovery.write(&points) {
            tracing::warn!(error = %e, "writing the recovery-point checkpoint failed");
        }
    }

    fn flush_due(&self) {
        for p in self.all() {
            if let Err(e) = p.maybe_flush() {
                tracing::error!(topic = %p.topic, partition = p.index, error = %e, "flush failed");
            }
        }
    }

    /// Compaction and retention of every log, on a blocking thread (they
    /// read and write whole segments); stops early at shutdown.
    fn retention(&self, shutdown: &watch::Receiver<bool>) {
        for p in self.all() {
            if *shutdown.borrow() {
                return;
            }
            if let Err(e) = p.apply_retention(&|| *shutdown.borrow()) {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "retention failed");
            }
        }
    }

    /// Follows the applied image and runs the timers until `shutdown`.
    /// Call once the broker has caught up with the metadata log (see
    /// `BrokerLifecycle::wait_caught_up`): a stale image must not open
    /// leaderships.
    pub async fn run(self: Arc<Self>, mut applied: watch::Receiver<AppliedImage>, mut shutdown: watch::Receiver<bool>) {
        let current = applied.borrow_and_update().clone();
        self.apply_applied(&current);
        let mut flush = tokio::time::interval(FLUSH_CHECK);
        let mut checkpoint = tokio::time::interval(CHECKPOINT_EVERY);
        let mut retention =
            tokio::time::interval(Duration::from_millis(self.settings.u64("log.retention.check.interval.ms").max(100)));
        let cleaning = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flushing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let checkpointing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for t in [&mut flush, &mut checkpoint, &mut retention] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        // Each timer's work touches the disk: it runs on a blocking thread,
        // one pass at a time, while the loop goes on following the image.
        loop {
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() { break }
                    let current = applied.borrow_and_update().clone();
                    self.apply_applied(&current);
                }
                _ = flush.tick() => {
                    let me = self.clone();
                    run_once_off_runtime(&flushing, move || me.flush_due());
                }
                _ = checkpoint.tick() => {
                    let me = self.clone();
                    run_once_off_runtime(&checkpointing, move || me.write_checkpoint());
                }
                _ = retention.tick() => {
                    let (me, stop) = (self.clone(), shutdown.clone());
                    run_once_off_runtime(&cleaning, move || me.retention(&stop));
                }
                _ = shutdown.changed() => break,
            }
        }
        self.shutdown();
    }

    /// Flushes every log and writes the checkpoint.
    pub fn shutdown(&self) {
        for p in self.all() {
            if let Err(e) = p.flush() {
                tracing::error!(topic = %p.topic, partition = p.index, error = %e, "flush on shutdown failed");
            }
        }
        self.write_checkpoint();
    }
}

/// Runs `work` on a blocking thread unless the last one `busy` guards is
/// still running.
fn run_once_off_runtime(busy: &Arc<std::sync::atomic::AtomicBool>, work: impl FnOnce() + Send + 'static) {
    if !busy.swap(true, std::sync::atomic::Ordering::AcqRel) {
        let busy = busy.clone();
        tokio::task::spawn_blocking(move || {
            // Cleared even if the work panics, or it would never run again.
            let _clear = ClearOnDrop(busy);
            work();
        });
    }
}

/// Clears its flag when dropped.
struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn cleanup_policy_decides_compaction_and_retention() {
        let settings = Settings::default();
        let (compact, _) = topic_settings(
            &settings,
            &configs(&[
                ("cleanup.policy", "compact"),
                ("retention.ms", "1000"),
                ("min.cleanable.dirty.ratio", "0.1"),
                ("min.compaction.lag.ms", "5000"),
                ("max.compaction.lag.ms", "60000"),
                ("delete.retention.ms", "7"),
            ]),
        );
        assert!(compact.compact && compact.keys_required);
        assert_eq!((compact.retention_ms, compact.retention_bytes), (None, None), "compact alone keeps everything");
        assert_eq!(compact.min_cleanable_dirty_ratio, 0.1);
        assert_eq!(
            (compact.min_compaction_lag_ms, compact.max_compaction_lag_ms, compact.delete_retention_ms),
            (5000, Some(60000), 7)
        );
        let (both, _) =
            topic_settings(&settings, &configs(&[("cleanup.policy", "compact,delete"), ("retention.ms", "1000")]));
        assert!(both.compact);
        assert_eq!(both.retention_ms, Some(1000));
        assert_eq!((both.max_compaction_lag_ms, both.delete_retention_ms), (None, 86_400_000), "Kafka's defaults");
        let (delete, _) = topic_settings(&settings, &configs(&[("retention.ms", "1000")]));
        assert!(!delete.compact && !delete.keys_required);
        assert_eq!(delete.retention_ms, Some(1000));
    }
}
