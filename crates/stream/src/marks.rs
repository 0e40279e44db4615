//! The marks that show Redis lost writes: with each batch this process
//! publishes, a number raised on each stream it published to, after the
//! messages, in the same pipeline. Redis applies (and replicates) a
//! server's writes in order, so when a mark is missing or older than the
//! one written, Redis lost what came after the mark it kept: messages
//! among them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::conn::Conn;
use crate::error::Result;
use crate::keys::Keys;

/// How long a mark is kept in Redis, and by this process once it stops
/// publishing to its stream.
const MARK_KEPT: Duration = Duration::from_secs(24 * 3600);
const MARK_FORGOTTEN: Duration = Duration::from_secs(3600);

/// Sets a mark to a number unless it holds a greater one (two batches may
/// reach Redis out of the order their numbers were taken in).
const RAISE_MARK: &str = "local m = tonumber(redis.call('GET', KEYS[1]) or '0') \
    if m < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end return 0";

/// The marks this process wrote (see [`crate::Streams::lost_writes`]).
pub(crate) struct Marks {
    /// Who this process is, on its marks and its announcements of publishes.
    pub(crate) owner: String,
    next: AtomicU64,
    written: Mutex<HashMap<String, (u64, Instant)>>,
}

impl Marks {
    pub(crate) fn new() -> Marks {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Marks {
            owner: format!("{}-{}", std::process::id(), since.as_nanos()),
            next: AtomicU64::new(1),
            written: Default::default(),
        }
    }

    /// The number the next batch raises its streams' marks to.
    pub(crate) fn next_number(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds to `pipe` the raise of this process's mark on `stream` to `number`.
    pub(crate) fn raise(&self, pipe: &mut redis::Pipeline, keys: &Keys, stream: &str, number: u64) {
        pipe.cmd("EVAL")
            .arg(RAISE_MARK)
            .arg(1)
            .arg(keys.mark(stream, &self.owner))
            .arg(number)
            .arg(MARK_KEPT.as_secs())
            .ignore();
    }

    /// Remembers that the marks of `streams` were raised to `number`.
    pub(crate) fn wrote<'a>(&self, streams: impl IntoIterator<Item = &'a str>, number: u64) {
        let now = Instant::now();
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        for stream in streams {
            let w = written.entry(stream.to_string()).or_insert((0, now));
            *w = (w.0.max(number), now);
        }
    }

    /// Whether a mark this process raised is gone from Redis or lower than
    /// it raised it. A loss is told once: the marks are forgotten with it.
    pub(crate) async fn lost(&self, conn: &Conn, keys: &Keys) -> Result<bool> {
        let marks: Vec<(String, u64)> = {
            let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
            written.retain(|_, (_, at)| at.elapsed() < MARK_FORGOTTEN);
            written.iter().map(|(stream, (n, _))| (stream.clone(), *n)).collect()
        };
        if marks.is_empty() {
            return Ok(false);
        }
        let reads = marks.iter().map(|(stream, _)| {
            let mut c = conn.clone();
            let key = keys.mark(stream, &self.owner);
            async move { c.get::<_, Option<u64>>(key).await }
        });
        let mut lost = false;
        for ((_, wrote), read) in marks.iter().zip(futures_util::future::join_all(reads).await) {
            lost |= read?.is_none_or(|kept| kept < *wrote);
        }
        if lost {
            self.written.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        Ok(lost)
    }
}
