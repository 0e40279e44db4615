/** examples/ship_orders.json, built in code: `definition()` is that file's definition. */

import { http, jq, tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; orders: Array<{ id: string }> }>("ship_orders", {
  description: "MAP: one shipment call per order, ten at a time; an order that cannot ship is reported, not fatal.",
});

const shipEach = wf.map("ship_each", {
  items: wf.input.orders,
  max_concurrency: 10,
  on_item_failure: "continue",
  node: (order, index) =>
    http(
      { method: "POST", url: tpl`${wf.input.target}/echo/ship/orders`, body: { order: order.id, position: index } },
      { retry: { max_attempts: 3 }, timeout: "30s" },
    ),
});
// jq over the MAP's output: the edge ship_each -> report comes from reading it.
const report = wf.transform("report", {
  shipped: jq<number>`[${shipEach.out}[] | select(has("error") | not)] | length`,
  failed: jq<number[]>`[${shipEach.out} | to_entries[] | select(.value | has("error")) | .key]`,
});

export default wf.returns(report.out);
