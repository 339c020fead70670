//! Durations on both binaries' command lines, in the grammar of Prometheus' own flags
//! (`model.ParseDuration`): `((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?`,
//! at least one unit, each at most once and in that order, or `0` alone. A year is 365 days, a
//! week 7. No sign, fraction, space or other unit; at most what Prometheus holds (2^63 - 1 ns,
//! about 292 years).
//!
//! Each flag checks its own range after parsing, with a message that says why.

use std::time::Duration;

/// The units, biggest first, with their length in milliseconds.
const UNITS: [(&str, u64); 7] = [
    ("y", 365 * 24 * 3_600_000),
    ("w", 7 * 24 * 3_600_000),
    ("d", 24 * 3_600_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest duration: Prometheus' (a Go `time.Duration`, `i64` nanoseconds), in milliseconds.
const MAX_MS: u64 = i64::MAX as u64 / 1_000_000;

/// What a malformed duration is told.
const FORM: &str = "a number and a unit, units from y, w, d, h, m, s, ms in that order, \
                    e.g. 1m30s or 500ms, or 0";

/// Parses `text` as Prometheus does; the error quotes it and says what was expected.
pub fn parse(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(format!("an empty duration; expected {FORM}"));
    }
    let invalid = || format!("{text:?} is not a duration; expected {FORM}");
    let mut rest = text;
    // Index in UNITS of the next unit allowed: each comes after the one before.
    let mut next = 0;
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let letters = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(letters);
        if number.is_empty() || unit.is_empty() || !unit.chars().all(char::is_alphabetic) {
            return Err(invalid());
        }
        let Some((index, &(_, unit_ms))) = UNITS.iter().enumerate().find(|(_, u)| u.0 == unit)
        else {
            return Err(format!("unknown unit {unit:?} in duration {text:?}; expected {FORM}"));
        };
        if index < next {
            return Err(invalid());
        }
        next = index + 1;
        let out_of_range = || format!("duration {text:?} is out of range (at most about 292y)");
        let count: u64 = number.parse().map_err(|_| out_of_range())?;
        total_ms = count
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .filter(|&ms| ms <= MAX_MS)
            .ok_or_else(out_of_range)?;
        rest = after;
    }
    Ok(Duration::from_millis(total_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Result<Duration, String> {
        Ok(Duration::from_millis(n))
    }

    #[test]
    fn each_unit_and_their_sums_in_order() {
        assert_eq!(parse("0"), ms(0));
        assert_eq!(parse("0s"), ms(0));
        assert_eq!(parse("500ms"), ms(500));
        assert_eq!(parse("10s"), ms(10_000));
        assert_eq!(parse("1m"), ms(60_000));
        assert_eq!(parse("1m30s"), ms(90_000));
        assert_eq!(parse("2h"), ms(7_200_000));
        assert_eq!(parse("1d"), ms(86_400_000));
        assert_eq!(parse("1w"), ms(604_800_000));
        assert_eq!(parse("1y"), ms(31_536_000_000));
        assert_eq!(
            parse("1y2w3d4h5m6s7ms"),
            ms(31_536_000_000 + 1_209_600_000 + 259_200_000 + 14_400_000 + 300_000 + 6_000 + 7)
        );
        assert_eq!(parse("90s"), ms(90_000));
        assert_eq!(parse("007s"), ms(7_000));
    }

    #[test]
    fn forms_outside_the_grammar_are_refused_naming_the_text() {
        for text in [
            "", "s", "ms", "10", "1.5", "1.5s", "-1s", "+1s", " 1s", "1s ", "1 s", "1S", "1sec",
            "1min", "1h30", "30s1m", "1s1s", "1ms1s", "ten", "1µs", "1us", "1ns", "00",
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains("expected"), "{text:?}: {err}");
            assert!(text.is_empty() || err.contains(&format!("{text:?}")), "{text:?}: {err}");
        }
        assert_eq!(
            parse("1min").unwrap_err(),
            "unknown unit \"min\" in duration \"1min\"; expected a number and a unit, units from \
             y, w, d, h, m, s, ms in that order, e.g. 1m30s or 500ms, or 0"
        );
    }

    #[test]
    fn durations_beyond_prometheus_range_are_refused_not_wrapped() {
        // 2^63 - 1 ns is 292y 24w 3d 23h 47m 16s 854ms.
        assert_eq!(parse("292y24w3d23h47m16s854ms"), ms(MAX_MS));
        for text in [
            "292y24w3d23h47m16s855ms",
            "293y",
            "106751992d",
            "18446744073709551615ms",
            "18446744073709551616ms",
            "99999999999999999999999y",
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains("out of range"), "{text:?}: {err}");
        }
    }
}
