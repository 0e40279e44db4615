//! A transaction whose `BEGIN` travels with its first statement.
//!
//! `tokio-postgres` pipelines requests: each is sent when its future is
//! first polled, and the server runs them in that order. Its own
//! `Client::transaction()` nevertheless waits for `BEGIN`'s answer before
//! the first statement can go, which costs every transaction a round trip
//! (0.15 ms on an idle box, a tenth of an idle engine transaction). Here
//! `BEGIN` is sent and not waited for: the first statement follows it on
//! the same connection and runs inside the transaction. `BEGIN` cannot
//! fail on a healthy connection (there is no transaction open: the last
//! one on this connection ended with a `COMMIT` or `ROLLBACK` queued ahead
//! of it), and on a broken one the first statement fails too.
//!
//! A transaction dropped before `commit` or `rollback` (an error, or a
//! caller that went away) queues a `ROLLBACK` the same way, as
//! `tokio-postgres`'s transaction does: the connection goes back to the
//! pool, and whatever uses it next runs after the rollback.
//!
//! Everything else a transaction does, it does through its connection
//! (`Deref` to [`Client`]): statements sent on it while the transaction is
//! open are in the transaction.

use std::ops::Deref;

use futures_util::FutureExt;

use crate::{Client, Result};

/// An open transaction (or savepoint) on a pooled connection.
pub struct Transaction<'a> {
    client: &'a Client,
    /// The savepoint this is, inside an outer transaction.
    savepoint: Option<String>,
    done: bool,
}

/// Opens a transaction on `client`; `BEGIN` goes out with the first
/// statement.
pub fn begin(client: &mut Client) -> Transaction<'_> {
    send_and_forget(client, "BEGIN");
    Transaction { client, savepoint: None, done: false }
}

/// Sends `sql` without waiting for its answer (which the connection then
/// drops): the request goes out when its future is first polled.
fn send_and_forget(client: &Client, sql: &str) {
    let _ = client.batch_execute(sql).now_or_never();
}

impl<'a> Transaction<'a> {
    /// Commits (or, for a savepoint, releases it into the outer
    /// transaction). Once sent, the `COMMIT` stands even if the caller goes
    /// away before its answer.
    pub async fn commit(mut self) -> Result<()> {
        self.done = true;
        let sql = match &self.savepoint {
            None => "COMMIT".to_string(),
            Some(name) => format!("RELEASE SAVEPOINT {name}"),
        };
        Ok(self.client.batch_execute(&sql).await?)
    }

    /// Rolls back (a savepoint: to where it began).
    pub async fn rollback(mut self) -> Result<()> {
        self.done = true;
        Ok(self.client.batch_execute(&rollback_sql(self.savepoint.as_deref())).await?)
    }

    /// A savepoint inside this transaction, itself committed (released) or
    /// rolled back as a transaction; dropped, it rolls back to where it
    /// began and the outer transaction goes on.
    pub async fn savepoint(&mut self, name: &str) -> Result<Transaction<'_>> {
        self.client.batch_execute(&format!("SAVEPOINT {name}")).await?;
        Ok(Transaction { client: self.client, savepoint: Some(name.to_string()), done: false })
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
            send_and_forget(self.client, &rollback_sql(self.savepoint.as_deref()));
        }
    }
}
