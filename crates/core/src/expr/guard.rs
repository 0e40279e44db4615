//! The budget of one evaluation: how many steps it may take, how many bytes
//! it may build, how deep it may nest values and recurse, and how long it may
//! run. Exceeding any of them ends the evaluation with an error naming the
//! limit.
//!
//! jaq has no hook for a budget, so the meter lives in a thread-local that
//! the sandbox's data type ([`super::value`]) charges on every term jaq
//! evaluates and every value it builds. When a limit is exceeded the charge
//! unwinds with [`std::panic::resume_unwind`] (which runs no panic hook), and
//! [`run`] catches it at the evaluation's boundary: no jaq iterator can keep
//! running past its budget, however it was written.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The limits of one evaluation. [`Limits::DEFAULT`] is what the engine
/// uses; every value is named in the error that reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Terms evaluated plus values built (`expr_max_steps`).
    pub steps: u64,
    /// Bytes of strings, arrays and objects built, summed over the whole
    /// evaluation (`expr_max_bytes`).
    pub bytes: u64,
    /// How deep values may nest (`expr_max_depth`); a result is stored and
    /// read back as JSON, whose readers stop at 128 levels.
    pub depth: u32,
    /// Stack the evaluation may use, which bounds recursion (`expr_max_stack`).
    pub stack: usize,
    /// Wall-clock time (`expr_max_time`), a backstop for natives that do
    /// much work in one step (sorting, regular expressions).
    pub time: Duration,
    /// Bytes of the result as JSON (`expr_max_bytes` too): a value that
    /// shares structure is small in memory but not as text. What is then
    /// stored is held to `COMPOSER_MAX_PAYLOAD` by the engine
    /// (`storable::check`), which knows the configured value.
    pub output: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        steps: 1_000_000,
        bytes: 64 << 20,
        depth: 100,
        stack: 512 << 10,
        time: Duration::from_millis(500),
        output: 64 << 20,
    };

    /// A MAP's `items`, which may build a list of up to `map_max_items`
    /// elements (`[range(1000000)]`): ten steps an item, 256 MiB and 5 s.
    pub const MAP_ITEMS: Limits = Limits {
        steps: 10_000_000,
        bytes: 256 << 20,
        depth: 100,
        stack: 512 << 10,
        time: Duration::from_secs(5),
        output: 256 << 20,
    };

    /// These limits for an expression that only reads a path
    /// ([`is_path`](super::is_path)) in a value to store: its result is a
    /// value the run already holds, written out once, so it may be as
    /// large as the `left` of [`PATH_OUTPUT`] the value's paths have not
    /// given yet, and take the time that takes ([`PATH_TIME`]).
    pub fn reading_a_path(self, left: usize) -> Limits {
        Limits { output: self.output.max(left), time: self.time.max(PATH_TIME), ..self }
    }
}

/// What the paths of one value to store may give in all: the largest value
/// a run holds (an offloaded one, `COMPOSER_MAX_OFFLOADED`, at most 1 GiB),
/// with room for jaq's JSON to differ from serde_json's. The engine then
/// holds what it stores to the configured limit.
pub const PATH_OUTPUT: usize = (1 << 30) + (1 << 26);

/// The time a path may take to write out [`PATH_OUTPUT`] bytes, linear in
/// them (the evaluation backstop, `COMPOSER_EVAL_BACKSTOP`, still holds).
pub const PATH_TIME: Duration = Duration::from_secs(20);

/// Which limit an evaluation exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Steps(u64),
    Bytes(u64),
    Depth(u32),
    Stack(usize),
    Time(Duration),
    Output(usize),
    /// Work running inline ([`inline`]) used its steps: never an
    /// expression's error, it sends the work to the evaluation threads.
    Inline,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exceeded::Steps(n) => write!(f, "expression exceeded expr_max_steps ({n} steps)"),
            Exceeded::Bytes(n) => write!(f, "expression exceeded expr_max_bytes ({n} bytes built)"),
            Exceeded::Depth(n) => write!(f, "expression exceeded expr_max_depth (values nested {n} deep)"),
            Exceeded::Stack(n) => write!(f, "expression exceeded expr_max_stack (recursion used {} KiB)", n >> 10),
            Exceeded::Time(t) => write!(f, "expression exceeded expr_max_time ({} ms)", t.as_millis()),
            Exceeded::Output(n) => write!(f, "expression exceeded expr_max_bytes (a result of more than {n} bytes)"),
            Exceeded::Inline => f.write_str("the inline budget of the work this evaluation is part of ran out"),
        }
    }
}

struct Meter {
    limits: Limits,
    /// Steps this evaluation may take: its limit, or less when the work it
    /// is part of runs inline with fewer left ([`inline`]).
    cap: u64,
    steps: u64,
    bytes: u64,
    /// The clock and when the time runs out, if this thread has a clock.
    deadline: Option<(Clock, Instant)>,
    stack_base: usize,
    /// Small pieces of work ([`tick`]) since the start.
    ticks: u64,
}

impl Meter {
    /// Past its cap: its step limit, or what inline work had left.
    fn over_steps(&self) -> Exceeded {
        match self.cap < self.limits.steps {
            true => Exceeded::Inline,
            false => Exceeded::Steps(self.limits.steps),
        }
    }

    fn past_deadline(&self) -> Option<Exceeded> {
        let (clock, deadline) = self.deadline?;
        (clock() > deadline).then_some(Exceeded::Time(self.limits.time))
    }
}

thread_local! {
    static METER: Cell<Option<Meter>> = const { Cell::new(None) };
    /// The clock of this thread's evaluations ([`use_clock`]); none: no time limit.
    static CLOCK: Cell<Option<Clock>> = const { Cell::new(None) };
    /// Whether an evaluation on this thread exceeded a limit since
    /// [`take_exceeded`] last asked.
    static EXCEEDED: Cell<bool> = const { Cell::new(false) };
    /// Steps the work running inline on this thread has left ([`inline`]).
    static INLINE_LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Work run inline — on a thread that also serves others, such as the async
/// runtime's — that used its steps: the caller runs it again on the
/// evaluation threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineSpent;

/// Runs `work` with at most `steps` steps for all the evaluations in it,
/// whatever their own limits: an evaluation that would go past them stops
/// the whole work (it unwinds out of every evaluation, and out of whatever
/// called them) with [`InlineSpent`]. Simple expressions are bounded by
/// their input, not cheap: a few cartesian products over a large input in
/// one event would hold the thread for seconds.
pub fn inline<T>(steps: u64, work: impl FnOnce() -> T) -> Result<T, InlineSpent> {
    let outer = INLINE_LEFT.with(|c| c.replace(Some(steps)));
    let done = panic::catch_unwind(AssertUnwindSafe(work));
    INLINE_LEFT.with(|c| c.set(outer));
    match done {
        Ok(t) => Ok(t),
        Err(payload) if payload.is::<InlineSpent>() => Err(InlineSpent),
        Err(payload) => panic::resume_unwind(payload),
    }
}

/// Whether this thread runs work inline ([`inline`]), where an evaluation
/// must stay cheap.
pub(super) fn inline_running() -> bool {
    INLINE_LEFT.with(Cell::get).is_some()
}

/// True when an evaluation on this thread exceeded a limit since the last
/// call: such an evaluation may have used much of the thread's stack (jaq
/// drops what it built recursively), which a caller may want to give back.
pub fn take_exceeded() -> bool {
    EXCEEDED.with(|e| e.replace(false))
}

/// Where an evaluation reads the time. The core reads no clock of its own:
/// the thread that evaluates is given one.
pub type Clock = fn() -> Instant;

/// Gives this thread's evaluations a clock, and so `expr_max_time`.
pub fn use_clock(clock: Clock) {
    CLOCK.with(|c| c.set(Some(clock)));
}

/// How often (in steps) the clock is read.
const CLOCK_EVERY: u64 = 1024;

/// Runs `f` under `limits`. A limit exceeded anywhere inside `f` becomes
/// `Err`; so does a panic inside jaq, which never reaches the caller.
pub fn run<T>(limits: Limits, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let marker = 0u8;
    let inline = INLINE_LEFT.with(Cell::get);
    let meter = Meter {
        limits,
        cap: inline.map_or(limits.steps, |left| left.min(limits.steps)),
        steps: 0,
        bytes: 0,
        deadline: CLOCK.with(Cell::get).map(|clock| (clock, clock() + limits.time)),
        stack_base: std::ptr::addr_of!(marker) as usize,
        ticks: 0,
    };
    // Evaluations do not nest; a stale meter (from a caller's unwinding) is
    // replaced and restored.
    let outer = METER.with(|m| m.replace(Some(meter)));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    let used = METER.with(|m| m.replace(outer)).map_or(0, |m| m.steps);
    if let Some(left) = inline {
        INLINE_LEFT.with(|c| c.set(Some(left.saturating_sub(used))));
    }
    match result {
        Ok(r) => r,
        Err(payload) => match payload.downcast::<Exceeded>() {
            Ok(exceeded) if *exceeded == Exceeded::Inline => panic::resume_unwind(Box::new(InlineSpent)),
            Ok(exceeded) => {
                EXCEEDED.with(|e| e.set(true));
                Err(exceeded.to_string())
            }
            Err(payload) => Err(format!("expression evaluation failed inside jq: {}", crate::panic_message(&*payload))),
        },
    }
}

fn with_meter(f: impl FnOnce(&mut Meter) -> Option<Exceeded>) {
    let exceeded = METER.with(|cell| {
        let mut meter = cell.take()?;
        let exceeded = f(&mut meter);
        cell.set(Some(meter));
        exceeded
    });
    if let Some(e) = exceeded {
        panic::resume_unwind(Box::new(e));
    }
}

/// One step: a term evaluated or a value built. Checks the step budget, the
/// stack and, now and then, the clock.
pub fn step() {
    let marker = 0u8;
    let here = std::ptr::addr_of!(marker) as usize;
    with_meter(|m| {
        m.steps += 1;
        if m.steps > m.cap {
            return Some(m.over_steps());
        }
        let used = m.stack_base.saturating_sub(here);
        if used > m.limits.stack {
            return Some(Exceeded::Stack(used));
        }
        if m.steps % CLOCK_EVERY == 0 {
            return m.past_deadline();
        }
        None
    });
}

/// `units` steps of work a native does in one call (comparisons, bytes
/// scanned, regex instructions times input), charged before it is done so
/// that a single call cannot outrun the budget; checks the clock too.
pub fn work(units: u64) {
    with_meter(|m| {
        m.steps = m.steps.saturating_add(units);
        if m.steps > m.cap {
            return Some(m.over_steps());
        }
        m.past_deadline()
    });
}

/// A unit of work too small to charge (a piece of text written), counted
/// only so that the clock is read now and then during a long write.
pub fn tick() {
    with_meter(|m| {
        m.ticks += 1;
        if m.ticks % CLOCK_EVERY == 0 {
            return m.past_deadline();
        }
        None
    });
}

/// One step that builds `bytes`, charged before they are allocated.
pub fn build(bytes: u64) {
    with_meter(|m| {
        m.steps += 1;
        m.bytes = m.bytes.saturating_add(bytes);
        if m.bytes > m.limits.bytes {
            return Some(Exceeded::Bytes(m.limits.bytes));
        }
        (m.steps > m.cap).then(|| m.over_steps())
    });
}

/// Checks the nesting depth of a value about to be built.
pub fn nest(depth: u32) {
    with_meter(|m| (depth > m.limits.depth).then_some(Exceeded::Depth(m.limits.depth)));
}

/// Bytes the evaluation running on this thread may still build.
pub fn bytes_left() -> u64 {
    METER.with(|cell| {
        let Some(meter) = cell.take() else { return u64::MAX };
        let left = meter.limits.bytes.saturating_sub(meter.bytes);
        cell.set(Some(meter));
        left
    })
}
