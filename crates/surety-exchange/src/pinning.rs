//! Prompt pinning: reading a client's messages back into a contract's input.
//!
//! The facade may send only prompts a certificate covers. A request pins
//! when its messages are exactly a rendering of the contract's templates:
//! one system message equal to the rendered system prompt, and one user
//! message that the user template, with the variables read back from it,
//! renders to the same text. Reading back works for templates that are
//! plain substitutions (`Message: {{ text }}`); a template with any other
//! syntax cannot be inverted, and its route can only be served output-only.

use regex::Regex;
use serde_json::{Map, Value};
use surety_contracts::Contract;
use surety_providers::{Message, Role};

use crate::text_digest;

/// Why a request's messages are not a rendering of the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinError {
    /// Which part differs: `messages`, `system` or `user`.
    pub part: &'static str,
    pub message: String,
}

impl std::fmt::Display for PinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A user template read as literal text around plain `{{ name }}` slots.
#[derive(Debug, Clone)]
pub struct UserTemplate {
    names: Vec<String>,
    literals: Vec<String>,
    pattern: Regex,
}

impl UserTemplate {
    /// Parses `template` as minijinja renders it (one trailing newline
    /// dropped); `Err` says why it cannot be inverted.
    pub fn parse(template: &str) -> Result<UserTemplate, String> {
        let template = template.strip_suffix('\n').unwrap_or(template);
        if template.contains("{%") || template.contains("{#") {
            return Err("it has statements or comments, not only `{{ name }}` slots".to_owned());
        }
        let mut names = Vec::new();
        let mut literals = Vec::new();
        let mut pattern = String::from("(?s)^");
        let mut rest = template;
        while let Some(open) = rest.find("{{") {
            let close = rest[open..]
                .find("}}")
                .map(|c| open + c)
                .ok_or("a `{{` is never closed")?;
            let name = rest[open + 2..close].trim();
            let plain = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !plain {
                return Err(format!(
                    "`{{{{{}}}}}` is an expression, not a plain variable",
                    &rest[open + 2..close]
                ));
            }
            pattern.push_str(&regex::escape(&rest[..open]));
            literals.push(rest[..open].to_owned());
            pattern.push_str("(.*?)");
            names.push(name.to_owned());
            rest = &rest[close + 2..];
        }
        if rest.contains("}}") {
            return Err("a `}}` is never opened".to_owned());
        }
        pattern.push_str(&regex::escape(rest));
        literals.push(rest.to_owned());
        pattern.push('$');
        let pattern = Regex::new(&pattern).map_err(|e| e.to_string())?;
        Ok(UserTemplate {
            names,
            literals,
            pattern,
        })
    }

    /// The template's variables, in the order their slots appear (a
    /// variable used twice appears twice).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The pieces of literal text around the slots, as the template renders
    /// them: one more than there are slots.
    pub fn literals(&self) -> &[String] {
        &self.literals
    }

    /// The variables `text` gives the slots, or none if it does not fit.
    fn read(&self, text: &str) -> Option<Map<String, Value>> {
        let captures = self.pattern.captures(text)?;
        let mut input = Map::new();
        for (i, name) in self.names.iter().enumerate() {
            let value = captures.get(i + 1)?.as_str();
            match input.get(name) {
                Some(seen) if seen.as_str() != Some(value) => return None,
                _ => {
                    input.insert(name.clone(), Value::String(value.to_owned()));
                }
            }
        }
        Some(input)
    }
}

/// The contract's input that renders to exactly `messages`, or why none does.
pub fn read_back(
    contract: &Contract,
    template: &UserTemplate,
    messages: &[Message],
) -> Result<Value, PinError> {
    let error = |part, message: String| Err(PinError { part, message });
    let (system, user) = match messages {
        [s, u] if s.role == Role::System && u.role == Role::User => (s, u),
        _ => {
            let roles: Vec<&str> = messages.iter().map(|m| role_name(m.role)).collect();
            return error(
                "messages",
                format!(
                    "the certified prompt of contract `{}` is one system message then one user message; this request has [{}]",
                    contract.id,
                    roles.join(", ")
                ),
            );
        }
    };
    let Some(input) = template.read(&user.content) else {
        return error(
            "user",
            format!(
                "the user message does not fit the user template of contract `{}`: {:?}",
                contract.id,
                contract.user_template.trim_end()
            ),
        );
    };
    let input = Value::Object(input);
    let rendered = match contract.render(&input) {
        Ok(rendered) => rendered,
        Err(e) => {
            return error(
                "user",
                format!("the user message's variables do not render: {e}"),
            );
        }
    };
    if rendered.user != user.content {
        return error(
            "user",
            format!(
                "the user message does not render back from the user template of contract `{}` (it differs from character {})",
                contract.id,
                first_difference(&rendered.user, &user.content)
            ),
        );
    }
    if rendered.system != system.content {
        return error(
            "system",
            format!(
                "the system message is not the certified system prompt of contract `{}`: expected {} ({} characters), got {} ({} characters), differing from character {}",
                contract.id,
                text_digest(&rendered.system),
                rendered.system.chars().count(),
                text_digest(&system.content),
                system.content.chars().count(),
                first_difference(&rendered.system, &system.content)
            ),
        );
    }
    Ok(input)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The 1-based position of the first character where `a` and `b` differ.
fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count() + 1
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn plain_substitutions_read_back_and_other_syntax_does_not() {
        let t = UserTemplate::parse("Customer plan: {{ plan }}\nTicket body:\n{{body}}\n").unwrap();
        let input = t
            .read("Customer plan: pro\nTicket body:\nIt broke.\nTwice.")
            .unwrap();
        assert_eq!(input["plan"], "pro");
        assert_eq!(input["body"], "It broke.\nTwice.");
        assert!(t.read("Plan: pro\nTicket body:\nx").is_none());
        for bad in [
            "{% if a %}x{% endif %}",
            "{{ a | upper }}",
            "{{ a.b }}",
            "{# c #}",
        ] {
            assert!(UserTemplate::parse(bad).is_err(), "{bad}");
        }
        let twice = UserTemplate::parse("{{ a }} and {{ a }}").unwrap();
        assert!(twice.read("x and x").is_some());
        assert!(twice.read("x and y").is_none());
    }
}
