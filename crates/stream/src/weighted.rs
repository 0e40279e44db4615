//! The weighted read: one poll's messages taken from a queue's priorities
//! by the weighted share (`composer_core::priority::Share`), so higher
//! priorities come first and none starves. One script on a single server;
//! stream by stream on a cluster.

use redis::Value;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::message::{Message, FIELD, GROUP};
use crate::streams::Streams;

/// What [`Streams::read_weighted`] read.
#[derive(Debug, Default)]
pub struct Weighted {
    pub messages: Vec<Message>,
    /// The streams whose group is missing.
    pub missing: Vec<String>,
    /// Which priorities (level 1's first) may still have messages waiting
    /// after the read.
    pub waiting: [bool; 5],
}

impl Streams {
    /// Reads up to `count` new messages for consumer `name`, without
    /// blocking, from the streams of each priority (`levels[0]` priority
    /// 1's), one at a time from the priority `share` picks among those that
    /// still have messages, so a read is shared by weight as a worker's
    /// slots are; each priority's shards are read from `start` on. One round
    /// trip on a single server (a script); stream by stream on a cluster,
    /// whose streams live on different nodes. Also returns the streams whose
    /// group is missing, and which priorities still have messages waiting.
    pub async fn read_weighted(
        &self,
        name: &str,
        levels: &[Vec<String>; 5],
        count: usize,
        share: &mut composer_core::priority::Share,
        start: usize,
    ) -> Result<Weighted> {
        if matches!(self.conn, Conn::Cluster(_)) {
            return self.read_weighted_per_stream(name, levels, count, share, start).await;
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ_WEIGHTED).arg(levels.iter().map(Vec::len).sum::<usize>());
        for level in levels {
            cmd.arg(level);
        }
        cmd.arg(count).arg(GROUP).arg(name).arg(FIELD);
        let state = share.state();
        for (i, level) in levels.iter().enumerate() {
            cmd.arg(level.len()).arg(composer_core::priority::WEIGHTS[i]).arg(state[i]);
        }
        cmd.arg(start);
        let mut c = self.conn.clone();
        let (read, state) = read_weighted_reply(cmd.query_async(&mut c).await?)?;
        *share = composer_core::priority::Share::with_state(state);
        Ok(read)
    }

    /// [`Streams::read_weighted`] as separate reads, for a cluster: which
    /// priorities have messages is found by reading, so an empty priority
    /// takes part in the share until then, which favours the lower
    /// priorities a little; a priority not found empty counts as waiting.
    async fn read_weighted_per_stream(
        &self,
        name: &str,
        levels: &[Vec<String>; 5],
        count: usize,
        share: &mut composer_core::priority::Share,
        start: usize,
    ) -> Result<Weighted> {
        let (mut out, mut missing) = (Vec::new(), Vec::new());
        let mut empty: [bool; 5] = std::array::from_fn(|i| levels[i].is_empty());
        let mut turn = [start; 5];
        while out.len() < count {
            let waiting = |e: &[bool; 5], l: u8| !e[usize::from(l - composer_core::priority::HIGHEST)];
            let snapshot = empty;
            let Some(level) = share.next(|l| waiting(&snapshot, l)) else { break };
            let at = usize::from(level - composer_core::priority::HIGHEST);
            let streams = &levels[at];
            let mut got = false;
            for i in 0..streams.len() {
                let stream = &streams[(turn[at] + i) % streams.len()];
                match self.read_now(name, stream, 1).await {
                    Ok(mut messages) if !messages.is_empty() => {
                        out.append(&mut messages);
                        turn[at] += i + 1;
                        got = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.is_no_group() => missing.push(stream.clone()),
                    Err(e) => return Err(e),
                }
            }
            if !got {
                share.take_back(level, |l| waiting(&snapshot, l));
                empty[at] = true;
            }
        }
        // As the script does: a reader that found nothing is still listed
        // as a consumer of the default priority's streams (an XREADGROUP
        // that reads nothing makes none), so a worker fed only by hand-overs
        // and results shows on the queues page. Best effort, all at once.
        if out.is_empty() {
            let default = &levels[usize::from(composer_core::priority::DEFAULT - composer_core::priority::HIGHEST)];
            let creates = default.iter().map(|stream| {
                let mut c = self.conn.clone();
                let mut cmd = redis::cmd("XGROUP");
                cmd.arg("CREATECONSUMER").arg(stream).arg(GROUP).arg(name);
                async move { cmd.query_async::<Value>(&mut c).await }
            });
            let _ = futures_util::future::join_all(creates).await;
        }
        missing.sort();
        missing.dedup();
        Ok(Weighted { messages: out, missing, waiting: empty.map(|e| !e) })
    }
}

/// [`Streams::read_weighted`] on one server. First, which priorities have
/// messages not yet delivered to the group (a stream whose last entry is
/// past the group's last delivered one: XINFO, nothing read; a stream
/// without the group is named back, to have it made again); only those
/// take part in the share, so an empty priority earns no turns. Then each
/// read picks a priority by the weighted share (as
/// `composer_core::priority::Share::next` does, its state passed in and
/// back) and XREADGROUPs one message from that priority's streams, shard
/// after shard; a priority found empty after all is left out of the rest,
/// its pick taken back. (XREADGROUP without BLOCK may run
/// in a script.) `KEYS` are the streams, priority 1's first; `ARGV` the
/// count, group, consumer, field, then for each priority its stream count,
/// weight and share state, then the shard to start at. Last, which
/// priorities still have messages waiting after the reads (XINFO again,
/// for those not found empty). A read that found nothing makes the reader
/// a consumer of the default priority's streams if it is not one yet, so
/// a worker whose work all comes to its waiting polls or with its results
/// is still listed as a reader of its queues (its last read is its last
/// real one). Replies `{{{stream, id, payload or nil}, …},
/// {stream whose group is missing, …}, {share state, …}, {1 or 0 for each
/// priority}}`.
const READ_WEIGHTED: &str = "local want = tonumber(ARGV[1]) \
    local start = tonumber(ARGV[20]) \
    local function field(list, name) \
    for j = 1, #list, 2 do \
    if list[j] == name then return list[j + 1] end \
    end \
    return nil \
    end \
    local missing = {} \
    local function waiting(key) \
    local s = redis.pcall('XINFO', 'STREAM', key) \
    if type(s) ~= 'table' or s.err then return false end \
    local g = redis.pcall('XINFO', 'GROUPS', key) \
    if type(g) ~= 'table' or g.err then return false end \
    for _, group in ipairs(g) do \
    if field(group, 'name') == ARGV[2] then \
    return field(group, 'last-delivered-id') ~= field(s, 'last-generated-id') \
    end \
    end \
    missing[#missing + 1] = key \
    return false \
    end \
    local n, w, cur, first, empty, turn = {}, {}, {}, {}, {}, {} \
    local k = 1 \
    for l = 1, 5 do \
    local a = 4 + 3 * (l - 1) \
    n[l] = tonumber(ARGV[a + 1]) \
    w[l] = tonumber(ARGV[a + 2]) \
    cur[l] = tonumber(ARGV[a + 3]) \
    first[l] = k \
    k = k + n[l] \
    empty[l] = true \
    for i = 0, n[l] - 1 do \
    if waiting(KEYS[first[l] + i]) then empty[l] = false break end \
    end \
    turn[l] = start \
    end \
    local out = {} \
    while #out < want do \
    local total, best = 0, nil \
    for l = 1, 5 do \
    if not empty[l] then \
    cur[l] = cur[l] + w[l] \
    total = total + w[l] \
    if best == nil or cur[l] > cur[best] then best = l end \
    end \
    end \
    if best == nil then break end \
    cur[best] = cur[best] - total \
    local got = false \
    for i = 0, n[best] - 1 do \
    local key = KEYS[first[best] + (turn[best] + i) % n[best]] \
    local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', 1, 'STREAMS', key, '>') \
    if type(r) == 'table' and r.err then \
    missing[#missing + 1] = key \
    elseif r and r[1] and r[1][2][1] then \
    local e = r[1][2][1] \
    local payload = field(e[2], ARGV[4]) or false \
    out[#out + 1] = {key, e[1], payload} \
    turn[best] = turn[best] + i + 1 \
    got = true \
    break \
    end \
    end \
    if not got then \
    for l = 1, 5 do \
    if not empty[l] then cur[l] = cur[l] - w[l] end \
    end \
    cur[best] = cur[best] + total \
    empty[best] = true \
    end \
    end \
    if #out == 0 then \
    for i = 0, n[3] - 1 do \
    redis.pcall('XGROUP', 'CREATECONSUMER', KEYS[first[3] + i], ARGV[2], ARGV[3]) \
    end \
    end \
    local left = {} \
    for l = 1, 5 do \
    left[l] = 0 \
    if not empty[l] then \
    for i = 0, n[l] - 1 do \
    if waiting(KEYS[first[l] + i]) then left[l] = 1 break end \
    end \
    end \
    end \
    return {out, missing, cur, left}";

/// Parses [`READ_WEIGHTED`]'s reply.
fn read_weighted_reply(reply: Value) -> Result<(Weighted, [i64; 5])> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let bad = |reason: &str| Error::BadMessage { stream: "(several)".into(), id: "-".into(), reason: reason.into() };
    let Value::Array(parts) = reply else { return Err(bad("the read script answered no list")) };
    let [read, missing, state, left] =
        <[Value; 4]>::try_from(parts).map_err(|_| bad("the read script answered no four lists"))?;
    let (Value::Array(read), Value::Array(missing), Value::Array(state), Value::Array(left)) =
        (read, missing, state, left)
    else {
        return Err(bad("the read script answered no lists"));
    };
    let mut waiting = [false; 5];
    for (slot, v) in waiting.iter_mut().zip(&left) {
        *slot = matches!(v, Value::Int(1));
    }
    let mut share = [0i64; 5];
    for (slot, v) in share.iter_mut().zip(&state) {
        *slot = match v {
            Value::Int(i) => *i,
            _ => return Err(bad("the read script answered a share state that is not numbers")),
        };
    }
    let mut out = Vec::with_capacity(read.len());
    for entry in read {
        let Value::Array(fields) = entry else { return Err(bad("a read entry is not a list")) };
        let stream = fields.first().and_then(text).ok_or_else(|| bad("a read entry names no stream"))?;
        let id = fields.get(1).and_then(text).ok_or_else(|| bad("a read entry has no id"))?;
        // A message without its field reads as an empty payload, which no
        // reader parses: it is dropped and acknowledged like any malformed one.
        let payload = fields.get(2).and_then(text).unwrap_or_default();
        out.push(Message { stream, id, payload });
    }
    let mut missing: Vec<String> = missing.iter().filter_map(text).collect();
    missing.sort();
    missing.dedup();
    Ok((Weighted { messages: out, missing, waiting }, share))
}
