//! The store's one error type: what failed, and whether retrying later
//! can help.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {}", detail(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("database unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("invalid database URL: {0}")]
    Config(String),
    #[error("inconsistent data: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Closed(String),
    /// Object storage (a value kept there, offloaded) could not be reached:
    /// retrying later can help. One it answered for and that is gone or
    /// altered is [`Error::Corrupt`].
    #[error("object storage: {0}")]
    Objects(String),
    /// A task the write read as PENDING was leased before it committed:
    /// what the write decided from that read may no longer hold (an
    /// at-most-once attempt retried while a worker sends it). The whole
    /// write rolls back; applied again, the event sees the lease.
    #[error("a task changed while the engine applied an event to it (a worker leased it); retry")]
    Moved,
}

/// The first error of statements sent together in one transaction, in the
/// order they were sent, that is not "current transaction is aborted"
/// (25P02): that one only says an earlier statement failed, and returned in
/// its place it would hide why (and be taken for a passing error).
pub(crate) fn first_cause<const N: usize>(results: [Result<(), Error>; N]) -> Result<(), Error> {
    let errors: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
    let aborted = |e: &Error| matches!(e, Error::Db(e) if e.code() == Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
    let at = errors.iter().position(|e| !aborted(e)).unwrap_or(0);
    match errors.into_iter().nth(at) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl Error {
    /// True when the database could not be reached (as opposed to a query
    /// that failed): callers answer 503 and retry later.
    pub fn is_unavailable(&self) -> bool {
        self.unavailable().is_some()
    }

    /// Why the database cannot do the work now, when it is not the work's
    /// fault: unreachable or closed (SQLSTATE classes 08, 57P), or out of a
    /// resource (class 53: its disk full, out of memory, no connection
    /// left); or object storage cannot be reached ([`Error::Objects`]).
    /// The work may succeed later, unchanged.
    pub fn unavailable(&self) -> Option<&'static str> {
        const AWAY: &str = "the database is unavailable";
        match self {
            Error::Objects(_) => Some("object storage is unavailable"),
            Error::Pool(_) => Some(AWAY),
            Error::Db(e) if e.is_closed() => Some(AWAY),
            Error::Db(e) => match e.code().map(|c| c.code()) {
                Some("53100") => Some("the database's disk is full"),
                Some("53200") => Some("the database is out of memory"),
                Some("53300") => Some("the database has no connection left"),
                // A statement sent in one pipeline behind one that failed
                // (a full disk, say) answers only that the transaction is
                // aborted: nothing was applied, and the cause is the other's.
                Some("25P02") => Some("the database aborted the transaction; nothing was applied"),
                Some(c) if c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") => Some(AWAY),
                Some(_) => None,
                // No SQLSTATE: the connection failed, or a value did not
                // convert (which is not the database being away).
                None => std::error::Error::source(e).is_none_or(|s| s.is::<std::io::Error>()).then_some(AWAY),
            },
            _ => None,
        }
    }
}

/// A driver error with what PostgreSQL said (its `Display` alone is "db error").
fn detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

impl Error {
    /// True when repeating the same work cannot succeed: data PostgreSQL
    /// refuses (class 22, e.g. a NUL in text), a constraint (23), a program
    /// limit (54), a stored value we cannot read back, or inconsistent data.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Corrupt(_) => true,
            Error::Db(e) if e.is_closed() => false,
            Error::Db(e) => match e.code() {
                Some(c) => ["22", "23", "54"].iter().any(|class| c.code().starts_with(class)),
                None => std::error::Error::source(e).is_some_and(|s| !s.is::<std::io::Error>()),
            },
            _ => false,
        }
    }
}

impl Error {
    /// True when PostgreSQL aborted the transaction to break a deadlock or
    /// a serialization conflict: the same work, tried again, can succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Db(e) if e.code().is_some_and(|c| matches!(c.code(), "40P01" | "40001")))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_storage_out_of_reach_is_unavailable_and_an_altered_object_is_not() {
        assert_eq!(Error::Objects("connection refused".into()).unavailable(), Some("object storage is unavailable"));
        assert_eq!(Error::Corrupt("an offloaded value: its SHA-256 is not the reference's".into()).unavailable(), None);
    }
}
