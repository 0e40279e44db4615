//! Which waiting steps their limits let go now: the pure part of the
//! coordinators' limiter. Storage hands it each key's state (its bucket, the
//! slots in use, a target's hold) and the waiting steps oldest first; it
//! admits every step whose keys all allow one more, takes what they use,
//! and says when a step still waiting could next go.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::definition::limit::Rate;

/// A key's state at a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyState {
    pub rate: Option<Rate>,
    pub concurrency: Option<u32>,
    /// The bucket's tokens as of `refilled_at`.
    pub tokens: f64,
    pub refilled_at: DateTime<Utc>,
    /// Admitted steps of the key not finished.
    pub in_use: u32,
    /// A target's `Retry-After`: nothing goes before it.
    pub held_until: Option<DateTime<Utc>>,
    /// When the first of the slots held by steps that ended elsewhere than
    /// at their worker (a timeout, a cancel) is free: their worker may still
    /// be running them until their lease would have ended.
    pub frees_at: Option<DateTime<Utc>>,
    /// Tokens this pass took (to write back).
    pub taken: u32,
}

impl KeyState {
    pub fn new(rate: Option<Rate>, concurrency: Option<u32>, tokens: f64, refilled_at: DateTime<Utc>) -> KeyState {
        KeyState { rate, concurrency, tokens, refilled_at, in_use: 0, held_until: None, frees_at: None, taken: 0 }
    }

    /// Adds the tokens earned since `refilled_at`, up to the burst.
    pub fn refill(&mut self, now: DateTime<Utc>) {
        let Some(rate) = self.rate else { return };
        let elapsed = (now - self.refilled_at).to_std().unwrap_or_default().as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second()).min(rate.burst as f64).max(0.0);
        self.refilled_at = now;
    }

    /// Why one more step of the key may not go now, if it may not.
    pub fn blocked(&self, now: DateTime<Utc>) -> Option<Blocked> {
        if let Some(until) = self.held_until.filter(|u| *u > now) {
            return Some(Blocked::RetryAfter(until));
        }
        if self.concurrency.is_some_and(|c| self.in_use >= c) {
            return Some(Blocked::Concurrency);
        }
        match self.rate {
            Some(rate) if self.tokens < 1.0 => {
                let secs = (1.0 - self.tokens) / rate.per_second();
                Some(Blocked::Rate(now + chrono::Duration::microseconds((secs * 1e6).ceil() as i64)))
            }
            _ => None,
        }
    }

    /// How many steps of the key alone could go now (at most `cap`).
    pub fn allowance(&self, now: DateTime<Utc>, cap: u32) -> u32 {
        if self.blocked(now).is_some() {
            return 0;
        }
        let mut n = cap;
        if let Some(c) = self.concurrency {
            n = n.min(c.saturating_sub(self.in_use));
        }
        if self.rate.is_some() {
            n = n.min(self.tokens.floor().clamp(0.0, u32::MAX as f64) as u32);
        }
        n
    }

    /// When a key that holds its next step may next let one go, where that
    /// is known: its next token, the end of a hold, a lingering slot's end.
    pub fn next_chance(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.blocked(now)? {
            Blocked::Concurrency => self.frees_at,
            b => b.until(),
        }
    }

    fn take(&mut self) {
        self.in_use += 1;
        if self.rate.is_some() {
            self.tokens -= 1.0;
            self.taken += 1;
        }
    }
}

/// Why a key holds its next step, and until when where that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Its bucket is empty until then.
    Rate(DateTime<Utc>),
    /// Every slot is taken: the next goes when a step of the key ends.
    Concurrency,
    /// A target asked for a pause (`Retry-After`) until then.
    RetryAfter(DateTime<Utc>),
}

impl Blocked {
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::Rate(_) => "rate",
            Blocked::Concurrency => "concurrency",
            Blocked::RetryAfter(_) => "retry_after",
        }
    }

    pub fn until(&self) -> Option<DateTime<Utc>> {
        match self {
            Blocked::Rate(at) | Blocked::RetryAfter(at) => Some(*at),
            Blocked::Concurrency => None,
        }
    }
}

/// What a pass decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Admission {
    /// Indices of the admitted steps, in the order given.
    pub admitted: Vec<usize>,
    /// How long until a step still waiting may go by its keys' rates or
    /// holds; `None` when only ended steps (concurrency) can free one.
    pub next_in: Option<Duration>,
}

/// Admits, oldest first, every step in `waiting` (each its list of keys)
/// whose keys all allow one more step, taking a slot and a token of each.
/// A key without state is not limited. A step that must wait takes
/// nothing, so it holds back only the steps that need what it lacks.
pub fn admit(keys: &mut HashMap<String, KeyState>, waiting: &[Vec<String>], now: DateTime<Utc>) -> Admission {
    for state in keys.values_mut() {
        state.refill(now);
    }
    let mut out = Admission::default();
    let mut next: Option<DateTime<Utc>> = None;
    for (i, step) in waiting.iter().enumerate() {
        let mut go = true;
        for key in step {
            if let Some(k) = keys.get(key).filter(|k| k.blocked(now).is_some()) {
                go = false;
                if let Some(at) = k.next_chance(now) {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        if go {
            for key in step {
                if let Some(k) = keys.get_mut(key) {
                    k.take();
                }
            }
            out.admitted.push(i);
        }
    }
    out.next_in = next.map(|at| (at - now).to_std().unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc()
    }

    fn rate(count: u32, per_ms: u64, burst: u32) -> Option<Rate> {
        Some(Rate { count, per: Duration::from_millis(per_ms), burst })
    }

    fn steps(keys: &[&[&str]]) -> Vec<Vec<String>> {
        keys.iter().map(|k| k.iter().map(|s| s.to_string()).collect()).collect()
    }

    #[test]
    fn a_bucket_lets_its_tokens_go_then_says_when_the_next_one_comes() {
        let mut keys = HashMap::from([("s".to_string(), KeyState::new(rate(10, 1000, 3), None, 3.0, t0()))]);
        let a = admit(&mut keys, &steps(&[&["s"], &["s"], &["s"], &["s"]]), t0());
        assert_eq!(a.admitted, vec![0, 1, 2]);
        assert_eq!(a.next_in, Some(Duration::from_millis(100)), "one token every 100 ms");
        assert_eq!(keys["s"].taken, 3);
        // 250 ms later: two tokens earned.
        let later = t0() + chrono::Duration::milliseconds(250);
        let a = admit(&mut keys, &steps(&[&["s"], &["s"], &["s"]]), later);
        assert_eq!(a.admitted, vec![0, 1]);
        assert_eq!(a.next_in, Some(Duration::from_millis(50)));
    }

    #[test]
    fn a_full_concurrency_holds_until_a_step_ends_and_other_keys_go_on() {
        let mut keys = HashMap::from([
            ("crm".to_string(), KeyState::new(None, Some(2), 0.0, t0())),
            ("other".to_string(), KeyState::new(None, Some(5), 0.0, t0())),
        ]);
        keys.get_mut("crm").unwrap().in_use = 1;
        let a = admit(&mut keys, &steps(&[&["crm"], &["crm", "other"], &["other"], &["unlimited"]]), t0());
        assert_eq!(a.admitted, vec![0, 2, 3], "the second crm step waits; the others do not wait behind it");
        assert_eq!(a.next_in, None, "only an ending step frees a slot");
        assert_eq!((keys["crm"].in_use, keys["other"].in_use), (2, 1));
    }

    #[test]
    fn a_slot_held_past_its_steps_end_says_when_it_frees_and_allowance_counts_what_could_go() {
        let mut k = KeyState::new(None, Some(3), 0.0, t0());
        k.in_use = 3;
        k.frees_at = Some(t0() + chrono::Duration::seconds(4));
        assert_eq!((k.allowance(t0(), 100), k.next_chance(t0())), (0, k.frees_at));
        k.in_use = 1;
        assert_eq!(k.allowance(t0(), 100), 2);
        let mut r = KeyState::new(rate(10, 1000, 10), Some(8), 3.7, t0());
        r.refill(t0());
        assert_eq!((r.allowance(t0(), 100), r.allowance(t0(), 2)), (3, 2));
        assert_eq!(KeyState::new(None, None, 0.0, t0()).allowance(t0(), 50), 50, "unlimited: the cap");
    }

    #[test]
    fn a_retry_after_holds_the_key_until_it_passes() {
        let mut k = KeyState::new(rate(100, 1000, 100), None, 100.0, t0());
        k.held_until = Some(t0() + chrono::Duration::seconds(30));
        let mut keys = HashMap::from([("s".to_string(), k)]);
        let a = admit(&mut keys, &steps(&[&["s"]]), t0());
        assert_eq!((a.admitted.len(), a.next_in), (0, Some(Duration::from_secs(30))));
        let a = admit(&mut keys, &steps(&[&["s"]]), t0() + chrono::Duration::seconds(30));
        assert_eq!(a.admitted, vec![0]);
    }

    proptest! {
        /// Over any schedule of passes, a key never lets more steps go than
        /// its burst plus what its rate earned, nor more at once than its
        /// concurrency.
        #[test]
        fn no_pass_schedule_exceeds_a_rate_or_a_concurrency(
            count in 1u32..50, per_ms in 1u64..5000, burst in 1u32..50, conc in 1u32..10,
            passes in proptest::collection::vec((0u64..3000, 0usize..20, 0u32..5), 1..40),
        ) {
            let mut keys = HashMap::from([
                ("r".to_string(), KeyState::new(rate(count, per_ms, burst), None, burst as f64, t0())),
                ("c".to_string(), KeyState::new(None, Some(conc), 0.0, t0())),
            ]);
            let mut now = t0();
            let mut went = 0u64;
            for (gap, want, ended) in passes {
                now += chrono::Duration::milliseconds(gap as i64);
                let c = keys.get_mut("c").unwrap();
                c.in_use = c.in_use.saturating_sub(ended);
                let waiting = vec![vec!["r".to_string(), "c".to_string()]; want];
                let a = admit(&mut keys, &waiting, now);
                went += a.admitted.len() as u64;
                prop_assert!(keys["c"].in_use <= conc);
                let earned = (now - t0()).num_milliseconds() as f64 / per_ms as f64 * count as f64;
                prop_assert!(went as f64 <= burst as f64 + earned + 1e-6, "{went} > {burst} + {earned}");
            }
        }
    }
}
