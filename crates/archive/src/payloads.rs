//! Values too large to keep in a row (offloaded): a run's input or output,
//! a step's input or output over the threshold is written as an object,
//! and the row holds a reference to it instead:
//!
//! ```json
//! {"$composer_offloaded": {"run": "<run id>", "object": "<uuid>", "sha256": "<hex>", "bytes": 123}}
//! ```
//!
//! - An object is written *before* the commit that refers to it, under a
//!   name never used twice (`payloads/<YYYY_MM>/<run>/<object>.json`, the
//!   month the run's id is of), so a crash in between leaves an object no row
//!   names — which [`Payloads::sweep`] deletes once it is older than any
//!   transaction lives — and never a row naming nothing.
//! - A row names only its own run's objects: a reference to another run's
//!   object (a child's input taken from its parent's step) is copied first.
//!   So a month's objects go with the month's runs ([`Payloads::drop_month`]).
//! - An event's payload has no run: its objects are the event's
//!   (`"event": true`, under `payloads/events/<YYYY_MM>/<owner>/`, `run`
//!   naming an owner made for the event), named by its rows in the event
//!   log and the buffer of events waiting for a step; the sweep deletes
//!   them once neither names them ([`Payloads::sweep_events`]). A run that
//!   takes the payload gets its own copy, as from another run.
//! - A reader checks the object against the reference's SHA-256: a value
//!   that only looks like a reference (an expression can build one) reads
//!   nothing it could not already name. Values that enter from outside may
//!   not use the key at all (`composer_core::storable`).

use futures_util::stream::BoxStream;
use object_store::path::Path;
use object_store::PutPayload;
use serde_json::Value;
use uuid::Uuid;

use crate::{Error, Store, MAX_READ_BYTES};

/// The directory under its store where a [`Payloads`] keeps its objects.
pub const DIR: &str = "payloads";

/// The key of a reference to an offloaded value.
pub use composer_core::storable::OFFLOADED_KEY as KEY;

/// Where offloaded values go, and from what size; or nowhere (every value
/// stays in its row).
#[derive(Clone, Debug, Default)]
pub struct Payloads {
    at: Option<(Store, usize)>,
}

/// A reference to an offloaded value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ref {
    /// The run the object is of; for an event's, the owner made for it.
    pub run: Uuid,
    pub object: Uuid,
    pub sha256: String,
    pub bytes: u64,
    /// An event's payload, not a run's value.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub event: bool,
}

impl Ref {
    /// The reference `value` is, if it is one.
    pub fn of(value: &Value) -> Option<Ref> {
        let map = value.as_object()?;
        if map.len() != 1 {
            return None;
        }
        serde_json::from_value(map.get(KEY)?.clone()).ok()
    }

    pub fn to_value(&self) -> Value {
        serde_json::json!({ KEY: self })
    }

    /// Whether `value` is the one its object holds (its JSON's SHA-256,
    /// counted as it is written, not held).
    pub fn holds(&self, value: &Value) -> bool {
        let mut hash = Hashing(ring::digest::Context::new(&ring::digest::SHA256));
        serde_json::to_writer(&mut hash, value).is_ok() && hex(hash.0.finish().as_ref()) == self.sha256
    }
}

impl Payloads {
    /// Values over `threshold` bytes of JSON go to `store`.
    pub fn new(store: Store, threshold: usize) -> Payloads {
        Payloads { at: Some((store.sub(DIR), threshold)) }
    }

    /// Every value stays in its row.
    pub fn off() -> Payloads {
        Payloads::default()
    }

    pub fn is_on(&self) -> bool {
        self.at.is_some()
    }

    /// Whether `value` is written as an object: over the threshold (counted
    /// only up to it), or a reference to another run's object.
    pub fn offloads(&self, run: Uuid, value: &Value) -> bool {
        let Some((_, threshold)) = &self.at else { return false };
        if let Some(r) = Ref::of(value) {
            return r.event || r.run != run;
        }
        crate::parts::json_over(value, *threshold)
    }

    /// The reference to write instead of `value` for run `run`, writing its
    /// object first; `had` is the reference it was read from (kept when the
    /// value did not change). `None`: the value stays in its row.
    pub async fn offload(&self, run: Uuid, value: &Value, had: Option<&Ref>) -> Result<Option<Value>, Error> {
        if !self.offloads(run, value) {
            return Ok(None);
        }
        self.offload_now(run, value, had).await
    }

    /// [`Payloads::offload`] of a value [`Payloads::offloads`] said is
    /// written as an object.
    pub async fn offload_now(&self, run: Uuid, value: &Value, had: Option<&Ref>) -> Result<Option<Value>, Error> {
        let Some((store, _)) = &self.at else { return Ok(None) };
        if let Some(theirs) = Ref::of(value) {
            // Another run's object: this run gets its own copy.
            return Ok(Some(write(store, run, false, &self.read(&theirs).await?).await?.to_value()));
        }
        // Unchanged, it keeps its object: its SHA-256 says so, counted
        // without its text held.
        if let Some(had) = had.filter(|h| h.run == run && !h.event) {
            if had.holds(value) {
                return Ok(Some(had.to_value()));
            }
        }
        Ok(Some(write(store, run, false, value).await?.to_value()))
    }

    /// The reference to `value`, written as an object of run `run` whatever
    /// its size (a step log's sealed chunk); `None` without storage.
    pub async fn keep(&self, run: Uuid, value: &Value) -> Result<Option<Value>, Error> {
        let Some((store, _)) = &self.at else { return Ok(None) };
        Ok(Some(write(store, run, false, value).await?.to_value()))
    }

    /// Bytes of JSON past which a value is offloaded, if it is.
    pub fn threshold(&self) -> Option<usize> {
        self.at.as_ref().map(|(_, threshold)| *threshold)
    }

    /// The reference to keep instead of an event's payload `value`, its
    /// object written first under an owner made for it; `None`: the payload
    /// stays in its rows.
    pub async fn offload_event(&self, value: &Value) -> Result<Option<Value>, Error> {
        let Some((store, _)) = &self.at else { return Ok(None) };
        if !self.offloads(Uuid::nil(), value) {
            return Ok(None);
        }
        Ok(Some(write(store, Uuid::now_v7(), true, value).await?.to_value()))
    }

    /// Replaces `value` by what it refers to, if it is a reference; returns
    /// that reference.
    pub async fn resolve(&self, value: &mut Value) -> Result<Option<Ref>, Error> {
        let Some(r) = Ref::of(value) else { return Ok(None) };
        *value = self.read(&r).await?;
        Ok(Some(r))
    }

    /// The value `r` refers to.
    pub async fn read(&self, r: &Ref) -> Result<Value, Error> {
        let bytes = self.read_text(r).await?;
        serde_json::from_slice(&bytes).map_err(|e| format_error(r, e))
    }

    /// The value `r` refers to as its JSON text, checked against the
    /// reference (its size before it is read).
    pub async fn read_text(&self, r: &Ref) -> Result<bytes::Bytes, Error> {
        let got = self.get(r).await?;
        // Its size first: a reference that says 1 KiB does not read 1 GiB.
        if got.meta.size != r.bytes {
            return Err(format_error(r, format!("{} bytes, not the reference's {}", got.meta.size, r.bytes)));
        }
        let bytes = got.bytes().await?;
        if sha256_hex(&bytes) != r.sha256 {
            return Err(format_error(r, "its SHA-256 is not the reference's"));
        }
        Ok(bytes)
    }

    /// The value `r` refers to as its JSON text, a part at a time, never
    /// held whole: checked against the reference's size before the first
    /// part and against its SHA-256 as the parts go, the stream's last item
    /// an error when they are not the reference's. A reader that passes the
    /// parts on (an API answer) has then passed on what it must not trust,
    /// and must cut its answer short.
    pub async fn stream_text(&self, r: &Ref) -> Result<BoxStream<'static, Result<bytes::Bytes, Error>>, Error> {
        use futures_util::StreamExt;
        let got = self.get(r).await?;
        if got.meta.size != r.bytes {
            return Err(format_error(r, format!("{} bytes, not the reference's {}", got.meta.size, r.bytes)));
        }
        Ok(checked(r, got.into_stream().map(|part| part.map_err(Error::from)).boxed()))
    }

    /// Whether the object `r` names is there, of the reference's size,
    /// without reading it: what an answer checks before it begins that
    /// streams the object later ([`Payloads::stream_text`]).
    pub async fn check(&self, r: &Ref) -> Result<(), Error> {
        let store = self.store_of(r)?;
        let meta = store.objects.head(&path_of(store, r)).await?;
        if meta.size != r.bytes || meta.size > MAX_READ_BYTES {
            return Err(format_error(r, format!("{} bytes, not the reference's {}", meta.size, r.bytes)));
        }
        Ok(())
    }

    /// Copies the object `r` names to where `to` keeps it (the same name
    /// under `to`'s directory, so the same reference reads it there): read
    /// a part at a time and checked against the reference as it goes, so
    /// a changed object is an error and leaves no copy. A copy `to`
    /// already holds that is the reference's (a pass that failed later
    /// made it) is left as it is; one that is not is written again.
    pub async fn copy_to(&self, r: &Ref, to: &Payloads) -> Result<(), Error> {
        if to.holds(r).await? {
            return Ok(());
        }
        to.write_text(r, self.stream_text(r).await?).await
    }

    /// Whether the object `r` names is here and is the reference's (read a
    /// part at a time to tell); an error only where storage fails.
    pub async fn holds(&self, r: &Ref) -> Result<bool, Error> {
        let store = self.store_of(r)?;
        match store.objects.head(&path_of(store, r)).await {
            Ok(meta) if meta.size == r.bytes => self.holds_object(r).await,
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `parts`, the JSON text of the value `r` refers to, as the
    /// object `r` names here (the same name, so the same reference reads
    /// it): checked against the reference's size and SHA-256 as they go,
    /// so text that is not the reference's is an error and leaves no
    /// object. Past [`PART`] it goes as a multipart upload, never whole.
    pub async fn write_text(
        &self,
        r: &Ref,
        parts: BoxStream<'static, Result<bytes::Bytes, Error>>,
    ) -> Result<(), Error> {
        use futures_util::StreamExt;
        let store = self.store_of(r)?;
        let path = path_of(store, r);
        let mut read = checked(r, parts);
        if r.bytes <= PART as u64 {
            let mut text = Vec::with_capacity(r.bytes as usize);
            while let Some(part) = read.next().await {
                text.extend_from_slice(&part?);
            }
            store.objects.put(&path, PutPayload::from(text)).await?;
            return Ok(());
        }
        let mut upload = store.objects.put_multipart(&path).await?;
        let sent: Result<(), Error> = async {
            let mut buf = Vec::with_capacity(PART);
            while let Some(part) = read.next().await {
                buf.extend_from_slice(&part?);
                if buf.len() >= PART {
                    let full = std::mem::replace(&mut buf, Vec::with_capacity(PART));
                    upload.put_part(PutPayload::from(full)).await?;
                }
            }
            if !buf.is_empty() {
                upload.put_part(PutPayload::from(buf)).await?;
            }
            Ok(())
        }
        .await;
        finish_upload(upload, sent).await
    }

    /// Whether the object `r` names here is the reference's, read a part
    /// at a time; an error only where storage fails.
    async fn holds_object(&self, r: &Ref) -> Result<bool, Error> {
        use futures_util::StreamExt;
        let mut parts = match self.stream_text(r).await {
            Ok(parts) => parts,
            Err(Error::Format { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        while let Some(part) = parts.next().await {
            match part {
                Ok(_) => {}
                Err(Error::Format { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn store_of(&self, r: &Ref) -> Result<&Store, Error> {
        match &self.at {
            Some((store, _)) => Ok(store),
            None => Err(Error::Location(format!(
                "{} is offloaded, and no object storage is set (COMPOSER_OFFLOAD_URL)",
                r.describe()
            ))),
        }
    }

    /// The object `r` names, opened; no larger than a reader takes.
    async fn get(&self, r: &Ref) -> Result<object_store::GetResult, Error> {
        let store = self.store_of(r)?;
        let got = store.objects.get(&path_of(store, r)).await?;
        if got.meta.size > MAX_READ_BYTES {
            return Err(format_error(r, format!("{} bytes, over the {MAX_READ_BYTES} a reader takes", got.meta.size)));
        }
        Ok(got)
    }

    /// Objects written before `before` that no row names: deleted; `named`
    /// gives the objects the rows of a run name (none for a run that is
    /// gone), asked once per run. Says how many it deleted, and what is
    /// kept under the payloads' directory (events' objects included).
    pub async fn sweep<F, Fut>(&self, before: chrono::DateTime<chrono::Utc>, named: F) -> Result<Swept, Error>
    where
        F: FnMut(Uuid) -> Fut,
        Fut: std::future::Future<Output = Result<std::collections::HashSet<Uuid>, Error>>,
    {
        let Some((store, _)) = &self.at else { return Ok(Swept::default()) };
        sweep_under(store, before, named).await
    }

    /// [`Payloads::sweep`] for events' payloads: `named` gives the objects
    /// the rows of an event's owner name (none once the event log and the
    /// buffer forgot it).
    pub async fn sweep_events<F, Fut>(&self, before: chrono::DateTime<chrono::Utc>, named: F) -> Result<u64, Error>
    where
        F: FnMut(Uuid) -> Fut,
        Fut: std::future::Future<Output = Result<std::collections::HashSet<Uuid>, Error>>,
    {
        let Some((store, _)) = &self.at else { return Ok(0) };
        Ok(sweep_under(&store.sub(EVENTS), before, named).await?.deleted)
    }

    /// Deletes the objects of the runs of month `month` (`YYYY_MM`), once
    /// their rows are gone.
    pub async fn drop_month(&self, month: &str) -> Result<(), Error> {
        let Some((store, _)) = &self.at else { return Ok(()) };
        drop_under(store, &store.sub(month)).await
    }

    /// Deletes every object (a namespace's, before its schema is dropped).
    pub async fn drop_all(&self) -> Result<(), Error> {
        let Some((store, _)) = &self.at else { return Ok(()) };
        drop_under(store, store).await
    }
}

/// Deletes every object under `dir`, as they are listed (in batches where
/// the storage takes them: S3's DeleteObjects).
async fn drop_under(store: &Store, dir: &Store) -> Result<(), Error> {
    use futures_util::{StreamExt, TryStreamExt};
    let listed = dir.objects.list(Some(&dir.dir)).map_ok(|meta| meta.location).boxed();
    let mut deleted = store.objects.delete_stream(listed);
    while let Some(gone) = deleted.next().await {
        match gone {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What a sweep did: objects deleted, and the objects (and their bytes)
/// left under the directory it listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub deleted: u64,
    pub kept: u64,
    pub kept_bytes: u64,
}

/// Objects under `store`'s directory (`<month>/<owner>/<object>.json`)
/// written before `before` that `named` does not name: deleted.
async fn sweep_under<F, Fut>(store: &Store, before: chrono::DateTime<chrono::Utc>, mut named: F) -> Result<Swept, Error>
where
    F: FnMut(Uuid) -> Fut,
    Fut: std::future::Future<Output = Result<std::collections::HashSet<Uuid>, Error>>,
{
    use futures_util::StreamExt;
    let mut listed = store.objects.list(Some(&store.dir));
    let mut old: std::collections::BTreeMap<Uuid, Vec<(Uuid, Path, u64)>> = std::collections::BTreeMap::new();
    let mut swept = Swept::default();
    while let Some(meta) = listed.next().await {
        let meta = meta?;
        swept.kept += 1;
        swept.kept_bytes += meta.size;
        // Only objects we named; their name says when they were written.
        let Some((run, object)) = names_of(&store.dir, &meta.location) else { continue };
        if written_at(object).is_some_and(|at| at < before) {
            old.entry(run).or_default().push((object, meta.location, meta.size));
        }
    }
    for (run, objects) in old {
        let kept = named(run).await?;
        for (_, location, size) in objects.into_iter().filter(|(object, ..)| !kept.contains(object)) {
            match store.objects.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    swept.deleted += 1;
                    swept.kept -= 1;
                    swept.kept_bytes -= size;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(swept)
}

/// Where events' payloads are, under the payloads' directory.
const EVENTS: &str = "events";

/// Where the object of `r` is: under its run's (or event owner's) month and id.
fn path_of(store: &Store, r: &Ref) -> Path {
    let month = crate::month_of(r.run).unwrap_or_else(|| "unknown".into());
    let dir = if r.event { store.dir.child(EVENTS) } else { store.dir.clone() };
    dir.child(month).child(r.run.to_string()).child(format!("{}.json", r.object))
}

/// The run and object an object's location under `dir` names, if it is one
/// of ours (`<month>/<run>/<object>.json`).
fn names_of(dir: &Path, location: &Path) -> Option<(Uuid, Uuid)> {
    let parts: Vec<_> = location.prefix_match(dir)?.collect();
    let [_, run, object] = parts.as_slice() else { return None };
    let object = object.as_ref().strip_suffix(".json")?;
    Some((run.as_ref().parse().ok()?, object.parse().ok()?))
}

/// When an object was named (its UUIDv7's time).
fn written_at(object: Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    let (secs, nanos) = object.get_timestamp()?.to_unix();
    chrono::DateTime::from_timestamp(secs as i64, nanos)
}

fn format_error(r: &Ref, problem: impl std::fmt::Display) -> Error {
    Error::Format { file: r.describe(), problem: problem.to_string() }
}

impl Ref {
    /// What the reference names, for an error.
    fn describe(&self) -> String {
        match self.event {
            true => format!("offloaded event payload {}", self.object),
            false => format!("offloaded value {} of run {}", self.object, self.run),
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that only hashes what is written to it.
struct Hashing(ring::digest::Context);

impl std::io::Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of JSON sent at once: a value past it is written a part at a time
/// (a multipart upload), not held whole as text (but for a string or
/// number, which goes whole into its part).
pub const PART: usize = 8 << 20;

/// Writes `value` as a new object of `run` (or of an event's owner, with
/// `event`), its JSON made a part at a time ([`crate::parts::Parts`]) and
/// hashed as it goes; its reference.
async fn write(store: &Store, run: Uuid, event: bool, value: &Value) -> Result<Ref, Error> {
    let mut r = Ref { run, object: Uuid::now_v7(), sha256: String::new(), bytes: 0, event };
    let path = path_of(store, &r);
    let json = |e: serde_json::Error| Error::Location(format!("a value to offload: {e}"));
    let mut parts = crate::parts::Parts::new(value);
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = Vec::new();
    let mut done = parts.fill(&mut buf, PART).map_err(json)?;
    if done {
        hash.update(&buf);
        r.bytes = buf.len() as u64;
        r.sha256 = hex(hash.finish().as_ref());
        store.objects.put(&path, PutPayload::from(buf)).await?;
        return Ok(r);
    }
    let mut upload = store.objects.put_multipart(&path).await?;
    let sent: Result<(), Error> = async {
        while !buf.is_empty() {
            hash.update(&buf);
            r.bytes += buf.len() as u64;
            let part = std::mem::replace(&mut buf, Vec::with_capacity(PART + (64 << 10)));
            upload.put_part(PutPayload::from(part)).await?;
            if !done {
                done = parts.fill(&mut buf, PART).map_err(json)?;
            }
        }
        Ok(())
    }
    .await;
    finish_upload(upload, sent).await?;
    r.sha256 = hex(hash.finish().as_ref());
    Ok(r)
}

/// `parts` passed on as they come, checked to be the text `r` refers to:
/// an error in place of the part that takes them past the reference's
/// size, and as the last item when they end short of it or their SHA-256
/// is not the reference's. Nothing after an error.
fn checked(
    r: &Ref,
    parts: BoxStream<'static, Result<bytes::Bytes, Error>>,
) -> BoxStream<'static, Result<bytes::Bytes, Error>> {
    use futures_util::StreamExt;
    let hash = Some((ring::digest::Context::new(&ring::digest::SHA256), 0u64));
    futures_util::stream::unfold((parts, hash, r.clone()), |(mut parts, hash, r)| async move {
        // `None` once the stream has ended or failed.
        let (mut hash, seen) = hash?;
        match parts.next().await {
            Some(Ok(part)) if seen + part.len() as u64 > r.bytes => {
                Some((Err(format_error(&r, format!("more than the reference's {} bytes", r.bytes))), (parts, None, r)))
            }
            Some(Ok(part)) => {
                hash.update(&part);
                let seen = seen + part.len() as u64;
                Some((Ok(part), (parts, Some((hash, seen)), r)))
            }
            Some(Err(e)) => Some((Err(e), (parts, None, r))),
            None if seen == r.bytes && hex(hash.finish().as_ref()) == r.sha256 => None,
            None if seen != r.bytes => Some((
                Err(format_error(&r, format!("{seen} bytes, not the reference's {}", r.bytes))),
                (parts, None, r),
            )),
            None => Some((Err(format_error(&r, "its SHA-256 is not the reference's")), (parts, None, r))),
        }
    })
    .boxed()
}

/// Ends a multipart `upload` as sending its parts went (`sent`): completed
/// when they all went, aborted otherwise (so that no part is left behind,
/// where the storage allows), the error returned.
async fn finish_upload(
    mut upload: Box<dyn object_store::MultipartUpload>,
    sent: Result<(), Error>,
) -> Result<(), Error> {
    let done = match sent {
        Ok(()) => upload.complete().await.map(drop).map_err(Error::from),
        Err(e) => Err(e),
    };
    if done.is_err() {
        let _ = upload.abort().await;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(dir: &std::path::Path, threshold: usize) -> Payloads {
        Payloads::new(Store::open(dir.to_str().unwrap()).unwrap(), threshold)
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("composer-payloads-{name}-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_value_over_the_threshold_is_written_once_and_read_back_whole() {
        let dir = scratch("roundtrip");
        let p = payloads(&dir, 64);
        let run = Uuid::now_v7();
        let small = serde_json::json!({"a": 1});
        assert_eq!(p.offload(run, &small, None).await.unwrap(), None);
        let big = serde_json::json!({"text": "x".repeat(100)});
        let mut r = p.offload(run, &big, None).await.unwrap().unwrap();
        let reference = Ref::of(&r).unwrap();
        assert_eq!(reference.run, run);
        // Unchanged, it keeps its reference (no second object).
        assert_eq!(p.offload(run, &big, Some(&reference)).await.unwrap().unwrap(), r);
        assert_eq!(p.resolve(&mut r).await.unwrap(), Some(reference));
        assert_eq!(r, big);
        // Another run refers to it: that run gets a copy of its own.
        let other = Uuid::now_v7();
        let copied = p.offload(other, &p.offload(run, &big, None).await.unwrap().unwrap(), None).await.unwrap();
        assert_eq!(Ref::of(&copied.clone().unwrap()).unwrap().run, other);
        assert_eq!(p.read(&Ref::of(&copied.unwrap()).unwrap()).await.unwrap(), big);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_reference_whose_sha256_is_not_its_objects_reads_nothing() {
        let dir = scratch("forged");
        let p = payloads(&dir, 8);
        let run = Uuid::now_v7();
        let v = p.offload(run, &serde_json::json!("a secret of some length"), None).await.unwrap().unwrap();
        let mut forged = Ref::of(&v).unwrap();
        forged.sha256 = "0".repeat(64);
        let err = p.read(&forged).await.unwrap_err().to_string();
        assert!(err.contains("SHA-256"), "{err}");
        // The object changed where it is kept: refused, whether it parses
        // or not; one of another size before it is read.
        let r = Ref::of(&v).unwrap();
        let file = dir.join(path_of(&p.at.as_ref().unwrap().0, &r).as_ref());
        for (text, said) in [
            (&b"\"a secret of some lengtX\""[..], "SHA-256"),
            (b"\"another secret of some length\"", "not the reference's 25"),
            (b"\"a secret of some", "not the reference's 25"),
            (b"\"a secret of some length\" 1", "not the reference's 25"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = p.read(&r).await.unwrap_err().to_string();
            assert!(err.contains(said), "{err}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A value read a part at a time is the value's text; an object
    /// changed where it is kept ends the parts with an error, one of
    /// another size before the first part.
    #[tokio::test]
    async fn a_value_streamed_is_its_text_and_an_object_changed_ends_the_stream_with_an_error() {
        use futures_util::StreamExt;
        let dir = scratch("streamed");
        let p = payloads(&dir, 8);
        let value = serde_json::json!({"rows": vec!["a row of text"; 50_000]});
        let r = Ref::of(&p.offload(Uuid::now_v7(), &value, None).await.unwrap().unwrap()).unwrap();
        let parts: Vec<_> = p.stream_text(&r).await.unwrap().collect().await;
        let text: Vec<u8> = parts.into_iter().flat_map(|part| part.unwrap()).collect();
        assert_eq!(text, serde_json::to_vec(&value).unwrap());
        assert_eq!(p.read_text(&r).await.unwrap(), text);
        let file = dir.join(path_of(&p.at.as_ref().unwrap().0, &r).as_ref());
        let mut changed = text.clone();
        changed[10] = b'b';
        std::fs::write(&file, &changed).unwrap();
        let parts: Vec<_> = p.stream_text(&r).await.unwrap().collect().await;
        let last = parts.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(last.contains("SHA-256"), "{last}");
        assert!(parts[..parts.len() - 1].iter().all(Result::is_ok));
        p.check(&r).await.unwrap();
        std::fs::write(&file, &text[1..]).unwrap();
        let err = p.stream_text(&r).await.err().unwrap().to_string();
        assert!(err.contains("not the reference's"), "{err}");
        let err = p.check(&r).await.unwrap_err().to_string();
        assert!(err.contains("not the reference's"), "{err}");
        std::fs::remove_file(&file).unwrap();
        assert!(p.check(&r).await.unwrap_err().is_missing());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn the_sweep_deletes_old_objects_no_row_names_and_a_month_goes_whole() {
        let dir = scratch("sweep");
        let p = payloads(&dir, 8);
        let run = Uuid::now_v7();
        let kept = Ref::of(&p.offload(run, &serde_json::json!("kept, named by a row"), None).await.unwrap().unwrap());
        let orphan = Ref::of(
            &p.offload(run, &serde_json::json!("an orphan: its commit never came"), None).await.unwrap().unwrap(),
        );
        let (kept, orphan) = (kept.unwrap(), orphan.unwrap());
        // Not older than the grace: nothing goes.
        let before = chrono::Utc::now() - chrono::Duration::hours(1);
        assert_eq!(p.sweep(before, |_| async { Ok(Default::default()) }).await.unwrap().deleted, 0);
        let later = chrono::Utc::now() + chrono::Duration::seconds(1);
        let kept_object = kept.object;
        let swept = p.sweep(later, |_| async move { Ok([kept_object].into()) }).await.unwrap();
        assert_eq!((swept.deleted, swept.kept, swept.kept_bytes), (1, 1, kept.bytes));
        assert!(p.read(&kept).await.is_ok());
        assert!(p.read(&orphan).await.is_err());
        p.drop_month(&crate::month_of(run).unwrap()).await.unwrap();
        assert!(p.read(&kept).await.is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn an_events_payload_is_an_object_of_its_own_that_only_the_events_sweep_deletes() {
        let dir = scratch("events");
        let p = payloads(&dir, 8);
        assert_eq!(p.offload_event(&serde_json::json!(1)).await.unwrap(), None, "under the threshold");
        let payload = serde_json::json!({"order": "an event's payload of some length"});
        let stored = p.offload_event(&payload).await.unwrap().unwrap();
        let r = Ref::of(&stored).unwrap();
        assert!(r.event);
        assert_eq!(p.read(&r).await.unwrap(), payload);
        assert!(r.holds(&payload));
        // A run that takes it gets a copy of its own.
        let run = Uuid::now_v7();
        let copied = Ref::of(&p.offload(run, &stored, None).await.unwrap().unwrap()).unwrap();
        assert!(!copied.event);
        assert_eq!((copied.run, p.read(&copied).await.unwrap()), (run, payload.clone()));
        // The events' sweep deletes it once its rows are gone, and not the
        // run's copy; the runs' sweep and a month's drop leave it.
        let later = chrono::Utc::now() + chrono::Duration::seconds(1);
        let copy = copied.object;
        assert_eq!(p.sweep(later, |_| async move { Ok([copy].into()) }).await.unwrap().deleted, 0);
        let object = r.object;
        assert_eq!(p.sweep_events(later, |_| async move { Ok([object].into()) }).await.unwrap(), 0);
        assert_eq!(p.sweep_events(later, |_| async { Ok(Default::default()) }).await.unwrap(), 1);
        assert!(p.read(&r).await.is_err());
        assert_eq!(p.read(&copied).await.unwrap(), payload);
        let kept = Ref::of(&p.offload_event(&payload).await.unwrap().unwrap()).unwrap();
        p.drop_month(&crate::month_of(run).unwrap()).await.unwrap();
        assert!(p.read(&copied).await.is_err(), "the run's month is gone");
        assert_eq!(p.read(&kept).await.unwrap(), payload, "the event's is not the run's month");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_value_past_a_part_is_written_in_parts_and_reads_back_as_its_reference_says() {
        let dir = scratch("parts");
        let p = payloads(&dir, 1024);
        let run = Uuid::now_v7();
        let big = serde_json::json!({"rows": (0..9_000).map(|i| format!("{i:>1000}")).collect::<Vec<_>>()});
        let text = serde_json::to_vec(&big).unwrap();
        assert!(text.len() > PART, "{} bytes", text.len());
        let r = Ref::of(&p.offload(run, &big, None).await.unwrap().unwrap()).unwrap();
        assert_eq!((r.bytes, r.sha256.as_str()), (text.len() as u64, sha256_hex(&text).as_str()));
        assert_eq!(p.read(&r).await.unwrap(), big);
        assert!(r.holds(&big));
        // Unchanged, it keeps its object; changed, it gets another.
        assert_eq!(Ref::of(&p.offload(run, &big, Some(&r)).await.unwrap().unwrap()).unwrap(), r);
        let mut changed = big.clone();
        changed["rows"][8_999] = serde_json::json!("x");
        assert_ne!(Ref::of(&p.offload(run, &changed, Some(&r)).await.unwrap().unwrap()).unwrap().object, r.object);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A copy reads back through the same reference from where it was
    /// copied to, small or in parts; a changed object copies nothing, and
    /// a copy already there is left.
    #[tokio::test]
    async fn an_object_copied_reads_back_by_its_reference_and_a_changed_one_is_not_copied() {
        let (from, to) = (scratch("copy-from"), scratch("copy-to"));
        let (p, q) = (payloads(&from, 8), payloads(&to, usize::MAX));
        let run = Uuid::now_v7();
        let small = serde_json::json!({"text": "x".repeat(100)});
        let big = serde_json::json!({"rows": (0..9_000).map(|i| format!("{i:>1000}")).collect::<Vec<_>>()});
        for value in [&small, &big] {
            let r = Ref::of(&p.offload(run, value, None).await.unwrap().unwrap()).unwrap();
            assert!(q.read(&r).await.unwrap_err().is_missing());
            p.copy_to(&r, &q).await.unwrap();
            assert_eq!(&q.read(&r).await.unwrap(), value);
            // Copied again: left as it is.
            p.copy_to(&r, &q).await.unwrap();
            assert_eq!(&q.read(&r).await.unwrap(), value);
            // A copy of the right size that is not the value is written again.
            let copy = to.join(path_of(&q.at.as_ref().unwrap().0, &r).as_ref());
            let mut text = std::fs::read(&copy).unwrap();
            let last = text.len() - 3;
            text[last] = b'z';
            std::fs::write(&copy, &text).unwrap();
            assert!(q.read(&r).await.is_err());
            p.copy_to(&r, &q).await.unwrap();
            assert_eq!(&q.read(&r).await.unwrap(), value);
            // Changed where it was kept, a byte at the end: nothing copied.
            let r2 = Ref::of(&p.offload(run, value, None).await.unwrap().unwrap()).unwrap();
            let file = from.join(path_of(&p.at.as_ref().unwrap().0, &r2).as_ref());
            let mut text = std::fs::read(&file).unwrap();
            let last = text.len() - 2;
            text[last] = b'y';
            std::fs::write(&file, &text).unwrap();
            let err = p.copy_to(&r2, &q).await.unwrap_err().to_string();
            assert!(err.contains("SHA-256"), "{err}");
            assert!(q.read(&r2).await.unwrap_err().is_missing(), "no copy of a changed object");
        }
        std::fs::remove_dir_all(from).unwrap();
        std::fs::remove_dir_all(to).unwrap();
    }
}
