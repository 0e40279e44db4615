"""A workflow written in Python, and the worker that runs its steps.

    composer dev                 # in one terminal: the coordinator on 127.0.0.1:8080
    python3 workflow.py          # in another: registers `greet`, then runs its steps
    composer run start greet --input '{"name": "Ada"}'

Each step is a plain function: its parameters are what it reads (the run's
input, other steps' outputs) and mypy checks that each matches the type of
what it is given.
"""

import logging
from dataclasses import dataclass
from typing import Literal

from composer_client.workflow import Retry, Workflow, run_worker, transform


@dataclass
class Person:
    """The run's input: its JSON Schema (input_schema) is made from this."""

    name: str
    language: Literal["en", "fr"] = "en"


@dataclass
class Greeting:
    text: str
    language: str


def greet(person: Person) -> Greeting:
    """Step 1: runs on this process's worker."""
    hello = {"en": "Hello", "fr": "Bonjour"}[person.language]
    return Greeting(f"{hello}, {person.name}!", person.language)


def shout(greeting: Greeting) -> Greeting:
    """Step 2: reads step 1's output, typed."""
    return Greeting(greeting.text.upper(), greeting.language)


wf = Workflow("greet", input=Person, description="Greets a person, loudly", timeout="5m")
greeting = wf.step(greet, wf.input, retry=Retry(max_attempts=3, initial_backoff="1s"))
loud = wf.step(shout, greeting)
# A TRANSFORM: evaluated by the coordinator, no worker needed.
summary = wf.add("summary", transform({"for": wf.input["name"], "said": greeting["text"], "shouted": loud["text"]}))
wf.output = summary


def main() -> None:
    """Registers the workflow (once per content: a restart with the same
    definition registers nothing new) and runs its steps until Ctrl-C.
    COMPOSER_URL (default http://127.0.0.1:8080), COMPOSER_API_TOKEN and
    COMPOSER_WORKER_TOKEN are read from the environment."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_worker(wf)


if __name__ == "__main__":
    main()
