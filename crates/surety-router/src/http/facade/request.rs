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
        tool_calls: contract.tool_calls.is_some(),
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
            "temperature" => sampled_as_certified(name, value, contract)?,
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
            "tools" | "tool_choice" | "parallel_tool_calls"
                if let Some(certified) = &contract.tool_calls =>
            {
                pin_tools(name, value, certified, &contract.id, ToolShape::Chat)?;
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

/// `temperature` and `top_p` as the contract is certified: its
/// temperature and no nucleus sampling (`top_p` 1), each sent or not.
pub(super) fn sampled_as_certified(
    name: &str,
    value: &Value,
    contract: &surety_contracts::Contract,
) -> Result<(), OpenAiError> {
    // The certified value as /openapi.json's `enum` has it (the f32 widened),
    // or as it is written (`0.2`); nothing merely near it (a fuzzer's
    // `-3e-65` is not the certified 0).
    let (certified, written, why) = match name {
        "top_p" => (
            1.0,
            1.0,
            "without nucleus sampling; send `top_p` 1 or none".to_owned(),
        ),
        _ => {
            let t = contract.sampling.temperature;
            let written = t.to_string().parse::<f64>().unwrap_or(f64::from(t));
            (
                f64::from(t),
                written,
                format!("at temperature {t}; send that or none"),
            )
        }
    };
    match value.is_null()
        || value
            .as_f64()
            .is_some_and(|v| v == certified || v == written)
    {
        true => Ok(()),
        false => Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some(name),
            format!("the route's contract `{}` is certified {why}", contract.id),
        )),
    }
}

/// How a dialect writes a function tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToolShape {
    /// Chat Completions: `{"type": "function", "function": {"name", …}}`,
    /// and a named `tool_choice` as `{"type": "function", "function": {"name"}}`.
    Chat,
    /// Responses: `{"type": "function", "name", …}`, and a named
    /// `tool_choice` as `{"type": "function", "name"}`.
    Responses,
}

impl ToolShape {
    /// The object holding a tool's (or a named choice's) name and definition.
    fn function(self, tool: &Value) -> &Value {
        match self {
            ToolShape::Chat => &tool["function"],
            ToolShape::Responses => tool,
        }
    }

    fn example(self) -> &'static str {
        match self {
            ToolShape::Chat => "`{\"type\": \"function\", \"function\": {\"name\": …}}`",
            ToolShape::Responses => "`{\"type\": \"function\", \"name\": …}`",
        }
    }
}

/// On a tool-call route, `tools`, `tool_choice` and `parallel_tool_calls`
/// may be sent only as the contract certified them (its tools, equal as
/// JSON: name, description, parameters; `strict` as the client likes):
/// anything else is a 400 naming what differs. Absent, the contract's apply.
pub(super) fn pin_tools(
    name: &str,
    value: &Value,
    certified: &surety_contracts::ToolCalls,
    contract: &str,
    shape: ToolShape,
) -> Result<(), OpenAiError> {
    let refuse = |param: String, why: String| {
        Err(OpenAiError::bad_request(
            "tools_not_certified",
            Some(&param),
            why,
        ))
    };
    if value.is_null() {
        return Ok(());
    }
    match name {
        "tools" => {
            let Some(sent) = value.as_array() else {
                return refuse(name.to_owned(), "`tools` must be a list".to_owned());
            };
            for (i, tool) in sent.iter().enumerate() {
                let function = shape.function(tool);
                let Some(tool_name) = function["name"].as_str() else {
                    return refuse(
                        format!("tools[{i}]"),
                        format!("a tool is {}", shape.example()),
                    );
                };
                let Some(ours) = certified.tool(tool_name) else {
                    return refuse(
                        format!("tools[{i}]"),
                        format!(
                            "the tool `{tool_name}` is not one contract `{contract}` certifies"
                        ),
                    );
                };
                let extra = tool
                    .as_object()
                    .into_iter()
                    .flat_map(|o| o.keys())
                    .chain(
                        function
                            .as_object()
                            .filter(|_| shape == ToolShape::Chat)
                            .into_iter()
                            .flat_map(|o| o.keys()),
                    )
                    .find(|k| {
                        !matches!(
                            k.as_str(),
                            "type" | "function" | "name" | "description" | "parameters" | "strict"
                        )
                    });
                let differs = if tool["type"] != "function" {
                    Some("its `type` is not `function`".to_owned())
                } else if let Some(extra) = extra {
                    Some(format!("it has `{extra}`"))
                } else if function["description"].as_str() != Some(ours.description.as_str()) {
                    Some("its `description` differs".to_owned())
                } else if function["parameters"] != ours.parameters {
                    Some("its `parameters` differ".to_owned())
                } else if !(function["strict"].is_null() || function["strict"].is_boolean()) {
                    Some("its `strict` is not true or false".to_owned())
                } else {
                    None
                };
                if let Some(why) = differs {
                    return refuse(
                        format!("tools[{i}]"),
                        format!(
                            "the tool `{tool_name}` differs from the one contract `{contract}` certifies: {why}"
                        ),
                    );
                }
            }
            if let Some(missing) = certified.tools.iter().find(|t| {
                !sent
                    .iter()
                    .any(|s| shape.function(s)["name"].as_str() == Some(t.name.as_str()))
            }) {
                return refuse(
                    name.to_owned(),
                    format!(
                        "the tool `{}` of contract `{contract}` is missing: send every certified tool, or none",
                        missing.name
                    ),
                );
            }
            if sent.len() != certified.tools.len() {
                return refuse(
                    name.to_owned(),
                    format!(
                        "`tools` names a tool twice; contract `{contract}` certifies each once"
                    ),
                );
            }
            Ok(())
        }
        "tool_choice" => {
            let matches = match &certified.choice {
                surety_contracts::ToolChoice::Any => value == "required",
                surety_contracts::ToolChoice::Named(tool) => {
                    value["type"] == "function"
                        && shape.function(value)["name"].as_str() == Some(tool)
                }
            };
            match matches {
                true => Ok(()),
                false => refuse(
                    name.to_owned(),
                    format!(
                        "contract `{contract}` is certified with `tool_choice` {}; send that or none",
                        match &certified.choice {
                            surety_contracts::ToolChoice::Any => "`required`".to_owned(),
                            surety_contracts::ToolChoice::Named(tool) => match shape {
                                ToolShape::Chat => format!(
                                    "`{{\"type\": \"function\", \"function\": {{\"name\": \"{tool}\"}}}}`"
                                ),
                                ToolShape::Responses =>
                                    format!("`{{\"type\": \"function\", \"name\": \"{tool}\"}}`"),
                            },
                        }
                    ),
                ),
            }
        }
        _ => match value.as_bool() {
            Some(parallel) if parallel == certified.parallel => Ok(()),
            _ => refuse(
                name.to_owned(),
                format!(
                    "contract `{contract}` is certified with `parallel_tool_calls` {}; send that or none",
                    certified.parallel
                ),
            ),
        },
    }
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
/// user, assistant (with the `tool_calls` it made, in an agent loop's
/// history) and tool (a call's result, by `tool_call_id`), content as text
/// or text parts. Anything else is refused by name.
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
            Some("tool") => Role::Tool,
            Some(other) => {
                return refuse(
                    format!("messages[{i}].role"),
                    format!(
                        "the role `{other}` is not supported; surety takes system, developer, user, assistant and tool messages"
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
        let allowed = |k: &str| match role {
            Role::Assistant => matches!(k, "role" | "content" | "name" | "tool_calls" | "refusal"),
            Role::Tool => matches!(k, "role" | "content" | "tool_call_id"),
            _ => matches!(k, "role" | "content" | "name"),
        };
        if let Some(extra) = m
            .as_object()
            .and_then(|o| o.keys().find(|k| !allowed(k.as_str())))
        {
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
            // An assistant turn that only called tools has no content.
            Value::Null if role == Role::Assistant && m["tool_calls"].is_array() => String::new(),
            _ => {
                return refuse(
                    format!("messages[{i}].content"),
                    "a message's content must be text".into(),
                );
            }
        };
        let mut message = match role {
            Role::System => Message::system(content),
            Role::User => Message::user(content),
            Role::Assistant => Message::assistant(content, Vec::new()),
            Role::Tool => {
                let Some(id) = m["tool_call_id"].as_str() else {
                    return refuse(
                        format!("messages[{i}].tool_call_id"),
                        "a tool message names the call it answers in `tool_call_id`".into(),
                    );
                };
                if surety_providers::called(&out, id).is_none() {
                    return refuse(
                        format!("messages[{i}].tool_call_id"),
                        format!(
                            "`{id}` is not the id of a tool call of an earlier assistant message"
                        ),
                    );
                }
                Message::tool(id, content)
            }
        };
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            let Some(calls) = calls.as_array() else {
                return refuse(
                    format!("messages[{i}].tool_calls"),
                    "`tool_calls` must be a list".into(),
                );
            };
            for (j, call) in calls.iter().enumerate() {
                let (Some(id), Some(name), Some(arguments), "function") = (
                    call["id"].as_str(),
                    call["function"]["name"].as_str(),
                    call["function"]["arguments"].as_str(),
                    call["type"].as_str().unwrap_or("function"),
                ) else {
                    return refuse(
                        format!("messages[{i}].tool_calls[{j}]"),
                        "a tool call is `{\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}`".into(),
                    );
                };
                message.tool_calls.push(surety_providers::CalledTool {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    arguments: arguments.to_owned(),
                });
            }
        }
        out.push(message);
    }
    if out.is_empty() {
        return refuse("messages".into(), "`messages` is empty".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// The certified temperature as the document's `enum` says it, or as
    /// written, and none, pass; a value merely near it (a fuzzer's
    /// `-3e-65` against a certified 0) is refused.
    #[test]
    fn only_the_certified_temperature_passes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../contracts/language-detect");
        let contract = surety_contracts::Contract::load(&dir)?;
        let t = contract.sampling.temperature;
        let passes = |v: serde_json::Value| {
            super::sampled_as_certified("temperature", &v, &contract).is_ok()
        };
        assert!(passes(json!(null)));
        assert!(passes(json!(f64::from(t))));
        assert!(passes(json!(t.to_string().parse::<f64>()?)));
        assert!(!passes(json!(f64::from(t) + 1e-12)));
        assert_eq!(t, 0.0, "language-detect is certified at temperature 0");
        assert!(!passes(json!(-3.0914408737285937e-65)));
        assert!(super::sampled_as_certified("top_p", &json!(1), &contract).is_ok());
        assert!(super::sampled_as_certified("top_p", &json!(0.9999999999), &contract).is_err());
        Ok(())
    }
}
