//! Human durations: `250ms`, `30s`, `10m`, `1h`, `7d`, and sums like `1h30m`.

use std::time::Duration;

/// Parses a duration such as `500ms`, `30s`, `10m`, `1h30m` or `7d`.
/// A bare number is refused: a unit is always required, so `30` is never
/// silently read as seconds when milliseconds were meant.
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration (write e.g. 500ms, 30s, 10m, 1h)".into());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {text:?} (write e.g. 500ms, 30s, 10m, 1h)"));
        }
        let value: u128 = rest[..digits].parse().map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let millis_per_unit: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("invalid duration {text:?}: missing unit (ms, s, m, h or d)")),
            unit => return Err(format!("invalid duration {text:?}: unknown unit {unit:?} (ms, s, m, h or d)")),
        };
        rest = &rest[unit_len..];
        total = total
            .checked_add(value.saturating_mul(millis_per_unit))
            .filter(|t| *t <= u64::MAX as u128)
            .ok_or_else(|| format!("invalid duration {text:?}: too large"))?;
    }
    if total > MAX.as_millis() {
        return Err(format!("invalid duration {text:?}: longer than the limit of 3650d (10 years)"));
    }
    Ok(Duration::from_millis(total as u64))
}

/// The longest duration anything in Composer may be given: 10 years.
pub const MAX: Duration = Duration::from_secs(3650 * 86_400);

/// Formats a duration in the same notation [`parse`] accepts.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_at_ten_years() {
        assert_eq!(parse("3650d").unwrap(), MAX);
        let e = parse("3651d").unwrap_err();
        assert!(e.contains("10 years"), "{e}");
        assert!(parse("100000000d").is_err());
        assert!(parse("99999999999999999999999d").is_err());
    }

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse(" 2s "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn refuses_bad_input_with_a_reason() {
        for bad in ["", "30", "s", "3x", "1.5s", "-1s", "99999999999999999999999d"] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
        assert!(parse("30").unwrap_err().contains("missing unit"));
    }

    #[test]
    fn format_round_trips() {
        for text in ["500ms", "30s", "10m", "1h", "7d", "1500ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
