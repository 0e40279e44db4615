//! The value the sandbox evaluates: jaq's JSON value with a bound on its
//! nesting depth, whose every construction is charged to the evaluation's
//! budget ([`super::guard`]).
//!
//! jaq builds values only through the value type's trait methods (array and
//! object construction, arithmetic, string conversion), so wrapping the value
//! is what lets the sandbox see every byte an expression builds before it is
//! allocated: `"x" * 1e12` is refused before a byte is repeated, a doubling
//! loop when it reaches the limit, not after it has eaten the machine.

use std::cmp::Ordering;
use std::fmt;
use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

use jaq_core::path::Opt;
use jaq_core::val::Range;
use jaq_core::{Error, Exn, ValR, ValX};
use jaq_json::{Num, Rc, Val};

use super::guard;

/// Bytes charged per array element or object entry.
const SLOT: u64 = 16;

/// What one piece of a split string is charged besides its bytes: the
/// value that holds it.
const PIECE_COST: u64 = 64;

/// Multiplier on the size of big integers in arithmetic.
const BIGINT_WORK: u64 = 1024;

/// A jaq value and an upper bound of its nesting depth (0 for scalars).
#[derive(Clone, Debug, Default)]
pub struct Value {
    pub(crate) inner: Val,
    depth: u32,
}

impl Value {
    pub(super) fn scalar(inner: Val) -> Value {
        Value { inner, depth: 0 }
    }

    /// Wraps a value that was not built by an expression (the input),
    /// measuring its depth once.
    pub fn wrap(inner: Val) -> Value {
        let depth = depth_of(&inner);
        Value { inner, depth }
    }

    /// This object with `fields` set (a non-object is taken as `{}`); its
    /// depth is updated from the new fields alone.
    pub(crate) fn with_fields<'k>(&self, fields: impl IntoIterator<Item = (&'k str, Val)>) -> Value {
        let mut map = match &self.inner {
            Val::Obj(o) => (**o).clone(),
            _ => jaq_json::Map::default(),
        };
        let mut depth = self.depth.max(1);
        for (key, v) in fields {
            depth = depth.max(depth_of(&v) + 1);
            map.insert(Val::from(key.to_string()), v);
        }
        Value { inner: Val::obj(map), depth }
    }

    /// A child of this value: no deeper than one level less.
    fn child(&self, inner: Val) -> Value {
        Value { inner, depth: self.depth.saturating_sub(1) }
    }

    /// A container built from values of depth up to `below`.
    fn container(inner: Val, below: u32) -> Value {
        let depth = below + 1;
        guard::nest(depth);
        Value { inner, depth }
    }

    pub(super) fn string(s: String) -> Value {
        Value::scalar(Val::from(s))
    }

    pub(super) fn err(message: impl fmt::Display) -> Error<Value> {
        Error::str(message)
    }
}

fn depth_of(v: &Val) -> u32 {
    match v {
        Val::Arr(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
        Val::Obj(o) => 1 + o.iter().map(|(k, v)| depth_of(k).max(depth_of(v))).max().unwrap_or(0),
        _ => 0,
    }
}

/// Bytes a string or big number occupies, for charging.
fn size_of(v: &Val) -> u64 {
    match v {
        Val::TStr(b) | Val::BStr(b) => b.len() as u64,
        Val::Arr(a) => a.len() as u64 * SLOT,
        Val::Obj(o) => o.len() as u64 * SLOT * 2,
        Val::Num(Num::BigInt(i)) => i.bits() / 8,
        Val::Num(Num::Dec(s)) => s.len() as u64,
        _ => 0,
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// An error's message, cut to a readable length (its values may be large).
pub(crate) fn describe(e: &Error<Value>) -> String {
    use fmt::Write;
    let mut w = Capped { out: String::new(), limit: 500 };
    if write!(w, "{e}").is_err() {
        w.out.push('…');
    }
    w.out
}

/// A `fmt::Write` that stops once it has taken `limit` bytes.
pub(crate) struct Capped {
    pub out: String,
    pub limit: usize,
}

impl fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        guard::tick();
        if self.out.len() + s.len() > self.limit {
            return Err(fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

/// `v` as JSON text, charged to the budget as it is written: a value that
/// shares structure (`[., .]` nested 40 times) is small in memory but not
/// as text.
pub(super) fn to_json(v: &Val) -> String {
    use fmt::Write;
    let limit = usize::try_from(guard::bytes_left()).unwrap_or(usize::MAX);
    let mut w = Capped { out: String::new(), limit };
    if write!(w, "{v}").is_err() {
        guard::build(u64::MAX);
    }
    guard::build(w.out.len() as u64);
    w.out
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        equal(&self.inner, &other.inner)
    }
}

/// `a == b` as jaq defines it, one step charged per pair of values
/// visited; values that share structure compare equal without a visit.
pub(super) fn equal(a: &Val, b: &Val) -> bool {
    guard::step();
    match (a, b) {
        (Val::Arr(x), Val::Arr(y)) => {
            Rc::ptr_eq(x, y) || (x.len() == y.len() && x.iter().zip(y.iter()).all(|(x, y)| equal(x, y)))
        }
        (Val::Obj(x), Val::Obj(y)) => {
            Rc::ptr_eq(x, y) || (x.len() == y.len() && x.iter().all(|(k, x)| y.get(k).is_some_and(|y| equal(x, y))))
        }
        (Val::Arr(_) | Val::Obj(_), _) | (_, Val::Arr(_) | Val::Obj(_)) => false,
        _ => a == b,
    }
}

/// jq's order (jaq's), one step charged per pair of values visited:
/// sorting values that share structure (`[., .]` nested 30 times) costs
/// what it visits, not what it would print.
fn order(a: &Val, b: &Val) -> Ordering {
    guard::step();
    match (a, b) {
        (Val::Arr(x), Val::Arr(y)) => {
            if Rc::ptr_eq(x, y) {
                return Ordering::Equal;
            }
            for (x, y) in x.iter().zip(y.iter()) {
                match order(x, y) {
                    Ordering::Equal => {}
                    other => return other,
                }
            }
            x.len().cmp(&y.len())
        }
        (Val::Obj(x), Val::Obj(y)) if !x.is_empty() && !y.is_empty() => {
            if Rc::ptr_eq(x, y) {
                return Ordering::Equal;
            }
            guard::work((x.len() + y.len()) as u64);
            let mut l: Vec<_> = x.iter().collect();
            let mut r: Vec<_> = y.iter().collect();
            l.sort_by(|(k, _), (j, _)| order(k, j));
            r.sort_by(|(k, _), (j, _)| order(k, j));
            let keys = l.iter().map(|(k, _)| *k).cmp_with(r.iter().map(|(k, _)| *k), order);
            keys.then_with(|| l.iter().map(|(_, v)| *v).cmp_with(r.iter().map(|(_, v)| *v), order))
        }
        // Scalars, and containers against anything else, by kind: no visit.
        _ => a.cmp(b),
    }
}

/// `Iterator::cmp_by`, which is not stable yet.
trait CmpBy<'a>: Iterator<Item = &'a Val> + Sized {
    fn cmp_with(mut self, mut other: impl Iterator<Item = &'a Val>, f: fn(&Val, &Val) -> Ordering) -> Ordering {
        loop {
            match (self.next(), other.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some(x), Some(y)) => match f(x, y) {
                    Ordering::Equal => {}
                    other => return other,
                },
            }
        }
    }
}

impl<'a, I: Iterator<Item = &'a Val>> CmpBy<'a> for I {}

impl Eq for Value {}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        order(&self.inner, &other.inner)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::scalar(Val::from(b))
    }
}

impl From<isize> for Value {
    fn from(i: isize) -> Self {
        Value::scalar(Val::from(i))
    }
}

impl From<usize> for Value {
    fn from(i: usize) -> Self {
        Value::scalar(Val::from(i))
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::scalar(Val::from(f))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        guard::build(s.len() as u64);
        Value::scalar(Val::from(s))
    }
}

impl From<Range<Value>> for Value {
    fn from(r: Range<Value>) -> Self {
        let below = r.start.iter().chain(r.end.iter()).map(|v| v.depth).max().unwrap_or(0);
        let inner = Val::from(r.start.map(|v| v.inner)..r.end.map(|v| v.inner));
        Value::container(inner, below)
    }
}

impl FromIterator<Value> for Value {
    fn from_iter<T: IntoIterator<Item = Value>>(iter: T) -> Self {
        let mut below = 0;
        let items: Vec<Val> = iter
            .into_iter()
            .map(|v| {
                guard::build(SLOT);
                below = below.max(v.depth);
                v.inner
            })
            .collect();
        Value::container(Val::Arr(Rc::new(items)), below)
    }
}

/// Checks that `l op r` stays within the budget before it is computed.
fn charge_math(l: &Val, op: char, r: &Val) {
    let cost = match (l, op, r) {
        (Val::TStr(_) | Val::BStr(_) | Val::Arr(_) | Val::Obj(_), '+', _) => size_of(l) + size_of(r),
        (Val::TStr(s) | Val::BStr(s), '*', Val::Num(n)) | (Val::Num(n), '*', Val::TStr(s) | Val::BStr(s)) => {
            let times = match n {
                Num::Int(i) => (*i).max(0) as u64,
                Num::BigInt(_) => u64::MAX,
                _ => 0,
            };
            (s.len() as u64).saturating_mul(times)
        }
        (Val::Obj(_), '*', Val::Obj(_)) => size_of(l) + size_of(r),
        // Splitting text (`/`, and `split/1`): its bytes again, and a value
        // for each piece it can make, charged before it is split (30 million
        // one-byte pieces took 4.5 s and 1.5 GB in one step).
        (Val::TStr(s) | Val::BStr(s), '/', Val::TStr(sep) | Val::BStr(sep)) => {
            let pieces = s.len() as u64 / (sep.len() as u64).max(1) + 1;
            (s.len() as u64).saturating_add(pieces.saturating_mul(PIECE_COST))
        }
        // Big integers are charged for the work of computing them, not just
        // their size: squaring a 16 MiB integer takes seconds in one step.
        (Val::Num(Num::BigInt(_)), _, _) | (_, _, Val::Num(Num::BigInt(_))) => {
            (size_of(l) + size_of(r)).saturating_mul(BIGINT_WORK)
        }
        _ => 0,
    };
    guard::build(cost);
}

macro_rules! math {
    ($trait:ident, $method:ident, $op:literal) => {
        impl $trait for Value {
            type Output = ValR<Value>;
            fn $method(self, rhs: Self) -> Self::Output {
                charge_math(&self.inner, $op, &rhs.inner);
                let depth = self.depth.max(rhs.depth);
                match self.inner.$method(rhs.inner) {
                    Ok(inner) => Ok(Value { inner, depth }),
                    Err(e) => Err(Value::err(e)),
                }
            }
        }
    };
}

math!(Add, add, '+');
math!(Sub, sub, '-');
math!(Mul, mul, '*');
math!(Div, div, '/');
math!(Rem, rem, '%');

impl Neg for Value {
    type Output = ValR<Value>;
    fn neg(self) -> Self::Output {
        (-self.inner).map(Value::scalar).map_err(Value::err)
    }
}

fn is_key(index: &Val) -> bool {
    matches!(index, Val::Num(_) | Val::TStr(_) | Val::BStr(_) | Val::Null)
}

impl jaq_core::ValT for Value {
    fn from_num(n: &str) -> ValR<Self> {
        guard::build(n.len() as u64);
        Val::from_num(n).map(Value::scalar).map_err(Value::err)
    }

    fn from_map<I: IntoIterator<Item = (Self, Self)>>(iter: I) -> ValR<Self> {
        let mut below = 0;
        let entries = iter.into_iter().map(|(k, v)| {
            guard::build(SLOT * 2);
            below = below.max(k.depth).max(v.depth);
            (k.inner, v.inner)
        });
        let inner = Val::from_map(entries.collect::<Vec<_>>()).map_err(Value::err)?;
        Ok(Value::container(inner, below))
    }

    fn key_values(self) -> jaq_core::box_iter::BoxIter<'static, ValR<(Self, Self), Self>> {
        let depth = self.depth.saturating_sub(1);
        let wrap = move |v: Val| Value { inner: v, depth };
        Box::new(self.inner.key_values().map(move |kv| match kv {
            Ok((k, v)) => Ok((wrap(k), wrap(v))),
            Err(e) => Err(Value::err(e)),
        }))
    }

    fn values(self) -> Box<dyn Iterator<Item = ValR<Self>>> {
        let depth = self.depth.saturating_sub(1);
        Box::new(self.inner.values().map(move |v| match v {
            Ok(inner) => Ok(Value { inner, depth }),
            Err(e) => Err(Value::err(e)),
        }))
    }

    fn index(self, index: &Self) -> ValR<Self> {
        let depth = if is_key(&index.inner) { self.depth.saturating_sub(1) } else { self.depth };
        match self.inner.index(&index.inner) {
            Ok(inner) => Ok(Value { inner, depth }),
            Err(e) => Err(Value::err(e)),
        }
    }

    fn range(self, range: Range<&Self>) -> ValR<Self> {
        let depth = self.depth;
        let range = range.start.map(|v| &v.inner)..range.end.map(|v| &v.inner);
        match self.inner.range(range) {
            Ok(inner) => Ok(Value { inner, depth }),
            Err(e) => Err(Value::err(e)),
        }
    }

    fn map_values<'a, I: Iterator<Item = ValX<'a, Self>>>(self, opt: Opt, f: impl Fn(Self) -> I) -> ValX<'a, Self> {
        let mut below = 0;
        let mut apply = |v: Val| -> Result<Option<Val>, Exn<'a, Value>> {
            guard::build(SLOT);
            match f(self.child(v)).next().transpose()? {
                Some(y) => {
                    below = below.max(y.depth);
                    Ok(Some(y.inner))
                }
                None => Ok(None),
            }
        };
        let inner = match &self.inner {
            Val::Arr(a) => {
                let mut out = Vec::with_capacity(a.len());
                for v in a.iter() {
                    out.extend(apply(v.clone())?);
                }
                Val::Arr(Rc::new(out))
            }
            Val::Obj(o) => {
                let mut out = Vec::with_capacity(o.len());
                for (k, v) in o.iter() {
                    if let Some(y) = apply(v.clone())? {
                        out.push((k.clone(), y));
                    }
                }
                Val::obj(out.into_iter().collect())
            }
            _ => return opt.fail(self, |v| Exn::from(Error::typ(v, "iterable"))),
        };
        Ok(Value::container(inner, below.max(self.depth.saturating_sub(1))))
    }

    fn map_index<'a, I: Iterator<Item = ValX<'a, Self>>>(
        self,
        index: &Self,
        opt: Opt,
        f: impl Fn(Self) -> I,
    ) -> ValX<'a, Self> {
        let rest = self.depth.saturating_sub(1);
        match (&self.inner, &index.inner) {
            (Val::Obj(o), k) => {
                let old = o.get(k).cloned().unwrap_or_default();
                let mut o = (**o).clone();
                guard::build(SLOT * 2);
                let below = match f(self.child(old)).next().transpose()? {
                    Some(y) => {
                        o.insert(k.clone(), y.inner);
                        y.depth.max(index.depth)
                    }
                    None => {
                        o.shift_remove(k);
                        0
                    }
                };
                Ok(Value::container(Val::obj(o), below.max(rest)))
            }
            (Val::Null, Val::TStr(_) | Val::BStr(_)) => {
                Value::from_map([]).map_err(Exn::from)?.map_index(index, opt, f)
            }
            (Val::Arr(a), Val::Num(n)) => {
                let len = a.len() as isize;
                let i = match n.as_isize() {
                    Some(i) if i < 0 && i + len >= 0 => (i + len) as usize,
                    Some(i) if (0..len).contains(&i) => i as usize,
                    _ => {
                        let e = Value::err(format_args!("index {n} out of bounds of an array of {len}"));
                        return opt.fail(self, |_| Exn::from(e));
                    }
                };
                let mut a = (**a).clone();
                guard::build(a.len() as u64 * SLOT);
                let below = match f(self.child(std::mem::take(&mut a[i]))).next().transpose()? {
                    Some(y) => {
                        a[i] = y.inner;
                        y.depth
                    }
                    None => {
                        a.remove(i);
                        0
                    }
                };
                Ok(Value::container(Val::Arr(Rc::new(a)), below.max(rest)))
            }
            (Val::Arr(_), Val::Obj(o)) => {
                let start = o.get(&Val::utf8_str("start")).map(|v| Value::scalar(v.clone()));
                let end = o.get(&Val::utf8_str("end")).map(|v| Value::scalar(v.clone()));
                self.map_range(start.as_ref()..end.as_ref(), opt, f)
            }
            _ => opt.fail(self, |v| Exn::from(Error::typ(v, "object or array"))),
        }
    }

    fn map_range<'a, I: Iterator<Item = ValX<'a, Self>>>(
        self,
        range: Range<&Self>,
        opt: Opt,
        f: impl Fn(Self) -> I,
    ) -> ValX<'a, Self> {
        let Val::Arr(a) = &self.inner else {
            return opt.fail(self, |v| Exn::from(Error::typ(v, "array")));
        };
        let len = a.len() as isize;
        let bound = |v: Option<&Value>, default: isize| -> Result<usize, Error<Value>> {
            let i = match v.map(|v| &v.inner) {
                None | Some(Val::Null) => default,
                Some(Val::Num(n)) => n.as_isize().ok_or_else(|| Value::err(format_args!("{n} is not an index")))?,
                Some(other) => return Err(Value::err(format_args!("{other} is not an index"))),
            };
            Ok((if i < 0 { i + len } else { i }).clamp(0, len) as usize)
        };
        let start = bound(range.start, 0).map_err(Exn::from)?;
        let end = bound(range.end, len).map_err(Exn::from)?.max(start);
        let slice = Value { inner: Val::Arr(Rc::new(a[start..end].to_vec())), depth: self.depth };
        let replacement = match f(slice).next().transpose()? {
            Some(Value { inner: Val::Arr(r), depth }) => (r, depth),
            Some(other) => return Err(Exn::from(Error::typ(other, "array"))),
            None => (Rc::new(Vec::new()), 0),
        };
        guard::build((a.len() + replacement.0.len()) as u64 * SLOT);
        let mut out = (**a).clone();
        out.splice(start..end, replacement.0.iter().cloned());
        Ok(Value::container(Val::Arr(Rc::new(out)), self.depth.saturating_sub(1).max(replacement.1.saturating_sub(1))))
    }

    fn as_bool(&self) -> bool {
        self.inner.as_bool()
    }

    fn into_string(self) -> Self {
        match self.inner {
            Val::TStr(_) | Val::BStr(_) => Value::scalar(self.inner.into_string()),
            other => Value::string(to_json(&other)),
        }
    }
}

impl jaq_std::ValT for Value {
    fn into_seq<S: FromIterator<Self>>(self) -> Result<S, Self> {
        let depth = self.depth.saturating_sub(1);
        match self.inner {
            Val::Arr(a) => Ok(a.iter().map(|inner| Value { inner: inner.clone(), depth }).collect()),
            inner => Err(Value { inner, depth: self.depth }),
        }
    }

    fn is_int(&self) -> bool {
        self.inner.is_int()
    }

    fn as_isize(&self) -> Option<isize> {
        self.inner.as_isize()
    }

    fn as_f64(&self) -> Option<f64> {
        self.inner.as_f64()
    }

    fn is_utf8_str(&self) -> bool {
        self.inner.is_utf8_str()
    }

    fn as_bytes(&self) -> Option<&[u8]> {
        self.inner.as_bytes()
    }

    fn as_sub_str(&self, sub: &[u8]) -> Self {
        Value::scalar(self.inner.as_sub_str(sub))
    }

    fn from_utf8_bytes(b: impl AsRef<[u8]> + Send + 'static) -> Self {
        guard::build(b.as_ref().len() as u64);
        Value::scalar(Val::from_utf8_bytes(b))
    }
}

/// The data type of sandboxed filters: values are [`Value`], and every term
/// jaq evaluates is charged to the budget when jaq looks it up.
pub struct Sandboxed;

impl jaq_core::DataT for Sandboxed {
    type V<'a> = Value;
    type Data<'a> = Lookup<'a>;
}

/// The filter's lookup table, charging one step per lookup.
#[derive(Clone, Copy)]
pub struct Lookup<'a>(pub &'a jaq_core::Lut<Sandboxed>);

impl<'a> jaq_core::data::HasLut<'a, Sandboxed> for Lookup<'a> {
    fn lut(&self) -> &'a jaq_core::Lut<Sandboxed> {
        guard::step();
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_measured_once_and_bounded_for_children() {
        let v = Value::wrap(serde_json::from_value(serde_json::json!({"a": [[1]], "b": 2})).unwrap());
        assert_eq!(v.depth, 3);
        let a = jaq_core::ValT::index(v, &Value::from("a".to_string())).unwrap();
        assert_eq!(a.depth, 2, "a child is one level less deep than its parent");
    }
}
