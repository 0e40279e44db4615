//! A value's JSON written a part at a time ([`Parts`]), so that a large
//! value goes to its object without its whole text in memory beside it:
//! the same bytes `serde_json::to_vec` writes (compact, an object's keys in
//! the order the map keeps them), produced as the caller asks for more.

use serde_json::Value;

/// Where a value's JSON is up to: the arrays and objects open around the
/// next element.
pub struct Parts<'a> {
    first: Option<&'a Value>,
    open: Vec<Open<'a>>,
}

enum Open<'a> {
    Array(std::slice::Iter<'a, Value>, bool),
    Object(serde_json::map::Iter<'a>, bool),
}

impl<'a> Parts<'a> {
    pub fn new(value: &'a Value) -> Parts<'a> {
        Parts { first: Some(value), open: Vec::new() }
    }

    /// Appends the value's next JSON to `out` until `out` holds at least
    /// `at_least` bytes (a string or number is written whole) or the value
    /// is written; whether it is.
    pub fn fill(&mut self, out: &mut Vec<u8>, at_least: usize) -> serde_json::Result<bool> {
        if let Some(v) = self.first.take() {
            self.start(v, out)?;
        }
        while out.len() < at_least {
            let next = match self.open.last_mut() {
                None => return Ok(true),
                Some(Open::Array(items, first)) => items.next().map(|v| (None, v, std::mem::replace(first, false))),
                Some(Open::Object(fields, first)) => {
                    fields.next().map(|(k, v)| (Some(k), v, std::mem::replace(first, false)))
                }
            };
            match next {
                Some((key, v, first)) => {
                    if !first {
                        out.push(b',');
                    }
                    if let Some(key) = key {
                        serde_json::to_writer(&mut *out, key)?;
                        out.push(b':');
                    }
                    self.start(v, out)?;
                }
                None => {
                    out.push(match self.open.pop() {
                        Some(Open::Array(..)) => b']',
                        _ => b'}',
                    });
                }
            }
        }
        Ok(self.open.is_empty())
    }

    fn start(&mut self, v: &'a Value, out: &mut Vec<u8>) -> serde_json::Result<()> {
        match v {
            Value::Array(items) => {
                out.push(b'[');
                self.open.push(Open::Array(items.iter(), true));
            }
            Value::Object(fields) => {
                out.push(b'{');
                self.open.push(Open::Object(fields.iter(), true));
            }
            leaf => serde_json::to_writer(&mut *out, leaf)?,
        }
        Ok(())
    }
}

/// Whether `value`'s JSON is more than `bytes`, counted no further than
/// that (a writer that fails once more is written to it).
pub(crate) fn json_over(value: &(impl serde::Serialize + ?Sized), bytes: usize) -> bool {
    struct Budget(usize);
    impl std::io::Write for Budget {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.checked_sub(buf.len()).ok_or_else(|| std::io::Error::other("over"))?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Budget(bytes), value).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
                prop::collection::btree_map(".{0,6}", inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn parts_of_any_size_make_the_bytes_serde_json_writes(v in json(), part in 1usize..64) {
            let mut parts = Parts::new(&v);
            let mut all = Vec::new();
            loop {
                let mut out = Vec::new();
                let done = parts.fill(&mut out, part).unwrap();
                prop_assert!(done || out.len() >= part, "a part short of its size before the end");
                all.extend(out);
                if done {
                    break;
                }
            }
            prop_assert_eq!(all, serde_json::to_vec(&v).unwrap());
        }
    }

    #[test]
    fn a_value_written_whole_at_once_is_done() {
        for v in
            [serde_json::json!([]), serde_json::json!({}), serde_json::json!("s"), serde_json::json!({"a": [1, {}]})]
        {
            let mut out = Vec::new();
            assert!(Parts::new(&v).fill(&mut out, usize::MAX).unwrap());
            assert_eq!(out, serde_json::to_vec(&v).unwrap());
        }
    }
}
