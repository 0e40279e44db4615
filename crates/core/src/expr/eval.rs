//! Evaluating an [`Expr`] in a [`Sandbox`], under its budget, over a
//! [`Scope`]: its input converted once for many expressions.

use std::cell::Cell;
use std::fmt;

use jaq_core::{Ctx, Vars};
use serde_json::Value;

use super::compile::Expr;
use super::guard::{self, Exceeded, Limits, PATH_OUTPUT};
use super::sandbox::Sandbox;
use super::value::{self, Lookup, Sandboxed};

impl Expr {
    /// The expression's first output for `input`; an error names the
    /// expression and what went wrong, and never panics.
    pub fn eval(&self, sb: &Sandbox, input: &Value) -> Result<Value, String> {
        self.eval_in(sb, &Scope::new(input)?)
    }

    /// Like [`Expr::eval`], on an input converted once for many expressions.
    pub fn eval_in(&self, sb: &Sandbox, scope: &Scope) -> Result<Value, String> {
        self.eval_limited(sb, scope, Limits::DEFAULT)
    }

    /// Evaluates under `limits`: whatever the expression does, this returns
    /// within the time limit, with its first output or an error.
    pub fn eval_limited(&self, sb: &Sandbox, scope: &Scope, limits: Limits) -> Result<Value, String> {
        sb.admit(&self.source, self.simple)?;
        if let Some(why) = &scope.1 {
            return Err(format!("{}: {why}", crate::clipped(&self.source, 200)));
        }
        // A path in a value to store ([`with_paths`]) builds nothing: it
        // gives a value the run holds, which may be as large as a value may
        // be (an offloaded one), not what an expression may build. Not
        // inline, where work must stay cheap: past the usual limit it goes
        // to the evaluation threads.
        let path_left = if self.path { PATH_LEFT.with(Cell::get) } else { None };
        let inline = guard::inline_running();
        let limits = match path_left {
            Some(left) if !inline => limits.reading_a_path(left),
            _ => limits,
        };
        let Some(linked) = self.linked.get() else {
            return Err(format!("{}: expression was never compiled", self.source));
        };
        let result = guard::run(limits, || {
            let vars = match linked.index {
                Some(i) => Vars::new([value::Value::from(i)]),
                None => Vars::new([]),
            };
            let ctx = Ctx::<Sandboxed>::new(Lookup(&linked.filter.lut), vars);
            let mut out = linked.filter.id.run((ctx, scope.0.clone()));
            match out.next() {
                Some(Ok(v)) => match to_json(&v.inner, limits) {
                    Ok((value, written)) => {
                        if let (Some(left), false) = (path_left, inline) {
                            PATH_LEFT.with(|c| c.set(Some(left.saturating_sub(written))));
                        }
                        Ok(value)
                    }
                    Err(Json::Output) if path_left.is_some() && inline => {
                        std::panic::resume_unwind(Box::new(Exceeded::Inline))
                    }
                    Err(Json::Output) => Err(Exceeded::Output(limits.output).to_string()),
                    Err(Json::Other(e)) => Err(e),
                },
                Some(Err(e)) => match e.get_err() {
                    Ok(e) => Err(value::describe(&e)),
                    Err(_) => Err("stopped outside of a label".to_string()),
                },
                None => Err("produced no value".to_string()),
            }
        });
        result.map_err(|e| format!("{}: {e}", crate::clipped(&self.source, 200)))
    }

    /// Evaluates a condition, which must yield a boolean.
    pub fn eval_bool(&self, sb: &Sandbox, input: &Value) -> Result<bool, String> {
        self.eval_bool_in(sb, &Scope::new(input)?)
    }

    pub fn eval_bool_in(&self, sb: &Sandbox, scope: &Scope) -> Result<bool, String> {
        match self.eval_in(sb, scope)? {
            Value::Bool(b) => Ok(b),
            other => {
                Err(format!("{}: must yield a boolean, got {}", self.source, crate::clipped(&other.to_string(), 200)))
            }
        }
    }
}

/// Why a result is not JSON to keep.
enum Json {
    /// Over the output limit.
    Output,
    Other(String),
}

/// A result as JSON, and the bytes of its text: no bigger than the byte
/// limit and no deeper than the depth limit, so that it can be stored and
/// read back.
fn to_json(v: &jaq_json::Val, limits: Limits) -> Result<(Value, usize), Json> {
    use fmt::Write;
    let mut text = value::Capped { out: String::new(), limit: limits.output };
    if write!(text, "{v}").is_err() {
        return Err(Json::Output);
    }
    let written = text.out.len();
    let value = serde_json::from_str(&text.out).map_err(|e| {
        Json::Other(if e.to_string().contains("recursion limit") {
            Exceeded::Depth(limits.depth).to_string()
        } else {
            let cut: String = text.out.chars().take(200).collect();
            format!("result {cut} is not JSON")
        })
    })?;
    Ok((value, written))
}

thread_local! {
    /// Bytes the paths of the value being evaluated to be stored may still
    /// give ([`with_paths`]); none: a path is held to the limits of any
    /// expression (a condition, a key, a message, a MAP's items).
    static PATH_LEFT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `f`, the evaluation of a value to store (a step's input, a
/// TRANSFORM's output, a child's input, the run's output), with its paths
/// ([`is_path`](super::is_path)) allowed to give up to [`PATH_OUTPUT`]
/// bytes in all, past what an expression may build.
pub(super) fn with_paths<T>(f: impl FnOnce() -> T) -> T {
    with_paths_up_to(PATH_OUTPUT, f)
}

/// [`with_paths`] with another budget than [`PATH_OUTPUT`].
pub(super) fn with_paths_up_to<T>(budget: usize, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PATH_LEFT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(PATH_LEFT.with(|c| c.replace(Some(budget))));
    f()
}

/// An expression input converted to jaq's values once, so that many
/// expressions can read it without converting it again (cheap to clone).
#[derive(Clone)]
pub struct Scope(value::Value, Option<std::sync::Arc<str>>);

/// A JSON value given by parts, for [`Scope::of`].
pub enum Part<'a> {
    Value(&'a Value),
    Owned(Value),
    /// An object's fields in any order; a key given twice keeps its last.
    Object(Vec<(&'a str, Part<'a>)>),
}

/// `part` as the expression engine's value, as a JSON value converts: an
/// object's keys in the order serde_json keeps them (sorted).
fn convert(part: Part<'_>) -> Result<jaq_json::Val, String> {
    use serde::Deserialize;
    let leaf = |v: &Value| jaq_json::Val::deserialize(v).map_err(|e| format!("expression input is not JSON: {e}"));
    match part {
        Part::Value(v) => leaf(v),
        Part::Owned(v) => leaf(&v),
        Part::Object(fields) => {
            let sorted: std::collections::BTreeMap<&str, Part<'_>> = fields.into_iter().collect();
            let mut map = jaq_json::Map::default();
            for (key, part) in sorted {
                map.insert(jaq_json::Val::from(key.to_string()), convert(part)?);
            }
            Ok(jaq_json::Val::obj(map))
        }
    }
}

impl Scope {
    pub fn new(input: &Value) -> Result<Scope, String> {
        // Read from the value in place, not from a copy of it: a run's
        // context may hold large values.
        <jaq_json::Val as serde::Deserialize>::deserialize(input)
            .map(|v| Scope(value::Value::wrap(v), None))
            .map_err(|e| format!("expression input is not JSON: {e}"))
    }

    /// The scope of an object given by its parts ([`Part`]), each value
    /// converted where it is, not copied into one JSON value first: the
    /// same scope as [`Scope::new`] of that object.
    pub fn of(object: Part<'_>) -> Result<Scope, String> {
        convert(object).map(|v| Scope(value::Value::wrap(v), None))
    }

    /// A scope no expression may be evaluated in, for `why`: every
    /// evaluation in it is that error (the values it would hold are more
    /// than a scope may convert, say).
    pub fn refused(why: String) -> Scope {
        Scope(value::Value::default(), Some(why.into()))
    }

    /// `null`, for inputs that could not be converted.
    pub fn null() -> Scope {
        Scope(value::Value::default(), None)
    }

    /// This scope (an object) with more top-level keys bound (a LOOP's
    /// `.iteration` and `.previous`), the rest shared.
    pub fn with(&self, fields: &[(&'static str, &Value)]) -> Result<Scope, String> {
        let mut bound = Vec::with_capacity(fields.len());
        for (name, value) in fields {
            let v = serde_json::from_value((*value).clone()).map_err(|e| format!("{name} is not JSON: {e}"))?;
            bound.push((*name, v));
        }
        Ok(Scope(self.0.with_fields(bound), self.1.clone()))
    }

    /// This scope (an object) with `.item` and `.index` bound, for one item
    /// of a MAP. The rest is shared, not converted again, so binding costs
    /// the item's size, not the run's.
    pub fn with_item(&self, item: &Value, index: usize) -> Result<Scope, String> {
        let item =
            <jaq_json::Val as serde::Deserialize>::deserialize(item).map_err(|e| format!("item is not JSON: {e}"))?;
        Ok(Scope(self.0.with_fields([("item", item), ("index", jaq_json::Val::from(index))]), self.1.clone()))
    }
}
