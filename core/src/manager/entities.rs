//! Entities: extracting values from user messages and counting the entity block.

use super::{ContextManager, ENTITIES_UNCOUNTED};
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::entities::{EntitiesMut, EntityStorage};
use crate::level::Level;
use crate::record::{self};
use crate::ring::RingStorage;
use crate::role::Role;
use crate::strategy::Strategy;

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// After a push: entities from a user message, then the strategy's plan.
    pub(crate) fn after_push(&mut self, role: Role, level: Level, id: u64) {
        if role == Role::User
            && level.is_history()
            && cfg!(feature = "entities")
            && !self.config.entity_schema.is_empty()
            && self.strategy.needs(&self.config).entities
        {
            self.extract_entities(id);
        }
        if !self.strategy.needs(&self.config).plans {
            return;
        }
        let plan = {
            let parts = self.parts();
            let env = parts.env();
            parts.strategy.after_push(&env)
        };
        self.run_plan(plan);
    }

    #[inline(never)]
    pub(super) fn extract_entities(&mut self, id: u64) {
        let changed = {
            let epoch = self.state.id_epoch;
            let rings = [self.working.view(), self.volatile.view()].map(|r| r.with_id_epoch(epoch));
            let text = rings.into_iter().find_map(|ring| {
                ring.iter().find(|h| ring.id(h) == id).map(|h| record::content(h, ring.record(h)))
            });
            let Some(text) = text else { return };
            let mut entities =
                EntitiesMut::new(&self.config.entity_schema, self.entities.parts_mut());
            self.strategy.extractor().extract(text, &mut entities);
            entities.changed()
        };
        if changed {
            self.recount_entities();
            self.mark_changed(Level::Session);
        }
    }

    /// Entity values in table order, for snapshots (independent of the schema).
    pub(crate) fn entity_values(&self) -> crate::entities::Entities<'_> {
        crate::entities::Entities::raw(self.entities.parts())
    }

    /// Stores a restored entity value (validated by the decoder).
    pub(crate) fn load_entity(&mut self, index: usize, value: Option<&[u8]>) {
        let parts = self.entities.parts_mut();
        let start = index * parts.value_capacity;
        let (Some(len), Some(value)) = (parts.lens.get_mut(index), value) else { return };
        if let Some(target) = parts.bytes.get_mut(start..start + value.len()) {
            target.copy_from_slice(value);
            *len = value.len() as u16 + 1;
        }
    }

    /// Tokens the entity block costs: its label, every key and known value, and framing.
    pub(crate) fn count_entity_tokens(&self) -> u32 {
        if !cfg!(feature = "entities") || self.config.entity_schema.is_empty() {
            return 0;
        }
        let pairs = self.entities().iter().fold(0u32, |sum, (key, value)| {
            sum.saturating_add(self.counter.count(key))
                .saturating_add(value.map_or(1, |v| self.counter.count(v)))
                .saturating_add(3)
        });
        (self.counter.count(crate::payload::ENTITIES_PREFIX) + 2)
            .saturating_add(pairs)
            .saturating_add(u32::from(self.config.message_overhead))
    }

    /// Caches [`count_entity_tokens`](Self::count_entity_tokens).
    pub(crate) fn recount_entities(&mut self) {
        self.state.entity_tokens = self.count_entity_tokens();
    }

    /// Fills the entity-token cache if it was never filled (a manager built in `const` context
    /// with a schema cannot count yet).
    pub(crate) fn refresh_entities(&mut self) {
        if cfg!(feature = "entities") && self.state.entity_tokens == ENTITIES_UNCOUNTED {
            self.recount_entities();
        }
    }
}
