/**
 * A workflow written in TypeScript, and the worker that runs its steps.
 *
 *     composer dev                 # in one terminal: the coordinator on 127.0.0.1:8080
 *     npm start                    # in another: registers `greet`, then runs its steps
 *     composer run start greet --input '{"name": "Ada"}'
 *
 * Each step says what it reads (the run's input, other steps' outputs);
 * its handler gets those values typed, and tsc refuses a handler that uses
 * them as something they are not.
 */

import { pathToFileURL } from "node:url";

import { s, serve, workflow, type Infer } from "@composer/client";

/** The run's input: the definition's input_schema is made from this. */
const Person = s.object({
  name: s.string({ minLength: 1 }),
  language: s.optional(s.enum(["en", "fr"])),
});
export type Person = Infer<typeof Person>;

const Greeting = s.object({ text: s.string(), language: s.string() });

export const wf = workflow("greet", { input: Person, description: "Greets a person, loudly", timeout: "5m" });

/** Step 1: runs on this process's worker. */
const greeting = wf.step("greet", {
  reads: { person: wf.input },
  output: Greeting,
  retry: { max_attempts: 3, initial_backoff: "1s" },
  handler: ({ person }) => {
    const language = person.language ?? "en";
    const hello = { en: "Hello", fr: "Bonjour" }[language];
    return { text: `${hello}, ${person.name}!`, language };
  },
});

/** Step 2: reads step 1's output, typed. */
const loud = wf.step("shout", {
  reads: { greeting },
  output: Greeting,
  handler: ({ greeting }) => ({ text: greeting.text.toUpperCase(), language: greeting.language }),
});

/** A TRANSFORM: evaluated by the coordinator, no worker needed. */
const summary = wf.transform("summary", { for: wf.input.name, said: greeting.out.text, shouted: loud.out.text });

export default wf.returns(summary.out);

/**
 * Registers the workflow (once per content: a restart with the same
 * definition registers nothing new) and runs its steps until Ctrl-C.
 * COMPOSER_URL (default http://127.0.0.1:8080), COMPOSER_API_TOKEN and
 * COMPOSER_WORKER_TOKEN are read from the environment.
 */
export async function main(): Promise<void> {
  const url = process.env["COMPOSER_URL"] ?? "http://127.0.0.1:8080";
  const apiToken = process.env["COMPOSER_API_TOKEN"];
  await serve(
    {
      url,
      apiToken,
      token: process.env["COMPOSER_WORKER_TOKEN"] ?? apiToken,
      workflows: [wf],
      onRegistered: (versions) => {
        for (const v of versions) console.log(`registered ${v.name} version ${v.version}${v.created ? "" : " (unchanged)"}`);
      },
    },
    { handleSignals: true },
  );
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exitCode = 1;
  });
}
