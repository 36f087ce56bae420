//! Checkpoint ids: a UTC timestamp with microseconds plus a sequence number.
//!
//! The grammar is exactly `YYYYMMDDTHHMMSS.ffffffZ-NNNNNN` (30 ASCII characters), so an id
//! is always a plain file name: it cannot hold a separator, a dot-dot, a NUL or a drive
//! letter, and ids compare in time order as plain strings.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MICROS_PER_SEC: u64 = 1_000_000;
const SECS_PER_DAY: u64 = 86_400;
/// Sequence numbers run over six decimal digits.
const SEQ_LIMIT: u32 = 1_000_000;
/// `D` stands for an ASCII digit; every other byte must match literally.
const PATTERN: &[u8; CheckpointId::LEN] = b"DDDDDDDDTDDDDDD.DDDDDDZ-DDDDDD";
/// Last microsecond of 9999-12-31, the last instant a four-digit year can name.
const MAX_MICROS: u64 = days_from_civil(10_000, 1, 1) * SECS_PER_DAY * MICROS_PER_SEC - 1;

/// Why a string is not a checkpoint id.
///
/// ```
/// use ctxwin_std::store::checkpoint::{CheckpointId, IdError};
/// assert_eq!(CheckpointId::parse("../etc/passwd"), Err(IdError::Length { len: 13 }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The string is empty.
    #[error("checkpoint id is empty")]
    Empty,
    /// The string is not exactly [`CheckpointId::LEN`] bytes long.
    #[error(
        "checkpoint id must be {} bytes (YYYYMMDDTHHMMSS.ffffffZ-NNNNNN), got {len}",
        CheckpointId::LEN
    )]
    Length {
        /// Length of the refused string in bytes.
        len: usize,
    },
    /// A character does not fit the grammar at its position.
    #[error("checkpoint id has {found:?} at position {position}, expected {expected}")]
    UnexpectedChar {
        /// Zero-based byte position.
        position: usize,
        /// The character found there.
        found: char,
        /// What the grammar wants there.
        expected: &'static str,
    },
    /// The digits are well placed but name no valid UTC time.
    #[error("checkpoint id has {field} {value}, which is out of range")]
    FieldOutOfRange {
        /// Which field: `year`, `month`, `day`, `hour`, `minute` or `second`.
        field: &'static str,
        /// The value found.
        value: u32,
    },
}

/// A validated checkpoint id such as `20261122T203412.123456Z-000042`.
///
/// Ids order by creation time (their string order is their time order), and one process
/// never hands out the same id twice. The only way to build one from outside is
/// [`CheckpointId::parse`], which accepts nothing but the exact grammar, so an id can be
/// joined to the store directory without any risk of escaping it.
///
/// # Examples
///
/// ```
/// use ctxwin_std::store::checkpoint::CheckpointId;
/// let id: CheckpointId = "20261122T203412.123456Z-000042".parse()?;
/// assert_eq!(id.sequence(), 42);
/// assert_eq!(id.to_string(), "20261122T203412.123456Z-000042");
/// assert!("a/b".parse::<CheckpointId>().is_err());
/// # Ok::<(), ctxwin_std::store::checkpoint::IdError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId(String);

impl CheckpointId {
    /// Length of every id in bytes.
    pub const LEN: usize = 30;

    /// Parses `text`, refusing anything that is not exactly the id grammar.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::store::checkpoint::{CheckpointId, IdError};
    /// assert!(CheckpointId::parse("20240229T235959.999999Z-999999").is_ok());
    /// assert_eq!(
    ///     CheckpointId::parse("20230229T000000.000000Z-000000"),
    ///     Err(IdError::FieldOutOfRange { field: "day", value: 29 })
    /// );
    /// ```
    pub fn parse(text: &str) -> Result<Self, IdError> {
        if text.is_empty() {
            return Err(IdError::Empty);
        }
        if text.len() != Self::LEN {
            return Err(IdError::Length { len: text.len() });
        }
        // Positions are byte offsets; every char before the first mismatch is ASCII, so
        // char index and byte offset agree up to the first error.
        for ((position, found), &want) in text.char_indices().zip(PATTERN.iter()) {
            let fits =
                if want == b'D' { found.is_ascii_digit() } else { found == char::from(want) };
            if !fits {
                let expected = match want {
                    b'D' => "a digit",
                    b'T' => "'T'",
                    b'.' => "'.'",
                    b'Z' => "'Z'",
                    _ => "'-'",
                };
                return Err(IdError::UnexpectedChar { position, found, expected });
            }
        }
        let digits = text.as_bytes();
        let year = decimal(digits, 0, 4);
        let month = decimal(digits, 4, 2);
        let day = decimal(digits, 6, 2);
        check_range("year", year, 1970, 9999)?;
        check_range("month", month, 1, 12)?;
        check_range("day", day, 1, days_in_month(year, month))?;
        check_range("hour", decimal(digits, 9, 2), 0, 23)?;
        check_range("minute", decimal(digits, 11, 2), 0, 59)?;
        check_range("second", decimal(digits, 13, 2), 0, 59)?;
        Ok(Self(text.to_owned()))
    }

    /// The id as text.
    ///
    /// ```
    /// # use ctxwin_std::store::checkpoint::CheckpointId;
    /// let id = CheckpointId::parse("19700101T000000.000000Z-000000").unwrap();
    /// assert_eq!(id.as_str(), "19700101T000000.000000Z-000000");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The UTC instant the id names.
    ///
    /// ```
    /// # use ctxwin_std::store::checkpoint::CheckpointId;
    /// use std::time::{Duration, UNIX_EPOCH};
    /// let id = CheckpointId::parse("19700102T000000.000001Z-000000").unwrap();
    /// assert_eq!(id.timestamp(), UNIX_EPOCH + Duration::from_micros(86_400_000_001));
    /// ```
    pub fn timestamp(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.unix_micros())
    }

    /// The UTC instant the id names, to the second, as `YYYY-MM-DD HH:MM:SS UTC` (for people).
    ///
    /// ```
    /// # use ctxwin_std::store::checkpoint::CheckpointId;
    /// let id = CheckpointId::parse("20261122T203412.123456Z-000042").unwrap();
    /// assert_eq!(id.taken_utc(), "2026-11-22 20:34:12 UTC");
    /// ```
    pub fn taken_utc(&self) -> String {
        let secs = self.unix_micros() / MICROS_PER_SEC;
        let (days, rest) = (secs / SECS_PER_DAY, secs % SECS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        format!(
            "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
            rest / 3600,
            rest % 3600 / 60,
            rest % 60
        )
    }

    /// The per-process sequence number (the last six digits).
    ///
    /// ```
    /// # use ctxwin_std::store::checkpoint::CheckpointId;
    /// let id = CheckpointId::parse("19700101T000000.000000Z-000007").unwrap();
    /// assert_eq!(id.sequence(), 7);
    /// ```
    pub fn sequence(&self) -> u32 {
        decimal(self.0.as_bytes(), 24, 6)
    }

    fn unix_micros(&self) -> u64 {
        let d = self.0.as_bytes();
        let days = days_from_civil(decimal(d, 0, 4), decimal(d, 4, 2), decimal(d, 6, 2));
        let secs = u64::from(decimal(d, 9, 2)) * 3600
            + u64::from(decimal(d, 11, 2)) * 60
            + u64::from(decimal(d, 13, 2));
        (days * SECS_PER_DAY + secs) * MICROS_PER_SEC + u64::from(decimal(d, 16, 6))
    }

    /// Formats an id; `None` when `micros` lies past year 9999.
    fn from_parts(micros: u64, sequence: u32) -> Option<Self> {
        if micros > MAX_MICROS || sequence >= SEQ_LIMIT {
            return None;
        }
        let secs = micros / MICROS_PER_SEC;
        let (year, month, day) = civil_from_days(secs / SECS_PER_DAY);
        let of_day = secs % SECS_PER_DAY;
        Some(Self(format!(
            "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{:06}Z-{sequence:06}",
            of_day / 3600,
            of_day / 60 % 60,
            of_day % 60,
            micros % MICROS_PER_SEC,
        )))
    }

    /// Hands out the next id of this process for the wall-clock time `now`.
    ///
    /// Ids of one process strictly increase even when the clock stands still or steps
    /// back; `None` when `now` lies before 1970 or after 9999.
    #[cfg(test)]
    pub(crate) fn next(now: SystemTime) -> Option<Self> {
        Self::next_after(now, None)
    }

    /// As [`next`](Self::next), but also later than `floor` (the newest id in a store), so a
    /// clock that stepped back never produces an id that sorts before an existing one.
    pub(crate) fn next_after(now: SystemTime, floor: Option<&CheckpointId>) -> Option<Self> {
        static LAST: Mutex<Option<(u64, u32)>> = Mutex::new(None);
        let micros = u64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_micros()).ok()?;
        let micros = match floor {
            Some(floor) => micros.max(floor.unix_micros().checked_add(1)?),
            None => micros,
        };
        // A panic elsewhere while holding the lock leaves a consistent pair behind.
        let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (micros, sequence) = advance(*last, micros);
        let id = Self::from_parts(micros, sequence)?;
        *last = Some((micros, sequence));
        Some(id)
    }
}

/// The `(microseconds, sequence)` pair after `last`, strictly greater than it.
fn advance(last: Option<(u64, u32)>, now: u64) -> (u64, u32) {
    let Some((last_micros, last_seq)) = last else { return (now, 0) };
    let seq = (last_seq + 1) % SEQ_LIMIT;
    if now > last_micros {
        (now, seq)
    } else if seq > last_seq {
        (last_micros, seq)
    } else {
        (last_micros + 1, seq)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for CheckpointId {
    type Err = IdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl AsRef<str> for CheckpointId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Reads `len` ASCII digits at `start`; callers have checked the grammar.
fn decimal(digits: &[u8], start: usize, len: usize) -> u32 {
    digits
        .iter()
        .skip(start)
        .take(len)
        .fold(0, |acc, &digit| acc * 10 + u32::from(digit.wrapping_sub(b'0')))
}

fn check_range(field: &'static str, value: u32, min: u32, max: u32) -> Result<(), IdError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(IdError::FieldOutOfRange { field, value })
    }
}

const fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

const fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date from 1970 on (H. Hinnant's algorithm).
const fn days_from_civil(year: u32, month: u32, day: u32) -> u64 {
    let year = (if month <= 2 { year - 1 } else { year }) as u64;
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (if month > 2 { month - 3 } else { month + 9 }) as u64;
    let day_of_year = (153 * month_from_march + 2) / 5 + day as u64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Inverse of [`days_from_civil`]: the Gregorian (year, month, day) of `days` since
/// 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(
            CheckpointId::from_parts(0, 0).unwrap().as_str(),
            "19700101T000000.000000Z-000000"
        );
        // 2026-11-22T20:34:12.123456Z
        let micros = 1_795_379_652_123_456;
        assert_eq!(
            CheckpointId::from_parts(micros, 42).unwrap().as_str(),
            "20261122T203412.123456Z-000042"
        );
        assert_eq!(
            CheckpointId::from_parts(MAX_MICROS, 999_999).unwrap().as_str(),
            "99991231T235959.999999Z-999999"
        );
        assert_eq!(CheckpointId::from_parts(MAX_MICROS + 1, 0), None);
        assert_eq!(CheckpointId::from_parts(0, SEQ_LIMIT), None);
    }

    #[test]
    fn refuses_paths_and_junk() {
        let refused = [
            ("", IdError::Empty),
            ("../x", IdError::Length { len: 4 }),
            ("/etc/passwd", IdError::Length { len: 11 }),
            ("a/b", IdError::Length { len: 3 }),
            ("20261122T203412.123456Z-0000421", IdError::Length { len: 31 }),
        ];
        for (text, error) in refused {
            assert_eq!(CheckpointId::parse(text), Err(error), "{text:?}");
        }
        let same_length_attacks = [
            "../../../../../../../../etc/pw",
            "/20261122T203412.123456Z-00004",
            "20261122T203412.123456Z/000042",
            "20261122T203412.123456Z-00004\0",
            "20261122T203412.123456Z\\000042",
            "2026112\u{e9}T203412.123456Z-00004",
            "20261122t203412.123456Z-000042",
            "20261122T203412.123456z-000042",
            "C:261122T203412.123456Z-000042",
            "+0261122T203412.123456Z-000042",
            "20261122T203412 123456Z-000042",
        ];
        for text in same_length_attacks {
            assert_eq!(text.len(), CheckpointId::LEN, "{text:?}");
            assert!(
                matches!(CheckpointId::parse(text), Err(IdError::UnexpectedChar { .. })),
                "{text:?} -> {:?}",
                CheckpointId::parse(text)
            );
        }
        assert_eq!(
            CheckpointId::parse("20261122T203412.123456Z-00004\0"),
            Err(IdError::UnexpectedChar { position: 29, found: '\0', expected: "a digit" })
        );
    }

    #[test]
    fn refuses_impossible_times() {
        let cases = [
            ("19691231T235959.999999Z-000000", "year", 1969),
            ("20261322T203412.123456Z-000042", "month", 13),
            ("20260022T203412.123456Z-000042", "month", 0),
            ("20260431T203412.123456Z-000042", "day", 31),
            ("21000229T203412.123456Z-000042", "day", 29),
            ("20261122T243412.123456Z-000042", "hour", 24),
            ("20261122T206012.123456Z-000042", "minute", 60),
            ("20261122T203460.123456Z-000042", "second", 60),
        ];
        for (text, field, value) in cases {
            assert_eq!(
                CheckpointId::parse(text),
                Err(IdError::FieldOutOfRange { field, value }),
                "{text}"
            );
        }
        assert!(CheckpointId::parse("20000229T000000.000000Z-000000").is_ok());
    }

    #[test]
    fn next_ids_strictly_increase_and_never_repeat() {
        let now = SystemTime::now();
        let ids: Vec<_> = (0..10_000).map(|_| CheckpointId::next(now).unwrap()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids);
    }

    #[test]
    fn next_refuses_times_outside_the_grammar() {
        assert_eq!(CheckpointId::next(UNIX_EPOCH - Duration::from_secs(1)), None);
        let year_10000 = UNIX_EPOCH + Duration::from_micros(MAX_MICROS + 1);
        assert_eq!(CheckpointId::next(year_10000), None);
    }

    #[test]
    fn advance_survives_clock_steps_and_sequence_wrap() {
        assert_eq!(advance(None, 5), (5, 0));
        assert_eq!(advance(Some((5, 3)), 9), (9, 4));
        assert_eq!(advance(Some((5, 3)), 5), (5, 4));
        assert_eq!(advance(Some((5, 3)), 1), (5, 4));
        assert_eq!(advance(Some((5, SEQ_LIMIT - 1)), 5), (6, 0));
        assert_eq!(advance(Some((5, SEQ_LIMIT - 1)), 7), (7, 0));
    }

    proptest! {
        #[test]
        fn format_parse_round_trips(micros in 0..=MAX_MICROS, seq in 0..SEQ_LIMIT) {
            let id = CheckpointId::from_parts(micros, seq).unwrap();
            let parsed = CheckpointId::parse(id.as_str()).unwrap();
            prop_assert_eq!(parsed.unix_micros(), micros);
            prop_assert_eq!(parsed.sequence(), seq);
            prop_assert_eq!(parsed, id);
        }

        #[test]
        fn string_order_is_time_order(
            a in (0..=MAX_MICROS, 0..SEQ_LIMIT),
            b in (0..=MAX_MICROS, 0..SEQ_LIMIT),
        ) {
            let id_a = CheckpointId::from_parts(a.0, a.1).unwrap();
            let id_b = CheckpointId::from_parts(b.0, b.1).unwrap();
            prop_assert_eq!(id_a.cmp(&id_b), a.cmp(&b));
        }

        #[test]
        fn any_char_off_the_grammar_is_refused(
            micros in 0..=MAX_MICROS,
            seq in 0..SEQ_LIMIT,
            position in 0..CheckpointId::LEN,
            replacement in any::<char>(),
        ) {
            let valid = CheckpointId::from_parts(micros, seq).unwrap().0;
            let mut chars: Vec<char> = valid.chars().collect();
            chars[position] = replacement;
            let mutated: String = chars.into_iter().collect();
            let fits = if PATTERN[position] == b'D' {
                replacement.is_ascii_digit()
            } else {
                replacement == char::from(PATTERN[position])
            };
            match CheckpointId::parse(&mutated) {
                Ok(id) => {
                    prop_assert!(fits, "{:?} accepted", mutated);
                    prop_assert!(id.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
                }
                Err(IdError::FieldOutOfRange { .. }) => prop_assert!(fits),
                Err(_) => prop_assert!(!fits),
            }
        }
    }
}
