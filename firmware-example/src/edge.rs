//! The device: how much RAM each level gets and the budgets of a small model's window.

use ctxwin_core::{Capacities, Config, ContextManager, Ring};

/// Level capacities of a 64 KiB-RAM part: about 7.5 KiB per manager.
#[derive(Clone, Copy, Debug, Default)]
pub struct EdgeCapacities;

impl Capacities for EdgeCapacities {
    type Permanent = Ring<4, 1024>;
    type Session = Ring<8, 768>;
    type Working = Ring<32, 3072>;
    type Volatile = Ring<4, 512>;
}

/// The manager the firmware runs.
pub type EdgeManager = ContextManager<EdgeCapacities>;

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

/// An empty manager with [`EDGE_CONFIG`], built at compile time so it can initialise a
/// `static`. An invalid config is a build error, not a runtime panic.
#[allow(clippy::panic)]
pub const EDGE_MANAGER: EdgeManager = match ContextManager::with_config(EDGE_CONFIG) {
    Ok(manager) => manager,
    Err(_) => panic!("EDGE_CONFIG is invalid"),
};
