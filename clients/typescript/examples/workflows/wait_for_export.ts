/** examples/wait_for_export.json, built in code: `definition()` is that file's definition. */

import { jq, tpl, workflow } from "@composer/client";

import checkExport from "./check_export.js";

const wf = workflow<{ target: string; export: string }>("wait_for_export", {
  description: "LOOP: run check_export every second until it reports done, at most 60 times; the output is the last check and how many it took.",
});

// Each iteration is a run of check_export: its output type is check_export's ({status}).
const poll = wf.loop("poll", {
  workflow: checkExport,
  input: (iteration, previous) => ({
    target: wf.input.target,
    export: wf.input.export,
    try: iteration.index,
    last: previous.status,
  }),
  until: (iteration) => jq`${iteration.output.status} == "done"`,
  max_iterations: 60,
  delay: "1s",
});
wf.fail(
  "gave_up",
  { message: tpl`export ${wf.input.export} was not done: ${poll.error.message}`, code: "export_not_done" },
  { after: { node: poll, on: "failure" } },
);

export default wf.returns(poll.out.output);
