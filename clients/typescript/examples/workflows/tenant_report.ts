/** examples/tenant_report.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; tenant: string; month: string }>("tenant_report", {
  description: "Priorities and fairness: reports run at priority 4 (urgent ones are started with --priority 1); at most 20 run at once, and the tenants' queued reports take turns, so one tenant's thousand queued reports do not hold up another's one.",
  priority: 4,
  concurrency: { max: 20 },
});
wf.set({ fairnessKey: wf.input.tenant });

wf.http("build", {
  method: "POST",
  url: tpl`${wf.input.target}/echo/reports/build`,
  body: { tenant: wf.input.tenant, month: wf.input.month },
});

export default wf;
