//! A trigger's flow control at work: `debounce`, `batch` and `throttle`
//! hold a key's events (its row in `trigger_flows`, and a row per event in
//! `trigger_flow_events`), `singleton` keeps the key's last run there.
//! What an event or the passing of time does is decided by
//! [`composer_core::flow`]; here it is done.
//!
//! - An event of the key ([`arrive`]) locks the row in the transaction that
//!   records the event, and writes back what the key holds in its commit,
//!   with the runs it starts. A retried event (the same id) is a duplicate
//!   before it gets here: it holds nothing twice.
//! - The timer loop ([`fire_due`]) locks a due row (`SKIP LOCKED`) in a
//!   short transaction of its own, and starts what its time starts in the
//!   commit that writes back what is left. A coordinator that dies before
//!   the commit leaves the row due for the next pass; one that dies after
//!   leaves it written. So a held event's run starts once, or not at all
//!   when it was replaced or dropped, and says so in the event's record.
//! - A singleton that cancels notes the run it replaces (`trigger_cancels`)
//!   in the commit that starts the new one, and cancels it after; what a
//!   coordinator left noted when it died, the timer loop cancels.

use std::sync::Arc;

use composer_core::definition::{Flowed, SingletonMode};
use composer_core::flow::{self, HeldEvent, Hold, Outcome, Start, State, Step};
use composer_core::machine::Event;
use composer_store::definitions::DefinitionRow;
use composer_store::flows::{self as store, FlowKey, Held, Locked};
use composer_store::triggers::EventRun;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::config::Config;
use crate::engine::starts::{StartOptions, Started};
use crate::engine::{By, Control, Engine, EngineError, EventRequest, Rejection};

/// What starting one run of a key did.
enum Begun {
    Run(Box<Started>),
    /// A singleton's run still runs: none started.
    Skipped(String),
    /// The start was refused: why.
    Refused(String),
}

/// What a key's runs did, for after the commit.
#[derive(Default)]
pub(crate) struct AfterCommit {
    pub started: Vec<Started>,
    /// Runs a singleton replaced, to cancel.
    pub cancels: Vec<Uuid>,
}

impl AfterCommit {
    /// Hands the runs to the engine and cancels the replaced ones.
    pub async fn run(self, engine: &Arc<Engine>) {
        for s in self.started {
            engine.started(s);
        }
        for run in self.cancels {
            cancel(engine, run).await;
        }
    }
}

/// Cancels a run a singleton replaced, and forgets the note that it must be;
/// a failure leaves the note for the timer loop.
async fn cancel(engine: &Arc<Engine>, run: Uuid) {
    let by = By::Operator(Control {
        actor: "trigger".into(),
        reason: Some("singleton: a newer event of its key started a run in its place".into()),
    });
    match engine.handle(EventRequest::new(run, Event::CancelRun).by(by)).await {
        // Gone (retention, a namespace's end): nothing to cancel.
        Ok(_) | Err(EngineError::RunNotFound(_)) => {}
        Err(e) => {
            tracing::warn!(run_id = %run, error = %e, "singleton: the run it replaced is not cancelled yet; the timer loop tries again");
            return;
        }
    }
    match composer_store::client(engine.pool()).await {
        Ok(client) => {
            if let Err(e) = store::cancelled(&client, run).await {
                tracing::warn!(run_id = %run, error = %e, "singleton: cancelled, but the note is kept");
            }
        }
        Err(e) => tracing::warn!(run_id = %run, error = %e, "singleton: cancelled, but the note is kept"),
    }
}

/// How one key's runs are started.
struct Starter<'a> {
    config: &'a Config,
    engine: &'a Arc<Engine>,
    def: &'a DefinitionRow,
    index: usize,
    key: &'a str,
    /// The trigger's event name.
    event: &'a str,
    flow: &'static str,
    singleton: Option<SingletonMode>,
    traceparent: Option<&'a str>,
    replay: Option<Uuid>,
    /// The arriving event, whose own record its sending writes.
    arriving: Option<i64>,
    /// A start over the namespace's quota is tried again later (the timer's
    /// and a replay's), not refused.
    waits_for_quota: bool,
}

impl Starter<'_> {
    /// Starts `start`'s run, unless the singleton's run still runs.
    async fn start(
        &self,
        tx: &mut composer_store::Transaction<'_>,
        start: &Start,
        last_run: &mut Option<Uuid>,
        after: &mut AfterCommit,
    ) -> Result<Begun, EngineError> {
        let mut replaces = None;
        if let (Some(mode), Some(run)) = (self.singleton, *last_run) {
            if store::is_running(tx, run).await? {
                match mode {
                    SingletonMode::Skip => {
                        return Ok(Begun::Skipped(format!("singleton: run {run} of the key is still running")))
                    }
                    SingletonMode::Cancel => replaces = Some(run),
                }
            }
        }
        if let Err(why) = composer_core::storable::check(&start.input, "input", self.config.max_value()) {
            return Ok(Begun::Refused(format!("the run's input: {why}")));
        }
        if start.idempotency_key.as_deref().is_some_and(|k| k.contains('\0')) {
            return Ok(Begun::Refused("idempotency_key: contains a NUL character, which cannot be stored".into()));
        }
        let mut trigger = json!({
            "event": self.event, "event_id": start.event_id, "trigger": self.index,
            "flow": self.flow, "key": self.key, "events": start.events.len(),
        });
        if let Some(replay) = self.replay {
            trigger["replay"] = json!(replay);
        }
        let opts = StartOptions {
            idempotency_key: start.idempotency_key.as_deref(),
            trigger: Some(&trigger),
            traceparent: self.traceparent,
            ..Default::default()
        };
        let sp = tx.savepoint("flow_start").await?;
        match self.engine.start_run_in(&sp, self.def, &start.input, opts).await {
            Ok(s) => {
                sp.commit().await?;
                if let Some(old) = replaces.filter(|old| *old != s.row.id) {
                    store::cancel_later(tx, old).await?;
                    after.cancels.push(old);
                }
                if self.singleton.is_some() {
                    *last_run = Some(s.row.id);
                }
                Ok(Begun::Run(Box::new(s)))
            }
            Err(e @ EngineError::Rejected(Rejection::OverQuota { .. })) if self.waits_for_quota => Err(e),
            Err(EngineError::Rejected(why)) => {
                sp.rollback().await?;
                Ok(Begun::Refused(why.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// Starts each of `starts` but the arriving event's (`own`), naming the
    /// run (or why none) in their events' records; returns the arriving
    /// event's, if it has one.
    async fn start_all(
        &self,
        tx: &mut composer_store::Transaction<'_>,
        starts: &[Start],
        own: Option<usize>,
        last_run: &mut Option<Uuid>,
        after: &mut AfterCommit,
    ) -> Result<Option<Begun>, EngineError> {
        let mut mine = None;
        for (i, start) in starts.iter().enumerate() {
            let begun = self.start(tx, start, last_run, after).await?;
            let trigger = self.index as i32;
            let clipped;
            let (run, error, note) = match &begun {
                Begun::Run(s) => (Some(s.row.id), None, None),
                Begun::Skipped(why) => (None, None, Some(why.as_str())),
                Begun::Refused(why) => {
                    clipped = composer_core::clipped(why, 1024);
                    (None, Some(clipped.as_str()), None)
                }
            };
            // The arriving event's own record is written after, by its sending.
            let held: Vec<i64> = start.events.iter().copied().filter(|seq| Some(*seq) != self.arriving).collect();
            store::note_events(tx, &held, &self.def.name, trigger, run, error, note).await?;
            if own == Some(i) {
                mine = Some(begun);
            } else if let Begun::Run(s) = begun {
                after.started.push(*s);
            }
        }
        Ok(mine)
    }
}

/// One event being recorded, or replayed: what starting the runs of its
/// triggers needs ([`crate::triggers`] starts them).
pub(crate) struct Sending<'a> {
    pub config: &'a Config,
    pub engine: &'a Arc<Engine>,
    /// Its place in the event log.
    pub seq: i64,
    /// The event's name and id.
    pub name: &'a str,
    pub event_id: &'a str,
    pub traceparent: Option<&'a str>,
    /// The replay starting the runs, named in their trigger.
    pub replay: Option<Uuid>,
}

/// An arriving event, for one trigger with flow control.
pub(crate) struct Arrival<'a> {
    pub sending: &'a Sending<'a>,
    /// The workflow, and its trigger's place in its `triggers`.
    pub def: &'a DefinitionRow,
    pub index: usize,
}

impl Arrival<'_> {
    /// Works the event through trigger `index` of `def`'s flow control, in
    /// `tx`: `run` says what became of it (its run, why it is held, or why
    /// none starts); runs started for events held before are in `after`.
    pub async fn arrive(
        &self,
        tx: &mut composer_store::Transaction<'_>,
        fired: composer_core::definition::Fired,
        flowed: Flowed,
        run: &mut EventRun,
        after: &mut AfterCommit,
    ) -> Result<(), EngineError> {
        let (def, index) = (self.def, self.index);
        if let Some(why) = self.refused(&fired, flowed.hold.as_ref()) {
            run.error = Some(why);
            return Ok(());
        }
        let k = FlowKey {
            workflow: def.name.clone(),
            trigger: index as i32,
            event: self.sending.name.to_string(),
            key: flowed.key.clone(),
        };
        let mut sp = tx.savepoint("flow").await?;
        let locked = store::lock(&sp, &k).await?;
        // A key holding events keeps the rules it held them under until it
        // is empty: a new version's flow applies from then on.
        let hold = match (&locked.held, kept_hold(&locked)?) {
            (Some(_), Some(kept)) => Some(kept),
            _ => flowed.hold.clone(),
        };
        let event = HeldEvent {
            seq: self.sending.seq,
            event_id: self.sending.event_id.to_string(),
            input: fired.input,
            idempotency_key: fired.idempotency_key,
        };
        let before = state_of(&locked)?;
        let kept = held_seqs(before.as_ref());
        let step = match &hold {
            Some(h) => flow::arrive(h, before.clone(), locked.now, event, self.sending.config.max_value()),
            None => at_once(event),
        };
        for (seq, note) in &step.superseded {
            store::note_events(&sp, &[*seq], &def.name, k.trigger, None, None, Some(note)).await?;
        }
        let starter = Starter {
            config: self.sending.config,
            engine: self.sending.engine,
            def,
            index,
            key: &flowed.key,
            event: self.sending.name,
            flow: hold.as_ref().map_or("singleton", Hold::name),
            singleton: flowed.singleton,
            traceparent: self.sending.traceparent,
            replay: self.sending.replay,
            arriving: Some(self.sending.seq),
            waits_for_quota: self.sending.replay.is_some(),
        };
        let own = match step.outcome {
            Outcome::Started(i) => Some(i),
            _ => None,
        };
        let mut last_run = locked.last_run;
        let mine = starter.start_all(&mut sp, &step.starts, own, &mut last_run, after).await?;
        let mut state = step.state.clone();
        if !matches!(mine, None | Some(Begun::Run(_))) {
            unstarted(hold.as_ref(), &mut state, before);
        }
        save(&sp, &k, hold.as_ref(), flowed.singleton, state.as_ref(), last_run, &kept).await?;
        sp.commit().await?;
        run.flow = Some(starter.flow.to_string());
        noted(run, mine, step.outcome, after);
        Ok(())
    }

    /// Why the event cannot be held: its input is stored as a run's would
    /// be, so it is refused alike, now (and as a batch's list when it goes
    /// in one, within what a key holds).
    fn refused(&self, fired: &composer_core::definition::Fired, hold: Option<&Hold>) -> Option<String> {
        let largest = match hold {
            Some(_) => self.sending.config.max_value().min(flow::MAX_HELD_BYTES),
            None => self.sending.config.max_value(),
        };
        let as_run = match hold {
            Some(Hold::Batch { .. }) => Value::Array(vec![fired.input.clone()]),
            _ => fired.input.clone(),
        };
        if let Err(why) = composer_core::storable::check(&as_run, "input", largest) {
            return Some(format!("the run's input: {why} (max_held_bytes)"));
        }
        if fired.idempotency_key.as_deref().is_some_and(|k| k.contains('\0')) {
            return Some("idempotency_key: contains a NUL character, which cannot be stored".into());
        }
        None
    }
}

/// A singleton alone holds nothing: the event's run starts now, if it may.
fn at_once(event: HeldEvent) -> Step {
    let start = Start {
        input: event.input,
        idempotency_key: event.idempotency_key,
        events: vec![event.seq],
        event_id: event.event_id,
    };
    Step { starts: vec![start], state: None, outcome: Outcome::Started(0), superseded: Vec::new() }
}

/// What became of the arriving event, into its record.
fn noted(run: &mut EventRun, mine: Option<Begun>, outcome: Outcome, after: &mut AfterCommit) {
    match (mine, outcome) {
        (Some(Begun::Run(s)), _) => {
            run.run_id = Some(s.row.id);
            if !s.new {
                run.replayed_by = None;
            }
            after.started.push(*s);
        }
        (Some(Begun::Skipped(why)), _) => run.flow_note = Some(why),
        (Some(Begun::Refused(why)), _) => run.error = Some(why),
        (None, Outcome::Held(why) | Outcome::Dropped(why)) => run.flow_note = Some(why),
        (None, Outcome::Started(_)) => {}
    }
}

/// An arriving event's run was refused or skipped: a leading debounce opens
/// no burst for it (the next event starts one), a throttle counts no run.
fn unstarted(hold: Option<&Hold>, state: &mut Option<State>, before: Option<State>) {
    match hold {
        Some(Hold::Debounce { leading: true, .. }) => *state = before.filter(|s| !s.events.is_empty()),
        Some(Hold::Throttle { .. }) => {
            if let Some(s) = state {
                s.count = s.count.saturating_sub(1);
            }
        }
        _ => {}
    }
}

/// The hold a key's row was written with.
fn kept_hold(locked: &Locked) -> Result<Option<Hold>, EngineError> {
    let Some(v) = &locked.hold else { return Ok(None) };
    serde_json::from_value(v.clone())
        .map(Some)
        .map_err(|e| composer_store::Error::Corrupt(format!("trigger_flows.hold: {e}")).into())
}

fn state_of(locked: &Locked) -> Result<Option<State>, EngineError> {
    let Some(h) = &locked.held else { return Ok(None) };
    let events: Vec<HeldEvent> = serde_json::from_value(h.events.clone())
        .map_err(|e| composer_store::Error::Corrupt(format!("trigger_flows.events: {e}")))?;
    Ok(Some(State { opened_at: h.opened_at, due_at: h.due_at, count: h.count.max(0) as u32, events }))
}

/// The `seq`s of the events `state` holds.
fn held_seqs(state: Option<&State>) -> Vec<i64> {
    state.map_or_else(Vec::new, |s| s.events.iter().map(|e| e.seq).collect())
}

/// Writes back `state`; `kept`: the `seq`s of the events held when the key
/// was locked.
async fn save(
    tx: &composer_store::Transaction<'_>,
    k: &FlowKey,
    hold: Option<&Hold>,
    singleton: Option<SingletonMode>,
    state: Option<&State>,
    last_run: Option<Uuid>,
    kept: &[i64],
) -> Result<(), EngineError> {
    let hold = hold.map(|h| serde_json::to_value(h).unwrap_or(Value::Null));
    let singleton = singleton.map(|m| match m {
        SingletonMode::Skip => "skip",
        SingletonMode::Cancel => "cancel",
    });
    let held = state.map(|s| Held {
        opened_at: s.opened_at,
        due_at: s.due_at,
        count: s.count as i32,
        events: serde_json::to_value(&s.events).unwrap_or(Value::Array(Vec::new())),
    });
    let last_run = singleton.and(last_run);
    store::save(tx, k, hold.as_ref(), singleton, held.as_ref(), last_run, kept).await?;
    Ok(())
}

/// How long a singleton's cancel noted by a coordinator waits before the
/// timer loop takes it over (the coordinator cancels at once after its
/// commit; this is for one that died first).
const CANCEL_LEFT_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a due key whose work failed (a quota, the store) waits before
/// it is tried again, so that it does not hold the head of the queue.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts what the due keys' time starts, each in a transaction of its
/// own, up to `limit` keys a pass; cancels what singletons left to cancel,
/// and forgets keys that hold nothing. Returns how many runs started.
pub async fn fire_due(config: &Config, engine: &Arc<Engine>, limit: i64) -> Result<usize, EngineError> {
    let pool = engine.pool();
    let due = store::due(&composer_store::client(pool).await?, limit).await?;
    let mut started = 0;
    for k in &due {
        match fire_one(config, engine, k).await {
            Ok(n) => started += n,
            Err(e) => {
                tracing::warn!(workflow = %k.workflow, trigger = k.trigger, error = %e, "trigger flow: due key not worked; trying again in a minute");
                store::put_off(&composer_store::client(pool).await?, k, RETRY_AFTER).await?;
            }
        }
    }
    let mut client = composer_store::client(pool).await?;
    for run in store::cancels_left(&client, CANCEL_LEFT_AFTER, limit).await? {
        cancel(engine, run).await;
    }
    store::forget_idle(&mut client, limit).await?;
    Ok(started)
}

/// Works one due key: `Ok(0)` when another coordinator has it, or had it.
async fn fire_one(config: &Config, engine: &Arc<Engine>, k: &FlowKey) -> Result<usize, EngineError> {
    let mut client = composer_store::client(engine.pool()).await?;
    let def = composer_store::definitions::by_name(&client, &k.workflow, None).await?;
    let mut tx = composer_store::begin(&mut client).await?;
    let Some(locked) = store::lock_due(&tx, k).await? else { return Ok(0) };
    let (Some(hold), Some(state)) = (kept_hold(&locked)?, state_of(&locked)?) else {
        save(&tx, k, None, None, None, None, &[]).await?;
        tx.commit().await?;
        return Ok(0);
    };
    let kept = held_seqs(Some(&state));
    let (starts, next) = flow::due(&hold, state, locked.now);
    let mut after = AfterCommit::default();
    let compiled = match &def {
        Some(d) => match engine.compile(d) {
            Ok(wf) => Some((d, wf)),
            // A definition that cannot be compiled now may be later.
            Err(e) if !e.is_permanent() => return Err(e),
            Err(_) => None,
        },
        None => None,
    };
    let trigger = compiled.as_ref().and_then(|(d, wf)| {
        let t = wf.triggers.get(k.trigger as usize).filter(|t| t.event == k.event)?;
        Some((*d, t.event.clone(), t.flow().cloned()))
    });
    let singleton = match &trigger {
        Some((_, _, flow)) => flow.as_ref().and_then(|f| f.singleton),
        None => None,
    };
    match &trigger {
        Some((def, event, _)) => {
            let starter = Starter {
                config,
                engine,
                def,
                index: k.trigger as usize,
                key: &k.key,
                event,
                flow: hold.name(),
                singleton,
                traceparent: None,
                replay: None,
                arriving: None,
                waits_for_quota: true,
            };
            let mut last_run = locked.last_run;
            starter.start_all(&mut tx, &starts, None, &mut last_run, &mut after).await?;
            save(&tx, k, Some(&hold), singleton, next.as_ref(), last_run, &kept).await?;
        }
        None => {
            // The workflow, or its trigger, is gone: what it held starts nothing.
            let why = "the workflow, or this trigger of it, no longer exists";
            for start in &starts {
                store::note_events(&tx, &start.events, &k.workflow, k.trigger, None, Some(why), None).await?;
            }
            save(&tx, k, Some(&hold), None, next.as_ref(), None, &kept).await?;
        }
    }
    tx.commit().await?;
    let n = after.started.len();
    after.run(engine).await;
    Ok(n)
}
