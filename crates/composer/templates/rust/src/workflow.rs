//! The workflow, declared in code: typed steps whose handlers take what
//! they read, so a step given the wrong type does not compile.

use composer_worker::workflow::{engine_node, WorkflowBuilder};
use composer_worker::TaskError;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The run's input: serde reads it, and its `ToSchema` is the workflow's
/// `input_schema`, which the server checks at every start.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, utoipa::ToSchema)]
pub struct Person {
    #[schema(min_length = 1)]
    pub name: String,
}

/// What `greet` gives and `shout` reads.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Greeting {
    pub text: String,
}

pub fn greet(person: Person) -> Result<Greeting, TaskError> {
    if person.name.trim().is_empty() {
        return Err(TaskError::fatal("a greeting needs a name"));
    }
    Ok(Greeting { text: format!("Hello, {}!", person.name) })
}

pub fn shout(greeting: Greeting) -> Result<Greeting, TaskError> {
    Ok(Greeting { text: greeting.text.to_uppercase() })
}

/// `greet` → `shout` → a TRANSFORM the coordinator evaluates.
pub fn workflow() -> WorkflowBuilder {
    let mut wf = WorkflowBuilder::new("greet");
    wf.set_input_type::<Person>();
    let person = wf.input::<Person>();
    let greeting = wf.step("greet", person.clone(), |_ctx, p: Person| async move { greet(p) });
    let loud = wf.step("shout", greeting.output(), |_ctx, g: Greeting| async move { shout(g) });
    let summary = wf.node(
        engine_node(
            "summary",
            "TRANSFORM",
            json!({"output": {
            "for": person.field::<String>("name").template(),
            "said": greeting.output().field::<String>("text").template(),
            "shouted": loud.output().field::<String>("text").template()}}),
        ),
        &["shout"],
    );
    wf.set_output(summary.template());
    wf
}

#[cfg(test)]
mod tests {
    use composer_worker::workflow::Mocks;

    use super::*;

    /// Offline, through the engine's own rules, with the steps' own code.
    #[test]
    fn the_workflow_greets_and_shouts() {
        let wf = workflow();
        let (greet_step, shout_step) = (wf.spec().nodes[0].id.clone(), wf.spec().nodes[1].id.clone());
        let mut mocks = Mocks::new();
        mocks.on_json(&greet_step, |v| {
            let p: Person = serde_json::from_value(v["input"].clone()).map_err(|e| TaskError::fatal(e.to_string()))?;
            Ok(serde_json::to_value(greet(p)?).unwrap_or_default())
        });
        mocks.on_json(&shout_step, |v| {
            let g: Greeting =
                serde_json::from_value(v["input"].clone()).map_err(|e| TaskError::fatal(e.to_string()))?;
            Ok(serde_json::to_value(shout(g)?).unwrap_or_default())
        });
        let report = wf.simulate(json!({"name": "Ada"}), &mut mocks).expect("the definition is valid");
        assert_eq!(
            report.output,
            Some(json!({"for": "Ada", "said": "Hello, Ada!", "shouted": "HELLO, ADA!"})),
            "{report:?}"
        );
        let refused = wf.simulate(json!({"name": ""}), &mut mocks).expect_err("an empty name is refused");
        assert!(refused.contains("input_schema at /name"), "{refused}");
    }
}
