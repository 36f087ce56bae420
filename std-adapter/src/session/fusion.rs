//! Fusing the lexical (BM25) and the semantic (cosine) rankings of hybrid recall.

use ctxwin_core::Role;

use crate::store::ArchivedMessage;

/// One ranked candidate: score, id, author, text.
pub(crate) type Ranked = (f64, u64, Role, String);

/// How hybrid recall fuses the BM25 ranking with the cosine ranking.
///
/// ```
/// use ctxwin_std::session::Hybrid;
/// let rrf = Hybrid::ReciprocalRank { k: 60.0, lexical: 1.0, semantic: 1.0 };
/// // The best BM25 hit that is 10th by cosine, against the reverse: a tie.
/// assert_eq!(rrf.rank_score(Some(1), Some(10)), rrf.rank_score(Some(10), Some(1)));
/// assert_eq!(Hybrid::DEFAULT, Hybrid::Interleave);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Hybrid {
    /// Reciprocal rank fusion (Cormack et al., 2009): a candidate at 1-based rank `r` in a
    /// list scores `weight / (k + r)` for it, summed over both lists. Blind to how far apart
    /// scores are: a sure BM25 hit ranks with a weak cosine match of the same rank.
    ReciprocalRank {
        /// Rank offset (60 in the paper): larger flattens the gap between top and lower ranks.
        k: f64,
        /// Weight of the BM25 list.
        lexical: f64,
        /// Weight of the cosine list.
        semantic: f64,
    },
    /// Convex combination of normalized scores (Bruch et al., 2023, who found it ahead of RRF):
    /// `(1 − semantic) · bm25 / best bm25 + semantic · (cos − lowest) / (highest − lowest)`,
    /// lowest and highest over the candidates of both lists (a candidate missing from the BM25
    /// list has 0 there; every candidate has a cosine).
    Convex {
        /// Weight of the cosine part, 0 to 1.
        semantic: f64,
    },
    /// The two rankings taken in turns, rank by rank (BM25's first, then the cosine list's
    /// first, then each one's second…), a message already taken skipped. Parameter-free, and
    /// a sure BM25 hit keeps the place it has in the lexical ranking (at most doubled), which
    /// a score combination cannot promise when a payload has room for few messages.
    Interleave,
}

impl Hybrid {
    /// The two rankings interleaved ([`Hybrid::Interleave`]): parameter-free, and on the
    /// recall bench ahead of the convex combination at both budgets (README, "Recall").
    pub const DEFAULT: Self = Self::Interleave;

    /// The reciprocal-rank score of a candidate at 1-based ranks `lexical` and `semantic`
    /// (`None`: not in that list); 0 for the other fusions.
    pub fn rank_score(&self, lexical: Option<usize>, semantic: Option<usize>) -> f64 {
        let Self::ReciprocalRank { k, lexical: wl, semantic: ws } = *self else { return 0.0 };
        let part = |rank: Option<usize>, weight: f64| rank.map_or(0.0, |r| weight / (k + r as f64));
        part(lexical, wl) + part(semantic, ws)
    }
}

impl Default for Hybrid {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The lexical ranking (best first, scores positive) fused with the semantic one (`nearest`:
/// ids and cosines, best first); `extra` holds the messages only the semantic ranking found,
/// `cosine` gives any candidate's similarity to the query.
pub(crate) fn fuse(
    lexical: Vec<Ranked>,
    nearest: &[(u64, f32)],
    extra: Vec<ArchivedMessage>,
    cosine: impl Fn(u64) -> Option<f32>,
    hybrid: &Hybrid,
) -> Vec<Ranked> {
    let ranks: std::collections::HashMap<u64, usize> =
        nearest.iter().enumerate().map(|(i, &(id, _))| (id, i + 1)).collect();
    let extra = extra.into_iter().map(|m| (0.0, m.id, m.message.role, m.message.content));
    let mut fused: Vec<Ranked> = match *hybrid {
        Hybrid::Interleave => {
            let lexical_ids: Vec<u64> = lexical.iter().map(|r| r.1).collect();
            let mut pool: std::collections::HashMap<u64, Ranked> =
                lexical.into_iter().chain(extra).map(|r| (r.1, r)).collect();
            let mut order: Vec<Ranked> = Vec::with_capacity(pool.len());
            for i in 0..lexical_ids.len().max(nearest.len()) {
                for id in [lexical_ids.get(i), nearest.get(i).map(|n| &n.0)].into_iter().flatten() {
                    if let Some(hit) = pool.remove(id) {
                        order.push(hit);
                    }
                }
            }
            let count = order.len() as f64;
            order
                .into_iter()
                .enumerate()
                .map(|(i, (_, id, role, text))| (count - i as f64, id, role, text))
                .collect()
        }
        Hybrid::ReciprocalRank { .. } => lexical
            .into_iter()
            .enumerate()
            .map(|(i, (_, id, role, text))| (Some(i + 1), id, role, text))
            .chain(extra.map(|(_, id, role, text)| (None, id, role, text)))
            .map(|(rank, id, role, text)| {
                (hybrid.rank_score(rank, ranks.get(&id).copied()), id, role, text)
            })
            .collect(),
        Hybrid::Convex { semantic } => {
            let weight = semantic.clamp(0.0, 1.0);
            let best = lexical.iter().map(|r| r.0).fold(0.0, f64::max);
            let all: Vec<(f64, u64, Role, String, f64)> = lexical
                .into_iter()
                .map(|(score, id, role, text)| {
                    (if best > 0.0 { score / best } else { 0.0 }, id, role, text)
                })
                .chain(extra)
                .map(|(lex, id, role, text)| {
                    (lex, id, role, text, f64::from(cosine(id).unwrap_or(0.0)))
                })
                .collect();
            let low = all.iter().map(|c| c.4).fold(f64::INFINITY, f64::min);
            let high = all.iter().map(|c| c.4).fold(f64::NEG_INFINITY, f64::max);
            let span = if high > low { high - low } else { 1.0 };
            all.into_iter()
                .map(|(lex, id, role, text, cos)| {
                    ((1.0 - weight) * lex + weight * (cos - low) / span, id, role, text)
                })
                .collect()
        }
    };
    fused.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ChatMessage;

    fn lexical(ids: &[(u64, f64)]) -> Vec<Ranked> {
        ids.iter().map(|&(id, s)| (s, id, Role::User, format!("m{id}"))).collect()
    }

    fn order(fused: &[Ranked]) -> Vec<u64> {
        fused.iter().map(|r| r.1).collect()
    }

    #[test]
    fn interleave_alternates_the_lists_and_takes_each_message_once() {
        let only_semantic = ArchivedMessage::new(9, 9, ChatMessage::text(Role::User, "m9"));
        let fused = fuse(
            lexical(&[(1, 30.0), (2, 20.0), (3, 1.0)]),
            &[(9, 0.9), (1, 0.8), (3, 0.5)],
            vec![only_semantic],
            |_| None,
            &Hybrid::Interleave,
        );
        // Lexical first, cosine first, lexical second; 1 and 3 come once, from whichever list
        // reaches them first.
        assert_eq!(order(&fused), [1, 9, 2, 3]);
        assert!(fused.windows(2).all(|w| w[0].0 > w[1].0), "scores follow the order");
    }

    #[test]
    fn interleave_keeps_a_sure_lexical_hit_first_whatever_its_cosine() {
        let near = [(5, 0.99), (6, 0.98), (7, 0.97)];
        let extra = [5, 6, 7].map(|id| {
            ArchivedMessage::new(id, id, ChatMessage::text(Role::User, format!("m{id}")))
        });
        let fused =
            fuse(lexical(&[(1, 9.0)]), &near, extra.into(), |_| Some(0.0), &Hybrid::Interleave);
        assert_eq!(order(&fused), [1, 5, 6, 7]);
    }

    #[test]
    fn rrf_prefers_agreement_and_ignores_score_gaps() {
        let h = Hybrid::ReciprocalRank { k: 60.0, lexical: 1.0, semantic: 1.0 };
        assert!(h.rank_score(Some(3), Some(3)) > h.rank_score(Some(1), None));
        assert_eq!(h.rank_score(None, None), 0.0);
        let only_semantic = ArchivedMessage::new(9, 9, ChatMessage::text(Role::User, "m9"));
        let fused = fuse(
            lexical(&[(1, 30.0), (2, 1.0)]),
            &[(9, 0.9), (2, 0.5)],
            vec![only_semantic],
            |_| None,
            &h,
        );
        assert_eq!(order(&fused), [2, 9, 1]);
    }

    #[test]
    fn convex_keeps_a_sure_lexical_hit_first() {
        let cosines = |id: u64| {
            Some(match id {
                1 => 0.2,
                2 => 0.5,
                9 => 0.9,
                _ => 0.0,
            })
        };
        let only_semantic = ArchivedMessage::new(9, 9, ChatMessage::text(Role::User, "m9"));
        let fused = fuse(
            lexical(&[(1, 30.0), (2, 1.0)]),
            &[(9, 0.9), (2, 0.5)],
            vec![only_semantic],
            cosines,
            &Hybrid::Convex { semantic: 0.5 },
        );
        // 1: 0.5·1 + 0 = 0.5; 9: 0 + 0.5·1 = 0.5 (newer id first on a tie); 2: 0.5·(1/30) + 0.5·(3/7).
        assert_eq!(order(&fused), [9, 1, 2]);
        let lexical_only = fuse(
            lexical(&[(1, 30.0), (2, 1.0)]),
            &[(9, 0.9)],
            vec![ArchivedMessage::new(9, 9, ChatMessage::text(Role::User, "m9"))],
            cosines,
            &Hybrid::Convex { semantic: 0.0 },
        );
        assert_eq!(order(&lexical_only), [1, 2, 9]);
    }
}
