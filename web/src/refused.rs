//! Refused handshakes and requests: each counted by its reason (for an exporter's metric,
//! [`Refusals::counts`]) and logged with the client's address and what was wrong, at most one
//! line per reason per [`LOG_INTERVAL`], saying how many were held back.

use crate::ratelimit::RateLimit;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// At most one line per reason per this interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a TLS handshake or an HTTP request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The TLS handshake failed: no common version or suite, the client refused the server's
    /// certificate, a malformed or cut handshake.
    TlsHandshake,
    /// The TLS handshake did not finish within the header-read timeout.
    TlsTimeout,
    /// A client certificate was required and none was given.
    ClientCertificateMissing,
    /// The client certificate was refused: not of a configured CA, expired, a wrong key usage,
    /// none of `client_allowed_sans`.
    ClientCertificate,
    /// A request without basic-auth credentials.
    CredentialsMissing,
    /// A request with an unknown user or a wrong password.
    Credentials,
    /// A request with more than one `Authorization` header (`400`).
    AuthorizationHeaders,
    /// The client's basic-auth checks were queued full (`503`).
    ChecksQueuedFull,
    /// `rate_limit` of the web configuration (`429`).
    RateLimit,
}

impl Refused {
    /// Every reason, in the order of the metric's series.
    pub const ALL: [Refused; 9] = [
        Refused::TlsHandshake,
        Refused::TlsTimeout,
        Refused::ClientCertificateMissing,
        Refused::ClientCertificate,
        Refused::CredentialsMissing,
        Refused::Credentials,
        Refused::AuthorizationHeaders,
        Refused::ChecksQueuedFull,
        Refused::RateLimit,
    ];

    /// The label value of the reason.
    pub const fn label(self) -> &'static str {
        match self {
            Refused::TlsHandshake => "tls-handshake",
            Refused::TlsTimeout => "tls-timeout",
            Refused::ClientCertificateMissing => "client-certificate-missing",
            Refused::ClientCertificate => "client-certificate",
            Refused::CredentialsMissing => "credentials-missing",
            Refused::Credentials => "credentials",
            Refused::AuthorizationHeaders => "authorization-headers",
            Refused::ChecksQueuedFull => "checks-queued-full",
            Refused::RateLimit => "rate-limit",
        }
    }

    /// What the log line says.
    const fn message(self) -> &'static str {
        match self {
            Refused::TlsHandshake => "TLS handshake failed",
            Refused::TlsTimeout => {
                "TLS handshake refused: not finished within --web.header-read-timeout"
            }
            Refused::ClientCertificateMissing => "TLS handshake refused: no client certificate",
            Refused::ClientCertificate => "TLS handshake refused: client certificate not accepted",
            Refused::CredentialsMissing => {
                "HTTP request refused with 401: no basic-auth credentials"
            }
            Refused::Credentials => "HTTP request refused with 401: basic authentication failed",
            Refused::AuthorizationHeaders => {
                "HTTP request refused with 400: more than one Authorization header"
            }
            Refused::ChecksQueuedFull => {
                "HTTP request refused with 503: too many basic-auth checks waiting"
            }
            Refused::RateLimit => {
                "HTTP request refused with 429: rate_limit of the web configuration"
            }
        }
    }

    /// The reason of a failed TLS handshake, from the error tokio-rustls returned.
    pub fn of_handshake(error: &std::io::Error) -> Refused {
        match error.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::NoCertificatesPresented) => Refused::ClientCertificateMissing,
            Some(rustls::Error::InvalidCertificate(_)) => Refused::ClientCertificate,
            _ => Refused::TlsHandshake,
        }
    }
}

/// The refusals of the process, by reason; one for the whole process, so a reload keeps them.
#[derive(Debug)]
pub struct Refusals {
    counts: [AtomicU64; Refused::ALL.len()],
    logs: [RateLimit; Refused::ALL.len()],
}

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            logs: std::array::from_fn(|_| RateLimit::new(LOG_INTERVAL)),
        }
    }
}

impl Refusals {
    /// Counts a refusal of `client` for `reason`, and logs it (`detail`: what was wrong) unless
    /// a line for this reason was written less than [`LOG_INTERVAL`] ago.
    pub fn refuse(&self, reason: Refused, client: IpAddr, detail: &dyn fmt::Display) {
        let i = reason as usize;
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.logs[i].check() {
            tracing::info!(
                client = %client,
                reason = reason.label(),
                detail = %detail,
                suppressed,
                "{}",
                reason.message()
            );
        }
    }

    /// Every reason with its count so far, in [`Refused::ALL`]'s order.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        Refused::ALL
            .iter()
            .map(|r| (r.label(), self.counts[*r as usize].load(Ordering::Relaxed)))
            .collect()
    }

    /// The count of `reason` so far.
    pub fn count(&self, reason: Refused) -> u64 {
        self.counts[reason as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_counted_apart_under_a_distinct_label() {
        let refusals = Refusals::default();
        let client = IpAddr::from([127, 0, 0, 2]);
        for (i, reason) in Refused::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "ALL is in declaration order");
            for _ in 0..=i {
                refusals.refuse(*reason, client, &"detail");
            }
        }
        let counts = refusals.counts();
        let mut labels: Vec<&str> = counts.iter().map(|(l, _)| *l).collect();
        assert!(counts.iter().enumerate().all(|(i, (_, n))| *n == i as u64 + 1), "{counts:?}");
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refused::ALL.len());
    }

    #[test]
    fn a_handshake_error_names_its_reason() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let invalid = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(Refused::of_handshake(&io(invalid)), Refused::ClientCertificate);
        assert_eq!(
            Refused::of_handshake(&io(rustls::Error::NoCertificatesPresented)),
            Refused::ClientCertificateMissing
        );
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(Refused::of_handshake(&eof), Refused::TlsHandshake);
    }
}
