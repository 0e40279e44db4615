/** examples/notify_failure.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; day: string; export: string; why: string; run: string }>("notify_failure", {
  description: "The handler of nightly_export's failures: posts what failed to a chat hook.",
});
const { target, day, why, run } = wf.input;

wf.http("post", {
  method: "POST",
  url: tpl`${target}/echo/chat/hooks/ops`,
  body: { text: tpl`export for ${day} ended ${wf.input.export}: ${why}`, run },
});

export default wf;
