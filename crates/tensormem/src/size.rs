//! Parsing byte sizes given on the command line (`80GiB`, `40GB`, `512MiB`, `1073741824`).

/// Parses a byte size: a number with an optional unit. Binary units (`KiB`, `MiB`, `GiB`,
/// `TiB`) are powers of 1024; decimal units (`KB`, `MB`, `GB`, `TB`) powers of 1000; `B` or no
/// unit means bytes. Units are case-insensitive; a fractional number is allowed with a unit
/// (`1.5GiB`).
///
/// # Errors
/// A message naming the input and the accepted forms.
pub fn parse_size(input: &str) -> Result<usize, String> {
    let s = input.trim();
    if s.starts_with('-') {
        return Err(format!(
            "invalid size '{input}': a size cannot be negative (expected e.g. 40GiB)"
        ));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "invalid size '{input}': unknown unit '{unit}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid size '{input}': expected a number such as 80GiB"))?;
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        return Err(format!("invalid size '{input}': out of range"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("40GB"), Ok(40_000_000_000));
        assert_eq!(parse_size("1.5gib"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_size("GiB").unwrap_err().contains("expected a number"));
        assert!(parse_size("0").is_err());
        // A new user's `--device-memory=-5`: the sign is named, not taken for a unit.
        assert_eq!(
            parse_size("-5"),
            Err("invalid size '-5': a size cannot be negative (expected e.g. 40GiB)".into())
        );
        assert_eq!(parse_size("+2KiB"), Ok(2048));
    }
}
