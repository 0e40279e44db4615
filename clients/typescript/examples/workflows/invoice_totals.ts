/** examples/invoice_totals.json, built in code: `definition()` is that file's definition. */

import { http, tpl, workflow } from "@composer/client";

const wf = workflow<{ target: string; invoices: number[] }>("invoice_totals", {
  description: "A MAP of up to a million items that keeps no list of outputs: a reduction sums the amounts as items end, and up to 1% of them may fail.",
});

const price = wf.map<number, unknown, { total: number; failed: number }>("price", {
  items: wf.input.invoices,
  max_concurrency: 500,
  tolerated_failures: "1%",
  collect: {
    init: { total: 0, failed: 0 },
    reduce: '.item as $i | .acc | if $i.state == "COMPLETED" then .total += $i.output.body.amount else .failed += 1 end',
  },
  node: (item) => http({ url: tpl`${wf.input.target}/invoices/${item}` }, { retry: { max_attempts: 3 } }),
});

export default wf.returns(price.out);
