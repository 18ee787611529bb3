//! The broker's two clocks.
//!
//! [`wall_ms`] is the time of day: record timestamps, retention, commit
//! timestamps, anything compared with a time a client or another node wrote.
//! [`mono_ms`] only ever moves forward at the pace of real time: every
//! duration the broker measures on itself (how long the controller has been
//! silent, how long a follower has lagged, rate windows, recheck intervals)
//! uses it, so a step of the system clock (NTP, an operator, a VM resumed)
//! neither fences a healthy broker nor hides a silent controller. The fault
//! harness's clock nemesis jumps the wall clock to check exactly this.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Milliseconds on a monotonic clock that starts near 0 with the process;
/// meaningful only as a difference between two readings.
pub fn mono_ms() -> i64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_never_goes_back() {
        let a = mono_ms();
        let b = mono_ms();
        assert!(a >= 0 && b >= a);
        assert!(wall_ms() > 1_600_000_000_000);
    }
}
