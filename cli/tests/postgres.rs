//! The `ctxwin` binary on a PostgreSQL store, against a real server (`CTXWIN_PG_URL`, as
//! `scripts/pg-server.sh start` prints; each test in a fresh schema): every command that
//! opens storage reaches the database through `CTXWIN_STORE_URL` or `[store] url`, and two
//! state directories (two hosts) share one conversation. Each test says it skipped without
//! the variable.

use std::fs;

use ctxwin_std::store::postgres::PgStore;
use ctxwin_std::store::postgres::testing::TestSchema;
use ctxwin_std::store::{ArchiveStore, CheckpointSink, Scope};
use serde_json::Value;

mod cli_support;
use cli_support::{Run, Workdir};

fn schema(test: &str) -> Option<TestSchema> {
    TestSchema::new(test).map(|schema| schema.expect("a fresh schema on the test server"))
}

/// A state directory whose commands run with `CTXWIN_STORE_URL` naming the schema.
struct Host<'a> {
    work: Workdir,
    url: &'a str,
}

impl Host<'_> {
    fn run(&self, args: &[&str]) -> Run {
        self.work.run_with(args, None, &[("CTXWIN_STORE_URL", self.url)])
    }

    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "ctxwin {args:?} failed:\n{}", run.stderr);
        run
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut with_json = args.to_vec();
        with_json.push("--json");
        self.ok(&with_json).json()
    }
}

/// The rows of the local conversation `name`, read straight from the database.
fn stored(store: &PgStore, name: &str) -> Vec<String> {
    let rows = store.rows_after(&Scope::local(name), 0, 1_000).unwrap();
    rows.into_iter().map(|row| row.message.content).collect()
}

#[test]
fn every_command_keeps_its_state_in_postgres() {
    let Some(schema) = schema("cli commands") else { return };
    let host = Host { work: Workdir::new(), url: schema.url() };
    let init = host.json(&["init"]);
    assert!(init["store"].as_str().unwrap().starts_with("postgres://"), "{init}");
    assert!(!init["store"].as_str().unwrap().contains(":ctxwin@"), "no password shown");
    let state = host.work.state();
    assert!(state.join("ctxwin.toml").is_file());
    assert!(!state.join("archive.db").exists() && !state.join("checkpoints").exists());

    host.ok(&["add", "system", "You deploy services."]);
    host.ok(&["add", "user", "Deploy the payments service to staging"]);
    let import = host.work.write(
        "more.jsonl",
        "{\"role\":\"assistant\",\"content\":\"Deployed payments build 4411 to staging.\"}\n",
    );
    host.ok(&["import", import.to_str().unwrap()]);
    let store = schema.open().unwrap();
    assert_eq!(
        stored(&store, "main"),
        [
            "You deploy services.",
            "Deploy the payments service to staging",
            "Deployed payments build 4411 to staging."
        ]
    );
    let stats = host.json(&["stats"]);
    assert_eq!(stats["messages"]["archived"], 3);
    let hits = host.json(&["search", "payments"]);
    assert_eq!(hits["messages"].as_array().unwrap().len(), 2, "{hits}");
    let payload = host.ok(&["build"]).stdout;
    assert!(payload.contains("build 4411"), "{payload}");

    // Checkpoints are rows of the database, listed, restored and pruned there.
    let listed = host.json(&["checkpoints"]);
    let count = listed.as_array().unwrap().len();
    assert!(count >= 4, "init, two adds and an import each checkpoint: {listed}");
    assert_eq!(store.ids(&Scope::local("main")).unwrap().len(), count);
    host.ok(&["checkpoint"]);
    let restored = host.json(&["restore", "latest"]);
    assert_eq!(restored["messages"], 3);
    assert_eq!(host.json(&["prune", "--keep", "2"])["keep"], 2);
    assert_eq!(store.ids(&Scope::local("main")).unwrap().len(), 2);

    // Forget: gone from the rows and from every checkpoint in the database.
    host.ok(&["forget", "--match", "4411"]);
    assert!(stored(&store, "main").iter().all(|text| !text.contains("4411")));
    for id in store.ids(&Scope::local("main")).unwrap() {
        let bytes = store.load(&Scope::local("main"), &id).unwrap();
        assert!(!bytes.windows(4).any(|w| w == b"4411"), "checkpoint {id} keeps the text");
    }
    assert!(host.json(&["search", "4411"])["messages"].as_array().unwrap().is_empty());

    // Recover rebuilds from the database's rows; the side conversation is pruned after.
    let recovered = host.json(&["recover"]);
    assert_eq!(recovered["messages"], 3);
    let side = recovered["kept_in"].as_str().unwrap().to_string();
    assert_eq!(stored(&store, &side).len(), 3);
    assert_eq!(host.json(&["prune", "--delete", &side])["messages"], 3);
    assert!(stored(&store, &side).is_empty());
    assert_eq!(host.json(&["stats"])["messages"]["archived"], 3);

    let deleted = host.json(&["prune", "--delete", "main"]);
    assert_eq!((deleted["messages"].as_u64(), deleted["session"].as_bool()), (Some(3), Some(true)));
    assert!(stored(&store, "main").is_empty());
    assert!(store.ids(&Scope::local("main")).unwrap().is_empty());
    assert_eq!(host.json(&["stats"])["messages"]["archived"], 0);
}

#[test]
fn two_hosts_share_a_conversation_through_the_store_url_of_their_config() {
    let Some(schema) = schema("cli hosts") else { return };
    let config = format!("session = \"team\"\n[store]\nurl = {:?}\n", schema.url());
    let hosts: Vec<Workdir> = (0..2).map(|_| Workdir::new()).collect();
    let mut runs = Vec::new();
    for (n, host) in hosts.iter().enumerate() {
        let file = host.write("ctxwin.toml", &config);
        let init = host.ok(&["init", "--config", file.to_str().unwrap(), "--json"]).json();
        assert_eq!(init["session"], "team");
        for turn in 0..3 {
            let text = format!("host {n} turn {turn}");
            host.ok(&["add", "user", &text]);
            runs.push(text);
        }
    }
    // The second host joined the first's conversation: one history, in the order written.
    let store = schema.open().unwrap();
    assert_eq!(stored(&store, "team"), runs);
    for host in &hosts {
        let stats = host.ok(&["stats", "--json"]).json();
        assert_eq!(stats["messages"]["archived"], 6);
        let payload = host.ok(&["build"]).stdout;
        let at = |text: &str| payload.find(text).unwrap_or_else(|| panic!("{text} missing"));
        assert!(runs.windows(2).all(|pair| at(&pair[0]) < at(&pair[1])), "{payload}");
    }
    assert!(!fs::read_to_string(hosts[0].state().join("ctxwin.toml")).unwrap().is_empty());
}
