/** examples/checkout.json, built in code: `definition()` is that file's definition. */

import { workflow } from "@composer/client";

import billing from "./billing.js";

const wf = workflow<{ target: string; customer: string; amount: number }>("checkout", {
  description: "SUB_WORKFLOW: billing is its own workflow (examples/billing.json, registered first); its output is this node's output. A failed billing run is retried as a new child run.",
});

// The child's output type is billing's: {invoice, amount}.
const bill = wf.subWorkflow(
  "bill",
  { workflow: billing, input: { target: wf.input.target, customer: wf.input.customer, amount: wf.input.amount } },
  { timeout: "10m", retry: { max_attempts: 2, initial_backoff: "30s" } },
);
const receipt = wf.transform("receipt", { customer: wf.input.customer, invoice: bill.out.invoice });

export default wf.returns(receipt.out);
