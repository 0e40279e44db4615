/** examples/check_export.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; export: string }>("check_export", {
  description: "One check of an export's status (the iteration of wait_for_export). Input: {\"target\": base URL of the services, \"export\": \"exp_1\"}.",
});

const status = wf.http<{ status: string }>("status", { url: tpl`${wf.input.target}/exports/${wf.input.export}` });

export default wf.returns({ status: status.out.body.status });
