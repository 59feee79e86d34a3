//! Sending one JSON request and classifying whatever comes back, shared by
//! every wire format.

use std::time::{Duration, Instant};

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::failure::{FailureKind, ProviderError, classify_status, classify_transport};
use crate::secret::Secret;

/// The most of a server's error body kept in a message.
const MAX_MESSAGE: usize = 1000;

/// The most bytes of a response read when the configuration says nothing.
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    provider: String,
    secret: Option<Secret>,
    /// The most bytes of a response body read; past it the call fails.
    max_body: usize,
}

/// Why a body was not read whole.
enum BodyError {
    Transport(reqwest::Error),
    TooLarge { limit: usize },
}

/// A 2xx answer, parsed.
pub(crate) struct JsonAnswer<T> {
    pub body: T,
    pub latency: Duration,
}

/// Whether a 2xx body is an object with an `error` that is not null: read
/// without building the body (keys compared where they lie, values
/// skipped). Anything but an object is a data error.
struct ErrorProbe(bool);

/// A key, as whether it is `error`.
struct IsError(bool);

impl<'de> Deserialize<'de> for ErrorProbe {
    fn deserialize<D: Deserializer<'de>>(body: D) -> Result<ErrorProbe, D::Error> {
        body.deserialize_map(ErrorProbe(false))
    }
}

impl<'de> Visitor<'de> for ErrorProbe {
    type Value = ErrorProbe;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<ErrorProbe, M::Error> {
        let mut error = self.0;
        while let Some(IsError(is_error)) = map.next_key()? {
            if is_error {
                error |= map.next_value::<Option<IgnoredAny>>()?.is_some();
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(ErrorProbe(error))
    }
}

impl<'de> Deserialize<'de> for IsError {
    fn deserialize<D: Deserializer<'de>>(key: D) -> Result<IsError, D::Error> {
        key.deserialize_str(IsError(false))
    }
}

impl Visitor<'_> for IsError {
    type Value = IsError;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<IsError, E> {
        Ok(IsError(key == "error"))
    }
}

/// The pooled HTTP client every call to `config`'s provider goes through:
/// its connect and request timeouts, idle connections kept 30 s.
pub fn pooled_client(config: &crate::ProviderConfig) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .timeout(config.request_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
}

impl HttpClient {
    /// The client of the provider `config`, carrying its key.
    pub(crate) fn for_provider(
        config: &crate::ProviderConfig,
        key: Option<Secret>,
    ) -> Result<HttpClient, crate::ConfigError> {
        let client = pooled_client(config).map_err(|e| {
            crate::ConfigError::at(
                format!("providers.{}", config.id),
                format!("cannot build an HTTP client: {e}"),
            )
        })?;
        Ok(HttpClient {
            client,
            provider: config.id.clone(),
            secret: key,
            max_body: config.max_response_bytes,
        })
    }

    /// `path` under the provider's `base_url`, parsed once, where its
    /// calls go.
    pub(crate) fn endpoint(
        config: &crate::ProviderConfig,
        path: &str,
    ) -> Result<Url, crate::ConfigError> {
        Url::parse(&format!("{}{path}", config.base_url)).map_err(|e| {
            crate::ConfigError::at(
                format!("providers.{}.base_url", config.id),
                format!("`{}{path}` is not a URL: {e}", config.base_url),
            )
        })
    }

    /// POSTs `body` to `url` and reads the answer as `T` (`what` says what
    /// it should be, for the failure when it is not).
    pub(crate) async fn post_json<T: DeserializeOwned>(
        &self,
        url: &Url,
        headers: HeaderMap,
        body: &Value,
        what: &str,
    ) -> Result<JsonAnswer<T>, ProviderError> {
        let request = self.client.post(url.clone()).headers(headers).json(body);
        self.send(request, what, None).await
    }

    /// As [`HttpClient::post_json`], telling `ids` the answer's top-level
    /// member `member` (the provider's id for it) as soon as the bytes up to
    /// it have arrived, before the rest of the answer.
    pub(crate) async fn post_json_telling<T: DeserializeOwned>(
        &self,
        url: &Url,
        headers: HeaderMap,
        body: &Value,
        what: &str,
        ids: (&'static str, &crate::ResponseIds),
    ) -> Result<JsonAnswer<T>, ProviderError> {
        let request = self.client.post(url.clone()).headers(headers).json(body);
        self.send(request, what, Some(ids)).await
    }

    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        url: &Url,
        headers: HeaderMap,
        what: &str,
    ) -> Result<JsonAnswer<T>, ProviderError> {
        self.send(self.client.get(url.clone()).headers(headers), what, None)
            .await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
        ids: Option<(&'static str, &crate::ResponseIds)>,
    ) -> Result<JsonAnswer<T>, ProviderError> {
        let result = self.exchange(request, what, ids).await;
        match &result {
            Ok(answer) => {
                tracing::debug!(provider = %self.provider, latency_ms = answer.latency.as_millis() as u64, "provider answered")
            }
            Err(error) => {
                tracing::warn!(provider = %self.provider, error = %error, "provider call failed")
            }
        }
        result
    }

    async fn exchange<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
        ids: Option<(&'static str, &crate::ResponseIds)>,
    ) -> Result<JsonAnswer<T>, ProviderError> {
        let started = Instant::now();
        let response = request.send().await.map_err(|e| self.transport_error(&e))?;
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        // Only a success's body names the answer.
        let ids = ids.filter(|(_, ids)| ids.listening() && classify_status(status).is_none());
        let body = read_capped(response, self.max_body, ids).await;
        let latency = started.elapsed();
        if let Some(kind) = classify_status(status) {
            let text = match &body {
                Ok(bytes) => server_message(bytes),
                Err(BodyError::Transport(e)) => {
                    format!("(the error body could not be read: {e})")
                }
                Err(BodyError::TooLarge { limit }) => {
                    format!("(the error body was longer than {limit} bytes)")
                }
            };
            return Err(ProviderError {
                provider: self.provider.clone(),
                kind,
                status: Some(status),
                // 429, 503 and Anthropic's 529 say when to ask again, in a
                // header or (Google) in the body; other statuses do not.
                retry_after: match status {
                    429 | 503 | 529 => retry_after
                        .or_else(|| body.as_ref().ok().and_then(|bytes| retry_info(bytes))),
                    _ => None,
                },
                message: self.scrub(&text),
            });
        }
        let bytes = body.map_err(|e| match e {
            // The status arrived, then the body broke off: the server answered.
            BodyError::Transport(e) => {
                let mut error = self.transport_error(&e);
                error.status = Some(status);
                error
            }
            // The provider answered, and its answer cannot be used: a bad response.
            BodyError::TooLarge { limit } => {
                let mut error = ProviderError::new(
                    &self.provider,
                    FailureKind::BadResponse,
                    format!(
                        "the response was longer than max_response_bytes ({limit} bytes); it was not read further"
                    ),
                );
                error.status = Some(status);
                error
            }
        })?;
        // Read straight into `T`, with no JSON tree between: first whether
        // the body is an error object instead (a scan that keeps nothing).
        let not_json = |e: serde_json::Error| {
            let mut error = ProviderError::new(
                &self.provider,
                FailureKind::BadResponse,
                self.scrub(&format!(
                    "the response body is not JSON ({e}): {}",
                    excerpt(&bytes)
                )),
            );
            error.status = Some(status);
            error
        };
        match serde_json::from_slice::<ErrorProbe>(&bytes) {
            Ok(ErrorProbe(true)) => {
                let body: Value = serde_json::from_slice(&bytes).map_err(not_json)?;
                if let Some(error) = self.error_in_body(&body) {
                    return Err(error);
                }
            }
            Ok(ErrorProbe(false)) => {}
            // JSON that is no object: `T` says what is wrong with it below.
            Err(e) if e.is_data() => {}
            Err(e) => return Err(not_json(e)),
        }
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| self.bad_response(format!("not {what}: {e}")))?;
        Ok(JsonAnswer { body, latency })
    }

    fn transport_error(&self, error: &reqwest::Error) -> ProviderError {
        // reqwest's messages name the URL, never headers; scrub anyway.
        let message = self.scrub(&error_chain(error));
        ProviderError::new(&self.provider, classify_transport(error), message)
    }

    pub(crate) fn scrub(&self, text: &str) -> String {
        match &self.secret {
            Some(secret) => secret.scrub(text),
            None => text.to_owned(),
        }
    }

    /// The headers every call carries: the key (marked sensitive, so no
    /// Debug output shows it) in `key_header` after `key_prefix`, and the
    /// provider-side idempotency key where the provider takes one.
    pub(crate) fn headers(
        &self,
        key_header: HeaderName,
        key_prefix: &str,
        idempotency: Option<(&str, &str)>,
    ) -> Result<HeaderMap, ProviderError> {
        let refuse = |what: &str| {
            ProviderError::not_sent(
                &self.provider,
                format!("{what} is not a valid header value"),
            )
        };
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.secret {
            let mut value = HeaderValue::from_str(&format!("{key_prefix}{}", key.expose()))
                .map_err(|_| refuse("the API key"))?;
            value.set_sensitive(true);
            headers.insert(key_header, value);
        }
        if let Some((name, key)) = idempotency {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| refuse("the idempotency header's name"))?;
            headers.insert(
                name,
                HeaderValue::from_str(key).map_err(|_| refuse("the idempotency key"))?,
            );
        }
        Ok(headers)
    }

    /// A 2xx whose body is an error object (`{"error": {...}}`) instead of
    /// an answer: the server said it failed, in its own words.
    pub(crate) fn error_in_body(&self, body: &Value) -> Option<ProviderError> {
        body.get("error").filter(|e| !e.is_null())?;
        let text = server_message(body.to_string().as_bytes());
        let mut error = ProviderError::new(
            &self.provider,
            FailureKind::ServerError,
            self.scrub(&format!("HTTP 200 carrying an error: {text}")),
        );
        error.status = Some(200);
        Some(error)
    }

    /// An answer's finish reason read against its kind's table
    /// ([`crate::kinds::KindSpec::finish`]), the failure scrubbed of the key.
    pub(crate) fn finish(
        &self,
        kind: &crate::kinds::KindSpec,
        reason: Option<&str>,
        words: Option<&str>,
    ) -> Result<crate::Finish, ProviderError> {
        kind.finish(&self.provider, reason, words).map_err(|mut e| {
            e.message = self.scrub(&e.message);
            e
        })
    }

    /// A definite failure for a 2xx answer that does not fit the request.
    pub(crate) fn bad_response(&self, message: impl Into<String>) -> ProviderError {
        ProviderError::new(
            &self.provider,
            FailureKind::BadResponse,
            self.scrub(&message.into()),
        )
    }
}

/// A response's body, read chunk by chunk and given up on past `limit`
/// bytes (a declared Content-Length past it is refused before reading), so
/// no answer can make the router hold more than `limit` of it.
///
/// With `ids`, the body's top-level member named there is told as soon as
/// the bytes up to its end have arrived (looked for in the first
/// [`ID_SCAN_LIMIT`] bytes only: the kinds that name their answer do so
/// first).
async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
    mut ids: Option<(&'static str, &crate::ResponseIds)>,
) -> Result<bytes::Bytes, BodyError> {
    if response
        .content_length()
        .is_some_and(|declared| declared > limit as u64)
    {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
        if let Some((member, sink)) = ids {
            if let Some(id) = leading_member(&body, member) {
                sink.tell(&id);
                ids = None;
            } else if body.len() > ID_SCAN_LIMIT {
                ids = None;
            }
        }
    }
    Ok(body.freeze())
}

/// How far into an answer its id is looked for as it arrives.
const ID_SCAN_LIMIT: usize = 64 * 1024;

/// The string value of `member`, a top-level member of the JSON object
/// that `bytes` begins (and may be cut short of ending): found once the
/// bytes up to the value's end are there, and only if every member before
/// it parses.
pub(crate) fn leading_member(bytes: &[u8], member: &str) -> Option<String> {
    use serde::Deserializer as _;
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    struct Seek<'a> {
        member: &'a str,
        found: &'a mut Option<String>,
    }
    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.member {
                    *self.found = map.next_value::<String>().ok();
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut found = None;
    // A body cut short ends in an error after the member was read: the
    // error says nothing the caller needs.
    let _ = serde_json::Deserializer::from_slice(bytes).deserialize_map(Seek {
        member,
        found: &mut found,
    });
    found.filter(|id| !id.is_empty())
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// OpenAI's `retry-after-ms`, else `Retry-After` in seconds or as an HTTP
/// date (RFC 9110; a date in the past means now).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// Google's `google.rpc.RetryInfo` in an error body:
/// `{"error": {"details": [{"@type": ".../google.rpc.RetryInfo", "retryDelay": "1.5s"}]}}`.
fn retry_info(bytes: &[u8]) -> Option<Duration> {
    let body: Value = serde_json::from_slice(bytes).ok()?;
    body.pointer("/error/details")?
        .as_array()?
        .iter()
        .filter(|d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|d| {
            d.get("retryDelay")?
                .as_str()?
                .strip_suffix('s')?
                .parse::<f64>()
                .ok()
        })
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
}

/// The server's own words: `error.message` (OpenAI, Anthropic), `detail`
/// (FastAPI), or the body itself.
fn server_message(bytes: &[u8]) -> String {
    let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
        return excerpt(bytes);
    };
    let message = body
        .pointer("/error/message")
        .or_else(|| body.pointer("/message"))
        .or_else(|| body.pointer("/detail"))
        .map(|m| {
            m.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| m.to_string())
        });
    // OpenAI and Anthropic name the error's `type`; Google its `status`.
    let kind = body
        .pointer("/error/type")
        .or_else(|| body.pointer("/error/status"))
        .and_then(Value::as_str);
    match (kind, message) {
        (Some(kind), Some(message)) => truncate(&format!("{kind}: {message}")),
        (None, Some(message)) => truncate(&message),
        _ => excerpt(bytes),
    }
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.trim().is_empty() {
        "(empty body)".to_owned()
    } else {
        truncate(&text)
    }
}

fn truncate(text: &str) -> String {
    match text.char_indices().nth(MAX_MESSAGE) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(body: &str) -> Result<bool, serde_json::error::Category> {
        serde_json::from_str::<ErrorProbe>(body)
            .map(|ErrorProbe(error)| error)
            .map_err(|e| e.classify())
    }

    /// The probe finds what `error_in_body` reads in a tree: a top-level
    /// `error` that is not null, however its key is spelled.
    #[test]
    fn the_probe_finds_a_top_level_error_and_nothing_else() {
        use serde_json::error::Category;
        assert_eq!(probe(r#"{"id": 1, "error": {"message": "x"}}"#), Ok(true));
        assert_eq!(probe(r#"{"\u0065rror": "overloaded"}"#), Ok(true));
        assert_eq!(probe(r#"{"error": null, "id": 1}"#), Ok(false));
        assert_eq!(
            probe(r#"{"choices": [{"error": 1}], "x": {"error": 2}}"#),
            Ok(false)
        );
        assert_eq!(probe("[1, 2]"), Err(Category::Data));
        assert_eq!(probe(r#""error""#), Err(Category::Data));
        assert_eq!(probe(r#"{"error": "#), Err(Category::Eof));
        assert_eq!(probe("{oops}"), Err(Category::Syntax));
    }
}
