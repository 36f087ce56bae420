//! Evidence recall on long generated chats (`ctxwin_benches::longchat`): for each question a
//! session is built from the conversation (in-memory archive), the question is pushed as the
//! live user message and the payload composed under the budget; the score is the share of the
//! question's answer turns present verbatim in the payload.
//!
//! Rows: ctxwin with recall for the live request (the default); ctxwin with main's explicit
//! retrieval path (`retrieve(question, 5 items, 8,000 chars)` then `compose`, which evicts to
//! fit); ctxwin without retrieval; the half-recent/half-BM25 baseline (newest turns in half
//! the budget, the archive's BM25 top turns in the other half, same archive and counter); the
//! newest turns that fit (a plain trim). Then the time retrieval adds to a build on a
//! 10,000-message archive.
//!
//! `cargo run --release -p ctxwin-benches --bin recall` (`RECALL_CHATS`, `RECALL_SEED`,
//! `RECALL_QUESTIONS` = questions per chat, sampled evenly, default 40; `RECALL_TIMING=0`
//! skips the timing, `RECALL_RECENCY` and `RECALL_NEIGHBOURS=0` change those retrieval
//! settings, `RECALL_EXAMPLES=1` prints the unmatched questions of the first two kinds).
//!
//! With `CTXWIN_EMBED_URL` set (an OpenAI-compatible `/v1/embeddings` server, e.g.
//! `scripts/embed-server.sh start`; model name from `CTXWIN_EMBED_MODEL`, default
//! `all-MiniLM-L6-v2`) a row "ctxwin + embeddings (hybrid)" is added: the same live recall with
//! [`SessionBuilder::embedder`], vectors cached per text for the whole run (each turn is
//! embedded once, not once per question), and the timing gives the hybrid path's added
//! retrieval time on the 10,000-message archive with the query's embedding measured apart.
//!
//! After the table it breaks the live-recall score down by question kind (next to the
//! baseline's) and, per budget, counts why each missing answer turn is missing: no query word
//! in it, a neighbour came back but not it, ranked past the candidate limit, ranked but did not
//! fit, or ranked with room left unused; and the ceiling of lexical matching.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxwin_benches::embedcache::CachedEmbedder;
use ctxwin_benches::longchat::{Chat, generate};
use ctxwin_core::Config;
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;
use ctxwin_std::embed::{Embedder, HttpEmbedder};
use ctxwin_std::llm::LlmClientBuilder;
use ctxwin_std::session::{ComposeOptions, RecallFor};
use ctxwin_std::session::{Hybrid, PushOptions, RetrievalSettings, Session, SessionBuilder};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope, SearchQuery};
use ctxwin_std::{ChatMessage, core::Role};

const BUDGETS: [u32; 2] = [4_096, 8_192];

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn role(speaker: u8) -> Role {
    if speaker == 0 { Role::User } else { Role::Assistant }
}

/// The core configuration for a payload budget: the recent turns get half of it (the working
/// level), the rest is free room that retrieval fills.
fn config(budget: u32) -> Config {
    Config {
        context_window: budget + 1_024,
        reserved_for_reply: 1_024,
        permanent_budget: budget / 8,
        session_budget: budget / 8,
        working_budget: budget / 2,
        ..Config::DEFAULT
    }
}

fn session(
    chat: &Chat,
    budget: u32,
    settings: RetrievalSettings,
    embedder: Option<Arc<CachedEmbedder>>,
) -> Session {
    let mut builder =
        SessionBuilder::new("bench").config(config(budget)).archive_in_memory().retrieval(settings);
    if let Some(embedder) = embedder {
        builder = builder.embedder(embedder).hybrid(hybrid());
    }
    let mut session = builder.build().expect("session");
    for turn in &chat.turns {
        let message = ChatMessage::text(role(turn.speaker), turn.text.clone());
        session
            .push_with(
                &message,
                PushOptions { timestamp: Some(turn.timestamp), ..PushOptions::default() },
            )
            .expect("push");
    }
    session
}

fn score(payload_texts: &[String], chat: &Chat, evidence: &[usize]) -> f64 {
    let found = evidence
        .iter()
        .filter(|&&i| payload_texts.iter().any(|text| text.contains(&chat.turns[i].text)))
        .count();
    found as f64 / evidence.len().max(1) as f64
}

#[derive(Default, Clone, Copy)]
struct Row {
    sum: f64,
    n: usize,
    over_budget: usize,
    fill: f64,
}

impl Row {
    fn add(&mut self, score: f64, tokens: u32, budget: u32) {
        self.sum += score;
        self.n += 1;
        self.fill += f64::from(tokens) / f64::from(budget);
        if tokens > budget {
            self.over_budget += 1;
        }
    }
    fn mean(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }
    fn fill(&self) -> f64 {
        self.fill / self.n.max(1) as f64
    }
}

/// Why an evidence turn is missing from the live-recall payload, first matching cause wins.
const CAUSES: [&str; 6] = [
    "no query word in it (not ranked at all)",
    "a neighbour came back, it did not",
    "ranked past the candidate limit",
    "ranked in the top 50, did not fit",
    "ranked 51st or lower, did not fit",
    "ranked, room left unused",
];

/// Missing evidence turns per cause, per question kind.
#[derive(Default, Clone, Copy)]
struct Causes {
    missing: [[usize; 6]; 3],
    evidence: [usize; 3],
    /// Free budget left in payloads that missed evidence, summed.
    free_when_missed: u64,
    missed_payloads: usize,
    /// Unranked evidence within two turns of a candidate.
    unranked_near_hit: [usize; 3],
}

/// The old `--retrieve` path: the `limit` best hits not in the window, as one block of at most
/// `max_chars` characters (`[Retrieved from archive]`, then a line per hit, the budget shared
/// fairly, none under 48 characters): what `Session::retrieve` did before there was one
/// retrieval.
fn top_hits_block(s: &Session, query: &str, limit: usize, max_chars: usize) -> String {
    const HEADER: &str = "[Retrieved from archive]";
    let Some(archive) = s.archive() else { return String::new() };
    let mut hits = archive.search(s.scope(), &SearchQuery::new(query, limit * 4)).expect("search");
    hits.retain(|hit| s.manager().get(hit.id).is_none());
    hits.truncate(limit);
    let Some(budget) = max_chars.checked_sub(HEADER.chars().count()) else { return String::new() };
    let fitting = (budget / 48).min(hits.len());
    let lines: Vec<(String, String)> = hits
        .iter()
        .take(fitting)
        .map(|hit| {
            let flat = hit.content.split_whitespace().collect::<Vec<_>>().join(" ");
            (format!("\n- (msg {}, {}) ", hit.id, hit.role), flat)
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    // The budget shared so that no line gets more than it needs, the rest split evenly.
    let needs: Vec<usize> =
        lines.iter().map(|(prefix, text)| prefix.chars().count() + text.chars().count()).collect();
    let mut order: Vec<usize> = (0..needs.len()).collect();
    order.sort_by_key(|&i| needs[i]);
    let mut allotted = vec![0; needs.len()];
    let mut left = budget;
    for (served, &index) in order.iter().enumerate() {
        let give = needs[index].min(left / (needs.len() - served));
        allotted[index] = give;
        left -= give;
    }
    let mut block = String::from(HEADER);
    for ((prefix, text), allot) in lines.into_iter().zip(allotted) {
        let room = allot.saturating_sub(prefix.chars().count());
        block.push_str(&prefix);
        if text.chars().count() <= room {
            block.push_str(&text);
        } else {
            block.extend(text.chars().take(room.saturating_sub(1)));
            block.push('…');
        }
    }
    block
}

/// Classifies every evidence turn of `question` the payload lacks.
#[allow(clippy::too_many_arguments)]
fn tally(
    causes: &mut Causes,
    s: &Session,
    payload_texts: &[String],
    chat: &Chat,
    question: &ctxwin_benches::longchat::Question,
    recalled: &[u64],
    free: u32,
    cost: &dyn Fn(&str) -> u32,
) {
    let kind = usize::from(question.kind);
    let settings = *s.retrieval();
    let archive = s.archive().expect("archive");
    // The full ranking, without what the window holds (what retrieval ranks among).
    let ranked: Vec<u64> = archive
        .search(s.scope(), &SearchQuery::new(&question.text, 100_000))
        .expect("rank")
        .into_iter()
        .map(|hit| hit.id)
        .filter(|&id| s.manager().get(id).is_none())
        .collect();
    let query = SearchQuery::new(&question.text, settings.candidates);
    let all_ranked = archive.search(s.scope(), &query).expect("rank");
    let candidates: Vec<u64> =
        all_ranked.iter().map(|hit| hit.id).filter(|&id| s.manager().get(id).is_none()).collect();
    let mut missed = false;
    for &i in &question.evidence {
        causes.evidence[kind] += 1;
        let text = &chat.turns[i].text;
        if payload_texts.iter().any(|t| t.contains(text.as_str())) {
            continue;
        }
        missed = true;
        let id = i as u64 + 1;
        let position = ranked.iter().position(|&r| r == id);
        let cause = if position.is_none() {
            0
        } else if recalled.contains(&(id - 1)) || recalled.contains(&(id + 1)) {
            1
        } else if !candidates.contains(&id) {
            2
        } else if free >= cost(text) + 8 {
            5
        } else if position.is_some_and(|p| p < 50) {
            3
        } else {
            4
        };
        causes.missing[kind][cause] += 1;
        if cause == 0 {
            let near = (1..=2u64).any(|d| {
                candidates.contains(&(id + d)) || candidates.contains(&id.saturating_sub(d))
            });
            if near {
                causes.unranked_near_hit[kind] += 1;
            }
            if env("RECALL_EXAMPLES", 0) == 1 && kind < 2 {
                eprintln!("{kind} {:?} -> {:?}", question.text, text);
            }
        }
    }
    if missed {
        causes.free_when_missed += u64::from(free);
        causes.missed_payloads += 1;
    }
}

/// Newest turns that fit `room`, as (index, text), with their cost.
fn newest(chat: &Chat, upto: usize, room: u32, cost: &dyn Fn(&str) -> u32) -> (Vec<usize>, u32) {
    let mut spent = 0;
    let mut out = Vec::new();
    for i in (0..upto).rev() {
        let c = cost(&chat.turns[i].text);
        if spent + c > room {
            break;
        }
        spent += c;
        out.push(i);
    }
    (out, spent)
}

/// The embeddings server from `CTXWIN_EMBED_URL`, behind a per-text cache.
fn embedder() -> Option<Arc<CachedEmbedder>> {
    let cached = CachedEmbedder::new(Arc::new(http_embedder()?));
    if let Some(path) = vector_cache() {
        let loaded = cached.load(&path);
        println!("embeddings: {loaded} vectors loaded from {}", path.display());
    }
    Some(Arc::new(cached))
}

/// The embeddings server from `CTXWIN_EMBED_URL` itself.
fn http_embedder() -> Option<HttpEmbedder> {
    let url = std::env::var("CTXWIN_EMBED_URL").ok().filter(|u| !u.trim().is_empty())?;
    let model =
        std::env::var("CTXWIN_EMBED_MODEL").unwrap_or_else(|_| "all-MiniLM-L6-v2".to_owned());
    // Generous limits: the bench measures recall, and two other jobs may share the cores.
    let client = LlmClientBuilder::new(&url)
        .model(&model)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("CTXWIN_EMBED_URL");
    Some(HttpEmbedder::with_client(client, &model).expect("model name").batch(32))
}

/// Where the run's vectors are kept between runs (`RECALL_VECTOR_CACHE`; empty: nowhere).
fn vector_cache() -> Option<std::path::PathBuf> {
    match std::env::var("RECALL_VECTOR_CACHE") {
        Ok(path) if path.is_empty() => None,
        Ok(path) => Some(path.into()),
        Err(_) => Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/recall-vectors.bin"),
        ),
    }
}

/// Embeds `texts` into the cache ahead of the sessions (and saves it); the seconds it took.
fn prewarm(embedder: &CachedEmbedder, texts: &[&str]) -> f64 {
    let start = Instant::now();
    for chunk in texts.chunks(512) {
        embedder.embed(chunk).expect("embeddings server");
    }
    if let Some(path) = vector_cache()
        && let Err(error) = embedder.save(&path)
    {
        eprintln!("could not save the vectors to {}: {error}", path.display());
    }
    start.elapsed().as_secs_f64()
}

/// The fusion of the hybrid row: `RECALL_HYBRID` = `interleave`, `rrf` or `convex:W` (default
/// [`Hybrid::DEFAULT`]).
fn hybrid() -> Hybrid {
    let value = std::env::var("RECALL_HYBRID").unwrap_or_default();
    match value.split_once(':') {
        _ if value == "interleave" => Hybrid::Interleave,
        _ if value == "rrf" => Hybrid::ReciprocalRank { k: 60.0, lexical: 1.0, semantic: 1.0 },
        Some(("convex", w)) => {
            Hybrid::Convex { semantic: w.parse().expect("RECALL_HYBRID weight") }
        }
        _ => Hybrid::DEFAULT,
    }
}

fn main() {
    let chats = generate(env("RECALL_SEED", 19), env("RECALL_CHATS", 10) as usize);
    let embed = embedder();
    let per_chat = env("RECALL_QUESTIONS", 40) as usize;
    let estimator = Estimator::new();
    let overhead = u32::from(Config::DEFAULT.message_overhead);
    let cost = |text: &str| estimator.count(text) + overhead;
    let tokens: Vec<u32> =
        chats.iter().map(|c| c.turns.iter().map(|t| cost(&t.text)).sum()).collect();
    let questions: usize = chats
        .iter()
        .map(|c| c.questions.len().div_ceil(c.questions.len().div_ceil(per_chat.max(1)).max(1)))
        .sum();
    println!(
        "recall: {} generated chats, {}–{} tokens ({}–{} turns), {} questions",
        chats.len(),
        tokens.iter().min().unwrap_or(&0),
        tokens.iter().max().unwrap_or(&0),
        chats.iter().map(|c| c.turns.len()).min().unwrap_or(0),
        chats.iter().map(|c| c.turns.len()).max().unwrap_or(0),
        questions
    );
    let names = [
        "ctxwin, recall for the live request",
        "ctxwin, main's --retrieve path (5 items, 8,000 chars)",
        "ctxwin, no retrieval",
        "half recent / half BM25 baseline",
        "newest turns (trim)",
        "ctxwin + embeddings (hybrid)",
    ];
    if let Some(embed) = &embed {
        let texts: Vec<&str> = chats
            .iter()
            .flat_map(|c| {
                c.turns
                    .iter()
                    .map(|t| t.text.as_str())
                    .chain(c.questions.iter().map(|q| q.text.as_str()))
            })
            .collect();
        let seconds = prewarm(embed, &texts);
        println!(
            "embeddings: {} texts from {} in {seconds:.1} s ({:.1} ms a text); fusion {:?}",
            embed.sent(),
            std::env::var("CTXWIN_EMBED_URL").unwrap_or_default(),
            seconds * 1e3 / embed.sent().max(1) as f64,
            hybrid()
        );
    }
    let mut hybrid_kinds = [[Row::default(); 3]; 2];
    let mut kinds = [[Row::default(); 3]; 2];
    let mut base_kinds = [[Row::default(); 3]; 2];
    let mut causes = [Causes::default(); 2];
    let mut rows = [[Row::default(); 6]; 2];
    let mut unchanged = true;
    for (b, &budget) in BUDGETS.iter().enumerate() {
        for chat in &chats {
            // The baseline's archive: every turn, searched with the same BM25.
            let archive = SqliteArchive::open_in_memory().expect("archive");
            let rows_in: Vec<ArchivedMessage> = chat
                .turns
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let id = i as u64 + 1;
                    ArchivedMessage::new(id, id, ChatMessage::text(role(t.speaker), t.text.clone()))
                })
                .collect();
            archive.put(&Scope::local("b"), Fence::NONE, &rows_in).expect("store");
            let step = chat.questions.len().div_ceil(per_chat.max(1)).max(1);
            for question in chat.questions.iter().step_by(step) {
                let live = ChatMessage::text(Role::User, question.text.clone());
                // ctxwin, automatic recall.
                let settings = RetrievalSettings {
                    recency: std::env::var("RECALL_RECENCY")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(RetrievalSettings::DEFAULT.recency),
                    neighbours: env("RECALL_NEIGHBOURS", 1) == 1,
                    ..RetrievalSettings::DEFAULT
                };
                if let Some(embed) = &embed {
                    let mut h = session(chat, budget, settings, Some(embed.clone()));
                    h.push(&live).expect("push question");
                    let before: Vec<u64> = h.manager().history().map(|m| m.id()).collect();
                    let payload = h.compose(&[]).expect("compose");
                    let after: Vec<u64> = h.manager().history().map(|m| m.id()).collect();
                    unchanged &= before == after
                        && h.compose(&[]).expect("again").conversation == payload.conversation;
                    let texts: Vec<String> =
                        payload.conversation.messages.iter().map(|m| m.content.clone()).collect();
                    let sc = score(&texts, chat, &question.evidence);
                    rows[b][5].add(sc, payload.tokens, budget);
                    hybrid_kinds[b][usize::from(question.kind)].add(sc, payload.tokens, budget);
                    let stats = h.semantic_stats().expect("semantic");
                    assert_eq!(stats.fallbacks, 0, "{:?}", stats.last_error);
                }
                let mut s = session(chat, budget, settings, None);
                s.push(&live).expect("push question");
                let plain = s
                    .compose_with(ComposeOptions::new(&[]).recall(RecallFor::Nothing))
                    .expect("compose");
                let before: Vec<u64> = s.manager().history().map(|m| m.id()).collect();
                let payload = s.compose(&[]).expect("compose");
                let after: Vec<u64> = s.manager().history().map(|m| m.id()).collect();
                unchanged &= before == after
                    && s.compose(&[]).expect("again").conversation == payload.conversation;
                let texts: Vec<String> =
                    payload.conversation.messages.iter().map(|m| m.content.clone()).collect();
                let sc = score(&texts, chat, &question.evidence);
                rows[b][0].add(sc, payload.tokens, budget);
                kinds[b][usize::from(question.kind)].add(sc, payload.tokens, budget);
                tally(
                    &mut causes[b],
                    &s,
                    &texts,
                    chat,
                    question,
                    &payload.recall.ids,
                    budget.saturating_sub(payload.tokens),
                    &cost,
                );
                let texts: Vec<String> =
                    plain.conversation.messages.iter().map(|m| m.content.clone()).collect();
                rows[b][2].add(score(&texts, chat, &question.evidence), plain.tokens, budget);
                // main's old path, last (it evicts): the 5 best hits outside the window as one
                // block of at most 8,000 characters, passed as dynamic context.
                let block = top_hits_block(&s, &question.text, 5, 8_000);
                let dynamic: Vec<&str> =
                    if block.is_empty() { vec![] } else { vec![block.as_str()] };
                let quiet = ComposeOptions::new(&dynamic).recall(RecallFor::Nothing);
                let old = s.compose_with(quiet).expect("compose");
                let texts: Vec<String> =
                    old.conversation.messages.iter().map(|m| m.content.clone()).collect();
                rows[b][1].add(score(&texts, chat, &question.evidence), old.tokens, budget);
                // Baseline: newest turns in half the budget, BM25 top turns in the other half.
                let upto = chat.turns.len();
                let q_cost = cost(&question.text);
                let half = (budget - q_cost) / 2;
                let (recent, spent) = newest(chat, upto, half, &cost);
                let mut texts: Vec<String> =
                    recent.iter().map(|&i| chat.turns[i].text.clone()).collect();
                let mut used = spent + q_cost;
                let hits = archive
                    .search(&Scope::local("b"), &SearchQuery::new(&question.text, 200))
                    .expect("search");
                let mut bm25_room = budget - used;
                for hit in hits {
                    let i = (hit.id - 1) as usize;
                    if recent.contains(&i) {
                        continue;
                    }
                    let c = cost(&hit.content);
                    if c <= bm25_room {
                        bm25_room -= c;
                        used += c;
                        texts.push(hit.content);
                    }
                }
                let sc = score(&texts, chat, &question.evidence);
                rows[b][3].add(sc, used, budget);
                base_kinds[b][usize::from(question.kind)].add(sc, used, budget);
                // Plain trim: the newest turns that fit.
                let (trim, spent) = newest(chat, upto, budget - q_cost, &cost);
                let texts: Vec<String> = trim.iter().map(|&i| chat.turns[i].text.clone()).collect();
                rows[b][4].add(score(&texts, chat, &question.evidence), spent + q_cost, budget);
            }
        }
    }
    println!(
        "\n{:<55} {:>12} {:>12}   fill 4k / 8k   over budget",
        "evidence recall", "4,096", "8,192"
    );
    for (i, name) in names.iter().enumerate() {
        if i == 5 && embed.is_none() {
            println!("{name:<55} (set CTXWIN_EMBED_URL to an embeddings server)");
            continue;
        }
        println!(
            "{:<55} {:>12.3} {:>12.3}   {:>5.0}% / {:>3.0}%   {}",
            name,
            rows[0][i].mean(),
            rows[1][i].mean(),
            rows[0][i].fill() * 100.0,
            rows[1][i].fill() * 100.0,
            rows[0][i].over_budget + rows[1][i].over_budget
        );
    }
    let labels = ["same word", "other form", "synonym only"];
    println!("\nby question kind (ctxwin live recall | baseline)        4,096          8,192");
    for (k, label) in labels.iter().enumerate() {
        println!(
            "  {:<14} n = {:<4} {:>28.3} | {:.3} {:>8.3} | {:.3}",
            label,
            kinds[0][k].n,
            kinds[0][k].mean(),
            base_kinds[0][k].mean(),
            kinds[1][k].mean(),
            base_kinds[1][k].mean(),
        );
    }
    if embed.is_some() {
        println!("by question kind (ctxwin + embeddings, hybrid)");
        for (k, label) in labels.iter().enumerate() {
            println!(
                "  {:<14} n = {:<4} {:>28.3} {:>17.3}",
                label,
                hybrid_kinds[0][k].n,
                hybrid_kinds[0][k].mean(),
                hybrid_kinds[1][k].mean(),
            );
        }
    }
    for (b, budget) in BUDGETS.iter().enumerate() {
        let c = &causes[b];
        println!(
            "\nmissing evidence turns at {budget} (same word / other form / synonym; of {} / {} / {} evidence turns); {:.0} tokens free on average in payloads that missed some",
            c.evidence[0],
            c.evidence[1],
            c.evidence[2],
            c.free_when_missed as f64 / c.missed_payloads.max(1) as f64
        );
        let unranked: usize = c.missing.iter().map(|m| m[0]).sum();
        let total: usize = c.evidence.iter().sum();
        println!(
            "  ceiling of lexical matching (every evidence turn sharing a query word found): {:.3}",
            1.0 - unranked as f64 / total.max(1) as f64
        );
        for (i, cause) in CAUSES.iter().enumerate() {
            println!(
                "  {:<44} {:>4} / {:>4} / {:>4}",
                cause, c.missing[0][i], c.missing[1][i], c.missing[2][i]
            );
            if i == 0 {
                println!(
                    "    of which within two turns of a candidate  {:>4} / {:>4} / {:>4}",
                    c.unranked_near_hit[0], c.unranked_near_hit[1], c.unranked_near_hit[2]
                );
            }
        }
    }
    println!("a build never changes what a later build sees: {unchanged}");

    if env("RECALL_TIMING", 1) == 0 {
        return;
    }
    // Retrieval time per build on a 10,000-message archive.
    let long = generate(env("RECALL_SEED", 19) + 1, 20);
    let mut big = Chat { names: long[0].names.clone(), turns: Vec::new(), questions: Vec::new() };
    for chat in &long {
        big.turns.extend(chat.turns.iter().cloned());
        big.questions.extend(chat.questions.iter().cloned());
    }
    big.turns.truncate(10_000);
    let mut s = session(&big, 8_192, RetrievalSettings::DEFAULT, None);
    let archived = s.archive().map(|a| a.usage(s.scope()).map_or(0, |u| u.messages)).unwrap_or(0);
    let questions: Vec<String> = big.questions.iter().take(200).map(|q| q.text.clone()).collect();
    let start = Instant::now();
    for q in &questions {
        std::hint::black_box(s.recall(q, &[]).expect("recall"));
    }
    let recall_ms = start.elapsed().as_secs_f64() * 1e3 / questions.len() as f64;
    let start = Instant::now();
    for q in &questions {
        let asked = ComposeOptions::new(&[]).recall(RecallFor::Query(q));
        std::hint::black_box(s.compose_with(asked).expect("compose").tokens);
    }
    let with_ms = start.elapsed().as_secs_f64() * 1e3 / questions.len() as f64;
    let start = Instant::now();
    for _ in &questions {
        let quiet = ComposeOptions::new(&[]).recall(RecallFor::Nothing);
        std::hint::black_box(s.compose_with(quiet).expect("compose").tokens);
    }
    let without_ms = start.elapsed().as_secs_f64() * 1e3 / questions.len() as f64;
    println!(
        "\nretrieval on a {archived}-message archive: recall {recall_ms:.2} ms; build {with_ms:.2} ms with it, {without_ms:.2} ms without (+{:.2} ms)",
        with_ms - without_ms
    );
    let Some(embed) = embed else { return };
    // Hybrid: the archive's 10,000 vectors embedded (and cached in the archive) first; the
    // questions' vectors too, so that the timed builds measure ranking, not the server.
    let texts: Vec<&str> = big.turns.iter().map(|t| t.text.as_str()).collect();
    let seconds = prewarm(&embed, &texts);
    let queries: Vec<&str> = questions.iter().map(String::as_str).collect();
    let server = http_embedder().expect("CTXWIN_EMBED_URL");
    let start = Instant::now();
    for q in &queries {
        std::hint::black_box(server.embed(&[q]).expect("embed"));
    }
    let query_ms = start.elapsed().as_secs_f64() * 1e3 / queries.len() as f64;
    prewarm(&embed, &queries);
    let mut h = session(&big, 8_192, RetrievalSettings::DEFAULT, Some(embed.clone()));
    let start = Instant::now();
    let synced = h.sync_vectors().expect("sync");
    let sync_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for q in &questions {
        std::hint::black_box(h.recall(q, &[]).expect("recall"));
    }
    let recall_ms = start.elapsed().as_secs_f64() * 1e3 / questions.len() as f64;
    let start = Instant::now();
    for q in &questions {
        let asked = ComposeOptions::new(&[]).recall(RecallFor::Query(q));
        std::hint::black_box(h.compose_with(asked).expect("compose").tokens);
    }
    let hybrid_ms = start.elapsed().as_secs_f64() * 1e3 / questions.len() as f64;
    let stats = h.semantic_stats().expect("semantic");
    println!(
        "hybrid on the same archive ({synced} vectors, embedded in {seconds:.1} s, indexed in {sync_s:.2} s): recall {recall_ms:.2} ms; build {hybrid_ms:.2} ms with it (+{:.2} ms over no retrieval, +{:.2} ms over lexical), query embedding excluded; a query's embedding over HTTP {query_ms:.2} ms; fallbacks {}",
        hybrid_ms - without_ms,
        hybrid_ms - with_ms,
        stats.fallbacks
    );
}
