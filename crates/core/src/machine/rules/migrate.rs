//! A run moved to another version: its steps were renamed to the new
//! version's nodes (`machine::migrate::move_run`) and the machine now
//! runs under it; the move is recorded and what the new version readies
//! starts.

use serde_json::json;

use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::RunStatus;
use crate::machine::migrate::Mapping;
use crate::machine::state::Machine;
use crate::machine::transition::Ignore;

impl Machine<'_> {
    pub(super) fn on_migrate(&mut self, from_version: i32, to_version: i32, map: Mapping) -> Result<(), Ignore> {
        self.require_active()?;
        self.tr
            .log(HistoryKind::RunMigrated, json!({"from_version": from_version, "to_version": to_version, "map": map}));
        // A queued run has not started: its start routes it, under the new version.
        if self.run.status != RunStatus::Queued {
            self.route();
        }
        Ok(())
    }
}
