/** examples/fulfil_on_order.json, built in code: `definition()` is that file's definition. */

import { jq, refs, tpl, workflow } from "@composer/client";

interface Order {
  order: number;
  total: number;
  items?: string[];
}

const wf = workflow<Order>("fulfil_on_order", {
  description: "Started by every order.created event with a total: one run per order (the order's id is the idempotency key), whatever sends the event and however often.",
});
wf.transform("pack", { order: wf.input.order, items: jq`${wf.input.items} // []` });

const event = refs.event<Order>();
wf.set({
  triggers: [
    {
      event: "order.created",
      when: jq`${event.payload.total} > 0`,
      input: event.payload,
      idempotency_key: tpl`order-${event.payload.order}`,
    },
  ],
});

export default wf;
