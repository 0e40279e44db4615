//! Schedules: a workflow started on a cron, in a time zone, with a policy for
//! overlapping runs and a catch-up window after downtime. This module is the
//! pure part — parsing, validation, and which fire times are due — so that it
//! can be tested without a clock or a database; the coordinator's timer loop
//! fires what [`Schedule::due`] returns.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::definition::ValidationError;
use crate::duration;

/// A schedule as the user writes it (`POST /v1/schedules`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub workflow: String,
    /// The version each run starts; the latest at each fire without it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// Five fields (minute hour day month weekday), or six with seconds first.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "*/5 * * * *"))]
    pub cron: String,
    /// An IANA time zone name; UTC by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "Europe/Paris"))]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// How far back missed fire times still fire after downtime (`"1m"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9]{1,9}(ms|s|m|h|d)$"))]
    pub catchup_window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// What a fire time does while the schedule's previous run is still open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// No new run (the fire time is skipped).
    #[default]
    Skip,
    /// A new run regardless.
    Allow,
    /// One run waits and starts when the open one ends; more are skipped.
    BufferOne,
}

/// What a backfilled fire time does while a run of the schedule is open
/// (its own runs and the backfill's alike).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackfillOverlap {
    /// Every fire time starts its run at once.
    #[default]
    Allow,
    /// A fire time that finds a run open starts none (the first of a backfill
    /// on an idle schedule starts, the others are skipped).
    Skip,
    /// One at a time, oldest first: each starts when the run before it ended.
    BufferAll,
}

impl BackfillOverlap {
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillOverlap::Allow => "allow",
            BackfillOverlap::Skip => "skip",
            BackfillOverlap::BufferAll => "buffer_all",
        }
    }

    pub fn parse(text: &str) -> Option<BackfillOverlap> {
        [BackfillOverlap::Allow, BackfillOverlap::Skip, BackfillOverlap::BufferAll]
            .into_iter()
            .find(|o| o.as_str() == text)
    }
}

/// Most fire times one backfill may ask for (`schedule_max_backfill`): a
/// per-second cron over a year would queue 31 million runs.
pub const MAX_BACKFILL_FIRES: usize = 10_000;

/// Most fire times one pass of the timer loop fires for one schedule: a
/// per-second cron with a day-long catch-up window cannot start 86,400 runs
/// in one transaction (`schedule_max_catchup`).
pub const MAX_CATCHUP_FIRES: usize = 100;

/// Missed fire times counted one by one before the rest of an outage is
/// skipped at once.
const MAX_MISSED_WALK: u64 = 100_000;

/// Longest catch-up window.
pub const MAX_CATCHUP_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest a new schedule may wait for its next fire time
/// (`schedule_max_fire_wait`, 8 years): a cron of 29 February waits at most
/// eight years (from 2096 to 2104, since 2100 is not a leap year), so a cron
/// whose days and months name a real date always fires within it. A cron
/// that does not (30 February, or 31 April) never fires and is refused, as
/// is one whose weekday rule pushes every fire time further away.
pub const MAX_FIRE_WAIT: chrono::TimeDelta = chrono::TimeDelta::days(8 * 366);

/// A validated schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub spec: ScheduleSpec,
    cron: croner::Cron,
    tz: chrono_tz::Tz,
    pub overlap: Overlap,
    pub catchup_window: Duration,
    /// Its hour field is `*` (or it is `@hourly`): it fires every hour,
    /// both passes of a fall-back's repeated hour included.
    every_hour: bool,
}

/// The fire times due at a moment, and what comes after them.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    /// Oldest first; each starts a run under the overlap policy.
    pub fire: Vec<DateTime<Utc>>,
    /// Fire times older than the catch-up window (or past
    /// [`MAX_CATCHUP_FIRES`]): not run, counted.
    pub missed: u64,
    /// The next fire time after now (`None`: the cron never fires again).
    pub next: Option<DateTime<Utc>>,
}

impl Schedule {
    /// Parses and validates; errors name the field.
    pub fn parse(json: &Value) -> Result<Schedule, ValidationError> {
        let spec: ScheduleSpec = crate::definition::read("", json)?;
        Schedule::new(spec)
    }

    pub fn new(spec: ScheduleSpec) -> Result<Schedule, ValidationError> {
        crate::definition::validate_name("id", &spec.id)?;
        crate::definition::validate_name("workflow", &spec.workflow)?;
        if spec.version.is_some_and(|v| v < 1) {
            return Err(ValidationError::new("version", "must be a version number (1 or more)"));
        }
        let cron = parse_cron(&spec.cron).map_err(|m| ValidationError::new("cron", m))?;
        let tz = match spec.timezone.as_deref() {
            None => chrono_tz::Tz::UTC,
            Some(name) => name.parse().map_err(|_| {
                ValidationError::new("timezone", format!("{name:?} is not an IANA time zone (such as Europe/Paris)"))
            })?,
        };
        let catchup_window = match spec.catchup_window.as_deref() {
            None => Duration::from_secs(60),
            Some(w) => {
                let d = duration::parse(w).map_err(|e| ValidationError::new("catchup_window", e))?;
                if d > MAX_CATCHUP_WINDOW {
                    return Err(ValidationError::new("catchup_window", "must be at most 7d"));
                }
                d
            }
        };
        if let Some(input) = &spec.input {
            crate::storable::check(input, "input", crate::storable::DEFAULT_MAX_PAYLOAD)
                .map_err(|m| ValidationError::new("input", m))?;
        }
        let overlap = spec.overlap.unwrap_or_default();
        let every_hour = every_hour(&spec.cron);
        Ok(Schedule { spec, cron, tz, overlap, catchup_window, every_hour })
    }

    /// The first fire time strictly after `t`. Fire times are whole seconds
    /// (the cron library would carry `t`'s fraction into its answer).
    ///
    /// Across daylight saving, as cron does: a wall time the spring-forward
    /// skips fires once, at the change; a wall time the fall-back repeats
    /// fires once, at its first pass, unless the schedule fires every hour
    /// (its hour field is `*`), which fires in both passes, so that an
    /// hourly schedule never goes two hours without a fire. (The cron
    /// library sees the repeated hour's wall times once: their second pass
    /// is found here, at the offset after the change.)
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        use chrono::Offset;
        let t = t.trunc_subsecs(0);
        let mut from = t;
        // A round passes a candidate over only in a repeated hour, and the
        // next round starts from it: a few rounds are always enough.
        for _ in 0..4 {
            let local = from.with_timezone(&self.tz);
            let by_zone = self.cron.find_next_occurrence(&local, false).ok()?.with_timezone(&Utc);
            let offsets = [local.offset().fix(), self.offset_at(by_zone)];
            if by_zone > t && offsets[0] == offsets[1] {
                return Some(by_zone); // no change of offset on the way: the usual case
            }
            // The library resolves a repeated wall time to its first pass
            // (even one before `from`): look at each offset on its own.
            let mut best = (by_zone > t && !self.repeats(by_zone)).then_some(by_zone);
            let mut passed: Option<DateTime<Utc>> = None;
            for offset in offsets {
                let Ok(c) = self.cron.find_next_occurrence(&from.with_timezone(&offset), false) else { continue };
                let c = c.with_timezone(&Utc);
                let real = self.offset_at(c) == offset;
                if real && c > t && (self.every_hour || !self.repeats(c)) {
                    best = Some(best.map_or(c, |b| b.min(c)));
                } else if c > from {
                    passed = Some(passed.map_or(c, |p| p.min(c)));
                }
            }
            match (best, passed) {
                (Some(b), _) => return Some(b),
                (None, Some(p)) => from = p,
                (None, None) => return None,
            }
        }
        None
    }

    /// The offset from UTC of the schedule's time zone at `t`.
    fn offset_at(&self, t: DateTime<Utc>) -> chrono::FixedOffset {
        use chrono::{Offset, TimeZone};
        self.tz.offset_from_utc_datetime(&t.naive_utc()).fix()
    }

    /// Whether `t` is the second pass of a wall time a fall-back repeats.
    fn repeats(&self, t: DateTime<Utc>) -> bool {
        use chrono::TimeZone;
        match self.tz.from_local_datetime(&t.with_timezone(&self.tz).naive_local()) {
            chrono::LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc) != t,
            _ => false,
        }
    }

    /// The first fire time after `now`; a cron that never fires (or not
    /// within [`MAX_FIRE_WAIT`]) is an error naming it. A schedule is
    /// refused when this fails, so none is stored that would never start a run.
    pub fn first_fire(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, ValidationError> {
        let cron = &self.spec.cron;
        match self.next_after(now) {
            Some(next) if next - now <= MAX_FIRE_WAIT => Ok(next),
            Some(next) => Err(ValidationError::new(
                "cron",
                format!("{cron:?} never fires within 8 years (schedule_max_fire_wait): its next fire time is {next}"),
            )),
            None => Err(ValidationError::new("cron", format!("{cron:?} never fires: no date matches it"))),
        }
    }

    /// The next `n` fire times after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }

    /// What is due at `now` for a schedule whose next fire time was `from`:
    /// every fire time in `[from, now]`, those within the catch-up window to
    /// fire (oldest first, at most [`MAX_CATCHUP_FIRES`]) and the older ones
    /// missed.
    pub fn due(&self, from: DateTime<Utc>, now: DateTime<Utc>) -> Due {
        let window = chrono::Duration::from_std(self.catchup_window).unwrap_or(chrono::Duration::MAX);
        let oldest = now.checked_sub_signed(window).unwrap_or(DateTime::<Utc>::MIN_UTC);
        let mut due = Due { fire: Vec::new(), missed: 0, next: None };
        let mut at = Some(from);
        // Before the window: missed. After a long outage this walk stops at
        // a bound and jumps to the window (the count is then a floor).
        while let Some(t) = at.filter(|t| *t < oldest) {
            due.missed += 1;
            at = if due.missed < MAX_MISSED_WALK {
                self.next_after(t)
            } else {
                self.next_after(oldest - chrono::Duration::milliseconds(1))
            };
        }
        while let Some(t) = at.filter(|t| *t <= now) {
            if due.fire.len() < MAX_CATCHUP_FIRES {
                due.fire.push(t);
            } else {
                due.missed += 1;
            }
            at = self.next_after(t);
        }
        due.next = at;
        due
    }
}

impl Schedule {
    /// The fire times a backfill of `[from, to)` starts, oldest first: the
    /// ones the cron names in that range, which must have passed (`to` at
    /// most `now`) and number at most [`MAX_BACKFILL_FIRES`]. Errors name the
    /// field.
    pub fn backfill(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<DateTime<Utc>>, ValidationError> {
        if to <= from {
            let (from, to) = (from.to_rfc3339(), to.to_rfc3339());
            return Err(ValidationError::new("to", format!("{to} is not after from ({from})")));
        }
        if to > now {
            return Err(ValidationError::new(
                "to",
                format!(
                    "{} is in the future: a backfill starts the fire times that have passed (now is {})",
                    to.to_rfc3339(),
                    now.to_rfc3339()
                ),
            ));
        }
        let mut fires = Vec::new();
        // next_after is strict and works in whole seconds: start a second early.
        let mut at = self.next_after(from.checked_sub_signed(chrono::Duration::seconds(1)).unwrap_or(from));
        while let Some(t) = at.filter(|t| *t < to) {
            if t >= from {
                if fires.len() == MAX_BACKFILL_FIRES {
                    return Err(ValidationError::new(
                        "to",
                        format!(
                            "more than {MAX_BACKFILL_FIRES} fire times between {} and {} \
                             (schedule_max_backfill): ask for a shorter range",
                            from.to_rfc3339(),
                            to.to_rfc3339()
                        ),
                    ));
                }
                fires.push(t);
            }
            at = self.next_after(t);
        }
        Ok(fires)
    }
}

/// Five fields, or six with seconds first (`@hourly` and friends too).
/// Whether a cron fires every hour: `@hourly`, or an hour field of `*`
/// (the second of five fields, the third of six).
fn every_hour(text: &str) -> bool {
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields.as_slice() {
        [one] => one.eq_ignore_ascii_case("@hourly"),
        [_, hour, _, _, _] | [_, _, hour, _, _, _] => *hour == "*",
        _ => false,
    }
}

fn parse_cron(text: &str) -> Result<croner::Cron, String> {
    let fields = text.split_whitespace().count();
    if !text.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
        return Err(format!(
            "{text:?} has {fields} fields: a cron has 5 (minute hour day month weekday) or 6 (seconds first)"
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(text)
        .map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn schedule(extra: Value) -> Schedule {
        let mut spec = json!({"id": "nightly", "workflow": "report", "cron": "0 2 * * *"});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        Schedule::parse(&spec).unwrap()
    }

    #[test]
    fn five_fields_fire_on_the_minute_and_six_take_seconds_first() {
        let s = schedule(json!({"cron": "*/15 * * * *"}));
        assert_eq!(s.next_after(at("2026-01-01T10:07:30Z")), Some(at("2026-01-01T10:15:00Z")));
        let s = schedule(json!({"cron": "30 * * * * *"}));
        assert_eq!(s.next_after(at("2026-01-01T10:07:30Z")), Some(at("2026-01-01T10:08:30Z")));
        assert_eq!(
            s.upcoming(at("2026-01-01T10:07:30Z"), 2),
            vec![at("2026-01-01T10:08:30Z"), at("2026-01-01T10:09:30Z")]
        );
    }

    #[test]
    fn across_daylight_saving_a_daily_time_fires_once_and_an_hourly_schedule_every_real_hour() {
        let paris = |cron: &str| schedule(json!({"cron": cron, "timezone": "Europe/Paris"}));
        // 28 March 2027: 02:00 CET becomes 03:00 CEST; 31 October: 03:00 CEST becomes 02:00 CET.
        let daily = paris("30 2 * * *");
        assert_eq!(
            daily.upcoming(at("2027-03-27T12:00:00Z"), 2),
            vec![at("2027-03-28T01:00:00Z"), at("2027-03-29T00:30:00Z")],
            "02:30 does not exist that night: once, at the change"
        );
        assert_eq!(
            daily.upcoming(at("2027-10-30T12:00:00Z"), 2),
            vec![at("2027-10-31T00:30:00Z"), at("2027-11-01T01:30:00Z")],
            "02:30 comes twice: once, at its first pass"
        );
        for hourly in [paris("0 * * * *"), paris("@hourly"), paris("0 0 * * * *")] {
            assert_eq!(
                hourly.upcoming(at("2027-10-30T22:30:00Z"), 5),
                ["23:00", "00:00", "01:00", "02:00", "03:00"]
                    .iter()
                    .enumerate()
                    .map(|(i, t)| at(&format!("2027-10-{}T{t}:00Z", if i == 0 { 30 } else { 31 })))
                    .collect::<Vec<_>>(),
                "{}: every hour, the repeated one twice",
                hourly.spec.cron
            );
            assert_eq!(
                hourly.upcoming(at("2027-03-27T23:30:00Z"), 3),
                vec![at("2027-03-28T00:00:00Z"), at("2027-03-28T01:00:00Z"), at("2027-03-28T02:00:00Z")]
            );
        }
        let quarter = paris("*/15 * * * *");
        let fires = quarter.upcoming(at("2027-10-31T00:00:00Z"), 8);
        let gaps: Vec<i64> = fires.windows(2).map(|w| (w[1] - w[0]).num_minutes()).collect();
        assert_eq!(gaps, vec![15; 7], "{fires:?}");
        assert!(!every_hour("0 2 * * *") && !every_hour("0 */2 * * *") && every_hour("*/5 * * * *"));
        // Asked during the second pass of 02:xx, a daily 02:30 does not go back to the first.
        assert_eq!(daily.next_after(at("2027-10-31T01:10:00Z")), Some(at("2027-11-01T01:30:00Z")));
    }

    proptest::proptest! {
        #[test]
        fn fire_times_only_go_forward_in_any_zone_across_any_change(
            secs in 1_798_761_600i64..1_830_297_600, // 2027
            cron in proptest::sample::select(vec!["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 1-3 * * *", "*/20 2 * * *", "0 0 * * 0"]),
            zone in proptest::sample::select(vec!["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Tehran", "UTC"]),
        ) {
            let s = schedule(json!({"cron": cron, "timezone": zone}));
            let t = DateTime::from_timestamp(secs, 0).unwrap();
            let fires = s.upcoming(t, 30);
            proptest::prop_assert_eq!(fires.len(), 30);
            proptest::prop_assert!(fires[0] > t);
            for w in fires.windows(2) {
                proptest::prop_assert!(w[1] > w[0], "{:?} after {:?}", w[1], w[0]);
            }
        }
    }

    #[test]
    fn a_time_zone_keeps_the_local_hour_across_daylight_saving() {
        let s = schedule(json!({"timezone": "Europe/Paris"}));
        // 02:00 in Paris is 01:00 UTC in winter and 00:00 UTC in summer.
        assert_eq!(s.next_after(at("2026-01-10T12:00:00Z")), Some(at("2026-01-11T01:00:00Z")));
        assert_eq!(s.next_after(at("2026-07-10T12:00:00Z")), Some(at("2026-07-11T00:00:00Z")));
    }

    #[test]
    fn after_downtime_fire_times_within_the_window_fire_oldest_first_and_older_ones_are_missed() {
        let s = schedule(json!({"cron": "* * * * *", "catchup_window": "3m"}));
        let due = s.due(at("2026-01-01T10:00:00Z"), at("2026-01-01T10:10:30Z"));
        assert_eq!(due.fire, vec![at("2026-01-01T10:08:00Z"), at("2026-01-01T10:09:00Z"), at("2026-01-01T10:10:00Z")]);
        assert_eq!(due.missed, 8, "10:00 to 10:07");
        assert_eq!(due.next, Some(at("2026-01-01T10:11:00Z")));
        let on_time = s.due(at("2026-01-01T10:11:00Z"), at("2026-01-01T10:11:00.2Z"));
        assert_eq!((on_time.fire.len(), on_time.missed), (1, 0));
        let early = s.due(at("2026-01-01T10:12:00Z"), at("2026-01-01T10:11:30Z"));
        assert_eq!((early.fire.len(), early.next), (0, Some(at("2026-01-01T10:12:00Z"))));
    }

    #[test]
    fn a_long_outage_is_counted_without_walking_every_second_of_it() {
        let s = schedule(json!({"cron": "* * * * * *", "catchup_window": "7d"}));
        let due = s.due(at("2026-01-01T00:00:00Z"), at("2026-01-01T01:00:00Z"));
        assert_eq!(due.fire.len(), MAX_CATCHUP_FIRES, "bounded per pass");
        assert_eq!(due.missed, 3601 - MAX_CATCHUP_FIRES as u64);
        let s = schedule(json!({"cron": "* * * * * *", "catchup_window": "1s"}));
        let due = s.due(at("2026-01-01T00:00:00Z"), at("2026-01-03T00:00:00Z"));
        assert_eq!(due.missed, MAX_MISSED_WALK, "a floor, reached at once");
        assert_eq!(due.fire, vec![at("2026-01-02T23:59:59Z"), at("2026-01-03T00:00:00Z")]);
    }

    #[test]
    fn a_backfill_names_the_fire_times_from_inclusive_to_exclusive() {
        let s = schedule(json!({"cron": "0 * * * *"}));
        let now = at("2026-06-01T00:00:00Z");
        let fires = s.backfill(at("2026-01-01T10:00:00Z"), at("2026-01-01T13:00:00Z"), now).unwrap();
        assert_eq!(fires, vec![at("2026-01-01T10:00:00Z"), at("2026-01-01T11:00:00Z"), at("2026-01-01T12:00:00Z")]);
        let fires = s.backfill(at("2026-01-01T10:00:00.5Z"), at("2026-01-01T12:00:01Z"), now).unwrap();
        assert_eq!(fires, vec![at("2026-01-01T11:00:00Z"), at("2026-01-01T12:00:00Z")], "a fraction past 10:00");
        assert!(s.backfill(at("2026-01-01T10:10:00Z"), at("2026-01-01T10:50:00Z"), now).unwrap().is_empty());
        let paris = schedule(json!({"timezone": "Europe/Paris"}));
        let fires = paris.backfill(at("2026-03-27T00:00:00Z"), at("2026-03-31T00:00:00Z"), now).unwrap();
        assert_eq!(
            fires,
            vec![
                at("2026-03-27T01:00:00Z"),
                at("2026-03-28T01:00:00Z"),
                at("2026-03-29T01:00:00Z"),
                at("2026-03-30T00:00:00Z")
            ],
            "local 02:00, which on 29 March (clocks go forward) is 03:00 CEST"
        );
    }

    #[test]
    fn a_backfill_of_the_future_or_of_too_many_fire_times_is_refused_naming_the_limit() {
        let s = schedule(json!({"cron": "* * * * * *"}));
        let now = at("2026-06-01T00:00:00Z");
        let e = s.backfill(at("2026-05-31T00:00:00Z"), at("2026-06-02T00:00:00Z"), now).unwrap_err();
        assert!(e.path == "to" && e.message.contains("future"), "{e}");
        let e = s.backfill(at("2026-05-31T00:00:00Z"), at("2026-05-30T00:00:00Z"), now).unwrap_err();
        assert!(e.message.contains("not after"), "{e}");
        let started = std::time::Instant::now();
        let e = s.backfill(at("2000-01-01T00:00:00Z"), now, now).unwrap_err();
        assert!(e.message.contains("schedule_max_backfill"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "stops at the limit: {:?}", started.elapsed());
        let max = s.backfill(now - chrono::Duration::seconds(MAX_BACKFILL_FIRES as i64), now, now).unwrap();
        assert_eq!(max.len(), MAX_BACKFILL_FIRES, "exactly the limit is allowed");
        // The ends of time: an answer, not a panic.
        let e = s.backfill(DateTime::<Utc>::MIN_UTC, now, now).unwrap_err();
        assert!(e.message.contains("schedule_max_backfill"), "{e}");
        let leap = schedule(json!({"cron": "0 0 29 2 *"})).backfill(DateTime::<Utc>::MIN_UTC, now, now).unwrap();
        assert_eq!((leap[0], leap.len()), (at("0004-02-29T00:00:00Z"), 491), "the cron's years start at 1");
        assert_eq!(BackfillOverlap::parse("buffer_all"), Some(BackfillOverlap::BufferAll));
        assert_eq!(BackfillOverlap::parse("queue"), None);
    }

    #[test]
    fn a_bad_schedule_is_refused_naming_the_field() {
        let base = json!({"id": "s", "workflow": "w", "cron": "* * * * *"});
        for (field, value, path) in [
            ("cron", json!("* * *"), "cron"),
            ("cron", json!("61 * * * *"), "cron"),
            ("timezone", json!("Mars/Olympus"), "timezone"),
            ("catchup_window", json!("30d"), "catchup_window"),
            ("catchup_window", json!("soon"), "catchup_window"),
            ("overlap", json!("queue"), "overlap"),
            ("id", json!("a b"), "id"),
            ("version", json!(0), "version"),
            ("extra", json!(1), "extra"),
        ] {
            let mut spec = base.clone();
            spec[field] = value;
            let e = Schedule::parse(&spec).expect_err(&spec.to_string());
            assert_eq!(e.path, path, "{spec}: {e}");
        }
        assert_eq!(schedule(json!({})).overlap, Overlap::Skip, "the default");
        assert_eq!(schedule(json!({"overlap": "buffer_one"})).overlap, Overlap::BufferOne);
    }

    #[test]
    fn a_cron_that_never_fires_is_refused_naming_it() {
        let now = at("2026-12-01T04:00:00Z");
        for cron in ["0 0 30 2 *", "0 0 31 2,4,6,9,11 *", "0 0 0 31 4 *"] {
            let s = schedule(json!({"cron": cron}));
            let started = std::time::Instant::now();
            let e = s.first_fire(now).expect_err(cron);
            // Not a speed check: a guard against a search without end. The
            // bound is wide because a loaded CI machine once took over 5 s.
            assert!(started.elapsed() < Duration::from_secs(60), "{cron}: {:?}", started.elapsed());
            assert_eq!(e.path, "cron");
            assert!(e.message.contains(cron) && e.message.contains("never fires"), "{e}");
        }
        let leap = schedule(json!({"cron": "0 0 29 2 *"}));
        assert_eq!(leap.first_fire(now), Ok(at("2028-02-29T00:00:00Z")));
        assert_eq!(leap.first_fire(at("2097-03-01T00:00:00Z")), Ok(at("2104-02-29T00:00:00Z")), "2100 is no leap year");
    }

    fn days_in(month: u32) -> u32 {
        match month {
            2 => 29,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// A cron of days and months is accepted exactly when one of its
        /// days exists in one of its months (29 February included), at any
        /// time, and its first fire time is then within the bound.
        #[test]
        fn a_cron_is_accepted_exactly_when_it_names_a_real_date(
            days in proptest::collection::btree_set(1u32..=31, 1..4),
            months in proptest::collection::btree_set(1u32..=12, 1..3),
            minute in 0u32..60,
            hour in 0u32..24,
            now in 946_684_800i64..13_569_465_600, // 2000 to 2400
        ) {
            let list = |set: &std::collections::BTreeSet<u32>| set.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let cron = format!("{minute} {hour} {} {} *", list(&days), list(&months));
            let now = DateTime::from_timestamp(now, 0).unwrap();
            let real = months.iter().any(|m| days.iter().any(|d| *d <= days_in(*m)));
            let first = schedule(json!({"cron": cron})).first_fire(now);
            proptest::prop_assert_eq!(first.is_ok(), real, "{} at {}: {:?}", cron, now, first);
            if let Ok(next) = first {
                proptest::prop_assert!(next > now && next - now <= MAX_FIRE_WAIT);
            }
        }
    }
}
