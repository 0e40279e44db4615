//! Runs kept as objects: an archive (the months retention drops, written
//! before their rows go) and an export (the runs a filter matches, live or
//! ended) are one format, written and read here.
//!
//! A directory holds `part-00000.jsonl.gz`, `part-00001.jsonl.gz`, … (each a
//! gzip of JSON Lines, one [`ArchivedRun`] per line, runs in id order) and
//! `manifest.json`, written last: a directory without a manifest is a write
//! that did not finish, and is written again whole.
//!
//! - [`Store`]: where the objects are: a local directory or S3-compatible
//!   storage, through one interface (`object_store`), so `composer dev`'s
//!   directory and production's bucket take the same code path.
//! - [`Writer`]: appends runs, cuts parts, writes the manifest.
//! - [`read_run`], [`read_all`]: one run by id, or every run.
//! - `items`: what a large MAP's item files hold, beside its run's line;
//!   [`read_items`] reads them a page at a time.
//! - [`payloads`]: values too large for their rows, kept as objects;
//!   `parts`: a value's JSON made a part at a time, for their writes.

mod items;
mod parts;
pub mod payloads;

pub use items::{ITEMS_PER_FILE, ITEM_FILE_BYTES};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use uuid::Uuid;

use composer_api::rest::{ArchivedRun, ItemFile, Manifest, ManifestPart, TaskView};
use composer_api::rest::{ARCHIVE_FORMAT, ARCHIVE_FORMATS_READ, ITEMS_IN_LINE, ITEMS_IN_LINE_BYTES};

/// Most runs in one part.
pub const PART_RUNS: u64 = 1000;

/// Most bytes of JSON Lines in one part before it is compressed: a part is
/// built in memory, so this bounds what a writer holds.
pub const PART_BYTES: usize = 64 << 20;

/// The largest run one line may hold, in bytes of JSON: a writer refuses a
/// larger one (its month is kept, and the error says which run), so that
/// every part it writes stays under what a reader takes. An archive's
/// offloaded values are references in its lines, their objects copied
/// beside the parts (`payloads/`), and a large MAP's items are in files of
/// their own (`items/`), so neither counts.
pub const MAX_RUN_BYTES: usize = 512 << 20;

/// The most a reader inflates one part to, or reads of one object: a
/// tampered or corrupt object cannot make a reader hold more. A part the
/// writer made is at most [`PART_BYTES`] plus one run of [`MAX_RUN_BYTES`].
pub const MAX_READ_BYTES: u64 = 1 << 30;

/// The manifest's name in its directory.
pub const MANIFEST: &str = "manifest.json";

/// What went wrong reading or writing an archive.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("archive location {0}")]
    Location(String),
    #[error("object storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("archive {file}: {problem}")]
    Format { file: String, problem: String },
}

impl Error {
    /// Whether the object asked for is not there.
    pub fn is_missing(&self) -> bool {
        matches!(self, Error::Store(object_store::Error::NotFound { .. }))
    }
}

/// A directory of objects: a local one, or a prefix of an S3 bucket.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    dir: Path,
    /// Where it is, to name in messages: no credentials are ever in it.
    shown: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Store {
    /// Opens `location`: `s3://bucket/prefix` (its credentials, region and
    /// endpoint from the standard `AWS_*` environment variables, never from
    /// the location), `file:///dir`, or a local directory's path (made if
    /// missing).
    pub fn open(location: &str) -> Result<Store, Error> {
        Store::open_with(location, &[])
    }

    /// [`Store::open`], with S3 settings besides the environment's, by their
    /// `AWS_*` names (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, …): these win.
    pub fn open_with(location: &str, options: &[(String, String)]) -> Result<Store, Error> {
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() || location.contains(['?', '#', '@']) {
                // Not echoed: what is refused may hold a credential.
                return Err(Error::Location(
                    "is not s3://BUCKET/PREFIX (no credentials, query or fragment in it: credentials come from the \
                     AWS_* variables)"
                        .into(),
                ));
            }
            let mut s3 = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            for (name, value) in options {
                let key = name
                    .to_ascii_lowercase()
                    .parse()
                    .map_err(|_| Error::Location(format!("{name}: not an S3 setting")))?;
                s3 = s3.with_config(key, value);
            }
            let s3 = s3.build()?;
            return Ok(Store { objects: Arc::new(s3), dir: Path::from(prefix), shown: location.to_string() });
        }
        let dir = match location.strip_prefix("file://") {
            Some(path) => path,
            None if location.contains("://") => {
                return Err(Error::Location("is not a directory, file:///DIR or s3://BUCKET/PREFIX".into()))
            }
            None => location,
        };
        if dir.is_empty() {
            return Err(Error::Location("is empty: expected a directory, file:///DIR or s3://BUCKET/PREFIX".into()));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::Location(format!("{dir}: {e}")))?;
        let local = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
        Ok(Store { objects: Arc::new(local), dir: Path::default(), shown: location.to_string() })
    }

    /// The directory `name` below this one (one segment per `/`).
    pub fn sub(&self, name: &str) -> Store {
        let mut dir = self.dir.clone();
        for segment in name.split('/').filter(|s| !s.is_empty()) {
            dir = dir.child(segment);
        }
        Store { objects: self.objects.clone(), dir, shown: format!("{}/{name}", self.shown.trim_end_matches('/')) }
    }

    async fn put(&self, file: &str, bytes: Vec<u8>) -> Result<(), Error> {
        self.objects.put(&self.dir.child(file), PutPayload::from(bytes)).await?;
        Ok(())
    }

    /// Deletes the object `file`, if there is one.
    async fn delete(&self, file: &str) -> Result<(), Error> {
        match self.objects.delete(&self.dir.child(file)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every object under the directory `dir` of this one but
    /// those `keep` names (from this directory): one listing.
    async fn delete_all_but(&self, dir: &str, keep: &std::collections::HashSet<String>) -> Result<(), Error> {
        use futures_util::TryStreamExt;
        let listed: Vec<object_store::ObjectMeta> = self.objects.list(Some(&self.sub(dir).dir)).try_collect().await?;
        for meta in listed {
            let name = meta.location.prefix_match(&self.dir).map(|parts| parts.map(|p| p.as_ref().to_string()));
            if name.is_some_and(|parts| keep.contains(&parts.collect::<Vec<_>>().join("/"))) {
                continue;
            }
            match self.objects.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The object `file`, or `None` where there is none.
    async fn get(&self, file: &str) -> Result<Option<Vec<u8>>, Error> {
        let got = match self.objects.get(&self.dir.child(file)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if got.meta.size > MAX_READ_BYTES {
            return Err(self.format(file, format!("{} bytes, over the {MAX_READ_BYTES} a reader takes", got.meta.size)));
        }
        Ok(Some(got.bytes().await?.to_vec()))
    }

    fn format(&self, file: &str, problem: impl Into<String>) -> Error {
        Error::Format { file: format!("{}/{file}", self.shown.trim_end_matches('/')), problem: problem.into() }
    }
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The month a run is of (`YYYY_MM`, as its partition is named): its
/// UUIDv7's time.
pub fn month_of(id: Uuid) -> Option<String> {
    let (secs, _) = id.get_timestamp()?.to_unix();
    let at = DateTime::<Utc>::from_timestamp(secs as i64, 0)?;
    Some(at.format("%Y_%m").to_string())
}

/// Writes runs into parts, then the manifest.
pub struct Writer {
    store: Store,
    namespace: String,
    selection: serde_json::Value,
    parts: Vec<ManifestPart>,
    part: Vec<u8>,
    part_runs: u64,
    /// The first run of the part being built.
    first: Option<Uuid>,
    /// The last run added, to any part.
    last: Option<Uuid>,
    /// Where its runs' offloaded values are, if its lines hold references.
    payloads: Option<String>,
    /// The item files it wrote ([`ArchivedRun::item_files`]).
    item_files: std::collections::HashSet<String>,
}

impl Writer {
    /// A writer into `store`, of `namespace`'s runs chosen by `selection`.
    pub fn new(store: Store, namespace: &str, selection: serde_json::Value) -> Writer {
        Writer {
            store,
            namespace: namespace.to_string(),
            selection,
            parts: Vec::new(),
            part: Vec::new(),
            part_runs: 0,
            first: None,
            last: None,
            payloads: None,
            item_files: Default::default(),
        }
    }

    /// A writer whose lines hold references to the values kept under
    /// `dir` beside the manifest, which says so ([`Manifest::payloads`]).
    pub fn with_payloads(mut self, dir: &str) -> Writer {
        self.payloads = Some(dir.to_string());
        self
    }

    /// Appends `run`; runs come in id order. A full part is written at once.
    pub async fn add(&mut self, run: &ArchivedRun) -> Result<(), Error> {
        let id = run.run.id;
        if let Some(last) = self.last.filter(|last| id <= *last) {
            return Err(self.store.format("part", format!("run {id} after {last}: runs go in id order")));
        }
        if !run.item_files.is_empty() {
            return Err(self.store.format("part", format!("run {id} names item files of another archive")));
        }
        if self.last.is_none() {
            // A manifest left by an earlier write would describe parts this
            // one overwrites: it goes first, so the directory is unfinished
            // until this write's own manifest.
            self.store.delete(MANIFEST).await?;
        }
        // A large MAP's items go to files of their own first, so that no
        // line names a file not yet written.
        let files = self.write_items(run).await?;
        let line = match files.is_empty() {
            true => serde_json::to_vec(run),
            false => serde_json::to_vec(&items::Line::of(run, &files)),
        };
        let line = line.map_err(|e| self.store.format("part", e.to_string()))?;
        if line.len() > MAX_RUN_BYTES {
            let problem = format!("run {id} is {} bytes of JSON, over the {MAX_RUN_BYTES} a run may be", line.len());
            return Err(self.store.format("part", problem));
        }
        self.part.extend_from_slice(&line);
        self.part.push(b'\n');
        self.first.get_or_insert(id);
        self.last = Some(id);
        self.part_runs += 1;
        if self.part_runs >= PART_RUNS || self.part.len() >= PART_BYTES {
            self.cut().await?;
        }
        Ok(())
    }

    /// Writes the items of each of `run`'s MAPs of more than
    /// [`ITEMS_IN_LINE`] to item files; the files, by the MAP's node id
    /// (empty when every MAP's items fit in the line).
    async fn write_items(&mut self, run: &ArchivedRun) -> Result<BTreeMap<String, Vec<ItemFile>>, Error> {
        let id = run.run.id;
        let mut written = BTreeMap::new();
        let apart = |all: &[TaskView]| all.len() > ITEMS_IN_LINE || parts::json_over(all, ITEMS_IN_LINE_BYTES);
        for (k, (node, all)) in run.items.iter().enumerate().filter(|(_, (_, all))| apart(all)) {
            let (mut files, mut from) = (Vec::new(), 0);
            while from < all.len() {
                let (text, file, next) = items::next_file(id, (k, files.len()), all, from)
                    .map_err(|e| self.store.format(&items::dir_of(id), e))?;
                let zipped = gzip(text).await.map_err(|e| self.store.format(&file.file, e))?;
                let (dir, name) = file.file.rsplit_once('/').unwrap_or(("", &file.file));
                self.store.sub(dir).put(name, zipped).await?;
                files.push(file);
                from = next;
            }
            written.insert(node.clone(), files);
        }
        self.item_files.extend(written.values().flatten().map(|f| f.file.clone()));
        Ok(written)
    }

    /// Writes the part being built, if it holds any run.
    async fn cut(&mut self) -> Result<(), Error> {
        let Some(first) = self.first.take() else { return Ok(()) };
        let file = format!("part-{:05}.jsonl.gz", self.parts.len());
        let json = std::mem::take(&mut self.part);
        let zipped = gzip(json).await.map_err(|e| self.store.format(&file, e))?;
        let bytes = zipped.len() as u64;
        self.store.put(&file, zipped).await?;
        let last = self.last.unwrap_or(first);
        self.parts.push(ManifestPart { file, runs: self.part_runs, first, last, bytes });
        self.part_runs = 0;
        Ok(())
    }

    /// Writes the last part and the manifest, which makes the directory whole.
    pub async fn finish(mut self, written_at: DateTime<Utc>) -> Result<Manifest, Error> {
        if self.last.is_none() {
            self.store.delete(MANIFEST).await?;
        }
        self.cut().await?;
        // Item files an earlier write here left (a pass retried, an export
        // into the same place) that this one did not write: one listing.
        self.store.delete_all_but(items::DIR, &self.item_files).await?;
        let manifest = Manifest {
            format: ARCHIVE_FORMAT.to_string(),
            namespace: self.namespace,
            written_at,
            selection: self.selection,
            runs: self.parts.iter().map(|p| p.runs).sum(),
            parts: self.parts,
            payloads: self.payloads,
        };
        let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| self.store.format(MANIFEST, e.to_string()))?;
        self.store.put(MANIFEST, bytes).await?;
        Ok(manifest)
    }
}

/// The manifest of `store`'s directory, or `None` where none was written
/// (nothing there, or a write that did not finish).
pub async fn manifest(store: &Store) -> Result<Option<Manifest>, Error> {
    let Some(bytes) = store.get(MANIFEST).await? else { return Ok(None) };
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| store.format(MANIFEST, e.to_string()))?;
    if !ARCHIVE_FORMATS_READ.contains(&manifest.format.as_str()) {
        let problem = format!("format {:?}, expected one of {ARCHIVE_FORMATS_READ:?}", manifest.format);
        return Err(store.format(MANIFEST, problem));
    }
    Ok(Some(manifest))
}

/// The run `id` of `store`'s directory, or `None` where it holds no such run.
/// Only that run's line is read whole; the others only as far as their id.
pub async fn read_run(store: &Store, id: Uuid) -> Result<Option<ArchivedRun>, Error> {
    let Some(manifest) = manifest(store).await? else { return Ok(None) };
    let Some(part) = manifest.parts.iter().find(|p| p.first <= id && id <= p.last) else { return Ok(None) };
    let lines = part_lines(store, part).await?;
    let (file, at) = (part.file.clone(), store.clone());
    let found = tokio::task::spawn_blocking(move || {
        for (n, line) in lines.lines().enumerate() {
            let bad = |e: serde_json::Error| at.format(&file, format!("line {}: {e}", n + 1));
            let head: Head = serde_json::from_str(line).map_err(bad)?;
            if head.run.id == id {
                return serde_json::from_str(line).map(Some).map_err(bad);
            }
            if head.run.id > id {
                break;
            }
        }
        Ok(None)
    });
    found.await.map_err(|e| store.format(&part.file, e.to_string()))?
}

/// A line read only as far as its run's id.
#[derive(serde::Deserialize)]
struct Head {
    run: HeadRun,
}

#[derive(serde::Deserialize)]
struct HeadRun {
    id: Uuid,
}

/// Every run of `store`'s directory, in id order (an export read back
/// whole: for tests and small exports). A part that holds other runs than
/// its manifest says is an error.
pub async fn read_all(store: &Store) -> Result<Vec<ArchivedRun>, Error> {
    let Some(manifest) = manifest(store).await? else { return Ok(Vec::new()) };
    let mut runs = Vec::new();
    for part in &manifest.parts {
        let lines = part_lines(store, part).await?;
        let mut of_part: Vec<ArchivedRun> = Vec::new();
        for (n, line) in lines.lines().enumerate() {
            let run =
                serde_json::from_str(line).map_err(|e| store.format(&part.file, format!("line {}: {e}", n + 1)))?;
            of_part.push(run);
        }
        let inside = of_part.iter().all(|r| part.first <= r.run.id && r.run.id <= part.last);
        if of_part.len() as u64 != part.runs || !inside {
            let problem = format!(
                "holds {} runs from {:?} to {:?}; its manifest says {} from {} to {}",
                of_part.len(),
                of_part.first().map(|r| r.run.id),
                of_part.last().map(|r| r.run.id),
                part.runs,
                part.first,
                part.last
            );
            return Err(store.format(&part.file, problem));
        }
        runs.extend(of_part);
    }
    Ok(runs)
}

/// The JSON Lines of `part`, inflated on a blocking thread; an error where
/// they inflate past [`MAX_READ_BYTES`].
async fn part_lines(store: &Store, part: &ManifestPart) -> Result<String, Error> {
    let missing = || store.format(&part.file, "missing, though the manifest lists it");
    let zipped = store.get(&part.file).await?.ok_or_else(missing)?;
    inflate(store, &part.file, zipped).await
}

/// The text of `file`'s gzip `zipped`, inflated on a blocking thread; an
/// error where it inflates past [`MAX_READ_BYTES`].
async fn inflate(store: &Store, file: &str, zipped: Vec<u8>) -> Result<String, Error> {
    let (name, at) = (file.to_string(), store.clone());
    let text = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        let read = GzDecoder::new(zipped.as_slice()).take(MAX_READ_BYTES + 1).read_to_string(&mut text);
        read.map_err(|e| at.format(&name, e.to_string()))?;
        if text.len() as u64 > MAX_READ_BYTES {
            return Err(at.format(&name, format!("inflates past the {MAX_READ_BYTES} bytes a reader takes")));
        }
        Ok(text)
    });
    text.await.map_err(|e| store.format(file, e.to_string()))?
}

/// `json` compressed, on a blocking thread: compressing up to 64 MiB is
/// work for one, not for the runtime's.
async fn gzip(json: Vec<u8>) -> Result<Vec<u8>, String> {
    tokio::task::spawn_blocking(move || {
        let mut gz = GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::default());
        gz.write_all(&json).and_then(|_| gz.finish())
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
}

/// Up to `limit` items after index `after` of the MAP `node` whose item
/// files of run `run` are `files` ([`ArchivedRun::item_files`]), by index:
/// only the files that hold them are read, and only the items after
/// `after` parsed whole. An item of another MAP is an error. A name that is not one of the run's item
/// files is an error, never read (a line names them, and a line can be
/// changed).
pub async fn read_items(
    store: &Store,
    run: Uuid,
    node: &str,
    files: &[ItemFile],
    after: i32,
    limit: usize,
) -> Result<Vec<TaskView>, Error> {
    let mut page = Vec::new();
    for f in files.iter().filter(|f| f.last > after) {
        if page.len() >= limit {
            break;
        }
        let name = items::item_file_name(run, &f.file)
            .ok_or_else(|| store.format(&f.file, "is not one of its run's item files"))?;
        let zipped = store.sub(&items::dir_of(run)).get(name).await?;
        let zipped = zipped.ok_or_else(|| store.format(&f.file, "missing, though its run's line names it"))?;
        let text = inflate(store, &f.file, zipped).await?;
        items::page_of(&text, node, after, limit, &mut page).map_err(|e| store.format(&f.file, e))?;
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_of_the_month_of_its_id() {
        let id = Uuid::parse_str("019a6b2e-0000-7000-8000-000000000000").unwrap();
        assert_eq!(month_of(id).as_deref(), Some("2025_11"));
        let v4 = Uuid::parse_str("6f1d2c3b-4a59-4e8f-9a7b-0c1d2e3f4a5b").unwrap();
        assert_eq!(month_of(v4), None, "not a UUIDv7: no month");
    }

    #[test]
    fn a_location_is_a_directory_or_a_bucket_and_a_refused_one_is_not_echoed() {
        for bad in ["", "s3://", "s3:///prefix", "s3://b/p?secret=x", "s3://key:hunter2@b/p", "http://x/y"] {
            match Store::open(bad) {
                Err(Error::Location(said)) => {
                    assert!(!said.contains("hunter2") && !said.contains("secret=x"), "{said}")
                }
                other => panic!("{bad:?} should be refused, got {other:?}"),
            }
        }
    }

    fn run(id: Uuid) -> ArchivedRun {
        serde_json::from_value(serde_json::json!({
            "run": {"id": id, "workflow": "w", "version": 1, "workflow_id": id, "status": "SUCCEEDED", "error": null,
                    "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z", "finished_at": null,
                    "trace_id": "00000000000000000000000000000000", "priority": 3},
            "history": []
        }))
        .unwrap()
    }

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir() -> (Dir, Store) {
        let d = std::env::temp_dir().join(format!("composer-archive-unit-{}", Uuid::now_v7()));
        let store = Store::open(d.to_str().unwrap()).unwrap();
        (Dir(d), store)
    }

    /// A MAP of 20,001 items goes to three item files (10,000 a file); its
    /// run's line names them and holds none of its items (a MAP of 3 stays
    /// in the line); every page, across files and from anywhere, reads
    /// back the items in order; a line naming another run's file is an
    /// error, not a read.
    #[tokio::test]
    async fn a_large_maps_items_go_to_files_of_their_own_and_read_back_a_page_at_a_time() {
        let (_d, store) = dir();
        let id = Uuid::now_v7();
        let mut r = run(id);
        let item = |i: i32| -> composer_api::rest::TaskView {
            serde_json::from_value(serde_json::json!({"id": Uuid::now_v7(), "node_id": format!("each[{i}]"),
                "node_type": "TRANSFORM", "state": "COMPLETED", "attempt": 1, "input": {}, "output": i,
                "error": null, "wake_at": null, "started_at": null, "finished_at": null, "item_index": i}))
            .unwrap()
        };
        r.items.insert("each".into(), (0..20_001).map(item).collect());
        r.items.insert("few".into(), (0..3).map(item).collect());
        let mut w = Writer::new(store.clone(), "default", serde_json::json!({}));
        w.add(&r).await.unwrap();
        w.finish(Utc::now()).await.unwrap();
        let back = read_run(&store, id).await.unwrap().unwrap();
        assert_eq!(back.items.keys().collect::<Vec<_>>(), vec!["few"]);
        let files = &back.item_files["each"];
        let spans: Vec<_> = files.iter().map(|f| (f.first, f.last, f.items)).collect();
        assert_eq!(spans, vec![(0, 9999, 10_000), (10_000, 19_999, 10_000), (20_000, 20_000, 1)]);
        for (after, limit) in [(-1, 100), (9_990, 20), (9_999, 3), (19_999, 100), (20_000, 5), (-1, 25_000)] {
            let page = read_items(&store, id, "each", files, after, limit).await.unwrap();
            let want: Vec<i32> = ((after + 1)..20_001).take(limit).collect();
            assert_eq!(page.iter().map(|t| t.item_index.unwrap()).collect::<Vec<_>>(), want, "{after} {limit}");
            assert!(page.iter().all(|t| t.output == Some(serde_json::json!(t.item_index))));
        }
        assert!(read_items(&store, id, "few", files, -1, 10).await.is_err(), "another MAP's file");
        let mut elsewhere = files.clone();
        elsewhere[0].file = files[0].file.replace(&id.to_string(), &Uuid::now_v7().to_string());
        assert!(read_items(&store, id, "each", &elsewhere, -1, 10).await.is_err());
        assert!(
            Writer::new(store.clone(), "d", serde_json::json!({})).add(&back).await.is_err(),
            "item files of another archive"
        );

        // Written again with fewer items: the files the first write left
        // and this one did not are gone. A MAP of few items over
        // ITEMS_IN_LINE_BYTES goes to a file too.
        r.items.insert("each".into(), (0..10_001).map(item).collect());
        let mut big = item(0);
        big.node_id = "few[0]".into();
        big.output = Some(serde_json::json!("x".repeat(ITEMS_IN_LINE_BYTES)));
        r.items.insert("few".into(), vec![big]);
        let mut w = Writer::new(store.clone(), "default", serde_json::json!({}));
        w.add(&r).await.unwrap();
        w.finish(Utc::now()).await.unwrap();
        let back = read_run(&store, id).await.unwrap().unwrap();
        assert!(back.items.is_empty());
        assert_eq!(back.item_files["each"].len(), 2);
        assert_eq!(back.item_files["few"].iter().map(|f| f.items).sum::<u64>(), 1);
        let on_disk = |f: &ItemFile| _d.0.join(&f.file).exists();
        assert!(back.item_files.values().flatten().all(on_disk));
        assert!(!on_disk(&files[2]), "the first write's third file is gone");
    }

    /// 2,500 runs are three parts (1,000 a part); each is read back from
    /// its part, every run once, in order; a run out of order is refused.
    #[tokio::test]
    async fn runs_are_cut_into_parts_and_each_reads_back_from_its_own() {
        let (_d, store) = dir();
        let ids: Vec<Uuid> = (0..2500).map(|_| Uuid::now_v7()).collect();
        let mut w = Writer::new(store.clone(), "default", serde_json::json!({"month": "2026_12"}));
        for id in &ids {
            w.add(&run(*id)).await.unwrap();
        }
        assert!(w.add(&run(ids[0])).await.is_err(), "a run before the last is refused");
        let m = w.finish(Utc::now()).await.unwrap();
        assert_eq!(m.parts.iter().map(|p| p.runs).collect::<Vec<_>>(), vec![1000, 1000, 500]);
        assert_eq!((m.parts[1].first, m.parts[1].last), (ids[1000], ids[1999]));
        for i in [0, 999, 1000, 1999, 2000, 2499] {
            assert_eq!(read_run(&store, ids[i]).await.unwrap().unwrap().run.id, ids[i], "run {i}");
        }
        assert!(read_run(&store, Uuid::now_v7()).await.unwrap().is_none());
        let all: Vec<Uuid> = read_all(&store).await.unwrap().iter().map(|r| r.run.id).collect();
        assert_eq!(all, ids);
    }

    /// A write into a directory that holds an earlier one takes the earlier
    /// manifest away before it overwrites a part: until it finishes, the
    /// directory reads as unfinished, never as the old runs in new parts.
    #[tokio::test]
    async fn a_write_over_an_earlier_one_is_unfinished_until_its_own_manifest() {
        let (_d, store) = dir();
        let mut w = Writer::new(store.clone(), "default", serde_json::json!({}));
        w.add(&run(Uuid::now_v7())).await.unwrap();
        w.finish(Utc::now()).await.unwrap();
        assert!(manifest(&store).await.unwrap().is_some());
        let mut again = Writer::new(store.clone(), "default", serde_json::json!({}));
        again.add(&run(Uuid::now_v7())).await.unwrap();
        assert!(manifest(&store).await.unwrap().is_none(), "the old manifest went first");
        drop(again);
        assert!(read_all(&store).await.unwrap().is_empty());
    }

    /// A part that holds other runs than its manifest says is an error, not
    /// fewer runs.
    #[tokio::test]
    async fn a_part_that_disagrees_with_its_manifest_is_an_error() {
        let (d, store) = dir();
        let mut w = Writer::new(store.clone(), "default", serde_json::json!({}));
        for _ in 0..3 {
            w.add(&run(Uuid::now_v7())).await.unwrap();
        }
        w.finish(Utc::now()).await.unwrap();
        let path = d.0.join(MANIFEST);
        let text = std::fs::read_to_string(&path).unwrap().replace("\"runs\": 3", "\"runs\": 4");
        std::fs::write(&path, text).unwrap();
        let e = read_all(&store).await.unwrap_err().to_string();
        assert!(e.contains("part-00000.jsonl.gz") && e.contains("manifest says 4"), "{e}");
    }
}
