//! Which definition a start names, for `POST /v1/runs`: a version asked for
//! by number from memory (versions never change once registered); the
//! latest version of a name read in batches. The starts that arrive while
//! one read is under way share the next read, which begins after each of
//! them arrived: a start still sees every version registered before it,
//! on any coordinator, and a thousand starts at once cost a handful of
//! queries rather than a thousand.

use std::collections::HashMap;
use std::sync::Mutex;

use composer_store::definitions::DefinitionRow;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Most starts one read of latest versions answers.
const MAX_BATCH: usize = 256;
/// Most definitions kept in memory; past it the memory is emptied.
pub const MAX_CACHED_DEFINITIONS: usize = 256;

type Answer = composer_store::Result<Option<DefinitionRow>>;

/// A start's ask for a name's latest version; answered `None` when the
/// batch's read failed, and the start then reads for itself (so that its
/// error is its own: the database away is a 503).
struct Ask {
    name: String,
    reply: oneshot::Sender<Option<Option<DefinitionRow>>>,
}

#[derive(Clone)]
pub struct Definitions {
    asks: mpsc::Sender<Ask>,
    kept: Kept,
}

/// Definitions by id, and the ids of names' numbered versions.
#[derive(Clone, Default)]
struct Kept(std::sync::Arc<Mutex<Memory>>);

#[derive(Default)]
struct Memory {
    by_id: HashMap<Uuid, DefinitionRow>,
    by_version: HashMap<(String, i32), Uuid>,
}

impl Kept {
    fn by_version(&self, name: &str, version: i32) -> Option<DefinitionRow> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.by_version.get(&(name.to_string(), version)).and_then(|id| m.by_id.get(id)).cloned()
    }

    fn by_id(&self, id: Uuid) -> Option<DefinitionRow> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).by_id.get(&id).cloned()
    }

    fn keep(&self, row: &DefinitionRow) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.by_id.len() >= MAX_CACHED_DEFINITIONS {
            *m = Memory::default();
        }
        m.by_version.insert((row.name.clone(), row.version), row.id);
        m.by_id.insert(row.id, row.clone());
    }
}

impl Definitions {
    /// Starts the reader of latest versions; it ends when every clone of
    /// this is dropped.
    pub fn new(pool: composer_store::Pool) -> Definitions {
        let (asks, rx) = mpsc::channel(4 * MAX_BATCH);
        let kept = Kept::default();
        crate::metrics::spawn(read_latest(pool, rx, kept.clone()));
        Definitions { asks, kept }
    }

    /// `name`'s `version`, or its latest without one; `None` when there is
    /// no such workflow or version.
    pub async fn get(&self, pool: &composer_store::Pool, name: &str, version: Option<i32>) -> Answer {
        match version {
            Some(v) => {
                if let Some(row) = self.kept.by_version(name, v) {
                    return Ok(Some(row));
                }
                let client = composer_store::client(pool).await?;
                let row = composer_store::definitions::by_name(&client, name, Some(v)).await?;
                if let Some(row) = &row {
                    self.kept.keep(row);
                }
                Ok(row)
            }
            None => {
                let (reply, answer) = oneshot::channel();
                if self.asks.send(Ask { name: name.to_string(), reply }).await.is_ok() {
                    if let Ok(Some(found)) = answer.await {
                        return Ok(found);
                    }
                }
                let client = composer_store::client(pool).await?;
                composer_store::definitions::by_name(&client, name, None).await
            }
        }
    }
}

/// Answers asks for latest versions, all those waiting in one read.
async fn read_latest(pool: composer_store::Pool, mut asks: mpsc::Receiver<Ask>, kept: Kept) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while asks.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut names: Vec<String> = batch.iter().map(|a| a.name.clone()).collect();
        names.sort();
        names.dedup();
        let found = latest(&pool, &names, &kept).await;
        if let Err(e) = &found {
            tracing::warn!(error = %e, starts = batch.len(), "reading latest versions failed; each start reads its own");
        }
        for ask in batch.drain(..) {
            let _ = ask.reply.send(found.as_ref().ok().map(|found| found.get(&ask.name).cloned()));
        }
    }
}

/// The latest version of each of `names` that exists: which version is
/// one read; what it says comes from memory, read only when not there.
async fn latest(
    pool: &composer_store::Pool,
    names: &[String],
    kept: &Kept,
) -> composer_store::Result<HashMap<String, DefinitionRow>> {
    let client = composer_store::client(pool).await?;
    let ids = composer_store::definitions::latest_ids(&client, names).await?;
    let missing: Vec<Uuid> = ids.iter().copied().filter(|id| kept.by_id(*id).is_none()).collect();
    for row in composer_store::definitions::by_ids(&client, &missing).await? {
        kept.keep(&row);
    }
    let mut found = HashMap::new();
    for id in ids {
        // Kept above, unless the memory was emptied meanwhile: then read it.
        let row = match kept.by_id(id) {
            Some(row) => row,
            None => match composer_store::definitions::by_id(&client, id).await? {
                Some(row) => row,
                None => continue,
            },
        };
        found.insert(row.name.clone(), row);
    }
    Ok(found)
}
