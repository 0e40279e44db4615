//! Waiting for what a test expects instead of sleeping a fixed time and
//! hoping it happened: [`eventually`] looks every few milliseconds until a
//! probe says it happened, and fails naming what did not happen (and what
//! was seen last) once a generous deadline passes. A wait that ends early
//! costs nothing; one on a slow machine just takes longer.
//!
//! A probe answers `Some(value)` or `Ok(value)` once it sees what it waits
//! for; `None`, or `Err(seen)` to have `seen` in the failure's message.
//! [`poll_until`] is the same wait for a caller that reports the failure
//! itself; [`eventually_blocking`] is [`eventually`] for code outside a
//! runtime (a child process's exit, a port that opens).
//!
//! The clock is tokio's, so a test on paused time waits in logical time.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// The first pause between two looks; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause between two looks: a wait notices within this.
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// What a probe answered: what it waited for, or not yet (with what it saw).
pub trait Probe {
    type Value;
    /// `Err(Some(seen))` when the probe has something to say of the miss.
    fn seen(self) -> Result<Self::Value, Option<String>>;
}

impl<T> Probe for Option<T> {
    type Value = T;
    fn seen(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Probe for Result<T, E> {
    type Value = T;
    fn seen(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

fn pause_after(pause: Duration) -> Duration {
    (pause * 2).min(LONGEST_PAUSE)
}

/// Looks with `probe` until it sees what it waits for and returns that;
/// `Err` with what it saw last (if anything) once `within` has passed.
pub async fn poll_until<P, F, Fut>(within: Duration, mut probe: F) -> Result<P::Value, Option<String>>
where
    P: Probe,
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
{
    let give_up = tokio::time::Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match probe().await.seen() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= give_up {
            return Err(last);
        }
        // The poll interval of every wait of the tests: not a fixed wait.
        tokio::time::sleep(pause).await;
        pause = pause_after(pause);
    }
}

/// Looks with `probe` until it sees what it waits for and returns that;
/// panics saying `what` did not happen within `within`, with what the
/// probe saw last.
pub async fn eventually<P, F, Fut>(within: Duration, what: impl Display, probe: F) -> P::Value
where
    P: Probe,
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
{
    match poll_until(within, probe).await {
        Ok(value) => value,
        Err(seen) => panic!("{}", missed(&what, within, seen)),
    }
}

/// [`eventually`] for code that is not async: the thread blocks between looks.
pub fn eventually_blocking<P: Probe>(within: Duration, what: impl Display, mut probe: impl FnMut() -> P) -> P::Value {
    let give_up = std::time::Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match probe().seen() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        if std::time::Instant::now() >= give_up {
            panic!("{}", missed(&what, within, last));
        }
        // The poll interval, as in `poll_until`.
        std::thread::sleep(pause);
        pause = pause_after(pause);
    }
}

fn missed(what: &impl Display, within: Duration, seen: Option<String>) -> String {
    match seen {
        Some(seen) => format!("{what}: not within {within:?}; last seen: {seen}"),
        None => format!("{what}: not within {within:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_wait_returns_what_the_probe_saw_once_it_saw_it() {
        let looks = AtomicU32::new(0);
        let n = eventually(Duration::from_secs(30), "the third look", || async {
            let n = looks.fetch_add(1, Ordering::Relaxed) + 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!((n, looks.load(Ordering::Relaxed)), (3, 3), "no look after it saw");
        assert_eq!(pause_after(FIRST_PAUSE), 2 * FIRST_PAUSE);
        assert_eq!(pause_after(LONGEST_PAUSE), LONGEST_PAUSE, "the pauses grow to a bound");
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_says_what_did_not_happen_and_what_was_seen() {
        let missed = poll_until(Duration::from_millis(20), || async { Err::<(), _>("still 0") }).await;
        assert_eq!(missed, Err(Some("still 0".to_string())));
        let nothing = poll_until(Duration::ZERO, || async { None::<()> }).await;
        assert_eq!(nothing, Err(None));
        let panicked = tokio::spawn(eventually(Duration::ZERO, "the sky to fall", || async { None::<()> }));
        let message = panicked.await.unwrap_err().into_panic();
        assert_eq!(message.downcast_ref::<String>().unwrap(), "the sky to fall: not within 0ns");
    }

    #[test]
    fn a_blocking_wait_looks_until_it_sees() {
        let mut looks = 0;
        let seen = eventually_blocking(Duration::from_secs(10), "the second look", || {
            looks += 1;
            if looks == 2 {
                Ok(looks)
            } else {
                Err(format!("look {looks}"))
            }
        });
        assert_eq!(seen, 2);
        let missed = std::panic::catch_unwind(|| {
            eventually_blocking(Duration::ZERO, "nothing", || Err::<(), _>("the only look"))
        });
        let message = missed.unwrap_err();
        assert_eq!(message.downcast_ref::<String>().unwrap(), "nothing: not within 0ns; last seen: the only look");
    }
}
