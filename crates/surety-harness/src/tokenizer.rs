//! The tokenizer check: the provider's own tokenizer (tiktoken encodings
//! for OpenAI-family models, the server's tokenize endpoint where it has
//! one), or `unverified`, said as such and never passed in silence.

use surety_contracts::{Contract, Rendered};
pub use surety_providers::Tokenizer;
use surety_providers::tokenizer::TOKENS_PER_MESSAGE;

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

/// Checks a rendered prompt with a provider's tokenizer.
pub trait TokenCheck {
    /// Checks a rendered prompt: exact round trip, within budget, no
    /// unrendered variables, no special-token text in the case's input.
    /// Returns the check and the prompt's token count, when known.
    fn check(
        &self,
        contract: &Contract,
        context_window: u32,
        input: &serde_json::Value,
        rendered: &Rendered,
    ) -> impl std::future::Future<Output = (Check, Option<u64>)> + Send;
}

impl TokenCheck for Tokenizer {
    async fn check(
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
        let prefix = match self.prefix().await {
            Ok(prefix) => prefix,
            Err(e) => return fail(format!("the tokenizer failed: {e}")),
        };
        for part in [&rendered.system, &rendered.user] {
            let body = match self.own_tokens(part, &prefix).await {
                Ok(Some(tokens)) => tokens,
                Ok(None) => {
                    return (
                        Check::new("tokenizer", CheckStatus::Unverified, "no tokenizer is known for this provider: budget and round trip unverified".into()),
                        None,
                    );
                }
                Err(e) => return fail(format!("the tokenizer failed: {e}")),
            };
            match self.decode(&body).await {
                Ok(back) if back == *part => {}
                Ok(back) => {
                    return fail(format!(
                        "the round trip is not exact: {part:?} came back as {back:?}"
                    ));
                }
                Err(e) => return fail(format!("the tokenizer could not decode: {e}")),
            }
            // Chat formatting adds a few tokens per message; counted against the budget.
            count += body.len() as u64 + TOKENS_PER_MESSAGE;
        }
        let prompt = count;
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
