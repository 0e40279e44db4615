//! A trigger's flow control: what an event of a key does when the trigger
//! debounces, batches or throttles, and what the passing of a hold's time
//! does. Pure: the coordinator keeps a key's [`State`] in one row, locked
//! for the transaction that records the event (or that the timer loop
//! opens when the row is due), and writes back what [`arrive`] or [`due`]
//! return in that same commit, with the runs they start. So each event is
//! counted once, and each run started once, whichever coordinator works
//! the row and whatever crashes.
//!
//! `singleton` is not here: whether a key's run still runs is the
//! store's to say, at the start of each run these ask for.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most events a batch may name (`max_size`).
pub const MAX_BATCH_SIZE: i64 = 1000;
/// Most runs a throttle may allow per period (`count`).
pub const MAX_THROTTLE_COUNT: i64 = 10_000;
/// Most events a throttle keeps queued for one key (`max_throttle_queue`);
/// past it, an event is dropped, and its answer says so.
pub const MAX_THROTTLE_QUEUE: usize = 1000;
/// Longest key a flow counts by, in bytes (`max_flow_key_bytes`): it is
/// part of an index's key, which PostgreSQL bounds.
pub const MAX_FLOW_KEY_BYTES: usize = 512;
/// Longest period, wait or quiet time a trigger's flow may name.
pub const MAX_FLOW_PERIOD: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// Most bytes of event inputs a key may hold (`max_held_bytes`), or the
/// largest run input when that is less: a batch that would pass it starts
/// with what it has (so its run's input is never too large), a queue drops
/// the event.
pub const MAX_HELD_BYTES: usize = 8 << 20;

/// How a trigger holds its events, compiled from its definition and kept
/// with a key's state, so that the timer works a held key by the rules its
/// events were held under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Hold {
    /// One run per burst: `period_ms` of quiet ends a burst.
    Debounce { period_ms: u64, leading: bool, max_wait_ms: Option<u64> },
    /// One run per `max_size` events, or per `max_wait_ms` after the first.
    Batch { max_size: u32, max_wait_ms: u64 },
    /// At most `count` runs per `period_ms`; the rest queued or dropped.
    Throttle { count: u32, period_ms: u64, queue: bool },
}

impl Hold {
    /// The word the answers and the docs use for it.
    pub fn name(&self) -> &'static str {
        match self {
            Hold::Debounce { .. } => "debounce",
            Hold::Batch { .. } => "batch",
            Hold::Throttle { .. } => "throttle",
        }
    }
}

/// An event a key holds: what its trigger made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldEvent {
    /// Its place in the event log (`event_log.seq`).
    pub seq: i64,
    pub event_id: String,
    /// The run input its trigger made of it.
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

impl HeldEvent {
    /// Its input's size as JSON text, with the comma a list puts after it.
    fn bytes(&self) -> usize {
        serde_json::to_string(&self.input).map_or(0, |s| s.len()) + 1
    }
}

/// The bytes `events` take as a list (`[` and `]` counted).
fn held_bytes(events: &[HeldEvent]) -> usize {
    2 + events.iter().map(HeldEvent::bytes).sum::<usize>()
}

/// A key's state between events.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// When the burst, the batch or the period began.
    pub opened_at: DateTime<Utc>,
    /// When the timer must look at it again.
    pub due_at: DateTime<Utc>,
    /// Runs started in the throttle's period.
    pub count: u32,
    /// The events held: a trailing debounce's last, a batch's, a throttle's queue.
    pub events: Vec<HeldEvent>,
}

/// A run to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub input: Value,
    pub idempotency_key: Option<String>,
    /// The events it starts for (their `seq`), to name the run in their record.
    pub events: Vec<i64>,
    /// The id of the last of them.
    pub event_id: String,
}

/// What became of the event that arrived.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It is in the start at this index of [`Step::starts`].
    Started(usize),
    /// Held, for a later run; why and until when.
    Held(String),
    /// No run will start for it; why.
    Dropped(String),
}

/// What one event did to its key.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Runs to start now, in order.
    pub starts: Vec<Start>,
    /// The key's state after it; `None`: nothing is held.
    pub state: Option<State>,
    pub outcome: Outcome,
    /// Held events that no run will start for now, and why (a debounced
    /// event another replaced).
    pub superseded: Vec<(i64, String)>,
}

/// `n` milliseconds; periods are at most [`MAX_FLOW_PERIOD`], which a
/// kept hold read back could pass: such a one counts as the longest.
fn ms(n: u64) -> Duration {
    let longest = MAX_FLOW_PERIOD.as_millis() as u64;
    Duration::milliseconds(n.min(longest) as i64)
}

/// An event of the key arrives at `now` (the database's clock), with the
/// key's state if it has one; the key holds at most `max_held` bytes of
/// inputs ([`MAX_HELD_BYTES`], or less: the largest run input).
pub fn arrive(hold: &Hold, state: Option<State>, now: DateTime<Utc>, event: HeldEvent, max_held: usize) -> Step {
    let max_held = max_held.min(MAX_HELD_BYTES);
    // A state whose time passed before the timer came to it: its time's
    // work is done first, as the timer would have.
    let (mut starts, state) = match state {
        Some(s) if s.due_at <= now => due(hold, s, now),
        other => (Vec::new(), other),
    };
    let mut step = match hold {
        Hold::Debounce { period_ms, leading: false, max_wait_ms } => {
            trailing(state, now, event, *period_ms, *max_wait_ms)
        }
        Hold::Debounce { period_ms, leading: true, max_wait_ms } => {
            leading(state, now, event, *period_ms, *max_wait_ms)
        }
        Hold::Batch { max_size, max_wait_ms } => batch(state, now, event, (*max_size, *max_wait_ms), max_held),
        Hold::Throttle { count, period_ms, queue } => {
            throttle(state, now, event, (*count, *period_ms, *queue), max_held)
        }
    };
    if !starts.is_empty() {
        if let Outcome::Started(i) = &mut step.outcome {
            *i += starts.len();
        }
        starts.append(&mut step.starts);
        step.starts = starts;
    }
    step
}

/// The key's time has come (`state.due_at <= now`): the runs that starts,
/// and what the key holds after.
pub fn due(hold: &Hold, mut state: State, now: DateTime<Utc>) -> (Vec<Start>, Option<State>) {
    match hold {
        // A leading debounce's quiet time passed: the next event starts a run.
        Hold::Debounce { leading: true, .. } => (Vec::new(), None),
        Hold::Debounce { leading: false, .. } => (state.events.pop().map(single).into_iter().collect(), None),
        Hold::Batch { .. } => (batch_start(state.events).into_iter().collect(), None),
        Hold::Throttle { count, period_ms, .. } => {
            // A new period begins now (not at the old one's end, so that a
            // timer that was held up does not start two periods' runs at once).
            let n = state.events.len().min(*count as usize);
            let starts: Vec<Start> = state.events.drain(..n).map(single).collect();
            if starts.is_empty() {
                return (starts, None);
            }
            let next = State { opened_at: now, due_at: now + ms(*period_ms), count: n as u32, events: state.events };
            (starts, Some(next))
        }
    }
}

fn single(e: HeldEvent) -> Start {
    Start { input: e.input, idempotency_key: e.idempotency_key, events: vec![e.seq], event_id: e.event_id }
}

fn batch_start(events: Vec<HeldEvent>) -> Option<Start> {
    if events.is_empty() {
        return None;
    }
    let seqs = events.iter().map(|e| e.seq).collect();
    let event_id = events.last().map(|e| e.event_id.clone()).unwrap_or_default();
    let inputs = events.into_iter().map(|e| e.input).collect();
    Some(Start { input: Value::Array(inputs), idempotency_key: None, events: seqs, event_id })
}

fn trailing(state: Option<State>, now: DateTime<Utc>, event: HeldEvent, period: u64, max_wait: Option<u64>) -> Step {
    let opened_at = state.as_ref().map_or(now, |s| s.opened_at);
    let mut due_at = now + ms(period);
    if let Some(w) = max_wait {
        due_at = due_at.min(opened_at + ms(w));
    }
    let superseded = state
        .into_iter()
        .flat_map(|s| s.events)
        .map(|old| (old.seq, format!("debounce: a later event ({}) of the burst took its place", event.event_id)))
        .collect();
    let note = format!("debounce: held; its run starts at {} unless another event of the key comes first", rfc(due_at));
    let state = State { opened_at, due_at, count: 0, events: vec![event] };
    Step { starts: Vec::new(), state: Some(state), outcome: Outcome::Held(note), superseded }
}

fn leading(state: Option<State>, now: DateTime<Utc>, event: HeldEvent, period: u64, max_wait: Option<u64>) -> Step {
    let due_at = now + ms(period);
    match state {
        // In a burst, and not past its longest wait: the burst's first event ran.
        Some(s) if max_wait.is_none_or(|w| now < s.opened_at + ms(w)) => {
            let state = State { due_at, ..s };
            let why = "debounce: the burst's first event started its run; this one starts none".to_string();
            Step { starts: Vec::new(), state: Some(state), outcome: Outcome::Dropped(why), superseded: Vec::new() }
        }
        _ => {
            let state = State { opened_at: now, due_at, count: 0, events: Vec::new() };
            Step {
                starts: vec![single(event)],
                state: Some(state),
                outcome: Outcome::Started(0),
                superseded: Vec::new(),
            }
        }
    }
}

fn batch(state: Option<State>, now: DateTime<Utc>, event: HeldEvent, size_wait: (u32, u64), max_held: usize) -> Step {
    let (max_size, max_wait) = size_wait;
    let mut starts = Vec::new();
    let mut state = state.filter(|s| !s.events.is_empty());
    // Past the bytes a key may hold: the batch so far starts without it.
    if let Some(s) = &state {
        if held_bytes(&s.events) + event.bytes() > max_held {
            starts.extend(state.take().and_then(|s| batch_start(s.events)));
        }
    }
    let mut s = state.unwrap_or(State { opened_at: now, due_at: now + ms(max_wait), count: 0, events: Vec::new() });
    s.events.push(event);
    if s.events.len() >= max_size as usize {
        starts.extend(batch_start(s.events));
        let outcome = Outcome::Started(starts.len() - 1);
        return Step { starts, state: None, outcome, superseded: Vec::new() };
    }
    let note =
        format!("batch: held ({} of {max_size}); its run starts at {} at the latest", s.events.len(), rfc(s.due_at));
    Step { starts, state: Some(s), outcome: Outcome::Held(note), superseded: Vec::new() }
}

fn throttle(
    state: Option<State>,
    now: DateTime<Utc>,
    event: HeldEvent,
    rule: (u32, u64, bool),
    max_held: usize,
) -> Step {
    let (count, period, queue) = rule;
    let mut s = state.unwrap_or(State { opened_at: now, due_at: now + ms(period), count: 0, events: Vec::new() });
    if s.count < count && s.events.is_empty() {
        s.count += 1;
        return Step {
            starts: vec![single(event)],
            state: Some(s),
            outcome: Outcome::Started(0),
            superseded: Vec::new(),
        };
    }
    let full = s.events.len() >= MAX_THROTTLE_QUEUE || held_bytes(&s.events) + event.bytes() > max_held;
    let outcome = if !queue {
        Outcome::Dropped(format!("throttle: {count} runs started in this period already; the trigger drops the rest"))
    } else if full {
        Outcome::Dropped(format!(
            "throttle: the key's queue is full ({MAX_THROTTLE_QUEUE} events or {max_held} bytes, max_throttle_queue)"
        ))
    } else {
        let ahead = s.events.len();
        s.events.push(event);
        Outcome::Held(format!("throttle: queued behind {ahead}; the next period begins at {}", rfc(s.due_at)))
    };
    Step { starts: Vec::new(), state: Some(s), outcome, superseded: Vec::new() }
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests;
