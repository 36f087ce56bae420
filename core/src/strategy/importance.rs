//! The importance score of a unit, in fixed point so a history scores the same on every target: `0.3·recency + 0.2·references + 0.4·task_relevance + 0.1·explicit`, each part in
//! thousandths.

use super::{Env, UnitView};
use crate::terms::WordSet;

/// Milliseconds in a minute: the caller's clock is in milliseconds by convention.
const MINUTE: u64 = 60_000;
/// References at which the references part is full.
const FULL_REFERENCES: u32 = 5;

/// A unit's importance and its parts, each in thousandths (0..=1000).
///
/// ```
/// use ctxwin_core::strategy::ImportanceScore;
/// let score = ImportanceScore::combine(1000, 0, 1000, 0);
/// assert_eq!(score.total, 700);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportanceScore {
    /// `1000 / (1 + minutes since the unit's newest message)`.
    pub recency: u32,
    /// Later messages mentioning one of its identifiers, paths or numbers (5 or more = 1000).
    pub references: u32,
    /// Share of the current request's content words and terms it contains; while a task
    /// runs, the best of that, the share of the task's goal, and a relevance the caller
    /// supplied (`ContextManager::set_task_relevance`, `tasks` feature).
    pub task_relevance: u32,
    /// 1000 if the caller marked it important.
    pub explicit: u32,
    /// The weighted total.
    pub total: u32,
}

impl ImportanceScore {
    /// The weighted total of four parts in thousandths.
    pub const fn combine(
        recency: u32,
        references: u32,
        task_relevance: u32,
        explicit: u32,
    ) -> Self {
        let total =
            (300 * recency + 200 * references + 400 * task_relevance + 100 * explicit) / 1000;
        ImportanceScore { recency, references, task_relevance, explicit, total }
    }
}

/// Scores `unit` against the manager's clock, later history and current task; see the
/// strategy tests for worked examples.
pub fn importance(unit: &UnitView<'_>, env: &Env<'_>) -> ImportanceScore {
    let minutes = env.now().saturating_sub(unit.newest_timestamp()) / MINUTE;
    let recency = (1000 / minutes.saturating_add(1)) as u32;
    let references = env.references(unit).min(FULL_REFERENCES) * (1000 / FULL_REFERENCES);
    let task_relevance = task_relevance(unit, env);
    let explicit = if unit.is_important() { 1000 } else { 0 };
    ImportanceScore::combine(recency, references, task_relevance, explicit)
}

/// How relevant `unit` is to the current task, in thousandths: the share of the current
/// request's (the newest user message's) content words and terms it contains, or while a task
/// runs [`running_task_relevance`].
fn task_relevance(unit: &UnitView<'_>, env: &Env<'_>) -> u32 {
    let request = WordSet::of(env.task());
    #[cfg(feature = "tasks")]
    if let Some(goal) = env.task_goal() {
        return running_task_relevance(unit, env, &request, goal);
    }
    if request.len() == 0 {
        0
    } else {
        let found = request.found_in(unit.messages().flat_map(|m| {
            core::iter::once(m.content()).chain(m.tool_calls().map(|c| c.arguments))
        }));
        (found * 1000 / request.len()) as u32
    }
}

/// While a task runs: the best of the unit's share of the current `request`'s words, its
/// share of the task's `goal`'s, and the relevance the caller supplied for it (an embedder's
/// similarity to the goal).
#[cfg(feature = "tasks")]
fn running_task_relevance(
    unit: &UnitView<'_>,
    env: &Env<'_>,
    request: &WordSet,
    goal: &str,
) -> u32 {
    let goal = WordSet::of(goal);
    let texts = unit
        .messages()
        .flat_map(|m| core::iter::once(m.content()).chain(m.tool_calls().map(|c| c.arguments)));
    let [by_request, by_goal] = WordSet::found_in_each([request, &goal], texts);
    let share = |found: usize, of: usize| (found * 1000).checked_div(of).unwrap_or(0) as u32;
    let lexical = share(by_request, request.len()).max(share(by_goal, goal.len()));
    lexical.max(env.supplied_relevance(unit).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::TinyCapacities;
    use crate::config::{Config, StrategyKind};
    use crate::manager::ContextManager;
    use crate::message::Message;

    const MINUTE: u64 = 60_000;

    #[test]
    fn importance_formula_in_fixed_point() {
        let config =
            Config { strategy: StrategyKind::Importance, locked_tail: 6, ..Config::DEFAULT };
        let mut m = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        m.push(Message::assistant("Config lives in src/config.rs").at(0)).unwrap();
        m.push(Message::user("open src/config.rs and fix the parser").at(2 * MINUTE)).unwrap();
        let (unit, env) = m.unit_and_env(0).unwrap();
        let score = importance(&unit, &env);
        assert_eq!(score.recency, 333, "two minutes old: 1000 / 3");
        assert_eq!(score.references, 200, "mentioned once later");
        assert_eq!(
            score.task_relevance, 333,
            "one of the task's three: open, src/config.rs, parser"
        );
        assert_eq!(score.explicit, 0);
        assert_eq!(score.total, (300 * 333 + 200 * 200 + 400 * 333) / 1000);
    }
}
