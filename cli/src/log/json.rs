//! The two JSON values a log record holds besides integers and booleans, written as
//! `serde_json` writes them: strings (RFC 8259 escaping, UTF-8 kept as is) and finite numbers.

use std::fmt::Write as _;

/// Writes `text` as a JSON string: `"` and `\` escaped, control characters below U+0020 as
/// `\b`, `\t`, `\n`, `\f`, `\r` or `\u00XX`, everything else as it is.
pub(super) fn string(text: &str, out: &mut String) {
    out.push('"');
    let mut plain = 0;
    for (at, byte) in text.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\x08' => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            b'\x0c' => "\\f",
            b'\r' => "\\r",
            0..0x20 => "",
            _ => continue,
        };
        // Every byte cut at is ASCII, so each slice is on a character boundary.
        out.push_str(text.get(plain..at).unwrap_or_default());
        if escape.is_empty() {
            let _ = write!(out, "\\u{byte:04x}");
        } else {
            out.push_str(escape);
        }
        plain = at + 1;
    }
    out.push_str(text.get(plain..).unwrap_or_default());
    out.push('"');
}

/// Writes a finite `n` as serde_json does: the shortest digits that read back as `n`, in fixed
/// notation with at least one fractional digit while the decimal exponent is within -5..=15
/// (`1.0`, `0.00001`, `1e+16`), else `d.ddde±x` (`1e-7`, `1.5e+300`).
pub(super) fn number(n: f64, out: &mut String) {
    // `{:e}` is the shortest round-trip form (`-1.234e-7`, `5e0`), but of two candidates as
    // short it takes the upper one where serde_json takes the even one: at that length, the
    // exact value rounded half to even is serde_json's.
    let shortest = format!("{n:e}");
    let length =
        shortest.split_once('e').map_or(0, |(m, _)| m.bytes().filter(u8::is_ascii_digit).count());
    let even = format!("{n:.*e}", length.saturating_sub(1));
    let scientific = if even.parse() == Ok(n) { even } else { shortest };
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    let length = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    if (-5..=15).contains(&exponent) {
        if exponent >= length - 1 {
            // 1234e7 → 12340000000.0
            out.push_str(&digits);
            (0..exponent - (length - 1)).for_each(|_| out.push('0'));
            out.push_str(".0");
        } else if exponent >= 0 {
            // 1234e-2 → 12.34
            let (whole, fraction) = digits.split_at(usize::try_from(exponent + 1).unwrap_or(0));
            let _ = write!(out, "{whole}.{fraction}");
        } else {
            // 1234e-6 → 0.001234
            out.push_str("0.");
            (0..-exponent - 1).for_each(|_| out.push('0'));
            out.push_str(&digits);
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "{mantissa}e{sign}{}", exponent.unsigned_abs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_string(text: &str) -> String {
        let mut out = String::new();
        string(text, &mut out);
        out
    }

    fn as_number(n: f64) -> String {
        let mut out = String::new();
        number(n, &mut out);
        out
    }

    #[test]
    fn tricky_strings_are_escaped_as_serde_json_escapes_them_and_read_back() {
        let mut tricky: Vec<String> = [
            "",
            "plain",
            "say \"hi\"",
            "C:\\path\\",
            "two\nlines\r\n",
            "tab\there, bell\u{7}, escape\u{1b}[31m, nul\u{0}, del\u{7f}",
            "\u{8}\u{c}\u{1f}",
            "grüße, 東京, 🦀, \u{2028}\u{2029}, \u{feff}",
            "\\u0041 is not an escape here",
            "}\",\"level\":\"ERROR",
        ]
        .map(str::to_owned)
        .to_vec();
        tricky.push((0..0x80_u8).map(char::from).collect());
        for text in &tricky {
            let written = as_string(text);
            assert_eq!(written, serde_json::Value::from(text.as_str()).to_string(), "{text:?}");
            assert_eq!(&serde_json::from_str::<String>(&written).unwrap(), text);
        }
    }

    #[test]
    fn numbers_are_written_as_serde_json_writes_them() {
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            1.0,
            -1.0,
            0.1,
            2.5,
            1e15,
            1e16,
            123_456_789_012_345.6,
            1e-5,
            1e-6,
            1.5e-7,
            1e300,
            -1.5e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            1e21,
            1e22,
            9_007_199_254_740_993.0,
            0.000_012_345,
            667_082_108_456_853.0 + 0.25, // a tie at the shortest length: serde_json takes the even
        ];
        // Every binary exponent, with a spread of mantissas.
        let mut bits = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            bits = bits
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            values.push(f64::from_bits(bits));
        }
        for n in values.into_iter().filter(|n| n.is_finite()) {
            let expected = serde_json::Number::from_f64(n).unwrap().to_string();
            assert_eq!(as_number(n), expected, "{n:e}");
        }
    }
}
