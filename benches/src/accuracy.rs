//! Error statistics of an estimate against exact counts.

/// How far estimates are from exact counts, relative to the exact count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accuracy {
    /// Pairs measured (pairs whose exact count is 0 are skipped).
    pub count: usize,
    /// Mean of |estimate − exact| / exact.
    pub mean_abs_error: f64,
    /// Mean of (estimate − exact) / exact: the bias.
    pub mean_error: f64,
    /// Share of pairs with estimate < exact.
    pub share_under: f64,
    /// Most negative (estimate − exact) / exact, or 0 when nothing is under.
    pub worst_under: f64,
}

impl Accuracy {
    /// Statistics of `(estimate, exact)` pairs.
    ///
    /// ```
    /// use ctxwin_benches::accuracy::Accuracy;
    /// let a = Accuracy::of([(90, 100), (120, 100), (100, 100), (5, 0)]);
    /// assert_eq!(a.count, 3);
    /// assert!((a.mean_abs_error - 0.1).abs() < 1e-9);
    /// assert!((a.share_under - 1.0 / 3.0).abs() < 1e-9);
    /// assert!((a.worst_under + 0.1).abs() < 1e-9);
    /// ```
    pub fn of(pairs: impl IntoIterator<Item = (u64, u64)>) -> Accuracy {
        let (mut count, mut abs, mut signed, mut under, mut worst) =
            (0usize, 0.0, 0.0, 0usize, 0.0f64);
        for (estimate, exact) in pairs {
            if exact == 0 {
                continue;
            }
            let error = (estimate as f64 - exact as f64) / exact as f64;
            count += 1;
            abs += error.abs();
            signed += error;
            if estimate < exact {
                under += 1;
                worst = worst.min(error);
            }
        }
        let n = count.max(1) as f64;
        Accuracy {
            count,
            mean_abs_error: abs / n,
            mean_error: signed / n,
            share_under: under as f64 / n,
            worst_under: worst,
        }
    }
}

/// `(estimate, exact)` totals of every run of `window` consecutive pairs (sliding by one).
///
/// ```
/// use ctxwin_benches::accuracy::window_totals;
/// let totals = window_totals(&[(1, 2), (3, 4), (5, 6)], 2);
/// assert_eq!(totals, [(4, 6), (8, 10)]);
/// assert!(window_totals(&[(1, 2)], 2).is_empty());
/// ```
pub fn window_totals(pairs: &[(u64, u64)], window: usize) -> Vec<(u64, u64)> {
    if window == 0 {
        return Vec::new();
    }
    pairs
        .windows(window)
        .map(|run| run.iter().fold((0, 0), |(e, x), (estimate, exact)| (e + estimate, x + exact)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_under_gives_zero_worst_and_share() {
        let a = Accuracy::of([(110, 100), (200, 100)]);
        assert_eq!((a.share_under, a.worst_under), (0.0, 0.0));
        assert!((a.mean_error - 0.55).abs() < 1e-9);
    }

    #[test]
    fn empty_input_is_all_zero() {
        let a = Accuracy::of([]);
        assert_eq!(a.count, 0);
        assert_eq!(a.mean_abs_error, 0.0);
    }
}
