//! The middleware in front of every path: the configured headers on every response, and basic
//! authentication when users are configured.

use crate::auth::{CHALLENGE, MAX_QUEUED, QUEUED_PER_CLIENT, Verdict};
use crate::client::ClientAddr;
use crate::config::WebState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// The middleware in front of every path: the configured headers on every response, and a
/// `401` with `WWW-Authenticate` for a request without valid credentials when users are
/// configured (a `503` with `Retry-After` when its client's checks are queued full).
pub async fn middleware(
    State(web): State<Arc<WebState>>,
    request: Request,
    next: Next,
) -> Response {
    let config = web.current();
    let mut response = match &config.users {
        None => next.run(request).await,
        Some(users) => {
            let authorization = request.headers().get(header::AUTHORIZATION).cloned();
            let client = request
                .extensions()
                .get::<ClientAddr>()
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0);
            let auth = web.auth();
            match auth.check(users, client, authorization.as_ref()).await {
                Verdict::Pass => next.run(request).await,
                Verdict::Fail => {
                    if let Some(suppressed) = auth.failures.check() {
                        tracing::info!(
                            path = %request.uri().path(),
                            credentials = authorization.is_some(),
                            suppressed,
                            "HTTP request refused: basic authentication failed"
                        );
                    }
                    let mut response = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
                    response
                }
                Verdict::Busy => {
                    if let Some(suppressed) = auth.busy.check() {
                        tracing::warn!(
                            client = %client,
                            queued_per_client = QUEUED_PER_CLIENT,
                            max_queued = MAX_QUEUED,
                            suppressed,
                            "HTTP request refused: too many basic-auth checks waiting"
                        );
                    }
                    let body = "Too many credentials waiting to be checked, try again later.\n";
                    let mut response = (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    response
                }
            }
        }
    };
    for (name, value) in &config.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}
