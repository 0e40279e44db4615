//! What can be stored and read back: PostgreSQL refuses a NUL character in
//! text and JSON, and our JSON readers stop at 128 levels of nesting. Every
//! value that enters (a run's input, an event's payload, a worker's output)
//! and every value the engine computes (an evaluated input, a TRANSFORM's
//! output, a run's output) is checked here, so that a bad value fails where
//! it appears, with its name, and never later as a write that cannot commit.

use serde_json::Value;

/// Largest run input, step output, event payload or HTTP response, in bytes
/// (`COMPOSER_MAX_PAYLOAD`'s default).
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// The key of a reference to a value kept as an object (offloaded): no
/// value from outside, nor any the engine computes, may use it, so that
/// only what storage wrote is ever read as one.
pub const OFFLOADED_KEY: &str = "$composer_offloaded";

/// About how many bytes of JSON `value` is — its strings and keys by their
/// length, each number as 8 — counted no further than `most`: `None` past
/// it. A walk that builds nothing, to bound what a conversion of `value`
/// costs before it starts.
pub fn size_up_to(value: &Value, most: usize) -> Option<usize> {
    fn walk(v: &Value, left: &mut usize) -> Option<()> {
        let here = match v {
            Value::Null | Value::Bool(_) => 5,
            Value::Number(_) => 8,
            Value::String(s) => s.len() + 2,
            Value::Array(items) => {
                *left = left.checked_sub(items.len() + 2)?;
                return items.iter().try_for_each(|item| walk(item, left));
            }
            Value::Object(map) => {
                *left = left.checked_sub(map.len() + 2)?;
                return map.iter().try_for_each(|(k, item)| {
                    *left = left.checked_sub(k.len() + 3)?;
                    walk(item, left)
                });
            }
        };
        *left = left.checked_sub(here)?;
        Some(())
    }
    let mut left = most;
    walk(value, &mut left)?;
    Some(most - left)
}

/// Whether `value` is a reference to a value kept as an object (an object
/// whose one key is [`OFFLOADED_KEY`]): only storage writes one.
pub fn is_reference(value: &Value) -> bool {
    value.as_object().is_some_and(|o| o.len() == 1 && o.contains_key(OFFLOADED_KEY))
}

/// Deepest nesting of a stored value (`max_depth`). Expressions see stored
/// values inside a context three levels deep, well within what JSON readers
/// accept (128).
pub const MAX_DEPTH: usize = 100;

/// Why a value cannot be stored, or `Ok`. `what` names the value in the
/// message; `max_bytes` bounds its size as JSON (`COMPOSER_MAX_PAYLOAD`).
pub fn check(value: &Value, what: &str, max_bytes: usize) -> Result<(), String> {
    if let Err(problem) = walk(value, 1) {
        return Err(format!("{what} {problem}"));
    }
    let mut size = Counter(0);
    // Writing into a counter cannot fail for a serde_json::Value.
    let _ = serde_json::to_writer(&mut size, value);
    if size.0 > max_bytes {
        return Err(format!("{what} exceeds the limit of {max_bytes} bytes (COMPOSER_MAX_PAYLOAD)"));
    }
    Ok(())
}

/// Why a text cannot be stored (a NUL character), or `Ok`.
pub fn check_text(text: &str, what: &str) -> Result<(), String> {
    if text.contains('\0') {
        return Err(format!("{what} contains a NUL character (\\u0000), which cannot be stored"));
    }
    Ok(())
}

fn walk(value: &Value, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("is nested deeper than the limit of {MAX_DEPTH} levels"));
    }
    let nul = || Err("contains a NUL character (\\u0000), which cannot be stored".to_string());
    match value {
        Value::String(s) if s.contains('\0') => nul(),
        Value::Array(items) => items.iter().try_for_each(|v| walk(v, depth + 1)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| match k.as_str() {
            k if k.contains('\0') => nul(),
            OFFLOADED_KEY => {
                Err(format!("uses the key {OFFLOADED_KEY:?}, which Composer keeps for its own references"))
            }
            _ => walk(v, depth + 1),
        }),
        _ => Ok(()),
    }
}

struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_characters_are_named_in_values_and_keys() {
        let e = check(&json!({"a": ["x\u{0}y"]}), "output", 1000).unwrap_err();
        assert!(e.starts_with("output contains a NUL"), "{e}");
        assert!(check(&json!({"k\u{0}": 1}), "input", 1000).is_err());
        assert!(check_text("a\u{0}", "event name").unwrap_err().contains("event name"));
        assert!(check(&json!({"fine": "text"}), "input", 1000).is_ok());
    }

    #[test]
    fn no_value_may_pass_for_a_reference_to_an_offloaded_one() {
        let forged = json!({"a": [{OFFLOADED_KEY: {"run": "x", "object": "y", "sha256": "z", "bytes": 1}}]});
        let e = check(&forged, "output", 1000).unwrap_err();
        assert!(e.starts_with("output uses the key \"$composer_offloaded\""), "{e}");
    }

    #[test]
    fn depth_and_size_are_bounded() {
        let mut deep = json!(1);
        for _ in 0..MAX_DEPTH {
            deep = json!([deep]);
        }
        assert!(check(&deep, "output", usize::MAX).unwrap_err().contains("nested deeper"));
        let e = check(&json!("x".repeat(100)), "output", 50).unwrap_err();
        assert!(e.contains("COMPOSER_MAX_PAYLOAD"), "{e}");
    }
}
