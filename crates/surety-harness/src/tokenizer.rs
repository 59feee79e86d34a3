//! The tokenizer check: the provider's own tokenizer (tiktoken encodings
//! for OpenAI-family models, the server's tokenize endpoint where it has
//! one), or `unverified`, said as such and never passed in silence.

use std::sync::Arc;

use surety_contracts::{Contract, Rendered};
use surety_providers::{Provider, ProviderConfig, TokenizerConfig};

use crate::{Check, CheckStatus};

/// Text that a tokenizer may read as a control token, across model families.
const SPECIAL_TOKEN_TEXT: [&str; 16] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|fim_prefix|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",
];

pub enum Tokenizer {
    Tiktoken {
        name: String,
        bpe: Box<tiktoken_rs::CoreBPE>,
    },
    Server(Arc<dyn Provider>),
    Unverified,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Tokenizer {
    pub fn for_provider(
        config: &ProviderConfig,
        provider: Arc<dyn Provider>,
    ) -> Result<Tokenizer, String> {
        match &config.tokenizer {
            TokenizerConfig::Tiktoken(name) => {
                let bpe = match name.as_str() {
                    "o200k_base" => tiktoken_rs::o200k_base(),
                    "cl100k_base" => tiktoken_rs::cl100k_base(),
                    "p50k_base" => tiktoken_rs::p50k_base(),
                    "r50k_base" => tiktoken_rs::r50k_base(),
                    other => return Err(format!("unknown tiktoken encoding `{other}`")),
                }
                .map_err(|e| format!("loading {name}: {e}"))?;
                Ok(Tokenizer::Tiktoken {
                    name: name.clone(),
                    bpe: Box::new(bpe),
                })
            }
            TokenizerConfig::Server => Ok(Tokenizer::Server(provider)),
            TokenizerConfig::None => Ok(Tokenizer::Unverified),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Tokenizer::Tiktoken { name, .. } => format!("tiktoken:{name}"),
            Tokenizer::Server(p) => format!("server:{}", p.id()),
            Tokenizer::Unverified => "unverified".to_owned(),
        }
    }

    async fn encode(&self, text: &str) -> Result<Option<Vec<u32>>, String> {
        match self {
            Tokenizer::Tiktoken { bpe, .. } => Ok(Some(bpe.encode_ordinary(text))),
            Tokenizer::Server(p) => p.tokenize(text).await.map(Some).map_err(|e| e.to_string()),
            Tokenizer::Unverified => Ok(None),
        }
    }

    async fn decode(&self, tokens: &[u32]) -> Result<String, String> {
        match self {
            Tokenizer::Tiktoken { bpe, .. } => bpe.decode(tokens).map_err(|e| e.to_string()),
            Tokenizer::Server(p) => p.detokenize(tokens).await.map_err(|e| e.to_string()),
            Tokenizer::Unverified => Err("no tokenizer".into()),
        }
    }

    /// Tokens the tokenizer adds to any text (a server's BOS), to set aside.
    async fn prefix(&self) -> Result<Vec<u32>, String> {
        Ok(self.encode("").await?.unwrap_or_default())
    }

    /// Checks a rendered prompt: exact round trip, within budget, no
    /// unrendered variables, no special-token text in the case's input.
    /// Returns the check and the prompt's token count, when known.
    pub async fn check(
        &self,
        contract: &Contract,
        context_window: u32,
        input: &serde_json::Value,
        rendered: &Rendered,
    ) -> (Check, Option<u64>) {
        let fail = |message: String| (Check::new("tokenizer", CheckStatus::Fail, message), None);
        let text = format!("{}\n{}", rendered.system, rendered.user);
        if let Some(left) = ["{{", "}}", "{%", "%}"].iter().find(|m| text.contains(**m)) {
            return fail(format!(
                "the rendered prompt still holds template syntax `{left}`"
            ));
        }
        let mut strings = Vec::new();
        collect_strings(input, &mut strings);
        for s in &strings {
            if let Some(special) = SPECIAL_TOKEN_TEXT.iter().find(|t| s.contains(**t)) {
                return fail(format!("the input holds special-token text `{special}`"));
            }
        }
        let mut count = 0u64;
        for part in [&rendered.system, &rendered.user] {
            let tokens = match self.encode(part).await {
                Ok(Some(tokens)) => tokens,
                Ok(None) => {
                    return (
                        Check::new("tokenizer", CheckStatus::Unverified, "no tokenizer is known for this provider: budget and round trip unverified".into()),
                        None,
                    );
                }
                Err(e) => return fail(format!("the tokenizer failed: {e}")),
            };
            let prefix = match self.prefix().await {
                Ok(prefix) => prefix,
                Err(e) => return fail(format!("the tokenizer failed: {e}")),
            };
            let body = tokens.strip_prefix(prefix.as_slice()).unwrap_or(&tokens);
            match self.decode(body).await {
                Ok(back) if back == *part => {}
                Ok(back) => {
                    return fail(format!(
                        "the round trip is not exact: {part:?} came back as {back:?}"
                    ));
                }
                Err(e) => return fail(format!("the tokenizer could not decode: {e}")),
            }
            count += body.len() as u64;
        }
        // Chat formatting adds a few tokens per message; count them against the budget.
        let prompt = count + 8;
        let max_prompt = u64::from(contract.limits.max_prompt_tokens);
        if prompt > max_prompt {
            return (
                Check::new(
                    "tokenizer",
                    CheckStatus::Fail,
                    format!("the prompt is {prompt} tokens; the contract allows {max_prompt}"),
                ),
                Some(prompt),
            );
        }
        let need = prompt + u64::from(contract.limits.max_output_tokens);
        if need > u64::from(context_window) {
            return (
                Check::new(
                    "tokenizer",
                    CheckStatus::Fail,
                    format!(
                        "the prompt ({prompt} tokens) and the output allowance ({}) overflow the context window ({context_window})",
                        contract.limits.max_output_tokens
                    ),
                ),
                Some(prompt),
            );
        }
        (
            Check::new(
                "tokenizer",
                CheckStatus::Pass,
                format!("{prompt} tokens ({})", self.describe()),
            ),
            Some(prompt),
        )
    }
}

fn collect_strings<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match value {
        serde_json::Value::String(s) => out.push(s),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}
