//! A tool-call contract's tools (SPEC "Tool-call contracts"): the tools
//! the model may call (name, description, parameters as JSON Schema, in a
//! file beside the prompt), which it may choose, and whether it may call
//! more than one. The answer's canonical form is `{"tool": <name>,
//! "arguments": {…}}` (with parallel calls allowed, `{"calls": [<that>,
//! …]}`), so the contract's schema, rules and facts apply to it by JSON
//! pointer; each call's arguments are validated by its tool's parameters.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::Violation;

/// One tool, as the contract declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `[a-zA-Z0-9_-]{1,64}`, as every provider kind accepts.
    pub name: String,
    pub description: String,
    /// A JSON Schema (2020-12) of the arguments: an object.
    pub parameters: Value,
}

/// Which tool the model may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Any declared tool, but a tool.
    Any,
    /// This one.
    Named(String),
}

impl ToolChoice {
    /// As `contract.toml` says it: `any`, or the tool's name.
    pub fn as_str(&self) -> &str {
        match self {
            ToolChoice::Any => "any",
            ToolChoice::Named(name) => name,
        }
    }
}

/// The calls of a canonical answer, each with its pointer: the answer
/// itself (`{"tool", "arguments"}`), or each of its `calls` (parallel calls).
pub fn calls(answer: &Value) -> Vec<(String, &Value)> {
    match answer.get("calls").and_then(Value::as_array) {
        Some(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| (format!("/calls/{i}"), call))
            .collect(),
        None => vec![(String::new(), answer)],
    }
}

/// A tool-call contract's tools, validated.
#[derive(Debug, Clone)]
pub struct ToolCalls {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Whether the answer may hold more than one call.
    pub parallel: bool,
    validators: Vec<Arc<jsonschema::Validator>>,
}

impl ToolCalls {
    /// `tools` (what the tools file holds), `choice` and `parallel`, checked:
    /// names a provider accepts and unique, each `parameters` an object
    /// schema that compiles, a named choice among them.
    pub(crate) fn new(
        tools: Vec<Tool>,
        choice: Option<&str>,
        parallel: bool,
    ) -> Result<ToolCalls, String> {
        if tools.is_empty() {
            return Err("declares no tool".to_owned());
        }
        let mut validators = Vec::new();
        for (i, tool) in tools.iter().enumerate() {
            let valid_name = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid_name {
                return Err(format!(
                    "tool `{}`: a name is 1 to 64 of a-z, A-Z, 0-9, `_` and `-`",
                    tool.name
                ));
            }
            if tools[..i].iter().any(|t| t.name == tool.name) {
                return Err(format!("two tools are named `{}`", tool.name));
            }
            if tool.parameters.get("type") != Some(&json!("object")) {
                return Err(format!(
                    "tool `{}`: `parameters` must be an object schema (`\"type\": \"object\"`)",
                    tool.name
                ));
            }
            let validator = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .should_validate_formats(true)
                .build(&tool.parameters)
                .map_err(|e| {
                    format!(
                        "tool `{}`: `parameters` is not a valid JSON Schema: {e}",
                        tool.name
                    )
                })?;
            validators.push(Arc::new(validator));
        }
        let choice = match choice.unwrap_or("any") {
            "any" => ToolChoice::Any,
            name if tools.iter().any(|t| t.name == name) => ToolChoice::Named(name.to_owned()),
            name => {
                return Err(format!(
                    "`tool_choice` is `{name}`, which is not a declared tool (or `any`)"
                ));
            }
        };
        Ok(ToolCalls {
            tools,
            choice,
            parallel,
            validators,
        })
    }

    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The definitions as one JSON value (tools, choice, parallel): what
    /// the prompt digest binds and what the facade pins `tools` against.
    pub fn definitions(&self) -> Value {
        json!({
            "tools": self.tools,
            "tool_choice": self.choice.as_str(),
            "parallel_calls": self.parallel,
        })
    }

    /// Every call's arguments against its tool's parameters (check
    /// `arguments`), each violation with its pointer into the answer.
    pub fn check_arguments(&self, answer: &Value) -> Vec<Violation> {
        let mut found = Vec::new();
        for (at, call) in calls(answer) {
            let violation = |pointer: String, message: String| Violation {
                check: "arguments".to_owned(),
                pointer,
                message,
            };
            let Some(name) = call.get("tool").and_then(Value::as_str) else {
                found.push(violation(format!("{at}/tool"), "names no tool".to_owned()));
                continue;
            };
            let Some(i) = self.tools.iter().position(|t| t.name == name) else {
                found.push(violation(
                    format!("{at}/tool"),
                    format!("`{name}` is not a declared tool"),
                ));
                continue;
            };
            let arguments = call.get("arguments").unwrap_or(&Value::Null);
            for e in self.validators[i].iter_errors(arguments) {
                found.push(violation(
                    format!("{at}/arguments{}", e.instance_path()),
                    format!("`{name}`'s parameters: {e}"),
                ));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refund() -> Tool {
        Tool {
            name: "refund".into(),
            description: "Refund an order.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"amount": {"type": "number"}},
                "required": ["amount"],
                "additionalProperties": false,
            }),
        }
    }

    #[test]
    fn arguments_are_judged_by_their_tools_parameters() {
        let tools = ToolCalls::new(vec![refund()], None, false).unwrap();
        assert_eq!(tools.choice, ToolChoice::Any);
        let good = json!({"tool": "refund", "arguments": {"amount": 30}});
        assert!(tools.check_arguments(&good).is_empty());
        let text = json!({"tool": "refund", "arguments": {"amount": "30"}});
        let found = tools.check_arguments(&text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].pointer, "/arguments/amount");
        assert!(
            found[0].message.contains("`refund`'s parameters"),
            "{found:?}"
        );
        let other = json!({"tool": "delete_account", "arguments": {}});
        assert_eq!(
            tools.check_arguments(&other)[0].message,
            "`delete_account` is not a declared tool"
        );
    }

    #[test]
    fn bad_declarations_are_refused_saying_why() {
        let mut spaced = refund();
        spaced.name = "issue refund".into();
        let mut loose = refund();
        loose.parameters = json!({"type": "string"});
        for (tools, choice, why) in [
            (vec![], None, "declares no tool"),
            (vec![spaced], None, "a name is 1 to 64"),
            (
                vec![refund(), refund()],
                None,
                "two tools are named `refund`",
            ),
            (vec![loose], None, "must be an object schema"),
            (vec![refund()], Some("escalate"), "not a declared tool"),
        ] {
            let refused = ToolCalls::new(tools, choice, false).unwrap_err();
            assert!(refused.contains(why), "{refused}");
        }
        let named = ToolCalls::new(vec![refund()], Some("refund"), false).unwrap();
        assert_eq!(named.choice, ToolChoice::Named("refund".into()));
    }
}
