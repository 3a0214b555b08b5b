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

/// Steps in a group: at least this many and [`GROUP_MIN_SHARE`] of them.
pub const GROUP_MIN_STEPS: usize = 3;
pub const GROUP_MIN_SHARE: f64 = 0.05;
/// The gap between two groups: the slower group's fastest step at least this many times the
/// faster group's slowest ...
pub const GROUP_GAP_RATIO: f64 = 1.5;
/// ... and the gap at least this many times the wider group's interquartile range.
pub const GROUP_GAP_SPREADS: f64 = 3.0;

/// Whether values (step times) fall into two separate groups: split at the widest gap between
/// consecutive sorted values (as a ratio), kept when each side holds [`GROUP_MIN_STEPS`] and
/// [`GROUP_MIN_SHARE`] of the values, the upper side's smallest is [`GROUP_GAP_RATIO`] times the
/// lower side's largest, and the gap is [`GROUP_GAP_SPREADS`] times the wider side's
/// interquartile range (no value near it). The two sides sorted, lower first; `None` when the
/// values form one group.
pub fn two_groups(xs: &[f64]) -> Option<(Vec<f64>, Vec<f64>)> {
    let mut v: Vec<f64> = xs
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let min_side = GROUP_MIN_STEPS.max((GROUP_MIN_SHARE * n as f64).ceil() as usize);
    if n < 2 * min_side {
        return None;
    }
    // The widest gap with enough values on each side: v[k - 1] | v[k].
    let k = (min_side..=n - min_side)
        .max_by(|&a, &b| (v[a] / v[a - 1]).total_cmp(&(v[b] / v[b - 1])))?;
    let (lo, hi) = v.split_at(k);
    let iqr = |g: &[f64]| quantile(g, 0.75).unwrap_or(0.0) - quantile(g, 0.25).unwrap_or(0.0);
    let (top, bottom) = (lo[lo.len() - 1], hi[0]);
    (bottom >= GROUP_GAP_RATIO * top && bottom - top >= GROUP_GAP_SPREADS * iqr(lo).max(iqr(hi)))
        .then(|| (lo.to_vec(), hi.to_vec()))
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

    /// Issue 56's boundaries: workers delivering in pairs make two groups; one noisy group, a
    /// couple of slow learning steps and a smooth spread make none; a periodic checkpoint step
    /// in 1 of 10 makes a small group.
    #[test]
    fn values_in_two_separate_groups() {
        // 2 workers, batches in pairs: ~110 ms and ~20 ms alternating, none between.
        let pairs: Vec<f64> = (0..40)
            .map(|i| {
                let j = (i * 7 % 5) as f64;
                if i % 2 == 0 {
                    108.0 + j
                } else {
                    19.0 + j / 2.0
                }
            })
            .collect();
        let (lo, hi) = two_groups(&pairs).unwrap();
        assert_eq!((lo.len(), hi.len()), (20, 20));
        assert!((median(&hi).unwrap() - 110.0).abs() < 2.0);
        assert!((median(&lo).unwrap() - 20.0).abs() < 1.0);
        // One group with noise (±20 %): none.
        let noisy: Vec<f64> = (0..60)
            .map(|i| 50.0 + ((i * 13) % 21) as f64 - 10.0)
            .collect();
        assert_eq!(two_groups(&noisy), None);
        // Two slow learning steps among 60: too few for a group.
        let mut learning = vec![20.0; 58];
        learning.extend([200.0, 180.0]);
        assert_eq!(two_groups(&learning), None);
        // A smooth spread from 10 to 100 ms: no gap.
        let smooth: Vec<f64> = (0..60).map(|i| 10.0 + 1.5 * i as f64).collect();
        assert_eq!(two_groups(&smooth), None);
        // A checkpoint step every 10th: 6 of 60 at ~500 ms.
        let ckpt: Vec<f64> = (0..60)
            .map(|i| {
                if i % 10 == 9 {
                    500.0
                } else {
                    40.0 + (i % 3) as f64
                }
            })
            .collect();
        let (lo, hi) = two_groups(&ckpt).unwrap();
        assert_eq!((lo.len(), hi.len()), (54, 6));
    }
}
