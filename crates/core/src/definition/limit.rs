//! Limits on steps across runs: a node's `limits`, each a key (an
//! expression) with a rate (a token bucket: `"25/1s"`, `burst`) or a
//! concurrency (steps in flight at once), or neither — a named limit whose
//! values are set at run time (`PUT /v1/limits/{key}`).
//!
//! The values here are only what a definition says; which step may go is
//! decided by the coordinators' limiter, over every run, item and
//! coordinator, under the key's stored state.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check::{check_path_segment, ValidationError};
use crate::expr::{Sandbox, Scope, Template};

/// Most limits one node may declare (`max_node_limits`).
pub const MAX_NODE_LIMITS: usize = 4;
/// Longest limit key, in bytes, as written and as evaluated (`max_limit_key`).
pub const MAX_LIMIT_KEY: usize = 256;
/// Most steps a rate may let through in one period, and largest burst
/// (`max_limit_rate`).
pub const MAX_LIMIT_RATE: u32 = 1_000_000;
/// Longest period of a rate (`max_limit_period`): a day.
pub const MAX_LIMIT_PERIOD: Duration = Duration::from_secs(86_400);
/// Most steps a concurrency limit may let run at once (`max_limit_concurrency`).
pub const MAX_LIMIT_CONCURRENCY: u32 = 100_000;
/// The longest a target's `Retry-After` holds a step and its keys
/// (`max_retry_after`): a longer one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3_600);

/// A limit as written, in a definition or a `PUT /v1/limits/{key}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitValuesSpec {
    /// Steps per period, as `"N/period"` (`"25/1s"`, `"1000/1h"`): a token
    /// bucket that refills N tokens each period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9]+/[0-9a-z]+$", example = "25/1s"))]
    pub rate: Option<String>,
    /// The most tokens the bucket holds, so the most steps that may go at
    /// once after a quiet spell (the rate's N by default).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000))]
    pub burst: Option<u32>,
    /// Steps of the key in flight at once, across runs.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub concurrency: Option<u32>,
}

/// One of a node's `limits` as written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// What the limit is per: text with `${ … }` expressions over the
    /// step's scope (`"stripe:${ .input.account }"`), never `.secrets`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^([^.\\u0000]|\\.[^.\\u0000]|\\.\\.[^\\u0000])[^\\u0000]*$",
            example = "stripe:${ .input.account }"
        )
    )]
    pub key: String,
    /// As in [`LimitValuesSpec`]: its fields again, since serde cannot
    /// refuse unknown fields through a flattened struct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9]+/[0-9a-z]+$", example = "25/1s"))]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000))]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub concurrency: Option<u32>,
}

impl LimitSpec {
    pub fn values(&self) -> LimitValuesSpec {
        LimitValuesSpec { rate: self.rate.clone(), burst: self.burst, concurrency: self.concurrency }
    }
}

/// A token bucket: `count` tokens every `per`, holding at most `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
    pub burst: u32,
}

impl Rate {
    /// Tokens added each second.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.per.as_secs_f64()
    }

    /// The rate as written (`25/1s`).
    pub fn text(&self) -> String {
        format!("{}/{}", self.count, crate::duration::format(self.per))
    }
}

/// What a limit allows; neither part for a named limit whose values are
/// set at run time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitValues {
    pub rate: Option<Rate>,
    pub concurrency: Option<u32>,
}

impl LimitValues {
    /// Checks values as written; `at` names them in an error.
    pub fn parse(at: &str, spec: &LimitValuesSpec) -> Result<LimitValues, ValidationError> {
        let rate = match &spec.rate {
            None => {
                if spec.burst.is_some() {
                    return Err(ValidationError::new(
                        format!("{at}.burst"),
                        "is the size of a rate's bucket: set rate",
                    ));
                }
                None
            }
            Some(text) => {
                let (count, per) = parse_rate(text).map_err(|m| ValidationError::new(format!("{at}.rate"), m))?;
                let burst = spec.burst.unwrap_or(count);
                if !(1..=MAX_LIMIT_RATE).contains(&burst) {
                    return Err(ValidationError::new(
                        format!("{at}.burst"),
                        format!("must be a whole number from 1 to {MAX_LIMIT_RATE}"),
                    ));
                }
                Some(Rate { count, per, burst })
            }
        };
        if let Some(c) = spec.concurrency {
            if !(1..=MAX_LIMIT_CONCURRENCY).contains(&c) {
                return Err(ValidationError::new(
                    format!("{at}.concurrency"),
                    format!("must be a whole number from 1 to {MAX_LIMIT_CONCURRENCY}"),
                ));
            }
        }
        Ok(LimitValues { rate, concurrency: spec.concurrency })
    }

    pub fn is_named(&self) -> bool {
        self.rate.is_none() && self.concurrency.is_none()
    }
}

/// `N/period`: a whole number of steps from 1 to [`MAX_LIMIT_RATE`] over a
/// period from 1 ms to [`MAX_LIMIT_PERIOD`].
fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let (count, per) = text.split_once('/').ok_or("must be N/period, as 25/1s or 1000/1h")?;
    let count: u32 = count
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=MAX_LIMIT_RATE).contains(n))
        .ok_or_else(|| format!("{count:?}: the count must be a whole number from 1 to {MAX_LIMIT_RATE}"))?;
    let per = crate::duration::parse(per)?;
    if per.is_zero() || per > MAX_LIMIT_PERIOD {
        return Err("the period must be from 1ms to 1d".into());
    }
    Ok((count, per))
}

/// One of a node's limits, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLimit {
    pub key: Template,
    pub values: LimitValues,
}

impl StepLimit {
    /// The key of a step in `scope`: text, at most [`MAX_LIMIT_KEY`] bytes.
    pub fn key_in(&self, sb: &Sandbox, scope: Option<&Scope>) -> Result<String, String> {
        match self.key.eval_in(sb, scope)? {
            Value::String(s) if s.is_empty() => Err("is empty".into()),
            Value::String(s) if s.len() > MAX_LIMIT_KEY => Err(format!("is longer than {MAX_LIMIT_KEY} bytes")),
            Value::String(s) if s.contains('\0') => Err("holds a NUL character".into()),
            Value::String(s) => check_path_segment(&s).map(|()| s),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(format!("must be text or a number, got {}", crate::clipped(&other.to_string(), 200))),
        }
    }
}

/// The keys of `limits` in `scope`, in order; an error names the limit.
pub fn keys_in(sb: &Sandbox, limits: &[StepLimit], scope: Option<&Scope>) -> Result<Vec<String>, String> {
    limits.iter().enumerate().map(|(i, l)| l.key_in(sb, scope).map_err(|e| format!("limits[{i}].key: {e}"))).collect()
}

/// Compiles a node's `limits` (`at` is the node's path).
pub fn compile_limits(at: &str, specs: &[LimitSpec]) -> Result<Vec<StepLimit>, ValidationError> {
    if specs.len() > MAX_NODE_LIMITS {
        return Err(ValidationError::new(
            format!("{at}.limits"),
            format!("{} limits, more than {MAX_NODE_LIMITS} (max_node_limits)", specs.len()),
        ));
    }
    let mut limits: Vec<StepLimit> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let here = format!("{at}.limits[{i}]");
        let key_at = format!("{here}.key");
        if spec.key.trim().is_empty() {
            return Err(ValidationError::new(key_at, "must not be empty"));
        }
        if spec.key.len() > MAX_LIMIT_KEY || spec.key.contains('\0') {
            return Err(ValidationError::new(key_at, format!("must be at most {MAX_LIMIT_KEY} bytes, without NUL")));
        }
        check_path_segment(&spec.key).map_err(|m| ValidationError::new(&key_at, m))?;
        if spec.key.contains(".secrets") {
            return Err(ValidationError::new(key_at, "is stored and shown: it cannot read .secrets"));
        }
        let key =
            Template::compile(&Value::String(spec.key.clone())).map_err(|(_, m)| ValidationError::new(&key_at, m))?;
        if let Template::Literal(Value::String(k)) = &key {
            if limits.iter().any(|l| matches!(&l.key, Template::Literal(Value::String(o)) if o == k)) {
                return Err(ValidationError::new(key_at, format!("{k:?} is named twice")));
            }
        }
        let values = LimitValues::parse(&here, &spec.values())?;
        limits.push(StepLimit { key, values });
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sb() -> crate::expr::Sandbox {
        crate::expr::Sandbox::for_tests()
    }

    fn spec(v: Value) -> Vec<LimitSpec> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_rate_is_a_count_over_a_period_with_a_burst_that_defaults_to_the_count() {
        let l = compile_limits("nodes[0]", &spec(json!([{"key": "stripe", "rate": "25/1s"}]))).unwrap();
        assert_eq!(l[0].values.rate, Some(Rate { count: 25, per: Duration::from_secs(1), burst: 25 }));
        let l = compile_limits("n", &spec(json!([{"key": "s", "rate": "1000/1h", "burst": 50}]))).unwrap();
        let rate = l[0].values.rate.unwrap();
        assert_eq!((rate.burst, rate.text()), (50, "1000/1h".to_string()));
        assert!((rate.per_second() - 1000.0 / 3600.0).abs() < 1e-9);
        let l = compile_limits("n", &spec(json!([{"key": "crm", "concurrency": 4}, {"key": "named"}]))).unwrap();
        assert_eq!(l[0].values, LimitValues { rate: None, concurrency: Some(4) });
        assert!(l[1].values.is_named());
    }

    #[test]
    fn a_bad_limit_names_its_field() {
        for (limits, field) in [
            (json!([{"key": ""}]), "nodes[0].limits[0].key"),
            (json!([{"key": "${ .secrets.k }"}]), "nodes[0].limits[0].key"),
            (json!([{"key": "${ .input | }"}]), "nodes[0].limits[0].key"),
            (json!([{"key": "a"}, {"key": "a"}]), "nodes[0].limits[1].key"),
            (json!([{"key": "k", "rate": "0/1s"}]), "nodes[0].limits[0].rate"),
            (json!([{"key": "k", "rate": "5"}]), "nodes[0].limits[0].rate"),
            (json!([{"key": "k", "rate": "5/0s"}]), "nodes[0].limits[0].rate"),
            (json!([{"key": "k", "rate": "5/2d"}]), "nodes[0].limits[0].rate"),
            (json!([{"key": "k", "rate": "2000000/1s"}]), "nodes[0].limits[0].rate"),
            (json!([{"key": "k", "burst": 3}]), "nodes[0].limits[0].burst"),
            (json!([{"key": "k", "rate": "1/1s", "burst": 0}]), "nodes[0].limits[0].burst"),
            (json!([{"key": "k", "concurrency": 0}]), "nodes[0].limits[0].concurrency"),
            (json!([{"key": "a"}, {"key": "b"}, {"key": "c"}, {"key": "d"}, {"key": "e"}]), "nodes[0].limits"),
            (json!([{"key": "x".repeat(MAX_LIMIT_KEY + 1)}]), "nodes[0].limits[0].key"),
        ] {
            let e = compile_limits("nodes[0]", &spec(limits.clone())).unwrap_err();
            assert_eq!(e.path, field, "{limits}: {e}");
        }
        assert!(serde_json::from_value::<Vec<LimitSpec>>(json!([{"key": "k", "rat": "1/1s"}])).is_err());
    }

    #[test]
    fn a_key_is_text_or_a_number_within_its_length() {
        let limit = |k: &str| compile_limits("n", &spec(json!([{"key": k}]))).unwrap().remove(0);
        let scope = Scope::new(&json!({"input": {"a": "acct_1", "n": 7, "o": {}, "long": "y".repeat(300)}})).unwrap();
        assert_eq!(limit("stripe:${ .input.a }").key_in(&sb(), Some(&scope)), Ok("stripe:acct_1".into()));
        assert_eq!(limit("${ .input.n }").key_in(&sb(), Some(&scope)), Ok("7".into()));
        assert!(limit("${ .input.o }").key_in(&sb(), Some(&scope)).unwrap_err().contains("text or a number"));
        assert!(limit("${ .input.long }").key_in(&sb(), Some(&scope)).unwrap_err().contains("longer than"));
        assert!(limit("${ .input.missing // \"\" }").key_in(&sb(), Some(&scope)).unwrap_err().contains("empty"));
    }

    /// `PUT /v1/limits/{key}` could not reach a key `.` or `..`, as written
    /// or as evaluated; `a.b` can.
    #[test]
    fn limit_keys_a_url_cannot_carry_are_refused_as_written_and_as_evaluated() {
        let why = "may not be \".\" or \"..\": a URL path cannot carry it";
        for bad in [".", ".."] {
            let e = compile_limits("nodes[a]", &spec(json!([{"key": bad}]))).unwrap_err();
            assert_eq!((e.path.as_str(), e.message.as_str()), ("nodes[a].limits[0].key", why));
            let scope = Scope::new(&json!({"input": {"k": bad}})).unwrap();
            let limits = compile_limits("n", &spec(json!([{"key": "${ .input.k }"}]))).unwrap();
            assert_eq!(keys_in(&sb(), &limits, Some(&scope)), Err(format!("limits[0].key: {why}")));
        }
        let scope = Scope::new(&json!({"input": {"k": "a.b"}})).unwrap();
        let limits = compile_limits("n", &spec(json!([{"key": "a.b"}, {"key": "${ .input.k }.."}]))).unwrap();
        assert_eq!(keys_in(&sb(), &limits, Some(&scope)), Ok(vec!["a.b".to_string(), "a.b..".to_string()]));
    }
}
