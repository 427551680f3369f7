//! Instants as text: human durations, RFC 3339 formatting and the fast
//! timestamp parser for input records (RFC 3339 strings or epoch millis).
//! Every instant is `i64` microseconds since the Unix epoch (UTC).

pub const MICROS_PER_SECOND: i64 = 1_000_000;

/// The wall clock, in microseconds since the Unix epoch (0 before it).
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The wall clock, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    now_micros() / 1000
}

/// Parses a human duration such as `5s`, `250ms`, `1m`, `2h`, `1d`, `0`.
pub fn parse_duration(text: &str) -> Option<i64> {
    let t = text.trim();
    if t == "0" {
        return Some(0);
    }
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = t.split_at(split);
    let n: i64 = num.parse().ok()?;
    let mul = match unit.trim() {
        "us" | "µs" => 1,
        "ms" => 1000,
        "s" | "sec" | "second" | "seconds" => MICROS_PER_SECOND,
        "m" | "min" | "minute" | "minutes" => 60 * MICROS_PER_SECOND,
        "h" | "hour" | "hours" => 3600 * MICROS_PER_SECOND,
        "d" | "day" | "days" => 86_400 * MICROS_PER_SECOND,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Formats microseconds as `2026-11-29T15:01:00.000000Z` into `out`, without allocating.
pub fn write_rfc3339_micros(out: &mut Vec<u8>, micros: i64) {
    let secs = micros.div_euclid(MICROS_PER_SECOND);
    let frac = micros.rem_euclid(MICROS_PER_SECOND) as u32;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400) as u32;
    let (y, m, d) = civil_from_days(days);
    let mut buf = [0u8; 32];
    let mut i = 0;
    if !(0..=9999).contains(&y) {
        // Outside four-digit years RFC 3339 has no form; ISO 8601 expanded years keep order.
        let s = format!("{y:+07}");
        out.extend_from_slice(s.as_bytes());
    } else {
        let y = y as u32;
        for v in [y / 1000, (y / 100) % 10, (y / 10) % 10, y % 10] {
            buf[i] = b'0' + v as u8;
            i += 1;
        }
    }
    let two = |buf: &mut [u8; 32], i: &mut usize, v: u32| {
        buf[*i] = b'0' + (v / 10) as u8;
        buf[*i + 1] = b'0' + (v % 10) as u8;
        *i += 2;
    };
    buf[i] = b'-';
    i += 1;
    two(&mut buf, &mut i, m);
    buf[i] = b'-';
    i += 1;
    two(&mut buf, &mut i, d);
    buf[i] = b'T';
    i += 1;
    two(&mut buf, &mut i, sod / 3600);
    buf[i] = b':';
    i += 1;
    two(&mut buf, &mut i, (sod / 60) % 60);
    buf[i] = b':';
    i += 1;
    two(&mut buf, &mut i, sod % 60);
    buf[i] = b'.';
    i += 1;
    let mut f = frac;
    for k in (0..6).rev() {
        buf[i + k] = b'0' + (f % 10) as u8;
        f /= 10;
    }
    i += 6;
    buf[i] = b'Z';
    i += 1;
    out.extend_from_slice(&buf[..i]);
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) to days since 1970-01-01.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
// ---- parsing timestamps of input records

/// What a number in a TIMESTAMP column counts since the epoch:
/// milliseconds unless the source says otherwise (a `timestamp_unit=`
/// option, or Debezium's `io.debezium.time.MicroTimestamp` in a change
/// event's schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum EpochUnit {
    Seconds,
    #[default]
    Millis,
    Micros,
    Nanos,
    /// Days (a DATE written as a number, as Connect's `Date` is).
    Days,
}

impl EpochUnit {
    /// The unit a `timestamp_unit=` option names.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "s" => EpochUnit::Seconds,
            "ms" => EpochUnit::Millis,
            "us" => EpochUnit::Micros,
            "ns" => EpochUnit::Nanos,
            _ => return None,
        })
    }

    /// The name [`Self::parse`] reads (`days` has none there).
    pub fn name(self) -> &'static str {
        match self {
            EpochUnit::Seconds => "s",
            EpochUnit::Millis => "ms",
            EpochUnit::Micros => "us",
            EpochUnit::Nanos => "ns",
            EpochUnit::Days => "days",
        }
    }

    /// The unit's name in messages: "epoch {plural}".
    pub fn plural(self) -> &'static str {
        match self {
            EpochUnit::Seconds => "seconds",
            EpochUnit::Millis => "milliseconds",
            EpochUnit::Micros => "microseconds",
            EpochUnit::Nanos => "nanoseconds",
            EpochUnit::Days => "days",
        }
    }

    /// `count` of this unit in microseconds (rounded down), if in range.
    fn micros(self, count: i64) -> Option<i64> {
        match self {
            EpochUnit::Seconds => count.checked_mul(1_000_000),
            EpochUnit::Millis => count.checked_mul(1000),
            EpochUnit::Micros => Some(count),
            EpochUnit::Nanos => Some(count.div_euclid(1000)),
            EpochUnit::Days => count.checked_mul(86_400_000_000),
        }
    }

    fn micros_per_unit(self) -> f64 {
        match self {
            EpochUnit::Seconds => 1e6,
            EpochUnit::Millis => 1e3,
            EpochUnit::Micros => 1.0,
            EpochUnit::Nanos => 1e-3,
            EpochUnit::Days => 86_400e6,
        }
    }
}

/// Microseconds since the epoch (UTC), or `None` if `s` is not a timestamp:
/// RFC 3339, or a number of epoch milliseconds.
pub fn parse_timestamp_micros(s: &[u8]) -> Option<i64> {
    parse_timestamp_micros_in(s, EpochUnit::Millis)
}

/// As [`parse_timestamp_micros`], a number counting `unit`s.
pub fn parse_timestamp_micros_in(s: &[u8], unit: EpochUnit) -> Option<i64> {
    let s = trim(s);
    if s.is_empty() {
        return None;
    }
    if s.len() < 10 || s[4] != b'-' {
        return parse_epoch(s, unit);
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

fn parse_epoch(s: &[u8], unit: EpochUnit) -> Option<i64> {
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
        return unit.micros(v);
    }
    // Fractional or exponent form: units as a float.
    let f: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    let micros = (f * unit.micros_per_unit()).round();
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

/// An RFC 3339 timestamp (or epoch milliseconds) as text.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    parse_timestamp_micros(s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_fixed_precision() {
        let mut out = Vec::new();
        write_rfc3339_micros(&mut out, 1_764_428_460_000_000);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "2025-11-29T15:01:00.000000Z"
        );
        out.clear();
        write_rfc3339_micros(&mut out, -1);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "1969-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn civil_round_trip() {
        for z in [-800_000i64, -1, 0, 1, 59, 60, 365, 20_000, 2_000_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }

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
