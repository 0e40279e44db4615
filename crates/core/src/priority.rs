//! Priorities, 1 (served first) to 5, and the weighted share that serves
//! them without starving any.
//!
//! Each level has a weight: 16, 8, 4, 2 and 1. Whoever hands out work (a
//! worker giving its free slots to the messages it read, a poll of the task
//! API choosing which level's streams to read first) asks a [`Share`] for
//! the next level, among the levels that have work. A [`Share`] is a smooth
//! weighted round robin: over any 31 picks with all five levels waiting,
//! level 1 gets 16, level 2 gets 8, …, level 5 gets 1, spread evenly rather
//! than in runs; with only levels 1 and 5 waiting, 16 of every 17 picks go
//! to level 1 and 1 to level 5. No level waits for ever.

use serde_json::Value;

/// The first-served level.
pub const HIGHEST: u8 = 1;
/// The last-served level.
pub const LOWEST: u8 = 5;
/// The level of a run whose definition and start name none.
pub const DEFAULT: u8 = 3;
/// The least urgent level of urgent work, every level served before the
/// default: it has a transaction loop of its own in each coordinator, and a
/// worker's urgent slots (`COMPOSER_WORKER_URGENT_SLOTS`) run only it.
pub const URGENT: u8 = DEFAULT - 1;
/// Each level's weight, level 1 first.
pub const WEIGHTS: [i64; 5] = [16, 8, 4, 2, 1];

/// Every level, first-served first.
pub fn levels() -> impl Iterator<Item = u8> {
    HIGHEST..=LOWEST
}

/// A priority written in JSON (`1` to `5`, `2.0` too): the level, or what is
/// wrong with it.
pub fn parse(v: &Value) -> Result<u8, String> {
    let n = v.as_f64().filter(|n| n.fract() == 0.0);
    match n {
        Some(n) if (HIGHEST as f64..=LOWEST as f64).contains(&n) => Ok(n as u8),
        _ => Err(format!("must be a whole number from {HIGHEST} (first) to {LOWEST} (last), got {v}")),
    }
}

/// Whether `p` is a level.
pub fn is_level(p: i64) -> bool {
    (HIGHEST as i64..=LOWEST as i64).contains(&p)
}

/// A smooth weighted round robin over the levels (see the module's doc).
#[derive(Debug, Clone, Default)]
pub struct Share {
    current: [i64; 5],
}

impl Share {
    /// The next level to serve among those `waiting` says have work; `None`
    /// when none has.
    pub fn next(&mut self, waiting: impl Fn(u8) -> bool) -> Option<u8> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for (i, w) in WEIGHTS.iter().enumerate() {
            if !waiting(i as u8 + HIGHEST) {
                continue;
            }
            self.current[i] += w;
            total += w;
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        self.current[best] -= total;
        Some(best as u8 + HIGHEST)
    }

    /// Takes back the pick of `level` that [`Share::next`] just made with
    /// the same `waiting` (it turned out to have no work): as if it had not
    /// been made.
    pub fn take_back(&mut self, level: u8, waiting: impl Fn(u8) -> bool) {
        let mut total = 0;
        for (i, w) in WEIGHTS.iter().enumerate() {
            if waiting(i as u8 + HIGHEST) {
                self.current[i] -= w;
                total += w;
            }
        }
        if let Some(c) = self.current.get_mut(usize::from(level.saturating_sub(HIGHEST))) {
            *c += total;
        }
    }

    /// The share's state, to carry it through a script that picks as
    /// [`Share::next`] does (the task API's reads on Redis).
    pub fn state(&self) -> [i64; 5] {
        self.current
    }

    /// A share in the state [`Share::state`] gave.
    pub fn with_state(current: [i64; 5]) -> Share {
        Share { current }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn picks(share: &mut Share, waiting: &[u8], n: usize) -> [usize; 5] {
        let mut got = [0; 5];
        for _ in 0..n {
            let l = share.next(|l| waiting.contains(&l)).unwrap();
            got[(l - HIGHEST) as usize] += 1;
        }
        got
    }

    #[test]
    fn all_levels_waiting_share_by_weight() {
        assert_eq!(picks(&mut Share::default(), &[1, 2, 3, 4, 5], 31), [16, 8, 4, 2, 1]);
    }

    #[test]
    fn the_first_and_last_levels_share_sixteen_to_one() {
        assert_eq!(picks(&mut Share::default(), &[1, 5], 17), [16, 0, 0, 0, 1]);
    }

    #[test]
    fn picks_are_spread_not_in_runs() {
        let mut share = Share::default();
        let seq: Vec<u8> = (0..6).map(|_| share.next(|l| l == 1 || l == 2).unwrap()).collect();
        assert_eq!(seq, [1, 2, 1, 1, 2, 1]);
    }

    #[test]
    fn nothing_waiting_gives_none() {
        assert_eq!(Share::default().next(|_| false), None);
    }

    #[test]
    fn a_pick_taken_back_leaves_the_share_as_it_was() {
        let mut share = Share::default();
        share.next(|l| l == 1 || l == 5);
        let before = share.state();
        let all = |_| true;
        let picked = share.next(all).unwrap();
        share.take_back(picked, all);
        assert_eq!(share.state(), before);
        assert_eq!(Share::with_state(before).state(), before);
    }

    #[test]
    fn priorities_parse_as_whole_levels() {
        assert_eq!(parse(&json!(1)), Ok(1));
        assert_eq!(parse(&json!(5.0)), Ok(5));
        for bad in [json!(0), json!(6), json!(2.5), json!("1"), json!(null), json!(-1)] {
            let e = parse(&bad).unwrap_err();
            assert!(e.contains("from 1 (first) to 5 (last)"), "{e}");
        }
    }

    proptest! {
        /// Whatever waits, each waiting level gets a pick within every
        /// window of 31 (the weights' sum): none starves.
        #[test]
        fn no_waiting_level_starves(mask in 1u8..32, n in 31usize..400) {
            let waiting: Vec<u8> = levels().filter(|l| mask & (1 << (l - 1)) != 0).collect();
            let mut share = Share::default();
            let mut last = [0usize; 5];
            for i in 1..=n {
                let l = share.next(|l| waiting.contains(&l)).unwrap();
                prop_assert!(waiting.contains(&l));
                last[(l - 1) as usize] = i;
                for &w in &waiting {
                    prop_assert!(i - last[(w - 1) as usize] <= 31, "level {w} waited past 31 picks");
                }
            }
        }

        /// Over whole rounds, each waiting level's share is its weight's.
        #[test]
        fn shares_follow_the_weights(mask in 1u8..32, rounds in 1usize..20) {
            let waiting: Vec<u8> = levels().filter(|l| mask & (1 << (l - 1)) != 0).collect();
            let sum: i64 = waiting.iter().map(|&l| WEIGHTS[(l - 1) as usize]).sum();
            let got = picks(&mut Share::default(), &waiting, sum as usize * rounds);
            for &l in &waiting {
                prop_assert_eq!(got[(l - 1) as usize] as i64, WEIGHTS[(l - 1) as usize] * rounds as i64);
            }
        }
    }
}
