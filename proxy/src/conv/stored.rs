//! The conversations' bills as their newest checkpoints keep them ([`super::bill`]), read
//! without loading any conversation: what `ctxwin stats --proxy` shows, the proxy running or
//! not.

use std::collections::BTreeSet;
use std::path::Path;

use ctxwin_std::session::SessionError;
use ctxwin_std::store::ArchiveStore;

use super::bill::Bill;
use super::state::Recorded;
use super::{ConvError, Stores, conv_dir, paths, stores};

/// Generations looked at per conversation (as [`super::Conv::open`] tries at most).
const MAX_GENERATIONS: u32 = super::MAX_GENERATIONS;

/// Each stored conversation's key and bill, in key order: the caller state of its newest
/// checkpoint (the newest generation that has one), read through the checkpoint port of
/// `stores` (the state directory's files, or a fleet's database), scoped by the
/// conversation's session. A conversation never checkpointed has no bill yet and is left out.
///
/// # Errors
/// Store errors; [`ConvError::State`] for a checkpoint whose record does not read.
pub fn stored_bills(stores: &Stores, state_dir: &Path) -> Result<Vec<(String, Bill)>, ConvError> {
    let names = match stores {
        Stores::Local(local) => local.archive.conversations("", ""),
        Stores::Fleet(ports) => ports.archive.conversations("", ""),
    }
    .map_err(SessionError::from)?;
    let keys: BTreeSet<&str> =
        names.iter().map(|name| name.split(['#', '@']).next().unwrap_or(name)).collect();
    let mut bills = Vec::new();
    for key in keys {
        let stored = match stores {
            Stores::Local(local) => {
                let dir = conv_dir(state_dir, key);
                let mut newest = None;
                for generation in 0..MAX_GENERATIONS {
                    let (name, checkpoints) = paths::generation(key, &dir, generation);
                    if generation > 0 && !checkpoints.exists() {
                        break;
                    }
                    let state =
                        stores::session_builder(local, &name, checkpoints).stored_caller_state()?;
                    newest = state.or(newest);
                }
                newest
            }
            Stores::Fleet(ports) => stores::fleet_builder(ports, key).stored_caller_state()?,
        };
        if let Some(bytes) = stored.filter(|bytes| !bytes.is_empty()) {
            let recorded = Recorded::decode(&bytes).map_err(ConvError::State)?;
            bills.push((key.to_string(), recorded.bill));
        }
    }
    Ok(bills)
}
