//! One exchange with a provider under a contract, written once for the
//! harness and the router: [`request`] builds what is sent (the rendered
//! prompt, the contract's sampling, a seed where the provider declares it,
//! the token limit, the output schema) and [`check`] judges what came back
//! (parse → schema → rules). Certification adds facts, golden snapshots and
//! determinism on top; the router adds nothing of its own, so what is
//! served is what was certified.
//!
//! [`pinning`] reads a client's messages back into a contract's input, so
//! the OpenAI-compatible facade sends only prompts a certificate covers.
//!
//! Architecture invariant: the harness and the router build provider
//! requests only through [`request`] and judge answers only through
//! [`check`].

pub mod pinning;

use serde_json::Value;
use sha2::{Digest, Sha256};
use surety_contracts::ToolChoice;
use surety_contracts::{Contract, RenderError, Rendered, Violation};
use surety_providers::{
    Capabilities, ChatRequest, ChatResponse, Message, OutputFormat, PromptCache, ToolPick,
    ToolRequest, ToolSpec,
};

/// The messages of a rendered prompt: the system prompt, then the user's.
pub fn messages(rendered: &Rendered) -> Vec<Message> {
    vec![
        Message::system(rendered.system.clone()),
        Message::user(rendered.user.clone()),
    ]
}

/// The request every call under `contract` sends with `messages` to a
/// provider that has `capabilities`: the contract's temperature and output
/// token limit, its seed where the provider declares seeds (determinism is
/// checked either way), and its output schema — or, for a tool-call
/// contract, its tools and tool choice.
pub fn request(
    contract: &Contract,
    messages: Vec<Message>,
    capabilities: &Capabilities,
) -> ChatRequest {
    let output = match &contract.tool_calls {
        None => OutputFormat::Json {
            name: contract.output_name.clone(),
            schema: contract.schema.clone(),
        },
        Some(tools) => OutputFormat::Tools(ToolRequest {
            tools: tools
                .tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.parameters.clone(),
                })
                .collect(),
            pick: match &tools.choice {
                ToolChoice::Any => ToolPick::Any,
                ToolChoice::Named(name) => ToolPick::Named(name.clone()),
            },
            parallel: tools.parallel,
        }),
    };
    ChatRequest {
        messages,
        temperature: contract.sampling.temperature,
        max_tokens: contract.limits.max_output_tokens,
        seed: contract.sampling.seed.filter(|_| capabilities.seed),
        output,
        cache: PromptCache {
            system: contract.cache.system,
            tools: contract.cache.tools,
        },
        anthropic_beta: None,
    }
}

/// One step of [`check`], in order: `parse`, `arguments` (a tool-call
/// contract's), `schema`, `rules`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: &'static str,
    /// Empty when the step passed.
    pub violations: Vec<Violation>,
}

impl Step {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The parsed answer, when there was one.
    pub answer: Option<Value>,
    /// The steps that ran, in order; a failed parse ends the check.
    pub steps: Vec<Step>,
}

impl Checked {
    pub fn passed(&self) -> bool {
        self.steps.iter().all(Step::passed)
    }

    /// Every violation, one line: `schema at /x: ...; rule: ... at /y: ...`.
    pub fn describe(&self) -> String {
        describe_all(self.steps.iter().flat_map(|s| &s.violations))
    }
}

/// Violations as one line, `; `-separated.
pub fn describe_all<'a>(violations: impl IntoIterator<Item = &'a Violation>) -> String {
    violations
        .into_iter()
        .map(describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One violation as a phrase.
pub fn describe(v: &Violation) -> String {
    match v.pointer.is_empty() && v.check == "parse" {
        true => v.message.clone(),
        false => format!("{} at `{}`: {}", v.check, v.pointer, v.message),
    }
}

/// Judges an answer to `input` against its contract: it must be JSON
/// (parse; for a tool-call contract, the adapter's canonical answer), each
/// tool call's arguments must match its tool's parameters (arguments),
/// the answer must match the output schema (every error, with its
/// pointer), and keep the business rules (which may read the input). The
/// same judgement at certification and at run time.
pub fn check(contract: &Contract, input: &Value, response: &ChatResponse) -> Checked {
    let Some(answer) = &response.json else {
        return Checked {
            answer: None,
            steps: vec![Step {
                name: "parse",
                violations: vec![Violation {
                    check: "parse".to_owned(),
                    pointer: String::new(),
                    message: format!("no JSON answer: {}", excerpt(&response.text)),
                }],
            }],
        };
    };
    let mut steps = vec![Step {
        name: "parse",
        violations: Vec::new(),
    }];
    if contract.tool_calls.is_some() {
        steps.push(Step {
            name: "arguments",
            violations: contract.check_arguments(answer),
        });
    }
    steps.push(Step {
        name: "schema",
        violations: contract.check_schema(answer),
    });
    steps.push(Step {
        name: "rules",
        violations: contract.check_rules(answer, input),
    });
    Checked {
        steps,
        answer: Some(answer.clone()),
    }
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

/// `sha256:<hex>` of `text`.
pub fn text_digest(text: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

/// The digest of the exact prompts certification sends: every case's
/// rendered system and user messages, in case order, a tool-call
/// contract's tool definitions (they are part of the prompt), and what of
/// it is marked cacheable (a breakpoint is part of the request). The router
/// computes it again from the contract it serves, so a change in rendering
/// (a template engine upgrade, say) or an edited tool lapses the
/// certificate as an edited template does.
pub fn prompt_digest(contract: &Contract) -> Result<String, RenderError> {
    let mut hash = Sha256::new();
    if let Some(tools) = &contract.tool_calls {
        hash.update(format!("tools\0{}\0", tools.definitions()).as_bytes());
    }
    for part in contract.cache.names() {
        hash.update(format!("cache\0{part}\0").as_bytes());
    }
    for case in &contract.cases {
        let rendered = contract.render(&case.input)?;
        hash.update(format!("{}\0{}\0{}\0", case.name, rendered.system, rendered.user).as_bytes());
    }
    Ok(format!("sha256:{}", hex::encode(hash.finalize())))
}

/// The digest of the rendered system prompt, when every case renders the
/// same one (the certified system prompt the facade pins); none otherwise.
pub fn system_prompt_digest(contract: &Contract) -> Option<String> {
    let mut systems = contract
        .cases
        .iter()
        .map(|case| contract.render(&case.input).map(|r| r.system));
    let first = systems.next()?.ok()?;
    systems
        .all(|s| s.as_ref() == Ok(&first))
        .then(|| text_digest(&first))
}
