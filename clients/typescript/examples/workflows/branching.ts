/** examples/branching.yaml, built in code: `definition()` is that file's definition. */

import { jq, workflow } from "@composer/client";

const wf = workflow<{ amount: number }>("branching");

const start = wf.transform("start", { big: jq<boolean>`${wf.input.amount} > 100` });
const review = wf.wait("review", { duration: "2s" }, { after: { node: start, when: jq`${start.out.big}` } });
const fastTrack = wf.transform("fast_track", { track: "fast" }, { after: { node: start, when: jq`${start.out.big} | not` } });
// A join after either branch: it runs when one of them was taken.
wf.transform(
  "done",
  { amount: wf.input.amount, reviewed: jq<boolean>`${review.state} == "COMPLETED"` },
  { after: [review, fastTrack] },
);

export default wf;
