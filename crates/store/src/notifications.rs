//! LISTEN/NOTIFY: one dedicated connection that listens on channels and
//! hands notifications over as they arrive. Notifications are wake-up hints
//! only: one sent while no listener was connected is lost, so a caller
//! re-checks whatever it waits for after each (re)connect.

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::{Error, Result};

/// One notification: its channel and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub channel: String,
    pub payload: String,
}

/// A listening connection. [`Listener::recv`] returns `None` once the
/// connection is gone; reconnecting is the caller's choice.
pub struct Listener {
    // Kept so the session (and its LISTENs) stays open.
    _client: tokio_postgres::Client,
    rx: mpsc::UnboundedReceiver<Notification>,
    driver: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl Listener {
    /// Connects to `url` and listens on `channels` (our own constants, never
    /// user input: LISTEN takes no parameters).
    pub async fn connect(url: &str, channels: &[&str]) -> Result<Listener> {
        let crate::tls::Target { config, tls } = crate::tls::parse(url)?;
        let (client, mut connection) = config.connect(tls).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(msg) = messages.next().await {
                if let AsyncMessage::Notification(n) = msg? {
                    let n = Notification { channel: n.channel().to_string(), payload: n.payload().to_string() };
                    if tx.send(n).is_err() {
                        break;
                    }
                }
            }
            Ok(())
        });
        let listen: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
        client.batch_execute(&listen).await?;
        Ok(Listener { _client: client, rx, driver })
    }

    /// The next notification, or `None` when the connection closed.
    pub async fn recv(&mut self) -> Option<Notification> {
        self.rx.recv().await
    }

    /// Why the connection ended, once [`Listener::recv`] returned `None`.
    pub async fn closed(self) -> Error {
        match self.driver.await {
            Ok(Err(e)) => Error::Db(e),
            Ok(Ok(())) => Error::Closed("the notification connection closed".into()),
            Err(e) => Error::Closed(format!("the notification driver stopped: {e}")),
        }
    }
}
