//! The HTTP surface: the telemetry path, a landing page at `/`, the probe paths `/-/healthy` and
//! `/-/ready`, 404 elsewhere, content negotiation between OpenMetrics 1.0 and the text format
//! 0.0.4.

use crate::budget::Budget;
use crate::metrics::{self, Format};
use crate::scrape::{Exporter, Owners};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

/// Header in which Prometheus sends its scrape timeout, in seconds.
pub const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// The router, with `exporter` as shared state. Tests call it with
/// `tower::ServiceExt::oneshot`, without a socket.
pub fn app(exporter: Arc<Exporter>) -> Router {
    let path = exporter.config().telemetry_path.clone();
    Router::new()
        .route("/", crate::landing::route(&exporter))
        .route(&path, get(telemetry))
        .fallback(not_found)
        .with_state(exporter)
}

/// Liveness and readiness probe paths, named as Prometheus names its own.
pub(crate) const PROBE_PATHS: [&str; 2] = ["/-/healthy", "/-/ready"];

/// The probe paths: a fixed answer once the server serves, without sampling (no broker request,
/// so no mailbox message) and without authentication (a kubelet probe sends no credentials,
/// and the answer tells nothing). A telemetry path of the same name wins.
fn probes(telemetry_path: &str) -> Router {
    let mut router = Router::new();
    for path in PROBE_PATHS.into_iter().filter(|p| *p != telemetry_path) {
        router = router.route(path, get(|| async { "amd-hsmp-exporter is serving.\n" }));
    }
    router
}

/// The router as served: [`app`] behind the `--web.config.file` authentication and headers
/// (every path but the probes, the landing page too), with responses gzipped when the client
/// accepts it (`Accept-Encoding: gzip`, which Prometheus sends).
pub fn service(exporter: Arc<Exporter>, web: Arc<amd_hsmp_web::config::WebState>) -> Router {
    let probes = probes(&exporter.config().telemetry_path);
    // The scrapes read the refusals through the exporter, not a request extension, which would
    // cost every request an allocation or two.
    exporter.serve_behind(Arc::clone(&web));
    app(exporter)
        .layer(axum::middleware::from_fn_with_state(web, amd_hsmp_web::layer::middleware))
        .merge(probes)
        .layer(axum::middleware::from_fn(crate::gzip::layer))
}

/// What can go wrong answering a request. The response never shows internals; the log does.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    /// The metrics could not be encoded.
    #[error("cannot encode the metrics")]
    Encode(#[source] std::fmt::Error),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        tracing::error!(error = %amd_hsmp_cli::chain(&self), "request failed");
        (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
    }
}

async fn telemetry(
    State(exporter): State<Arc<Exporter>>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let Some(permit) = exporter.admit_scrape() else {
        let limit = exporter.config().max_requests;
        let body = format!("Limit of concurrent requests reached ({limit}), try again later.\n");
        return Ok((StatusCode::SERVICE_UNAVAILABLE, body).into_response());
    };
    let timeout = headers.get(SCRAPE_TIMEOUT_HEADER).map(|v| v.as_bytes());
    let budget = Budget::new(timeout, exporter.config().max_scrape_timeout);
    let format = negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let mut report = exporter.scrape(budget, &permit, Owners::Wanted).await;
    // Counted only with a configuration file: without one nothing is ever refused.
    if let Some(web) = exporter.web()
        && web.path().is_some()
        && exporter.config().exporter_metrics
    {
        report.web_refused = web.refusals().counts();
    }
    let report = Arc::new(report);
    let body = metrics::render(report, format).map_err(AppError::Encode)?;
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "404 page not found\n")
}

/// Picks the format for an `Accept` header: OpenMetrics when the client accepts
/// `application/openmetrics-text` (version 1.0.0, 0.0.1 or unspecified) at least as much as
/// `text/plain`; the text format 0.0.4 otherwise, including without a header.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let mut openmetrics = 0.0f64;
    let mut text = 0.0f64;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut q = 1.0f64;
        let mut version_ok = true;
        for param in parts {
            let Some((key, value)) = param.split_once('=') else { continue };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => q = value.parse().unwrap_or(0.0),
                "version" => version_ok = matches!(value, "1.0.0" | "0.0.1"),
                _ => {}
            }
        }
        match media.as_str() {
            "application/openmetrics-text" if version_ok => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if openmetrics > 0.0 && openmetrics >= text { Format::OpenMetrics } else { Format::Text }
}

/// The `Accept` header Prometheus 2 sends by default: what the negotiation, the tests and the
/// fuzz seeds are held against.
pub const PROMETHEUS_2_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The `Accept` header Prometheus 3 sends by default.
pub const PROMETHEUS_3_ACCEPT: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_default_accept_header_gets_openmetrics() {
        assert_eq!(negotiate(Some(PROMETHEUS_2_ACCEPT)), Format::OpenMetrics);
        assert_eq!(negotiate(Some(PROMETHEUS_3_ACCEPT)), Format::OpenMetrics);
    }

    #[test]
    fn plain_clients_get_the_text_format() {
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some("*/*")), Format::Text);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4")), Format::Text);
        assert_eq!(
            negotiate(Some("text/plain;q=0.9, application/openmetrics-text;q=0.5")),
            Format::Text
        );
        assert_eq!(negotiate(Some("application/openmetrics-text;version=2.0.0")), Format::Text);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=0")), Format::Text);
    }

    /// An exporter asking the broker at `socket`, with its own metrics or without them.
    fn exporter(socket: &std::path::Path, exporter_metrics: bool) -> Arc<Exporter> {
        Exporter::new(crate::scrape::Config {
            broker_socket: socket.to_owned(),
            families: amd_hsmp_proto::Families::ALL,
            max_scrape_timeout: std::time::Duration::from_secs(1),
            max_requests: 0,
            telemetry_path: "/metrics".into(),
            procfs: "/proc".into(),
            core_owner: None,
            core_owner_max_age: std::time::Duration::ZERO,
            core_owner_linger: std::time::Duration::ZERO,
            exporter_metrics,
        })
    }

    /// `--web.disable-exporter-metrics` leaves out `process_*` and the web refusals; without a
    /// `--web.config.file` the refusals are not exported either (nothing is ever refused).
    #[tokio::test]
    async fn the_exporters_own_metrics_follow_the_flag_and_the_web_configuration() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let config = dir.path().join("web.yml");
        std::fs::write(&config, "").unwrap();
        let scrape = async |router: Router| {
            let request = axum::http::Request::get("/metrics")
                .header(SCRAPE_TIMEOUT_HEADER, "0.1")
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            String::from_utf8_lossy(&body).into_owned()
        };
        let loaded = || amd_hsmp_web::config::WebState::load(&config).unwrap();
        let text = scrape(service(exporter(&socket, true), loaded())).await;
        assert!(text.contains("\nprocess_open_fds "), "{text}");
        assert!(text.contains("amd_hsmp_web_refused_total{reason=\"rate-limit\"} 0\n"), "{text}");
        let text = scrape(service(exporter(&socket, false), loaded())).await;
        assert!(!text.contains("process_") && !text.contains("amd_hsmp_web_refused"), "{text}");
        assert!(text.contains("amd_hsmp_build_info"), "{text}");
        let open = amd_hsmp_web::config::WebState::open();
        let text = scrape(service(exporter(&socket, true), open)).await;
        assert!(text.contains("\nprocess_open_fds ") && !text.contains("amd_hsmp_web_refused"));
    }

    /// What the served router gzips: the answers of a client that accepts gzip, each decoding
    /// to an answer like the one the client would have had without; never an answer too short,
    /// nor for a client that does not accept gzip. Every answer that could be gzipped varies by
    /// `Accept-Encoding`.
    #[tokio::test]
    async fn answers_are_gzipped_for_clients_that_accept_it_and_decode_to_the_plain_answer() {
        use std::io::Read as _;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let open = amd_hsmp_web::config::WebState::open();
        let router = service(exporter(&dir.path().join("absent.sock"), true), open);
        let get = |path: &str, encoding: Option<&str>| {
            let mut request = axum::http::Request::get(path).header(SCRAPE_TIMEOUT_HEADER, "0.1");
            if let Some(encoding) = encoding {
                request = request.header(header::ACCEPT_ENCODING, encoding);
            }
            request.body(axum::body::Body::empty()).unwrap()
        };
        let answer = async |request: axum::http::Request<axum::body::Body>| {
            let response = router.clone().oneshot(request).await.unwrap();
            let headers = response.headers().clone();
            let body = axum::body::to_bytes(response.into_body(), 1 << 22).await.unwrap();
            (headers, body)
        };
        for path in ["/", "/nothing-here"] {
            let (plain_headers, plain) = answer(get(path, None)).await;
            assert_eq!(plain_headers.get(header::CONTENT_ENCODING), None, "{path}");
            assert_eq!(plain_headers.get(header::VARY).unwrap(), "accept-encoding", "{path}");
            let (headers, gzipped) = answer(get(path, Some("br;q=1, gzip;q=0.8"))).await;
            if plain.len() < 32 {
                assert_eq!(headers.get(header::CONTENT_ENCODING), None, "{path}");
                assert_eq!(gzipped, plain, "{path}");
                continue;
            }
            assert_eq!(headers.get(header::CONTENT_ENCODING).unwrap(), "gzip", "{path}");
            assert_eq!(headers.get(header::VARY).unwrap(), "accept-encoding", "{path}");
            let mut decoded = Vec::new();
            flate2::read::GzDecoder::new(&gzipped[..]).read_to_end(&mut decoded).unwrap();
            // The landing page shows live values: its frame is the same, not every byte.
            let frame = |b: &[u8]| (b[..64].to_vec(), b[b.len() - 16..].to_vec());
            assert_eq!(frame(&decoded), frame(&plain), "{path}");
            let (headers, _) = answer(get(path, Some("gzip;q=0, *"))).await;
            assert_eq!(headers.get(header::CONTENT_ENCODING), None, "{path}");
        }
        // A scrape: the exposition's values change from one to the next; its families do not.
        let (headers, gzipped) = answer(get("/metrics", Some("gzip"))).await;
        assert_eq!(headers.get(header::CONTENT_ENCODING).unwrap(), "gzip");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gzipped[..]).read_to_string(&mut text).unwrap();
        assert!(text.contains("\namd_hsmp_broker_up 0\n"), "{text}");
    }

    /// The exporter behind `service`, with basic auth for user `u`, asking a "broker" that only
    /// counts connections.
    #[tokio::test]
    async fn probes_answer_without_credentials_and_without_asking_the_broker() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("broker.sock");
        let broker = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        broker.set_nonblocking(true).unwrap();
        let config = dir.path().join("web.yml");
        let hash = bcrypt::hash("p", 4).unwrap();
        std::fs::write(&config, format!("basic_auth_users:\n  u: {hash}\n")).unwrap();
        let web = amd_hsmp_web::config::WebState::load(&config).unwrap();
        let router = service(exporter(&socket, true), web);
        let get = |path: &str, auth: bool| {
            let mut request = axum::http::Request::get(path);
            if auth {
                request = request.header(header::AUTHORIZATION, "Basic dTpw"); // u:p
            }
            request.header(SCRAPE_TIMEOUT_HEADER, "0.1").body(axum::body::Body::empty()).unwrap()
        };
        for path in PROBE_PATHS {
            let response = router.clone().oneshot(get(path, false)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
        }
        let accepted = broker.accept().map(|_| ()).map_err(|e| e.kind());
        assert_eq!(accepted, Err(std::io::ErrorKind::WouldBlock), "a probe asked the broker");
        // Everything else still needs the credentials, and a scrape does ask the broker.
        let response = router.clone().oneshot(get("/metrics", false)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let response = router.clone().oneshot(get("/metrics", true)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(broker.accept().is_ok(), "the scrape did not reach the broker");
        // The refused request is counted by its reason, every reason with a series.
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("amd_hsmp_web_refused_total{reason=\"credentials-missing\"} 1\n"),
            "{text}"
        );
        let reasons = text.matches("amd_hsmp_web_refused_total{").count();
        assert_eq!(reasons, amd_hsmp_web::refused::Refused::ALL.len(), "{text}");
    }
}
