//! What the crate's calls fail with.

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
