//! Vector arithmetic for ranking: unit length and cosine similarity.

/// Cosine similarity of `a` and `b` (0 when either is all zeros or their lengths differ).
///
/// ```
/// use ctxwin_std::embed::cosine;
/// assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
/// assert_eq!(cosine(&[1.0, 0.0], &[0.0, 3.0]), 0.0);
/// assert_eq!(cosine(&[1.0], &[1.0, 2.0]), 0.0);
/// ```
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut aa, mut bb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 { 0.0 } else { dot / (aa.sqrt() * bb.sqrt()) }
}

/// `v` scaled to unit length (all zeros stay zeros), so that a dot product is the cosine.
///
/// ```
/// let v = ctxwin_std::embed::normalized(vec![3.0, 4.0]);
/// assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
/// ```
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x /= norm;
        }
    }
    v
}
