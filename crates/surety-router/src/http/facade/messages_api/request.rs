//! Reading an Anthropic Messages request: the parameters surety honours
//! (any other refused by name), and the system prompt and turns as the
//! messages every provider kind is sent.

use serde_json::{Map, Value, json};
use surety_providers::{CalledTool, Message, Role};

use super::super::OpenAiError;
use super::super::request::{ToolShape, pin_tools, sampled_as_certified};
use crate::certification::ServedContract;

/// What the request asks of the answer's delivery.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked {
    pub(super) stream: bool,
    /// The route's contract answers with tool calls: `tool_use` blocks.
    pub(super) tool_calls: bool,
}

fn refuse(param: &str, why: impl Into<String>) -> OpenAiError {
    OpenAiError::bad_request("unsupported_parameter", Some(param), why)
}

/// The parameters surety honours, checked; any other is refused by name.
/// Sampling is the contract's: a request may repeat it, not change it.
pub(super) fn parameters(
    request: &Map<String, Value>,
    served: &ServedContract,
) -> Result<Asked, OpenAiError> {
    let contract = &served.contract;
    let mut asked = Asked {
        stream: false,
        tool_calls: contract.tool_calls.is_some(),
    };
    let limit = u64::from(contract.limits.max_output_tokens);
    // A whole number, however JSON writes it (`256` or `256.0`).
    let whole = |v: &Value| {
        v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(f))
                .map(|f| f as u64)
        })
    };
    match request.get("max_tokens").map(whole) {
        None => {
            return Err(OpenAiError::bad_request(
                "invalid_request",
                Some("max_tokens"),
                "`max_tokens` is required",
            ));
        }
        Some(Some(n)) if n >= limit => {}
        Some(_) => {
            return Err(refuse(
                "max_tokens",
                format!(
                    "the route's contract `{}` is certified with {limit} output tokens, which the provider is asked for: send `max_tokens` of {limit} or more",
                    contract.id
                ),
            ));
        }
    }
    if let Some(certified) = &contract.tool_calls {
        for (name, value) in openai_tools(request)? {
            pin_tools(name, &value, certified, &contract.id, ToolShape::Responses)?;
        }
    }
    for (name, value) in request {
        match name.as_str() {
            "model" | "messages" | "system" | "max_tokens" => {}
            "tools" | "tool_choice" if asked.tool_calls => {}
            "tools" | "tool_choice" if value.is_null() || value == &json!([]) => {}
            "tool_choice" if value["type"] == "auto" || value["type"] == "none" => {}
            "tools" | "tool_choice" => {
                return Err(refuse(
                    name,
                    format!(
                        "`{name}` is not supported: a route answers in its contract's JSON, not with tool use"
                    ),
                ));
            }
            "stream" => match value {
                Value::Bool(on) => asked.stream = *on,
                Value::Null => {}
                _ => return Err(refuse(name, "`stream` must be true or false")),
            },
            "temperature" | "top_p" => sampled_as_certified(name, value, contract)?,
            "stop_sequences" if value.is_null() || value == &json!([]) => {}
            "stop_sequences" => {
                return Err(refuse(
                    name,
                    format!(
                        "the route's contract `{}` is certified without stop sequences; send none",
                        contract.id
                    ),
                ));
            }
            // For the caller's own records: nothing sent changes.
            "metadata" => metadata(value)?,
            other => {
                return Err(refuse(
                    other,
                    format!("`{other}` is not supported by surety's messages"),
                ));
            }
        }
    }
    Ok(asked)
}

/// `metadata`: only `user_id` (a string, or none), as Anthropic takes it.
fn metadata(value: &Value) -> Result<(), OpenAiError> {
    let Some(pairs) = value.as_object() else {
        return match value {
            Value::Null => Ok(()),
            _ => Err(refuse("metadata", "`metadata` must be an object")),
        };
    };
    for (key, v) in pairs {
        if key != "user_id" || !(v.is_string() || v.is_null()) {
            return Err(refuse(
                &format!("metadata.{key}"),
                "`metadata` takes `user_id`, a string",
            ));
        }
    }
    Ok(())
}

/// Anthropic's `tools` and `tool_choice`, in the Responses API's words,
/// for the one check of certified tools: a tool `{name, description,
/// input_schema}` (`type` `custom`, if sent), `tool_choice` `any` (the
/// contract's `required`), or `tool` by `name`; its
/// `disable_parallel_tool_use` says `parallel_tool_calls`.
fn openai_tools(request: &Map<String, Value>) -> Result<Vec<(&'static str, Value)>, OpenAiError> {
    let mut out = Vec::new();
    if let Some(tools) = request.get("tools").filter(|t| !t.is_null()) {
        let Some(list) = tools.as_array() else {
            return Err(refuse("tools", "`tools` must be a list"));
        };
        let mut same = Vec::new();
        for (i, tool) in list.iter().enumerate() {
            let extra = tool.as_object().and_then(|o| {
                o.keys().find(|k| {
                    !matches!(k.as_str(), "type" | "name" | "description" | "input_schema")
                })
            });
            if let Some(extra) = extra {
                return Err(OpenAiError::bad_request(
                    "tools_not_certified",
                    Some(&format!("tools[{i}].{extra}")),
                    format!("`{extra}` in a tool is not supported"),
                ));
            }
            if !(tool["type"].is_null() || tool["type"] == "custom") {
                return Err(OpenAiError::bad_request(
                    "tools_not_certified",
                    Some(&format!("tools[{i}].type")),
                    "only custom tools (`{\"name\", \"description\", \"input_schema\"}`) are certified",
                ));
            }
            same.push(json!({
                "type": "function",
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["input_schema"],
            }));
        }
        out.push(("tools", Value::Array(same)));
    }
    if let Some(choice) = request.get("tool_choice").filter(|c| !c.is_null()) {
        let same = match choice["type"].as_str() {
            Some("any") => json!("required"),
            Some("tool") => json!({"type": "function", "name": choice["name"]}),
            Some(other) => json!(other),
            None => return Err(refuse("tool_choice", "`tool_choice` needs a `type`")),
        };
        out.push(("tool_choice", same));
        if let Some(disable) = choice.get("disable_parallel_tool_use") {
            let Some(disable) = disable.as_bool() else {
                return Err(refuse(
                    "tool_choice.disable_parallel_tool_use",
                    "`disable_parallel_tool_use` must be true or false",
                ));
            };
            out.push(("parallel_tool_calls", json!(!disable)));
        }
    }
    Ok(out)
}

/// The request's `system` (text, or text blocks) and `messages` (`user`
/// and `assistant` turns; text, an assistant's `tool_use` and `thinking`,
/// a user's `tool_result`), as messages every provider kind is sent. An
/// earlier turn's `thinking` is not sent, as Anthropic's API leaves it out
/// of the context of a request without extended thinking; anything else
/// is refused by name.
pub(super) fn turns(body: &Value) -> Result<Vec<Message>, OpenAiError> {
    let mut out = Vec::new();
    match &body["system"] {
        Value::Null => {}
        Value::String(text) => out.push(Message::system(text.clone())),
        Value::Array(blocks) => {
            let (text, control) = texts(blocks, "system")?;
            out.push(Message::system(text).cached(control));
        }
        _ => return Err(refuse("system", "`system` must be text or text blocks")),
    }
    let Some(turns) = body["messages"].as_array().filter(|t| !t.is_empty()) else {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            Some("messages"),
            "`messages` must be a list of at least one turn",
        ));
    };
    for (i, turn) in turns.iter().enumerate() {
        let at = format!("messages[{i}]");
        if let Some(extra) = turn
            .as_object()
            .and_then(|o| o.keys().find(|k| !matches!(k.as_str(), "role" | "content")))
        {
            return Err(refuse(
                &format!("{at}.{extra}"),
                format!("`{extra}` in a message is not supported"),
            ));
        }
        let role = match turn["role"].as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => {
                return Err(refuse(
                    &format!("{at}.role"),
                    "a turn's `role` is `user` or `assistant`",
                ));
            }
        };
        let blocks = match &turn["content"] {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            _ => {
                return Err(refuse(
                    &format!("{at}.content"),
                    "a turn's content is text or a list of blocks",
                ));
            }
        };
        let (mut text, mut calls, mut control) = (String::new(), Vec::new(), None);
        // The turn's own last block (a tool_result is a turn of its own):
        // where its breakpoint may stand.
        let last = blocks
            .iter()
            .rposition(|b| matches!(b["type"].as_str(), Some("text" | "tool_use")));
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            let kind = block["type"].as_str().unwrap_or_default();
            let allowed: &[&str] = match (role, kind) {
                (_, "text") => &["type", "text", "citations", "cache_control"],
                (Role::Assistant, "tool_use") => &["type", "id", "name", "input", "cache_control"],
                (Role::Assistant, "thinking") => &["type", "thinking", "signature"],
                (Role::Assistant, "redacted_thinking") => &["type", "data"],
                (Role::User, "tool_result") => &[
                    "type",
                    "tool_use_id",
                    "content",
                    "is_error",
                    "cache_control",
                ],
                _ => {
                    return Err(refuse(
                        &at,
                        format!(
                            "a `{kind}` block is not supported in a {} turn; surety takes text, an assistant's tool_use and thinking, and a user's tool_result",
                            match role {
                                Role::Assistant => "assistant",
                                _ => "user",
                            }
                        ),
                    ));
                }
            };
            if let Some(extra) = block
                .as_object()
                .and_then(|o| o.keys().find(|k| !allowed.contains(&k.as_str())))
            {
                return Err(refuse(
                    &format!("{at}.{extra}"),
                    format!("`{extra}` in a `{kind}` block is not supported"),
                ));
            }
            let marked = breakpoint(block, &at)?;
            if marked.is_some() && kind != "tool_result" && Some(j) != last {
                return Err(refuse(&format!("{at}.cache_control"), ONE_BLOCK));
            }
            match kind {
                "text" => match (block["text"].as_str(), &block["citations"]) {
                    (Some(t), Value::Null) => text.push_str(t),
                    (Some(t), Value::Array(c)) if c.is_empty() => text.push_str(t),
                    _ => {
                        return Err(refuse(
                            &at,
                            "a text block is `{\"type\": \"text\", \"text\"}`",
                        ));
                    }
                },
                "tool_use" => {
                    let (Some(id), Some(name), Some(input)) = (
                        block["id"].as_str(),
                        block["name"].as_str(),
                        block.get("input").filter(|i| i.is_object()),
                    ) else {
                        return Err(refuse(
                            &at,
                            "a tool_use block is `{\"type\": \"tool_use\", \"id\", \"name\", \"input\": {…}}`",
                        ));
                    };
                    calls.push(CalledTool {
                        id: id.to_owned(),
                        name: name.to_owned(),
                        arguments: input.to_string(),
                    });
                }
                "tool_result" => {
                    let Some(id) = block["tool_use_id"].as_str() else {
                        return Err(refuse(&at, "a tool_result names its `tool_use_id`"));
                    };
                    if surety_providers::called(&out, id).is_none() {
                        return Err(refuse(
                            &format!("{at}.tool_use_id"),
                            format!(
                                "`{id}` is not the id of a tool_use of an earlier assistant turn"
                            ),
                        ));
                    }
                    let (result, inner) = match &block["content"] {
                        Value::String(t) => (t.clone(), None),
                        Value::Array(parts) => texts(parts, &format!("{at}.content"))?,
                        Value::Null => (String::new(), None),
                        _ => return Err(refuse(&format!("{at}.content"), "a tool result is text")),
                    };
                    out.push(Message::tool(id, result).cached(marked.clone().or(inner)));
                }
                // An earlier turn's reasoning: not part of the context.
                _ => {}
            }
            if kind != "tool_result" {
                control = control.or(marked);
            }
        }
        match role {
            Role::Assistant => out.push(Message::assistant(text, calls).cached(control)),
            _ if !text.is_empty() => out.push(Message::user(text).cached(control)),
            _ => {}
        }
    }
    Ok(out)
}

/// The texts a `count_tokens` request's prompt is counted as: each turn's
/// (an assistant's tool calls as their names and arguments) and each tool
/// definition's JSON; any parameter it does not count is refused by name.
pub(super) fn counted(body: &Value) -> Result<Vec<String>, OpenAiError> {
    if let Some(other) = body.as_object().and_then(|o| {
        o.keys().find(|k| {
            !matches!(
                k.as_str(),
                "model" | "messages" | "system" | "tools" | "tool_choice"
            )
        })
    }) {
        return Err(refuse(
            other,
            format!("`{other}` is not supported by surety's count_tokens"),
        ));
    }
    // Omitted, `system` is no system prompt; sent, it is text or blocks.
    if body.get("system").is_some_and(Value::is_null) {
        return Err(refuse("system", "`system` must be text or text blocks"));
    }
    let mut texts: Vec<String> = turns(body)?
        .into_iter()
        .map(|m| {
            m.tool_calls.iter().fold(m.content, |text, call| {
                format!("{text}{}{}", call.name, call.arguments)
            })
        })
        .collect();
    match &body["tools"] {
        Value::Null => {}
        Value::Array(tools) => texts.extend(tools.iter().map(Value::to_string)),
        _ => return Err(refuse("tools", "`tools` must be a list")),
    }
    Ok(texts)
}

/// Why a breakpoint is refused where it stands.
const ONE_BLOCK: &str = "`cache_control` is kept on a turn's last block (or a tool_result): surety sends a turn's text as one block, and the breakpoint at its end";

/// A block's `cache_control`, as the client sent it: an object naming its
/// `type` (Anthropic's `ephemeral`, with a `ttl` if sent), passed on
/// unchanged to the providers that take it.
fn breakpoint(block: &Value, at: &str) -> Result<Option<Value>, OpenAiError> {
    match block.get("cache_control") {
        None | Some(Value::Null) => Ok(None),
        Some(control) if control["type"].is_string() => Ok(Some(control.clone())),
        Some(_) => Err(refuse(
            &format!("{at}.cache_control"),
            "`cache_control` is an object naming its `type` (`{\"type\": \"ephemeral\"}`)",
        )),
    }
}

/// The text of a list of text blocks (`param` names the list), and the
/// breakpoint on its last block.
fn texts(blocks: &[Value], param: &str) -> Result<(String, Option<Value>), OpenAiError> {
    let (mut text, mut control) = (String::new(), None);
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("{param}[{i}]");
        if let Some(extra) = block.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "type" | "text" | "cache_control"))
        }) {
            return Err(refuse(
                &format!("{at}.{extra}"),
                format!("`{extra}` in a text block is not supported"),
            ));
        }
        control = breakpoint(block, &at)?;
        if control.is_some() && i + 1 != blocks.len() {
            return Err(refuse(&format!("{at}.cache_control"), ONE_BLOCK));
        }
        match (block["type"].as_str(), block["text"].as_str()) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => return Err(refuse(&at, "only text blocks are supported here")),
        }
    }
    Ok((text, control))
}

/// The header a client names Anthropic's betas in.
pub(super) const ANTHROPIC_BETA: &str = "anthropic-beta";

/// What of a request's caching a route sends: on an output-only route the
/// client's breakpoints and `anthropic-beta` pass on (to the providers
/// that take them); on a pinned route the contract decides what is cached,
/// so a breakpoint is refused unless it is the contract's own (on the
/// system prompt, `ephemeral`), and so is a beta.
pub(super) fn caching(
    messages: &[Message],
    headers: &axum::http::HeaderMap,
    served: &ServedContract,
    facade: surety_config::Facade,
) -> Result<Option<String>, OpenAiError> {
    let sent: Vec<&str> = headers
        .get_all(ANTHROPIC_BETA)
        .iter()
        .map(|v| v.to_str())
        .collect::<Result<_, _>>()
        .map_err(|_| refuse(ANTHROPIC_BETA, "`anthropic-beta` must be visible ASCII"))?;
    let beta = (!sent.is_empty()).then(|| sent.join(","));
    if facade == surety_config::Facade::OutputOnly {
        return Ok(beta);
    }
    let contract = &served.contract;
    let marked = contract.cache.names().join(", ");
    let decides = format!(
        "route's contract `{}` decides what is cached (`[prompt] cache = [{marked}]`)",
        contract.id
    );
    if beta.is_some() {
        return Err(refuse(
            ANTHROPIC_BETA,
            format!(
                "a pinned route sends the certified request, which names no beta; the {decides}"
            ),
        ));
    }
    let own = json!({"type": "ephemeral"});
    for m in messages {
        let Some(control) = &m.cache_control else {
            continue;
        };
        let (param, ours) = match m.role {
            Role::System => ("system", contract.cache.system && control == &own),
            _ => ("messages", false),
        };
        if !ours {
            return Err(refuse(
                &format!("{param}.cache_control"),
                format!("on a pinned route the {decides}; send `cache_control` only where it does"),
            ));
        }
    }
    Ok(None)
}
