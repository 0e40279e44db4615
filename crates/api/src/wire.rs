//! Messages that cross process boundaries: the dispatch a worker reads from a
//! stream, and the report it sends back to a coordinator.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// One task to execute, as carried on a Redis stream: built from the task
/// row when the outbox row is claimed, serialized here and parsed by the
/// worker. Field names are a contract with workers in other languages.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Dispatch {
    pub task_id: Uuid,
    pub run_id: Uuid,
    pub workflow_id: Uuid,
    pub workflow_version: i32,
    pub node_id: String,
    pub node_type: String,
    pub attempt: i32,
    pub input: Value,
    /// When the coordinator put the message on its stream, in microseconds
    /// since the Unix epoch: the worker measures the message's time in
    /// transit from it (`composer_step_stage_seconds`). Absent from messages
    /// of older coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at_us: Option<i64>,
    /// The W3C `traceparent` of this attempt's span: an HTTP node sends it
    /// to its target, a handler may pass it on. Absent from messages of
    /// older coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// When the transaction that dispatched the attempt wrote it (µs since
    /// the epoch), for the attempt's span; absent from a message the
    /// outbox's safety net sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_at_us: Option<i64>,
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// The outcome a worker reports for one attempt of a task.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReportStatus {
    Completed,
    Failed,
}

/// `POST /internal/v1/tasks/{id}/result`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    pub run_id: Uuid,
    #[serde(deserialize_with = "composer_core::whole::int")]
    pub attempt: i32,
    #[schema(pattern = "^[^\\u0000]*$")]
    pub worker_id: String,
    pub status: ReportStatus,
    /// The attempt's output; a NUL character in it fails the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub retryable: bool,
    /// A failure's code (`.nodes.X.error.code`); `task_failed` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    pub code: Option<String>,
    /// The HTTP status of a failure that is one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    #[schema(minimum = 100, maximum = 599)]
    pub http_status: Option<u16>,
    /// How long a 429 answer asked to wait (its `Retry-After`), in
    /// milliseconds; the engine waits at most an hour.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    #[schema(minimum = 0)]
    pub retry_after_ms: Option<u64>,
    /// When the attempt passed each stage on its way, for its span.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "stage_times")]
    pub stages: Option<StageTimes>,
}

/// `stages` only as a JSON object: serde would read a list as the fields in order.
fn stage_times<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StageTimes>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Map<String, Value>>::deserialize(d)? {
        None => Ok(None),
        Some(fields) => serde_json::from_value(Value::Object(fields)).map(Some).map_err(D::Error::custom),
    }
}

/// When one attempt passed each stage, in microseconds since the Unix
/// epoch, as the worker saw them (the first two it was told): what the
/// attempt's span shows besides its start and end.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageTimes {
    /// The dispatching transaction wrote the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub dispatched_at_us: Option<i64>,
    /// Its message went on its stream.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub published_at_us: Option<i64>,
    /// A worker read the message.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub read_at_us: Option<i64>,
    /// The worker's lease was granted.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub leased_at_us: Option<i64>,
    /// The handler started.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub started_at_us: Option<i64>,
    /// The handler ended.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub finished_at_us: Option<i64>,
}

/// The coordinator's answer to a report. An ignored report (duplicate, late,
/// stale) is still a success for the worker: it acks the message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReportAck {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
    /// The tasks leased to the reporting worker with this answer, as its
    /// `next` asked: run each as one a poll leased.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<crate::rest::LeasedTask>,
}

/// The answer to `POST /internal/v1/tasks/{id}/result`: the report's fate,
/// and the tasks leased to the reporting worker with it (eager dispatch).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReportReply {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
    /// Tasks the report's commit leased to its worker, as the report's
    /// [`EAGER_HEADER`] offered (at most its slots, of its queues): run
    /// them as if read from their streams and leased, from now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Dispatch>,
}

/// The header of a report that offers to take the run's next tasks with
/// its answer: `slots=<n>; lease_ms=<ms>; queues=<queue>,<queue>…`. A
/// coordinator that does not know it ignores it.
pub const EAGER_HEADER: &str = "composer-eager";

/// The header of a report that names its run's priority (`1` to `5`), as
/// the task's stream said it: the report waits for the coordinator's next
/// batch at that priority. One that does not read is the default level; a
/// coordinator that does not know it ignores it.
pub const PRIORITY_HEADER: &str = "composer-priority";

/// The level a [`PRIORITY_HEADER`] names: `None` unless `1` to `5`.
pub fn priority_of_header(value: &[u8]) -> Option<u8> {
    match value {
        [d @ b'1'..=b'5'] => Some(d - b'0'),
        _ => None,
    }
}

/// The [`EAGER_HEADER`]'s value in the form a worker writes it (the
/// coordinator also reads its parts in any order): the OpenAPI document's
/// pattern, held to [`EagerOffer::parse`] by a test.
pub const EAGER_HEADER_PATTERN: &str =
    "^slots=([1-9]|1[0-6]); lease_ms=([1-9][0-9]{3,5}|[12][0-9]{6}|3[0-5][0-9]{5}|3600000); \
     queues=[A-Za-z0-9_.-]{1,128}(,[A-Za-z0-9_.-]{1,128}){0,63}$";

/// The [`EAGER_HEADER`]'s schema.
pub struct EagerHeader;

impl utoipa::PartialSchema for EagerHeader {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(EAGER_HEADER_PATTERN))
            .into()
    }
}

impl utoipa::ToSchema for EagerHeader {}

/// Most tasks one report may ask for.
pub const MAX_EAGER_SLOTS: u32 = 16;
/// Most queues one report's offer may name.
pub const MAX_EAGER_QUEUES: usize = 64;
/// The shortest and longest lease an offer may ask for.
pub const EAGER_LEASE_MS: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;

/// What a report's [`EAGER_HEADER`] offers: up to `slots` tasks of `queues`,
/// each leased to the reporting worker for `lease`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EagerOffer {
    pub slots: u32,
    pub lease: std::time::Duration,
    pub queues: Vec<String>,
}

impl EagerOffer {
    /// The header's value.
    pub fn header(&self) -> String {
        format!("slots={}; lease_ms={}; queues={}", self.slots, self.lease.as_millis(), self.queues.join(","))
    }

    /// Reads a header's value; the error names what is wrong.
    pub fn parse(value: &str) -> Result<EagerOffer, String> {
        let (mut slots, mut lease, mut queues) = (None, None, None);
        for part in value.split(';') {
            let (key, v) = part.trim().split_once('=').ok_or_else(|| format!("{part:?} is not key=value"))?;
            let number = || v.parse::<u64>().map_err(|_| format!("{key} must be a whole number, not {v:?}"));
            match key {
                "slots" if slots.is_none() => slots = Some(number()?),
                "lease_ms" if lease.is_none() => lease = Some(number()?),
                "queues" if queues.is_none() => {
                    queues = Some(v.split(',').map(str::to_string).collect::<Vec<_>>());
                }
                _ => return Err(format!("unknown or repeated key {key:?}")),
            }
        }
        let slots = slots.ok_or("slots is missing")?;
        if slots == 0 || slots > u64::from(MAX_EAGER_SLOTS) {
            return Err(format!("slots must be 1 to {MAX_EAGER_SLOTS}"));
        }
        let lease = lease.ok_or("lease_ms is missing")?;
        if !EAGER_LEASE_MS.contains(&lease) {
            return Err(format!("lease_ms must be {} to {}", EAGER_LEASE_MS.start(), EAGER_LEASE_MS.end()));
        }
        let queues = queues.ok_or("queues is missing")?;
        if queues.len() > MAX_EAGER_QUEUES {
            return Err(format!("at most {MAX_EAGER_QUEUES} queues"));
        }
        for q in &queues {
            composer_core::definition::check_name("queues", q)?;
        }
        Ok(EagerOffer { slots: slots as u32, lease: std::time::Duration::from_millis(lease), queues })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priority_header_names_a_level_or_nothing() {
        let levels: Vec<Option<u8>> = [&b"1"[..], b"3", b"5"].iter().map(|v| priority_of_header(v)).collect();
        assert_eq!(levels, [Some(1), Some(3), Some(5)]);
        for bad in [&b"0"[..], b"6", b"", b"11", b" 1", b"1 ", b"-1", b"one", b"\xff"] {
            assert_eq!(priority_of_header(bad), None, "{bad:?}");
        }
    }

    fn report(stages: &str) -> Result<TaskReport, serde_json::Error> {
        let id = Uuid::now_v7();
        serde_json::from_str(&format!(
            r#"{{"run_id": "{id}", "attempt": 1, "worker_id": "w", "status": "COMPLETED", "stages": {stages}}}"#
        ))
    }

    #[test]
    fn stage_times_are_an_object_of_whole_microseconds_or_nothing() {
        let r = report(r#"{"read_at_us": 5, "finished_at_us": 9}"#).unwrap();
        assert_eq!(r.stages.map(|s| (s.read_at_us, s.finished_at_us)), Some((Some(5), Some(9))));
        assert!(report("null").unwrap().stages.is_none());
        let whole = report(r#"{"read_at_us": 5.0, "leased_at_us": null}"#).unwrap();
        assert_eq!(whole.stages.map(|s| (s.read_at_us, s.leased_at_us)), Some((Some(5), None)), "5.0 is whole");
        for bad in ["[1, 2, 3]", "[]", r#"{"read_at_us": "5"}"#, r#"{"read_at_us": 5.5}"#, r#"{"lease_at_us": 5}"#, "1"]
        {
            assert!(report(bad).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn an_eager_offer_reads_back_what_it_writes_and_refuses_what_it_does_not_take() {
        let offer = EagerOffer {
            slots: 2,
            lease: std::time::Duration::from_secs(30),
            queues: vec!["http".into(), "emails.v2".into()],
        };
        assert_eq!(offer.header(), "slots=2; lease_ms=30000; queues=http,emails.v2");
        assert_eq!(EagerOffer::parse(&offer.header()), Ok(offer));
        assert_eq!(EagerOffer::parse("queues=q;slots=1;lease_ms=1000").map(|o| o.slots), Ok(1), "any order");
        for (bad, says) in [
            ("", "not key=value"),
            ("slots=1", "lease_ms is missing"),
            ("slots=1; lease_ms=1000", "queues is missing"),
            ("lease_ms=1000; queues=q", "slots is missing"),
            ("slots=-1; lease_ms=1000; queues=q", "whole number"),
            ("slots=17; lease_ms=1000; queues=q", "1 to 16"),
            ("slots=1; lease_ms=999; queues=q", "1000 to 3600000"),
            ("slots=1; lease_ms=3600001; queues=q", "1000 to 3600000"),
            ("slots=1; lease_ms=1000; queues=", "must not be empty"),
            ("slots=1; lease_ms=1000; queues=a,,b", "must not be empty"),
            ("slots=1; lease_ms=1000; queues=a b", "queues"),
            ("slots=1; lease_ms=1000; queues=q; slots=2", "repeated"),
            ("slots=1; lease_ms=1000; queues=q; owner=x", "unknown"),
        ] {
            let e = EagerOffer::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let pattern = regex::Regex::new(EAGER_HEADER_PATTERN).unwrap();
        for (value, ok) in [
            ("slots=1; lease_ms=1000; queues=q", true),
            ("slots=16; lease_ms=3600000; queues=a.b,c-d,e_f", true),
            ("slots=9; lease_ms=999999; queues=q", true),
            ("slots=1; lease_ms=3599999; queues=q", true),
            ("slots=0; lease_ms=1000; queues=q", false),
            ("slots=17; lease_ms=1000; queues=q", false),
            ("slots=1; lease_ms=999; queues=q", false),
            ("slots=1; lease_ms=3600001; queues=q", false),
            ("slots=1; lease_ms=1000; queues=", false),
            ("null", false),
        ] {
            assert_eq!(pattern.is_match(value), ok, "{value}");
            assert_eq!(EagerOffer::parse(value).is_ok(), ok, "{value}");
        }
        let many = (0..=MAX_EAGER_QUEUES).map(|i| format!("q{i}")).collect::<Vec<_>>().join(",");
        let e = EagerOffer::parse(&format!("slots=1; lease_ms=1000; queues={many}")).unwrap_err();
        assert!(e.contains("at most 64 queues"), "{e}");
    }
}
