//! A provider's tokenizer, as its configuration names it: a tiktoken
//! encoding for OpenAI-family models, the server's own tokenize endpoint
//! where it has one, or none — said as such, never guessed. Certification
//! checks prompts with it and the router counts tokens with it, so a count
//! a client is told is the count a certificate was judged by.

use std::sync::Arc;

use crate::{Provider, ProviderConfig, TokenizerConfig};

/// Tokens a chat template adds per message (its role and delimiters),
/// counted against a prompt's budget on top of the message's own tokens.
pub const TOKENS_PER_MESSAGE: u64 = 4;

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
    /// The tokenizer `config` names, reaching a server's endpoint through
    /// `provider`; an encoding it does not know is an error.
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

    /// `text`'s tokens, or `None` with no tokenizer.
    pub async fn encode(&self, text: &str) -> Result<Option<Vec<u32>>, String> {
        match self {
            Tokenizer::Tiktoken { bpe, .. } => Ok(Some(bpe.encode_ordinary(text))),
            Tokenizer::Server(p) => p.tokenize(text).await.map(Some).map_err(|e| e.to_string()),
            Tokenizer::Unverified => Ok(None),
        }
    }

    pub async fn decode(&self, tokens: &[u32]) -> Result<String, String> {
        match self {
            Tokenizer::Tiktoken { bpe, .. } => bpe.decode(tokens).map_err(|e| e.to_string()),
            Tokenizer::Server(p) => p.detokenize(tokens).await.map_err(|e| e.to_string()),
            Tokenizer::Unverified => Err("no tokenizer".into()),
        }
    }

    /// Tokens the tokenizer adds to any text (a server's BOS), to set aside.
    pub async fn prefix(&self) -> Result<Vec<u32>, String> {
        Ok(self.encode("").await?.unwrap_or_default())
    }

    /// `text`'s own tokens: less `prefix`, what the tokenizer adds to any
    /// text (see [`Tokenizer::prefix`]). `None` with no tokenizer.
    pub async fn own_tokens(&self, text: &str, prefix: &[u32]) -> Result<Option<Vec<u32>>, String> {
        Ok(self
            .encode(text)
            .await?
            .map(|tokens| match tokens.strip_prefix(prefix) {
                Some(own) => own.to_vec(),
                None => tokens,
            }))
    }

    /// The tokens of a prompt of `messages` (each message's text), as a
    /// certificate counts them: each message's own tokens and
    /// [`TOKENS_PER_MESSAGE`] for its framing. `None` with no tokenizer.
    pub async fn count(&self, messages: &[&str]) -> Result<Option<u64>, String> {
        if matches!(self, Tokenizer::Unverified) {
            return Ok(None);
        }
        let prefix = self.prefix().await?;
        let mut count = 0u64;
        for text in messages {
            let own = self.own_tokens(text, &prefix).await?.unwrap_or_default();
            count += own.len() as u64 + TOKENS_PER_MESSAGE;
        }
        Ok(Some(count))
    }
}
