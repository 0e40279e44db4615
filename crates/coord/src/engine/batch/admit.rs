//! Phase 4: create the runs of the batch's starts (plain starts: no
//! idempotency key, no concurrency limit), set-based, as loaded runs the
//! write phase writes with the rest.

use super::super::admission::{self, NewRunOf};
use super::super::error::Result;
use super::super::queue::QueuedStart;
use super::super::store::Tx;
use super::Batch;

impl Batch<'_> {
    pub(super) async fn admit(&mut self, tx: &composer_store::Transaction<'_>, starts: &[QueuedStart]) -> Result<()> {
        let mut creating = Vec::with_capacity(starts.len());
        for QueuedStart { def, input, tags, traceparent, priority } in starts {
            let how = NewRunOf {
                tags: tags.as_ref(),
                traceparent: traceparent.as_deref(),
                priority: *priority,
                ..NewRunOf::of(def, input)
            };
            creating.push((self.engine.compile(def)?, how));
        }
        self.created.reserve(starts.len());
        for (row, loaded) in
            admission::create_runs(&Tx(tx, &self.engine.payloads), creating, self.engine.bounds).await?
        {
            if let Some(loaded) = loaded {
                self.runs.insert(row.id, loaded);
            }
            self.created.push(row);
        }
        Ok(())
    }
}
