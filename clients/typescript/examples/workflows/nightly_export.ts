/** examples/nightly_export.json, built in code: `definition()` is that file's definition. */

import { at, refs, tpl, workflow } from "@composer/client";

import notifyFailure from "./notify_failure.js";

const wf = workflow<{ target: string; day: string }>("nightly_export", {
  description: "A failure handler: when an export fails (or times out, or is cancelled), a run of notify_failure is started in the same commit, with what failed.",
  timeout: "2h",
});
const failed = refs.failedRun;
wf.set({
  onFailure: {
    workflow: notifyFailure,
    on: ["FAILED", "CANCELLED"],
    input: {
      run: failed.id,
      why: failed.error,
      // .failed_run.nodes is keyed by node id: at() reaches one without an index check.
      export: at(failed.nodes, "export", "state"),
      day: wf.input.day,
      target: wf.input.target,
    },
  },
});

wf.http(
  "export",
  { method: "POST", url: tpl`${wf.input.target}/exports`, body: { day: wf.input.day } },
  { retry: { max_attempts: 3 } },
);

export default wf;
