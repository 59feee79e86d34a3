//! The canonical answer of a tool-call request, written once for every
//! wire format: each adapter reads its own tool calls (OpenAI
//! `message.tool_calls`, Anthropic `tool_use` blocks, Gemini `functionCall`
//! parts) into [`Made`], and [`canonical`] judges them against what was
//! asked. Each failure is definite, in words: a text answer where a tool
//! call was required, an undeclared (or unchosen) tool, arguments that do
//! not parse or are not an object, more calls than allowed.

use serde_json::{Value, json};

use crate::{ToolPick, ToolRequest};

/// One tool call as the wire format gave it.
pub(crate) struct Made {
    pub(crate) name: String,
    /// Its arguments: parsed, or the text that did not parse.
    pub(crate) arguments: Arguments,
}

pub(crate) enum Arguments {
    Parsed(Value),
    /// OpenAI sends the arguments as a JSON string.
    Text(String),
}

/// The answer `made` is under `asked`: `{"tool", "arguments"}` (or, with
/// parallel calls allowed, `{"calls": […]}`), or why it is none; `text` is
/// what the model said besides, for the words of a text answer.
pub(crate) fn canonical(asked: &ToolRequest, made: Vec<Made>, text: &str) -> Result<Value, String> {
    if made.is_empty() {
        return Err(format!(
            "answered in text, not a tool call: {}",
            excerpt(if text.trim().is_empty() {
                "(nothing)"
            } else {
                text
            })
        ));
    }
    if made.len() > 1 && !asked.parallel {
        let names: Vec<&str> = made.iter().map(|m| m.name.as_str()).collect();
        return Err(format!(
            "made {} tool calls ({}) where one is allowed",
            made.len(),
            names.join(", ")
        ));
    }
    let mut calls = Vec::new();
    for call in made {
        let name = call.name;
        if !asked.tools.iter().any(|t| t.name == name) {
            return Err(format!(
                "called `{name}`, which the request does not declare"
            ));
        }
        if let ToolPick::Named(chosen) = &asked.pick
            && *chosen != name
        {
            return Err(format!(
                "called `{name}` where the request names `{chosen}`"
            ));
        }
        let arguments = match call.arguments {
            Arguments::Parsed(value) => value,
            Arguments::Text(text) => serde_json::from_str(&text).map_err(|e| {
                format!(
                    "the arguments of `{name}` are not JSON ({e}): {}",
                    excerpt(&text)
                )
            })?,
        };
        if !arguments.is_object() {
            return Err(format!(
                "the arguments of `{name}` are not an object: {}",
                excerpt(&arguments.to_string())
            ));
        }
        calls.push(json!({"tool": name, "arguments": arguments}));
    }
    Ok(match asked.parallel {
        true => json!({ "calls": calls }),
        false => calls.remove(0),
    })
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolSpec;

    fn asked(pick: ToolPick, parallel: bool) -> ToolRequest {
        let tool = |name: &str| ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        };
        ToolRequest {
            tools: vec![tool("refund"), tool("escalate")],
            pick,
            parallel,
        }
    }

    fn call(name: &str, arguments: &str) -> Made {
        Made {
            name: name.to_owned(),
            arguments: Arguments::Text(arguments.to_owned()),
        }
    }

    #[test]
    fn one_call_is_the_canonical_answer() {
        let answer = canonical(
            &asked(ToolPick::Any, false),
            vec![call("refund", r#"{"amount": 30}"#)],
            "",
        )
        .unwrap();
        assert_eq!(
            answer,
            json!({"tool": "refund", "arguments": {"amount": 30}})
        );
        let both = canonical(
            &asked(ToolPick::Any, true),
            vec![call("refund", "{}"), call("escalate", "{}")],
            "",
        )
        .unwrap();
        assert_eq!(both["calls"][1]["tool"], "escalate");
    }

    #[test]
    fn every_way_a_tool_answer_fails_is_named() {
        let any = asked(ToolPick::Any, false);
        for (made, text, why) in [
            (
                vec![],
                "I will refund it.",
                "answered in text, not a tool call: I will refund it.",
            ),
            (
                vec![call("delete", "{}")],
                "",
                "called `delete`, which the request does not declare",
            ),
            (
                vec![call("refund", "{amount: 30")],
                "",
                "the arguments of `refund` are not JSON",
            ),
            (
                vec![call("refund", "[30]")],
                "",
                "the arguments of `refund` are not an object",
            ),
            (
                vec![call("refund", "{}"), call("refund", "{}")],
                "",
                "made 2 tool calls (refund, refund) where one is allowed",
            ),
        ] {
            let refused = canonical(&any, made, text).unwrap_err();
            assert!(refused.starts_with(why), "{refused}");
        }
        let named = asked(ToolPick::Named("refund".into()), false);
        let refused = canonical(&named, vec![call("escalate", "{}")], "").unwrap_err();
        assert_eq!(
            refused,
            "called `escalate` where the request names `refund`"
        );
    }
}
