/** examples/pay_once.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; order_id: string; amount: number }>("pay_once", {
  description: "At most once: a charge whose outcome is unknown (its worker died, its request timed out) waits IN_DOUBT for an operator instead of being sent again; retries of one execution share one Idempotency-Key.",
});

wf.http(
  "charge",
  {
    method: "POST",
    url: tpl`${wf.input.target}/pay/charge`,
    timeout: "10s",
    idempotency_key: tpl`order-${wf.input.order_id}`,
    body: { amount: wf.input.amount, order: wf.input.order_id },
  },
  { delivery: "at_most_once", retry: { max_attempts: 3 } },
);

export default wf;
