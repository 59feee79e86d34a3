//! The schema capability lint: where a provider's structured-output mode
//! silently drops a keyword the contract's schema relies on (the keywords
//! each mode drops are the provider registry's:
//! `StructuredMode::dropped_keywords`). The answer is
//! always validated afterwards anyway; the lint says where the provider
//! cannot be trusted to have been constrained.

use serde_json::Value;
use surety_providers::StructuredMode;

/// What `mode` leaves out of what `contract` sends: its output schema's
/// keywords, or for a tool-call contract each tool's parameters' (the
/// tools are sent in the kind's own words, constrained as its
/// structured-output mode constrains a schema; a mode that sends no schema
/// sends the parameters unenforced).
pub fn lint_contract(contract: &surety_contracts::Contract, mode: StructuredMode) -> Vec<String> {
    let Some(tools) = &contract.tool_calls else {
        return lint(&contract.schema, mode);
    };
    let mut found = Vec::new();
    for tool in &tools.tools {
        if mode.dropped_keywords() == ["*"] {
            found.push(format!(
                "tool `{}`: `{}` sends its parameters unenforced: the arguments are constrained by the model alone",
                tool.name,
                mode.as_str()
            ));
            continue;
        }
        found.extend(
            lint(&tool.parameters, mode)
                .into_iter()
                .map(|w| format!("tool `{}`: {w}", tool.name)),
        );
    }
    found
}

/// One warning per keyword the schema uses that `mode` drops, with where.
pub fn lint(schema: &Value, mode: StructuredMode) -> Vec<String> {
    let dropped = mode.dropped_keywords();
    if dropped == ["*"] {
        return vec![format!(
            "`{}` does not send the schema: the output is constrained by the prompt alone",
            mode.as_str()
        )];
    }
    let mut found = Vec::new();
    walk(schema, "", dropped, mode, &mut found);
    found
}

fn walk(value: &Value, at: &str, dropped: &[&str], mode: StructuredMode, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let here = format!("{at}/{key}");
                // Property names under `properties` are data, not keywords.
                let is_keyword = !at.ends_with("/properties");
                if is_keyword && dropped.contains(&key.as_str()) {
                    found.push(format!("`{}` drops `{key}` at {here}", mode.as_str()));
                }
                walk(v, &here, dropped, mode, found);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, &format!("{at}/{i}"), dropped, mode, found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tool_call_contract_is_linted_on_its_tools_parameters() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
        let contract = surety_contracts::Contract::load(&root.join("support-action")).unwrap();
        let strict = lint_contract(&contract, StructuredMode::JsonSchema);
        assert!(
            strict.contains(
                &"tool `escalate`: `json_schema` drops `minLength` at /properties/reason/minLength"
                    .to_owned()
            ),
            "{strict:?}"
        );
        let llama = lint_contract(&contract, StructuredMode::JsonObjectSchema);
        assert!(
            llama.contains(&"tool `refund`: `json_object_schema` drops `exclusiveMinimum` at /properties/amount/exclusiveMinimum".to_owned()),
            "{llama:?}"
        );
        assert_eq!(
            lint_contract(&contract, StructuredMode::PromptOnly).len(),
            3,
            "one per tool"
        );
    }

    #[test]
    fn warns_where_a_mode_drops_what_the_schema_relies_on() {
        let schema = json!({
            "type": "object",
            "properties": {
                "issue_date": {"type": "string", "format": "date"},
                "tax": {"type": "number", "minimum": 0},
                "format": {"type": "string"},
                "tags": {"type": "array", "uniqueItems": true}
            }
        });
        let llama = lint(&schema, StructuredMode::JsonObjectSchema);
        assert_eq!(
            llama,
            [
                "`json_object_schema` drops `format` at /properties/issue_date/format",
                "`json_object_schema` drops `uniqueItems` at /properties/tags/uniqueItems",
                "`json_object_schema` drops `minimum` at /properties/tax/minimum",
            ],
            "a property named `format` is data, not the keyword"
        );
        assert_eq!(
            lint(&schema, StructuredMode::JsonObject).len(),
            1,
            "json_object does not send the schema at all"
        );
        assert!(
            lint(
                &json!({"type": "object", "properties": {"a": {"type": "string"}}}),
                StructuredMode::JsonSchema
            )
            .is_empty()
        );
    }
}
