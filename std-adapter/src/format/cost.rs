//! Estimated token costs of content the counter cannot read: images (from their header's
//! size, with each provider's published formula), documents, audio, and any other block.
//!
//! ```
//! use ctxwin_std::format::cost::{anthropic_image_tokens, openai_image_tokens};
//! assert_eq!(openai_image_tokens(Some((1024, 1024))), 765);
//! assert_eq!(anthropic_image_tokens(Some((1000, 1000))), 1334);
//! ```

use base64::Engine;
use serde_json::Value;

/// OpenAI's published formula for `detail: high`: fit in 2048×2048, shortest side to 768,
/// 170 tokens per 512-pixel tile plus 85. Unknown size: a 1024×1024 image (765).
///
/// ```
/// use ctxwin_std::format::cost::openai_image_tokens;
/// assert_eq!(openai_image_tokens(Some((2048, 4096))), 1105);
/// assert_eq!(openai_image_tokens(None), 765);
/// ```
pub fn openai_image_tokens(dims: Option<(u32, u32)>) -> u32 {
    let Some((w, h)) = dims else { return 765 };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    let short = (768.0 / w.min(h)).min(1.0);
    w *= short;
    h *= short;
    let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
    85 + 170 * tiles as u32
}

/// Anthropic's published formula: `width × height / 750`, after scaling the long edge to at
/// most 1,568 pixels. Unknown size: the largest image it keeps unscaled (1,600).
///
/// ```
/// use ctxwin_std::format::cost::anthropic_image_tokens;
/// assert_eq!(anthropic_image_tokens(Some((200, 200))), 54);
/// assert_eq!(anthropic_image_tokens(None), 1_600);
/// ```
pub fn anthropic_image_tokens(dims: Option<(u32, u32)>) -> u32 {
    let Some((w, h)) = dims else { return 1_600 };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let fit = (1568.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    ((w * h / 750.0).ceil() as u32).clamp(1, 1_600)
}

/// Documents (PDF and other files) by size: about 1,500 tokens per 100 KB page-equivalent,
/// at least 256.
///
/// ```
/// assert_eq!(ctxwin_std::format::cost::document_tokens(64_000), 1_000);
/// assert_eq!(ctxwin_std::format::cost::document_tokens(0), 256);
/// ```
pub fn document_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes / 64).unwrap_or(u32::MAX).max(256)
}

/// Audio by size: about 1 token per 160 bytes (16 kB/s speech at ~100 tokens/s), at least 32.
///
/// ```
/// assert_eq!(ctxwin_std::format::cost::audio_tokens(16_000), 100);
/// ```
pub fn audio_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes / 160).unwrap_or(u32::MAX).max(32)
}

/// Any other block: a quarter of its JSON length, at least 1.
///
/// ```
/// let block = serde_json::json!({"type": "server_tool_use", "id": "s1"});
/// assert_eq!(ctxwin_std::format::cost::json_tokens(&block), 9);
/// ```
pub fn json_tokens(value: &Value) -> u32 {
    let mut length = JsonLength(0);
    // Counted as written: a web search result's JSON is not copied just to be measured.
    let _ = serde_json::to_writer(&mut length, value);
    u32::try_from(length.0 / 4).unwrap_or(u32::MAX).max(1)
}

/// A writer that only counts the bytes written to it.
struct JsonLength(usize);

impl std::io::Write for JsonLength {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Plain text the counter does not see (a text document's data, redacted thinking): a quarter
/// of its length, at least 1.
pub(super) fn text_tokens(text: &str) -> u32 {
    u32::try_from(text.len() / 4).unwrap_or(u32::MAX).max(1)
}

/// The bytes base64 text of `len` characters decodes to, about.
pub(super) const fn base64_len(len: usize) -> usize {
    len / 4 * 3 + len % 4 * 3 / 4
}

/// The media type and the first bytes of a `data:` URL with base64 data (see
/// [`decode_prefix`]).
pub(super) fn data_url_bytes(url: &str) -> Option<(String, Vec<u8>)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.split(';').next().unwrap_or("").to_string();
    meta.ends_with(";base64").then_some(())?;
    Some((media, decode_prefix(data)))
}

/// Decodes enough of a base64 string to read an image header (JPEG may need more: the
/// whole string up to 4 MB). Empty when it does not decode.
pub(super) fn decode_prefix(data: &str) -> Vec<u8> {
    let end = data.len().min(4 << 20) / 4 * 4;
    let engine = base64::engine::general_purpose::STANDARD;
    data.as_bytes().get(..end).and_then(|prefix| engine.decode(prefix).ok()).unwrap_or_default()
}

/// Width and height from a PNG, GIF, JPEG or WebP header; `None` for anything else.
///
/// ```
/// use ctxwin_std::format::cost::image_size;
/// assert_eq!(image_size(b"GIF89a\x10\x00\x20\x00rest"), Some((16, 32)));
/// assert_eq!(image_size(b"not an image"), None);
/// ```
pub fn image_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some((be32(bytes, 16)?, be32(bytes, 20)?));
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return Some((u32::from(le16(bytes, 6)?), u32::from(le16(bytes, 8)?)));
    }
    if bytes.len() >= 30 && bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        return webp_size(bytes);
    }
    if bytes.starts_with(&[0xff, 0xd8]) {
        return jpeg_size(bytes);
    }
    None
}

fn byte(bytes: &[u8], at: usize) -> Option<u8> {
    bytes.get(at).copied()
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(b))
}

fn le16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes([byte(bytes, at)?, byte(bytes, at.checked_add(1)?)?]))
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([byte(bytes, at)?, byte(bytes, at.checked_add(1)?)?]))
}

fn le24(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes([byte(bytes, at)?, byte(bytes, at + 1)?, byte(bytes, at + 2)?, 0]))
}

fn webp_size(bytes: &[u8]) -> Option<(u32, u32)> {
    match bytes.get(12..16)? {
        b"VP8X" => Some((1 + le24(bytes, 24)?, 1 + le24(bytes, 27)?)),
        b"VP8 " => {
            Some((u32::from(le16(bytes, 26)? & 0x3fff), u32::from(le16(bytes, 28)? & 0x3fff)))
        }
        b"VP8L" => {
            let b: [u8; 4] = bytes.get(21..25)?.try_into().ok()?;
            let [b0, b1, b2, b3] = b.map(u32::from);
            let w = 1 + (b0 | ((b1 & 0x3f) << 8));
            let h = 1 + ((b1 >> 6) | (b2 << 2) | ((b3 & 0x0f) << 10));
            Some((w, h))
        }
        _ => None,
    }
}

/// Walks the JPEG segments to the first start-of-frame marker.
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut i = 2usize;
    while i.saturating_add(9) < bytes.len() {
        if byte(bytes, i)? != 0xff {
            i += 1;
            continue;
        }
        let marker = byte(bytes, i + 1)?;
        let len = usize::from(be16(bytes, i + 2)?);
        let sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if sof {
            return Some((u32::from(be16(bytes, i + 7)?), u32::from(be16(bytes, i + 5)?)));
        }
        i = i.saturating_add(2 + len);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn png(w: u32, h: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        bytes.extend_from_slice(&w.to_be_bytes());
        bytes.extend_from_slice(&h.to_be_bytes());
        bytes.extend_from_slice(&[8, 6, 0, 0, 0]);
        bytes
    }

    #[test]
    fn image_sizes_and_costs() {
        assert_eq!(image_size(&png(800, 600)), Some((800, 600)));
        assert_eq!(image_size(&png(800, 600)[..23]), None, "a truncated header");
        assert_eq!(anthropic_image_tokens(Some((1000, 1000))), 1334);
        assert_eq!(anthropic_image_tokens(Some((200, 200))), 54);
        assert_eq!(openai_image_tokens(Some((1024, 1024))), 765);
        assert_eq!(openai_image_tokens(Some((2048, 4096))), 1105);
        let gif = b"GIF89a\x10\x00\x20\x00rest";
        assert_eq!(image_size(gif), Some((16, 32)));
    }

    #[test]
    fn jpeg_and_webp_headers() {
        // SOI, an APP0 segment of 16 bytes, then SOF0 with height 480 and width 640.
        let mut jpeg = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10];
        jpeg.extend_from_slice(&[0; 14]);
        jpeg.extend_from_slice(&[0xff, 0xc0, 0x00, 0x11, 0x08, 0x01, 0xe0, 0x02, 0x80, 0x03]);
        assert_eq!(image_size(&jpeg), Some((640, 480)));
        let mut webp = b"RIFF\0\0\0\0WEBPVP8X".to_vec();
        webp.extend_from_slice(&[0; 8]);
        webp.extend_from_slice(&[0x7f, 0x02, 0x00, 0xdf, 0x01, 0x00]);
        assert_eq!(image_size(&webp), Some((640, 480)));
        assert_eq!(image_size(&[0xff, 0xd8, 0xff]), None);
    }

    #[test]
    fn data_urls_and_base64() {
        let (media, bytes) = data_url_bytes("data:image/gif;base64,R0lGODlhEAAgAA==").unwrap();
        assert_eq!((media.as_str(), image_size(&bytes)), ("image/gif", Some((16, 32))));
        assert!(data_url_bytes("data:text/plain,hello").is_none());
        assert!(decode_prefix("!!!!").is_empty());
        assert_eq!(base64_len(8), 6);
    }
}
