//! The deadlines a transaction's runs arm and disarm, written with them
//! ([`super::write`]); [`super::deadlines`] fires them.

use composer_core::definition::{Deadline, NodeKind};
use composer_core::machine::HistoryKind;
use composer_store::deadlines::Armed;
use uuid::Uuid;

use super::loaded::Loaded;

/// The deadlines `all`'s transitions arm (a started run's own, a created
/// step's), and the runs with deadlines they end.
pub(super) fn arming<'a>(all: &[&'a Loaded]) -> (Vec<Armed<'a>>, Vec<Uuid>) {
    let (mut armed, mut ended) = (Vec::new(), Vec::new());
    let ms = |d: &Deadline| i64::try_from(d.after.as_millis()).unwrap_or(i64::MAX);
    for l in all.iter().filter(|l| l.handles.is_none()) {
        let (wf, run_id) = (&l.wf, l.run.id);
        if !wf.deadlines.is_empty() && l.tr.history.iter().any(|h| h.kind == HistoryKind::RunStarted) {
            for (i, d) in wf.deadlines.iter().enumerate() {
                armed.push(Armed { run_id, node_id: "", idx: i as i32, after_ms: ms(d) });
            }
        }
        for &i in &l.tr.created {
            let t = &l.run.tasks[i];
            let node = &wf.nodes[t.node];
            if node.deadlines.is_empty() || t.item.is_some() || t.removed || t.state.is_terminal() {
                continue;
            }
            for (k, d) in node.deadlines.iter().enumerate() {
                armed.push(Armed { run_id, node_id: &node.id, idx: k as i32, after_ms: ms(d) });
            }
        }
        // An approval assigned (it began to wait) or escalated: its notification, due now.
        for h in
            l.tr.history.iter().filter(|h| matches!(h.kind, HistoryKind::TaskWaiting | HistoryKind::ApprovalEscalated))
        {
            let node = wf.nodes.iter().find(|n| Some(n.id.as_str()) == h.payload["node_id"].as_str());
            if let Some(n) = node.filter(|n| matches!(&n.kind, NodeKind::Approval(a) if a.notify.is_some())) {
                // Once per statement: a row armed twice in one would be an error.
                let idx = composer_store::deadlines::NOTIFY;
                if !armed.iter().any(|a| a.run_id == run_id && a.node_id == n.id && a.idx == idx) {
                    armed.push(Armed { run_id, node_id: &n.id, idx, after_ms: 0 });
                }
            }
        }
        let any = || !wf.deadlines.is_empty() || wf.nodes.iter().any(|n| !n.deadlines.is_empty());
        if l.tr.run_changed && l.run.status.is_terminal() && any() {
            ended.push(run_id);
        }
    }
    (armed, ended)
}
