//! The middleware in front of every path: the configured headers on every response, and basic
//! authentication when users are configured.

use crate::auth::{CHALLENGE, MAX_QUEUED, QUEUED_PER_CLIENT, Verdict};
use crate::client::ClientAddr;
use crate::config::WebState;
use crate::refused::Refused;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// The middleware in front of every path: the configured headers on every response, and a
/// `401` with `WWW-Authenticate` for a request without valid credentials when users are
/// configured (a `503` with `Retry-After` when its client's checks are queued full, a `400`
/// before any check when it has more than one `Authorization` header: which one counts would
/// be a guess, and a proxy in front may guess otherwise).
pub async fn middleware(
    State(web): State<Arc<WebState>>,
    request: Request,
    next: Next,
) -> Response {
    let config = web.current();
    let client =
        request.extensions().get::<ClientAddr>().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0);
    let refused = |reason: Refused, detail: &dyn std::fmt::Display| {
        web.refusals().refuse(reason, client, detail);
    };
    let mut response = match &config.users {
        // `rate_limit` before anything else, over all clients, as exporter-toolkit does.
        _ if !web.allow_request(&config) => {
            refused(Refused::RateLimit, &format_args!("path {}", request.uri().path()));
            (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n").into_response()
        }
        None => next.run(request).await,
        Some(_) if request.headers().get_all(header::AUTHORIZATION).iter().nth(1).is_some() => {
            refused(Refused::AuthorizationHeaders, &format_args!("path {}", request.uri().path()));
            (StatusCode::BAD_REQUEST, "More than one Authorization header.\n").into_response()
        }
        Some(users) => {
            let authorization = request.headers().get(header::AUTHORIZATION).cloned();
            match web.auth().check(users, client, authorization.as_ref()).await {
                Verdict::Pass => next.run(request).await,
                Verdict::Fail => {
                    let reason = if authorization.is_some() {
                        Refused::Credentials
                    } else {
                        Refused::CredentialsMissing
                    };
                    refused(reason, &format_args!("path {}", request.uri().path()));
                    let mut response = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
                    response
                }
                Verdict::Busy => {
                    refused(
                        Refused::ChecksQueuedFull,
                        &format_args!(
                            "path {}: at most {QUEUED_PER_CLIENT} per client address and \
                             {MAX_QUEUED} in all",
                            request.uri().path()
                        ),
                    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tests::{basic, hash};
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt as _;

    /// Regression (I1): with two `Authorization` headers the first decided, [right, wrong]
    /// passing and [wrong, right] failing, while a proxy that takes the last one would disagree.
    #[tokio::test]
    async fn more_than_one_authorization_header_is_a_400_before_any_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let yaml = format!("basic_auth_users:\n  prometheus: {}\n", hash("s3cret", 4));
        std::fs::write(&path, yaml).unwrap();
        let web = WebState::load(&path).unwrap();
        let app = Router::new()
            .route("/", get(|| async { "served" }))
            .layer(axum::middleware::from_fn_with_state(Arc::clone(&web), middleware));
        let get = |authorization: &[HeaderValue]| {
            let mut request = Request::get("/");
            for value in authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            app.clone().oneshot(request.body(Body::empty()).unwrap())
        };
        let (right, wrong) = (basic("prometheus", "s3cret"), basic("prometheus", "wrong"));
        for pair in [[&right, &wrong], [&wrong, &right], [&right, &right]] {
            let response = get(&pair.map(Clone::clone)).await.unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{pair:?}");
        }
        assert_eq!(web.auth().cached(), 0, "no credentials were checked");
        assert_eq!(web.refusals().count(Refused::AuthorizationHeaders), 3);
        assert_eq!(get(&[right]).await.unwrap().status(), StatusCode::OK);
        assert_eq!(web.auth().cached(), 1);
    }

    /// `rate_limit` over all clients: past the burst a `429` with the configured headers,
    /// before any credentials are checked (the refill is `ratelimit`'s test, on its own clock).
    #[tokio::test]
    async fn requests_beyond_the_rate_limit_burst_get_429_before_authentication() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let yaml = format!(
            "rate_limit:\n  interval: 1h\n  burst: 2\nhttp_server_config:\n  headers:\n    \
             X-Frame-Options: deny\nbasic_auth_users:\n  prometheus: {}\n",
            hash("s3cret", 4)
        );
        std::fs::write(&path, yaml).unwrap();
        let web = WebState::load(&path).unwrap();
        let app = Router::new()
            .route("/", get(|| async { "served" }))
            .layer(axum::middleware::from_fn_with_state(Arc::clone(&web), middleware));
        let get = |authorization: Option<HeaderValue>| {
            let mut request = Request::get("/");
            if let Some(value) = authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            app.clone().oneshot(request.body(Body::empty()).unwrap())
        };
        let right = basic("prometheus", "s3cret");
        assert_eq!(get(Some(right.clone())).await.unwrap().status(), StatusCode::OK);
        assert_eq!(get(None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
        let refused = get(Some(right)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()["x-frame-options"], "deny");
        let body = axum::body::to_bytes(refused.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"Too Many Requests\n");
        assert_eq!(web.auth().cached(), 1, "the refused request was not checked");
        let counts = web.refusals();
        assert_eq!(
            (counts.count(Refused::RateLimit), counts.count(Refused::CredentialsMissing)),
            (1, 1)
        );
    }
}
