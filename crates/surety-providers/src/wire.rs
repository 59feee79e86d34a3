//! The skeleton every wire format's chat call shares, written once: check
//! the request against the provider's capabilities, build the body, POST it
//! with the kind's headers, take an error sent in a 200 body for what it is,
//! parse the answer as the wire format's type, and hand it to the format to
//! read. A kind says only what differs ([`Wire`]).

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::ProviderConfig;
use crate::http::HttpClient;
use crate::{CallContext, ChatRequest, ChatResponse, Finish, ProviderError};

/// One wire format: how its requests are written and its answers read.
pub(crate) trait Wire: Sync {
    /// The answer's body as the format has it.
    type Answer: DeserializeOwned;
    /// What the answer is, in words, for an answer that does not parse.
    const ANSWER: &'static str;
    /// The answer's top-level member that holds the provider's id for it.
    const ID_MEMBER: &'static str = "id";

    /// The provider's configuration and its HTTP client.
    fn parts(&self) -> (&ProviderConfig, &HttpClient);
    /// Where a chat call goes (parsed once, when the adapter was made).
    fn url(&self) -> &reqwest::Url;
    fn headers(
        &self,
        request: &ChatRequest,
        call: &CallContext,
    ) -> Result<HeaderMap, ProviderError>;
    fn request_body(&self, request: &ChatRequest) -> Result<Value, ProviderError>;
    /// What this call's body carries beyond the request's own (OpenAI's
    /// stored completions: `store` and the attempt's metadata); nothing by
    /// default.
    fn stamp(&self, _body: &mut Value, _call: &CallContext) {}
    /// The answer to `request`, read; `latency` is the call's.
    fn read(
        &self,
        request: &ChatRequest,
        answer: Self::Answer,
        latency: Duration,
    ) -> Result<ChatResponse, ProviderError>;
}

/// One chat call in `wire`'s format.
pub(crate) async fn chat<W: Wire>(
    wire: &W,
    request: &ChatRequest,
    call: &CallContext,
) -> Result<ChatResponse, ProviderError> {
    let (config, http) = wire.parts();
    config.capabilities.check(&config.id, request)?;
    let mut body = wire.request_body(request)?;
    wire.stamp(&mut body, call);
    let answer = http
        .post_json_telling::<W::Answer>(
            wire.url(),
            wire.headers(request, call)?,
            &body,
            W::ANSWER,
            (W::ID_MEMBER, &call.ids),
        )
        .await?;
    wire.read(request, answer.body, answer.latency)
}

impl HttpClient {
    /// A JSON answer's text as JSON: refused when the answer was cut at the
    /// token limit (`limit`, as the format names it) before the JSON
    /// closed, or when it is not JSON.
    pub(crate) fn json_answer(
        &self,
        text: &str,
        finish: Finish,
        limit: &str,
        max_tokens: u32,
    ) -> Result<Value, ProviderError> {
        if finish == Finish::Truncated {
            return Err(self.bad_response(format!(
                "the answer was cut at {limit} ({max_tokens}) before the JSON closed: {text}"
            )));
        }
        serde_json::from_str(text)
            .map_err(|e| self.bad_response(format!("the answer is not JSON ({e}): {text}")))
    }

    /// A tool-call request's answer: the calls `made` (beside the model's
    /// `text`) as the canonical answer; refused when the answer was cut at
    /// the token limit, or when the calls are not what was asked.
    pub(crate) fn tool_answer(
        &self,
        asked: &crate::ToolRequest,
        made: Vec<crate::tools::Made>,
        text: &str,
        finish: Finish,
        max_tokens: u32,
    ) -> Result<Value, ProviderError> {
        if finish == Finish::Truncated {
            return Err(self.bad_response(format!(
                "the answer was cut at the token limit ({max_tokens}) before its tool call was whole"
            )));
        }
        crate::tools::canonical(asked, made, text).map_err(|why| self.bad_response(why))
    }
}

/// The [`Provider`](crate::Provider) methods of an adapter that speaks a
/// [`Wire`] format: its configuration, and a chat call through [`chat`].
macro_rules! provider_methods {
    () => {
        fn config(&self) -> &crate::config::ProviderConfig {
            crate::wire::Wire::parts(self).0
        }

        fn chat<'a>(
            &'a self,
            request: &'a crate::ChatRequest,
            call: &'a crate::CallContext,
        ) -> crate::BoxFuture<'a, Result<crate::ChatResponse, crate::ProviderError>> {
            Box::pin(crate::wire::chat(self, request, call))
        }
    };
}
pub(crate) use provider_methods;
