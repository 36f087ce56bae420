//! Small valid PNG screenshots (what a user pastes into an agent, or what `Read` returns for
//! an image file), and reading a PNG's size back (what vision tokens are billed by).

use std::io::Write;

use base64::Engine;

use crate::rng::Rng;

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A `width` × `height` RGB screenshot-like PNG (a window with panels and lines of "text"),
/// base64-encoded.
pub fn screenshot(rng: &mut Rng, width: u32, height: u32) -> String {
    let background =
        [rng.range(200, 255) as u8, rng.range(200, 255) as u8, rng.range(200, 255) as u8];
    let panels: Vec<(u32, u32, u32, u32, [u8; 3])> = (0..rng.range(3, 8))
        .map(|_| {
            let (x, y) =
                (rng.range(0, width as usize / 2) as u32, rng.range(0, height as usize / 2) as u32);
            let (w, h) = (
                rng.range(40, width as usize / 2) as u32,
                rng.range(20, height as usize / 2) as u32,
            );
            (
                x,
                y,
                w,
                h,
                [rng.range(0, 255) as u8, rng.range(0, 255) as u8, rng.range(0, 255) as u8],
            )
        })
        .collect();
    let mut raw = Vec::with_capacity(((width * 3 + 1) * height) as usize);
    for y in 0..height {
        raw.push(0);
        for x in 0..width {
            let mut pixel = background;
            for &(px, py, pw, ph, color) in &panels {
                if x >= px && x < px + pw && y >= py && y < py + ph {
                    pixel = color;
                    // Lines of "text" inside the panel.
                    if (y - py) % 14 < 8 && (y - py) % 14 > 1 && (x - px) % 9 < 6 && x - px > 6 {
                        pixel = [30, 30, 30];
                    }
                }
            }
            raw.extend_from_slice(&pixel);
        }
    }
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let _ = encoder.write_all(&raw);
    let compressed = encoder.finish().unwrap_or_default();
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &header);
    chunk(&mut png, b"IDAT", &compressed);
    chunk(&mut png, b"IEND", &[]);
    base64::engine::general_purpose::STANDARD.encode(png)
}

/// The width and height of a base64 PNG, when it is one: the signature, an `IHDR` chunk whose
/// CRC holds, an `IEND` chunk at the end.
pub fn size(base64_png: &str) -> Option<(u32, u32)> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(base64_png).ok()?;
    if bytes.get(..8)? != b"\x89PNG\r\n\x1a\n" || bytes.get(12..16)? != b"IHDR" {
        return None;
    }
    let crc = u32::from_be_bytes(bytes.get(29..33)?.try_into().ok()?);
    if crc != crc32(bytes.get(12..29)?)
        || bytes.get(bytes.len().checked_sub(8)?..bytes.len().checked_sub(4)?)? != b"IEND"
    {
        return None;
    }
    let width = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?);
    let height = u32::from_be_bytes(bytes.get(20..24)?.try_into().ok()?);
    Some((width, height))
}
