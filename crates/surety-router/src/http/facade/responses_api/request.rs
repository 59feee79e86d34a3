//! Reading a Responses request: the parameters surety honours (any other
//! refused by name, in OpenAI's format with `param` set) and the input
//! items, as the messages a provider of any kind is sent.

use serde_json::{Map, Value};
use surety_providers::{CalledTool, Message};

use super::super::OpenAiError;
use super::super::request::{ToolShape, pin_tools, sampled_as_certified};
use crate::certification::ServedContract;

/// The most `metadata` pairs, and the longest key and value, as OpenAI allows.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;

/// What a Responses request asks for, apart from its input.
#[derive(Debug, Clone)]
pub(super) struct Asked {
    pub(super) stream: bool,
    /// The route's contract answers with a tool call.
    pub(super) tool_calls: bool,
    pub(super) instructions: Option<String>,
    /// The response this one continues (`resp_…`).
    pub(super) previous: Option<String>,
    /// Whether the response may be continued later (`store`, default true).
    pub(super) store: bool,
    /// Answer at once with the job as it is; its outcome is read later.
    pub(super) background: bool,
}

fn refuse(param: &str, why: impl Into<String>) -> OpenAiError {
    OpenAiError::bad_request("unsupported_parameter", Some(param), why)
}

/// The parameters surety honours, checked; any other is refused by name.
/// Sampling and the answer's format are the contract's: a request may
/// repeat them, not change them.
pub(super) fn parameters(
    request: &Map<String, Value>,
    served: &ServedContract,
) -> Result<Asked, OpenAiError> {
    let contract = &served.contract;
    let mut asked = Asked {
        stream: false,
        tool_calls: contract.tool_calls.is_some(),
        instructions: None,
        previous: None,
        store: true,
        background: false,
    };
    let boolean = |name: &str, value: &Value| match value {
        Value::Bool(on) => Ok(Some(*on)),
        Value::Null => Ok(None),
        _ => Err(refuse(name, format!("`{name}` must be true or false"))),
    };
    for (name, value) in request {
        match name.as_str() {
            "model" | "input" => {}
            // The caller's own ids for its end users: they change nothing sent.
            "user" | "safety_identifier" if value.is_string() || value.is_null() => {}
            "stream" => asked.stream = boolean(name, value)?.unwrap_or(false),
            "store" => asked.store = boolean(name, value)?.unwrap_or(true),
            "background" => asked.background = boolean(name, value)?.unwrap_or(false),
            "instructions" => match value {
                Value::String(text) => asked.instructions = Some(text.clone()),
                Value::Null => {}
                _ => return Err(refuse(name, "`instructions` must be text")),
            },
            "previous_response_id" => match value {
                Value::String(id) => asked.previous = Some(id.clone()),
                Value::Null => {}
                _ => {
                    return Err(refuse(
                        name,
                        "`previous_response_id` must be a response's id",
                    ));
                }
            },
            "metadata" => metadata(value)?,
            "include" => match value {
                Value::Null => {}
                Value::Array(values) => {
                    if let Some((i, v)) = values.iter().enumerate().next() {
                        return Err(refuse(
                            &format!("include[{i}]"),
                            format!(
                                "`include` of {v} is not supported: a surety response has no reasoning, logprobs or tool outputs to add"
                            ),
                        ));
                    }
                }
                _ => return Err(refuse(name, "`include` must be a list")),
            },
            "truncation" if value.is_null() || value == "disabled" => {}
            "truncation" => {
                return Err(refuse(
                    name,
                    "only `truncation: \"disabled\"`: surety never drops part of a conversation",
                ));
            }
            "temperature" | "top_p" => sampled_as_certified(name, value, contract)?,
            "max_output_tokens" => {
                let certified = u64::from(contract.limits.max_output_tokens);
                if !(value.is_null() || value.as_u64() == Some(certified)) {
                    return Err(refuse(
                        name,
                        format!(
                            "the route's contract `{}` is certified with {certified} output tokens; send that or none",
                            contract.id
                        ),
                    ));
                }
            }
            "text" => text(value, served)?,
            "tools" | "tool_choice" | "parallel_tool_calls"
                if let Some(certified) = &contract.tool_calls =>
            {
                pin_tools(name, value, certified, &contract.id, ToolShape::Responses)?;
            }
            // Without tools, the choices that ask for none change nothing.
            "tools" if value.is_null() || value.as_array().is_some_and(Vec::is_empty) => {}
            "tool_choice" if value.is_null() || value == "none" || value == "auto" => {}
            "parallel_tool_calls" if value.is_null() || value.is_boolean() => {}
            "tools" | "tool_choice" => {
                return Err(refuse(
                    name,
                    format!(
                        "`{name}` is not supported: the route's contract `{}` answers in its JSON, not with tool calls",
                        contract.id
                    ),
                ));
            }
            other => {
                return Err(refuse(
                    other,
                    format!("`{other}` is not supported by surety's Responses API"),
                ));
            }
        }
    }
    if asked.background && !asked.store {
        return Err(refuse(
            "store",
            "a `background` response is read back later, so it must be stored: send `store: true` or none",
        ));
    }
    Ok(asked)
}

/// `metadata`: at most 16 pairs of strings, keys of at most 64 characters
/// and values of at most 512.
fn metadata(value: &Value) -> Result<(), OpenAiError> {
    let pairs = match value {
        Value::Null => return Ok(()),
        Value::Object(pairs) => pairs,
        _ => {
            return Err(refuse(
                "metadata",
                "`metadata` must be an object of strings",
            ));
        }
    };
    if pairs.len() > METADATA_PAIRS {
        return Err(refuse(
            "metadata",
            format!("`metadata` holds at most {METADATA_PAIRS} pairs"),
        ));
    }
    for (key, v) in pairs {
        let fits = key.chars().count() <= METADATA_KEY_CHARS
            && v.as_str()
                .is_some_and(|v| v.chars().count() <= METADATA_VALUE_CHARS);
        if !fits {
            return Err(refuse(
                &format!("metadata.{key}"),
                format!(
                    "a `metadata` key has at most {METADATA_KEY_CHARS} characters and its value is a string of at most {METADATA_VALUE_CHARS}"
                ),
            ));
        }
    }
    Ok(())
}

/// `text`: its `format` may be `text` (the default) or `json_schema` with
/// exactly the contract's output schema; nothing else is honoured.
fn text(value: &Value, served: &ServedContract) -> Result<(), OpenAiError> {
    let contract = &served.contract;
    let Some(text) = value.as_object() else {
        return match value.is_null() {
            true => Ok(()),
            false => Err(refuse("text", "`text` must be an object")),
        };
    };
    for (name, v) in text {
        match name.as_str() {
            "format" => {}
            "verbosity" if v.is_null() => {}
            other => {
                return Err(refuse(
                    &format!("text.{other}"),
                    format!("`text.{other}` is not supported; only `text.format`"),
                ));
            }
        }
    }
    let format = &text["format"];
    match format["type"].as_str() {
        None if format.is_null() => Ok(()),
        Some("text") => Ok(()),
        Some("json_schema") => {
            if let Some(extra) = format.as_object().and_then(|o| {
                o.keys().find(|k| {
                    !matches!(
                        k.as_str(),
                        "type" | "name" | "schema" | "strict" | "description"
                    )
                })
            }) {
                return Err(refuse(
                    &format!("text.format.{extra}"),
                    format!("`text.format.{extra}` is not supported"),
                ));
            }
            match format["schema"] == contract.schema {
                true => Ok(()),
                false => Err(OpenAiError::bad_request(
                    "schema_not_certified",
                    Some("text.format.schema"),
                    format!(
                        "the route's contract `{}` answers in its own JSON Schema (`{}`); send exactly that schema, or no `text.format`",
                        contract.id, contract.output_name
                    ),
                )),
            }
        }
        _ => Err(refuse(
            "text.format",
            format!(
                "the route's contract `{}` answers in its JSON Schema: `text.format` may be `text` or that `json_schema`",
                contract.id
            ),
        )),
    }
}

/// The input as messages: a string is one user message; a list holds
/// `message` items (roles user, system, developer, assistant, content as
/// text or parts), `function_call` items (the calls an assistant turn
/// made, merged into that turn) and `function_call_output` items (a call's
/// result, by `call_id`, which must be a call of an earlier item or of
/// `history`). Anything else is refused by name.
pub(super) fn input_messages(
    input: &Value,
    history: &[Message],
) -> Result<Vec<Message>, OpenAiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![Message::user(text.clone())]),
        Value::Array(items) if !items.is_empty() => items,
        Value::Array(_) => return Err(refuse("input", "`input` is empty")),
        _ => return Err(refuse("input", "`input` must be text or a list of items")),
    };
    let mut out: Vec<Message> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| match field {
            "" => format!("input[{i}]"),
            field => format!("input[{i}].{field}"),
        };
        let Some(fields) = item.as_object() else {
            return Err(refuse(&at(""), "an input item must be an object"));
        };
        let kind = match &item["type"] {
            Value::Null => "message",
            Value::String(kind) => kind.as_str(),
            _ => return Err(refuse(&at("type"), "an item's `type` must be text")),
        };
        let allowed: &[&str] = match kind {
            "message" => &["type", "role", "content", "id", "status"],
            "function_call" => &["type", "call_id", "name", "arguments", "id", "status"],
            "function_call_output" => &["type", "call_id", "output", "id", "status"],
            other => {
                return Err(refuse(
                    &at("type"),
                    format!(
                        "an input item of type `{other}` is not supported; surety takes `message`, `function_call` and `function_call_output`"
                    ),
                ));
            }
        };
        if let Some(extra) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(refuse(
                &at(extra),
                format!("`{extra}` in a `{kind}` item is not supported"),
            ));
        }
        match kind {
            "message" => {
                let role = item["role"].as_str().unwrap_or_default();
                let content = content_text(&item["content"], role, &at("content"))?;
                let message = match role {
                    "system" | "developer" => Message::system(content),
                    "user" => Message::user(content),
                    "assistant" => Message::assistant(content, Vec::new()),
                    _ => {
                        return Err(refuse(
                            &at("role"),
                            "a message's role is user, system, developer or assistant",
                        ));
                    }
                };
                out.push(message);
            }
            "function_call" => {
                let (Some(call_id), Some(name), Some(arguments)) = (
                    item["call_id"].as_str(),
                    item["name"].as_str(),
                    item["arguments"].as_str(),
                ) else {
                    return Err(refuse(
                        &at(""),
                        "a `function_call` item has `call_id`, `name` and `arguments` (JSON text)",
                    ));
                };
                let call = CalledTool {
                    id: call_id.to_owned(),
                    name: name.to_owned(),
                    arguments: arguments.to_owned(),
                };
                // The calls of one assistant turn are one message.
                match out.last_mut() {
                    Some(last) if last.role == surety_providers::Role::Assistant => {
                        last.tool_calls.push(call);
                    }
                    _ => {
                        let mut turn = Message::assistant(String::new(), Vec::new());
                        turn.tool_calls.push(call);
                        out.push(turn);
                    }
                }
            }
            _ => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(refuse(
                        &at("call_id"),
                        "a `function_call_output` item names the call it answers in `call_id`",
                    ));
                };
                let output = content_text(&item["output"], "tool", &at("output"))?;
                let earlier: Vec<Message> = history.iter().chain(out.iter()).cloned().collect();
                if surety_providers::called(&earlier, call_id).is_none() {
                    return Err(refuse(
                        &at("call_id"),
                        format!(
                            "`{call_id}` is not the `call_id` of a function call earlier in the conversation"
                        ),
                    ));
                }
                out.push(Message::tool(call_id, output));
            }
        }
    }
    Ok(out)
}

/// A message's (or a call output's) content as text: a string, or text
/// parts (`input_text`, and `output_text` in an assistant's turn).
fn content_text(content: &Value, role: &str, at: &str) -> Result<String, OpenAiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part["type"].as_str().unwrap_or("(none)");
                let fits = match role {
                    "assistant" => kind == "output_text",
                    _ => kind == "input_text",
                };
                match (fits, part["text"].as_str()) {
                    (true, Some(t)) => text.push_str(t),
                    _ => {
                        return Err(refuse(
                            &format!("{at}[{j}]"),
                            format!(
                                "a content part of type `{kind}` is not supported here; only text (`input_text`, or `output_text` in an assistant's message)"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(refuse(at, "content must be text or a list of text parts")),
    }
}
