//! [`UiError`]: a page that could not be made, shown as its status and the
//! reason in the page's frame; [`Page`], what a page handler answers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::html::{html, page};

/// A page that could not be made: the status and the reason, in the frame.
pub struct UiError(pub StatusCode, pub String);

/// What a page's handler answers: the page (or a redirect), or why not.
pub type Page = Result<Response, UiError>;

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let body = page("Error", html!("<h1>{}</h1><p class=\"error\">{}</p>", self.0.to_string(), self.1));
        (self.0, body).into_response()
    }
}

impl From<composer_store::Error> for UiError {
    fn from(e: composer_store::Error) -> UiError {
        tracing::warn!(error = %e, "ui: database error");
        UiError(StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable; retry shortly".into())
    }
}

impl From<crate::http::error::ApiError> for UiError {
    fn from(e: crate::http::error::ApiError) -> UiError {
        let (status, _) = e.status_and_code();
        if status.is_server_error() {
            tracing::warn!(error = %e, "ui: request failed");
        }
        UiError(status, e.to_string())
    }
}

impl From<crate::engine::EngineError> for UiError {
    fn from(e: crate::engine::EngineError) -> UiError {
        UiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

/// 404: `what` is not there.
pub fn not_found(what: &str) -> UiError {
    UiError(StatusCode::NOT_FOUND, format!("{what} not found"))
}

/// 400: what is wrong with the request.
pub fn bad(message: impl Into<String>) -> UiError {
    UiError(StatusCode::BAD_REQUEST, message.into())
}

/// 403: a form posted from another site's page.
pub fn other_site() -> UiError {
    UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into())
}
