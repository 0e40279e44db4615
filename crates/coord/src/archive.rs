//! Where a namespace's runs are archived (`COMPOSER_ARCHIVE_URL`), and an
//! archived run read back ([`Archive::read`]). What a run's record holds is
//! `http::archive::record_as_kept`, the same door the export goes through; writing
//! expired months there before retention drops them is [`crate::archiving`].
//!
//! A namespace's runs go to `<url>/<dir>/runs/<YYYY_MM>/` (parts and a
//! manifest, see `composer_archive`), by the month their id is of: `dir` is
//! `default`, or `NAME-ID` for another namespace. A run's offloaded values
//! stay references in its line; their objects are copied to the month's
//! `payloads/` beside it, under the names they had ([`Archive::payloads_in`]).

use composer_api::rest::{ArchivedRun, TaskView};
use composer_archive::payloads::Payloads;
use composer_archive::Store;
use uuid::Uuid;

/// Where a namespace's runs are archived, if anywhere.
#[derive(Clone, Default)]
pub struct Archive(Option<At>);

#[derive(Clone)]
struct At {
    store: Store,
    namespace: String,
}

/// Why an archive could not be opened, written or read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Archive(#[from] composer_archive::Error),
    #[error(transparent)]
    Store(#[from] composer_store::Error),
}

impl Archive {
    /// The archive of `namespace` at `url` (`COMPOSER_ARCHIVE_URL`), in its
    /// directory `dir` there, or none; `options` are S3 settings besides the
    /// environment's (`AWS_*` names).
    pub fn open(
        url: Option<&str>,
        options: &[(String, String)],
        dir: &str,
        namespace: &str,
    ) -> Result<Archive, composer_archive::Error> {
        let Some(url) = url else { return Ok(Archive(None)) };
        let store = Store::open_with(url, options)?.sub(dir);
        Ok(Archive(Some(At { store, namespace: namespace.to_string() })))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The namespace whose runs it keeps, and the directory of month
    /// `month`'s runs; `None` where no archive is set.
    pub fn month(&self, month: &str) -> Option<(&str, Store)> {
        let at = self.0.as_ref()?;
        Some((&at.namespace, at.store.sub(&format!("runs/{month}"))))
    }

    /// Where the archive of month directory `dir` keeps the copies of its
    /// runs' offloaded values (`<dir>/payloads/`, by the same names as
    /// where they were offloaded, so their references read them there).
    pub fn payloads_in(dir: &Store) -> Payloads {
        Payloads::new(dir.clone(), usize::MAX)
    }

    /// The archived run `id`, its offloaded values references to objects
    /// that the [`Payloads`] returned with it reads: `None` where no
    /// archive is set or it holds no such run.
    pub async fn read(&self, id: Uuid) -> Result<Option<(ArchivedRun, Payloads)>, composer_archive::Error> {
        let Some(month) = composer_archive::month_of(id) else { return Ok(None) };
        let Some((_, dir)) = self.month(&month) else { return Ok(None) };
        let run = composer_archive::read_run(&dir, id).await?;
        Ok(run.map(|run| (run, Archive::payloads_in(&dir))))
    }

    /// Up to `limit` items after index `after` of the MAP `node` of the
    /// archived run `id` (from its line, or from its item files a page at
    /// a time), with where their offloaded values are: `None` where the
    /// archive holds no such run, `Some(None)` where the run has no such
    /// MAP.
    pub async fn read_items(
        &self,
        id: Uuid,
        node: &str,
        after: i32,
        limit: usize,
    ) -> Result<Option<Option<(Vec<TaskView>, Payloads)>>, composer_archive::Error> {
        let Some(month) = composer_archive::month_of(id) else { return Ok(None) };
        let Some((_, dir)) = self.month(&month) else { return Ok(None) };
        let Some(mut run) = composer_archive::read_run(&dir, id).await? else { return Ok(None) };
        let items = match (run.items.remove(node), run.item_files.get(node)) {
            (Some(items), _) => {
                items.into_iter().filter(|t| t.item_index.is_some_and(|i| i > after)).take(limit).collect()
            }
            (None, Some(files)) => composer_archive::read_items(&dir, id, node, files, after, limit).await?,
            (None, None) => return Ok(Some(None)),
        };
        Ok(Some(Some((items, Archive::payloads_in(&dir)))))
    }
}
