//! The router's routes, gathered with the OpenAPI document derived from
//! their handlers, and laid behind the edge.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderName;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use super::edge::{
    REQUEST_ID, anthropic_request_id, body_deadline, bounded_request_id, header_limit, request_span,
};
use super::error::{ApiError, Problem};
use super::views::{OpenAiErrorView, ProblemView};
use crate::state::AppState;

/// The document `/openapi.json` serves: every path comes from a handler's
/// `#[utoipa::path]`, registered with the route itself (`routes!`), so no
/// route exists undocumented.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "surety", description = "One job per intent behind idempotency keys; failover only to certified providers."),
    modifiers(&BearerAuth),
    security(("api_key" = [])),
    components(schemas(ProblemView, OpenAiErrorView))
)]
struct ApiDoc;

/// The `api_key` bearer scheme every authenticated path names.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The router, and the OpenAPI document derived from its handlers.
pub fn routes() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(super::jobs::create_job))
        .routes(routes!(super::jobs::get_job))
        .routes(routes!(super::jobs::get_attempts))
        .routes(routes!(super::jobs::retry))
        .routes(routes!(super::jobs::cancel))
        .routes(routes!(super::facade::chat_completions))
        .routes(routes!(super::facade::responses_api::create_response))
        .routes(routes!(
            super::facade::responses_api::stored::retrieve_response,
            super::facade::responses_api::stored::delete_response
        ))
        .routes(routes!(
            super::facade::responses_api::stored::cancel_response
        ))
        .routes(routes!(super::facade::responses_api::stored::input_items))
        .routes(routes!(super::facade::messages_api::create_message))
        .routes(routes!(super::facade::messages_api::count_tokens))
        .routes(routes!(super::facade::models))
        .routes(routes!(super::ops::providers))
        .routes(routes!(super::ops::budget))
        .routes(routes!(super::ops::reinstate))
        .routes(routes!(super::ops::healthz))
        .routes(routes!(super::ops::readyz))
        .routes(routes!(super::ops::metrics))
        .routes(routes!(super::ops::openapi))
        .split_for_parts()
}

/// The whole HTTP surface: the API's routes and `others` (the operator's
/// pages), behind the edge's limits, with the fallbacks in problem details.
pub fn app(state: AppState, others: Router<AppState>) -> Router {
    let limit = state.inner.settings.max_body_bytes;
    let (router, doc) = routes();
    let router = router
        .merge(others)
        .fallback(|| async { ApiError::new(Problem::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                Problem::MethodNotAllowed,
                "this endpoint does not take that method; /openapi.json lists what it takes",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        // A body must arrive whole within the read timeout, whatever the
        // pace of its bytes (`listen.rs` bounds the headers the same way).
        .layer(axum::middleware::from_fn_with_state(
            state.inner.settings.listening.request_read_timeout,
            body_deadline,
        ))
        .layer(axum::Extension(Arc::new(super::document::for_routes(
            doc, &state,
        ))))
        .with_state(state);
    // `x-request-id`: taken from the request or made (a UUID), recorded on
    // a span around everything the request does, so every log line of it
    // carries `request_id`, and returned on the response. (The last layer
    // added runs first.)
    let id = HeaderName::from_static(REQUEST_ID);
    router
        .layer(axum::middleware::from_fn(header_limit))
        .layer(PropagateRequestIdLayer::new(id.clone()))
        // Outside the propagation, so the answer's id is there to copy.
        .layer(axum::middleware::map_response(anthropic_request_id))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(id, MakeRequestUuid))
        .layer(axum::middleware::from_fn(bounded_request_id))
}

#[cfg(test)]
mod tests {

    /// Tidy: every API route is registered through `routes!` with its
    /// `#[utoipa::path]`, so none can be served undocumented. The operator's
    /// HTML pages (`ui/mod.rs`, under `/ui`) are not API, and only they may.
    #[test]
    fn no_route_is_registered_outside_the_openapi_router() {
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => dirs.push(path),
                    false if path.ends_with("ui/mod.rs") => {}
                    false => files.push(path),
                }
            }
        }
        assert!(files.len() > 5, "{files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            // Spelled in pieces, so this test does not find itself.
            let found = [
                concat!(".rou", "te(\""),
                concat!(".ne", "st(\""),
                concat!(".rou", "te_service("),
            ]
            .iter()
            .find(|pattern| text.contains(*pattern));
            assert!(
                found.is_none(),
                "{} registers a route with `{}`; use `.routes(routes!(handler))`",
                path.display(),
                found.unwrap_or(&"")
            );
        }
    }
}
