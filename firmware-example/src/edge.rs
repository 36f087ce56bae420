//! The device: how much RAM each level gets and the budgets of a small model's window.

use ctxwin_core::{
    Capacities, Config, ContextManager, OutboxMode, capacity::Scratch, entities::EntityTable,
    estimator::Estimator, ring::Ring, strategy::SlidingWindow,
};

/// Level capacities of a 64 KiB-RAM part: 7,656 B per manager. No summary scratch: the
/// sliding window never summarizes (the firmware writes its own summaries).
#[derive(Clone, Copy, Debug, Default)]
pub struct EdgeCapacities;

impl Capacities for EdgeCapacities {
    type Permanent = Ring<4, 1024>;
    type Session = Ring<8, 768>;
    type Working = Ring<32, 3072>;
    type Volatile = Ring<4, 512>;
    type Scratch = Scratch<0>;
    type Entities = EntityTable<2, 24>;
}

/// [`EdgeCapacities`] with a 384-byte summary scratch, for strategies that summarize (the
/// `Builtin` ones the panic-never proof runs).
#[derive(Clone, Copy, Debug, Default)]
pub struct SummarizingCapacities;

impl Capacities for SummarizingCapacities {
    type Permanent = <EdgeCapacities as Capacities>::Permanent;
    type Session = <EdgeCapacities as Capacities>::Session;
    type Working = <EdgeCapacities as Capacities>::Working;
    type Volatile = <EdgeCapacities as Capacities>::Volatile;
    type Scratch = Scratch<384>;
    type Entities = <EdgeCapacities as Capacities>::Entities;
}

/// The manager the firmware runs: the sliding window without the core's summarizer, extractor
/// and scoring code (the firmware writes its own summaries of evicted units), the smallest
/// footprint. `ContextManager<SummarizingCapacities>` (the `Builtin` strategies) links them all.
pub type EdgeManager = ContextManager<EdgeCapacities, Estimator, SlidingWindow>;

/// A 4k-token window (a small on-premise model), tool outputs reduced above 160 tokens.
pub const EDGE_CONFIG: Config = Config {
    context_window: 4_096,
    reserved_for_reply: 512,
    permanent_budget: 600,
    session_budget: 400,
    working_budget: 1_600,
    observation_limit: 160,
    ..Config::DEFAULT
};

// An invalid configuration is a build error, not a runtime one.
const _: () = assert!(EDGE_CONFIG.validate().is_ok(), "EDGE_CONFIG is invalid");

/// The statics' initial value: all zero bytes, so they land in `.bss` and cost no flash (an
/// initialised manager's image would cost its whole size in flash too). Call
/// `configure(EDGE_CONFIG)` before use; an unconfigured manager refuses work with an error.
pub const EDGE_MANAGER: EdgeManager = EdgeManager::UNCONFIGURED;

/// [`EDGE_CONFIG`] for the `minimal` and `snapshot` binaries: evicted units are released at
/// once (no outbox to drain, no summaries written).
pub const LEAN_CONFIG: Config = Config { outbox: OutboxMode::Discard, ..EDGE_CONFIG };

const _: () = assert!(LEAN_CONFIG.validate().is_ok(), "LEAN_CONFIG is invalid");
