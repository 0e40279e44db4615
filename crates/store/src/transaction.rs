//! Transactions on a pooled connection, and one whose `BEGIN` travels with
//! its first statement.
//!
//! `tokio-postgres` pipelines requests: each is sent when its future is
//! first polled, and the server runs them in that order. [`begin`] waits
//! for `BEGIN`'s answer, as `Client::transaction()` does. The engine's
//! transaction, whose first statement is a read (the locked read of its
//! runs), saves that round trip (0.1 ms, a tenth of an idle engine
//! transaction) with [`begin_pipelined`]: `BEGIN` is sent, the read follows
//! it on the same connection, and [`Transaction::confirm`], called before
//! the first write, checks `BEGIN`'s answer, which came before the read's.
//! A `BEGIN` that failed (a cancel that lands on it) would otherwise leave
//! every later statement to commit on its own.
//!
//! A transaction dropped before `commit` or `rollback` (an error, or a
//! caller that went away) queues a `ROLLBACK` without waiting, as
//! `tokio-postgres`'s transaction does: the connection goes back to the
//! pool, and whatever uses it next runs after the rollback.
//!
//! Everything else a transaction does, it does through its connection
//! (`Deref` to [`Client`]): statements sent on it while the transaction is
//! open are in the transaction.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use futures_util::FutureExt;

use deadpool_postgres::Object as Client;

use crate::error::Result;

type Answer<'a> = Pin<Box<dyn Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send + 'a>>;

/// An open transaction (or savepoint) on a pooled connection.
pub struct Transaction<'a> {
    client: &'a Client,
    /// The savepoint this is, inside an outer transaction.
    savepoint: Option<&'static str>,
    /// `BEGIN`'s answer, not yet looked at ([`begin_pipelined`]); only
    /// ever reached through `&mut self` (the mutex makes the transaction
    /// `Sync`, as statements borrow it across awaits).
    begun: Mutex<Option<Answer<'a>>>,
    /// `BEGIN` failed: every later `confirm` (and `commit`) says so.
    failed: bool,
    done: bool,
    /// [`Transaction::allow_object_io`] raised its idle limit.
    object_io: std::sync::atomic::AtomicBool,
}

/// How long a transaction that reads or writes objects (offloaded values,
/// up to a gigabyte each) may sit idle between its statements, in place of
/// the session's `idle_in_transaction_session_timeout` (60 s): a value is
/// read or written while the transaction holds its run's lock, and storage
/// gives one such read or write a few minutes.
pub const OBJECT_IO_IDLE: &str = "10min";

/// Opens a transaction on `client`.
pub async fn begin(client: &mut Client) -> Result<Transaction<'_>> {
    client.batch_execute("BEGIN").await?;
    Ok(Transaction {
        client,
        savepoint: None,
        begun: Mutex::new(None),
        failed: false,
        done: false,
        object_io: Default::default(),
    })
}

/// Opens a transaction on `client` without waiting for `BEGIN`: the first
/// statement goes right behind it. Only for a transaction whose first
/// statements read: call [`Transaction::confirm`] before any write.
pub fn begin_pipelined(client: &mut Client) -> Transaction<'_> {
    let client: &Client = client;
    let mut answer: Answer<'_> = Box::pin(client.batch_execute("BEGIN"));
    // The first poll sends it; what it answers is looked at in `confirm`.
    let begun = match answer.as_mut().poll(&mut Context::from_waker(futures_util::task::noop_waker_ref())) {
        Poll::Ready(Ok(())) => None,
        Poll::Ready(Err(e)) => Some(Box::pin(std::future::ready(Err(e))) as Answer<'_>),
        Poll::Pending => Some(answer),
    };
    Transaction {
        client,
        savepoint: None,
        begun: Mutex::new(begun),
        failed: false,
        done: false,
        object_io: Default::default(),
    }
}

/// Sends `sql` without waiting for its answer (which the connection then
/// drops): the request goes out when its future is first polled.
fn send_and_forget(client: &Client, sql: &str) {
    let _ = client.batch_execute(sql).now_or_never();
}

impl<'a> Transaction<'a> {
    /// Whether `BEGIN` succeeded: an error if it did not, and then nothing
    /// must be written (the statements since ran outside a transaction).
    /// Once its answer is in, this waits for nothing. The answer is let go
    /// only once it is known, so a `confirm` abandoned half way leaves the
    /// check to the next one.
    pub async fn confirm(&mut self) -> Result<()> {
        if self.failed {
            return Err(crate::error::Error::Closed(
                "the transaction's BEGIN failed; nothing may be written in it".into(),
            ));
        }
        let begun = self.begun.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(answer) = begun.as_mut() else { return Ok(()) };
        let answered = answer.await;
        *begun = None;
        if answered.is_err() {
            self.failed = true;
        }
        Ok(answered?)
    }

    /// Commits (or, for a savepoint, releases it into the outer
    /// transaction). Once sent, the `COMMIT` stands even if the caller goes
    /// away before its answer.
    pub async fn commit(mut self) -> Result<()> {
        self.confirm().await?;
        self.done = true;
        let sql = match self.savepoint {
            None => "COMMIT".to_string(),
            Some(name) => format!("RELEASE SAVEPOINT {name}"),
        };
        Ok(self.client.batch_execute(&sql).await?)
    }

    /// Rolls back (a savepoint: to where it began).
    pub async fn rollback(mut self) -> Result<()> {
        self.done = true;
        Ok(self.client.batch_execute(&rollback_sql(self.savepoint)).await?)
    }

    /// A savepoint inside this transaction, itself committed (released) or
    /// rolled back as a transaction; dropped, it rolls back to where it
    /// began and the outer transaction goes on.
    pub async fn savepoint(&mut self, name: &'static str) -> Result<Transaction<'_>> {
        self.confirm().await?;
        self.client.batch_execute(&format!("SAVEPOINT {name}")).await?;
        Ok(Transaction {
            client: self.client,
            savepoint: Some(name),
            begun: Mutex::new(None),
            failed: false,
            done: false,
            object_io: Default::default(),
        })
    }

    /// Lets this transaction sit idle for up to [`OBJECT_IO_IDLE`] between
    /// statements from now to its end, once: before it reads or writes an
    /// object, which may take longer than the session allows an idle
    /// transaction. Only transactions that do pay the round trip.
    pub async fn allow_object_io(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if self.object_io.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let sql = format!("SET LOCAL idle_in_transaction_session_timeout = '{OBJECT_IO_IDLE}'");
        if let Err(e) = self.client.batch_execute(&sql).await {
            self.object_io.store(false, Ordering::Relaxed);
            return Err(e.into());
        }
        Ok(())
    }
}

fn rollback_sql(savepoint: Option<&str>) -> String {
    match savepoint {
        None => "ROLLBACK".to_string(),
        Some(name) => format!("ROLLBACK TO SAVEPOINT {name}"),
    }
}

impl Deref for Transaction<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            send_and_forget(self.client, &rollback_sql(self.savepoint));
        }
    }
}
