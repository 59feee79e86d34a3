//! The OpenAPI document as this router serves it: the document derived from
//! the handlers (`api::routes`), with the request bodies of `/v1/jobs` and
//! `/v1/chat/completions` narrowed to what the configured routes take — one
//! alternative per route, naming the route, the contract's input variables,
//! and (on a pinned route) its certified prompt — so that a request the
//! document calls valid is one the router accepts.

use serde_json::{Value, json};
use surety_config::Facade;

use crate::AppState;

/// `doc` with the request bodies of the job and chat endpoints per route.
pub fn for_routes(doc: utoipa::openapi::OpenApi, state: &AppState) -> Value {
    let mut doc = serde_json::to_value(doc).unwrap_or(Value::Null);
    let mut jobs = Vec::new();
    let mut chats = Vec::new();
    for route in state.inner.routes.values() {
        let Some(served) = state.inner.contracts.get(&route.contract) else {
            continue;
        };
        let contract = &served.contract;
        let template = served.user_template.as_ref().ok();
        let names: Vec<&String> = template
            .map(|t| t.names().iter().collect())
            .unwrap_or_default();
        let mut variables = serde_json::Map::new();
        for name in &names {
            // Any JSON value: the template renders it as text.
            variables.insert(
                (*name).clone(),
                json!({"description": "rendered into the prompt as text"}),
            );
        }
        jobs.push(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["route", "input"],
            "properties": {
                "route": {"type": "string", "enum": [route.id]},
                "input": {
                    "type": "object",
                    "description": format!("The variables of contract `{}`", contract.id),
                    "required": names,
                    "properties": variables,
                },
            },
        }));
        let system = contract
            .cases
            .first()
            .and_then(|case| contract.render(&case.input).ok())
            .map(|r| r.system);
        let messages = match (route.facade, template, system) {
            (Facade::Pinned, Some(template), Some(system)) => json!({
                "type": "array",
                "description": "The contract's rendered system prompt, then a user message its user template renders",
                "minItems": 2,
                "maxItems": 2,
                "prefixItems": [
                    {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                     "properties": {"role": {"type": "string", "enum": ["system"]}, "content": {"type": "string", "enum": [system]}}},
                    {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                     "properties": {"role": {"type": "string", "enum": ["user"]}, "content": {"type": "string", "pattern": user_pattern(template)}}},
                ],
                "items": false,
            }),
            _ => json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                          "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
                                         "content": {"type": "string"}}},
            }),
        };
        // Optional parameters may be null, as OpenAI's API takes them.
        let mut properties = json!({
            "model": {"type": "string", "enum": [route.id]},
            "messages": messages,
            "stream": {"type": ["boolean", "null"]},
            "stream_options": {"type": ["object", "null"], "additionalProperties": false,
                               "properties": {"include_usage": {"type": "boolean"}}},
            "n": {"enum": [1, null]},
            "user": {"type": ["string", "null"]},
            "temperature": {"enum": [contract.sampling.temperature, null]},
            "max_tokens": {"enum": [contract.limits.max_output_tokens, null]},
            "max_completion_tokens": {"enum": [contract.limits.max_output_tokens, null]},
        });
        properties["seed"] = match contract.sampling.seed {
            Some(seed) => json!({"enum": [seed, null]}),
            None => json!({"enum": [null]}),
        };
        chats.push(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["model", "messages"],
            "properties": properties,
        }));
    }
    let body =
        |path: &str| format!("/paths/{path}/post/requestBody/content/application~1json/schema");
    if let Some(schema) = doc.pointer_mut(&body("~1v1~1jobs")) {
        *schema = json!({"oneOf": jobs});
    }
    if let Some(schema) = doc.pointer_mut(&body("~1v1~1chat~1completions")) {
        *schema = json!({"oneOf": chats});
    }
    // The facade takes a request without a key only when the operator allows one-off jobs.
    let keyless = state.inner.settings.allow_keyless_chat;
    if let Some(Value::Array(params)) =
        doc.pointer_mut("/paths/~1v1~1chat~1completions/post/parameters")
    {
        for param in params.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
            param["required"] = json!(!keyless);
        }
    }
    doc
}

/// An ECMA-262 pattern for the user messages a template renders: its
/// literal text, with anything in each slot.
fn user_pattern(template: &surety_exchange::pinning::UserTemplate) -> String {
    let escaped: Vec<String> = template
        .literals()
        .iter()
        .map(|literal| {
            literal
                .chars()
                .map(|c| match c {
                    '\\' | '^' | '$' | '.' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']'
                    | '{' | '}' | '/' => format!("\\{c}"),
                    '\n' => "\\n".to_owned(),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    format!("^{}$", escaped.join("[\\s\\S]*"))
}
