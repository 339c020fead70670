//! What the client-certificate checks read of an X.509 certificate that rustls' verifier does
//! not hand out: its subject alternative names as Go's `crypto/x509` renders them (for
//! `client_allowed_sans`), its validity period and its extended key usages (for a client
//! certificate that is itself a configured CA, which Go accepts). A small DER reader: anything
//! it cannot read is `None`, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The parts of a certificate the checks use.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// DNS names, e-mail addresses, IP addresses (as Go's `net.IP.String`) and URIs, in
    /// Go's order (`DNSNames`, `EmailAddresses`, `IPAddresses`, `URIs`).
    pub(crate) sans: Vec<String>,
    /// `notBefore` and `notAfter`, seconds since the Unix epoch.
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
    /// The extended key usage OIDs (DER contents); `None` without the extension.
    pub(crate) eku: Option<Vec<Vec<u8>>>,
}

/// `id-kp-clientAuth` (1.3.6.1.5.5.7.3.2).
pub(crate) const CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];
/// `anyExtendedKeyUsage` (2.5.29.37.0).
pub(crate) const ANY_EKU: &[u8] = &[0x55, 0x1d, 0x25, 0x00];

const SEQUENCE: u8 = 0x30;
const SAN_OID: &[u8] = &[0x55, 0x1d, 0x11];
const EKU_OID: &[u8] = &[0x55, 0x1d, 0x25];

/// One DER element: its tag, contents and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        (bytes.iter().fold(0usize, |len, b| (len << 8) | usize::from(*b)), rest)
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The contents of an element of tag `tag`, and what follows it.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, contents, rest) = element(input)?;
    (t == tag).then_some((contents, rest))
}

/// Reads `der`, a certificate.
pub(crate) fn parse(der: &[u8]) -> Option<Parsed> {
    let (certificate, _) = expect(der, SEQUENCE)?;
    let (mut tbs, _) = expect(certificate, SEQUENCE)?;
    // version [0] EXPLICIT, optional
    if let Some((0xa0, _, rest)) = element(tbs) {
        tbs = rest;
    }
    let (_, _serial, rest) = element(tbs)?;
    let (_signature, rest) = expect(rest, SEQUENCE)?;
    let (_issuer, rest) = expect(rest, SEQUENCE)?;
    let (validity, rest) = expect(rest, SEQUENCE)?;
    let (_subject, rest) = expect(rest, SEQUENCE)?;
    let (_key, mut rest) = expect(rest, SEQUENCE)?;
    let (not_before, after) = time(validity)?;
    let (not_after, _) = time(after)?;
    let mut parsed = Parsed { not_before, not_after, ..Parsed::default() };
    while let Some((tag, contents, next)) = element(rest) {
        rest = next;
        if tag != 0xa3 {
            continue; // issuerUniqueID, subjectUniqueID
        }
        let (mut extensions, _) = expect(contents, SEQUENCE)?;
        while !extensions.is_empty() {
            let (extension, next) = expect(extensions, SEQUENCE)?;
            extensions = next;
            let (oid, mut fields) = expect(extension, 0x06)?;
            if let Some((0x01, _, next)) = element(fields) {
                fields = next; // critical
            }
            let (value, _) = expect(fields, 0x04)?;
            if oid == SAN_OID {
                parsed.sans = sans(value)?;
            } else if oid == EKU_OID {
                let (mut list, _) = expect(value, SEQUENCE)?;
                let mut oids = Vec::new();
                while !list.is_empty() {
                    let (oid, next) = expect(list, 0x06)?;
                    oids.push(oid.to_vec());
                    list = next;
                }
                parsed.eku = Some(oids);
            }
        }
    }
    Some(parsed)
}

/// `GeneralNames` as Go lists them: DNS names, e-mail addresses, IP addresses, URIs.
fn sans(value: &[u8]) -> Option<Vec<String>> {
    let (mut names, _) = expect(value, SEQUENCE)?;
    let (mut dns, mut email, mut ip, mut uri) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    while !names.is_empty() {
        let (tag, contents, next) = element(names)?;
        names = next;
        let text = || std::str::from_utf8(contents).ok().filter(|t| t.is_ascii()).map(String::from);
        match tag {
            0x81 => email.push(text()?),
            0x82 => dns.push(text()?),
            0x86 => uri.push(text()?),
            0x87 => ip.push(go_ip(contents)?),
            _ => {}
        }
    }
    Some([dns, email, ip, uri].concat())
}

/// An IP address as Go's `net.IP.String` writes it (an IPv4-mapped IPv6 address as IPv4).
fn go_ip(bytes: &[u8]) -> Option<String> {
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(bytes);
            let v6 = Ipv6Addr::from(octets);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(ip.to_string())
}

/// A `UTCTime` or `GeneralizedTime` (`...Z`) as seconds since the epoch; what follows it.
fn time(input: &[u8]) -> Option<(i64, &[u8])> {
    let (tag, contents, rest) = element(input)?;
    let text = std::str::from_utf8(contents).ok()?.strip_suffix('Z')?;
    let (year, text) = match (tag, text.len()) {
        (0x17, 12) => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        (0x18, 14) => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let field = |i: usize| text.get(i..i + 2).and_then(|f| f.parse::<i64>().ok());
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60 + second, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair, SanType};

    #[test]
    fn sans_validity_and_key_usages_are_read_as_go_reads_them() {
        let mut params = CertificateParams::new(vec!["b.example".to_owned()]).unwrap();
        params.subject_alt_names.extend([
            SanType::URI("spiffe://cluster/ns/monitoring/sa/prometheus".try_into().unwrap()),
            SanType::IpAddress("2001:db8::1".parse().unwrap()),
            SanType::IpAddress("::ffff:10.0.0.1".parse().unwrap()),
            SanType::IpAddress("10.0.0.2".parse().unwrap()),
            SanType::Rfc822Name("ops@example.org".try_into().unwrap()),
            SanType::DnsName("A.example".try_into().unwrap()),
        ]);
        params.not_before = rcgen::date_time_ymd(2024, 2, 29);
        params.not_after = rcgen::date_time_ymd(2051, 1, 1);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
        let parsed = parse(cert.der()).unwrap();
        assert_eq!(
            parsed.sans,
            [
                "b.example",
                "A.example",
                "ops@example.org",
                "2001:db8::1",
                "10.0.0.1",
                "10.0.0.2",
                "spiffe://cluster/ns/monitoring/sa/prometheus"
            ]
        );
        // 2024-02-29T00:00:00Z; 2051-01-01 is past 2049, a GeneralizedTime.
        assert_eq!((parsed.not_before, parsed.not_after), (1_709_164_800, 2_556_144_000));
        assert_eq!(parsed.eku, Some(vec![CLIENT_AUTH.to_vec()]));
        // Without the extensions: no SAN, no EKU (any use).
        let bare = CertificateParams::new(Vec::<String>::new()).unwrap();
        let cert = bare.self_signed(&KeyPair::generate().unwrap()).unwrap();
        let parsed = parse(cert.der()).unwrap();
        assert!(parsed.sans.is_empty() && parsed.eku.is_none(), "{parsed:?}");
    }

    #[test]
    fn truncated_or_garbled_certificates_are_none_not_a_panic() {
        let cert = rcgen::generate_simple_self_signed(vec!["a".into()]).unwrap().cert;
        let der = cert.der().to_vec();
        assert!(parse(&der).is_some());
        for end in 0..der.len() {
            assert!(parse(&der[..end]).is_none(), "{end} bytes");
        }
        for i in 0..der.len() {
            let mut bad = der.clone();
            bad[i] ^= 0xff;
            let _ = parse(&bad);
        }
        assert!(parse(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(parse(&[0x30, 0x80]).is_none());
    }
}
