//! The names of the crate's Redis keys under one prefix: the one place
//! stream names are made, and read back into queue and priority.

/// Names of keys under one prefix (tests give each their own).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into() }
    }

    /// The key counting the starts of unix second `second` (`starts_per_second`).
    pub fn starts(&self, second: i64) -> String {
        format!("{}starts:{second}", self.prefix)
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
