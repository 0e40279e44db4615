//! The API's OpenAPI 3.1 document. Its operations come from the routes
//! themselves (each handler's `#[utoipa::path]`, registered once in
//! `super::routes`), so the document cannot drift from what the server
//! answers. What applies to many operations at once is added here, by rule:
//! the error answers every operation may give, the bearer schemes, and the
//! links from an answer to the operations that use its ids.

use std::sync::OnceLock;

use composer_api::schema::{JsonObject, JsonValue, Name};
use composer_api::ErrorBody;
use serde::Serialize;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::response::Response;
use utoipa::openapi::schema::{AllOf, Object, Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::server::ServerBuilder;
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::{Modify, OpenApi, ToSchema};

/// `{"status": "ok"}` and the like.
#[derive(Serialize, ToSchema)]
pub(crate) struct Status {
    pub status: String,
}

/// What a `DELETE` of a schedule, a webhook or a limit answers: what it deleted.
#[derive(Serialize, ToSchema)]
pub(crate) struct Deleted {
    pub deleted: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Composer",
        description = "A workflow engine: register versioned workflows, start runs, watch and control them. \
            Every error is JSON `{\"error\": {\"code\", \"message\"}}`: 4xx for the caller's input \
            (naming the field), 503 while a dependency is down (retry later), 500 only for a bug. \
            Without a token set on the coordinator, no bearer token is needed. With one, each operation \
            needs the scope its `x-composer-scope` names: a key holding it (or `admin`), or the \
            environment's token for the role.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(Name, JsonValue, JsonObject, ErrorBody)),
    tags(
        (name = "workflows", description = "Versioned workflow definitions"),
        (name = "runs", description = "Runs of workflows: start, watch, control"),
        (name = "schedules", description = "Runs started on a cron schedule"),
        (name = "events", description = "Events that start runs and wake waiting steps, and the webhooks that send them"),
        (name = "approvals", description = "APPROVAL steps waiting for people, and their decisions"),
        (name = "limits", description = "Rate and concurrency limits on steps across runs"),
        (name = "access", description = "API keys and their scopes, and the audit log of changes"),
        (name = "workers", description = "What workers call (the worker token)"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    ),
)]
struct Document;

/// The document's frame (info, shared schemas, tags), before the routes add
/// their operations.
pub(super) fn frame() -> utoipa::openapi::OpenApi {
    Document::openapi()
}

/// The document as `/openapi.json` serves it, given when the router is built.
static PUBLISHED: OnceLock<&'static str> = OnceLock::new();

pub(super) fn publish(json: &'static str) {
    let _ = PUBLISHED.set(json);
}

/// The document the router was built with.
pub(super) fn published() -> &'static str {
    PUBLISHED.get().copied().unwrap_or("{}")
}

/// The error answers and security of every operation, and the links.
pub(super) struct Rules;

/// The error answers, by status: when each applies, and what it means.
const ERRORS: &[(&str, &str)] = &[
    ("400", "the request is invalid: the message names the field"),
    ("401", "the bearer token is missing or wrong"),
    ("403", "a request from a web page of another origin (COMPOSER_ALLOWED_ORIGINS)"),
    ("404", "not found: the message says what"),
    ("413", "the body, or a JSON value in it, is over COMPOSER_MAX_PAYLOAD"),
    ("414", "the URI is longer than 8 KiB"),
    ("421", "the Host header is not a name of this coordinator (COMPOSER_ALLOWED_HOSTS)"),
    ("415", "the body is not application/json"),
    ("503", "PostgreSQL or Redis is down, the engine is busy or the coordinator is stopping: retry (see Retry-After)"),
];

/// A link from an answer to what can be done next with it: (operation,
/// status, link name, target operation, parameters from the answer).
type Link = (&'static str, &'static str, &'static str, &'static str, &'static [(&'static str, &'static str)]);

const LINKS: &[Link] = &[
    ("startRun", "201", "GetRun", "getRun", &[("id", "$response.body#/id")]),
    ("startRun", "200", "GetRun", "getRun", &[("id", "$response.body#/id")]),
    ("startRun", "201", "GetRunHistory", "getRunHistory", &[("id", "$response.body#/id")]),
    ("startRun", "201", "CancelRun", "cancelRun", &[("id", "$response.body#/id")]),
    ("startRun", "201", "PauseRun", "pauseRun", &[("id", "$response.body#/id")]),
    ("startRun", "201", "ListChildRuns", "listRuns", &[("parent_run_id", "$response.body#/id")]),
    ("getRun", "200", "RetryRun", "retryRun", &[("id", "$response.body#/id")]),
    ("getRun", "200", "ResumeRun", "resumeRun", &[("id", "$response.body#/id")]),
    ("pauseRun", "200", "ResumeRun", "resumeRun", &[("id", "$response.body#/id")]),
    ("registerWorkflow", "201", "GetWorkflow", "getWorkflow", &[("name", "$response.body#/name")]),
    (
        "registerWorkflow",
        "201",
        "GetWorkflowVersion",
        "getWorkflowVersion",
        &[("name", "$response.body#/name"), ("version", "$response.body#/version")],
    ),
    ("registerWorkflow", "200", "GetWorkflow", "getWorkflow", &[("name", "$response.body#/name")]),
    ("registerWorkflow", "201", "ListRuns", "listRuns", &[("workflow", "$response.body#/name")]),
    ("createSchedule", "201", "GetSchedule", "getSchedule", &[("id", "$response.body#/id")]),
    ("createSchedule", "201", "TriggerSchedule", "triggerSchedule", &[("id", "$response.body#/id")]),
    ("createSchedule", "201", "PauseSchedule", "pauseSchedule", &[("id", "$response.body#/id")]),
    ("createSchedule", "201", "DeleteSchedule", "deleteSchedule", &[("id", "$response.body#/id")]),
    ("pauseSchedule", "200", "ResumeSchedule", "resumeSchedule", &[("id", "$response.body#/id")]),
    ("triggerSchedule", "201", "GetRun", "getRun", &[("id", "$response.body#/id")]),
];

/// A coordinator may run without a token (`composer dev`): the empty
/// requirement, first, says none is needed then. Generators that read an
/// operation's own `security` as "a token is required" (openapi-python-client)
/// see none on the API's operations, which take the document's.
fn optional_token(scheme: &str) -> Vec<SecurityRequirement> {
    vec![Default::default(), SecurityRequirement::new::<_, _, &str>(scheme, [])]
}

/// Each guarded operation names the scope it needs (`x-composer-scope`),
/// by the function the guard asks: the document cannot disagree with it.
fn name_scopes(doc: &mut utoipa::openapi::OpenApi) {
    use axum::http::Method;
    for (path, item) in doc.paths.paths.iter_mut() {
        let guarded = path.starts_with("/v1/") || path == "/metrics";
        let by_method = [
            (Method::GET, &mut item.get),
            (Method::POST, &mut item.post),
            (Method::PUT, &mut item.put),
            (Method::DELETE, &mut item.delete),
        ];
        for (method, op) in by_method {
            let Some(op) = op else { continue };
            // A webhook's delivery is signed, not authorized.
            if guarded && op.operation_id.as_deref() != Some("deliverWebhook") {
                let scope = super::authorize::required_scope(&method, path).name();
                let named = ExtensionsBuilder::new().add("x-composer-scope", scope).build();
                op.extensions.get_or_insert_with(Default::default).merge(named);
            }
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [&mut item.get, &mut item.post, &mut item.put, &mut item.delete].into_iter().flatten()
}

/// An optional header is sent or left out, never JSON null: the schema of
/// one declared `Option<T>` is `T`'s alone (a fuzzer otherwise sends the
/// text `null` as a valid value).
fn headers_not_null(op: &mut Operation) {
    for p in op.parameters.iter_mut().flatten() {
        let RefOr::T(p) = p else { continue };
        if p.parameter_in != ParameterIn::Header {
            continue;
        }
        if let Some(RefOr::T(Schema::OneOf(one))) = &p.schema {
            let not_null: Vec<&RefOr<Schema>> = one.items.iter().filter(|s| !is_null(s)).collect();
            if let [only] = not_null.as_slice() {
                p.schema = Some((*only).clone());
            }
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(schema, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null))
}

/// One object with every property of the `allOf`'s parts, when each part
/// is an object written out (not a reference).
fn merge_objects(all: &AllOf) -> Option<Object> {
    let mut merged = Object::new();
    for part in &all.items {
        let RefOr::T(Schema::Object(part)) = part else { return None };
        merged.properties.extend(part.properties.clone());
        merged
            .required
            .extend(part.required.iter().filter(|r| !merged.required.contains(r)).cloned().collect::<Vec<_>>());
    }
    merged.description = all.description.clone();
    Some(merged)
}

/// A flattened struct is an `allOf`; one whose part refuses unknown
/// properties would refuse the other parts' too: merge them. Then what the
/// server checks that a schema can say, from its constants
/// (`composer_api::bounds`).
fn merge_and_bound(components: &mut utoipa::openapi::Components) {
    for (name, schema) in components.schemas.iter_mut() {
        if let RefOr::T(Schema::AllOf(all)) = schema {
            if let Some(merged) = merge_objects(all) {
                *schema = RefOr::T(Schema::Object(merged));
            }
        }
        composer_api::bounds::apply(name, schema);
    }
}

impl Modify for Rules {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |what: &str| {
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(what)).build())
        };
        components.add_security_scheme("apiToken", bearer("COMPOSER_API_TOKEN, when the coordinator has one"));
        components.add_security_scheme(
            "workerToken",
            bearer("COMPOSER_WORKER_TOKEN (or the API token when only that is set)"),
        );
        components.add_security_scheme(
            "metricsToken",
            bearer("COMPOSER_METRICS_TOKEN, else COMPOSER_API_TOKEN, when the coordinator has either"),
        );

        merge_and_bound(components);
        name_scopes(doc);

        for (path, item) in doc.paths.paths.iter_mut() {
            let guarded = path.starts_with("/v1/");
            for op in operations(item) {
                headers_not_null(op);
                let answers = &mut op.responses.responses;
                for &(status, meaning) in ERRORS {
                    let applies = match status {
                        "413" | "415" => op.request_body.is_some(),
                        "414" => true,
                        "421" => !super::guard::ANY_HOST_PATHS.contains(&path.as_str()),
                        _ => guarded,
                    };
                    if applies && !answers.contains_key(status) {
                        let mut r = Response::new(meaning);
                        r.content.insert(
                            "application/json".into(),
                            RefOr::T(ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build()),
                        );
                        answers.insert(status.into(), RefOr::T(r));
                    }
                }
                // The API token is the document's default (below); workers'
                // routes name theirs, and the operator's need none.
                if path.starts_with("/v1/tasks/") {
                    op.security = Some(optional_token("workerToken"));
                } else if op.operation_id.as_deref() == Some("deliverWebhook") {
                    // Another service's delivery: its signature, not a token.
                    op.security = Some(vec![]);
                } else if !guarded && op.security.is_none() {
                    op.security = Some(vec![]);
                }
            }
        }

        doc.security = Some(optional_token("apiToken"));
        doc.servers = Some(vec![ServerBuilder::new()
            .url("/")
            .description(Some("the coordinator that serves this document"))
            .build()]);

        for (from, status, name, to, params) in LINKS {
            let Some(op) =
                doc.paths.paths.values_mut().flat_map(operations).find(|op| op.operation_id.as_deref() == Some(from))
            else {
                continue; // a test checks every link resolves
            };
            if let Some(RefOr::T(resp)) = op.responses.responses.get_mut(*status) {
                let mut link = LinkBuilder::new().operation_id(*to);
                for (param, value) in *params {
                    link = link.parameter(*param, *value);
                }
                resp.links.insert((*name).into(), RefOr::T(link.build()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn doc() -> Value {
        serde_json::from_str(super::super::json()).expect("the document is JSON")
    }

    fn ops(doc: &Value) -> Vec<(String, String, Value)> {
        let mut all = vec![];
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                all.push((method.clone(), path.clone(), op.clone()));
            }
        }
        all
    }

    /// The repository's copy (docs/openapi.json, what clients are generated
    /// from and a reviewer reads) is the document this build serves: a
    /// change of the API shows in a diff of that file, and a restructure
    /// that changes it by accident fails here.
    #[test]
    fn the_repository_s_copy_is_the_document_this_build_serves() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let copy = std::fs::read_to_string(path).expect("docs/openapi.json");
        assert!(
            copy == super::super::json(),
            "docs/openapi.json is out of date: run `cargo run -p composer-coord --example openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_operation_has_an_id_its_security_and_json_errors() {
        let doc = doc();
        let optional = |scheme: &str| serde_json::json!([{}, {scheme: []}]);
        assert_eq!(doc["security"], optional("apiToken"), "the API token is the default, and optional");
        let mut ids = std::collections::HashSet::new();
        for (method, path, op) in ops(&doc) {
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
            assert!(op["responses"]["414"].is_object(), "{method} {path}: no 414");
            if path.starts_with("/v1/tasks/") {
                assert_eq!(op["security"], optional("workerToken"), "{method} {path}: security");
            } else if id == "deliverWebhook" {
                assert_eq!(op["security"], serde_json::json!([]), "a delivery is signed, not authorized");
            } else if path.starts_with("/v1/") {
                assert!(op.get("security").is_none(), "{method} {path}: takes the document's security");
            } else if path == "/metrics" {
                assert_eq!(op["security"], optional("metricsToken"));
            } else {
                assert_eq!(op["security"], serde_json::json!([]), "{method} {path}: open");
            }
            let scope = op.get("x-composer-scope").and_then(|s| s.as_str());
            if (path.starts_with("/v1/") && id != "deliverWebhook") || path == "/metrics" {
                let named = composer_api::Scope::ALL.iter().find(|s| Some(s.name()) == scope);
                assert!(named.is_some(), "{method} {path}: names no scope a key can hold ({scope:?})");
            } else {
                assert_eq!(scope, None, "{method} {path}: open, or signed");
            }
            if path.starts_with("/v1/") {
                for status in ["400", "401", "403", "503"] {
                    let schema = &op["responses"][status]["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(schema, "#/components/schemas/ErrorBody", "{method} {path}: {status}");
                }
            }
            if op.get("requestBody").is_some() {
                assert!(op["responses"]["413"].is_object() && op["responses"]["415"].is_object(), "{method} {path}");
            }
        }
        assert_eq!(ids.len(), 71);
    }

    /// Generated clients name their functions and docs from these, and
    /// linters require both.
    #[test]
    fn every_operation_has_a_one_line_summary_and_a_description() {
        let doc = doc();
        for (method, path, op) in ops(&doc) {
            let summary = op["summary"].as_str().unwrap_or_else(|| panic!("{method} {path}: no summary"));
            assert!(!summary.contains('\n') && summary.len() <= 60, "{method} {path}: summary {summary:?}");
            let description = op["description"].as_str().unwrap_or("");
            assert!(description.len() > summary.len(), "{method} {path}: no description");
        }
        assert_eq!(doc["servers"][0]["url"], "/", "relative to the coordinator that serves the document");
    }

    /// Every component is referred to (linters refuse unused ones), and every
    /// reference names one.
    #[test]
    fn every_component_is_used_and_every_reference_resolves() {
        let doc = doc();
        let text = doc.to_string();
        for (kind, all) in doc["components"].as_object().unwrap() {
            if kind == "securitySchemes" {
                continue;
            }
            for name in all.as_object().unwrap().keys() {
                let reference = format!("\"#/components/{kind}/{name}\"");
                assert!(text.contains(&reference), "components.{kind}.{name} is never used");
            }
        }
        for (at, _) in text.match_indices("\"$ref\":\"#/components/") {
            let rest = &text[at + "\"$ref\":\"#/components/".len()..];
            let path = &rest[..rest.find('"').unwrap()];
            let (kind, name) = path.split_once('/').unwrap();
            assert!(doc["components"][kind][name].is_object(), "a reference to {path}, which does not exist");
        }
    }

    #[test]
    fn every_link_names_an_operation_and_its_parameters() {
        let doc = doc();
        let all = ops(&doc);
        let mut links = 0;
        for (_, _, op) in &all {
            for resp in op["responses"].as_object().unwrap().values() {
                for link in resp.get("links").and_then(Value::as_object).into_iter().flat_map(|l| l.values()) {
                    links += 1;
                    let target = link["operationId"].as_str().unwrap();
                    let (_, _, to) = all.iter().find(|(_, _, o)| o["operationId"] == target).expect(target);
                    for param in link["parameters"].as_object().unwrap().keys() {
                        let known = to["parameters"].as_array().into_iter().flatten().any(|p| p["name"] == **param);
                        assert!(known, "link to {target}: no parameter {param}");
                    }
                }
            }
        }
        assert_eq!(links, super::LINKS.len(), "a link whose operation or status does not exist");
    }

    /// `JsonValue` holds null already: "it or null" would match null twice,
    /// which a `oneOf` refuses (schemathesis reads the answer as invalid).
    #[test]
    fn no_schema_is_any_json_or_null() {
        fn walk(v: &Value, at: &str) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::Array(alts)) = o.get("oneOf") {
                        let any = alts.iter().any(|a| a["$ref"] == "#/components/schemas/JsonValue");
                        let null = alts.iter().any(|a| a["type"] == "null");
                        assert!(!(any && null), "{at}: declare it `value_type = schema::JsonValue`, not Option<…>");
                    }
                    o.iter().for_each(|(k, v)| walk(v, &format!("{at}/{k}")));
                }
                Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| walk(v, &format!("{at}/{i}"))),
                _ => {}
            }
        }
        walk(&doc(), "#");
    }

    /// A value the schema allows is one the server takes: schemathesis
    /// found `retry.max_attempts: 0` allowed here and refused there.
    #[test]
    fn the_document_s_limits_are_the_server_s() {
        use composer_core::definition::{CONCURRENCY_MAX, MAX_RETRY_ATTEMPTS, MAX_RETRY_MULTIPLIER};
        let doc = doc();
        let schemas = &doc["components"]["schemas"];
        let range = |schema: &str, field: &str| {
            let p = &schemas[schema]["properties"][field];
            (p["minimum"].as_f64(), p["maximum"].as_f64())
        };
        assert_eq!(range("RetrySpec", "max_attempts"), (Some(1.0), Some(f64::from(MAX_RETRY_ATTEMPTS))));
        assert_eq!(range("RetrySpec", "multiplier"), (Some(1.0), Some(MAX_RETRY_MULTIPLIER)));
        assert_eq!(range("ConcurrencySpec", "max"), (Some(1.0), Some(f64::from(CONCURRENCY_MAX))));
        assert_eq!(range("PollTasks", "max"), (Some(1.0), Some(f64::from(crate::http::tasks::MAX_POLL_TASKS))));
        let queues = &schemas["PollTasks"]["properties"]["queues"];
        assert_eq!(queues["maxItems"].as_u64(), Some(crate::http::tasks::MAX_POLL_QUEUES as u64));
        assert_eq!(range("FailTask", "status"), (Some(100.0), Some(599.0)));
        for tags in ["RunTags", "DefinitionTags", "TagFilter"] {
            assert_eq!(schemas[tags]["maxProperties"].as_u64(), Some(composer_core::definition::MAX_TAGS as u64));
            let key = schemas[tags]["propertyNames"]["pattern"].as_str().unwrap();
            assert_eq!(key, format!("^[A-Za-z0-9_.-]{{1,64}}$"), "{tags}: is_tag_key");
        }
        let value = &schemas["RunTags"]["additionalProperties"]["maxLength"];
        assert_eq!(value.as_u64(), Some(composer_core::definition::MAX_TAG_VALUE as u64));
        let code = schemas["FailTask"]["properties"]["code"]["pattern"].as_str().unwrap();
        let longest = composer_core::definition::MAX_ERROR_CODE_LEN;
        assert_eq!(code, format!("^[a-z0-9_.-]{{1,{longest}}}$"));
    }

    #[test]
    fn the_states_are_the_codes_and_request_bodies_refuse_unknown_fields() {
        let doc = doc();
        let schemas = &doc["components"]["schemas"];
        let names = |v: &Value| -> Vec<String> {
            v["enum"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        let statuses: Vec<String> =
            composer_core::machine::RunStatus::ALL.iter().map(|s| s.as_str().to_string()).collect();
        assert_eq!(names(&schemas["RunStatus"]), statuses);
        let states: Vec<String> =
            composer_core::machine::TaskState::ALL.iter().map(|s| s.as_str().to_string()).collect();
        assert_eq!(names(&schemas["TaskState"]), states);
        for body in [
            "StartRun",
            "SendEvent",
            "WorkflowSpec",
            "NodeSpec",
            "EdgeSpec",
            "ScheduleSpec",
            "PollTasks",
            "TaskHeartbeat",
            "CompleteTask",
            "FailTask",
            "TakeNext",
        ] {
            assert_eq!(schemas[body]["additionalProperties"], false, "{body}");
        }
        assert_eq!(schemas["Name"]["pattern"], composer_api::schema::NAME_PATTERN);
    }

    /// The fuzzer's exceptions (tests/api/schemathesis.toml) stay true:
    /// each `[[operations]]` block has its reason in comments right above
    /// it and names only operations this document has, each once per check.
    #[test]
    fn every_fuzzer_exception_has_its_reason_and_names_real_operations() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/api/schemathesis.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let doc = doc();
        let ids: Vec<String> = ops(&doc).iter().map(|(_, _, op)| op["operationId"].as_str().unwrap().into()).collect();
        let lines: Vec<&str> = text.lines().collect();
        let mut blocks = 0;
        let mut seen = std::collections::HashSet::new();
        for (at, _) in lines.iter().enumerate().filter(|(_, l)| l.trim() == "[[operations]]") {
            blocks += 1;
            let reason: Vec<&str> = lines[..at]
                .iter()
                .rev()
                .take_while(|l| l.starts_with('#'))
                .map(|l| l.trim_start_matches('#'))
                .collect();
            assert!(
                reason.join(" ").split_whitespace().count() >= 8,
                "line {}: an exception without its reason",
                at + 1
            );
            let body: Vec<&str> = lines[at + 1..].iter().take_while(|l| !l.trim().is_empty()).copied().collect();
            let named = body.iter().find(|l| l.starts_with("include-operation-id")).expect("names its operations");
            let checks: Vec<&str> = body.iter().filter_map(|l| l.strip_prefix("checks.")).collect();
            assert!(!checks.is_empty(), "line {}: names no check", at + 1);
            for id in named.split('"').skip(1).step_by(2) {
                assert!(ids.iter().any(|i| i == id), "line {}: no operation {id} in the document", at + 1);
                for check in &checks {
                    let check = check.split('.').next().unwrap();
                    assert!(seen.insert((id.to_string(), check.to_string())), "{id}: {check} twice");
                }
            }
        }
        assert!(blocks > 0, "no exception read: has the file's form changed?");
    }

    /// A webhook's tolerance, a node's limits, a burst without a rate and
    /// a limits cursor: the document says what the server checks, from its
    /// constants, and refuses what the server refuses at the bounds.
    #[test]
    fn the_document_says_the_server_s_bounds() {
        use composer_api::bounds;
        use composer_core::definition::limit::{MAX_LIMIT_KEY, MAX_NODE_LIMITS};
        let doc = doc();
        let schemas = &doc["components"]["schemas"];
        let tolerance = bounds::duration_up_to(crate::webhooks::MAX_TOLERANCE, false);
        assert_eq!(schemas["WebhookSpec"]["properties"]["tolerance"]["pattern"], tolerance.as_str());
        let r = regex::Regex::new(&tolerance).unwrap();
        for t in ["0ms", "0h", "1ms", "3600000ms", "3600001ms", "3600s", "3601s", "60m", "61m", "1h", "2h", "1d", ""] {
            let spec = composer_api::WebhookSpec {
                name: "w".into(),
                scheme: composer_api::WebhookScheme::Github,
                secret: "S".into(),
                tolerance: Some(t.into()),
                event: None,
            };
            assert_eq!(r.is_match(t), crate::webhooks::tolerance(&spec).is_ok(), "{t:?}");
        }
        assert_eq!(schemas["NodeSpec"]["properties"]["limits"]["maxItems"], MAX_NODE_LIMITS);
        for limit in ["LimitSpec", "LimitValuesSpec"] {
            assert_eq!(schemas[limit]["dependentSchemas"], bounds::dependent_schemas(limit).unwrap(), "{limit}");
            assert_eq!(schemas[limit]["properties"]["rate"]["pattern"], bounds::rate_pattern().as_str(), "{limit}");
        }
        let list = &doc["paths"]["/v1/limits"]["get"]["parameters"];
        let after = list.as_array().unwrap().iter().find(|p| p["name"] == "after").unwrap();
        assert_eq!(after["schema"]["pattern"], composer_api::schema::NO_NUL);
        assert_eq!(after["schema"]["maxLength"], MAX_LIMIT_KEY);
    }
}
