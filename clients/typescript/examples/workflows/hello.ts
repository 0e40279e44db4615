/** examples/hello.json, built in code: `definition()` is that file's definition. */

import { jq, tpl, workflow } from "@composer/client";

const wf = workflow<{ coordinator: string }>("hello", {
  description: "Three steps: call the health endpoint of the coordinator the run's input names ({\"coordinator\": URL}), pause for a second, call it again.",
});

const check = wf.http(
  "check",
  {
    method: "GET",
    // ${ .input.coordinator // error("...") }: a jq expression put in a template.
    url: tpl`${jq`${wf.input.coordinator} // error("the input names no coordinator URL")`}/healthz`,
    timeout: "5s",
  },
  { retry: { max_attempts: 3, initial_backoff: "500ms" } },
);
const pause = wf.wait("pause", { duration: "1s" }, { after: check });
wf.http("recheck", { method: "GET", url: tpl`${wf.input.coordinator}/healthz` }, { after: pause });

export default wf;
