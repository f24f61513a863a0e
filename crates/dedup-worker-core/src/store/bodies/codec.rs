//! How a kept body is stored: zstd at level 3, or the bytes as they came when that does not
//! make them smaller (a tiny body, or one compressed already). Done in Rust, by the consumer,
//! before its transaction's statements: both stores then hold the same bytes and the same
//! `encoding`, and the database's CPU (the pipeline's bottleneck) does none of it.

use std::cell::RefCell;

use zstd::bulk::Compressor;

/// The `encoding` column: how [`decode`] reads `body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// The bytes as received.
    Raw,
    /// A zstd frame of them.
    Zstd,
}

impl Encoding {
    /// The column's value.
    pub fn code(self) -> i16 {
        match self {
            Encoding::Raw => 0,
            Encoding::Zstd => 1,
        }
    }

    /// The encoding a column value names; `None` for one this release does not know (a later
    /// release's dictionary, say).
    pub fn from_code(code: i16) -> Option<Self> {
        match code {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// zstd's level: 3 is its default, ~3–4× on JSON at tens of µs per body; higher levels buy
/// a few percent for several times the CPU.
const LEVEL: i32 = 3;

/// The most a decoded body may be: far above the ingress's body limit (1 MiB by default), so a
/// corrupt or hostile frame cannot make a page reader allocate without bound.
pub const MAX_DECODED_BYTES: usize = 64 * 1024 * 1024;

thread_local! {
    /// This thread's zstd context, made once and reused for every body it compresses:
    /// `zstd::bulk::compress` makes and frees one per call, which for a webhook-sized body
    /// costs more than the compression itself (`bench/criterion/kept_body.rs`). It keeps the
    /// tables of the largest body it compressed (about 1 MB for a 1 MiB body at level 3), one
    /// per runtime thread. `None` until first used, and if zstd could not make one.
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
}

/// `body` as stored: compressed when that makes it smaller, else as it is.
pub fn encode(body: &[u8]) -> (Encoding, Vec<u8>) {
    match compress(body) {
        Some(compressed) if compressed.len() < body.len() => (Encoding::Zstd, compressed),
        _ => (Encoding::Raw, body.to_vec()),
    }
}

/// `body` as one zstd frame, by this thread's context; `None` if zstd failed (the body is
/// then kept raw).
fn compress(body: &[u8]) -> Option<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let compressor = match &mut *cell {
            Some(compressor) => compressor,
            None => cell.insert(Compressor::new(LEVEL).ok()?),
        };
        compressor.compress(body).ok()
    })
}

/// Why a stored body cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the body's encoding {0} is unknown to this release")]
    UnknownEncoding(i16),
    #[error("the body's zstd frame is unreadable")]
    Zstd(#[source] std::io::Error),
}

/// The body as received, from its stored bytes and `encoding` column.
pub fn decode(encoding: i16, stored: &[u8]) -> Result<Vec<u8>, DecodeError> {
    match Encoding::from_code(encoding) {
        Some(Encoding::Raw) => Ok(stored.to_vec()),
        Some(Encoding::Zstd) => {
            zstd::bulk::decompress(stored, MAX_DECODED_BYTES).map_err(DecodeError::Zstd)
        }
        None => Err(DecodeError::UnknownEncoding(encoding)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_body_is_compressed_and_reads_back_equal() {
        let body = serde_json::json!({
            "id": "evt_1", "type": "invoice.paid",
            "data": {"object": {"id": "in_1", "customer": "cus_A", "lines": vec!["a line item"; 40]}}
        })
        .to_string();
        let (encoding, stored) = encode(body.as_bytes());
        assert_eq!(encoding, Encoding::Zstd);
        assert!(
            stored.len() < body.len() / 2,
            "{} of {}",
            stored.len(),
            body.len()
        );
        assert_eq!(decode(encoding.code(), &stored).unwrap(), body.as_bytes());
    }

    #[test]
    fn a_body_that_does_not_shrink_is_kept_raw() {
        // A zstd frame of anything this short is longer than it.
        let (encoding, stored) = encode(b"{}");
        assert_eq!((encoding, stored.as_slice()), (Encoding::Raw, &b"{}"[..]));
        assert_eq!(decode(0, &stored).unwrap(), b"{}");
        // Compressed already: a second pass only adds its frame.
        let once = encode(&vec![b'x'; 10_000]).1;
        let (encoding, stored) = encode(&once);
        assert_eq!(encoding, Encoding::Raw);
        assert_eq!(stored, once);
        assert_eq!(decode(0, b"").unwrap(), b"");
    }

    #[test]
    fn unknown_encodings_and_broken_frames_are_errors_not_panics() {
        assert!(matches!(
            decode(7, b"x"),
            Err(DecodeError::UnknownEncoding(7))
        ));
        assert!(matches!(decode(1, b"not zstd"), Err(DecodeError::Zstd(_))));
    }

    #[test]
    fn the_reused_context_gives_each_body_the_frame_a_fresh_one_gives() {
        // Bodies of growing and shrinking sizes through the one context: none may carry
        // anything over from the one before (tables sized for another body, a dictionary).
        let bodies: Vec<Vec<u8>> = [600, 20_000, 900, 3_000, 1_000_000, 700]
            .iter()
            .enumerate()
            .map(|(n, &size)| {
                // Varied, as bodies are: a run of one string compresses alike at any level.
                let items: Vec<String> = (0..size / 12)
                    .map(|i| format!("{{\"a\":{}}}", (i * 7_919 + n * 104_729) % 100_003))
                    .collect();
                format!("{{\"id\":\"evt_{n}\",\"lines\":[{}]}}", items.join(",")).into_bytes()
            })
            .collect();
        for body in &bodies {
            let (encoding, stored) = encode(body);
            assert_eq!(encoding, Encoding::Zstd);
            let fresh = zstd::bulk::compress(body, LEVEL).unwrap().len();
            assert!(
                stored.len() <= fresh + fresh / 50,
                "{} vs {fresh}",
                stored.len()
            );
            assert_eq!(&decode(encoding.code(), &stored).unwrap(), body);
        }
    }
}
