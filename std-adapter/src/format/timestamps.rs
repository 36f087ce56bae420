//! Message timestamps where an input format carries them: a `timestamp`, `created_at`,
//! `created`, `time` or `date` field on each message object, as Unix seconds, Unix
//! milliseconds, or an RFC 3339 / ISO 8601 date (`2023-05-08T13:56:00Z`, `2023-05-08 13:56`,
//! `2023-05-08`; an offset such as `+02:00` is applied). Provider formats have no such field,
//! but exports (chat logs, LoCoMo-style sets, agent traces) often do; `import` gives those
//! messages their own time, so ages come from when things were said, not from the import.

use serde_json::Value;

/// Field names read as a message's time, first found wins.
const FIELDS: [&str; 5] = ["timestamp", "created_at", "created", "time", "date"];

/// The timestamp (ms since the Unix epoch) of each of `count` read messages, from the raw
/// `input` (JSON document or JSONL). The raw message objects are matched to the read messages
/// one to one, or with system/developer messages left out (the reader may move them to
/// [`Conversation::system`](crate::Conversation::system)), or as the Anthropic reader splits
/// them (each `tool_result` block and each text block of a user turn is a message of its own,
/// all with that turn's time); when nothing matches, every entry is `None`, and `import` gives
/// those messages ages in turn order.
///
/// ```
/// use ctxwin_std::format::message_timestamps;
/// let jsonl = "{\"role\":\"user\",\"content\":\"hi\",\"timestamp\":\"2023-05-08T13:56:00Z\"}\n\
///              {\"role\":\"assistant\",\"content\":\"hello\",\"created\":1683554200}\n\
///              {\"role\":\"user\",\"content\":\"no time\"}\n";
/// assert_eq!(
///     message_timestamps(jsonl, 3),
///     [Some(1_683_554_160_000), Some(1_683_554_200_000), None]
/// );
/// ```
pub fn message_timestamps(input: &str, count: usize) -> Vec<Option<u64>> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    let objects: Vec<Value> = match serde_json::from_str::<Value>(input) {
        Ok(Value::Array(items)) => items,
        // One JSONL line is a JSON document too.
        Ok(Value::Object(root)) if root.contains_key("role") => vec![Value::Object(root)],
        Ok(Value::Object(mut root)) => match root.remove("messages") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => input
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|value| value.get("role").is_some())
            .collect(),
    };
    let stamps = |objects: &mut dyn Iterator<Item = &Value>| -> Vec<Option<u64>> {
        objects.map(message_time).collect()
    };
    let all = stamps(&mut objects.iter());
    if all.len() == count {
        return all;
    }
    let is_system = |value: &&Value| {
        matches!(value.get("role").and_then(Value::as_str), Some("system" | "developer"))
    };
    let spoken = stamps(&mut objects.iter().filter(|v| !is_system(v)));
    if spoken.len() == count {
        return spoken;
    }
    split_stamps(&objects, count).unwrap_or_else(|| vec![None; count])
}

/// Each object's time repeated for every message the Anthropic reader makes of it (a user
/// turn with tool results becomes one message per result and per text block), when those
/// counts add up to `count`. The reader itself does the counting, so the split stays the one
/// `import` reads.
fn split_stamps(objects: &[Value], count: usize) -> Option<Vec<Option<u64>>> {
    let mut stamps = Vec::with_capacity(count);
    for object in objects {
        let alone = serde_json::to_string(&[object]).ok()?;
        let made = super::read(&alone, super::Format::AnthropicJson).ok()?.messages.len();
        stamps.extend(std::iter::repeat_n(message_time(object), made));
    }
    (stamps.len() == count).then_some(stamps)
}

fn message_time(message: &Value) -> Option<u64> {
    FIELDS.iter().find_map(|field| message.get(field).and_then(parse_time))
}

/// A time value: Unix seconds or milliseconds (a number, or digits in a string), or an ISO
/// 8601 date.
fn parse_time(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_f64().and_then(epoch_ms),
        Value::String(s) => {
            let s = s.trim();
            match s.parse::<f64>() {
                Ok(n) => epoch_ms(n),
                Err(_) => parse_iso(s),
            }
        }
        _ => None,
    }
}

/// Seconds below 10^11 (until the year 5138), milliseconds above.
fn epoch_ms(n: f64) -> Option<u64> {
    if !n.is_finite() || n <= 0.0 {
        return None;
    }
    let ms = if n < 1e11 { n * 1000.0 } else { n };
    (ms < 1e16).then_some(ms as u64)
}

/// `YYYY-MM-DD`, then optionally `T` or a space, `HH:MM[:SS[.fff]]`, and `Z` or `±HH:MM`.
fn parse_iso(s: &str) -> Option<u64> {
    let number = |text: &str| -> Option<i64> {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    let date = s.get(..10)?;
    let (year, month, day) =
        (number(date.get(..4)?)?, number(date.get(5..7)?)?, number(date.get(8..10)?)?);
    if date.get(4..5)? != "-" || date.get(7..8)? != "-" || !(1..=12).contains(&month) {
        return None;
    }
    if !(1..=31).contains(&day) {
        return None;
    }
    let mut ms = days_from_civil(year, month, day) * 86_400_000;
    let rest = s.get(10..)?;
    if let Some(time) = rest.strip_prefix(['T', 't', ' ']) {
        let end = time.find(['Z', 'z', '+', '-']).unwrap_or(time.len());
        let (clock, zone) = (time.get(..end)?, time.get(end..)?);
        let mut parts = clock.split(':');
        let hours = number(parts.next()?)?;
        let minutes = number(parts.next()?)?;
        let seconds: f64 = match parts.next() {
            Some(sec) => sec.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?,
            None => 0.0,
        };
        if hours > 23 || minutes > 59 || seconds >= 61.0 {
            return None;
        }
        ms += (hours * 3_600 + minutes * 60) * 1000 + (seconds * 1000.0) as i64;
        if let Some(offset) = zone.strip_prefix(['+', '-']) {
            let sign = if zone.starts_with('+') { 1 } else { -1 };
            let (h, m) = offset.split_once(':').unwrap_or((offset.get(..2)?, offset.get(2..)?));
            ms -= sign * (number(h)? * 60 + number(m).unwrap_or(0)) * 60_000;
        }
    } else if !rest.is_empty() {
        return None;
    }
    u64::try_from(ms).ok().filter(|&ms| ms > 0)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates_and_epochs() {
        assert_eq!(parse_iso("1970-01-01"), None, "the epoch itself is no time");
        assert_eq!(parse_iso("1970-01-02"), Some(86_400_000));
        assert_eq!(parse_iso("2023-05-08T13:56:00Z"), Some(1_683_554_160_000));
        assert_eq!(parse_iso("2023-05-08 15:56:00+02:00"), Some(1_683_554_160_000));
        assert_eq!(parse_iso("2023-05-08T13:56:00.250Z"), Some(1_683_554_160_250));
        assert_eq!(parse_iso("2024-02-29T00:00Z"), Some(1_709_164_800_000));
        assert_eq!(parse_iso("8 May 2023"), None);
        assert_eq!(parse_iso("2023-13-01"), None);
        assert_eq!(parse_time(&Value::from(1_683_554_160u64)), Some(1_683_554_160_000));
        assert_eq!(parse_time(&Value::from(1_683_554_160_000u64)), Some(1_683_554_160_000));
        assert_eq!(parse_time(&Value::from("1683554160")), Some(1_683_554_160_000));
        assert_eq!(parse_time(&Value::Bool(true)), None);
    }

    #[test]
    fn documents_match_messages_or_give_up() {
        let body = r#"{"messages":[
            {"role":"system","content":"rules","timestamp":1},
            {"role":"user","content":"a","created_at":"2023-05-08"},
            {"role":"assistant","content":"b"}]}"#;
        // Three read messages: matched one to one.
        assert_eq!(message_timestamps(body, 3), [Some(1000), Some(1_683_504_000_000), None]);
        // The system prompt read apart: matched without it.
        assert_eq!(message_timestamps(body, 2), [Some(1_683_504_000_000), None]);
        // A reader that split messages: nothing is guessed.
        assert_eq!(message_timestamps(body, 5), [None; 5]);
        assert_eq!(message_timestamps("not json", 2), [None, None]);
        let one = "{\"role\":\"user\",\"content\":\"a\",\"time\":1683554160}\n";
        assert_eq!(message_timestamps(one, 1), [Some(1_683_554_160_000)]);
    }

    #[test]
    fn anthropic_turns_split_by_the_reader_keep_their_time() {
        let body = r#"{"messages":[
            {"role":"user","content":"list files","timestamp":"2023-05-08T10:00:00Z"},
            {"role":"assistant","timestamp":"2023-05-08T10:00:05Z","content":[
                {"type":"text","text":"Looking."},
                {"type":"tool_use","id":"a","name":"ls","input":{}},
                {"type":"tool_use","id":"b","name":"pwd","input":{}}]},
            {"role":"user","timestamp":"2023-05-08T10:01:00Z","content":[
                {"type":"tool_result","tool_use_id":"a","content":"x.rs"},
                {"type":"tool_result","tool_use_id":"b","content":"/src"},
                {"type":"text","text":"and now?"}]}]}"#;
        let read = crate::format::read(body, crate::format::Format::AnthropicJson).unwrap();
        assert_eq!(read.messages.len(), 5, "the user turn splits into two results and a text");
        let at = |hms: &str| parse_iso(&format!("2023-05-08T{hms}Z"));
        assert_eq!(
            message_timestamps(body, read.messages.len()),
            [at("10:00:00"), at("10:00:05"), at("10:01:00"), at("10:01:00"), at("10:01:00")]
        );
        // A count the reader's split does not give is still not guessed.
        assert_eq!(message_timestamps(body, 4), [None; 4]);
    }
}
