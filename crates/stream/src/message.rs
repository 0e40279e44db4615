//! A dispatch as it sits on a stream: the consumer group that reads it, the
//! field that carries it, and the message read back.

use redis::streams::StreamReadReply;
use redis::Value;

use crate::error::{Error, Result};

/// The consumer group every worker joins.
pub const GROUP: &str = "composer-workers";
/// The message field that carries the dispatch JSON.
pub const FIELD: &str = "task";

/// A message read from a stream.
#[derive(Debug, Clone)]
pub struct Message {
    pub stream: String,
    pub id: String,
    pub payload: String,
}

/// The messages of an XREADGROUP reply (none: nothing was new).
pub(crate) fn messages_of(reply: Option<StreamReadReply>) -> Result<Vec<Message>> {
    let mut out = Vec::new();
    for key in reply.map(|r| r.keys).unwrap_or_default() {
        for entry in key.ids {
            out.push(to_message(&key.key, entry.id, &entry.map)?);
        }
    }
    Ok(out)
}

/// The message `id` of `stream`, whose fields are `map`.
pub(crate) fn to_message(stream: &str, id: String, map: &std::collections::HashMap<String, Value>) -> Result<Message> {
    let payload = match map.get(FIELD) {
        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).map_err(|_| Error::BadMessage {
            stream: stream.to_string(),
            id: id.clone(),
            reason: "payload is not UTF-8".into(),
        })?,
        Some(Value::SimpleString(s)) => s.clone(),
        _ => return Err(Error::BadMessage { stream: stream.to_string(), id, reason: format!("no {FIELD:?} field") }),
    };
    Ok(Message { stream: stream.to_string(), id, payload })
}
