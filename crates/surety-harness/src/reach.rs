//! Whether a run reached its provider at all: every call of a run (its
//! samples' and its tokenizer's) goes through [`Reaching`], which counts
//! the calls and those the provider answered. A run in which none was
//! answered could not be made: its connection resets and refusals are not
//! the model's answers, and are not graded as if they were.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use surety_providers::{
    BoxFuture, CallContext, ChatRequest, ChatResponse, Provider, ProviderConfig, ProviderError,
};

/// The calls of one run, and how many the provider answered.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    calls: AtomicU64,
    answered: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl Reach {
    fn record<T>(&self, result: &Result<T, ProviderError>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(_) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.answered() => {
                self.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let mut first = self
                    .first_failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// `(calls, the first failure)` when calls were made and none was answered.
    pub(crate) fn unanswered(&self) -> Option<(u64, String)> {
        let calls = self.calls.load(Ordering::Relaxed);
        if calls == 0 || self.answered.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let first = self
            .first_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_default();
        Some((calls, first))
    }
}

/// A provider whose every call is recorded in a [`Reach`].
#[derive(Debug)]
pub(crate) struct Reaching {
    inner: Arc<dyn Provider>,
    reach: Arc<Reach>,
}

impl Reaching {
    pub(crate) fn wrap(inner: Arc<dyn Provider>, reach: Arc<Reach>) -> Arc<dyn Provider> {
        Arc::new(Reaching { inner, reach })
    }
}

impl Provider for Reaching {
    fn config(&self) -> &ProviderConfig {
        self.inner.config()
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.chat(request, call).await;
            self.reach.record(&result);
            result
        })
    }

    fn served_models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.served_models().await;
            self.reach.record(&result);
            result
        })
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Vec<u32>, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.tokenize(text).await;
            self.reach.record(&result);
            result
        })
    }

    fn detokenize<'a>(&'a self, tokens: &'a [u32]) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.detokenize(tokens).await;
            self.reach.record(&result);
            result
        })
    }
}
