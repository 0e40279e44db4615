//! A workflow's triggers: the runs an event of a name starts, and their
//! flow control (`debounce`, `batch`, `throttle`, `singleton`), compiled.
//! What a held event does is [`crate::flow`]'s.

use serde_json::Value;

use super::check::positive_duration;
use super::check::ValidationError;
use super::input_schema::InputSchema;
use super::spec::{DebounceSpec, Excess, SingletonMode, ThrottleSpec, TriggerSpec};
use crate::expr::{Expr, OneScope, Sandbox, Template};
use crate::flow::{Hold, MAX_BATCH_SIZE, MAX_FLOW_KEY_BYTES, MAX_FLOW_PERIOD, MAX_THROTTLE_COUNT};

/// Most triggers one definition may have (`max_triggers`).
pub const MAX_TRIGGERS: usize = 16;
/// Longest event name, in characters (an event's, a trigger's, a webhook's).
pub const MAX_EVENT_NAME: usize = 256;
/// Longest event key, in characters: an event's, and so a WAIT_FOR_EVENT
/// step's (a longer one could never be matched).
pub const MAX_EVENT_KEY: usize = 1024;

/// A trigger, compiled: the run an event of its name starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub event: String,
    when: Option<Expr>,
    input: Option<Template>,
    idempotency_key: Option<Template>,
    key: Option<Template>,
    flow: Option<Flow>,
}

/// What a trigger makes of an event that meets its condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    pub input: Value,
    pub idempotency_key: Option<String>,
    /// Its flow control, with the key the event counts under.
    pub flow: Option<Flowed>,
}

/// A trigger's flow control: how it holds events, and whether a key runs
/// one run at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub hold: Option<Hold>,
    pub singleton: Option<SingletonMode>,
}

impl Flow {
    /// What it does, in words (the UI's and `simulate`'s).
    pub fn describe(&self) -> String {
        let mut said = match &self.hold {
            Some(Hold::Debounce { period_ms, leading: false, max_wait_ms }) => {
                let most = max_wait_ms.map(|w| format!(" (at most {w}ms after its first)")).unwrap_or_default();
                format!("debounced: one run {period_ms}ms after a burst's last event, with that event{most}")
            }
            Some(Hold::Debounce { period_ms, leading: true, .. }) => {
                format!("debounced: a burst's first event starts the run, the rest until {period_ms}ms of quiet none")
            }
            Some(Hold::Batch { max_size, max_wait_ms }) => format!(
                "batched: one run for the list of up to {max_size} events' inputs, or those within {max_wait_ms}ms \
                 of the first"
            ),
            Some(Hold::Throttle { count, period_ms, queue }) => format!(
                "throttled: at most {count} runs per {period_ms}ms, the rest {}",
                if *queue { "queued" } else { "dropped" }
            ),
            None => String::new(),
        };
        if let Some(mode) = self.singleton {
            let what = match mode {
                SingletonMode::Skip => "starts none while its last run runs",
                SingletonMode::Cancel => "cancels its last run if it runs",
            };
            let sep = if said.is_empty() { "" } else { "; " };
            said.push_str(&format!("{sep}singleton: a new run of a key {what}"));
        }
        said
    }
}

/// A trigger's flow control for one event: its key's.
#[derive(Debug, Clone, PartialEq)]
pub struct Flowed {
    pub key: String,
    pub hold: Option<Hold>,
    pub singleton: Option<SingletonMode>,
}

impl Trigger {
    /// Whether every expression of it is simple ([`Expr::is_simple`]).
    pub fn is_simple(&self) -> bool {
        self.when.as_ref().is_none_or(Expr::is_simple)
            && self.input.as_ref().is_none_or(Template::is_simple)
            && self.idempotency_key.as_ref().is_none_or(Template::is_simple)
            && self.key.as_ref().is_none_or(Template::is_simple)
    }

    /// Its flow control, if it has any.
    pub fn flow(&self) -> Option<&Flow> {
        self.flow.as_ref()
    }

    /// Applies the trigger to `event` (`{id, name, key, payload}`): `None`
    /// when its condition does not hold; an error naming the expression
    /// when one fails, or the key is not text of at most 256 characters.
    pub fn fire(&self, sb: &Sandbox, event: &Value) -> Result<Option<Fired>, String> {
        // One scope for its expressions: the event converted once, if read.
        let scope = OneScope::new("event", event);
        if let Some(when) = &self.when {
            if !scope.eval_bool(sb, when).map_err(|e| format!("when: {e}"))? {
                return Ok(None);
            }
        }
        let input = match &self.input {
            Some(t) => scope.eval(sb, t).map_err(|e| format!("input: {e}"))?,
            None => event.get("payload").cloned().unwrap_or(Value::Null),
        };
        let idempotency_key = match &self.idempotency_key {
            None => None,
            Some(t) => match scope.eval(sb, t).map_err(|e| format!("idempotency_key: {e}"))? {
                Value::String(k) if !k.is_empty() && k.chars().count() <= 256 => Some(k),
                Value::Number(n) => Some(n.to_string()),
                other => {
                    let shown = crate::clipped(&other.to_string(), 200);
                    return Err(format!("idempotency_key: must be text of 1 to 256 characters, got {shown}"));
                }
            },
        };
        let flow = match &self.flow {
            None => None,
            Some(f) => {
                let key = match &self.key {
                    None => event.get("key").and_then(Value::as_str).unwrap_or_default().to_string(),
                    Some(t) => match scope.eval(sb, t).map_err(|e| format!("key: {e}"))? {
                        Value::String(k) if k.chars().count() <= MAX_EVENT_KEY && !k.contains('\0') => k,
                        Value::Number(n) => n.to_string(),
                        other => {
                            let shown = crate::clipped(&other.to_string(), 200);
                            return Err(format!(
                                "key: must be text of at most {MAX_EVENT_KEY} characters, without NUL, got {shown}"
                            ));
                        }
                    },
                };
                if key.len() > MAX_FLOW_KEY_BYTES {
                    let shown = crate::clipped(&key, 100);
                    return Err(format!(
                        "key: {} bytes, more than {MAX_FLOW_KEY_BYTES} (max_flow_key_bytes): {shown}",
                        key.len()
                    ));
                }
                Some(Flowed { key, hold: f.hold.clone(), singleton: f.singleton })
            }
        };
        Ok(Some(Fired { input, idempotency_key, flow }))
    }
}

/// A batch's run takes the list of its events' inputs: refused when the
/// workflow's `input_schema` could take no list, as every batch would fail.
fn batches_fit(triggers: &[Trigger], schema: Option<&InputSchema>) -> Result<(), ValidationError> {
    let Some(why) = schema.and_then(InputSchema::refuses_every_list) else { return Ok(()) };
    let batch = triggers.iter().position(|t| matches!(t.flow, Some(Flow { hold: Some(Hold::Batch { .. }), .. })));
    match batch {
        Some(i) => Err(ValidationError::new(
            format!("triggers[{i}].batch"),
            format!("a batch's run takes the list of its events' inputs, and {why}"),
        )),
        None => Ok(()),
    }
}

/// A definition's `triggers`, compiled: at most [`MAX_TRIGGERS`], each
/// naming an event, with expressions that read the event only. `schema` is
/// its `input_schema`, which a batch's list must be able to meet.
pub(super) fn compile_triggers(
    triggers: Option<&[TriggerSpec]>,
    schema: Option<&InputSchema>,
) -> Result<Vec<Trigger>, ValidationError> {
    let Some(triggers) = triggers else { return Ok(Vec::new()) };
    if triggers.len() > MAX_TRIGGERS {
        return Err(ValidationError::new("triggers", format!("at most {MAX_TRIGGERS} (max_triggers)")));
    }
    let mut out = Vec::with_capacity(triggers.len());
    for (i, t) in triggers.iter().enumerate() {
        let at = |field: &str| format!("triggers[{i}].{field}");
        let chars = t.event.chars().count();
        if chars == 0 || chars > MAX_EVENT_NAME || t.event.contains('\0') {
            return Err(ValidationError::new(at("event"), format!("must be 1 to {MAX_EVENT_NAME} characters")));
        }
        let reads_only_the_event = |text: &str| !text.contains(".secrets") && !text.contains(".nodes");
        let when = match &t.when {
            None => None,
            Some(w) if !reads_only_the_event(w) => {
                return Err(ValidationError::new(at("when"), "reads the event only (.event)"))
            }
            Some(w) => Some(Expr::compile(w).map_err(|m| ValidationError::new(at("when"), m))?),
        };
        let input = match &t.input {
            None => None,
            Some(v) if !reads_only_the_event(&v.to_string()) => {
                return Err(ValidationError::new(at("input"), "reads the event only (.event)"))
            }
            Some(v) => {
                Some(Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{}{p}", at("input")), m))?)
            }
        };
        let idempotency_key = match &t.idempotency_key {
            None => None,
            Some(k) if !reads_only_the_event(k) => {
                return Err(ValidationError::new(at("idempotency_key"), "reads the event only (.event)"))
            }
            Some(k) => Some(
                Template::compile(&Value::String(k.clone()))
                    .map_err(|(_, m)| ValidationError::new(at("idempotency_key"), m))?,
            ),
        };
        let key = match &t.key {
            None => None,
            Some(k) if !reads_only_the_event(k) => {
                return Err(ValidationError::new(at("key"), "reads the event only (.event)"))
            }
            Some(k) => Some(
                Template::compile(&Value::String(k.clone())).map_err(|(_, m)| ValidationError::new(at("key"), m))?,
            ),
        };
        let flow = compile_flow(t, &at)?;
        if key.is_some() && flow.is_none() {
            return Err(ValidationError::new(
                at("key"),
                "is the key of a flow control: give debounce, batch, throttle or singleton",
            ));
        }
        out.push(Trigger { event: t.event.clone(), when, input, idempotency_key, key, flow });
    }
    batches_fit(&out, schema)?;
    Ok(out)
}

/// A trigger's `debounce`, `batch`, `throttle` and `singleton`, checked:
/// at most one way to hold events, each number and time within its limit.
fn compile_flow(t: &TriggerSpec, at: &dyn Fn(&str) -> String) -> Result<Option<Flow>, ValidationError> {
    let holds = [t.debounce.is_some(), t.batch.is_some(), t.throttle.is_some()];
    if holds.iter().filter(|h| **h).count() > 1 {
        return Err(ValidationError::new(at("debounce"), "debounce, batch and throttle exclude each other: give one"));
    }
    let period = |field: &str, text: &str| -> Result<u64, ValidationError> {
        let d = positive_duration(&at(field), text)?;
        if d > MAX_FLOW_PERIOD {
            return Err(ValidationError::new(at(field), "must be at most 7d (max_flow_period)"));
        }
        Ok(d.as_millis() as u64)
    };
    let hold = if let Some(DebounceSpec { period: p, leading, max_wait }) = &t.debounce {
        let max_wait_ms = match max_wait {
            Some(w) => Some(period("debounce.max_wait", w)?),
            None => None,
        };
        Some(Hold::Debounce {
            period_ms: period("debounce.period", p)?,
            leading: leading.unwrap_or(false),
            max_wait_ms,
        })
    } else if let Some(b) = &t.batch {
        if !(1..=MAX_BATCH_SIZE).contains(&b.max_size) {
            return Err(ValidationError::new(
                at("batch.max_size"),
                format!("must be 1 to {MAX_BATCH_SIZE} (max_batch_size)"),
            ));
        }
        if t.idempotency_key.is_some() {
            return Err(ValidationError::new(
                at("idempotency_key"),
                "a batch's run is many events' run: it takes no idempotency_key",
            ));
        }
        Some(Hold::Batch { max_size: b.max_size as u32, max_wait_ms: period("batch.max_wait", &b.max_wait)? })
    } else if let Some(ThrottleSpec { count, period: p, excess }) = &t.throttle {
        if !(1..=MAX_THROTTLE_COUNT).contains(count) {
            return Err(ValidationError::new(
                at("throttle.count"),
                format!("must be 1 to {MAX_THROTTLE_COUNT} (max_throttle_count)"),
            ));
        }
        let queue = !matches!(excess, Some(Excess::Drop));
        Some(Hold::Throttle { count: *count as u32, period_ms: period("throttle.period", p)?, queue })
    } else {
        None
    };
    if hold.is_none() && t.singleton.is_none() {
        return Ok(None);
    }
    Ok(Some(Flow { hold, singleton: t.singleton }))
}

#[cfg(test)]
mod tests {
    use super::super::Workflow;
    use super::*;
    use serde_json::json;

    fn with(trigger: Value) -> Result<Workflow, ValidationError> {
        Workflow::parse(&json!({"name": "w", "nodes": [{"id": "a", "type": "NOOP"}], "triggers": [trigger]}))
    }

    #[test]
    fn each_flow_compiles_to_its_hold_and_the_key_is_the_event_s_by_default() {
        let wf =
            with(json!({"event": "e", "debounce": {"period": "5s", "max_wait": "1m"}, "singleton": "cancel"})).unwrap();
        let flow = wf.triggers[0].flow().unwrap();
        assert_eq!(flow.hold, Some(Hold::Debounce { period_ms: 5000, leading: false, max_wait_ms: Some(60_000) }));
        assert_eq!(flow.singleton, Some(SingletonMode::Cancel));
        let sb = Sandbox::for_tests();
        let fired = wf.triggers[0].fire(&sb, &json!({"key": "k1", "payload": 1})).unwrap().unwrap();
        assert_eq!(fired.flow.unwrap().key, "k1");

        let wf =
            with(json!({"event": "e", "key": "${ .event.payload.c }", "batch": {"max_size": 3, "max_wait": "2s"}}))
                .unwrap();
        let fired = wf.triggers[0].fire(&sb, &json!({"key": "k", "payload": {"c": 7}})).unwrap().unwrap();
        let flowed = fired.flow.unwrap();
        assert_eq!((flowed.key.as_str(), flowed.hold), ("7", Some(Hold::Batch { max_size: 3, max_wait_ms: 2000 })));
        let bad = wf.triggers[0].fire(&sb, &json!({"payload": {"c": [1]}})).unwrap_err();
        assert!(bad.starts_with("key: must be text"), "{bad}");

        let wf = with(json!({"event": "e", "throttle": {"count": 2, "period": "1m", "excess": "drop"}})).unwrap();
        let hold = wf.triggers[0].flow().unwrap().hold.clone();
        assert_eq!(hold, Some(Hold::Throttle { count: 2, period_ms: 60_000, queue: false }));
        assert!(with(json!({"event": "e"})).unwrap().triggers[0].flow().is_none());
    }

    #[test]
    fn flows_that_cannot_work_are_refused_by_field() {
        for (trigger, field, says) in [
            (
                json!({"event": "e", "debounce": {"period": "1s"}, "batch": {"max_size": 2, "max_wait": "1s"}}),
                "triggers[0].debounce",
                "exclude each other",
            ),
            (json!({"event": "e", "key": "k"}), "triggers[0].key", "give debounce"),
            (json!({"event": "e", "debounce": {"period": "0s"}}), "triggers[0].debounce.period", "greater than zero"),
            (json!({"event": "e", "debounce": {"period": "8d"}}), "triggers[0].debounce.period", "max_flow_period"),
            (
                json!({"event": "e", "batch": {"max_size": 1001, "max_wait": "1s"}}),
                "triggers[0].batch.max_size",
                "max_batch_size",
            ),
            (
                json!({"event": "e", "batch": {"max_size": 0, "max_wait": "1s"}}),
                "triggers[0].batch.max_size",
                "max_batch_size",
            ),
            (
                json!({"event": "e", "batch": {"max_size": 5, "max_wait": "1s"}, "idempotency_key": "x"}),
                "triggers[0].idempotency_key",
                "no idempotency_key",
            ),
            (
                json!({"event": "e", "throttle": {"count": 10001, "period": "1s"}}),
                "triggers[0].throttle.count",
                "max_throttle_count",
            ),
            (
                json!({"event": "e", "throttle": {"count": 1, "period": "1s", "excess": "later"}}),
                "triggers[0].throttle.excess",
                "is not accepted",
            ),
            (json!({"event": "e", "singleton": "maybe"}), "triggers[0].singleton", "is not accepted"),
            (
                json!({"event": "e", "singleton": "skip", "key": "${ .secrets.k }"}),
                "triggers[0].key",
                "reads the event only",
            ),
        ] {
            let e = with(trigger.clone()).unwrap_err();
            assert_eq!(e.path, field, "{trigger}: {e}");
            assert!(e.message.contains(says), "{trigger}: {e}");
        }
    }

    #[test]
    fn a_batch_is_refused_when_the_input_schema_takes_no_list() {
        let batch = json!({"event": "e", "batch": {"max_size": 3, "max_wait": "1s"}});
        let parse = |schema: Value, trigger: &Value| {
            Workflow::parse(&json!({"name": "w", "nodes": [{"id": "a", "type": "NOOP"}],
                                    "input_schema": schema, "triggers": [{"event": "x"}, trigger]}))
        };
        for (schema, says) in [
            (json!({"type": "object"}), "input_schema's type is object"),
            (json!({"type": ["string", "null"]}), "type is string or null"),
            (json!(false), "input_schema is false"),
            (json!({"const": {"a": 1}}), "const is not a list"),
            (json!({"enum": [1, "a"]}), "enum has no list"),
        ] {
            let e = parse(schema.clone(), &batch).unwrap_err();
            assert_eq!(e.path, "triggers[1].batch", "{schema}: {e}");
            assert!(e.message.contains("takes the list of its events' inputs") && e.message.contains(says), "{e}");
            // The same schema with no batch is no one's business here.
            parse(schema, &json!({"event": "e", "debounce": {"period": "1s"}})).unwrap();
        }
        // A schema that may take a list, or says nothing at its root, is let be.
        for schema in [
            json!({"type": "array", "items": {"type": "object"}}),
            json!({"type": ["array", "object"]}),
            json!({"anyOf": [{"type": "object"}]}),
            json!({"enum": [[1], 2]}),
            json!(true),
            json!({}),
        ] {
            parse(schema.clone(), &batch).unwrap_or_else(|e| panic!("{schema}: {e}"));
        }
    }
}
