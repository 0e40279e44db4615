//! One LISTEN connection per coordinator. Notifications are wake-up hints
//! only: after every (re)connect the outbox re-polls and run waiters re-check,
//! because notifications sent while disconnected are lost.

use std::sync::Arc;
use std::time::Duration;

use composer_store::runs::{OUTBOX_CHANNEL, RUN_DONE_CHANNEL};
use futures_util::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Shared;

/// Tells long-polling requests that a run ended. `Uuid::nil()` means "the
/// listener reconnected: re-check whatever you wait for".
#[derive(Clone)]
pub struct RunWatch {
    tx: broadcast::Sender<Uuid>,
}

impl Default for RunWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RunWatch {
    pub fn new() -> RunWatch {
        RunWatch { tx: broadcast::channel(1024).0 }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.tx.subscribe()
    }

    pub fn notify(&self, run_id: Uuid) {
        let _ = self.tx.send(run_id);
    }
}

pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listen(&shared) => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "notification listener disconnected; reconnecting");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen(shared: &Shared) -> anyhow::Result<()> {
    let (client, mut connection) = tokio_postgres::connect(&shared.config.database_url, tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(msg) = messages.next().await {
            match msg {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send((n.channel().to_string(), n.payload().to_string())).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {OUTBOX_CHANNEL}; LISTEN {RUN_DONE_CHANNEL}")).await?;
    // Anything sent while we were not listening is lost: re-check now.
    shared.outbox_wake.notify_one();
    shared.runs.notify(Uuid::nil());
    while let Some((channel, payload)) = rx.recv().await {
        if channel == OUTBOX_CHANNEL {
            shared.outbox_wake.notify_one();
        } else if let Ok(run_id) = payload.parse::<Uuid>() {
            shared.runs.notify(run_id);
        }
    }
    drop(client);
    match driver.await {
        Ok(Ok(())) => anyhow::bail!("connection closed"),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}
