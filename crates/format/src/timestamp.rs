//! Timestamps in input records: RFC 3339 strings (`2026-11-29T15:01:00.123Z`,
//! with an offset, a space for `T`, or a date alone) or epoch milliseconds
//! (a JSON number or a digit string). Parsed by hand, without allocating:
//! this runs once per row on the ingest hot path.

use ubik_engine::time::days_from_civil;

/// Microseconds since the epoch (UTC), or `None` if `s` is not a timestamp.
pub fn parse_timestamp_micros(s: &[u8]) -> Option<i64> {
    let s = trim(s);
    if s.is_empty() {
        return None;
    }
    if s.len() < 10 || s[4] != b'-' {
        return parse_epoch_millis(s);
    }
    let year = digits(&s[0..4])? as i64;
    let month = digits(&s[5..7])? as u32;
    if s[7] != b'-' {
        return None;
    }
    let day = digits(&s[8..10])? as u32;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let mut micros = days.checked_mul(86_400_000_000)?;
    let rest = &s[10..];
    if rest.is_empty() {
        return Some(micros);
    }
    if !(rest[0] == b'T' || rest[0] == b't' || rest[0] == b' ') || rest.len() < 6 {
        return None;
    }
    let hour = digits(&rest[1..3])? as i64;
    if rest[3] != b':' {
        return None;
    }
    let minute = digits(&rest[4..6])? as i64;
    let mut i = 6;
    let mut second = 0i64;
    if rest.len() > i && rest[i] == b':' {
        second = digits(rest.get(i + 1..i + 3)?)? as i64;
        i += 3;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut frac_micros = 0i64;
    if rest.len() > i && (rest[i] == b'.' || rest[i] == b',') {
        i += 1;
        let start = i;
        let mut scale = 100_000i64;
        while i < rest.len() && rest[i].is_ascii_digit() {
            if scale > 0 {
                frac_micros += (rest[i] - b'0') as i64 * scale;
                scale /= 10;
            }
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset_secs: i64 = match rest.get(i) {
        None => 0,
        Some(b'Z') | Some(b'z') if i + 1 == rest.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let o = &rest[i + 1..];
            let (h, m) = match o.len() {
                2 => (digits(o)?, 0),
                4 => (digits(&o[0..2])?, digits(&o[2..4])?),
                5 if o[2] == b':' => (digits(&o[0..2])?, digits(&o[3..5])?),
                _ => return None,
            };
            let secs = (h as i64) * 3600 + (m as i64) * 60;
            if sign == b'+' { secs } else { -secs }
        }
        _ => return None,
    };
    micros = micros
        .checked_add(((hour * 3600 + minute * 60 + second) - offset_secs) * 1_000_000)?
        .checked_add(frac_micros)?;
    Some(micros)
}

fn parse_epoch_millis(s: &[u8]) -> Option<i64> {
    let (neg, body) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if body.is_empty() {
        return None;
    }
    if body.iter().all(u8::is_ascii_digit) && body.len() <= 18 {
        let v = digits(body)? as i64;
        let v = if neg { -v } else { v };
        return v.checked_mul(1000);
    }
    // Fractional or exponent form: milliseconds as a float.
    let f: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    let micros = (f * 1000.0).round();
    (micros.abs() < 9.0e18).then_some(micros as i64)
}

#[inline]
fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &s[start..end]
}

#[inline]
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (c - b'0') as u64;
    }
    Some(v)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_timestamp_micros as p;

    #[test]
    fn rfc3339_forms() {
        let base = 1_704_067_200_000_000; // 2024-01-01T00:00:00Z
        assert_eq!(p(b"2024-01-01T00:00:00Z"), Some(base));
        assert_eq!(p(b"2024-01-01T00:00:00.123Z"), Some(base + 123_000));
        assert_eq!(p(b"2024-01-01T00:00:00.1234567Z"), Some(base + 123_456));
        assert_eq!(p(b"2024-01-01 01:00:00+01:00"), Some(base));
        assert_eq!(p(b"2024-01-01T00:00"), Some(base));
        assert_eq!(p(b"2024-01-01"), Some(base));
        assert_eq!(p(b"2023-12-31T19:00:00-0500"), Some(base));
        assert_eq!(p(b"1704067200000"), Some(base));
        assert_eq!(p(b"1704067200000.5"), Some(base + 500));
        assert_eq!(p(b"-1000"), Some(-1_000_000));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "hello",
            "2024-13-01",
            "2024-02-30",
            "2024-01-01T25:00:00Z",
            "2024-01-01T00:00:00Q",
            "12ab",
        ] {
            assert_eq!(p(s.as_bytes()), None, "{s}");
        }
    }
}
