//! The OpenAPI document as this router serves it: the document derived from
//! the handlers (`api::routes`), with the request bodies of `/v1/jobs`,
//! `/v1/chat/completions`, `/v1/responses` and `/v1/messages` narrowed to what the configured routes take — one
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
    let mut responses = Vec::new();
    let mut anthropic = Vec::new();
    let mut counted = Vec::new();
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
        let (instructions, input) = match (route.facade, template, &system) {
            (Facade::Pinned, Some(template), Some(system)) => (
                json!({"type": "string", "enum": [system]}),
                json!({"type": "string", "pattern": user_pattern(template),
                       "description": "A user message the contract's user template renders"}),
            ),
            _ => (
                json!({"type": ["string", "null"]}),
                json!({"oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1,
                     "items": {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                               "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
                                              "content": {"type": "string"}}}},
                ]}),
            ),
        };
        let mut required = vec!["model", "input"];
        if route.facade == Facade::Pinned {
            required.push("instructions");
        }
        responses.push(json!({
            "type": "object",
            "additionalProperties": false,
            "required": required,
            "properties": {
                "model": {"type": "string", "enum": [route.id]},
                "instructions": instructions,
                "input": input,
                "stream": {"type": ["boolean", "null"]},
                "store": {"type": ["boolean", "null"]},
                "user": {"type": ["string", "null"]},
                "temperature": {"enum": [contract.sampling.temperature, null]},
                "top_p": {"enum": [1, null]},
                "max_output_tokens": {"enum": [contract.limits.max_output_tokens, null]},
                "metadata": {"type": ["object", "null"], "maxProperties": 16,
                             "propertyNames": {"maxLength": 64},
                             "additionalProperties": {"type": "string", "maxLength": 512}},
                "include": {"type": ["array", "null"], "maxItems": 0},
                "truncation": {"enum": ["disabled", null]},
            },
        }));
        let user_turns = match (route.facade, template) {
            (Facade::Pinned, Some(template)) => json!({
                "type": "array", "minItems": 1, "maxItems": 1,
                "items": {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                          "properties": {"role": {"enum": ["user"]},
                                         "content": {"type": "string", "pattern": user_pattern(template)}}},
            }),
            _ => json!({
                "type": "array", "minItems": 1,
                "items": {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                          "properties": {"role": {"enum": ["user"]}, "content": {"type": "string", "minLength": 1}}},
            }),
        };
        // A count needs a tokenizer: routes whose first provider names one.
        let tokenized = route
            .providers
            .first()
            .and_then(|p| state.inner.providers.get(p))
            .is_some_and(|p| p.config.tokenizer != surety_providers::TokenizerConfig::None);
        if tokenized {
            counted.push(json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["model", "messages"],
                "properties": {
                    "model": {"type": "string", "enum": [route.id]},
                    "system": {"type": "string"},
                    "messages": {
                        "type": "array", "minItems": 1,
                        "items": {"type": "object", "additionalProperties": false, "required": ["role", "content"],
                                  "properties": {"role": {"enum": ["user"]}, "content": {"type": "string"}}},
                    },
                },
            }));
        }
        let mut turns = vec!["model", "max_tokens", "messages"];
        if route.facade == Facade::Pinned {
            turns.push("system");
        }
        anthropic.push(json!({
            "type": "object",
            "additionalProperties": false,
            "required": turns,
            "properties": {
                "model": {"type": "string", "enum": [route.id]},
                "max_tokens": {"type": "integer", "minimum": contract.limits.max_output_tokens, "maximum": 1_000_000},
                "system": match (route.facade, &system) {
                    (Facade::Pinned, Some(system)) => json!({"type": "string", "enum": [system]}),
                    _ => json!({"type": "string"}),
                },
                "messages": user_turns,
                "stream": {"type": "boolean"},
                "temperature": {"enum": [contract.sampling.temperature]},
                "top_p": {"enum": [1]},
                "stop_sequences": {"type": "array", "maxItems": 0},
                "metadata": {"type": "object", "additionalProperties": false,
                             "properties": {"user_id": {"type": "string"}}},
            },
        }));
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
    if let Some(schema) = doc.pointer_mut(&body("~1v1~1responses")) {
        *schema = json!({"oneOf": responses});
    }
    if let Some(schema) = doc.pointer_mut(&body("~1v1~1messages")) {
        *schema = json!({"oneOf": anthropic});
    }
    // With none, the general shape stands (and every count is a 400 naming why).
    if let (Some(schema), false) = (
        doc.pointer_mut(&body("~1v1~1messages~1count_tokens")),
        counted.is_empty(),
    ) {
        *schema = json!({"oneOf": counted});
    }
    // The facade takes a request without a key only when the operator allows one-off jobs.
    let keyless = state.inner.settings.allow_keyless_chat;
    for path in [
        "~1v1~1chat~1completions",
        "~1v1~1responses",
        "~1v1~1messages",
    ] {
        if let Some(Value::Array(params)) =
            doc.pointer_mut(&format!("/paths/{path}/post/parameters"))
        {
            for param in params.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
                param["required"] = json!(!keyless);
            }
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
