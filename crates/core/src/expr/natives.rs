//! The natives the sandbox writes for its own value type: jq's JSON
//! functions (`length`, `has`, `contains`, `indices`, `tojson`, `fromjson`),
//! each charged for its work, and the charge a regex pays before it runs.

use jaq_core::native::{bome, unary, v, Fun};
use jaq_core::{Error, ValR};
use jaq_json::Val;

use super::guard;
use super::value::{equal, to_json, Value};

/// jq's JSON functions, written for [`Value`] (jaq's own are bound to its
/// value type): `length`, `has`, `contains`, `indices`, `tojson`, `fromjson`.
pub fn json_funs<D: for<'a> jaq_core::DataT<V<'a> = Value>>() -> impl Iterator<Item = Fun<D>> {
    json_natives().into_vec().into_iter().map(jaq_core::native::run)
}

fn json_natives<D: for<'a> jaq_core::DataT<V<'a> = Value>>() -> Box<[jaq_core::native::Filter<jaq_core::RunPtr<D>>]> {
    Box::new([
        ("length", v(0), |cv| bome(length(&cv.1))),
        ("has", v(1), |cv| unary(cv, |v, k| has(&v.inner, &k.inner).map(Value::from))),
        ("contains", v(1), |cv| unary(cv, |a, b| Ok(Value::from(contains(&a.inner, &b.inner))))),
        ("indices", v(1), |cv| unary(cv, |a, b| indices(&a.inner, &b.inner))),
        ("tojson", v(0), |cv| bome(Ok(Value::string(to_json(&cv.1.inner))))),
        ("fromjson", v(0), |cv| bome(fromjson(&cv.1))),
    ])
}

/// `__composer_regex_cost($re; $flags)`: charges what matching `$re`
/// against the input will cost, and passes the input on.
pub fn regex_cost_fun<D: for<'a> jaq_core::DataT<V<'a> = Value>>() -> impl Iterator<Item = Fun<D>> {
    regex_cost_native().into_vec().into_iter().map(jaq_core::native::run)
}

fn regex_cost_native<D: for<'a> jaq_core::DataT<V<'a> = Value>>() -> Box<[jaq_core::native::Filter<jaq_core::RunPtr<D>>]>
{
    Box::new([("__composer_regex_cost", v(2), |mut cv| {
        let _flags = cv.0.pop_var();
        let re = cv.0.pop_var();
        if let (Val::TStr(re), Val::TStr(text) | Val::BStr(text)) = (&re.inner, &cv.1.inner) {
            guard::work(regex_cost(&String::from_utf8_lossy(re), text.len()));
        }
        bome(Ok(cv.1))
    })])
}

/// Program size times input length per step charged for a regex. jaq's
/// engine (regex-bites, a PikeVM) does work in proportion to both: the
/// pattern `(\w{1,250}){1,250}b` (size ~63,000) took 10.6 s on 1,000
/// characters, ~170 ns per unit, and a step is budgeted ~500 ns.
const REGEX_UNITS_PER_STEP: u64 = 3;

/// Steps to charge for matching `re` against `len` bytes.
pub fn regex_cost(re: &str, len: usize) -> u64 {
    regex_size(re).saturating_mul(len as u64 + 1) / REGEX_UNITS_PER_STEP
}

/// An upper bound of the size of `re`'s compiled program: a counted
/// repetition (`x{m,n}`) copies what it repeats `n` times (`m + 1` for
/// `x{m,}`), nested ones multiply. Deliberately rough, and never below
/// what the engine builds.
pub fn regex_size(re: &str) -> u64 {
    // The size of each open group's contents, innermost last.
    let mut groups: Vec<u64> = vec![0];
    // The size of the last atom, which a quantifier repeats.
    let mut last: u64 = 0;
    let mut chars = re.chars().peekable();
    let add = |groups: &mut Vec<u64>, n: u64| {
        if let Some(top) = groups.last_mut() {
            *top = top.saturating_add(n);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
                last = 1;
                add(&mut groups, 1);
            }
            '[' => {
                // A class is one instruction, however long.
                let mut first = true;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        ']' if !first => break,
                        _ => {}
                    }
                    first = false;
                }
                last = 1;
                add(&mut groups, 1);
            }
            '(' => groups.push(1),
            ')' if groups.len() > 1 => {
                last = groups.pop().unwrap_or(1);
                add(&mut groups, last);
            }
            '{' => {
                let mut spec = String::new();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    spec.push(c);
                }
                let mut bounds = spec.splitn(2, ',').map(|b| b.trim().parse::<u64>().ok());
                let times = match (bounds.next().flatten(), bounds.next()) {
                    (Some(m), None) => m,
                    (Some(m), Some(None)) => m.saturating_add(1),
                    (_, Some(Some(n))) => n,
                    (None, _) => 1,
                };
                let more = last.saturating_mul(times.saturating_sub(1));
                add(&mut groups, more);
                last = last.saturating_mul(times.max(1));
            }
            '*' | '+' | '?' => add(&mut groups, 1),
            _ => {
                last = 1;
                add(&mut groups, 1);
            }
        }
    }
    groups.into_iter().fold(0u64, |a, b| a.saturating_add(b))
}

fn length(v: &Value) -> ValR<Value> {
    Ok(match &v.inner {
        Val::Null => Value::from(0usize),
        Val::Bool(_) => return Err(Value::err(format_args!("{v} has no length"))),
        Val::Num(n) => match n.as_isize() {
            Some(i) => Value::from(i.unsigned_abs()),
            None => Value::from(jaq_std::ValT::as_f64(&v.inner).unwrap_or(f64::NAN).abs()),
        },
        Val::TStr(s) => Value::from(String::from_utf8_lossy(s).chars().count()),
        Val::BStr(b) => Value::from(b.len()),
        Val::Arr(a) => Value::from(a.len()),
        Val::Obj(o) => Value::from(o.len()),
    })
}

fn has(v: &Val, k: &Val) -> Result<bool, Error<Value>> {
    match (v, k) {
        (Val::Obj(o), _) => Ok(o.contains_key(k)),
        (Val::Arr(a), Val::Num(n)) => Ok(n.as_isize().is_some_and(|i| i >= 0 && (i as usize) < a.len())),
        _ => Err(Value::err(format_args!("cannot check whether {v} has {k}"))),
    }
}

/// Bytes scanned per step charged when searching text.
const SCAN_PER_STEP: u64 = 64;

/// jq's `contains`: substrings found in linear time, every pair of values
/// compared charged a step.
fn contains(a: &Val, b: &Val) -> bool {
    guard::step();
    match (a, b) {
        (Val::TStr(x) | Val::BStr(x), Val::TStr(y) | Val::BStr(y)) => {
            guard::work((x.len() + y.len()) as u64 / SCAN_PER_STEP);
            memchr::memmem::find(x, y).is_some()
        }
        (Val::Arr(x), Val::Arr(y)) => y.iter().all(|y| x.iter().any(|x| contains(x, y))),
        (Val::Obj(x), Val::Obj(y)) => y.iter().all(|(k, y)| x.get(k).is_some_and(|x| contains(x, y))),
        _ => equal(a, b),
    }
}

/// Where `y` starts in `x`, overlapping matches included; each search
/// charged by the bytes it may scan.
fn find_all(x: &[u8], y: &[u8]) -> Vec<usize> {
    let finder = memchr::memmem::Finder::new(y);
    let mut found = Vec::new();
    let mut from = 0;
    loop {
        guard::work((x.len() - from + y.len()).min(2 * y.len() + SCAN_PER_STEP as usize) as u64 / SCAN_PER_STEP + 1);
        match finder.find(&x[from..]) {
            Some(i) => {
                found.push(from + i);
                from += i + 1;
                if from > x.len() {
                    return found;
                }
            }
            None => return found,
        }
    }
}

fn indices(a: &Val, b: &Val) -> ValR<Value> {
    let found: Vec<usize> = match (a, b) {
        (Val::TStr(x) | Val::BStr(x), Val::TStr(y) | Val::BStr(y)) if !y.is_empty() => find_all(x, y),
        (Val::Arr(x), Val::Arr(y)) if !y.is_empty() => x
            .windows(y.len())
            .enumerate()
            .filter(|(_, w)| w.iter().zip(y.iter()).all(|(a, b)| equal(a, b)))
            .map(|(i, _)| i)
            .collect(),
        (Val::Arr(x), y) if !matches!(y, Val::Arr(_)) => {
            x.iter().enumerate().filter(|(_, x)| equal(x, y)).map(|(i, _)| i).collect()
        }
        (Val::Null, _) => return Ok(Value::default()),
        (_, Val::TStr(_) | Val::BStr(_) | Val::Arr(_)) => Vec::new(),
        _ => return Err(Value::err(format_args!("cannot find indices of {b} in {a}"))),
    };
    Ok(found.into_iter().map(Value::from).collect())
}

fn fromjson(v: &Value) -> ValR<Value> {
    let text = match &v.inner {
        Val::TStr(s) => s,
        other => return Err(Error::typ(Value::scalar(other.clone()), "string")),
    };
    guard::build(text.len() as u64);
    match serde_json::from_slice::<serde_json::Value>(text) {
        Ok(parsed) => serde_json::from_value::<Val>(parsed)
            .map(Value::wrap)
            .map_err(|e| Value::err(format_args!("fromjson: {e}"))),
        Err(e) => Err(Value::err(format_args!("fromjson: {e}"))),
    }
}
