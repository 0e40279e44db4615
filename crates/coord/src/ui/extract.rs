//! What pages read from a query or a form: texts, ids, times as a browser's
//! `datetime-local` sends them, tags, reasons. Each refuses what does not
//! fit, with a message that names the field.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::{bad, UiError};

/// A query's parameters, by name (the last of a repeated one).
pub type Params = HashMap<String, String>;

/// A form's fields in order, repeated names kept (a box per run, per step).
pub struct Fields(Vec<(String, String)>);

impl Fields {
    /// The fields of a urlencoded body; an unreadable body has none.
    pub fn read(body: &[u8]) -> Fields {
        Fields(serde_urlencoded::from_bytes(body).unwrap_or_default())
    }

    /// The fields of a urlencoded body, or why it cannot be read.
    pub fn parse(body: &[u8]) -> Result<Fields, UiError> {
        serde_urlencoded::from_bytes(body).map(Fields).map_err(|e| bad(format!("form: {e}")))
    }

    /// The first value of `name`, or "".
    pub fn one(&self, name: &str) -> &str {
        self.0.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    }

    /// Every value of `name`, in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A text parameter, trimmed; "" when absent. Refused when it cannot be
/// stored (a NUL, too long).
pub fn text<'a>(q: &'a Params, key: &str) -> Result<&'a str, UiError> {
    let v = q.get(key).map(String::as_str).unwrap_or("").trim();
    composer_core::storable::check_text(v, key).map_err(bad)?;
    Ok(v)
}

/// A run id from a path or a form.
pub fn run_id(id: &str) -> Result<Uuid, UiError> {
    id.parse().map_err(|_| bad(format!("{id:?} is not a run id")))
}

/// The smallest UUIDv7 of a moment: run ids sort by creation, so a time
/// range is an id range.
pub fn id_at(t: DateTime<Utc>) -> Uuid {
    Uuid::from_u128((t.timestamp_millis().max(0) as u128) << 80)
}

/// A `datetime-local` value (`2026-11-01T10:00` or with seconds), read as UTC.
pub fn local_time(v: &str) -> Option<DateTime<Utc>> {
    ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(v.trim(), f).ok())
        .map(|t| t.and_utc())
}

/// A filter's time: none when blank, refused when not a time.
pub fn filter_time(v: &str) -> Result<Option<DateTime<Utc>>, UiError> {
    if v.is_empty() {
        return Ok(None);
    }
    local_time(v).map(Some).ok_or_else(|| bad(format!("{v:?} is not a time such as 2026-11-29T18:30")))
}

/// `customer=42, region=eu`, as a run filter's `{key: value}`.
pub fn tags(v: &str) -> Result<Option<serde_json::Value>, UiError> {
    let mut tags = serde_json::Map::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = pair.split_once('=').ok_or_else(|| bad(format!("tag {pair:?}: write key=value")))?;
        let (k, val) = (k.trim(), val.trim());
        if !composer_core::definition::is_tag_key(k) {
            return Err(bad(format!("tag {k:?}: a key is 1 to 64 of A-Z a-z 0-9 _ . -")));
        }
        tags.insert(k.to_string(), serde_json::Value::String(val.to_string()));
    }
    if tags.len() > composer_core::definition::MAX_TAGS {
        return Err(bad(format!("tag: at most {} pairs", composer_core::definition::MAX_TAGS)));
    }
    Ok((!tags.is_empty()).then_some(serde_json::Value::Object(tags)))
}

/// A reason typed in a form: at most `MAX_REASON_CHARS`, blank for none.
pub fn reason(r: &str) -> Result<Option<String>, UiError> {
    let r = r.trim();
    if r.chars().count() > crate::http::control::MAX_REASON_CHARS {
        return Err(bad("reason: at most 1,024 characters"));
    }
    composer_core::storable::check_text(r, "reason").map_err(bad)?;
    Ok((!r.is_empty()).then(|| r.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forms_time_is_read_as_utc_and_anything_else_is_refused() {
        let t = |v: &str| local_time(v).map(|t| t.to_rfc3339());
        assert_eq!(t("2026-11-01T10:00"), Some("2026-11-01T10:00:00+00:00".into()));
        assert_eq!(t("2026-11-01T10:00:30"), Some("2026-11-01T10:00:30+00:00".into()));
        for bad in ["", "yesterday", "2026-11-01", "2026-13-01T10:00", "2026-11-01T10:00Z\u{0}"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert!(matches!(filter_time(""), Ok(None)) && filter_time("yesterday").is_err());
    }

    #[test]
    fn a_forms_repeated_fields_are_all_kept() {
        let f = Fields::read(b"run=a&action=cancel&run=b");
        assert_eq!((f.one("action"), f.one("none")), ("cancel", ""));
        assert_eq!(f.all("run").collect::<Vec<_>>(), ["a", "b"]);
    }
}
