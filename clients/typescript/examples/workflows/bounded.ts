/** examples/bounded.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; amount: number }>("bounded", {
  description: "Time limits: each attempt of the charge gets 10 seconds, the whole run one hour. Input: {\"target\": base URL of the services (composer dev: http://HOST:PORT/demo), \"amount\": 30}.",
  timeout: "1h",
});

const charge = wf.http<{ id: string }>(
  "charge",
  { method: "POST", url: tpl`${wf.input.target}/pay/charge`, body: { amount: wf.input.amount } },
  { timeout: "10s", retry: { max_attempts: 3, initial_backoff: "2s" } },
);
// Reads charge's output: the edge charge -> receipt.
const receipt = wf.transform("receipt", { paid: wf.input.amount, charge: charge.out.body.id });

export default wf.returns(receipt.out);
