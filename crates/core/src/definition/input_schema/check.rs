//! Checking a value against a compiled schema: the first place it does
//! not match, within a budget of steps and a depth.

use std::fmt;

use serde_json::{Map, Number, Value};

use super::tree::{Keywords, Schema, Type, MAX_DEPTH, MAX_STEPS};

/// Why an input does not pass its workflow's `input_schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The value at `at` (a JSON pointer into the input, `""` the whole
    /// input) does not match: `why`.
    At { at: String, why: String },
    /// The check ran into a limit before it could say.
    Limit(String),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::At { at, why } if at.is_empty() => write!(f, "the input does not match input_schema: {why}"),
            Mismatch::At { at, why } => write!(f, "the input does not match input_schema at {at}: {why}"),
            Mismatch::Limit(why) => write!(f, "the input could not be checked against input_schema: {why}"),
        }
    }
}

/// One step into the input: a property or an index.
#[derive(Clone, Copy)]
enum Seg<'v> {
    Key(&'v str),
    Index(usize),
}

/// A check under way: its budget, and where in the input it is.
pub(super) struct Checker<'s, 'v> {
    targets: &'s [Schema],
    steps: u64,
    depth: usize,
    path: Vec<Seg<'v>>,
    /// How deep in the branches of `anyOf`, `oneOf`, `not`, `if` and
    /// `contains` the check is: a branch's reason is written only for the
    /// first level's (the one a refusal quotes), so a schema that tries
    /// branch after branch costs steps, not text.
    quiet: u32,
}

/// The `quiet` past which a mismatch's reason is not written.
const QUOTED: u32 = 1;

type Checked = Result<(), Mismatch>;

impl<'s, 'v> Checker<'s, 'v> {
    pub(super) fn new(targets: &'s [Schema]) -> Self {
        Checker { targets, steps: 0, depth: 0, path: Vec::new(), quiet: 0 }
    }

    pub(super) fn run(mut self, root: &'s Schema, input: &'v Value) -> Checked {
        self.schema(root, input)
    }

    /// Spends `n` steps of the budget.
    fn spend(&mut self, n: u64) -> Checked {
        self.steps = self.steps.saturating_add(n);
        if self.steps > MAX_STEPS {
            return Err(Mismatch::Limit(format!(
                "checking it takes more than {MAX_STEPS} steps (INPUT_SCHEMA_MAX_STEPS): simplify the schema or the input"
            )));
        }
        Ok(())
    }

    fn miss(&self, why: impl Into<String>) -> Mismatch {
        if self.quiet > QUOTED {
            return Mismatch::At { at: String::new(), why: String::new() };
        }
        let mut at = String::new();
        for seg in &self.path {
            at.push('/');
            match seg {
                Seg::Key(k) => at.push_str(&k.replace('~', "~0").replace('/', "~1")),
                Seg::Index(i) => at.push_str(&i.to_string()),
            }
        }
        Mismatch::At { at, why: why.into() }
    }

    fn schema(&mut self, s: &'s Schema, v: &'v Value) -> Checked {
        self.spend(1)?;
        match s {
            Schema::Bool(true) => Ok(()),
            Schema::Bool(false) => Err(self.miss("no value is allowed here")),
            Schema::Keywords(k) => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(Mismatch::Limit(format!(
                        "the schema nests more than {MAX_DEPTH} levels deep over this input (INPUT_SCHEMA_MAX_DEPTH): \
                         a $ref that leads back to itself, or an input too deep"
                    )));
                }
                let checked = self.keywords(k, v);
                self.depth -= 1;
                checked
            }
        }
    }

    /// `s` applied to `v` as a branch: `quiet` levels deeper.
    fn branch(&mut self, quiet: u32, s: &'s Schema, v: &'v Value) -> Checked {
        self.quiet += quiet;
        let checked = self.schema(s, v);
        self.quiet -= quiet;
        checked
    }

    /// `s` applied to `v`, which is `seg` of the value being checked.
    fn inside(&mut self, seg: Seg<'v>, s: &'s Schema, v: &'v Value) -> Checked {
        self.path.push(seg);
        let checked = self.schema(s, v);
        self.path.pop();
        checked
    }

    fn keywords(&mut self, k: &'s Keywords, v: &'v Value) -> Checked {
        self.generic(k, v)?;
        match v {
            Value::Number(n) => self.number(k, n)?,
            Value::String(s) => self.string(k, s)?,
            Value::Array(a) => self.array(k, a)?,
            Value::Object(o) => self.object(k, o)?,
            _ => {}
        }
        self.combined(k, v)
    }

    fn generic(&mut self, k: &'s Keywords, v: &'v Value) -> Checked {
        if let Some(types) = &k.types {
            if !types.iter().any(|t| is_type(v, *t)) {
                let want: Vec<&str> = types.iter().map(|t| t.name()).collect();
                return Err(self.miss(format!("expected {}, got {}", want.join(" or "), described(v))));
            }
        }
        if let Some(c) = &k.constant {
            if !self.equal(c, v)? {
                return Err(self.miss(format!("expected {}, got {}", short(c), described(v))));
            }
        }
        if let Some(values) = &k.enumeration {
            let mut found = false;
            for e in values {
                if self.equal(e, v)? {
                    found = true;
                    break;
                }
            }
            if !found {
                let listed: Vec<String> = values.iter().take(8).map(short).collect();
                let more = if values.len() > 8 { ", …" } else { "" };
                return Err(self.miss(format!("expected one of {}{more}, got {}", listed.join(", "), described(v))));
            }
        }
        if let Some(r) = k.reference {
            if let Some(target) = self.targets.get(r) {
                self.schema(target, v)?;
            }
        }
        Ok(())
    }

    fn number(&mut self, k: &Keywords, n: &Number) -> Checked {
        let x = n.as_f64().unwrap_or(f64::NAN);
        let bound = |ok: bool, what: &str, limit: Option<f64>| match limit {
            Some(l) if !ok => Err(format!("{n} is {what} {l}")),
            _ => Ok(()),
        };
        let checks = [
            bound(k.maximum.is_none_or(|m| x <= m), "more than the maximum", k.maximum),
            bound(
                k.exclusive_maximum.is_none_or(|m| x < m),
                "not less than the exclusive maximum",
                k.exclusive_maximum,
            ),
            bound(k.minimum.is_none_or(|m| x >= m), "less than the minimum", k.minimum),
            bound(
                k.exclusive_minimum.is_none_or(|m| x > m),
                "not more than the exclusive minimum",
                k.exclusive_minimum,
            ),
        ];
        for c in checks {
            c.map_err(|why| self.miss(why))?;
        }
        if let Some(m) = &k.multiple_of {
            if !multiple_of(n, m) {
                return Err(self.miss(format!("{n} is not a multiple of {}", short(&Value::Number(m.clone())))));
            }
        }
        Ok(())
    }

    fn string(&mut self, k: &Keywords, s: &str) -> Checked {
        if k.max_length.is_some() || k.min_length.is_some() {
            self.spend(1 + s.len() as u64 / 256)?;
            let len = s.chars().count() as u64;
            if k.max_length.is_some_and(|m| len > m) {
                return Err(self.miss(format!("{len} characters, more than maxLength {}", k.max_length.unwrap_or(0))));
            }
            if k.min_length.is_some_and(|m| len < m) {
                return Err(self.miss(format!("{len} characters, fewer than minLength {}", k.min_length.unwrap_or(0))));
            }
        }
        if let Some((pattern, re)) = &k.pattern {
            self.spend(1 + s.len() as u64 / 64)?;
            if !re.is_match(s) {
                return Err(self.miss(format!("{} does not match the pattern {pattern:?}", short(&Value::from(s)))));
            }
        }
        Ok(())
    }

    fn array(&mut self, k: &'s Keywords, a: &'v [Value]) -> Checked {
        let len = a.len() as u64;
        if k.max_items.is_some_and(|m| len > m) {
            return Err(self.miss(format!("{len} items, more than maxItems {}", k.max_items.unwrap_or(0))));
        }
        if k.min_items.is_some_and(|m| len < m) {
            return Err(self.miss(format!("{len} items, fewer than minItems {}", k.min_items.unwrap_or(0))));
        }
        if k.unique_items {
            self.unique(a)?;
        }
        for (i, item) in a.iter().enumerate() {
            let s = match k.prefix_items.get(i) {
                Some(s) => s,
                None => match &k.items {
                    Some(s) => s,
                    None => break,
                },
            };
            self.inside(Seg::Index(i), s, item)?;
        }
        if let Some(c) = &k.contains {
            self.contains(k, c, a)?;
        }
        Ok(())
    }

    fn unique(&mut self, a: &'v [Value]) -> Checked {
        self.spend((a.len() as u64).saturating_mul(a.len() as u64) / 2)?;
        for (i, x) in a.iter().enumerate() {
            for (j, y) in a[..i].iter().enumerate() {
                if self.equal(x, y)? {
                    return Err(self.miss(format!("items {j} and {i} are equal (uniqueItems)")));
                }
            }
        }
        Ok(())
    }

    /// Whether `a` equals `b`, each value compared costing a step.
    fn equal(&mut self, a: &Value, b: &Value) -> Result<bool, Mismatch> {
        let mut visited = 0u64;
        let same = equal(a, b, &mut visited);
        self.spend(visited)?;
        Ok(same)
    }

    fn contains(&mut self, k: &Keywords, c: &'s Schema, a: &'v [Value]) -> Checked {
        let mut matched = 0u64;
        for (i, item) in a.iter().enumerate() {
            self.path.push(Seg::Index(i));
            let checked = self.branch(QUOTED + 1, c, item);
            self.path.pop();
            match checked {
                Ok(()) => matched += 1,
                Err(Mismatch::At { .. }) => {}
                Err(limit) => return Err(limit),
            }
        }
        let min = k.min_contains.unwrap_or(1);
        if matched < min {
            return Err(self.miss(format!("{matched} items match contains, fewer than {min}")));
        }
        if let Some(max) = k.max_contains.filter(|m| matched > *m) {
            return Err(self.miss(format!("{matched} items match contains, more than maxContains {max}")));
        }
        Ok(())
    }

    fn object(&mut self, k: &'s Keywords, o: &'v Map<String, Value>) -> Checked {
        let len = o.len() as u64;
        if k.max_properties.is_some_and(|m| len > m) {
            return Err(
                self.miss(format!("{len} properties, more than maxProperties {}", k.max_properties.unwrap_or(0)))
            );
        }
        if k.min_properties.is_some_and(|m| len < m) {
            return Err(
                self.miss(format!("{len} properties, fewer than minProperties {}", k.min_properties.unwrap_or(0)))
            );
        }
        self.spend(k.required.len() as u64)?;
        if let Some(missing) = k.required.iter().find(|r| !o.contains_key(r.as_str())) {
            return Err(self.miss(format!("the property {missing:?} is required")));
        }
        self.spend(k.dependent_required.len() as u64 + k.dependent_schemas.len() as u64)?;
        for (name, needs) in &k.dependent_required {
            if o.contains_key(name) {
                self.spend(needs.len() as u64)?;
                if let Some(missing) = needs.iter().find(|r| !o.contains_key(r.as_str())) {
                    return Err(self.miss(format!("{missing:?} is required when {name:?} is present")));
                }
            }
        }
        self.properties(k, o)
    }

    fn properties(&mut self, k: &'s Keywords, o: &'v Map<String, Value>) -> Checked {
        for (name, v) in o {
            self.spend(1)?;
            if let Some(names) = &k.property_names {
                // The name is a value of its own: checked by a checker that
                // shares this one's budget and depth.
                let key = Value::String(name.clone());
                let mut sub = Checker {
                    targets: self.targets,
                    steps: self.steps,
                    depth: self.depth,
                    path: Vec::new(),
                    quiet: self.quiet,
                };
                let checked = sub.schema(names, &key);
                self.steps = sub.steps;
                match checked {
                    Ok(()) => {}
                    Err(Mismatch::At { why, .. }) => {
                        return Err(self.miss(format!("the property name {name:?} does not match propertyNames: {why}")))
                    }
                    Err(limit) => return Err(limit),
                }
            }
            let mut known = false;
            if let Some(s) = k.properties.get(name) {
                known = true;
                self.inside(Seg::Key(name), s, v)?;
            }
            for (_, re, s) in &k.pattern_properties {
                self.spend(1 + name.len() as u64 / 64)?;
                if re.is_match(name) {
                    known = true;
                    self.inside(Seg::Key(name), s, v)?;
                }
            }
            if !known {
                match &k.additional_properties {
                    Some(Schema::Bool(false)) => {
                        return Err(self.miss(format!("the property {name:?} is not allowed (additionalProperties)")))
                    }
                    Some(s) => self.inside(Seg::Key(name), s, v)?,
                    None => {}
                }
            }
        }
        Ok(())
    }

    fn combined(&mut self, k: &'s Keywords, v: &'v Value) -> Checked {
        for s in &k.all_of {
            self.schema(s, v)?;
        }
        if !k.any_of.is_empty() {
            let (mut misses, mut matched) = (Vec::new(), false);
            for s in &k.any_of {
                match self.branch(1, s, v) {
                    Ok(()) => {
                        matched = true;
                        break;
                    }
                    Err(Mismatch::At { at, why }) => self.note(&mut misses, at, why),
                    Err(limit) => return Err(limit),
                }
            }
            if !matched {
                let n = k.any_of.len();
                return Err(self.miss(format!("matches none of anyOf's {n} schemas{}", summary(&misses))));
            }
        }
        if !k.one_of.is_empty() {
            self.one_of(&k.one_of, v)?;
        }
        if let Some(not) = &k.not {
            match self.branch(QUOTED + 1, not, v) {
                Ok(()) => return Err(self.miss("matches the schema under not")),
                Err(Mismatch::At { .. }) => {}
                Err(limit) => return Err(limit),
            }
        }
        if let Some((cond, then, otherwise)) = &k.if_then_else {
            let holds = match self.branch(QUOTED + 1, cond, v) {
                Ok(()) => true,
                Err(Mismatch::At { .. }) => false,
                Err(limit) => return Err(limit),
            };
            let branch = if holds { then } else { otherwise };
            if let Some(s) = branch {
                self.schema(s, v)?;
            }
        }
        if let Value::Object(o) = v {
            for (name, s) in &k.dependent_schemas {
                if o.contains_key(name) {
                    self.schema(s, v)?;
                }
            }
        }
        Ok(())
    }

    /// A branch's reason, kept for the refusal when this is the first
    /// level of branches ("at /x: " when it is deeper than the value).
    fn note(&self, misses: &mut Vec<String>, at: String, why: String) {
        if self.quiet > 0 {
            return;
        }
        let here = match self.miss("") {
            Mismatch::At { at, .. } => at,
            Mismatch::Limit(_) => String::new(),
        };
        misses.push(if at == here { why } else { format!("at {at}: {why}") });
    }

    fn one_of(&mut self, schemas: &'s [Schema], v: &'v Value) -> Checked {
        let mut matched = Vec::new();
        let mut misses = Vec::new();
        for (i, s) in schemas.iter().enumerate() {
            match self.branch(1, s, v) {
                Ok(()) => matched.push(i),
                Err(Mismatch::At { at, why }) => self.note(&mut misses, at, why),
                Err(limit) => return Err(limit),
            }
        }
        match matched.len() {
            1 => Ok(()),
            0 => Err(self.miss(format!("matches none of oneOf's {} schemas{}", schemas.len(), summary(&misses)))),
            _ => Err(self.miss(format!("matches more than one of oneOf's schemas (numbers {matched:?})"))),
        }
    }
}

/// The first few reasons, joined in parentheses (nothing without any).
fn summary(misses: &[String]) -> String {
    if misses.is_empty() {
        return String::new();
    }
    let mut s: Vec<&str> = misses.iter().take(3).map(String::as_str).collect();
    if misses.len() > 3 {
        s.push("…");
    }
    format!(" ({})", s.join("; "))
}

fn is_type(v: &Value, t: Type) -> bool {
    match (t, v) {
        (Type::Null, Value::Null)
        | (Type::Boolean, Value::Bool(_))
        | (Type::Object, Value::Object(_))
        | (Type::Array, Value::Array(_))
        | (Type::Number, Value::Number(_))
        | (Type::String, Value::String(_)) => true,
        (Type::Integer, Value::Number(n)) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// Whether `n` is a multiple of `m`: exactly for whole numbers, within
/// a float's rounding otherwise (`0.0075` is a multiple of `0.0001`).
fn multiple_of(n: &Number, m: &Number) -> bool {
    if let (Some(x), Some(m)) = (n.as_u64(), m.as_u64()) {
        return m != 0 && x % m == 0;
    }
    if let (Some(x), Some(m)) = (n.as_i64(), m.as_i64()) {
        return m != 0 && x % m == 0;
    }
    let q = n.as_f64().unwrap_or(f64::NAN) / m.as_f64().unwrap_or(f64::NAN);
    q.is_finite() && (q - q.round()).abs() <= 1e-9 * q.abs().max(1.0)
}

/// JSON equality: numbers by value (`1` equals `1.0`); `visited` counts
/// the values compared.
fn equal(a: &Value, b: &Value, visited: &mut u64) -> bool {
    *visited += 1;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(x), Some(y), _, _) => x == y,
            (_, _, Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equal(x, y, visited)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w, visited)))
        }
        _ => a == b,
    }
}

/// A value as a reason names it: its type, and its text when short.
fn described(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(b) => return b.to_string(),
        Value::Number(n) => return format!("number {}", short(&Value::Number(n.clone()))),
        Value::String(_) => "string",
        Value::Array(a) => return format!("an array of {} items", a.len()),
        Value::Object(_) => return "an object".into(),
    };
    format!("{kind} {}", short(v))
}

/// A value's JSON, cut at 40 characters.
fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}
