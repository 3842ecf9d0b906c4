//! Byte counts on the command line: `4096`, `4k`, `1M`, `1GiB`, `0x1000`.
//!
//! Every suffix is a power of 1024, as block sizes are: `k`/`K`/`KB`/`KiB`
//! = 1024, `m`/`M`/`MB`/`MiB` = 1024², `g`/`G`/`GB`/`GiB` = 1024³,
//! `t`/`T`/`TB`/`TiB` = 1024⁴ (the suffix is case-insensitive). A plain number
//! is bytes; `0x` introduces hex bytes. Output uses the largest exact unit
//! ([`format_bytes`]).

use std::fmt;

/// Why a byte count did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError {
    /// What was given.
    found: String,
    /// What is wrong with it.
    reason: &'static str,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected a byte count like 4096, 4k, 1M or 1GiB (suffixes are powers of 1024), found {:?}",
            self.reason, self.found
        )
    }
}

impl std::error::Error for SizeError {}

/// Parses a byte count (see the module docs).
///
/// # Errors
///
/// [`SizeError`] naming the text and what is wrong: no digits, an unknown
/// suffix, or a value beyond `u64`.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let error = |reason| SizeError {
        found: text.to_owned(),
        reason,
    };
    let trimmed = text.trim();
    if let Some(hex) = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
    {
        return u64::from_str_radix(hex, 16).map_err(|_| error("bad hex number"));
    }
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(error("no digits"));
    }
    let value: u64 = digits.parse().map_err(|_| error("number too large"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(error("unknown suffix")),
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| error("number too large"))
}

/// `4KiB`, `1MiB`, `4097B`: the largest unit that divides the value.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        if bytes != 0 && bytes % (1u64 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// `79.8MiB`, `4.0KiB`, `512B`: a total rounded to one decimal in the
/// largest unit it reaches.
pub fn format_bytes_approx(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        if bytes >= 1u64 << shift {
            return format!("{:.1}{unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("4K"), Ok(4096));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("1M"), Ok(1 << 20));
        assert_eq!(parse_bytes("1MB"), Ok(1 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2t"), Ok(2 << 40));
        assert_eq!(parse_bytes("0x1000"), Ok(4096));
        assert_eq!(parse_bytes("512b"), Ok(512));
    }

    #[test]
    fn refuses_garbage() {
        let error = parse_bytes("12XB").unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown suffix: expected a byte count like 4096, 4k, 1M or 1GiB (suffixes are powers of 1024), found \"12XB\""
        );
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("k").is_err());
        assert!(parse_bytes("-4k").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert!(parse_bytes("18446744073709551616").is_err());
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_bytes(4096), "4KiB");
        assert_eq!(format_bytes(1 << 20), "1MiB");
        assert_eq!(format_bytes(3 << 30), "3GiB");
        assert_eq!(format_bytes(4097), "4097B");
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_bytes_approx(81_740 * 1024), "79.8MiB");
        assert_eq!(format_bytes_approx(4096), "4.0KiB");
        assert_eq!(format_bytes_approx(512), "512B");
    }
}
