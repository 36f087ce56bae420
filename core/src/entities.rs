//! Entity extraction: a fixed table of declared keys (the schema, e.g. `destination`, `date`)
//! and their current values, updated from user messages by an [`Extractor`] and shown to the
//! model as one JSON object.

/// Most keys a schema declares.
pub const MAX_ENTITY_KEYS: usize = 8;
/// Longest key, in bytes.
pub const MAX_ENTITY_KEY_LEN: usize = 24;

/// The declared keys, in order. `Copy` and `const`, so it can live in a [`Config`](crate::config::Config).
///
/// ```
/// use ctxwin_core::EntitySchema;
/// let schema = EntitySchema::new(&["destination", "date"]).unwrap();
/// assert_eq!(schema.keys().collect::<Vec<_>>(), ["destination", "date"]);
/// assert!(EntitySchema::new(&["a key far longer than twenty four bytes"]).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntitySchema {
    keys: [[u8; MAX_ENTITY_KEY_LEN]; MAX_ENTITY_KEYS],
    lens: [u8; MAX_ENTITY_KEYS],
    count: u8,
}

/// Why a schema or a value was refused.
///
/// ```
/// use ctxwin_core::{entities::EntityError, EntitySchema};
/// assert_eq!(EntitySchema::new(&[""]), Err(EntityError::BadKey));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum EntityError {
    /// More than [`MAX_ENTITY_KEYS`] keys, or more than the table holds.
    TooManyKeys,
    /// A key that is empty, longer than [`MAX_ENTITY_KEY_LEN`], declared twice, or has
    /// characters other than ASCII letters, digits, `_` and `-`.
    BadKey,
    /// A key the schema does not declare.
    Undeclared,
    /// A value longer than the table's value capacity.
    ValueTooLong,
}

impl core::fmt::Display for EntityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            EntityError::TooManyKeys => "too many entity keys",
            EntityError::BadKey => {
                "entity keys must be 1-24 ASCII letters, digits, '_' or '-', each declared once"
            }
            EntityError::Undeclared => "key not declared in the entity schema",
            EntityError::ValueTooLong => "entity value longer than the table holds",
        })
    }
}

impl core::error::Error for EntityError {}

impl core::fmt::Debug for EntitySchema {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.keys()).finish()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for EntitySchema {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "EntitySchema({=u8} keys)", self.count);
    }
}

impl EntitySchema {
    /// No keys: entity extraction off.
    pub const EMPTY: EntitySchema = EntitySchema {
        keys: [[0; MAX_ENTITY_KEY_LEN]; MAX_ENTITY_KEYS],
        lens: [0; MAX_ENTITY_KEYS],
        count: 0,
    };

    /// A schema of `keys`.
    pub fn new(keys: &[&str]) -> Result<Self, EntityError> {
        let mut schema = Self::EMPTY;
        for key in keys {
            schema.push(key)?;
        }
        Ok(schema)
    }

    /// Declares one more key.
    ///
    /// ```
    /// let mut schema = ctxwin_core::EntitySchema::EMPTY;
    /// schema.push("budget")?;
    /// assert_eq!(schema.len(), 1);
    /// # Ok::<(), ctxwin_core::entities::EntityError>(())
    /// ```
    pub fn push(&mut self, key: &str) -> Result<(), EntityError> {
        let valid = !key.is_empty()
            && key.len() <= MAX_ENTITY_KEY_LEN
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid || self.position(key).is_some() {
            return Err(EntityError::BadKey);
        }
        let index = usize::from(self.count);
        let (Some(slot), Some(len)) = (self.keys.get_mut(index), self.lens.get_mut(index)) else {
            return Err(EntityError::TooManyKeys);
        };
        if let Some(target) = slot.get_mut(..key.len()) {
            target.copy_from_slice(key.as_bytes());
        }
        *len = key.len() as u8;
        self.count += 1;
        Ok(())
    }

    /// Number of keys.
    pub const fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether no key is declared.
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Key `index`.
    pub fn key(&self, index: usize) -> Option<&str> {
        if index >= self.len() {
            return None;
        }
        let len = usize::from(*self.lens.get(index)?);
        core::str::from_utf8(self.keys.get(index)?.get(..len)?).ok()
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.key(i))
    }

    /// Index of `key`.
    pub fn position(&self, key: &str) -> Option<usize> {
        self.keys().position(|k| k == key)
    }
}

impl Default for EntitySchema {
    fn default() -> Self {
        Self::EMPTY
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for EntitySchema {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // An exact length: postcard cannot encode a sequence of unknown length.
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for key in self.keys() {
            seq.serialize_element(key)?;
        }
        seq.end()
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for EntitySchema {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = EntitySchema;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a list of entity keys")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<EntitySchema, A::Error> {
                let mut schema = EntitySchema::EMPTY;
                while let Some(key) = seq.next_element::<&str>()? {
                    schema.push(key).map_err(serde::de::Error::custom)?;
                }
                Ok(schema)
            }
        }
        deserializer.deserialize_seq(Keys)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Storage for entity values, implemented by [`EntityTable`] only (sealed).
pub trait EntityStorage: sealed::Sealed {
    /// An empty table, usable in `const` context.
    const EMPTY: Self;
    /// Entities it holds values for.
    const KEYS: usize;
    /// Most bytes of one value.
    const VALUE_BYTES: usize;
    #[doc(hidden)]
    fn parts(&self) -> EntityParts<'_>;
    #[doc(hidden)]
    fn parts_mut(&mut self) -> EntityPartsMut<'_>;
}

#[doc(hidden)]
#[derive(Debug)]
pub struct EntityParts<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) lens: &'a [u16],
    pub(crate) value_capacity: usize,
}

#[doc(hidden)]
#[derive(Debug)]
pub struct EntityPartsMut<'a> {
    pub(crate) bytes: &'a mut [u8],
    pub(crate) lens: &'a mut [u16],
    pub(crate) value_capacity: usize,
}

/// Stored length of an entity never set (set values store their length + 1, so an empty
/// table is all zeros).
pub const UNSET: u16 = 0;

/// Values for up to `K` entities of up to `V` bytes each.
///
/// ```
/// use ctxwin_core::{entities::EntityStorage, entities::EntityTable};
/// const TABLE: EntityTable<8, 64> = <EntityTable<8, 64> as EntityStorage>::EMPTY;
/// assert_eq!(core::mem::size_of_val(&TABLE), 8 * 64 + 8 * 2);
/// ```
#[derive(Clone, Debug)]
pub struct EntityTable<const K: usize, const V: usize> {
    bytes: [[u8; V]; K],
    lens: [u16; K],
}

impl<const K: usize, const V: usize> sealed::Sealed for EntityTable<K, V> {}

impl<const K: usize, const V: usize> EntityStorage for EntityTable<K, V> {
    const EMPTY: Self = {
        assert!(V < u16::MAX as usize, "entity values must be shorter than 65535 bytes");
        EntityTable { bytes: [[0; V]; K], lens: [UNSET; K] }
    };
    const KEYS: usize = K;
    const VALUE_BYTES: usize = V;

    fn parts(&self) -> EntityParts<'_> {
        EntityParts { bytes: self.bytes.as_flattened(), lens: &self.lens, value_capacity: V }
    }

    fn parts_mut(&mut self) -> EntityPartsMut<'_> {
        EntityPartsMut {
            bytes: self.bytes.as_flattened_mut(),
            lens: &mut self.lens,
            value_capacity: V,
        }
    }
}

/// The current entity values, read-only: what the payload shows.
///
/// ```
/// use ctxwin_core::{Config, ContextManager, EntitySchema, Message, TinyCapacities};
/// # if !cfg!(feature = "entities") { return Ok(()); }
/// let schema = EntitySchema::new(&["destination", "date"]).unwrap();
/// let config = Config { entity_schema: schema, ..Config::DEFAULT };
/// let mut manager = ContextManager::<TinyCapacities>::with_config(config)?;
/// manager.push(Message::user("My destination is Lisbon. date: 3 May"))?;
/// let entities = manager.entities();
/// assert_eq!(entities.get("destination"), Some("Lisbon"));
/// assert_eq!(entities.get("date"), Some("3 May"));
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Entities<'a> {
    schema: &'a EntitySchema,
    bytes: &'a [u8],
    lens: &'a [u16],
    value_capacity: usize,
}

impl<'a> Entities<'a> {
    pub(crate) fn new(schema: &'a EntitySchema, parts: EntityParts<'a>) -> Self {
        Self { schema, bytes: parts.bytes, lens: parts.lens, value_capacity: parts.value_capacity }
    }

    /// The table without a schema: values by index (snapshots).
    pub(crate) fn raw(parts: EntityParts<'a>) -> Self {
        Self::new(&EntitySchema::EMPTY, parts)
    }

    /// The value of key `index`, if set.
    pub(crate) fn value(&self, index: usize) -> Option<&'a str> {
        let len = usize::from(self.lens.get(index)?.checked_sub(1)?);
        let start = index * self.value_capacity;
        core::str::from_utf8(self.bytes.get(start..start + len)?).ok()
    }

    /// The value of `key`, if declared and set.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.value(self.schema.position(key)?)
    }

    /// Declared keys with their values (`None` when not known yet), in schema order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Option<&'a str>)> + '_ {
        let schema: &'a EntitySchema = self.schema;
        (0..schema.len().min(self.lens.len()))
            .filter_map(move |i| Some((schema.key(i)?, self.value(i))))
    }

    /// Whether any key is declared (the payload shows the table only then).
    pub fn is_declared(&self) -> bool {
        !self.schema.is_empty() && !self.lens.is_empty()
    }
}

/// The entity values, writable: what an [`Extractor`] updates.
#[derive(Debug)]
pub struct EntitiesMut<'a> {
    schema: &'a EntitySchema,
    parts: EntityPartsMut<'a>,
    changed: bool,
}

impl<'a> EntitiesMut<'a> {
    pub(crate) fn new(schema: &'a EntitySchema, parts: EntityPartsMut<'a>) -> Self {
        Self { schema, parts, changed: false }
    }

    /// The declared keys.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.schema.keys().take(self.parts.lens.len())
    }

    /// The current value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let index = self.schema.position(key)?;
        let len = usize::from(self.parts.lens.get(index)?.checked_sub(1)?);
        let start = index * self.parts.value_capacity;
        core::str::from_utf8(self.parts.bytes.get(start..start + len)?).ok()
    }

    /// Sets `key` to `value` (trimmed).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), EntityError> {
        let index = self.schema.position(key).ok_or(EntityError::Undeclared)?;
        let value = value.trim();
        if value.len() > self.parts.value_capacity {
            return Err(EntityError::ValueTooLong);
        }
        if self.get(key) == Some(value) {
            // Unchanged: the entity block (and a cached prompt prefix) stays as it is.
            return Ok(());
        }
        let start = index * self.parts.value_capacity;
        let (Some(target), Some(len)) =
            (self.parts.bytes.get_mut(start..start + value.len()), self.parts.lens.get_mut(index))
        else {
            return Err(EntityError::TooManyKeys);
        };
        target.copy_from_slice(value.as_bytes());
        *len = value.len() as u16 + 1;
        self.changed = true;
        Ok(())
    }

    /// Forgets the value of `key`.
    pub fn clear(&mut self, key: &str) -> Result<(), EntityError> {
        let index = self.schema.position(key).ok_or(EntityError::Undeclared)?;
        if let Some(len) = self.parts.lens.get_mut(index) {
            if *len != UNSET {
                *len = UNSET;
                self.changed = true;
            }
        }
        Ok(())
    }

    /// Most bytes a value may have.
    pub fn value_capacity(&self) -> usize {
        self.parts.value_capacity
    }

    pub(crate) fn changed(&self) -> bool {
        self.changed
    }
}

/// Updates entity values from a user message.
///
/// Contract: only declared keys are set ([`EntitiesMut::set`] refuses others); never allocate
/// or panic; a value that does not fit is skipped, not cut mid-word.
///
/// ```
/// use ctxwin_core::{entities::EntitiesMut, entities::Extractor};
/// /// Sets `mood` whenever the user says "happy".
/// struct Mood;
/// impl Extractor for Mood {
///     fn extract(&mut self, text: &str, entities: &mut EntitiesMut<'_>) {
///         if text.contains("happy") {
///             let _ = entities.set("mood", "happy");
///         }
///     }
/// }
/// ```
pub trait Extractor {
    /// Reads `text` and updates `entities`.
    fn extract(&mut self, text: &str, entities: &mut EntitiesMut<'_>);
}

/// The pattern extractor the core ships: `key: value`, `key = value` and "my key is value"
/// (case-insensitive; `_` in a key also matches a space).
///
/// ```
/// use ctxwin_core::{Config, ContextManager, EntitySchema, Message, TinyCapacities};
/// # if !cfg!(feature = "entities") { return Ok(()); }
/// let schema = EntitySchema::new(&["departure_date", "seats"]).unwrap();
/// let config = Config { entity_schema: schema, ..Config::DEFAULT };
/// let mut manager = ContextManager::<TinyCapacities>::with_config(config)?;
/// manager.push(Message::user("Seats = 2. Our departure date is June 12."))?;
/// assert_eq!(manager.entities().get("seats"), Some("2"));
/// assert_eq!(manager.entities().get("departure_date"), Some("June 12"));
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patterns;

/// Whether `haystack[at..]` starts with `key`, `_` matching `_` or a space, ignoring case.
fn key_at(haystack: &[u8], at: usize, key: &[u8]) -> bool {
    haystack.get(at..at + key.len()).is_some_and(|window| {
        window
            .iter()
            .zip(key)
            .all(|(&h, &k)| h.eq_ignore_ascii_case(&k) || (k == b'_' && (h == b' ' || h == b'-')))
    })
}

/// The value after a key: up to the end of the line or sentence.
fn value_from(text: &str, start: usize) -> &str {
    let rest = text.get(start..).unwrap_or_default();
    let bytes = rest.as_bytes();
    let mut end = rest.len();
    for (at, &b) in bytes.iter().enumerate() {
        let next = bytes.get(at + 1).copied();
        let sentence_end =
            matches!(b, b'.' | b'!' | b'?') && next.is_none_or(|n| n == b' ' || n == b'\n');
        if b == b'\n' || b == b';' || b == b',' && next == Some(b' ') || sentence_end {
            end = at;
            break;
        }
    }
    rest.get(..end).unwrap_or_default().trim().trim_matches(['"', '\''])
}

impl Patterns {
    /// The value `text` states for `key`, if any (the last statement wins).
    fn find<'t>(text: &'t str, key: &str) -> Option<&'t str> {
        let bytes = text.as_bytes();
        let key = key.as_bytes();
        let mut found = None;
        for at in 0..bytes.len() {
            let boundary = at == 0
                || !bytes.get(at - 1).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
            if !boundary || !key_at(bytes, at, key) {
                continue;
            }
            let after = at + key.len();
            if bytes.get(after).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_') {
                continue;
            }
            let mut cursor = after;
            while bytes.get(cursor) == Some(&b' ') {
                cursor += 1;
            }
            let value_start = match bytes.get(cursor) {
                Some(b':') | Some(b'=') => Some(cursor + 1),
                _ if key_at(bytes, cursor, b"is ") => Some(cursor + 3),
                _ => None,
            };
            if let Some(start) = value_start {
                let value = value_from(text, start);
                if !value.is_empty() {
                    found = Some(value);
                }
            }
        }
        found
    }
}

impl Extractor for Patterns {
    fn extract(&mut self, text: &str, entities: &mut EntitiesMut<'_>) {
        let schema = *entities.schema;
        for key in schema.keys() {
            if let Some(value) = Self::find(text, key) {
                let _ = entities.set(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(text: &str, key: &str) -> Option<String> {
        Patterns::find(text, key).map(str::to_string)
    }

    #[test]
    fn finds_the_three_forms() {
        assert_eq!(find("destination: Paris", "destination").as_deref(), Some("Paris"));
        assert_eq!(find("Budget = 1200 EUR; thanks", "budget").as_deref(), Some("1200 EUR"));
        assert_eq!(find("Hi! My name is Ada Lovelace.", "name").as_deref(), Some("Ada Lovelace"));
        assert_eq!(
            find("the return date is 3.5.2026 and more", "return_date").as_deref(),
            Some("3.5.2026 and more")
        );
        assert_eq!(
            find("Destination:Rome\ndestination: Oslo", "destination").as_deref(),
            Some("Oslo"),
            "last wins"
        );
    }

    #[test]
    fn ignores_partial_words_and_missing_values() {
        assert_eq!(find("redestination: x", "destination"), None);
        assert_eq!(find("destinations: x", "destination"), None);
        assert_eq!(find("destination:", "destination"), None);
        assert_eq!(find("no key here", "destination"), None);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,120}", key in "[a-z_]{1,12}") {
            let _ = Patterns::find(&text, &key);
        }
    }
}
