//! The items of a large MAP, kept apart from their run's line: a MAP of
//! more than [`composer_api::rest::ITEMS_IN_LINE`] items goes to
//! `items/<run>/<k>-<NNNNN>.jsonl.gz` files (`k` the MAP's place among the
//! run's MAPs), each a gzip of JSON Lines with one item per line by index,
//! at most [`ITEMS_PER_FILE`] items or [`ITEM_FILE_BYTES`] of JSON; the
//! run's line names them ([`ArchivedRun::item_files`]) and a reader takes
//! them a page at a time. So a run's line stays small whatever its MAPs
//! hold, and no reader holds a million items to show a hundred. What a
//! file holds and how it is named are here; the crate writes and reads
//! them (`Writer::add`, `read_items`).

use std::collections::BTreeMap;

use uuid::Uuid;

use composer_api::rest::{ArchivedRun, ItemFile, TaskView};

/// Most items in one item file.
pub const ITEMS_PER_FILE: usize = 10_000;

/// Most bytes of JSON Lines in one item file before it is compressed: a
/// file is built in memory, and a page's read inflates one or two.
pub const ITEM_FILE_BYTES: usize = 16 << 20;

/// The directory of every run's item files, from the archive's directory.
pub(crate) const DIR: &str = "items";

/// The directory of a run's item files, from the archive's directory.
pub(crate) fn dir_of(run: Uuid) -> String {
    format!("{DIR}/{run}")
}

/// The next item file of a MAP's `items` from `from` on: its JSON Lines
/// (at most [`ITEMS_PER_FILE`] items, or past [`ITEM_FILE_BYTES`] by one
/// item) and what the run's line says of it, named as the `n`th file of
/// the run's `k`th MAP; and where the next file begins.
pub(crate) fn next_file(
    run: Uuid,
    (k, n): (usize, usize),
    items: &[TaskView],
    from: usize,
) -> Result<(Vec<u8>, ItemFile, usize), String> {
    let mut text = Vec::new();
    let (mut first, mut last, mut at) = (None, 0, from);
    while at < items.len() && at - from < ITEMS_PER_FILE && text.len() < ITEM_FILE_BYTES {
        let item = &items[at];
        let index = item.item_index.ok_or_else(|| format!("item {at} of a MAP has no index"))?;
        serde_json::to_writer(&mut text, item).map_err(|e| e.to_string())?;
        text.push(b'\n');
        first.get_or_insert(index);
        last = index;
        at += 1;
    }
    let file = format!("{}/{k}-{n:05}.jsonl.gz", dir_of(run));
    let described = ItemFile { file, first: first.unwrap_or(0), last, items: (at - from) as u64 };
    Ok((text, described, at))
}

/// `run`'s line: the run without the items its item files hold, naming
/// them.
#[derive(serde::Serialize)]
pub(crate) struct Line<'a> {
    run: &'a composer_api::rest::RunView,
    history: &'a [composer_api::rest::HistoryEntryView],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    items: BTreeMap<&'a str, &'a [TaskView]>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    item_files: &'a BTreeMap<String, Vec<ItemFile>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    logs: &'a [composer_api::rest::AttemptLog],
}

impl<'a> Line<'a> {
    pub(crate) fn of(run: &'a ArchivedRun, files: &'a BTreeMap<String, Vec<ItemFile>>) -> Line<'a> {
        let items = run.items.iter().filter(|(node, _)| !files.contains_key(*node));
        Line {
            run: &run.run,
            history: &run.history,
            items: items.map(|(node, items)| (node.as_str(), items.as_slice())).collect(),
            item_files: files,
            logs: &run.logs,
        }
    }
}

/// Appends to `page` the items of MAP `node` of an item file's JSON Lines
/// `text` after index `after`, until it holds `limit`: a line before
/// `after` is read only as far as its index. An item of another node is an
/// error (a file that is not the one its line meant); the error names the
/// line.
pub(crate) fn page_of(
    text: &str,
    node: &str,
    after: i32,
    limit: usize,
    page: &mut Vec<TaskView>,
) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Index {
        item_index: Option<i32>,
    }
    let of_node = format!("{node}[");
    for (n, line) in text.lines().enumerate() {
        if page.len() >= limit {
            break;
        }
        let at = |e: serde_json::Error| format!("line {}: {e}", n + 1);
        let index: Index = serde_json::from_str(line).map_err(at)?;
        if index.item_index.is_none_or(|i| i <= after) {
            continue;
        }
        let item: TaskView = serde_json::from_str(line).map_err(at)?;
        if !item.node_id.starts_with(&of_node) {
            return Err(format!("line {}: an item of {:?}, not of MAP {node:?}", n + 1, item.node_id));
        }
        page.push(item);
    }
    Ok(())
}

/// The name in its run's directory of `file`, if it is one of run `run`'s
/// item files (`items/<run>/<k>-<NNNNN>.jsonl.gz`).
pub(crate) fn item_file_name(run: Uuid, file: &str) -> Option<&str> {
    let name = file.strip_prefix(&format!("{}/", dir_of(run)))?;
    let (k, n) = name.strip_suffix(".jsonl.gz")?.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 6 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(k) && digits(n)).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_runs_own_item_files_are_read() {
        let run = Uuid::now_v7();
        assert_eq!(item_file_name(run, &format!("items/{run}/0-00003.jsonl.gz")), Some("0-00003.jsonl.gz"));
        let other = Uuid::now_v7();
        for bad in [
            format!("items/{other}/0-00003.jsonl.gz"),
            format!("items/{run}/../x/0-00003.jsonl.gz"),
            format!("items/{run}/0-00003.json"),
            format!("items/{run}/a-00003.jsonl.gz"),
            format!("items/{run}/0-.jsonl.gz"),
            "part-00000.jsonl.gz".to_string(),
            format!("/items/{run}/0-00003.jsonl.gz"),
        ] {
            assert_eq!(item_file_name(run, &bad), None, "{bad}");
        }
    }
}
