//! Client quotas (KIP-13, KIP-55): produce and fetch byte rates per user and
//! client id, with defaults, kept in the metadata quorum.
//!
//! A request's quota is found as Kafka finds it, the first entity that sets
//! the key, in this order: user and client id, user and default client,
//! user, default user and client id, default user and default client,
//! default user, client id, default client. Default entities apply to each
//! user (or client) on its own: the rate is measured per actual name.
//!
//! Rates are measured over `quota.window.num` windows of
//! `quota.window.size.seconds` (Kafka's Rate: the window counts as at least
//! `num - 1` windows long). A client over its quota is answered with
//! `throttle_time_ms = (rate - quota) / quota * window`, and its connection
//! reads nothing more for that long (KIP-219). `request_percentage` (KIP-124)
//! counts the time spent handling a client's requests, as a percentage of
//! one thread: over it, the connection is muted the same way (the answers
//! do not carry that throttle time).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use strom_raft::records::{EntityName, QuotaEntity};
use strom_raft::MetadataImage;

use crate::config::Settings;
use crate::error::{ApiError, ErrorCode};

pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// The quota keys Strom knows.
pub const KEYS: &[&str] = &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE];

/// Checks one quota value.
pub fn check(entity: &QuotaEntity, key: &str, value: Option<f64>) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::InvalidRequest, m);
    if entity.user == EntityName::Unset && entity.client_id == EntityName::Unset {
        return Err(bad("a quota entity names a user, a client id, or both".into()));
    }
    if !KEYS.contains(&key) {
        return Err(bad(format!("`{key}` is not a quota Strom knows ({})", KEYS.join(", "))));
    }
    if let Some(v) = value {
        if !v.is_finite() || v <= 0.0 {
            return Err(bad(format!("{key} must be a positive number, got {v}")));
        }
    }
    Ok(())
}

/// The entity whose `key` applies to `user` and `client_id`, and its value:
/// the first of Kafka's precedence order that sets it.
pub fn resolve(image: &MetadataImage, user: &str, client_id: &str, key: &str) -> Option<(QuotaEntity, f64)> {
    if image.client_quotas.is_empty() {
        return None;
    }
    let named = |s: &str| EntityName::Named(s.to_string());
    let order = [
        (named(user), named(client_id)),
        (named(user), EntityName::Default),
        (named(user), EntityName::Unset),
        (EntityName::Default, named(client_id)),
        (EntityName::Default, EntityName::Default),
        (EntityName::Default, EntityName::Unset),
        (EntityName::Unset, named(client_id)),
        (EntityName::Unset, EntityName::Default),
    ];
    for (u, c) in order {
        let entity = QuotaEntity { user: u, client_id: c };
        if let Some(value) = image.client_quotas.get(&entity).and_then(|v| v.get(key)) {
            // Rates are kept per actual name, also under a default entity.
            let measured = QuotaEntity {
                user: if entity.user == EntityName::Default { named(user) } else { entity.user },
                client_id: if entity.client_id == EntityName::Default { named(client_id) } else { entity.client_id },
            };
            return Some((measured, *value));
        }
    }
    None
}

/// Bytes in fixed windows, Kafka's Rate.
#[derive(Debug)]
struct Sensor {
    windows: VecDeque<(u64, f64)>,
}

impl Sensor {
    /// Takes back `bytes` just recorded (in the newest window).
    fn unrecord(&mut self, bytes: f64) {
        if let Some((_, b)) = self.windows.back_mut() {
            *b = (*b - bytes).max(0.0);
        }
    }

    /// Records `bytes` at `now_ms`; the rate over the kept windows after it, in bytes/s.
    fn record(&mut self, bytes: f64, now_ms: u64, window_ms: u64, samples: usize) -> (f64, u64) {
        let start = now_ms - now_ms % window_ms;
        match self.windows.back_mut() {
            Some((s, b)) if *s == start => *b += bytes,
            _ => self.windows.push_back((start, bytes)),
        }
        while self.windows.front().is_some_and(|(s, _)| *s + window_ms * samples as u64 <= now_ms) {
            self.windows.pop_front();
        }
        let oldest = self.windows.front().map_or(start, |(s, _)| *s);
        // The measured window is never shorter than `samples - 1` windows.
        let elapsed = (now_ms - oldest).max(window_ms * (samples as u64 - 1)).max(1);
        let total: f64 = self.windows.iter().map(|(_, b)| b).sum();
        (total * 1000.0 / elapsed as f64, elapsed)
    }
}

/// Which rate a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Bytes produced.
    Produce,
    /// Bytes fetched.
    Fetch,
    /// Microseconds spent handling requests.
    Request,
}

impl QuotaKind {
    fn key(self) -> &'static str {
        match self {
            Self::Produce => PRODUCER_BYTE_RATE,
            Self::Fetch => CONSUMER_BYTE_RATE,
            Self::Request => REQUEST_PERCENTAGE,
        }
    }

    /// The quota's value in the unit recorded per second: bytes/s, or for
    /// `request_percentage` (percent of one thread) microseconds per second.
    fn per_second(self, quota: f64) -> f64 {
        match self {
            Self::Request => quota * 10_000.0,
            _ => quota,
        }
    }
}

/// The rates of the clients that have quotas, on this broker.
pub struct QuotaManager {
    window_ms: u64,
    samples: usize,
    sensors: Mutex<HashMap<(QuotaKind, QuotaEntity), Sensor>>,
}

impl QuotaManager {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            window_ms: settings.u64("quota.window.size.seconds").max(1) * 1000,
            samples: (settings.u64("quota.window.num") as usize).max(2),
            sensors: Mutex::new(HashMap::new()),
        }
    }

    /// Records `bytes` of `kind` (microseconds for [`QuotaKind::Request`])
    /// for the client; the time it must be throttled for, in ms (0 when
    /// within its quota or without one).
    pub fn record(
        &self,
        image: &MetadataImage,
        kind: QuotaKind,
        principal: &str,
        client_id: &str,
        bytes: usize,
        now_ms: u64,
    ) -> u64 {
        let user = principal.strip_prefix("User:").unwrap_or(principal);
        let Some((entity, quota)) = resolve(image, user, client_id, kind.key()) else { return 0 };
        let quota = kind.per_second(quota);
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        let sensor = sensors.entry((kind, entity)).or_insert_with(|| Sensor { windows: VecDeque::new() });
        let (rate, elapsed_ms) = sensor.record(bytes as f64, now_ms, self.window_ms, self.samples);
        if rate <= quota {
            return 0;
        }
        let throttle = (rate - quota) / quota * elapsed_ms as f64;
        (throttle as u64).min(self.window_ms * self.samples as u64)
    }

    /// A Fetch answer of `bytes` for the client: Kafka's rule. If sending it
    /// would take the client over its quota, it is not sent (not recorded
    /// either): the client gets an empty answer and the throttle time after
    /// which it would fit. An answer is always sent when nothing else is in
    /// the measured windows, so an answer larger than the quota allows in a
    /// whole measurement still goes out, then throttles the client.
    pub fn admit(
        &self,
        image: &MetadataImage,
        kind: QuotaKind,
        principal: &str,
        client_id: &str,
        bytes: usize,
        now_ms: u64,
    ) -> Admission {
        let user = principal.strip_prefix("User:").unwrap_or(principal);
        let Some((entity, quota)) = resolve(image, user, client_id, kind.key()) else {
            return Admission::Send { throttle_ms: 0 };
        };
        let quota = kind.per_second(quota);
        let max_throttle = self.window_ms * self.samples as u64;
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        let sensor = sensors.entry((kind, entity)).or_insert_with(|| Sensor { windows: VecDeque::new() });
        let before: f64 = sensor.windows.iter().map(|(_, b)| b).sum();
        let (rate, elapsed_ms) = sensor.record(bytes as f64, now_ms, self.window_ms, self.samples);
        if rate <= quota {
            return Admission::Send { throttle_ms: 0 };
        }
        let throttle_ms = (((rate - quota) / quota * elapsed_ms as f64) as u64).min(max_throttle);
        let others: f64 = sensor.windows.iter().map(|(_, b)| b).sum::<f64>() - bytes as f64;
        if before > 0.0 && others > 0.0 {
            sensor.unrecord(bytes as f64);
            return Admission::Withhold { throttle_ms };
        }
        Admission::Send { throttle_ms }
    }
}

/// What [`QuotaManager::admit`] decided for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send it; then throttle the client this long (0: not at all).
    Send { throttle_ms: u64 },
    /// Send an empty answer instead, throttled this long.
    Withhold { throttle_ms: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_raft::MetadataRecord;

    fn image(quotas: &[(EntityName, EntityName, &str, f64)]) -> MetadataImage {
        let mut img = MetadataImage::default();
        for (user, client_id, key, value) in quotas {
            let entity = QuotaEntity { user: user.clone(), client_id: client_id.clone() };
            img.apply(&MetadataRecord::ClientQuota { entity, key: key.to_string(), value: Some(*value) })
                .expect("applies");
        }
        img
    }

    fn named(s: &str) -> EntityName {
        EntityName::Named(s.into())
    }

    #[test]
    fn the_most_specific_entity_wins_and_defaults_apply_per_name() {
        use EntityName::{Default, Unset};
        let img = image(&[
            (Unset, Default, PRODUCER_BYTE_RATE, 1.0),
            (Unset, named("etl"), PRODUCER_BYTE_RATE, 2.0),
            (Default, Unset, PRODUCER_BYTE_RATE, 3.0),
            (named("alice"), Unset, PRODUCER_BYTE_RATE, 4.0),
            (named("alice"), named("etl"), PRODUCER_BYTE_RATE, 5.0),
        ]);
        let value = |u, c| resolve(&img, u, c, PRODUCER_BYTE_RATE).map(|(e, v)| (v, e));
        assert_eq!(value("alice", "etl").map(|(v, _)| v), Some(5.0));
        assert_eq!(value("alice", "other").map(|(v, _)| v), Some(4.0));
        let (v, e) = value("bob", "etl").expect("the default user");
        assert_eq!((v, e.user, e.client_id), (3.0, named("bob"), Unset), "measured per user");
        assert!(resolve(&img, "bob", "etl", CONSUMER_BYTE_RATE).is_none());
        let only_clients =
            image(&[(Unset, Default, PRODUCER_BYTE_RATE, 1.0), (Unset, named("etl"), PRODUCER_BYTE_RATE, 2.0)]);
        assert_eq!(resolve(&only_clients, "bob", "etl", PRODUCER_BYTE_RATE).map(|x| x.1), Some(2.0));
        let (e, _) = resolve(&only_clients, "bob", "x", PRODUCER_BYTE_RATE).expect("default client");
        assert_eq!(e.client_id, named("x"));
    }

    #[test]
    fn over_the_quota_the_throttle_brings_the_rate_back() {
        let img = image(&[(EntityName::Unset, named("slow"), PRODUCER_BYTE_RATE, 1000.0)]);
        let mut settings = Settings::default();
        settings.set("quota.window.num", "11").expect("set");
        let q = QuotaManager::from_settings(&settings);
        // 10 windows' worth at once is within the quota (the window counts as 10 s).
        assert_eq!(q.record(&img, QuotaKind::Produce, "User:x", "slow", 10_000, 100_000), 0);
        // 10 s more at once: the rate is 2x the quota, so 10 s of throttle.
        let t = q.record(&img, QuotaKind::Produce, "User:x", "slow", 10_000, 100_000);
        assert_eq!(t, 10_000);
        assert_eq!(q.record(&img, QuotaKind::Produce, "User:x", "fast", 1 << 30, 100_000), 0, "no quota");
        assert_eq!(q.record(&img, QuotaKind::Fetch, "User:x", "slow", 1 << 30, 100_000), 0, "another kind");
    }

    #[test]
    fn a_fetch_answer_over_the_quota_is_withheld_unless_it_is_alone() {
        let img = image(&[(EntityName::Unset, named("slow"), CONSUMER_BYTE_RATE, 1000.0)]);
        let mut settings = Settings::default();
        settings.set("quota.window.num", "2").expect("set");
        let q = QuotaManager::from_settings(&settings);
        let admit = |bytes, now| q.admit(&img, QuotaKind::Fetch, "User:x", "slow", bytes, now);
        // Alone in the windows: sent, however large, then throttled.
        assert_eq!(admit(3000, 100_000), Admission::Send { throttle_ms: 2000 });
        // Over the quota with the first one still measured: withheld, and
        // not counted, so the same answer is withheld again for the same reason.
        let Admission::Withhold { throttle_ms } = admit(500, 100_500) else { panic!("withheld") };
        assert!(throttle_ms > 0);
        assert_eq!(admit(500, 100_500), Admission::Withhold { throttle_ms });
        // Once the first answer's window has passed, it fits again.
        assert_eq!(admit(500, 102_000), Admission::Send { throttle_ms: 0 });
        assert_eq!(
            q.admit(&img, QuotaKind::Fetch, "User:x", "other", 1 << 30, 100_000),
            Admission::Send { throttle_ms: 0 },
            "no quota"
        );
    }

    #[test]
    fn bad_quotas_are_refused() {
        let e = QuotaEntity { user: EntityName::Unset, client_id: named("c") };
        assert!(check(&e, PRODUCER_BYTE_RATE, Some(1.0)).is_ok());
        assert!(check(&e, PRODUCER_BYTE_RATE, None).is_ok());
        assert!(check(&e, "controller_mutation_rate", Some(1.0)).is_err());
        assert!(check(&e, PRODUCER_BYTE_RATE, Some(0.0)).is_err());
        assert!(check(&e, PRODUCER_BYTE_RATE, Some(f64::NAN)).is_err());
        let none = QuotaEntity { user: EntityName::Unset, client_id: EntityName::Unset };
        assert!(check(&none, PRODUCER_BYTE_RATE, Some(1.0)).is_err());
    }
}
