//! `cargo xtask openapi-extract`: the schemas the conformance tests need,
//! copied out of OpenAI's official OpenAPI document, so that tests never
//! read `../shared` at run time.
//!
//! The closure of `CreateChatCompletionRequest` and
//! `CreateChatCompletionResponse` goes under `$defs`, with references
//! rewritten to point there and OpenAPI's `nullable: true` spelled as JSON
//! Schema spells it (a `null` type), so a JSON Schema 2020-12 validator
//! reads it as OpenAPI 3 meant it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

const ROOTS: [&str; 2] = [
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
];
const OUT: &str = "tests/data/openai/chat-completions.schema.json";

pub fn extract(root: &Path, from: &Path) -> Result<()> {
    let document = from.join("openapi.json");
    let text = std::fs::read_to_string(&document)
        .with_context(|| format!("reading {}", document.display()))?;
    let source = std::fs::read_to_string(from.join("SOURCE"))
        .unwrap_or_else(|_| "unknown source".to_owned());
    let spec: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", document.display()))?;
    let schemas = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .context("the document has no components.schemas")?;

    let mut wanted: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<String> = ROOTS.iter().map(|s| (*s).to_owned()).collect();
    while let Some(name) = todo.pop() {
        if !wanted.insert(name.clone()) {
            continue;
        }
        let schema = schemas
            .get(&name)
            .with_context(|| format!("schema `{name}` is referenced but missing"))?;
        collect_refs(schema, &mut todo)?;
    }
    let defs: BTreeMap<String, Value> = wanted
        .iter()
        .map(|name| (name.clone(), convert(&schemas[name])))
        .collect();
    let out = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": format!(
            "Extracted by `cargo xtask openapi-extract` from {}. Only the closure of {} is kept; `$ref`s point into `$defs`; `nullable: true` became a `null` type.",
            source.trim().trim_end_matches('.'),
            ROOTS.join(" and ")
        ),
        "$defs": defs,
    });
    let path = root.join(OUT);
    std::fs::create_dir_all(path.parent().context("output has a parent")?)?;
    std::fs::write(&path, serde_json::to_string_pretty(&out)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    // The document is MIT-licensed: its notice travels with the copy.
    if let Ok(license) = std::fs::read_to_string(from.join("LICENSE")) {
        std::fs::write(path.with_file_name("LICENSE"), license)?;
    }
    eprintln!(
        "wrote {} ({} schemas) from {}",
        OUT,
        wanted.len(),
        source.trim()
    );
    Ok(())
}

fn collect_refs(value: &Value, todo: &mut Vec<String>) -> Result<()> {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    let target = v.as_str().context("a $ref that is not a string")?;
                    let Some(name) = target.strip_prefix("#/components/schemas/") else {
                        bail!("a $ref outside components.schemas: {target}");
                    };
                    todo.push(name.to_owned());
                } else {
                    collect_refs(v, todo)?;
                }
            }
        }
        Value::Array(items) => items.iter().try_for_each(|v| collect_refs(v, todo))?,
        _ => {}
    }
    Ok(())
}

fn convert(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out: Map<String, Value> = Map::new();
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("nullable", _) => {}
                    ("$ref", Value::String(target)) => {
                        out.insert(
                            key.clone(),
                            json!(target.replace("#/components/schemas/", "#/$defs/")),
                        );
                    }
                    // Property names are data, not keywords: keep them, convert their schemas.
                    ("properties", Value::Object(props)) => {
                        let props = props.iter().map(|(k, v)| (k.clone(), convert(v))).collect();
                        out.insert(key.clone(), Value::Object(props));
                    }
                    _ => {
                        out.insert(key.clone(), convert(v));
                    }
                }
            }
            if map.get("nullable") == Some(&Value::Bool(true)) {
                return nullable(out);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(convert).collect()),
        other => other.clone(),
    }
}

/// A schema that also accepts null.
fn nullable(mut schema: Map<String, Value>) -> Value {
    if let Some(values) = schema.get_mut("enum").and_then(Value::as_array_mut) {
        values.push(Value::Null);
    }
    match schema.get_mut("type") {
        Some(Value::String(t)) => {
            let t = t.clone();
            schema.insert("type".to_owned(), json!([t, "null"]));
            Value::Object(schema)
        }
        Some(Value::Array(types)) => {
            types.push(json!("null"));
            Value::Object(schema)
        }
        _ => json!({ "anyOf": [Value::Object(schema), { "type": "null" }] }),
    }
}
