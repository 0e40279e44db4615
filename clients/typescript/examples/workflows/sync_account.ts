/** examples/sync_account.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; customer_id: string }>("sync_account", {
  description: "Concurrency limit: at most one sync per customer at a time; more runs for a customer wait QUEUED and start oldest first.",
});
wf.set({ concurrency: { key: wf.input.customer_id, max: 1 } });

wf.http("pull", { method: "POST", url: tpl`${wf.input.target}/echo/crm/sync`, body: { customer: wf.input.customer_id } });

export default wf;
