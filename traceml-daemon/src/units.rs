//! Numbers with units as people read them: percent, milliseconds, durations, bytes (decimal for
//! transfers, binary for memory sizes). Used by the rules' messages and the renderers.

/// "62%" (or "0.4%" below 1 %).
pub fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p > 0.0 && p < 1.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// "74.1 ms", "1.25 s", "—".
pub fn ms(x: Option<f64>) -> String {
    match x {
        None => "—".to_owned(),
        Some(v) if v >= 10_000.0 => format!("{:.1} s", v / 1000.0),
        Some(v) if v >= 100.0 => format!("{v:.0} ms"),
        Some(v) if v >= 10.0 => format!("{v:.1} ms"),
        Some(v) => format!("{v:.2} ms"),
    }
}

/// "6.3 MB", "512 KB", "3.2 GiB" style: decimal units for transfers.
pub fn bytes_dec(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0} KB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// Binary units for memory sizes.
pub fn bytes_bin(b: u64) -> String {
    let b = b as f64;
    const GI: f64 = (1u64 << 30) as f64;
    const MI: f64 = (1u64 << 20) as f64;
    if b >= GI {
        format!("{:.1} GiB", b / GI)
    } else if b >= MI {
        format!("{:.0} MiB", b / MI)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

/// "2 m 03 s", "20.6 s", "1 h 02 m".
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "—".to_owned();
    }
    let s = secs.round() as u64;
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if s < 3600 {
        format!("{} m {:02} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} m", s / 3600, (s % 3600) / 60)
    }
}

/// A p-value: "<0.001", "0.042", "—".
pub fn p_value(p: Option<f64>) -> String {
    match p {
        None => "—".to_owned(),
        Some(p) if p < 0.001 => "<0.001".to_owned(),
        Some(p) => format!("{p:.3}"),
    }
}

/// `20261231-010101`: a UTC time for file and directory names.
pub fn utc_stamp(unix_s: u64) -> String {
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_stamps() {
        assert_eq!(super::utc_stamp(0), "19700101-000000");
        assert_eq!(super::utc_stamp(1_798_675_200 + 3_661), "20261231-010101");
    }
}
