//! A prompt's token ids without a Python int per token (`TokenIds`), and the cache of the
//! token ids of prompt pieces (`TokenCache`, behind `tpuserve_router.pipeline.token_cache`): a request
//! pays only for the text it does not share with earlier ones, and its ids go from the cache
//! to the block index's keys without becoming Python objects.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::sequence::int_sequence;
use crate::tokenizer::{DefaultScheme, SchemeNumbers};

int_sequence!(
    /// Immutable token ids: a read-only sequence of ints to Python.
    TokenIds, ids: u32
);

enum Encoder {
    /// The built-in scheme, here.
    Default(DefaultScheme),
    /// A Python `encode(text) -> list[int]` (a Hugging Face tokenizer).
    Python(Py<PyAny>),
}

/// A piece's text by a 128-bit hash of it, from two independently seeded hashers. Two pieces
/// that collide (about 2^-128 per pair, and the seeds are per process) would only route one
/// as if it were the other: what the engine receives is the request's own text. Keyed by the
/// hash, the table neither copies a piece's text nor compares it on a hit (a 256-byte chunk
/// is four cache lines, cold in the router between requests).
#[derive(Default)]
struct PieceHasher {
    low: foldhash::quality::RandomState,
    high: foldhash::quality::RandomState,
}

impl PieceHasher {
    fn key(&self, piece: &str) -> u128 {
        (u128::from(self.high.hash_one(piece)) << 64) | u128::from(self.low.hash_one(piece))
    }
}

/// What a cached piece takes beyond its ids: its table entry (the 128-bit key and `Piece`,
/// at the table's load), its place on the clock and its ids' allocation.
const PIECE_OVERHEAD_BYTES: usize = 112;

struct Piece {
    ids: Box<[u32]>,
    /// Bytes of memory it takes (what the cache's bound counts): its ids and the overhead.
    bytes: usize,
    /// Read since the clock hand last passed it.
    used: bool,
}

/// The token ids of prompt pieces, bounded by the bytes of memory they take (4 per id and
/// `PIECE_OVERHEAD_BYTES` per piece, whatever the tokenizer's ratio of text to ids). Eviction is
/// the clock algorithm (second chance), an approximation of least recently used: a hit only
/// marks its entry, where a linked list would rewrite its neighbours' links too.
#[pyclass(module = "tpuserve_router._native")]
pub struct TokenCache {
    encoder: Encoder,
    chunk_bytes: usize,
    #[pyo3(get)]
    max_bytes: usize,
    #[pyo3(get)]
    cached_bytes: usize,
    #[pyo3(get)]
    hits: u64,
    #[pyo3(get)]
    misses: u64,
    hasher: PieceHasher,
    pieces: HashMap<u128, Piece, foldhash::fast::RandomState>,
    /// The clock: keys in the order the hand passes them.
    clock: VecDeque<u128>,
}

impl TokenCache {
    fn encode_uncached(&self, py: Python<'_>, text: &str, out: &mut Vec<u32>) -> PyResult<()> {
        match &self.encoder {
            Encoder::Default(scheme) => scheme.encode_into(text, out),
            Encoder::Python(encode) => {
                out.extend(encode.call1(py, (text,))?.extract::<Vec<u32>>(py)?)
            }
        }
        Ok(())
    }

    fn piece(&mut self, py: Python<'_>, piece: &str, out: &mut Vec<u32>) -> PyResult<()> {
        let key = self.hasher.key(piece);
        if let Some(cached) = self.pieces.get_mut(&key) {
            cached.used = true;
            out.extend_from_slice(&cached.ids);
            self.hits += 1;
            return Ok(());
        }
        self.misses += 1;
        let start = out.len();
        self.encode_uncached(py, piece, out)?;
        let bytes = (out.len() - start) * std::mem::size_of::<u32>() + PIECE_OVERHEAD_BYTES;
        if bytes <= self.max_bytes {
            let ids = out[start..].into();
            self.pieces.insert(
                key,
                Piece {
                    ids,
                    bytes,
                    used: false,
                },
            );
            self.clock.push_back(key);
            self.cached_bytes += bytes;
            self.evict();
        }
        Ok(())
    }

    /// Drop pieces until the cache is within its bound: the hand takes the oldest key; a
    /// piece read since the hand last passed gets a second chance (back of the clock,
    /// unmarked), any other goes. At most two turns of the clock.
    fn evict(&mut self) {
        while self.cached_bytes > self.max_bytes {
            let Some(key) = self.clock.pop_front() else {
                break;
            };
            let piece = self
                .pieces
                .get_mut(&key)
                .expect("every key on the clock is cached");
            if piece.used {
                piece.used = false;
                self.clock.push_back(key);
            } else {
                self.cached_bytes -= piece.bytes;
                self.pieces.remove(&key);
            }
        }
    }

    /// Each chunk of `text` through the cache: cut just before a space once a chunk has
    /// `chunk_bytes` bytes (a space only ever leads a piece, so chunks encode independently).
    fn chunks(&mut self, py: Python<'_>, text: &str, out: &mut Vec<u32>) -> PyResult<()> {
        let bytes = text.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let from = (start + self.chunk_bytes).min(bytes.len());
            let cut = bytes[from..]
                .iter()
                .position(|&b| b == b' ')
                .map_or(bytes.len(), |k| from + k);
            // A space byte never sits inside a multi-byte character: `cut` is a boundary.
            self.piece(py, &text[start..cut], out)?;
            start = cut;
        }
        Ok(())
    }

    fn chunked(&self) -> bool {
        matches!(self.encoder, Encoder::Default(_))
    }
}

#[pymethods]
impl TokenCache {
    /// `encode`: None for the built-in scheme (then `scheme` holds its numbers: the special
    /// tokens and the id bases), else a Python callable (a Hugging Face tokenizer's).
    #[new]
    #[pyo3(signature = (encode, scheme, max_bytes, chunk_bytes))]
    fn new(
        encode: Option<Py<PyAny>>,
        scheme: Option<SchemeNumbers>,
        max_bytes: usize,
        chunk_bytes: usize,
    ) -> PyResult<TokenCache> {
        let encoder = match (encode, scheme) {
            (Some(encode), None) => Encoder::Python(encode),
            (None, Some(numbers)) => Encoder::Default(DefaultScheme::new(numbers)),
            _ => {
                return Err(PyTypeError::new_err(
                    "give exactly one of encode and scheme",
                ))
            }
        };
        Ok(TokenCache {
            encoder,
            chunk_bytes: chunk_bytes.max(1),
            max_bytes,
            cached_bytes: 0,
            hits: 0,
            misses: 0,
            hasher: PieceHasher::default(),
            pieces: HashMap::default(),
            clock: VecDeque::new(),
        })
    }

    /// The ids of `text`. With the built-in scheme a long text goes through the cache in
    /// chunks; other tokenizers (whose pre-tokenizers may merge across spaces) encode it whole.
    fn encode(&mut self, py: Python<'_>, text: &str) -> PyResult<TokenIds> {
        let mut out = Vec::with_capacity(text.len() / 3);
        if !self.chunked() || text.len() < 2 * self.chunk_bytes {
            self.encode_uncached(py, text, &mut out)?;
        } else {
            self.chunks(py, text, &mut out)?;
        }
        Ok(TokenIds { ids: out })
    }

    /// The ids of a rendered chat template: split just before every `turn_start` (no
    /// tokenizer merges across a special token), each piece through the cache (in chunks
    /// too when long, with the built-in scheme).
    fn encode_pieces(
        &mut self,
        py: Python<'_>,
        text: &str,
        turn_start: &str,
    ) -> PyResult<TokenIds> {
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut starts: Vec<usize> = text.match_indices(turn_start).map(|(i, _)| i).collect();
        if starts.first() != Some(&0) {
            starts.insert(0, 0);
        }
        starts.push(text.len());
        for pair in starts.windows(2) {
            let piece = &text[pair[0]..pair[1]];
            if piece.is_empty() {
                continue;
            }
            if self.chunked() && piece.len() >= 2 * self.chunk_bytes {
                self.chunks(py, piece, &mut out)?;
            } else {
                self.piece(py, piece, &mut out)?;
            }
        }
        Ok(TokenIds { ids: out })
    }
}
