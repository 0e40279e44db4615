/** examples/billing.json, built in code: `definition()` is that file's definition. */

import { refs, tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; customer: string; amount: number }>("billing", {
  description: "The child of checkout: charges the customer once (the Idempotency-Key is this run's, so a retried call is not a second charge) and returns the invoice.",
});

const charge = wf.http<{ id: string; amount: number }>(
  "charge",
  {
    method: "POST",
    url: tpl`${wf.input.target}/pay/charge`,
    idempotency_key: tpl`bill-${refs.run.id}`,
    body: { amount: wf.input.amount, customer: wf.input.customer },
  },
  { retry: { max_attempts: 3, initial_backoff: "1s" } },
);

export default wf.returns({ invoice: charge.out.body.id, amount: charge.out.body.amount });
