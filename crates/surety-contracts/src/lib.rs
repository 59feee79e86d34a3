//! surety's prompt contracts: the operational agreement a provider must keep.
//!
//! A contract lives in `contracts/<id>/`:
//! - `contract.toml`: id, side effects, the prompt's templates, the output
//!   schema, sampling (temperature, samples per case, the k-of-N per case,
//!   whether a flaky case passes), token limits, business rules, golden
//!   redactions;
//! - the templates (`system.jinja`, `user.jinja`, rendered by minijinja with
//!   strict undefined variables);
//! - the output JSON Schema (2020-12, formats validated);
//! - for a tool-call contract (`[output] kind = "tool_call"`), its tools
//!   (name, description, parameters), in a JSON file beside the prompt;
//! - `cases.toml`: real inputs, each with the facts expected of its answer.
//!
//! Its digest is a sha256 over every file of the directory, so editing any
//! of them lapses every certification bound to the old digest.
//!
//! Architecture invariant: this crate owns the contract file format; it does
//! no network IO and knows no provider.

mod facts;
mod live;
mod rules;
mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use facts::Expectation;
pub use live::{Judged, Live, Seen};
pub use rules::{Condition, Rule};
pub use tools::{Tool, ToolCalls, ToolChoice, calls};

/// What a contract's calls do outside the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffects {
    /// Nothing: a duplicate call costs money, never correctness. Hedging is allowed.
    None,
    /// A repeated call has the same effect as one.
    Idempotent,
    /// Calls change something outside: never hedge.
    External,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    pub temperature: f32,
    /// Samples per case (N).
    pub samples: u32,
    /// Samples that must pass for the case to pass (k of N).
    pub pass_k: u32,
    /// Whether a flaky case (k of N passed, but not all, or not all alike) passes.
    #[serde(default)]
    pub flaky_passes: bool,
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The answer's budget: the request's max tokens.
    pub max_output_tokens: u32,
    /// The rendered prompt's budget.
    pub max_prompt_tokens: u32,
}

/// One real input, with the facts its answer must state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub input: Value,
    #[serde(default)]
    pub expect: Vec<Expectation>,
}

/// `cases` as `cases.toml` has them, each after its comment lines (where
/// it came from): what `surety cases export` proposes, for a person to
/// review and merge.
pub fn cases_toml(cases: &[(String, Case)]) -> Result<String, ContractError> {
    let mut out = String::new();
    for (comment, case) in cases {
        #[derive(Serialize)]
        struct One<'a> {
            case: [&'a Case; 1],
        }
        let text = toml::to_string(&One { case: [case] }).map_err(|e| ContractError::Invalid {
            path: format!("case `{}`", case.name),
            message: e.to_string(),
        })?;
        for line in comment.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&text);
        out.push('\n');
    }
    Ok(out)
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rendered {
    pub system: String,
    pub user: String,
}

/// One way an answer breaks its contract: which check, where, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The check that found it: `schema`, `rule: <name>` or `fact`.
    pub check: String,
    /// The JSON pointer into the answer.
    pub pointer: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("render: {0}")]
pub struct RenderError(pub String);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContract {
    id: String,
    description: String,
    side_effects: SideEffects,
    prompt: RawPrompt,
    output: RawOutput,
    sampling: Sampling,
    limits: Limits,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    golden: RawGolden,
    #[serde(default)]
    live: Live,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrompt {
    system: String,
    user: String,
    /// What a provider that takes cache breakpoints caches:
    /// `["system"]`, `["tools"]` (a tool-call contract's), or both.
    #[serde(default)]
    cache: Vec<Cached>,
}

/// A part of the prompt a contract marks cacheable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Cached {
    System,
    Tools,
}

/// What of its prompt a contract marks cacheable (`[prompt] cache`): a
/// provider that takes cache breakpoints (Anthropic's `cache_control`) is
/// sent one there, as part of the request certification sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cache {
    /// The rendered system prompt.
    pub system: bool,
    /// The tools' definitions.
    pub tools: bool,
}

impl Cache {
    /// The marking, as `[prompt] cache` writes it (`system`, `tools`).
    pub fn names(&self) -> Vec<&'static str> {
        [(self.system, "system"), (self.tools, "tools")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }
}

/// What shape a contract's answer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OutputKind {
    /// A JSON document.
    #[default]
    Json,
    /// A call of one of the contract's tools.
    ToolCall,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutput {
    name: String,
    schema: String,
    #[serde(default)]
    kind: OutputKind,
    /// The tools' file (a JSON array), for a tool-call contract.
    tools: Option<String>,
    /// `any` (the default) or a declared tool's name.
    tool_choice: Option<String>,
    /// Whether the answer may hold more than one call (by default, exactly one).
    #[serde(default)]
    parallel_calls: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGolden {
    #[serde(default)]
    redact: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCases {
    case: Vec<Case>,
}

/// A loaded, validated contract.
#[derive(Debug, Clone)]
pub struct Contract {
    pub id: String,
    pub description: String,
    pub side_effects: SideEffects,
    pub dir: PathBuf,
    /// The templates' text as read (digests and read-back use it);
    /// `render` evaluates the copies parsed at load.
    pub system_template: String,
    pub user_template: String,
    pub output_name: String,
    pub schema: Value,
    validator: Arc<jsonschema::Validator>,
    /// The two templates, parsed once at load (`system.jinja`, `user.jinja`).
    templates: Arc<minijinja::Environment<'static>>,
    pub sampling: Sampling,
    pub limits: Limits,
    pub rules: Vec<Rule>,
    pub cases: Vec<Case>,
    /// JSON pointers blanked in golden snapshots (volatile fields).
    pub golden_redact: Vec<String>,
    /// What the router's own checks compare, and when they demote.
    pub live: Live,
    /// A tool-call contract's tools; `None` for a JSON answer.
    pub tool_calls: Option<ToolCalls>,
    /// What of the prompt is marked cacheable.
    pub cache: Cache,
    /// `sha256:<hex>` over the contract's files.
    pub digest: String,
}

const SYSTEM_TEMPLATE: &str = "system.jinja";
const USER_TEMPLATE: &str = "user.jinja";

/// The prompt's templates (name, file, source), parsed: strict about
/// undefined variables, trailing newlines trimmed. A template that does not
/// parse is an error naming its file.
fn templates(
    sources: [(&'static str, &Path, &str); 2],
) -> Result<minijinja::Environment<'static>, ContractError> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(false);
    for (name, path, source) in sources {
        env.add_template_owned(name, source.to_owned())
            .map_err(|e| invalid(path, format!("the template does not parse: {e:#}")))?;
    }
    Ok(env)
}

/// Every contract under `dir` (one per subdirectory), sorted by id.
pub fn load_all(dir: &Path) -> Result<Vec<Contract>, ContractError> {
    let entries = std::fs::read_dir(dir).map_err(|source| io(dir, source))?;
    let mut contracts = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io(dir, source))?;
        if entry.path().join("contract.toml").is_file() {
            contracts.push(Contract::load(&entry.path())?);
        }
    }
    contracts.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(contracts)
}

fn io(path: &Path, source: std::io::Error) -> ContractError {
    ContractError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn invalid(path: &Path, message: impl Into<String>) -> ContractError {
    ContractError::Invalid {
        path: path.display().to_string(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<String, ContractError> {
    std::fs::read_to_string(path).map_err(|source| io(path, source))
}

impl Contract {
    pub fn load(dir: &Path) -> Result<Contract, ContractError> {
        let manifest = dir.join("contract.toml");
        let raw: RawContract = toml::from_str(&read(&manifest)?)
            .map_err(|e| invalid(&manifest, e.to_string().trim_end().to_owned()))?;
        let dir_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if raw.id != dir_name {
            return Err(invalid(
                &manifest,
                format!("`id` is `{}` but the directory is `{dir_name}`", raw.id),
            ));
        }
        let schema_path = dir.join(&raw.output.schema);
        let schema: Value = serde_json::from_str(&read(&schema_path)?)
            .map_err(|e| invalid(&schema_path, e.to_string()))?;
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&schema)
            .map_err(|e| invalid(&schema_path, format!("not a valid JSON Schema: {e}")))?;
        let sampling = &raw.sampling;
        if sampling.samples == 0 || sampling.pass_k == 0 || sampling.pass_k > sampling.samples {
            return Err(invalid(
                &manifest,
                "`sampling`: need 1 <= pass_k <= samples",
            ));
        }
        if !(0.0..=1.0).contains(&sampling.temperature) {
            return Err(invalid(
                &manifest,
                "`sampling.temperature`: a certification runs at low temperature, 0 to 1",
            ));
        }
        for (i, rule) in raw.rules.iter().enumerate() {
            rule.validate()
                .map_err(|m| invalid(&manifest, format!("`rules[{i}]` ({}): {m}", rule.name())))?;
        }
        raw.live.validate().map_err(|m| invalid(&manifest, m))?;
        let tool_calls = tool_calls(dir, &manifest, &raw.output)?;
        let mut cache = Cache::default();
        for cached in &raw.prompt.cache {
            let mark = match cached {
                Cached::System => &mut cache.system,
                Cached::Tools => &mut cache.tools,
            };
            if std::mem::replace(mark, true) {
                return Err(invalid(&manifest, "`prompt.cache` names a part twice"));
            }
        }
        if cache.tools && tool_calls.is_none() {
            return Err(invalid(
                &manifest,
                "`prompt.cache`: `tools` is a tool-call contract's (`output.kind = \"tool_call\"`)",
            ));
        }
        let cases_path = dir.join("cases.toml");
        let cases: RawCases = toml::from_str(&read(&cases_path)?)
            .map_err(|e| invalid(&cases_path, e.to_string().trim_end().to_owned()))?;
        let mut names = std::collections::BTreeSet::new();
        for case in &cases.case {
            if !names.insert(case.name.as_str()) {
                return Err(invalid(
                    &cases_path,
                    format!("two cases are named `{}`", case.name),
                ));
            }
            if !case.input.is_object() {
                return Err(invalid(
                    &cases_path,
                    format!("case `{}`: `input` must be a table", case.name),
                ));
            }
        }
        let system_path = dir.join(&raw.prompt.system);
        let user_path = dir.join(&raw.prompt.user);
        let system_template = read(&system_path)?;
        let user_template = read(&user_path)?;
        let templates = templates([
            (SYSTEM_TEMPLATE, &system_path, &system_template),
            (USER_TEMPLATE, &user_path, &user_template),
        ])?;
        let contract = Contract {
            id: raw.id,
            description: raw.description,
            side_effects: raw.side_effects,
            system_template,
            user_template,
            output_name: raw.output.name,
            schema,
            validator: Arc::new(validator),
            templates: Arc::new(templates),
            sampling: raw.sampling,
            limits: raw.limits,
            rules: raw.rules,
            cases: cases.case,
            golden_redact: raw.golden.redact,
            live: raw.live,
            tool_calls,
            cache,
            digest: digest_dir(dir)?,
            dir: dir.to_path_buf(),
        };
        // Every case must render: a template that names a missing variable is the contract's bug.
        for case in &contract.cases {
            contract
                .render(&case.input)
                .map_err(|e| invalid(&cases_path, format!("case `{}`: {e}", case.name)))?;
        }
        Ok(contract)
    }

    /// Renders the prompt for `input`. An undefined variable is an error,
    /// never an empty string.
    ///
    /// The templates were parsed when the contract was loaded; a render
    /// only evaluates them.
    pub fn render(&self, input: &Value) -> Result<Rendered, RenderError> {
        let render = |name: &str| {
            self.templates
                .get_template(name)
                .and_then(|template| template.render(input))
                .map_err(|e| RenderError(format!("{name}: {e:#}")))
        };
        Ok(Rendered {
            system: render(SYSTEM_TEMPLATE)?,
            user: render(USER_TEMPLATE)?,
        })
    }

    /// Every schema error, with its JSON pointer.
    pub fn check_schema(&self, answer: &Value) -> Vec<Violation> {
        self.validator
            .iter_errors(answer)
            .map(|e| Violation {
                check: "schema".into(),
                pointer: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect()
    }

    /// Every broken business rule, given the job's `input`.
    pub fn check_rules(&self, answer: &Value, input: &Value) -> Vec<Violation> {
        self.rules
            .iter()
            .flat_map(|rule| rule.check(answer, &self.schema, input))
            .collect()
    }

    /// A tool-call contract's answer: every call's arguments against its
    /// tool's parameters; nothing for a JSON answer.
    pub fn check_arguments(&self, answer: &Value) -> Vec<Violation> {
        self.tool_calls
            .as_ref()
            .map(|t| t.check_arguments(answer))
            .unwrap_or_default()
    }

    /// Every expected fact of `case` the answer does not state.
    pub fn check_facts(&self, case: &Case, answer: &Value) -> Vec<Violation> {
        case.expect.iter().filter_map(|e| e.check(answer)).collect()
    }

    /// Whether a hedging attempt may run for this contract.
    pub fn hedgeable(&self) -> bool {
        self.side_effects == SideEffects::None
    }
}

/// A tool-call contract's tools, from the file `[output] tools` names; a
/// JSON contract names none.
fn tool_calls(
    dir: &Path,
    manifest: &Path,
    output: &RawOutput,
) -> Result<Option<ToolCalls>, ContractError> {
    match (output.kind, &output.tools) {
        (OutputKind::Json, None) => {
            if output.tool_choice.is_some() || output.parallel_calls {
                return Err(invalid(
                    manifest,
                    "`output.tool_choice` and `output.parallel_calls` are for `kind = \"tool_call\"`",
                ));
            }
            Ok(None)
        }
        (OutputKind::Json, Some(_)) => Err(invalid(
            manifest,
            "`output.tools` is for `kind = \"tool_call\"`",
        )),
        (OutputKind::ToolCall, None) => Err(invalid(
            manifest,
            "a tool-call contract names its tools' file in `output.tools`",
        )),
        (OutputKind::ToolCall, Some(file)) => {
            let path = dir.join(file);
            let tools: Vec<Tool> = serde_json::from_str(&read(&path)?)
                .map_err(|e| invalid(&path, format!("not a list of tools: {e}")))?;
            ToolCalls::new(tools, output.tool_choice.as_deref(), output.parallel_calls)
                .map(Some)
                .map_err(|m| invalid(&path, m))
        }
    }
}

/// `sha256:<hex>` over the directory's files: each file's relative path and
/// the sha256 of its bytes, one line each, in path order.
pub fn digest_dir(dir: &Path) -> Result<String, ContractError> {
    let mut files = BTreeMap::new();
    collect_files(dir, dir, &mut files)?;
    let mut listing = String::new();
    for (path, digest) in files {
        listing.push_str(&format!("{digest}  {path}\n"));
    }
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(listing.as_bytes()))
    ))
}

fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, String>,
) -> Result<(), ContractError> {
    for entry in std::fs::read_dir(dir).map_err(|source| io(dir, source))? {
        let path = entry.map_err(|source| io(dir, source))?.path();
        if path.is_dir() {
            collect_files(root, &path, out)?;
        } else {
            let bytes = std::fs::read(&path).map_err(|source| io(&path, source))?;
            let relative = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            out.insert(relative, hex::encode(Sha256::digest(&bytes)));
        }
    }
    Ok(())
}
