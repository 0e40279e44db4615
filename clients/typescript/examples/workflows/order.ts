/** examples/order.json, built in code: `definition()` is that file's definition. */

import { tpl, workflow } from "@composer/client";

interface OrderInput {
  target: string;
  order_id: string;
  amount: number;
}

const wf = workflow<OrderInput>("order", {
  description: "An order: charge it (one charge per order, however often the call is retried: the order's Idempotency-Key), cool off, wait for the shipment event, summarise. A declined charge takes the failure edge: refund, then end the run FAILED. Input: {\"target\": base URL of the services (composer dev: http://HOST:PORT/demo), \"order_id\": \"o-1\", \"amount\": 30}; an amount over 1000 is declined.",
});
const { target, order_id, amount } = wf.input;

const charge = wf.http<{ id: string }>(
  "charge",
  {
    method: "POST",
    url: tpl`${target}/pay/charge`,
    idempotency_key: tpl`order-${order_id}`,
    body: { amount, order: order_id },
    timeout: "10s",
  },
  { retry: { max_attempts: 5, initial_backoff: "1s", multiplier: 2.0, max_backoff: "1m" } },
);
const coolOff = wf.wait("cool_off", { duration: "2s" }, { after: charge });
const shipped = wf.waitForEvent<{ carrier: string }>(
  "shipped",
  { event: "shipment.sent", key: order_id, timeout: "7d" },
  { after: coolOff },
);
// Reads charge and shipped: an edge from shipped (charge already leads to it).
const summary = wf.transform("summary", { paid: charge.out.body.id, carrier: shipped.out.carrier });

// The failure edge: a declined charge is refunded, then the run ends FAILED.
const refund = wf.http(
  "refund",
  {
    method: "POST",
    url: tpl`${target}/pay/refund`,
    body: { order: order_id, reason: charge.error.code, status: charge.error.status },
  },
  { after: { node: charge, on: "failure" } },
);
wf.fail(
  "order_failed",
  { message: tpl`order ${order_id} was not charged (${charge.error.message}); it was refunded`, code: "charge_failed" },
  { after: refund },
);

export default wf.returns({ summary: summary.out, order: order_id });
