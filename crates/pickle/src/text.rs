//! The text arguments of protocol-0 opcodes: decimal integers, floats, quoted Python 2 strings
//! and raw-unicode-escape text. Each parser returns a reason on failure, which the decoder wraps
//! into [`crate::DecodeError::Malformed`] with the opcode's position.

use crate::value::{MAX_STR_DIGITS, Value, int_from_sign_magnitude};

/// A decimal integer (`INT`, `LONG` without its `L`): optional sign, ASCII digits, surrounding
/// ASCII whitespace allowed. Python's other forms (`0x..`, `1_000`) are refused: picklers never
/// write them.
pub(crate) fn parse_decimal(text: &[u8]) -> Result<Value, String> {
    let text = text.trim_ascii();
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "`{}` is not a decimal integer",
            String::from_utf8_lossy(text).escape_debug()
        ));
    }
    if digits.len() > MAX_STR_DIGITS {
        return Err(format!(
            "an integer literal of {} digits exceeds the limit of {MAX_STR_DIGITS}",
            digits.len()
        ));
    }
    if digits.len() <= 18 {
        let mut n: i64 = 0;
        for d in digits {
            n = n * 10 + i64::from(d - b'0');
        }
        return Ok(Value::Int(if negative { -n } else { n }));
    }
    // Magnitude in little-endian base-2^32 limbs: multiply by 10 and add, digit by digit.
    let mut limbs: Vec<u32> = vec![0];
    for d in digits {
        let mut carry = u64::from(d - b'0');
        for limb in &mut limbs {
            let cur = u64::from(*limb) * 10 + carry;
            *limb = cur as u32;
            carry = cur >> 32;
        }
        if carry != 0 {
            limbs.push(carry as u32);
        }
    }
    Ok(int_from_sign_magnitude(negative, &limbs))
}

/// A float as Python's `repr` writes it (`FLOAT`), including `inf` and `nan`.
pub(crate) fn parse_float(text: &[u8]) -> Result<f64, String> {
    let bad = || {
        format!(
            "`{}` is not a float",
            String::from_utf8_lossy(text).escape_debug()
        )
    };
    let s = std::str::from_utf8(text).map_err(|_| bad())?.trim_ascii();
    s.parse::<f64>().map_err(|_| bad())
}

/// The bytes of a quoted Python 2 string literal (`STRING`): quotes stripped, backslash escapes
/// decoded as `codecs.escape_decode` does.
pub(crate) fn unquote_string(text: &[u8]) -> Result<Vec<u8>, String> {
    let inner = match text {
        [q @ (b'\'' | b'"'), inner @ .., last] if last == q => inner,
        _ => return Err("the STRING opcode argument must be quoted".into()),
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let b = inner[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&e) = inner.get(i) else {
            return Err("trailing \\ in the string".into());
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(e),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut value = u32::from(e - b'0');
                for _ in 0..2 {
                    match inner.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(value as u8); // CPython keeps the low byte of \400..\777
            }
            b'x' => {
                let hex = inner
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid \\x escape at position {}", i - 2))?;
                out.push(hex);
                i += 2;
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// Text in Python's `raw-unicode-escape` codec (`UNICODE`): bytes are Latin-1 characters,
/// except `\uXXXX` and `\UXXXXXXXX` after an odd number of backslashes.
pub(crate) fn raw_unicode_unescape(text: &[u8]) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        if b != b'\\' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let run_end = text[i..]
            .iter()
            .position(|&c| c != b'\\')
            .map_or(text.len(), |p| i + p);
        let run = run_end - i;
        let width = match text.get(run_end) {
            Some(b'u') if run % 2 == 1 => 4,
            Some(b'U') if run % 2 == 1 => 8,
            _ => 0,
        };
        if width == 0 {
            out.extend(std::iter::repeat_n('\\', run));
            i = run_end;
            continue;
        }
        out.extend(std::iter::repeat_n('\\', run - 1));
        let start = run_end + 1;
        let code = text
            .get(start..start + width)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                format!(
                    "truncated \\{} escape at position {}",
                    text[run_end] as char,
                    run_end - 1
                )
            })?;
        let ch = char::from_u32(code).ok_or_else(|| {
            format!(
                "\\U{code:08x} at position {} is not a Unicode scalar value",
                run_end - 1
            )
        })?;
        out.push(ch);
        i = start + width;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        assert_eq!(parse_decimal(b"-42").unwrap(), Value::Int(-42));
        assert_eq!(parse_decimal(b" 7 ").unwrap(), Value::Int(7));
        assert_eq!(
            parse_decimal(b"-9223372036854775808").unwrap(),
            Value::Int(i64::MIN)
        );
        let big = parse_decimal(b"123456789012345678901234567890").unwrap();
        match big {
            Value::BigInt(b) => {
                assert_eq!(b.to_string(), "123456789012345678901234567890")
            }
            other => panic!("{other:?}"),
        }
        match parse_decimal(b"-9223372036854775809").unwrap() {
            Value::BigInt(b) => assert_eq!(b.to_string(), "-9223372036854775809"),
            other => panic!("{other:?}"),
        }
        assert!(parse_decimal(b"0x10").is_err());
        assert!(parse_decimal(b"").is_err());
        assert!(parse_decimal(&vec![b'1'; 5000]).is_err());
    }

    #[test]
    fn strings() {
        assert_eq!(
            unquote_string(b"'a\\'b\\n\\x41\\101\\q'").unwrap(),
            b"a'b\nAA\\q"
        );
        assert!(unquote_string(b"'abc").is_err());
        assert!(unquote_string(b"'\\x4'").is_err());
        assert_eq!(
            raw_unicode_unescape(b"a\\u00e9\\U0001F600").unwrap(),
            "a\u{e9}\u{1F600}"
        );
        assert_eq!(raw_unicode_unescape(b"\\\\u0041").unwrap(), "\\\\u0041");
        assert_eq!(raw_unicode_unescape(b"\\\\\\u0041").unwrap(), "\\\\A");
        assert_eq!(raw_unicode_unescape(b"\xe9").unwrap(), "\u{e9}");
        assert!(raw_unicode_unescape(b"\\u12").is_err());
        assert!(raw_unicode_unescape(b"\\UFFFFFFFF").is_err());
    }
}
