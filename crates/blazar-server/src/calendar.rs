//! `/calendar` (additive): the reservation calendar, a page and its scripts compiled into the
//! binary, so a site serves it with nothing installed beside the server and a browser on an
//! offline network loads it. The page calls the v1 API itself, with the caller's own token,
//! so it is held to the same policy as any client. Keystone sign-in (`POST
//! /calendar/api/sign-in`) is the one call the page cannot make itself: Keystone may not be
//! reachable from the browser, and it does not answer cross-origin requests.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::error::framework_error;
use crate::extract::JsonObject;
use crate::state::AppState;

/// One asset: its path under `/calendar/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// An asset under `crates/blazar-server/calendar/`, compiled in.
macro_rules! asset {
    ($path:literal, $content_type:expr) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_str!(concat!("../calendar/", $path)),
        }
    };
}

const SCRIPT: &str = "text/javascript; charset=utf-8";

const ASSETS: &[Asset] = &[
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", SCRIPT),
    asset!("api.js", SCRIPT),
    asset!("gantt.js", SCRIPT),
    asset!("time.js", SCRIPT),
    asset!("panels.js", SCRIPT),
    asset!("icon.svg", "image/svg+xml"),
];

const INDEX: &str = include_str!("../calendar/index.html");

/// Scripts and style sheets only from the server itself, never inline, so injected markup
/// cannot run; the page may call this origin only, and no other site may frame it. Style
/// attributes are allowed: the chart positions thousands of bars with them, and an
/// attribute cannot run code.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; style-src-elem 'self'; style-src-attr 'unsafe-inline'; img-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> Router<AppState> {
    let mut router = Router::new()
        .route("/calendar", get(index))
        .route(
            "/calendar/",
            get(|| async { Redirect::permanent("/calendar") }),
        )
        .route("/calendar/api/sign-in", post(sign_in));
    for asset in ASSETS {
        router = router.route(
            &format!("/calendar/{}", asset.path),
            get(move |request: HeaderMap| async move {
                page_response(&request, asset.content_type, asset.body.to_string())
            }),
        );
    }
    router
}

/// A calendar response with the security headers every one of them carries. Assets are
/// revalidated on each load, so an upgraded server never runs with yesterday's scripts;
/// their entity tags make that a 304 when nothing changed.
fn page_response(request: &HeaderMap, content_type: &'static str, body: String) -> Response {
    crate::reply::revalidated(request, body, |headers| {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        security_headers(headers);
    })
}

/// The headers every calendar answer carries, a 304 included.
fn security_headers(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

/// The page, told the authentication mode so it knows whether to ask for a sign-in.
async fn index(State(state): State<AppState>, request: HeaderMap) -> Response {
    let body = INDEX.replace("{{auth_mode}}", state.auth.mode());
    page_response(&request, "text/html; charset=utf-8", body)
}

#[derive(Deserialize)]
struct SignIn {
    username: String,
    password: String,
    project: String,
    #[serde(default)]
    domain: Option<String>,
}

/// `POST /calendar/api/sign-in` (keystone mode): Keystone's password authentication scoped
/// to a project, on the user's behalf. The answer carries the token in its body only; the
/// page keeps it in the tab's session storage.
async fn sign_in(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    // The mode first: without Keystone, nobody's body is worth parsing.
    let crate::auth::Auth::Keystone(keystone) = state.auth.as_ref() else {
        return framework_error(
            StatusCode::NOT_FOUND,
            "Sign-in exchanges credentials with Keystone; this server does not use Keystone",
        );
    };
    let body =
        match <JsonObject as axum::extract::FromRequest<AppState>>::from_request(request, &state)
            .await
        {
            Ok(JsonObject(body)) => body,
            Err(e) => return axum::response::IntoResponse::into_response(e),
        };
    let request: SignIn = match serde_json::from_value(serde_json::Value::Object(body)) {
        Ok(r) => r,
        Err(e) => {
            return framework_error(
                StatusCode::BAD_REQUEST,
                &format!("Malformed sign-in request: {e}"),
            );
        }
    };
    let domain = request
        .domain
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| "Default".to_string());
    match keystone
        .password_token(
            &request.username,
            &request.password,
            &request.project,
            &domain,
        )
        .await
    {
        Ok(Some(token)) => {
            let mut response = axum::Json(serde_json::json!({
                "token": token.token,
                "expires_at": token.expires_at,
                "user": {"name": request.username, "domain": domain},
                "project": {"id": token.project_id, "name": request.project},
                "roles": token.roles,
            }))
            .into_response();
            // The token is a credential: no cache along the way may keep it.
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Ok(None) => framework_error(
            StatusCode::UNAUTHORIZED,
            "Keystone refused these credentials for this project",
        ),
        Err(e) => {
            tracing::warn!(error = %e, "calendar sign-in: Keystone unavailable");
            framework_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Keystone could not be reached; try again later",
            )
        }
    }
}
