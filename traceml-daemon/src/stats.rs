//! Statistics over samples: mean, quantiles and medians of the finite values, and the
//! Mann-Whitney U test that `compare` uses on per-step distributions.

/// `Some(x)` when `x` is finite.
pub fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// Mean of the finite values; `None` when there are none.
pub fn mean(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0u64);
    for x in xs.into_iter().filter(|x| x.is_finite()) {
        sum += x;
        n += 1;
    }
    if n == 0 { None } else { finite(sum / n as f64) }
}

/// Linear-interpolated quantile `q` (0–1) of the finite values; `None` when there are none.
pub fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    finite(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// [`quantile`] 0.5.
pub fn median(xs: &[f64]) -> Option<f64> {
    quantile(xs, 0.5)
}

/// The middle element (the upper one of an even count); `None` when empty.
pub fn median_u64(xs: &[u64]) -> Option<u64> {
    let mut v = xs.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

/// Two-sided p-value of the Mann-Whitney U test (normal approximation with tie correction and
/// continuity correction); `None` when either sample has no finite values. Identical constant
/// samples give 1.
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> Option<f64> {
    let a: Vec<f64> = a.iter().copied().filter(|x| x.is_finite()).collect();
    let b: Vec<f64> = b.iter().copied().filter(|x| x.is_finite()).collect();
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut r1, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1..=j+1 share their average.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        r1 += rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let u1 = r1 - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let nf = n as f64;
    let var = n1 * n2 / 12.0 * ((nf + 1.0) - ties / (nf * (nf - 1.0)).max(1.0));
    if var <= 0.0 || !var.is_finite() {
        return Some(1.0);
    }
    let z = ((u1 - mu).abs() - 0.5).max(0.0) / var.sqrt();
    Some(erfc(z / std::f64::consts::SQRT_2).clamp(0.0, 1.0))
}

/// Complementary error function (Numerical Recipes' `erfcc`, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_and_skip_nan() {
        let xs = [1.0, 2.0, f64::NAN, 3.0, 4.0];
        assert_eq!(median(&xs), Some(2.5));
        assert!((quantile(&xs, 0.9).unwrap() - 3.7).abs() < 1e-9);
        assert_eq!(median(&[]), None);
        assert_eq!(mean([f64::NAN, f64::INFINITY]), None);
    }

    #[test]
    fn erfc_and_mann_whitney() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-6);
        assert!((erfc(1.0) - 0.157_299_2).abs() < 1e-6);
        assert!((erfc(-1.0) - 1.842_700_8).abs() < 1e-6);
        let a: Vec<f64> = (0..50).map(f64::from).collect();
        assert!(mann_whitney_p(&a, &a).unwrap() > 0.9);
        let b: Vec<f64> = (100..150).map(f64::from).collect();
        assert!(mann_whitney_p(&a, &b).unwrap() < 1e-6);
        assert_eq!(mann_whitney_p(&[1.0; 20], &[1.0; 20]), Some(1.0));
        assert_eq!(mann_whitney_p(&[], &[1.0]), None);
        assert_eq!(mann_whitney_p(&[f64::NAN], &[1.0]), None);
    }
}
