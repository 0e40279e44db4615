//! What the server checks that JSON Schema can say, written into the
//! schemas of the OpenAPI document and of the definition JSON Schema alike
//! from the server's own constants (`apply`), so a bound cannot drift from
//! the check: a node's most limits, a rate's count and period, a webhook's
//! tolerance, a schedule's catch-up window, a positive timeout, a cron that
//! is not blank, and a `burst` only with a `rate`.
//!
//! A bounded duration is said in one unit (`90m`, not `1h30m`, which the
//! server also takes): a sum's total is no regular language. A count or a
//! duration written with a leading `+` or blanks around it is the other
//! text the server takes and the schema refuses.

use std::time::Duration;

use serde_json::{json, Value};
use utoipa::openapi::schema::{Object, Schema};
use utoipa::openapi::RefOr;

use composer_core::definition::limit::{MAX_LIMIT_CONCURRENCY, MAX_LIMIT_PERIOD, MAX_LIMIT_RATE, MAX_NODE_LIMITS};
use composer_core::schedule::MAX_CATCHUP_WINDOW;

use crate::rest::webhooks::MAX_WEBHOOK_TOLERANCE;

/// What a rule says of a property.
#[derive(Debug, Clone, PartialEq)]
pub enum Say {
    /// A string's pattern (it replaces the attribute's).
    Pattern(String),
    /// An array's most items.
    MaxItems(usize),
    /// A number's least and most.
    Range(u32, u32),
}

/// A duration the server reads with `duration::parse`: whole numbers with
/// units, summed (zero included).
pub const DURATION: &str = "^([0-9]+(ms|s|m|h|d))+$";
/// A duration more than zero: one of its terms is not.
pub const POSITIVE_DURATION: &str = "^([0-9]+(ms|s|m|h|d))*0*[1-9][0-9]*(ms|s|m|h|d)([0-9]+(ms|s|m|h|d))*$";
/// Text with a character other than a blank, and no NUL.
pub const NOT_BLANK: &str = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$";

/// The rules, by schema and property.
pub fn rules() -> Vec<(&'static str, &'static str, Say)> {
    let rate = Say::Pattern(rate_pattern());
    let burst = Say::Range(1, MAX_LIMIT_RATE);
    let concurrency = Say::Range(1, MAX_LIMIT_CONCURRENCY);
    vec![
        ("NodeSpec", "limits", Say::MaxItems(MAX_NODE_LIMITS)),
        ("LimitSpec", "rate", rate.clone()),
        ("LimitSpec", "burst", burst.clone()),
        ("LimitSpec", "concurrency", concurrency.clone()),
        ("LimitValuesSpec", "rate", rate),
        ("LimitValuesSpec", "burst", burst),
        ("LimitValuesSpec", "concurrency", concurrency),
        ("WorkflowSpec", "timeout", Say::Pattern(POSITIVE_DURATION.into())),
        ("NodeSpec", "timeout", Say::Pattern(POSITIVE_DURATION.into())),
        ("RetrySpec", "initial_backoff", Say::Pattern(DURATION.into())),
        ("RetrySpec", "max_backoff", Say::Pattern(DURATION.into())),
        ("ScheduleSpec", "cron", Say::Pattern(NOT_BLANK.into())),
        ("ScheduleSpec", "catchup_window", Say::Pattern(duration_up_to(MAX_CATCHUP_WINDOW, true))),
        ("WebhookSpec", "tolerance", Say::Pattern(duration_up_to(MAX_WEBHOOK_TOLERANCE, false))),
    ]
}

/// `dependentSchemas` by schema: a `burst` (not null) only with a `rate`
/// (not null), which `LimitValues::parse` checks.
pub fn dependent_schemas(schema: &str) -> Option<Value> {
    match schema {
        "LimitSpec" | "LimitValuesSpec" => Some(json!({"burst": {"anyOf": [
            {"properties": {"burst": {"type": "null"}}},
            {"required": ["rate"], "properties": {"rate": {"type": "string"}}},
        ]}})),
        _ => None,
    }
}

/// `N/period`: a count from 1 to `MAX_LIMIT_RATE` over a period from 1 ms
/// to `MAX_LIMIT_PERIOD` (`definition::limit`'s `parse_rate`).
pub fn rate_pattern() -> String {
    let period = duration_up_to(MAX_LIMIT_PERIOD, false);
    format!("^0*{}/{}", up_to(u64::from(MAX_LIMIT_RATE)), &period[1..])
}

/// A duration in one unit, at most `max` (and more than zero unless
/// `zero`), leading zeros allowed.
pub fn duration_up_to(max: Duration, zero: bool) -> String {
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    let mut terms: Vec<String> = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
        .into_iter()
        .filter(|(_, size)| ms / size >= 1)
        .map(|(unit, size)| format!("0*{}{unit}", up_to(ms / size)))
        .collect();
    if zero {
        terms.push("0+(ms|s|m|h|d)".into());
    }
    format!("^({})$", terms.join("|"))
}

/// The decimal numbers from 1 to `n` (n ≥ 1), without leading zeros, as an
/// alternation in parentheses.
pub fn up_to(n: u64) -> String {
    let digits: Vec<u8> = n.to_string().bytes().map(|b| b - b'0').collect();
    let len = digits.len();
    let mut alts = Vec::new();
    if len > 1 {
        // Every number with fewer digits.
        alts.push(if len == 2 { "[1-9]".to_string() } else { format!("[1-9][0-9]{{0,{}}}", len - 2) });
    }
    for (i, &top) in digits.iter().enumerate() {
        let low = u8::from(i == 0);
        if top > low {
            let prefix: String = digits[..i].iter().map(|d| char::from(b'0' + d)).collect();
            let class = if top - 1 == low { low.to_string() } else { format!("[{low}-{}]", top - 1) };
            let rest = match len - i - 1 {
                0 => String::new(),
                1 => "[0-9]".into(),
                k => format!("[0-9]{{{k}}}"),
            };
            alts.push(format!("{prefix}{class}{rest}"));
        }
    }
    alts.push(n.to_string());
    format!("({})", alts.join("|"))
}

/// Writes the rules of schema `name` into it; answers how many it wrote
/// (a test holds every rule to a property that exists).
pub fn apply(name: &str, schema: &mut RefOr<Schema>) -> usize {
    let RefOr::T(Schema::Object(object)) = schema else { return 0 };
    let mut written = 0;
    for (_, property, say) in rules().into_iter().filter(|(s, _, _)| *s == name) {
        if let Some(RefOr::T(target)) = object.properties.get_mut(property) {
            written += usize::from(say_in(target, &say));
        }
    }
    if let Some(dependent) = dependent_schemas(name) {
        object.extensions.get_or_insert_with(Default::default).insert("dependentSchemas".into(), dependent);
        written += 1;
    }
    written
}

fn say_in(target: &mut Schema, say: &Say) -> bool {
    match (target, say) {
        (Schema::Array(array), Say::MaxItems(n)) => {
            array.max_items = Some(*n);
            true
        }
        (Schema::Object(o), Say::Pattern(p)) => {
            o.pattern = Some(p.clone());
            true
        }
        (Schema::Object(o), Say::Range(low, high)) => range(o, *low, *high),
        _ => false,
    }
}

fn range(o: &mut Object, low: u32, high: u32) -> bool {
    o.minimum = Some(low.into());
    o.maximum = Some(high.into());
    true
}

#[cfg(test)]
mod tests {
    use composer_core::definition::limit::{compile_limits, LimitSpec, LimitValues, LimitValuesSpec};
    use composer_core::schedule::Schedule;
    use serde_json::json;

    use super::*;

    fn re(pattern: &str) -> regex::Regex {
        regex::Regex::new(pattern).unwrap()
    }

    #[test]
    fn up_to_matches_exactly_the_numbers_from_one_to_n() {
        for n in [1u64, 7, 9, 10, 24, 60, 99, 100, 1440, 3600, 86_400, 1_000_000, 3_600_000, 86_400_000] {
            let r = re(&format!("^{}$", up_to(n)));
            let mut samples: Vec<u64> = (0..=n.min(2_000) + 1).collect();
            samples.extend([n - 1, n, n + 1, n * 10, n / 2 + 1, 10u64.pow(n.to_string().len() as u32 - 1)]);
            for k in samples {
                assert_eq!(r.is_match(&k.to_string()), (1..=n).contains(&k), "{n}: {k}");
            }
            assert!(!r.is_match(&format!("0{n}")), "no leading zero: {n}");
        }
    }

    fn rate_ok(rate: &str) -> bool {
        let spec = LimitValuesSpec { rate: Some(rate.into()), ..Default::default() };
        LimitValues::parse("", &spec).is_ok()
    }

    /// The schema's rate refuses what `parse_rate` refuses, at each bound:
    /// a count of 0 or over the most, a period of 0 or over a day in any unit.
    #[test]
    fn a_rate_s_pattern_is_the_server_s_rule_at_its_bounds() {
        let r = re(&rate_pattern());
        let max = MAX_LIMIT_RATE;
        let day = MAX_LIMIT_PERIOD.as_millis();
        for text in [
            "1/1ms".to_string(),
            "0/1s".into(),
            "00/1s".into(),
            "007/1s".into(),
            format!("{max}/1s"),
            format!("{}/1s", max + 1),
            "1/0s".into(),
            "1/0ms".into(),
            format!("1/{day}ms"),
            format!("1/{}ms", day + 1),
            "1/86400s".into(),
            "1/86401s".into(),
            "1/1440m".into(),
            "1/1441m".into(),
            "1/24h".into(),
            "1/25h".into(),
            "1/1d".into(),
            "1/2d".into(),
            "1/01d".into(),
            "25/1s".into(),
            "1/".into(),
            "/1s".into(),
            "1/1".into(),
            "1/1x".into(),
            "".into(),
            "1/1s/1s".into(),
        ] {
            assert_eq!(r.is_match(&text), rate_ok(&text), "{text:?}");
        }
        // What the server also takes and the schema does not say.
        for text in ["1/1h30m", " 5/1s", "5/ 1s", "+5/1s"] {
            assert!(rate_ok(text) && !r.is_match(text), "{text:?}");
        }
    }

    fn limits(n: usize) -> Vec<LimitSpec> {
        serde_json::from_value((0..n).map(|i| json!({"key": format!("k{i}")})).collect()).unwrap()
    }

    /// A node may have `MAX_NODE_LIMITS` limits, not one more, in the
    /// schema as at the server; a burst needs a rate in both.
    #[test]
    fn a_node_s_limits_and_a_burst_are_bounded_in_the_schema_as_at_the_server() {
        assert!(compile_limits("n", &limits(MAX_NODE_LIMITS)).is_ok());
        assert!(compile_limits("n", &limits(MAX_NODE_LIMITS + 1)).is_err());
        let defs = &crate::definition_schema::workflow()["$defs"];
        assert_eq!(defs["NodeSpec"]["properties"]["limits"]["maxItems"], json!(MAX_NODE_LIMITS));
        assert_eq!(defs["ItemNode"]["properties"]["limits"]["maxItems"], json!(MAX_NODE_LIMITS));
        let mut values = <LimitValuesSpec as utoipa::PartialSchema>::schema();
        apply("LimitValuesSpec", &mut values);
        let values = serde_json::to_value(values).unwrap();
        for (def, d) in [("LimitSpec", &defs["LimitSpec"]), ("LimitValuesSpec", &values)] {
            assert_eq!(d["properties"]["rate"]["pattern"], json!(rate_pattern()), "{def}");
            assert_eq!(d["properties"]["burst"]["maximum"], json!(MAX_LIMIT_RATE), "{def}");
            assert_eq!(d["properties"]["concurrency"]["maximum"], json!(MAX_LIMIT_CONCURRENCY), "{def}");
            assert_eq!(d["dependentSchemas"], dependent_schemas(def).unwrap(), "{def}");
        }
        let parse = |v: serde_json::Value| LimitValues::parse("", &serde_json::from_value(v).unwrap()).is_ok();
        // The dependent schema's two ways: no burst (or null), or a rate that is text.
        assert!(parse(json!({"burst": null})) && parse(json!({"burst": 3, "rate": "1/1s"})));
        assert!(!parse(json!({"burst": 3})) && !parse(json!({"burst": 3, "rate": null})));
    }

    fn positive(text: &str) -> bool {
        composer_core::duration::parse(text).is_ok_and(|d| !d.is_zero())
    }

    #[test]
    fn durations_patterns_are_the_server_s_grammar() {
        let any = re(DURATION);
        let more_than_zero = re(POSITIVE_DURATION);
        for text in ["", "0s", "0ms0s", "1ms", "1h30m", "00h0m1s", "30", "1x", "s", "1m0s", "2d", "0d1ms", "1s1"] {
            assert_eq!(any.is_match(text), composer_core::duration::parse(text).is_ok(), "{text:?}");
            assert_eq!(more_than_zero.is_match(text), positive(text), "{text:?}");
        }
        // Over ten years, the bound of every duration: a rule the schema leaves to the server.
        assert!(more_than_zero.is_match("3651d") && !positive("3651d"));
        // Blanks around it, which the server trims: the schema does not say them.
        assert!(positive(" 1s ") && !any.is_match(" 1s "));
    }

    fn catchup_ok(window: &str) -> bool {
        Schedule::parse(&json!({"id": "s", "workflow": "w", "cron": "* * * * *", "catchup_window": window})).is_ok()
    }

    #[test]
    fn a_catch_up_window_and_a_cron_are_bounded_in_the_schema_as_at_the_server() {
        let r = re(&duration_up_to(MAX_CATCHUP_WINDOW, true));
        for text in ["0s", "0ms", "1ms", "7d", "8d", "168h", "169h", "10080m", "10081m", "604800s", "604801s", "1w"] {
            assert_eq!(r.is_match(text), catchup_ok(text), "{text:?}");
        }
        let blank = re(NOT_BLANK);
        for cron in ["", " ", "\t", "* * * * *"] {
            let ok = Schedule::parse(&json!({"id": "s", "workflow": "w", "cron": cron})).is_ok();
            assert_eq!(blank.is_match(cron), ok, "{cron:?}");
        }
    }

    /// Every rule names a property its schema has: each is written.
    #[test]
    fn every_rule_is_written_into_its_schema() {
        use utoipa::{PartialSchema, ToSchema};
        let mut schemas = Vec::new();
        <composer_core::definition::WorkflowSpec as ToSchema>::schemas(&mut schemas);
        schemas.push(("WorkflowSpec".into(), composer_core::definition::WorkflowSpec::schema()));
        schemas.push(("LimitValuesSpec".into(), LimitValuesSpec::schema()));
        schemas.push(("ScheduleSpec".into(), composer_core::schedule::ScheduleSpec::schema()));
        schemas.push(("WebhookSpec".into(), crate::WebhookSpec::schema()));
        let mut written = 0;
        for (name, mut schema) in schemas {
            written += apply(&name, &mut schema);
        }
        let dependent = ["LimitSpec", "LimitValuesSpec"].iter().filter(|s| dependent_schemas(s).is_some()).count();
        assert_eq!(written, rules().len() + dependent);
    }
}
