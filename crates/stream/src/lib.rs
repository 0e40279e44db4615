//! Redis Streams: the dispatch channel between the outbox and workers.
//!
//! Streams are named `<prefix>tasks:<queue>.<shard>` for priority 3, the
//! default, and `<prefix>tasks:<queue>~p<priority>.<shard>` for the others
//! (1 to 5); the shard count lives at `<prefix>stream_shards`, published by
//! coordinators. Only coordinators touch streams: they publish, and read for
//! their workers' polls.
//! One consumer group per stream. Redis holds no truth: losing a stream loses
//! messages, never runs (the coordinators' sweeps re-dispatch from PostgreSQL).
//! Each publish raises the publisher's mark on each stream it wrote to, after
//! the messages, so that a loss of the latest writes (a failover to a replica
//! behind, a restart from older data) shows as a mark gone back
//! ([`Streams::lost_writes`]) and is repaired at once.
//!
//! A Redis Cluster works too (`redis+cluster://host:port,host:port`, or
//! `rediss+cluster://` over TLS): every command names one stream, so it goes
//! to the node of that stream's slot; batches are split per stream; and the
//! weighted read goes stream by stream, since one XREADGROUP (or script)
//! cannot name streams of different slots.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, Value};

/// The consumer group every worker joins.
pub const GROUP: &str = "composer-workers";
/// The message field that carries the dispatch JSON.
pub const FIELD: &str = "task";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("invalid message {id} on {stream}: {reason}")]
    BadMessage { stream: String, id: String, reason: String },
    #[error("Redis CA file {0}")]
    Tls(String),
}

impl Error {
    /// The stream's consumer group is missing (Redis restarted without
    /// persistence, or the stream was deleted): create it and read again.
    pub fn is_no_group(&self) -> bool {
        matches!(self, Error::Redis(e) if e.code() == Some("NOGROUP"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names of keys under one prefix (tests give each their own).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into() }
    }

    /// The stream a task on `queue` at `priority` goes to: the one place
    /// stream names are made. Priority 3's keep the names streams had before
    /// priorities, so workers of either age serve it.
    pub fn stream(&self, queue: &str, priority: u8, shard: u32) -> String {
        match priority {
            composer_core::priority::DEFAULT => format!("{}tasks:{queue}.{shard}", self.prefix),
            p => format!("{}tasks:{queue}~p{p}.{shard}", self.prefix),
        }
    }

    /// Every stream of `queues`, each priority's and shard's.
    pub fn streams_of<'a>(&'a self, queues: impl IntoIterator<Item = &'a str> + 'a, shards: u32) -> Vec<String> {
        let mut names = Vec::new();
        for queue in queues {
            for priority in composer_core::priority::levels() {
                names.extend((0..shards).map(|shard| self.stream(queue, priority, shard)));
            }
        }
        names
    }

    /// The queue of a stream named by [`Keys::stream`].
    pub fn queue_of<'a>(&self, stream: &'a str) -> Option<&'a str> {
        let rest = stream.strip_prefix(&self.prefix)?.strip_prefix("tasks:")?;
        let (queue, _) = rest.rsplit_once('.')?;
        Some(queue.rsplit_once("~p").map_or(queue, |(q, _)| q))
    }

    /// The priority of a stream named by [`Keys::stream`].
    pub fn priority_of(&self, stream: &str) -> u8 {
        let queue = stream.rsplit_once('.').map_or(stream, |(q, _)| q);
        match queue.rsplit_once("~p").map(|(_, p)| p.parse::<u8>()) {
            Some(Ok(p)) if composer_core::priority::is_level(p.into()) => p,
            _ => composer_core::priority::DEFAULT,
        }
    }

    /// The mark `owner` keeps on `stream`: in the stream's hash slot (its
    /// whole name is the hash tag), so it lives on the stream's node.
    pub fn mark(&self, stream: &str, owner: &str) -> String {
        format!("{}mark:{{{stream}}}:{owner}", self.prefix)
    }

    /// The channel every publish is announced on (with the publisher's
    /// id), so that coordinators wake their waiting polls at once.
    pub fn wake_channel(&self) -> String {
        format!("{}published", self.prefix)
    }

    pub fn shard_count(&self) -> String {
        format!("{}stream_shards", self.prefix)
    }

    /// A key a coordinator sets and nothing deletes: when it is missing,
    /// Redis lost what it held (restarted without persistence, flushed) or
    /// is new, and with it any message not yet read.
    pub fn epoch(&self) -> String {
        format!("{}epoch", self.prefix)
    }
}

/// A message read from a stream.
#[derive(Debug, Clone)]
pub struct Message {
    pub stream: String,
    pub id: String,
    pub payload: String,
}

/// The shared, self-reconnecting connection: publishing, acks, metadata.
#[derive(Clone)]
pub struct Streams {
    conn: Conn,
    keys: Keys,
    marks: std::sync::Arc<Marks>,
    /// Where [`Streams::announced`] subscribes: the server, or each node of
    /// a cluster in turn (a cluster's PUBLISH reaches every node).
    subscribe_to: std::sync::Arc<Vec<redis::Client>>,
}

/// How long a mark is kept in Redis, and by this process once it stops
/// publishing to its stream.
const MARK_KEPT: Duration = Duration::from_secs(24 * 3600);
const MARK_FORGOTTEN: Duration = Duration::from_secs(3600);

/// The marks this process wrote: with each batch it publishes, a number on
/// each stream it published to, after the messages, in the same pipeline.
/// Redis applies (and replicates) a server's writes in order, so when a
/// mark is missing or older than the one written, Redis lost what came
/// after the mark it kept: messages among them (see [`Streams::lost_writes`]).
struct Marks {
    owner: String,
    next: std::sync::atomic::AtomicU64,
    /// An announcement of a publish failed (told once).
    announce_failed: std::sync::atomic::AtomicBool,
    written: std::sync::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>,
}

impl Marks {
    fn new() -> Marks {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Marks {
            owner: format!("{}-{}", std::process::id(), since.as_nanos()),
            next: std::sync::atomic::AtomicU64::new(1),
            announce_failed: Default::default(),
            written: Default::default(),
        }
    }
}

/// Sets a mark to a number unless it holds a greater one (two batches may
/// reach Redis out of the order their numbers were taken in).
const RAISE_MARK: &str = "local m = tonumber(redis.call('GET', KEYS[1]) or '0') \
    if m < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end return 0";

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

/// A connection to one server or to a cluster (which routes each command
/// by its key and follows the cluster through failovers and migrations).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The nodes of a `redis+cluster://a:1,b:2` (or `rediss+cluster://`) URL,
/// as node URLs; `None` for any other URL.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let node_scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    // Credentials, when given, are for every node: `redis+cluster://:pw@a:1,b:2`.
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let nodes: Vec<String> = hosts
        .trim_end_matches('/')
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{node_scheme}://{auth}{h}"))
        .collect();
    Some(nodes)
}

impl Streams {
    /// Connects, retrying in the background on loss. Fails only when the URL
    /// is invalid or Redis cannot be reached at all now.
    pub async fn connect(url: &str, keys: Keys) -> Result<Streams> {
        Streams::connect_with(url, keys, None).await
    }

    /// Like [`Streams::connect`]; a `rediss://` URL is checked against the
    /// CA in `ca_file` (PEM) instead of the system's roots.
    pub async fn connect_with(url: &str, keys: Keys, ca_file: Option<&std::path::Path>) -> Result<Streams> {
        let root_cert = match ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?),
            None => None,
        };
        if let Some(nodes) = cluster_nodes(url) {
            if nodes.is_empty() {
                return Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "a redis+cluster:// URL names no node",
                ))));
            }
            let mut builder = ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(5));
            if let Some(root_cert) = root_cert.clone() {
                builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) });
            }
            let client = builder.build()?;
            let conn = client.get_async_connection().await?;
            let marks = std::sync::Arc::new(Marks::new());
            let subscribe_to = nodes
                .iter()
                .map(|node| match &root_cert {
                    Some(root_cert) => redis::Client::build_with_tls(
                        node.as_str(),
                        redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert.clone()) },
                    ),
                    None => redis::Client::open(node.as_str()),
                })
                .collect::<redis::RedisResult<Vec<_>>>()?;
            let subscribe_to = std::sync::Arc::new(subscribe_to);
            return Ok(Streams { conn: Conn::Cluster(conn), keys, marks, subscribe_to });
        }
        let client = match ca_file {
            Some(path) => {
                let root_cert = std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
                )?
            }
            None => redis::Client::open(url)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        let marks = std::sync::Arc::new(Marks::new());
        Ok(Streams { conn: Conn::Single(conn), keys, marks, subscribe_to: std::sync::Arc::new(vec![client]) })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub async fn ping(&self) -> Result<()> {
        let mut c = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut c).await?;
        Ok(())
    }

    pub async fn publish_shard_count(&self, shards: u32) -> Result<()> {
        let mut c = self.conn.clone();
        let _: () = c.set(self.keys.shard_count(), shards).await?;
        Ok(())
    }

    pub async fn shard_count(&self) -> Result<Option<u32>> {
        let mut c = self.conn.clone();
        Ok(c.get(self.keys.shard_count()).await?)
    }

    /// Sets the [`Keys::epoch`] key when it is missing: true when this call
    /// set it, that is when Redis lost its messages since a coordinator
    /// last did (or is new). One caller of many gets true (`SET NX`).
    pub async fn claim_new_epoch(&self, id: &str) -> Result<bool> {
        let mut c = self.conn.clone();
        let set: Option<String> =
            redis::cmd("SET").arg(self.keys.epoch()).arg(id).arg("NX").query_async(&mut c).await?;
        Ok(set.is_some())
    }

    /// Deletes the epoch key this caller set, when it could not do what a new
    /// epoch asks (the next caller then will).
    pub async fn forget_epoch(&self) -> Result<()> {
        let mut c = self.conn.clone();
        let _: () = c.del(self.keys.epoch()).await?;
        Ok(())
    }

    /// XADDs every `(stream, payload)`: one pipeline, or on a cluster one
    /// per stream, all at once; all or error.
    /// Each stream's [`Marks`] mark is raised after its messages; then the
    /// publish is announced on [`Keys::wake_channel`], in the background.
    pub async fn publish(&self, batch: &[(&str, &str)]) -> Result<()> {
        let number = self.marks.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = &self.marks.owner;
        self.per_stream_then(
            batch,
            |pipe, stream, payload| {
                pipe.cmd("XADD").arg(stream).arg("*").arg(FIELD).arg(payload).ignore();
            },
            |pipe, stream| {
                pipe.cmd("EVAL")
                    .arg(RAISE_MARK)
                    .arg(1)
                    .arg(self.keys.mark(stream, owner))
                    .arg(number)
                    .arg(MARK_KEPT.as_secs())
                    .ignore();
            },
        )
        .await?;
        self.announce();
        let now = std::time::Instant::now();
        let mut written = self.marks.written.lock().unwrap_or_else(|p| p.into_inner());
        for (stream, _) in batch {
            let w = written.entry(stream.to_string()).or_insert((0, now));
            *w = (w.0.max(number), now);
        }
        Ok(())
    }

    /// Whether Redis lost writes of this process since its last look: a
    /// mark it raised on a stream is gone or lower than it raised it (a
    /// failover to a replica that lacked the latest writes, a restart from
    /// an older snapshot or AOF), so messages published before that mark
    /// may be gone too. A loss is told once.
    pub async fn lost_writes(&self) -> Result<bool> {
        let marks: Vec<(String, u64)> = {
            let mut written = self.marks.written.lock().unwrap_or_else(|p| p.into_inner());
            written.retain(|_, (_, at)| at.elapsed() < MARK_FORGOTTEN);
            written.iter().map(|(stream, (n, _))| (stream.clone(), *n)).collect()
        };
        if marks.is_empty() {
            return Ok(false);
        }
        let reads = marks.iter().map(|(stream, _)| {
            let mut c = self.conn.clone();
            let key = self.keys.mark(stream, &self.marks.owner);
            async move { c.get::<_, Option<u64>>(key).await }
        });
        let mut lost = false;
        for ((_, wrote), read) in marks.iter().zip(futures_util::future::join_all(reads).await) {
            lost |= read?.is_none_or(|kept| kept < *wrote);
        }
        if lost {
            self.marks.written.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        Ok(lost)
    }

    /// Sends one command per `(stream, arg)` built by `add`: in one pipeline
    /// on a single server; on a cluster, where a pipeline must stay within
    /// one slot, in one pipeline per stream, concurrently.
    async fn per_stream(&self, items: &[(&str, &str)], add: impl Fn(&mut redis::Pipeline, &str, &str)) -> Result<()> {
        self.per_stream_then(items, add, |_, _| {}).await
    }

    /// [`Streams::per_stream`], with `then` adding a command per stream
    /// after that stream's own.
    async fn per_stream_then(
        &self,
        items: &[(&str, &str)],
        add: impl Fn(&mut redis::Pipeline, &str, &str),
        then: impl Fn(&mut redis::Pipeline, &str),
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        match &self.conn {
            Conn::Single(_) => {
                let mut pipe = redis::pipe();
                let mut streams = std::collections::BTreeSet::new();
                for (stream, arg) in items {
                    add(&mut pipe, stream, arg);
                    streams.insert(*stream);
                }
                for stream in streams {
                    then(&mut pipe, stream);
                }
                let _: () = pipe.query_async(&mut self.conn.clone()).await?;
            }
            Conn::Cluster(_) => {
                let mut by_stream: std::collections::BTreeMap<&str, redis::Pipeline> = Default::default();
                for (stream, arg) in items {
                    add(by_stream.entry(stream).or_insert_with(redis::pipe), stream, arg);
                }
                for (stream, pipe) in by_stream.iter_mut() {
                    then(pipe, stream);
                }
                let sends = by_stream.into_values().map(|pipe| {
                    let mut c = self.conn.clone();
                    async move { pipe.query_async::<()>(&mut c).await }
                });
                for r in futures_util::future::join_all(sends).await {
                    r?;
                }
            }
        }
        Ok(())
    }

    /// Says on [`Keys::wake_channel`] that this one published: after the
    /// messages are on their streams, and apart from them, so that a failed
    /// announcement (a Redis user without access to channels) fails no
    /// publish; that failure is logged once.
    fn announce(&self) {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.keys.wake_channel()).arg(&self.marks.owner);
        let mut conn = self.conn.clone();
        let marks = self.marks.clone();
        tokio::spawn(async move {
            if let Err(e) = cmd.query_async::<()>(&mut conn).await {
                if !marks.announce_failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %e, "Redis: cannot announce publishes (PUBLISH); polls on other coordinators see them at their next idle read");
                }
            }
        });
    }

    /// Calls `announced` for each publish of another [`Streams`] (another
    /// coordinator) on the same keys, as it is announced; runs until
    /// dropped. Subscribes again after losing its connection (to the next
    /// node of a cluster): one second later, up to a minute while refused. Announcements are a hint: one
    /// lost while reconnecting is a publish its waiters see on their next read.
    pub async fn announced(&self, announced: impl Fn()) {
        use futures_util::StreamExt;
        let channel = self.keys.wake_channel();
        let mut node = 0usize;
        let mut pause = Duration::from_secs(1);
        loop {
            let client = &self.subscribe_to[node % self.subscribe_to.len()];
            node = node.wrapping_add(1);
            match client.get_async_pubsub().await {
                Ok(mut sub) => match sub.subscribe(&channel).await {
                    Ok(()) => {
                        pause = Duration::from_secs(1);
                        let mut messages = sub.on_message();
                        while let Some(msg) = messages.next().await {
                            if msg.get_payload::<String>().is_ok_and(|by| by != self.marks.owner) {
                                announced();
                            }
                        }
                        tracing::warn!("Redis: the subscription to publishes ended; subscribing again");
                    }
                    Err(e) => tracing::warn!(error = %e, "Redis: cannot subscribe to publishes"),
                },
                Err(e) => tracing::warn!(error = %e, "Redis: cannot connect to subscribe to publishes"),
            }
            tokio::time::sleep(pause).await;
            // A refusal that lasts (a user without channels) is retried, and logged, once a minute.
            pause = (pause * 2).min(Duration::from_secs(60));
        }
    }

    /// Creates the group on `stream` (and the stream) if missing. Reading
    /// from `0` means a group made after messages arrived still gets them.
    pub async fn ensure_group(&self, stream: &str) -> Result<()> {
        let mut c = self.conn.clone();
        let r: redis::RedisResult<()> = c.xgroup_create_mkstream(stream, GROUP, "0").await;
        match r {
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            other => Ok(other?),
        }
    }

    /// The consumers of our group on `stream`: each one's name, how long
    /// since it last read (ms), and its messages read and not acknowledged.
    /// None (no group yet) is an empty list.
    pub async fn consumers(&self, stream: &str) -> Result<Vec<(String, u64, u64)>> {
        let mut c = self.conn.clone();
        let r: redis::RedisResult<redis::streams::StreamInfoConsumersReply> = c.xinfo_consumers(stream, GROUP).await;
        match r {
            Ok(reply) => Ok(reply.consumers.into_iter().map(|c| (c.name, c.idle as u64, c.pending as u64)).collect()),
            Err(e) if e.code() == Some("NOGROUP") || e.to_string().contains("no such key") => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Acknowledges and deletes a handled message, so streams hold only
    /// undelivered and in-flight work.
    pub async fn ack(&self, stream: &str, id: &str) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("XACK").arg(stream).arg(GROUP).arg(id).ignore();
        pipe.cmd("XDEL").arg(stream).arg(id).ignore();
        let mut c = self.conn.clone();
        let _: () = pipe.query_async(&mut c).await?;
        Ok(())
    }

    /// Reads up to `count` new messages of one stream for consumer `name`,
    /// without blocking, on the shared connection (the task API's
    /// long-poll waits between reads instead).
    /// Claims for `name` up to `count` messages of `stream` that a consumer
    /// of the group read and has not acknowledged for `min_idle` (it died
    /// between reading and acknowledging), as XAUTOCLAIM does; none when the
    /// stream or its group is gone.
    pub async fn claim_stale(
        &self,
        name: &str,
        stream: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Message>> {
        let mut c = self.conn.clone();
        let opts = StreamAutoClaimOptions::default().count(count);
        let idle = min_idle.as_millis() as u64;
        let r: redis::RedisResult<StreamAutoClaimReply> =
            c.xautoclaim_options(stream, GROUP, name, idle, "0-0", opts).await;
        let reply = match r {
            Ok(reply) => reply,
            Err(e) if e.code() == Some("NOGROUP") => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        reply.claimed.into_iter().map(|e| to_message(stream, e.id, &e.map)).collect()
    }

    pub async fn read_now(&self, name: &str, stream: &str, count: usize) -> Result<Vec<Message>> {
        let opts = StreamReadOptions::default().group(GROUP, name).count(count);
        let mut c = self.conn.clone();
        let reply: Option<StreamReadReply> = c.xread_options(&[stream], &[">"], &opts).await?;
        messages_of(reply)
    }

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

    /// [`Streams::ack`] for many messages, pipelined.
    pub async fn ack_many(&self, messages: &[(&str, &str)]) -> Result<()> {
        self.per_stream(messages, |pipe, stream, id| {
            pipe.cmd("XACK").arg(stream).arg(GROUP).arg(id).ignore();
            pipe.cmd("XDEL").arg(stream).arg(id).ignore();
        })
        .await
    }
}

/// The messages of an XREADGROUP reply (none: nothing was new).
fn messages_of(reply: Option<StreamReadReply>) -> Result<Vec<Message>> {
    let mut out = Vec::new();
    for key in reply.map(|r| r.keys).unwrap_or_default() {
        for entry in key.ids {
            out.push(to_message(&key.key, entry.id, &entry.map)?);
        }
    }
    Ok(out)
}

fn to_message(stream: &str, id: String, map: &std::collections::HashMap<String, Value>) -> Result<Message> {
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

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

    #[test]
    fn cluster_urls_name_their_nodes_and_other_urls_are_not_clusters() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/"),
            Some(vec!["redis://10.0.0.1:7000".to_string(), "redis://10.0.0.2:7001".to_string()])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://:pw@a:1,b:2"),
            Some(vec!["rediss://:pw@a:1".to_string(), "rediss://:pw@b:2".to_string()])
        );
        assert_eq!(cluster_nodes("redis+cluster://"), Some(vec![]));
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379/"), None);
        assert_eq!(cluster_nodes("rediss://h:1"), None);
    }
}
