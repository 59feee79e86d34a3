//! Reading an OpenAI chat request: the parameters surety honours (any
//! other refused by name), the messages, and on a pinned route the
//! contract's input they are a rendering of.

use serde_json::Value;
use surety_providers::{Message, Role};

use super::{Delivery, OpenAiError};
use crate::certification::ServedContract;

/// The parameters surety honours, checked; any other is refused by name.
/// Sampling parameters are the contract's: a request may repeat them, not
/// change them.
pub(super) fn parameters(
    request: &serde_json::Map<String, Value>,
    served: &ServedContract,
) -> Result<Delivery, OpenAiError> {
    let contract = &served.contract;
    let refuse = |param: &str, why: String| {
        Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some(param),
            why,
        ))
    };
    let mut delivery = Delivery {
        stream: false,
        include_usage: false,
    };
    for (name, value) in request {
        match name.as_str() {
            "model" | "messages" => {}
            // An end-user id for the caller's own records: it changes nothing sent.
            "user" if value.is_string() || value.is_null() => {}
            "stream" => match value {
                Value::Bool(on) => delivery.stream = *on,
                Value::Null => {}
                _ => return refuse(name, "`stream` must be true or false".to_owned()),
            },
            "stream_options" => match value {
                Value::Null => {}
                Value::Object(options) => {
                    for (option, v) in options {
                        match (option.as_str(), v) {
                            ("include_usage", Value::Bool(on)) => delivery.include_usage = *on,
                            _ => {
                                return refuse(
                                    &format!("stream_options.{option}"),
                                    format!(
                                        "`stream_options.{option}` is not supported; only `include_usage`"
                                    ),
                                );
                            }
                        }
                    }
                }
                _ => return refuse(name, "`stream_options` must be an object".to_owned()),
            },
            "n" if value.as_u64() == Some(1) || value.is_null() => {}
            "n" => {
                return refuse(
                    name,
                    "surety answers one choice per job: `n` must be 1".to_owned(),
                );
            }
            "temperature" => {
                let certified = f64::from(contract.sampling.temperature);
                if !(value.is_null()
                    || value.as_f64().is_some_and(|t| (t - certified).abs() < 1e-9))
                {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` is certified at temperature {certified}; send that or none",
                            contract.id
                        ),
                    );
                }
            }
            "max_tokens" | "max_completion_tokens" => {
                let certified = u64::from(contract.limits.max_output_tokens);
                if !(value.is_null() || value.as_u64() == Some(certified)) {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` is certified with {certified} output tokens; send that or none",
                            contract.id
                        ),
                    );
                }
            }
            "seed" => {
                let certified = contract.sampling.seed;
                if !(value.is_null() || (certified.is_some() && value.as_u64() == certified)) {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` decides the seed; send none",
                            contract.id
                        ),
                    );
                }
            }
            "response_format" => {
                return refuse(
                    name,
                    format!(
                        "the route's contract `{}` decides the answer's format (its JSON Schema); send no `response_format`",
                        contract.id
                    ),
                );
            }
            "tools" | "tool_choice" | "functions" | "function_call" | "parallel_tool_calls" => {
                return refuse(
                    name,
                    format!(
                        "`{name}` is not supported: a route answers in its contract's JSON, not with tool calls"
                    ),
                );
            }
            other => {
                return refuse(
                    other,
                    format!("`{other}` is not supported by surety's chat completions"),
                );
            }
        }
    }
    Ok(delivery)
}

/// The input of the route's contract that renders to exactly `messages`,
/// or what differs.
pub(super) fn pin(served: &ServedContract, messages: &[Message]) -> Result<Value, String> {
    let contract = &served.contract;
    let template = served.user_template.as_ref().map_err(|why| {
        format!(
            "the user template of contract `{}` cannot be read back ({why}), so no request can be shown to be its certified prompt; the route can be served only with `facade = \"output-only\"`",
            contract.id
        )
    })?;
    surety_exchange::pinning::read_back(contract, template, messages).map_err(|e| {
        // A system message that differs names the digest it should have had already.
        let expected = surety_exchange::system_prompt_digest(contract)
            .filter(|_| e.part != "system")
            .map(|d| format!(" (the certified system prompt is {d})"))
            .unwrap_or_default();
        format!("{e}{expected}")
    })
}

/// The messages of an OpenAI chat request: roles system (or developer),
/// user and assistant, content as text or text parts. Anything else is
/// refused by name.
pub fn chat_messages(body: &Value) -> Result<Vec<Message>, OpenAiError> {
    let refuse = |param: String, message: String| {
        Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some(&param),
            message,
        ))
    };
    let Some(messages) = body["messages"].as_array() else {
        return refuse("messages".into(), "`messages` must be a list".into());
    };
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = match m["role"].as_str() {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => {
                return refuse(
                    format!("messages[{i}].role"),
                    format!(
                        "the role `{other}` is not supported; surety takes system, developer, user and assistant messages"
                    ),
                );
            }
            None => {
                return refuse(
                    format!("messages[{i}].role"),
                    "a message needs a `role`".into(),
                );
            }
        };
        if let Some(extra) = m.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "role" | "content" | "name"))
        }) {
            return refuse(
                format!("messages[{i}].{extra}"),
                format!("`{extra}` in a message is not supported"),
            );
        }
        let content = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part["type"].as_str(), part["text"].as_str()) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return refuse(
                                format!("messages[{i}].content[{j}]"),
                                format!(
                                    "a content part of type `{}` is not supported; only text",
                                    kind.unwrap_or("(none)")
                                ),
                            );
                        }
                    }
                }
                text
            }
            _ => {
                return refuse(
                    format!("messages[{i}].content"),
                    "a message's content must be text".into(),
                );
            }
        };
        out.push(Message { role, content });
    }
    if out.is_empty() {
        return refuse("messages".into(), "`messages` is empty".into());
    }
    Ok(out)
}
