//! Semantic recall against a real `/v1/embeddings` server, skipped unless `CTXWIN_EMBED_URL`
//! is set (CI sets it):
//!
//! ```sh
//! export CTXWIN_EMBED_URL=$(scripts/embed-server.sh start)
//! cargo test -p ctxwin-std --test embeddings_server -- --nocapture
//! scripts/embed-server.sh stop
//! ```
//!
//! With all-MiniLM-L6-v2 (llama-server `--embeddings --pooling mean`) these check that the
//! vectors are usable (a paraphrase is nearer than an unrelated sentence), that hybrid recall
//! brings back a turn sharing no word with the request where BM25 alone does not, that
//! vectors are cached in the archive and reused, and that a dead endpoint falls back.

use std::sync::Arc;
use std::time::Instant;

use ctxwin_std::ChatMessage;
use ctxwin_std::core::{Config, Role};
use ctxwin_std::embed::{Embedder, HttpEmbedder, cosine};
use ctxwin_std::llm::LlmClientBuilder;
use ctxwin_std::session::{RetrievalSettings, Session, SessionBuilder};

const MODEL: &str = "all-MiniLM-L6-v2";

/// The embedder for `CTXWIN_EMBED_URL`, or `None` (after saying why) when it is unset.
fn server(test: &str) -> Option<HttpEmbedder> {
    let Ok(url) = std::env::var("CTXWIN_EMBED_URL") else {
        println!(
            "SKIPPED {test}: CTXWIN_EMBED_URL is not set; run \
             `export CTXWIN_EMBED_URL=$(scripts/embed-server.sh start)` to test against a real server"
        );
        return None;
    };
    // A long limit: these tests check what the vectors do, not the build path's 3 s limit,
    // and CI's cores may be busy.
    let client = LlmClientBuilder::new(&url)
        .model(MODEL)
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap();
    Some(HttpEmbedder::with_client(client, MODEL).unwrap())
}

/// A chat whose window holds only its last turns: the pet fact is archived, out of the window,
/// and the request names it with other words.
fn builder(dir: &std::path::Path, embedder: Option<Arc<dyn Embedder>>) -> SessionBuilder {
    let config = Config { max_messages: 4, locked_tail: 1, ..Config::DEFAULT };
    // Two items: BM25's only hit ("new laptop") and one more.
    let retrieval =
        RetrievalSettings { max_items: 2, neighbours: false, ..RetrievalSettings::DEFAULT };
    let builder = SessionBuilder::new("s")
        .config(config)
        .archive(dir.join("archive.db"))
        .checkpoints(dir.join("checkpoints"))
        .retrieval(retrieval);
    match embedder {
        Some(embedder) => builder.embedder(embedder),
        None => builder,
    }
}

fn chat(dir: &std::path::Path, embedder: Option<Arc<dyn Embedder>>) -> Session {
    let mut session = builder(dir, embedder).build().unwrap();
    let filler = [
        "The quarterly budget review moved to Thursday afternoon.",
        "I repainted the kitchen cabinets a pale green colour.",
        "Our flight to Lisbon lands just after nine in the evening.",
        "The new laptop battery lasts almost eleven hours now.",
    ];
    session.push(&ChatMessage::text(Role::User, "We adopted a puppy from the shelter.")).unwrap();
    for turn in 0..12 {
        session.push(&ChatMessage::text(Role::User, filler[turn % filler.len()])).unwrap();
    }
    session.push(&ChatMessage::text(Role::User, "How is your new dog settling in?")).unwrap();
    session
}

#[test]
fn a_paraphrase_is_nearer_than_an_unrelated_sentence() {
    let Some(embedder) = server("a_paraphrase_is_nearer_than_an_unrelated_sentence") else {
        return;
    };
    let started = Instant::now();
    let v = embedder
        .embed(&["We adopted a puppy.", "We got a new dog.", "The stock market fell sharply."])
        .unwrap();
    println!("3 embeddings in {:?}, {} dimensions", started.elapsed(), v[0].len());
    assert_eq!(v.len(), 3);
    assert_eq!(v[0].len(), 384, "all-MiniLM-L6-v2 has 384 dimensions");
    let (near, far) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    println!("cosine: paraphrase {near:.3}, unrelated {far:.3}");
    assert!(near > far + 0.2, "{near} vs {far}");
}

#[test]
fn hybrid_recall_finds_what_bm25_cannot_and_caches_vectors() {
    let Some(embedder) = server("hybrid_recall_finds_what_bm25_cannot_and_caches_vectors") else {
        return;
    };
    let embedder: Arc<dyn Embedder> = Arc::new(embedder);
    let lexical_dir = tempfile::tempdir().unwrap();
    let mut lexical = chat(lexical_dir.path(), None);
    let lexical_block = lexical.compose(&[]).unwrap().recall.block;
    assert!(!lexical_block.contains("puppy"), "{lexical_block}");

    let dir = tempfile::tempdir().unwrap();
    let mut hybrid = chat(dir.path(), Some(embedder.clone()));
    let started = Instant::now();
    let payload = hybrid.compose(&[]).unwrap();
    println!("first hybrid build (embeds 14 messages and the query) {:?}", started.elapsed());
    assert!(payload.recall.block.contains("puppy"), "{}", payload.recall.block);
    assert!(payload.tokens <= payload.budget);
    let stats = hybrid.semantic_stats().unwrap();
    assert_eq!((stats.embedded >= 14, stats.fallbacks), (true, 0), "{stats:?}");
    assert_eq!(hybrid.archive().unwrap().usage(hybrid.scope()).unwrap().vectors, 14);
    // The same build again sees the same payload.
    assert_eq!(hybrid.compose(&[]).unwrap().conversation, payload.conversation);
    hybrid.checkpoint().unwrap();
    drop(hybrid);

    // A new process over the same archive loads the vectors instead of embedding them.
    let mut again = builder(dir.path(), Some(embedder)).restore_latest(true).build().unwrap();
    assert_eq!(again.sync_vectors().unwrap(), 14);
    let stats = again.semantic_stats().unwrap();
    assert_eq!((stats.loaded, stats.embedded), (14, 0), "{stats:?}");
}

#[test]
fn a_dead_endpoint_falls_back_to_lexical() {
    if server("a_dead_endpoint_falls_back_to_lexical").is_none() {
        return;
    }
    let dead: Arc<dyn Embedder> = Arc::new(HttpEmbedder::new("http://127.0.0.1:1", MODEL).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut session = chat(dir.path(), Some(dead));
    let lexical_dir = tempfile::tempdir().unwrap();
    let expected = chat(lexical_dir.path(), None).compose(&[]).unwrap();
    let payload = session.compose(&[]).unwrap();
    assert_eq!(payload.conversation, expected.conversation);
    let stats = session.semantic_stats().unwrap();
    assert!(stats.fallbacks >= 1 && stats.last_error.is_some(), "{stats:?}");
}
