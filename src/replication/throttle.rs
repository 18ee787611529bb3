//! The replication throttle (Kafka's `leader.replication.throttled.rate` and
//! `follower.replication.throttled.rate`): a token bucket per direction that
//! bounds the bytes per second of reassignment catch-up traffic, that is,
//! fetches of replicas a reassignment adds while they are not in the ISR.
//! Normal ISR replication never passes through it.
//!
//! Pure: time comes in as an argument. The bucket holds one second of
//! tokens, and at least [`MIN_BURST_BYTES`] so that a batch larger than a
//! small rate still fits in one allowance; the first batch of a response may
//! overdraw it (it is sent whole), and nothing more is allowed until the
//! debt is paid, so the average stays at the rate.

use std::sync::Mutex;

/// Kafka's "no limit" value for the throttled rates (Long.MAX_VALUE).
pub const UNLIMITED: u64 = i64::MAX as u64;
/// The least the bucket holds when full: a default-sized batch (Kafka's
/// `message.max.bytes` is about 1 MB).
pub const MIN_BURST_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    rate_bytes_per_s: u64,
    tokens: f64,
    last_ms: i64,
}

impl TokenBucket {
    pub fn new(rate_bytes_per_s: u64, now_ms: i64) -> Self {
        Self { rate_bytes_per_s, tokens: Self::burst(rate_bytes_per_s), last_ms: now_ms }
    }

    fn burst(rate_bytes_per_s: u64) -> f64 {
        rate_bytes_per_s.max(MIN_BURST_BYTES) as f64
    }

    pub fn is_unlimited(&self) -> bool {
        self.rate_bytes_per_s >= UNLIMITED
    }

    /// Changes the rate (a dynamic config change); tokens in hand stay.
    pub fn set_rate(&mut self, rate_bytes_per_s: u64) {
        self.rate_bytes_per_s = rate_bytes_per_s;
        self.tokens = self.tokens.min(Self::burst(rate_bytes_per_s));
    }

    fn refill(&mut self, now_ms: i64) {
        let elapsed_ms = (now_ms - self.last_ms).max(0);
        self.last_ms = self.last_ms.max(now_ms);
        let rate = self.rate_bytes_per_s as f64;
        self.tokens = (self.tokens + rate * elapsed_ms as f64 / 1000.0).min(Self::burst(self.rate_bytes_per_s));
    }

    /// Bytes that may be read now: `None` when unlimited, `Some(0)` while
    /// the bucket is in debt. A positive allowance lets one whole batch go
    /// even if larger (the overdraft is paid back by waiting).
    pub fn allowance(&mut self, now_ms: i64) -> Option<usize> {
        if self.is_unlimited() {
            return None;
        }
        self.refill(now_ms);
        Some(if self.tokens >= 1.0 { self.tokens as usize } else { 0 })
    }

    /// Takes `bytes` that were sent (or received).
    pub fn record(&mut self, bytes: usize, now_ms: i64) {
        if self.is_unlimited() {
            return;
        }
        self.refill(now_ms);
        self.tokens -= bytes as f64;
    }

    /// Milliseconds until the bucket is out of debt (0 when it is).
    /// A rate of 0 stops the traffic: ask again in a second.
    pub fn wait_ms(&self) -> u64 {
        if self.is_unlimited() || self.tokens >= 1.0 {
            0
        } else if self.rate_bytes_per_s == 0 {
            1000
        } else {
            ((1.0 - self.tokens) * 1000.0 / self.rate_bytes_per_s as f64).ceil() as u64
        }
    }
}

/// A bucket shared by the tasks of one direction.
#[derive(Debug)]
pub struct SharedBucket(Mutex<TokenBucket>);

impl SharedBucket {
    pub fn unlimited() -> Self {
        Self(Mutex::new(TokenBucket::new(UNLIMITED, 0)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TokenBucket> {
        // A panic elsewhere mid-update leaves a usable bucket.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_rate(&self, rate_bytes_per_s: u64) {
        let mut b = self.lock();
        if b.rate_bytes_per_s != rate_bytes_per_s {
            b.set_rate(rate_bytes_per_s);
        }
    }

    pub fn allowance(&self, now_ms: i64) -> Option<usize> {
        self.lock().allowance(now_ms)
    }

    /// No rate set (the default): nothing passes through this bucket.
    pub fn is_unlimited(&self) -> bool {
        self.lock().is_unlimited()
    }

    pub fn record(&self, bytes: usize, now_ms: i64) {
        self.lock().record(bytes, now_ms)
    }

    pub fn wait_ms(&self) -> u64 {
        self.lock().wait_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_never_limits() {
        let mut b = TokenBucket::new(UNLIMITED, 0);
        b.record(1 << 40, 0);
        assert_eq!(b.allowance(0), None);
        assert_eq!(b.wait_ms(), 0);
    }

    #[test]
    fn the_average_stays_at_the_rate() {
        // 10 MB/s; a reader that takes all it may, in 256 kB batches, polling
        // every 10 ms for 60 s, gets 60 s worth plus one burst, within a batch.
        let rate = 10_000_000u64;
        let mut b = TokenBucket::new(rate, 0);
        let mut sent = 0u64;
        for now in (0..60_000).step_by(10) {
            if b.allowance(now).is_some_and(|a| a > 0) {
                b.record(262_144, now);
                sent += 262_144;
            }
        }
        let expected = rate * 60 + rate;
        assert!(sent <= expected + 262_144 && sent + 262_144 >= expected, "sent {sent}, expected {expected}");
    }

    #[test]
    fn debt_is_paid_by_waiting() {
        let mut b = TokenBucket::new(2_000_000, 0);
        assert_eq!(b.allowance(0), Some(2_000_000));
        b.record(6_000_000, 0);
        assert_eq!(b.allowance(0), Some(0));
        assert_eq!(b.wait_ms(), 2_001);
        assert_eq!(b.allowance(1_500), Some(0));
        assert!(b.allowance(2_001).is_some_and(|a| a >= 1));
    }

    #[test]
    fn a_small_rate_still_lets_a_whole_batch_through() {
        let mut b = TokenBucket::new(1_000, 0);
        assert_eq!(b.allowance(0), Some(MIN_BURST_BYTES as usize));
        // One batch of two bursts goes whole; paying it back at 1 kB/s takes
        // about 1,049 s.
        b.record(2 * MIN_BURST_BYTES as usize, 0);
        assert_eq!(b.allowance(1_000_000), Some(0));
        assert!(b.allowance(1_049_000).is_some_and(|a| a > 0));
    }

    #[test]
    fn a_rate_change_applies_at_once_and_caps_the_burst() {
        let mut b = TokenBucket::new(100_000_000, 0);
        b.set_rate(100);
        assert_eq!(b.allowance(0), Some(MIN_BURST_BYTES as usize));
        b.set_rate(UNLIMITED);
        assert_eq!(b.allowance(0), None);
        b.set_rate(0);
        b.record(MIN_BURST_BYTES as usize, 0);
        assert_eq!(b.allowance(10_000), Some(0), "a rate of 0 moves nothing more");
    }
}
