//! Where the state machine runs: a few threads of its own, off the async
//! runtime, each with the stack an evaluation needs
//! ([`composer_core::expr::EVAL_STACK`]).
//!
//! Applying an event evaluates the definition's expressions, written by the
//! people who register workflows. The sandbox bounds each evaluation, but a
//! tokio worker is the wrong place for one: its 2 MiB stack is too small
//! for what jaq drops when it stops a closure-passing recursion, and an
//! evaluation near its time limit would hold a worker that also serves
//! `/healthz`. So the engine hands each application to this pool and
//! awaits the answer, with a backstop ([`BACKSTOP`]): an application that
//! does not answer by then fails as a fault, and the pool starts a thread
//! in place of the one still busy, which leaves when it is done.
//!
//! A thread that ran an evaluation stopped by a limit is replaced too, so
//! that the stack it touched is given back.
//!
//! If an evaluation still kills the process, the flight recorder
//! ([`Flight`]) says which run did: each thread writes the run it applies
//! to a slot of a small file before it starts and clears it after, and a
//! SIGABRT (how Rust ends a process whose stack overflowed, or that
//! panicked while panicking) marks the file. A coordinator that starts and
//! finds a marked file fails the runs in its slots with
//! [`CRASHED_MESSAGE`] instead of running them again: no crash loop.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use uuid::Uuid;

/// How long one application may take before the engine stops waiting for
/// it (`COMPOSER_EVAL_BACKSTOP`'s default). Each expression has its own
/// time limit (500 ms); an event may evaluate many (a MAP's items), so this
/// is a backstop, not the budget.
pub const BACKSTOP: Duration = Duration::from_secs(30);

/// What a run whose evaluation killed a coordinator fails with.
pub const CRASHED_MESSAGE: &str = "expr_crash: a coordinator died while evaluating this run's expressions; \
     the run was failed so that it cannot stop coordinators again";

/// Most threads the pool runs at once, busy ones past the backstop included.
const MAX_THREADS: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The pool. One per process ([`pool`]).
pub struct Pool {
    jobs: mpsc::Sender<(Uuid, Job)>,
    shared: Arc<Shared>,
    backstop: Duration,
}

struct Shared {
    queue: Mutex<mpsc::Receiver<(Uuid, Job)>>,
    /// Threads the pool wants.
    target: usize,
    /// Threads alive, busy ones past the backstop included.
    live: AtomicUsize,
    /// Slots of the flight file not held by a thread.
    free_slots: Mutex<Vec<usize>>,
    flight: Option<Flight>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// The process's pool, started on first use without a flight recorder
/// unless [`start`] came first.
pub fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool::new(None, BACKSTOP))
}

/// Starts the pool with a flight recorder; the runs a crash left in it,
/// which the caller fails. A second call (several coordinators in one
/// process, as in tests) keeps the first pool and reads no file.
pub fn start(flight: Option<&Path>, backstop: Duration) -> std::io::Result<Vec<Uuid>> {
    if POOL.get().is_some() {
        return Ok(Vec::new());
    }
    let (flight, crashed) = match flight {
        Some(path) => {
            let (f, crashed) = Flight::open(path)?;
            (Some(f), crashed)
        }
        None => (None, Vec::new()),
    };
    let _ = POOL.set(Pool::new(flight, backstop));
    Ok(crashed)
}

/// Why an application did not come back.
#[derive(Debug)]
pub enum Lost {
    /// It ran past the backstop.
    Backstop(Duration),
    /// Its thread ended without answering (a bug).
    Gone,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Backstop(d) => {
                write!(f, "evaluation did not finish within COMPOSER_EVAL_BACKSTOP ({} s)", d.as_secs())
            }
            Lost::Gone => f.write_str("the evaluating thread ended without an answer"),
        }
    }
}

impl Pool {
    fn new(flight: Option<Flight>, backstop: Duration) -> Pool {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let target = cores.clamp(2, 16);
        let (jobs, queue) = mpsc::channel();
        let shared = Arc::new(Shared {
            queue: Mutex::new(queue),
            target,
            live: AtomicUsize::new(0),
            free_slots: Mutex::new((0..MAX_THREADS).rev().collect()),
            flight,
        });
        for _ in 0..target {
            spawn(&shared);
        }
        Pool { jobs, shared, backstop }
    }

    /// Runs `f` (which applies an event to `run_id`) on a pool thread.
    pub async fn run<T: Send + 'static>(
        &self,
        run_id: Uuid,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Lost> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        if self.jobs.send((run_id, job)).is_err() {
            return Err(Lost::Gone);
        }
        match tokio::time::timeout(self.backstop, rx).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(Lost::Gone),
            Err(_) => {
                // The busy thread leaves when it is done; one takes its place.
                spawn(&self.shared);
                Err(Lost::Backstop(self.backstop))
            }
        }
    }
}

fn spawn(shared: &Arc<Shared>) {
    let Some(slot) = shared.free_slots.lock().expect("free slots").pop() else {
        tracing::error!("the evaluation pool has {MAX_THREADS} threads, all busy; not adding one");
        return;
    };
    shared.live.fetch_add(1, Ordering::SeqCst);
    let mine = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("composer-eval".into())
        .stack_size(composer_core::expr::EVAL_STACK)
        .spawn(move || work(&mine, slot));
    if let Err(e) = spawned {
        shared.live.fetch_sub(1, Ordering::SeqCst);
        shared.free_slots.lock().expect("free slots").push(slot);
        tracing::error!(error = %e, "could not start an evaluation thread");
    }
}

fn work(shared: &Arc<Shared>, slot: usize) {
    composer_core::expr::use_clock(std::time::Instant::now);
    loop {
        let next = shared.queue.lock().expect("evaluation queue").recv();
        let Ok((run_id, job)) = next else { break };
        if let Some(flight) = &shared.flight {
            flight.record(slot, Some(run_id));
        }
        job();
        if let Some(flight) = &shared.flight {
            flight.record(slot, None);
        }
        let exceeded = composer_core::expr::take_exceeded();
        if exceeded || shared.live.load(Ordering::SeqCst) > shared.target {
            if exceeded {
                // Give back the stack this one touched: a fresh thread.
                spawn(shared);
            }
            break;
        }
    }
    shared.live.fetch_sub(1, Ordering::SeqCst);
    shared.free_slots.lock().expect("free slots").push(slot);
}

/// The flight recorder: which run each pool thread is applying now, in a
/// file that outlives the process. Byte 0 is the crash mark; slot `i` is 16
/// bytes at `16 * (i + 1)`, a run id or zeros.
pub struct Flight {
    file: File,
}

/// The flight file's descriptor, for the signal handler.
static FLIGHT_FD: AtomicI32 = AtomicI32::new(-1);

const CRASH_MARK: u8 = b'!';

impl Flight {
    /// Opens (creating) the file at `path`; the runs it names if the last
    /// process to use it crashed. Clears it, and marks it on SIGABRT.
    pub fn open(path: &Path) -> std::io::Result<(Flight, Vec<Uuid>)> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let crashed = if bytes.first() == Some(&CRASH_MARK) {
            bytes
                .get(16..)
                .unwrap_or_default()
                .chunks_exact(16)
                .filter_map(|c| {
                    let id = Uuid::from_slice(c).ok()?;
                    (!id.is_nil()).then_some(id)
                })
                .collect()
        } else {
            Vec::new()
        };
        file.set_len(0)?;
        file.set_len(16 * (MAX_THREADS as u64 + 1))?;
        file.sync_all()?;
        mark_on_abort(&file);
        Ok((Flight { file }, crashed))
    }

    fn record(&self, slot: usize, run_id: Option<Uuid>) {
        let bytes = run_id.unwrap_or_default().into_bytes();
        // Not synced: the page cache outlives the process, which is what
        // the recorder is for (a machine that dies takes the runs' locks
        // with it, and nothing was half-applied).
        if let Err(e) = self.file.write_all_at(&bytes, 16 * (slot as u64 + 1)) {
            tracing::warn!(error = %e, "could not write the flight file");
        }
    }
}

/// The default place of the flight file: one per listen address, in the
/// temporary directory.
pub fn default_path(listen: &str) -> PathBuf {
    let name: String = listen.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    std::env::temp_dir().join(format!("composer-flight-{name}"))
}

fn mark_on_abort(file: &File) {
    use std::os::fd::AsRawFd;
    FLIGHT_FD.store(file.as_raw_fd(), Ordering::SeqCst);
    extern "C" fn on_abort(_: libc::c_int) {
        let fd = FLIGHT_FD.load(Ordering::SeqCst);
        let mark = [CRASH_MARK];
        // SAFETY: pwrite, signal and raise are async-signal-safe; the buffer
        // outlives the call. The default action then ends the process, as
        // abort() (or a SIGABRT sent from outside) means it to.
        #[allow(unsafe_code)]
        unsafe {
            if fd >= 0 {
                libc::pwrite(fd, mark.as_ptr().cast(), 1, 0);
            }
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::raise(libc::SIGABRT);
        }
    }
    let handler = on_abort as extern "C" fn(libc::c_int);
    // SAFETY: installs a handler that only calls an async-signal-safe function.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGABRT, handler as libc::sighandler_t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_mark_names_the_runs_in_flight_once() {
        let path = std::env::temp_dir().join(format!("composer-flight-test-{}", Uuid::now_v7()));
        let (flight, crashed) = Flight::open(&path).unwrap();
        assert!(crashed.is_empty());
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        flight.record(0, Some(a));
        flight.record(3, Some(b));
        flight.record(3, None);
        let (_, crashed) = Flight::open(&path).unwrap();
        assert!(crashed.is_empty(), "no mark (a clean stop or a SIGKILL): nobody is blamed");

        let (flight, _) = Flight::open(&path).unwrap();
        flight.record(5, Some(a));
        flight.file.write_all_at(&[CRASH_MARK], 0).unwrap();
        let (_, crashed) = Flight::open(&path).unwrap();
        assert_eq!(crashed, vec![a], "the run being applied when the process aborted");
        let (_, again) = Flight::open(&path).unwrap();
        assert!(again.is_empty(), "blamed once");
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn the_pool_answers_and_a_stuck_application_is_abandoned_at_the_backstop() {
        let pool = Pool::new(None, Duration::from_millis(200));
        assert_eq!(pool.run(Uuid::nil(), || 41 + 1).await.unwrap(), 42);
        let stuck = pool.run(Uuid::nil(), || std::thread::sleep(Duration::from_secs(2))).await;
        assert!(matches!(stuck, Err(Lost::Backstop(_))), "{stuck:?}");
        for _ in 0..4 {
            assert_eq!(pool.run(Uuid::nil(), || 7).await.unwrap(), 7, "the others still answer");
        }
    }
}
