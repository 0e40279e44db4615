//! The one door to the evaluator: [`evaluate`]. Every expression a
//! coordinator evaluates — an event applied to a run, a new run's tags and
//! keys, a trigger, a failure handler's input, a webhook's transform — goes
//! through it, because evaluating takes a [`Sandbox`] and this is where the
//! coordinator gets one.
//!
//! Expressions are written by the people who register workflows and hooks.
//! The sandbox bounds each evaluation, but a tokio worker is the wrong place
//! for one that is not simple: its 2 MiB stack is small, and an evaluation
//! near its time limit would hold a worker that also serves `/healthz`. So
//! [`evaluate`] runs such work on a pool of threads of its own ([`Threads`]),
//! with [`composer_core::expr::EVAL_STACK`], and awaits the answer with a
//! backstop ([`BACKSTOP`]): work that does not answer by then fails, and
//! the pool starts a thread in place of the one still busy, which leaves
//! when it is done. Simple expressions (bounded by their input, no
//! recursion) are evaluated where the caller is: the hop would cost more.
//!
//! A thread that ran an evaluation stopped by a limit is replaced, so that
//! the stack it touched is given back.
//!
//! Every evaluation names its [`Subject`] and is recorded in the flight
//! recorder ([`super::flight`]) while it runs, whatever thread it runs on. A
//! coordinator that starts and finds that an evaluation killed the last one
//! fails what it was for, once ([`fail_crashed`]): the run, or (for a
//! definition's start-time expressions, or a webhook) a quarantine that
//! refuses that subject's evaluations from then on with [`CRASHED_MESSAGE`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use composer_core::expr::{InlineSpent, Sandbox};

pub use super::flight::{default_state_dir, StateDir, Subject};
use super::flight::{recording, Flight};

/// How long one piece of work may take on the pool before the caller stops
/// waiting for it (`COMPOSER_EVAL_BACKSTOP`'s default). Each expression has
/// its own time limit (500 ms); an event may evaluate many (a MAP's items),
/// so this is a backstop, not the budget.
pub const BACKSTOP: Duration = Duration::from_secs(30);

/// What a run whose evaluation killed a coordinator fails with, and what a
/// quarantined subject's evaluations are refused with.
pub const CRASHED_MESSAGE: &str = "expr_crash: a coordinator died while evaluating this run's expressions; \
     the run was failed so that it cannot stop coordinators again";

/// Most threads the pool runs at once, busy ones past the backstop included.
const MAX_THREADS: usize = 64;

type Job = Box<dyn FnOnce(&Sandbox) + Send>;

/// The evaluation threads. One set per process ([`threads`]).
pub struct Threads {
    jobs: mpsc::Sender<(Subject, Job)>,
    crew: Arc<Crew>,
    backstop: Duration,
}

/// What the evaluation threads share: their queue of work and their count.
struct Crew {
    queue: Mutex<mpsc::Receiver<(Subject, Job)>>,
    /// Threads the pool wants.
    target: usize,
    /// Threads alive, busy ones past the backstop included.
    live: AtomicUsize,
}

static THREADS: OnceLock<Threads> = OnceLock::new();

/// The process's evaluation threads, started on first use unless [`start`] came first.
fn threads() -> &'static Threads {
    THREADS.get_or_init(|| Threads::new(BACKSTOP))
}

/// Starts the pool with its flight recorder at `flight`; what a crash left in
/// it, which the caller fails ([`fail_crashed`]). A second call (several
/// coordinators in one process, as in tests) keeps the first pool and reads
/// no file.
pub fn start(flight: Option<&std::path::Path>, backstop: Duration) -> std::io::Result<Vec<Subject>> {
    if THREADS.get().is_some() {
        return Ok(Vec::new());
    }
    let crashed = match flight {
        Some(path) => {
            let (f, crashed) = Flight::open(path)?;
            f.install();
            crashed
        }
        None => Vec::new(),
    };
    let _ = THREADS.set(Threads::new(backstop));
    Ok(crashed)
}

/// Why evaluation did not answer.
#[derive(Debug)]
pub enum Lost {
    /// It ran past the backstop.
    Backstop(Duration),
    /// It panicked (a bug: the sandbox turns every failure of an expression
    /// into an error).
    Panicked(String),
    /// Its subject killed a coordinator before: it is not evaluated again.
    Quarantined(Subject),
    /// Its thread ended without answering (a bug).
    Gone,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Backstop(d) => {
                write!(f, "evaluation did not finish within COMPOSER_EVAL_BACKSTOP ({d:?})")
            }
            Lost::Panicked(message) => write!(f, "evaluation failed: {message}"),
            Lost::Quarantined(subject) => write!(
                f,
                "expr_crash: a coordinator died evaluating the expressions of this {}; they are not evaluated \
                 again{}",
                subject.kind(),
                match subject {
                    Subject::Definition(_) => " (register a new version of the workflow)",
                    Subject::Webhook(_) => " (create the webhook again)",
                    Subject::Run(_) => "",
                }
            ),
            Lost::Gone => f.write_str("the evaluating thread ended without an answer"),
        }
    }
}

/// Steps simple work may take where it is called ([`evaluate`]) before it
/// goes to the pool instead: about 50 ms. Simple expressions are bounded by
/// their input, not cheap (a cartesian product over a large list is simple).
pub const INLINE_STEPS: u64 = 100_000;

/// The one door: runs `work` over `input` with a sandbox, for `subject`.
/// With `simple` (every expression `work` evaluates is simple) it runs
/// here, in a sandbox that refuses anything else, over a copy of `input`,
/// for at most [`INLINE_STEPS`] steps in all; past them, or without
/// `simple`, on the pool. Either way a crash inside blames `subject`, and
/// a panic comes back as [`Lost::Panicked`].
pub async fn evaluate<I, T>(subject: Subject, simple: bool, input: I, work: fn(&Sandbox, I) -> T) -> Result<T, Lost>
where
    I: Clone + Send + 'static,
    T: Send + 'static,
{
    if quarantined(&subject) {
        return Err(Lost::Quarantined(subject));
    }
    if simple {
        let copy = input.clone();
        let here = recording(&subject, || {
            contained(|| composer_core::expr::inline(INLINE_STEPS, || work(&Sandbox::simple_only(), copy)))
        })?;
        match here {
            Ok(t) => return Ok(t),
            Err(InlineSpent) => crate::metrics::inc(composer_metrics::EVALUATIONS_MOVED, &[], 1),
        }
    }
    threads().run(subject, move |sb| work(sb, input)).await
}

fn contained<T>(f: impl FnOnce() -> T) -> Result<T, Lost> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|panic| Lost::Panicked(composer_core::panic_message(&*panic)))
}

impl Threads {
    fn new(backstop: Duration) -> Threads {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let target = cores.clamp(2, 16);
        let (jobs, queue) = mpsc::channel();
        let crew = Arc::new(Crew { queue: Mutex::new(queue), target, live: AtomicUsize::new(0) });
        for _ in 0..target {
            spawn(&crew);
        }
        Threads { jobs, crew, backstop }
    }

    /// Runs `f` on a pool thread. The backstop counts from when a thread
    /// takes the work, not from when it was queued: work queued behind
    /// others' evaluations (a burst of hostile ones at their limits) waits
    /// its turn instead of failing as a fault. Every piece of work ends
    /// within its backstop, so the queue always moves.
    async fn run<T: Send + 'static>(
        &self,
        subject: Subject,
        f: impl FnOnce(&Sandbox) -> T + Send + 'static,
    ) -> Result<T, Lost> {
        let (taken_tx, taken) = tokio::sync::oneshot::channel();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |sb| {
            let _ = taken_tx.send(());
            let _ = tx.send(contained(|| f(sb)));
        });
        if self.jobs.send((subject, job)).is_err() {
            return Err(Lost::Gone);
        }
        if taken.await.is_err() {
            return Err(Lost::Gone);
        }
        match tokio::time::timeout(self.backstop, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Lost::Gone),
            Err(_) => {
                // The busy thread leaves when it is done; one takes its place.
                spawn(&self.crew);
                Err(Lost::Backstop(self.backstop))
            }
        }
    }
}

fn spawn(crew: &Arc<Crew>) {
    if crew.live.fetch_add(1, Ordering::SeqCst) >= MAX_THREADS {
        crew.live.fetch_sub(1, Ordering::SeqCst);
        tracing::error!("the evaluation pool has {MAX_THREADS} threads, all busy; not adding one");
        return;
    }
    let mine = crew.clone();
    if let Err(e) =
        composer_core::expr::sandbox_thread("composer-eval", std::time::Instant::now, move |sb| work(&mine, sb))
    {
        crew.live.fetch_sub(1, Ordering::SeqCst);
        tracing::error!(error = %e, "could not start an evaluation thread");
    }
}

fn work(crew: &Arc<Crew>, sb: &Sandbox) {
    loop {
        let next = crew.queue.lock().expect("evaluation queue").recv();
        let Ok((subject, job)) = next else { break };
        recording(&subject, || job(sb));
        let exceeded = composer_core::expr::take_exceeded();
        if exceeded || crew.live.load(Ordering::SeqCst) > crew.target {
            if exceeded {
                // Give back the stack this one touched: a fresh thread.
                crew.live.fetch_sub(1, Ordering::SeqCst);
                spawn(crew);
                return;
            }
            break;
        }
    }
    crew.live.fetch_sub(1, Ordering::SeqCst);
}

/// Subjects whose evaluation killed a coordinator, with why, as this
/// process last read them ([`refresh_quarantine`]).
static QUARANTINE: RwLock<Option<HashMap<Subject, String>>> = RwLock::new(None);

/// Whether `subject` is quarantined (a run never is: a run that killed a
/// coordinator is failed instead).
pub fn quarantined(subject: &Subject) -> bool {
    if matches!(subject, Subject::Run(_)) {
        return false;
    }
    QUARANTINE.read().expect("quarantine").as_ref().is_some_and(|q| q.contains_key(subject))
}

/// Reads the quarantine again: a subject another coordinator's crash put
/// there is refused here too, from now on.
pub async fn refresh_quarantine(client: &composer_store::Client) -> composer_store::Result<()> {
    let rows = composer_store::quarantine::all(client).await?;
    let read: HashMap<Subject, String> =
        rows.into_iter().filter_map(|(kind, key, reason)| Some((Subject::of(&kind, &key)?, reason))).collect();
    *QUARANTINE.write().expect("quarantine") = Some(read);
    Ok(())
}

/// Fails, once, what the evaluations a crash cut short were for: a run is
/// failed with [`CRASHED_MESSAGE`]; a definition's start-time expressions
/// and a webhook's transform are quarantined (every coordinator refuses to
/// evaluate them again).
///
/// `client` is the default namespace's, where the quarantine is kept for
/// every namespace; a run is failed in whichever namespace holds it, looked
/// for there first and then in the schemas of `others`.
pub async fn fail_crashed(
    client: &mut composer_store::Client,
    crashed: Vec<Subject>,
    others: &[composer_store::Pool],
) -> composer_store::Result<()> {
    for subject in crashed {
        tracing::error!(%subject, "this coordinator died evaluating expressions; failing what they were for");
        match &subject {
            Subject::Run(run_id) => {
                let mut failed = composer_store::runs::fail_faulted(client, *run_id, CRASHED_MESSAGE).await?;
                for pool in others {
                    if failed {
                        break;
                    }
                    // A namespace that cannot be read (dropped meanwhile) does not hold it.
                    let in_theirs = async {
                        let mut theirs = composer_store::client(pool).await?;
                        composer_store::runs::fail_faulted(&mut theirs, *run_id, CRASHED_MESSAGE).await
                    };
                    failed = in_theirs.await.unwrap_or_else(|e| {
                        tracing::warn!(run = %run_id, error = %e, "looking for a crashed run in a namespace failed");
                        false
                    });
                }
            }
            Subject::Definition(_) | Subject::Webhook(_) => {
                let reason = Lost::Quarantined(subject.clone()).to_string();
                composer_store::quarantine::add(client, subject.kind(), &subject.key(), &reason).await?;
            }
        }
    }
    refresh_quarantine(client).await?;
    if let Some(flight) = Flight::installed() {
        if let Err(e) = flight.clear_mark() {
            tracing::warn!(error = %e, "could not clear the flight file's crash mark");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_pool_answers_and_a_stuck_evaluation_is_abandoned_at_the_backstop() {
        let pool = Threads::new(Duration::from_millis(200));
        let run = Subject::Run(uuid::Uuid::nil());
        assert!(pool.run(run.clone(), |sb| sb.is_evaluation_thread()).await.unwrap());
        let stuck = pool.run(run.clone(), |_| std::thread::sleep(Duration::from_secs(2))).await;
        assert!(matches!(stuck, Err(Lost::Backstop(_))), "{stuck:?}");
        // Queued behind work that keeps every thread busy past the backstop,
        // quick work waits its turn and answers: the backstop counts from
        // when a thread takes it.
        let busy: Vec<_> = (0..2 * pool.crew.target)
            .map(|_| pool.run(run.clone(), |_| std::thread::sleep(Duration::from_millis(150))))
            .collect();
        let queued = pool.run(run.clone(), |_| 9);
        let (busy, queued) = tokio::join!(futures_util::future::join_all(busy), queued);
        assert!(busy.iter().all(Result::is_ok), "{busy:?}");
        assert_eq!(queued.unwrap(), 9);
        for _ in 0..4 {
            assert_eq!(pool.run(run.clone(), |_| 7).await.unwrap(), 7, "the others still answer");
        }
        // A pool of its own, with a backstop a panic's report cannot reach
        // (with RUST_BACKTRACE set, writing the backtrace takes a debug
        // build longer than 200 ms).
        let pool = Threads::new(Duration::from_secs(30));
        let panicked = pool.run(run, |_| -> u8 { panic!("a bug") }).await;
        assert!(matches!(panicked, Err(Lost::Panicked(ref m)) if m == "a bug"), "{panicked:?}");
    }

    fn whose(sb: &Sandbox, _: ()) -> (std::thread::ThreadId, bool) {
        (std::thread::current().id(), sb.is_evaluation_thread())
    }

    #[tokio::test]
    async fn simple_work_runs_here_in_a_sandbox_that_refuses_the_rest() {
        let here = std::thread::current().id();
        let subject = Subject::Definition(uuid::Uuid::nil());
        let (thread, any) = evaluate(subject.clone(), true, (), whose).await.unwrap();
        assert_eq!((thread, any), (here, false));
        let (thread, any) = evaluate(subject, false, (), whose).await.unwrap();
        assert!(thread != here && any, "the rest goes to the pool");
    }

    /// A simple expression is bounded by its input, not cheap: work that
    /// takes more than its inline steps is run again on the pool, from its
    /// input as it was, and answers as it would have.
    #[tokio::test]
    async fn simple_work_past_its_inline_steps_is_done_again_on_the_pool() {
        fn product(sb: &Sandbox, (expr, input): (composer_core::expr::Expr, serde_json::Value)) -> (bool, String) {
            let out = expr.eval(sb, &input).map(|v| v.to_string()).unwrap_or_else(|e| e);
            (sb.is_evaluation_thread(), out)
        }
        let expr = composer_core::expr::Expr::compile("[.a[] + .a[] + .a[]] | length").unwrap();
        assert!(expr.is_simple(), "a cartesian product is simple");
        let subject = Subject::Definition(uuid::Uuid::nil());
        let small = serde_json::json!({"a": [1, 2, 3]});
        let (pooled, out) = evaluate(subject.clone(), true, (expr.clone(), small), product).await.unwrap();
        assert_eq!((pooled, out.as_str()), (false, "27"), "small: here");
        let large = serde_json::json!({"a": (0..50).collect::<Vec<_>>()});
        let (pooled, out) = evaluate(subject, true, (expr, large), product).await.unwrap();
        assert_eq!((pooled, out.as_str()), (true, "125000"), "large: past the inline steps, on the pool");
    }
}
