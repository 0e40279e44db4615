//! Runs kept past their rows: one run as an archive or an export holds it
//! (what the API showed of it), a page of the export API, and the manifest
//! that lists an archive's or an export's files.
//!
//! An archive or an export is a directory of objects: `manifest.json` and
//! `part-NNNNN.jsonl.gz` files, each a gzip of JSON Lines with one
//! [`ArchivedRun`] per line, runs in id order, and the items of its large
//! MAPs in `items/<run>/` ([`ItemFile`]). The manifest is written last,
//! so a directory without one is a write that did not finish.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::logs::LogLineView;
use super::runs::{HistoryEntryView, RunView, TaskView};

/// The format an archive's and an export's manifest names: `/2` keeps a
/// large MAP's items in files of their own ([`ArchivedRun::item_files`]).
pub const ARCHIVE_FORMAT: &str = "composer-runs/2";

/// The formats a reader takes: this one, and `/1`, written before item
/// files (a `/1` reader refuses a `/2` manifest rather than miss items).
pub const ARCHIVE_FORMATS_READ: [&str; 2] = ["composer-runs/1", ARCHIVE_FORMAT];

/// One run as an archive or an export holds it: what the API showed of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ArchivedRun {
    /// The run with its tasks, as getRun answers.
    pub run: RunView,
    /// Its whole history, oldest first, as getRunHistory pages it.
    pub history: Vec<HistoryEntryView>,
    /// Each MAP's items by index, by the MAP's node id, as listMapItems pages them; a MAP of
    /// more than [`ITEMS_IN_LINE`] items (or [`ITEMS_IN_LINE_BYTES`]) is not here but in
    /// `item_files`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub items: BTreeMap<String, Vec<TaskView>>,
    /// The MAPs whose items an archive keeps in files of their own, beside the run's line (more
    /// than [`ITEMS_IN_LINE`], or [`ITEMS_IN_LINE_BYTES`]), by the MAP's node id: read them a
    /// page at a time (listArchivedMapItems).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub item_files: BTreeMap<String, Vec<ItemFile>>,
    /// The log lines of every step attempt that has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<AttemptLog>,
}

/// Most items of one MAP a run's line holds: a MAP of more keeps them in
/// files of their own ([`ArchivedRun::item_files`]), as does one whose
/// items are more than [`ITEMS_IN_LINE_BYTES`] of JSON, so that a run's
/// line stays small whatever its MAPs' sizes.
pub const ITEMS_IN_LINE: usize = 1000;

/// Most bytes of JSON of one MAP's items a run's line holds.
pub const ITEMS_IN_LINE_BYTES: usize = 16 << 20;

/// A file of a MAP's items that an archive keeps apart from its run's line:
/// a gzip of JSON Lines, one item (as listMapItems shows it) per line, by
/// index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ItemFile {
    /// Its name, from the archive's directory.
    pub file: String,
    /// The index of its first item and of its last.
    pub first: i32,
    pub last: i32,
    /// How many items it holds.
    pub items: u64,
}

/// The log lines of one attempt of one step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct AttemptLog {
    /// The step's node id (a MAP item: `ship_each[3]`).
    pub node: String,
    pub attempt: i32,
    pub lines: Vec<LogLineView>,
}

/// `GET /v1/export/runs`: the runs a filter matches, in id order;
/// `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ExportPage {
    pub runs: Vec<ArchivedRun>,
    pub next_after: Option<Uuid>,
}

/// An archive's or an export's list of its files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Manifest {
    /// [`ARCHIVE_FORMAT`] as written; a reader takes any of [`ARCHIVE_FORMATS_READ`].
    pub format: String,
    /// The namespace the runs are of.
    pub namespace: String,
    /// When the last file was written.
    pub written_at: DateTime<Utc>,
    /// What chose the runs: a month of retention (`{"month": "2026_07"}`)
    /// or an export's filter.
    pub selection: serde_json::Value,
    /// How many runs in all.
    pub runs: u64,
    /// The files, in run id order.
    pub parts: Vec<ManifestPart>,
    /// Where the runs' offloaded values are, beside the manifest (an
    /// archive: `payloads`): its lines hold references to them
    /// (`{"$composer_offloaded": …}`) in place of those values, and a run
    /// is read back with them (`GET /v1/archive/runs/{id}`). Absent (an
    /// export), every value is in its line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payloads: Option<String>,
}

/// One file of an archive or an export.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ManifestPart {
    /// Its name in the manifest's directory.
    pub file: String,
    pub runs: u64,
    /// Its first and last run id: a run is read from the one part whose
    /// range holds its id.
    pub first: Uuid,
    pub last: Uuid,
    /// Its size, compressed.
    pub bytes: u64,
}
