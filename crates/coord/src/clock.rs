//! The coordinator's clock is PostgreSQL's. Leases and due timers are
//! compared with PostgreSQL's `now()` in SQL; every time the coordinator
//! computes itself (a WAIT's `wake_at`, a step's deadline, a schedule's next
//! fire, a rate limit's window, the history's timestamps) is PostgreSQL's
//! clock as read at the last measurement (at start and at every timer pass)
//! plus what this process's monotonic clock counted since. So a host whose
//! wall clock runs ahead or behind, or jumps, does not move a timer: the
//! error is the measurement's, at most half its round trip, plus what the
//! monotonic clock drifted since the last one.
//!
//! A skew larger than `COMPOSER_MAX_CLOCK_SKEW` means a host that is not
//! kept in time (no NTP): the coordinator refuses to start. A running one
//! logs an error when the skew grows past it and goes on working, on
//! PostgreSQL's clock: its `/readyz` does not fail for it, since which clock
//! is wrong cannot be told from here, and when PostgreSQL's is, every
//! coordinator would be taken out of service at once. `chrono::Utc::now` is refused by clippy
//! in this crate (clippy.toml), so this is the only way to read the time.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// PostgreSQL's clock at the last measurement, and this process's monotonic
/// clock then: the time now is the one plus what the other counted since.
/// The monotonic clock does not move when the wall clock is set or jumps.
/// One value per process: every coordinator of a process reads one host,
/// and a cluster has one PostgreSQL primary.
static BASE: Mutex<Option<(DateTime<Utc>, Instant)>> = Mutex::new(None);
/// Whether the last measurement found a skew over the allowed one (an
/// error is logged when it begins).
static TOO_FAR: AtomicBool = AtomicBool::new(false);

/// The latest time [`now`] returned, in unix microseconds: a new
/// measurement may put the clock back by a fraction of a round trip, and
/// time read here never goes back (a step would otherwise end before it began).
static LAST_MICROS: AtomicI64 = AtomicI64::new(i64::MIN);

/// The time now, on PostgreSQL's clock (this host's until the first
/// measurement); never earlier than a time it returned before.
pub fn now() -> DateTime<Utc> {
    let base = *BASE.lock().unwrap_or_else(|e| e.into_inner());
    not_before(reading(base), &LAST_MICROS)
}

/// PostgreSQL's time at the measurement plus the monotonic time since.
fn reading(base: Option<(DateTime<Utc>, Instant)>) -> DateTime<Utc> {
    match base {
        Some((theirs, at)) => theirs + chrono::Duration::from_std(at.elapsed()).unwrap_or_default(),
        #[allow(clippy::disallowed_methods)] // nothing measured yet: the host's clock
        None => Utc::now(),
    }
}

/// `t`, or the latest time returned before when that is later.
fn not_before(t: DateTime<Utc>, last: &AtomicI64) -> DateTime<Utc> {
    let micros = t.timestamp_micros();
    let before = last.fetch_max(micros, Ordering::Relaxed);
    if before > micros {
        return DateTime::from_timestamp_micros(before).unwrap_or(t);
    }
    t
}

/// What one measurement found.
#[derive(Debug, Clone, Copy)]
pub struct Skew {
    /// PostgreSQL's clock minus this host's.
    pub offset: chrono::Duration,
    /// The round trip of the measuring query: the offset is right to half of it.
    pub round_trip: Duration,
}

impl Skew {
    /// The offset's size, as a `Duration`.
    pub fn size(&self) -> Duration {
        self.offset.abs().to_std().unwrap_or(Duration::MAX)
    }

    /// "3.2 s ahead of PostgreSQL's" or "behind".
    pub fn describe(&self) -> String {
        let way = if self.offset > chrono::Duration::zero() { "behind" } else { "ahead of" };
        format!("this host's clock is {:.1} s {way} PostgreSQL's", self.size().as_secs_f64())
    }
}

/// Reads PostgreSQL's clock and keeps the offset to this host's; tells
/// whether it is within `allowed`.
pub async fn measure(pool: &composer_store::Pool, allowed: Duration) -> Result<Skew, composer_store::Error> {
    let client = composer_store::client(pool).await?;
    let sent = Instant::now();
    #[allow(clippy::disallowed_methods)] // measuring the host's clock against PostgreSQL's
    let before = Utc::now();
    let row = client.query_one("SELECT clock_timestamp()", &[]).await?;
    let round_trip = sent.elapsed();
    let theirs: DateTime<Utc> = row.get(0);
    let half = round_trip / 2;
    let midway = before + chrono::Duration::from_std(half).unwrap_or_default();
    let skew = Skew { offset: theirs - midway, round_trip };
    *BASE.lock().unwrap_or_else(|e| e.into_inner()) = Some((theirs, sent + half));
    let too_far = skew.size() > allowed;
    if too_far && !TOO_FAR.swap(true, Ordering::Relaxed) {
        tracing::error!(skew = %skew.describe(), allowed = ?allowed, "clock skew over COMPOSER_MAX_CLOCK_SKEW");
    } else if !too_far && TOO_FAR.swap(false, Ordering::Relaxed) {
        tracing::warn!(skew = %skew.describe(), "clock skew back within COMPOSER_MAX_CLOCK_SKEW");
    }
    crate::metrics::set(composer_metrics::CLOCK_OFFSET, &[], skew.offset.num_milliseconds() as f64 / 1000.0);
    Ok(skew)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_runs_on_from_the_last_measurement_by_the_monotonic_clock() {
        let then = DateTime::parse_from_rfc3339("2020-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let since = (reading(Some((then, Instant::now() - Duration::from_secs(10)))) - then).to_std().unwrap();
        assert!(since >= Duration::from_secs(10) && since < Duration::from_secs(60), "{since:?}");
    }

    #[test]
    fn a_measurement_that_puts_the_clock_back_does_not_put_time_back() {
        let last = AtomicI64::new(i64::MIN);
        let later = DateTime::parse_from_rfc3339("2020-01-01T00:00:01Z").unwrap().with_timezone(&Utc);
        let earlier = later - chrono::Duration::milliseconds(3);
        assert_eq!(not_before(later, &last), later);
        assert_eq!(not_before(earlier, &last), later);
        let after = later + chrono::Duration::milliseconds(1);
        assert_eq!(not_before(after, &last), after);
    }

    #[test]
    fn a_skew_says_which_way_the_host_is_off() {
        let ahead = Skew { offset: chrono::Duration::milliseconds(-30_200), round_trip: Duration::ZERO };
        assert_eq!(ahead.describe(), "this host's clock is 30.2 s ahead of PostgreSQL's");
        let behind = Skew { offset: chrono::Duration::seconds(3), round_trip: Duration::ZERO };
        assert_eq!(behind.describe(), "this host's clock is 3.0 s behind PostgreSQL's");
        assert_eq!(behind.size(), Duration::from_secs(3));
    }
}
