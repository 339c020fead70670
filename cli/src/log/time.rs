//! RFC 3339 timestamps in UTC (`2026-12-01T09:24:42.197Z`), from the civil calendar by Howard
//! Hinnant's `civil_from_days`.

use std::time::SystemTime;

/// `YYYY-MM-DDThh:mm:ss.mmmZ`.
pub(super) fn rfc3339_millis(time: SystemTime) -> String {
    let (seconds, nanos) = since_epoch(time);
    format!("{}.{:03}Z", seconds_text(seconds), nanos / 1_000_000)
}

/// `YYYY-MM-DDThh:mm:ss.nnnnnnnnnZ`.
pub(super) fn rfc3339_nanos(time: SystemTime) -> String {
    let (seconds, nanos) = since_epoch(time);
    format!("{}.{nanos:09}Z", seconds_text(seconds))
}

/// Whole seconds since 1970-01-01T00:00:00Z (negative before) and the nanoseconds after them.
fn since_epoch(time: SystemTime) -> (i64, u32) {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => (i64::try_from(after.as_secs()).unwrap_or(i64::MAX), after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            let whole = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            match before.subsec_nanos() {
                0 => (-whole, 0),
                n => (-whole - 1, 1_000_000_000 - n),
            }
        }
    }
}

/// `YYYY-MM-DDThh:mm:ss`.
fn seconds_text(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}")
}

/// The proleptic Gregorian date `days` after 1970-01-01
/// (<https://howardhinnant.github.io/date_algorithms.html#civil_from_days>).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both fit: day is 1..=31 and month 1..=12 by construction.
    (year, u32::try_from(month).unwrap_or(0), u32::try_from(day).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(seconds: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos)
    }

    #[test]
    fn timestamps_match_humantime_across_the_calendar() {
        let mut seconds: Vec<u64> = vec![
            0,
            1,
            59,
            86_399,
            86_400,
            68_169_599,    // 1972-02-29T23:59:59, the first leap day after 1970
            951_782_400,   // 2000-02-29, a leap day of a year divisible by 400
            4_107_542_399, // 2100-02-28T23:59:59, 2100 is no leap year
            2_147_483_647, // 2038-01-19T03:14:07, the end of a signed 32-bit time_t
            2_147_483_648,
            4_294_967_295,   // 2106, the end of an unsigned one
            253_402_300_799, // 9999-12-31T23:59:59, the last second humantime writes
        ];
        // A step prime to the day and to the 400-year cycle: every hour, day and month comes up.
        seconds.extend((0..20_000_u64).map(|i| i * 12_670_001_u64 % 253_402_300_800));
        for (i, s) in seconds.into_iter().enumerate() {
            let nanos = [0, 1, 999_999_999, 197_318_000][i % 4];
            let time = at(s, nanos);
            assert_eq!(rfc3339_millis(time), humantime::format_rfc3339_millis(time).to_string());
            assert_eq!(rfc3339_nanos(time), humantime::format_rfc3339_nanos(time).to_string());
        }
    }

    #[test]
    fn a_time_before_1970_is_written_not_refused() {
        let time = SystemTime::UNIX_EPOCH - Duration::from_millis(1);
        assert_eq!(rfc3339_millis(time), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            rfc3339_nanos(SystemTime::UNIX_EPOCH - Duration::from_secs(86_400)),
            "1969-12-31T00:00:00.000000000Z"
        );
    }
}
