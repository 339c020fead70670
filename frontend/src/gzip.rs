//! Gzip of the answers for the clients that accept it (`Accept-Encoding: gzip`, which Prometheus
//! sends to every target): deflate at its fastest level, with the compressor's state kept from
//! one answer to the next.
//!
//! A deflate state is a few hundred KiB (miniz_oxide's window, hash chains and output buffer).
//! Made afresh for every answer, as a general compression layer makes it, every gzipped scrape
//! paid for allocating and zeroing it and, each time glibc gave the top of the heap back to the
//! kernel, for faulting its pages in again (`brk` about five times a scrape): the system time
//! of a gzipped scrape was nearly twice that of a plain one. Kept ([`KEPT`] of them, one per
//! server of a Prometheus HA pair scraping at once), a state is reset and used again. The
//! figures are in docs/benchmarks.md ("Where a scrape's CPU goes").
//!
//! Level 1: a scrape's body compresses to about 7 % more bytes than at the default level (8.7
//! against 8.1 kB on a Turin 2P) for well under half the CPU. Its bytes cross a network once;
//! its CPU is spent on every scrape.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, VARY};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use flate2::{Compress, CompressError, Compression, Crc, FlushCompress, Status};
use std::sync::{Mutex, PoisonError};

/// Deflate states kept for the next answers: one for each server of an HA pair scraping at
/// once. Answers beyond that many at once make a state of their own and drop it after.
const KEPT: usize = 2;

/// Answers shorter than this are sent as they are: gzip's 18 bytes of framing would outweigh
/// what it saves.
const MIN_LENGTH: usize = 32;

/// The gzip member header (RFC 1952): deflate, no flags, no modification time, `XFL` 4 (the
/// fastest algorithm), `OS` 255 (unknown).
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];

/// The states kept by the running exporter.
static STATES: Deflaters = Deflaters::new();

/// Deflate states at level 1, kept for reuse.
#[derive(Debug)]
pub(crate) struct Deflaters {
    kept: Mutex<Vec<Compress>>,
}

impl Deflaters {
    pub(crate) const fn new() -> Deflaters {
        Deflaters { kept: Mutex::new(Vec::new()) }
    }

    /// `data` as one gzip member, through a kept state if one is free.
    pub(crate) fn gzip(&self, data: &[u8]) -> Result<Vec<u8>, CompressError> {
        let taken = self.kept.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut state = taken.unwrap_or_else(|| Compress::new(Compression::fast(), false));
        let result = gzip_with(&mut state, data);
        state.reset();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < KEPT {
            kept.push(state);
        }
        result
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// `data` as one gzip member compressed by `state` (fresh or reset): the header, the raw deflate
/// stream, then the CRC-32 and the length modulo 2³² of `data`, little-endian.
fn gzip_with(state: &mut Compress, data: &[u8]) -> Result<Vec<u8>, CompressError> {
    let mut out = Vec::with_capacity(HEADER.len() + data.len() / 6 + 1024);
    out.extend_from_slice(&HEADER);
    loop {
        // What the state has consumed of `data` so far (it counts from its last reset).
        let consumed = usize::try_from(state.total_in()).map_or(data.len(), |n| n.min(data.len()));
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.len().max(1024));
        }
        match state.compress_vec(&data[consumed..], &mut out, FlushCompress::Finish)? {
            Status::StreamEnd => break,
            Status::Ok | Status::BufError => {}
        }
    }
    let mut crc = Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    let length = u64::try_from(data.len()).unwrap_or(u64::MAX).to_le_bytes();
    out.extend_from_slice(&length[..4]);
    Ok(out)
}

/// Whether a request's `Accept-Encoding` values, as the bytes that came off the wire, accept
/// gzip (RFC 9110, 12.5.3): `gzip` (or `x-gzip`) with a weight above 0, or, when neither is
/// named, `*` with a weight above 0. An item whose weight is not a number from 0 to 1 is
/// ignored, and so is a value that is not UTF-8. Never panics (the `accept` fuzz target).
pub fn accepts_gzip<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let (mut gzip, mut any) = (None::<f32>, None::<f32>);
    for value in values {
        let Ok(value) = std::str::from_utf8(value) else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let mut weight = Some(1.0f32);
            for parameter in parts {
                if let Some((name, q)) = parameter.split_once('=')
                    && name.trim().eq_ignore_ascii_case("q")
                {
                    weight = q.trim().parse().ok().filter(|q| (0.0..=1.0).contains(q));
                }
            }
            let Some(weight) = weight else { continue };
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                gzip = Some(gzip.map_or(weight, |w| w.max(weight)));
            } else if coding == "*" {
                any = Some(any.map_or(weight, |w| w.max(weight)));
            }
        }
    }
    gzip.or(any).is_some_and(|w| w > 0.0)
}

/// The middleware: gzips the answer when the request accepts gzip and the answer is neither
/// encoded already nor shorter than [`MIN_LENGTH`]. Every answer it may gzip says
/// `Vary: Accept-Encoding`. A body that cannot be compressed (never seen: the answers are in
/// memory) is sent as it is.
pub(crate) async fn layer(request: Request, next: Next) -> Response {
    let wanted =
        accepts_gzip(request.headers().get_all(ACCEPT_ENCODING).iter().map(|v| v.as_bytes()));
    let response = next.run(request).await;
    if response.headers().contains_key(CONTENT_ENCODING) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.append(VARY, HeaderValue::from_static("accept-encoding"));
    if !wanted {
        return Response::from_parts(parts, body);
    }
    let data = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(data) => data,
        Err(e) => {
            tracing::error!(error = %e, "cannot read an answer's body to compress it");
            return (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response();
        }
    };
    if data.len() < MIN_LENGTH {
        return Response::from_parts(parts, Body::from(data));
    }
    match STATES.gzip(&data) {
        Ok(gzipped) => {
            parts.headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            parts.headers.remove(CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(gzipped))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot gzip an answer; sending it uncompressed");
            Response::from_parts(parts, Body::from(data))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap();
        out
    }

    fn accepts(values: &[&str]) -> bool {
        accepts_gzip(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn every_answer_decodes_to_its_input_through_states_used_again() {
        let deflaters = Deflaters::new();
        // An exposition-like text long enough to outgrow the first output buffer, and an
        // incompressible one that does too, then short ones: each through a reused state.
        let text: String = (0..20_000)
            .map(|i| format!("amd_hsmp_core_energy_joules_total{{core=\"{i}\"}} {}.5\n", i * 7919))
            .collect();
        let mut noise = Vec::with_capacity(300_000);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.push(x.to_le_bytes()[0]);
        }
        for data in [text.as_bytes(), &noise, b"", b"amd_hsmp_up 1\n", text.as_bytes()] {
            let gzipped = deflaters.gzip(data).unwrap();
            assert_eq!(gunzip(&gzipped), data);
            assert_eq!(deflaters.kept(), 1, "one state, kept and used again");
        }
        let gzipped = deflaters.gzip(text.as_bytes()).unwrap();
        assert!(gzipped.len() * 4 < text.len(), "{} of {}", gzipped.len(), text.len());
        assert_eq!(gzipped[..HEADER.len()], HEADER);
    }

    #[test]
    fn no_more_states_are_kept_than_an_ha_pair_uses() {
        let deflaters = Deflaters::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| deflaters.gzip(&[b'a'; 100_000]).unwrap());
            }
        });
        assert!(deflaters.kept() <= KEPT, "{}", deflaters.kept());
    }

    #[test]
    fn gzip_is_accepted_as_rfc_9110_weighs_it() {
        for yes in [
            &["gzip"][..],
            &["GZIP"],
            &["x-gzip"],
            &["br, gzip;q=0.5"],
            &["gzip; q=1.0"],
            &["*"],
            &["identity", "gzip"],
            &["deflate, *;q=0.1"],
            &["gzip;q=0, gzip;q=0.3"],
        ] {
            assert!(accepts(yes), "{yes:?}");
        }
        for no in [
            &[][..],
            &[""],
            &["identity"],
            &["br, deflate"],
            &["gzip;q=0"],
            &["gzip;q=0.000"],
            &["*;q=0"],
            &["gzip;q=0, *"],
            &["gzip;q=abc"],
            &["gzip;q=2"],
            &["gzip;q=-1"],
            &["gzipper"],
            &["gzip;q=NaN"],
        ] {
            assert!(!accepts(no), "{no:?}");
        }
        assert!(!accepts_gzip([&b"gzip\xff"[..]]), "a value that is not UTF-8 is ignored");
        assert!(accepts_gzip([&b"\xff"[..], b"gzip"]), "the other values still count");
    }
}
