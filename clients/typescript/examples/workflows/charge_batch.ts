/** examples/charge_batch.json, built in code: `definition()` is that file's definition. */

import { http, tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; account: string; charges: Array<{ amount: number }> }>("charge_batch", {
  description: "Limits on steps across runs: charges go out at most 25 a second (a burst of 50) per Stripe account, and at most 4 CRM updates are in flight across every run; a 429 with Retry-After holds the account's key that long. 'partner' is a named limit: set it with PUT /v1/limits/partner.",
});

const chargeEach = wf.map("charge_each", {
  items: wf.input.charges,
  node: (item) =>
    http(
      { method: "POST", url: tpl`${wf.input.target}/pay/charge`, body: item },
      { limits: [{ key: tpl`stripe:${wf.input.account}`, rate: "25/1s", burst: 50 }] },
    ),
});
wf.http(
  "update_crm",
  { method: "POST", url: tpl`${wf.input.target}/echo/crm/accounts/${wf.input.account}/charged` },
  { after: chargeEach, limits: [{ key: "crm", concurrency: 4 }, { key: "partner" }] },
);

export default wf;
