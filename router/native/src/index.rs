//! `BlockIndex`: which worker holds which KV-cache block. The semantics are documented in
//! `tpuserve_router/kv/block_index.py`, which exports this class.

use std::collections::{HashMap, HashSet};

use hashlink::LinkedHashMap;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::affinity;
use crate::bits::Bits;
use crate::events::{decode_common_batch, Event, Medium};
use crate::keys::{block_keys, page_key, ROOT_KEY};
use crate::predictions::Predictions;
use crate::sequence::int_sequence;
use crate::tokens::TokenIds;

/// `block_keys` of a `TokenIds` (no conversion) or of any sequence of ints.
pub fn token_ids_keys(token_ids: &Bound<'_, PyAny>, page_size: usize) -> PyResult<Vec<Key>> {
    if let Ok(ids) = token_ids.cast::<TokenIds>() {
        return Ok(block_keys(&ids.get().ids, page_size));
    }
    Ok(block_keys(&token_ids.extract::<Vec<i64>>()?, page_size))
}

int_sequence!(
    /// A prompt's block keys (`BlockIndex.keys`): a read-only sequence of ints to Python, taken
    /// by `match` and `predict` as they are.
    BlockKeys, keys: i64
);

/// `f` over `keys`: a `BlockKeys` as it is, any other sequence of ints converted.
fn with_keys<R>(keys: &Bound<'_, PyAny>, f: impl FnOnce(&[Key]) -> R) -> PyResult<R> {
    if let Ok(keys) = keys.cast::<BlockKeys>() {
        return Ok(f(&keys.get().keys));
    }
    Ok(f(&keys.extract::<Vec<Key>>()?))
}

/// Keys come from what clients send (a router key is an invertible hash of the prompt's last
/// page), so tables use a hash seeded per process: no one can pick keys that all land in one
/// bucket. foldhash is hashbrown's own default, and about as fast as a plain multiply.
type Mix = foldhash::fast::RandomState;
type Key = i64;
/// Engines hash blocks to 64-bit ints, signed (SGLang) or not: both fit.
type EngineHash = i128;

/// What `route` answers: the prompt's keys, each worker's depth, the chosen one's index, why,
/// whether its keys were predicted on it, the page size the keys were cut at, and the last key.
type Routed<'py> = (
    BlockKeys,
    Vec<usize>,
    usize,
    Bound<'py, PyString>,
    bool,
    usize,
    Option<Key>,
);

/// A block in HBM is worth this many units in `route`'s tiered choice (a host block
/// `host_hit_weight` of them).
const TIER_UNITS: usize = 1000;

/// Keys whose confirmed entries `depths` looks up together (at most this many are looked up
/// past the end of a match).
const LOOKAHEAD: usize = 8;

/// The tiers an engine block is in (`Medium`), as bits.
const DEVICE: u8 = 1;
const HOST: u8 = 2;

fn tier_bit(medium: Medium) -> u8 {
    match medium {
        Medium::Device => DEVICE,
        Medium::Host => HOST,
    }
}

/// One engine block of a stream: its router key (None: an orphan whose parent the index never
/// saw) and the tiers that hold it.
#[derive(Clone, Copy)]
struct Entry {
    key: Option<Key>,
    tiers: u8,
}

struct Stream {
    bit: usize,
    /// Engine block hash -> its entry.
    engine_keys: HashMap<EngineHash, Entry, Mix>,
    /// The page size its first `BlockStored` gave (0: none yet); a block of another size on
    /// this stream is dropped.
    page_size: usize,
    /// It has published a lower tier (a host-memory `BlockStored`): it may hold up to
    /// `HOST_TIER_FACTOR` times its worker's KV pool (the HBM's, from `/server_info`), at
    /// most `max_stream_blocks`.
    tiered: bool,
}

impl Stream {
    fn new(bit: usize) -> Stream {
        Stream {
            bit,
            engine_keys: HashMap::default(),
            page_size: 0,
            tiered: false,
        }
    }
}

struct Worker {
    /// The bit of its predictions and of its rank-0 stream.
    bit: usize,
    /// The bits of all its streams.
    mask: Bits,
    streams: HashMap<i64, Stream>,
    /// Router key -> expiry time, oldest first.
    predicted: Predictions,
    has_events: bool,
    /// The most blocks each of its streams may hold (its KV pool's pages, else the index's
    /// `max_stream_blocks`): a stream claiming more is not believed past it (a tiered stream
    /// up to `HOST_TIER_FACTOR` times it). All its streams together hold at most
    /// `max_stream_blocks`, whatever ranks and tiers they claim.
    max_blocks: usize,
}

/// A stream that publishes a host tier may hold this many times its worker's KV pool (HBM
/// and host together; SGLang's default host pool is twice the device pool, `--hicache-ratio`
/// 2.0): a `CPU_PINNED` tag no longer lifts its bound to `max_stream_blocks` (issue 68).
pub const HOST_TIER_FACTOR: usize = 16;

#[pyclass(module = "tpuserve_router._native")]
pub struct BlockIndex {
    #[pyo3(get, set)]
    page_size: usize,
    #[pyo3(get, set)]
    page_size_learned: bool,
    #[pyo3(get, set)]
    predicted_ttl_seconds: f64,
    #[pyo3(get, set)]
    approximate_ttl_seconds: f64,
    #[pyo3(get, set)]
    max_predicted_blocks: usize,
    /// The most blocks one stream may hold unless its worker's pool says (`set_worker_limit`).
    #[pyo3(get, set)]
    max_stream_blocks: usize,
    /// Blocks dropped: over their stream's bound, or of another page size than its first.
    #[pyo3(get)]
    dropped_blocks: i64,
    /// Streams per page size they reported: the index's `page_size` is the most common one.
    page_size_streams: HashMap<usize, usize>,
    /// Blocks stored under a parent the index never saw (they cannot be keyed).
    #[pyo3(get)]
    orphan_blocks: i64,
    /// Distinct stream bits handed out so far (freed bits are reused before new ones).
    #[pyo3(get)]
    allocated_bits: usize,
    clock: Py<PyAny>,
    workers: LinkedHashMap<String, Worker>,
    free_bits: Vec<usize>,
    /// Streams holding each key in any tier (device or host).
    confirmed: HashMap<Key, Bits, Mix>,
    /// Streams holding each key in device memory (HBM); a subset of `confirmed`.
    device: HashMap<Key, Bits, Mix>,
    /// Entries held in a lower tier only (0: no engine reported one, `route` skips tiers).
    #[pyo3(get)]
    host_only_blocks: i64,
    predicted: HashMap<Key, Bits, Mix>,
    next_expiry: f64,
    /// `route`'s parameters (`set_route_params`), fixed per policy: not passed per request.
    route_params: Option<RouteParams>,
    /// Where `route` starts looking among equally loaded, equally full workers
    /// (`affinity::choose`'s cursor).
    cursor: usize,
}

/// The affinity rule's and the queue test's parameters (`prefix_routing.AffinityParams`,
/// `QueueParams`).
#[derive(Clone, Copy)]
struct RouteParams {
    cache_threshold: f64,
    balance_abs_threshold: i64,
    balance_rel_threshold: f64,
    queue_margin_tokens: f64,
    saved_prefix_weight: f64,
    /// What a block held in host memory is worth against one in HBM (0..1): the share of its
    /// prefill that loading it back saves (`IndexParams.host_hit_weight`).
    host_hit_weight: f64,
    /// How far above the fleet's mean load a worker may be and still have its host-memory
    /// blocks count (`PreciseParams.host_load_factor`, `affinity::bounded`).
    host_load_factor: f64,
}

/// Each item of `items` as a `T`: a list read directly (what the policy passes; pyo3's
/// generic sequence extraction goes through the iterator protocol), any other iterable too,
/// except a string (as pyo3 refuses it: names are a sequence of names, not one string).
fn extract_items<'py, T>(items: &Bound<'py, PyAny>) -> PyResult<Vec<T>>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    if items.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "expected a sequence of items, got one str",
        ));
    }
    if let Ok(list) = items.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            out.push(item.extract::<T>().map_err(Into::into)?);
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for item in items.try_iter()? {
        out.push(item?.extract::<T>().map_err(Into::into)?);
    }
    Ok(out)
}

fn drop_bit(map: &mut HashMap<Key, Bits, Mix>, key: Key, bit: usize) {
    if let Some(mask) = map.get_mut(&key) {
        mask.unset(bit);
        if mask.is_empty() {
            map.remove(&key);
        }
    }
}

/// Read an entry and drop it: brings its cache lines in ahead of the writes that follow.
#[inline]
fn touch<T>(entry: Option<&T>) {
    std::hint::black_box(entry);
}

fn add_bit(map: &mut HashMap<Key, Bits, Mix>, key: Key, bit: usize) {
    map.entry(key).or_default().set(bit);
}

impl BlockIndex {
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        self.clock.call0(py)?.extract::<f64>(py)
    }

    fn new_bit(&mut self) -> usize {
        if let Some(bit) = self.free_bits.pop() {
            return bit;
        }
        self.allocated_bits += 1;
        self.allocated_bits - 1
    }

    /// The predicted blocks each worker may keep: an equal share of `max_predicted_blocks`,
    /// which bounds them over all workers (the router's memory, whatever the fleet's size).
    fn prediction_share(&self) -> usize {
        self.max_predicted_blocks / self.workers.len().max(1)
    }

    /// Drop `worker`'s oldest predictions beyond `share`.
    fn trim_predictions(
        worker: &mut Worker,
        predicted: &mut HashMap<Key, Bits, Mix>,
        share: usize,
    ) {
        while worker.predicted.len() > share {
            let Some(key) = worker.predicted.pop_oldest() else {
                break;
            };
            drop_bit(predicted, key, worker.bit);
        }
    }

    fn ensure_worker(&mut self, name: &str) {
        if !self.workers.contains_key(name) {
            // the others' shares shrink: trim them now, so the bound holds in all at once
            let share = self.max_predicted_blocks / (self.workers.len() + 1);
            for worker in self.workers.values_mut() {
                Self::trim_predictions(worker, &mut self.predicted, share);
            }
            let bit = self.new_bit();
            let mut streams = HashMap::new();
            streams.insert(0, Stream::new(bit));
            let worker = Worker {
                bit,
                mask: Bits::single(bit),
                streams,
                predicted: Predictions::default(),
                has_events: false,
                max_blocks: self.max_stream_blocks,
            };
            self.workers.insert(name.to_owned(), worker);
        }
    }

    /// The worker, created if new, with its stream `rank` created if new.
    fn ensure_stream(&mut self, name: &str, rank: i64) {
        self.ensure_worker(name);
        if !self.workers[name].streams.contains_key(&rank) {
            let bit = self.new_bit();
            let worker = self.workers.get_mut(name).expect("just ensured");
            worker.streams.insert(rank, Stream::new(bit));
            worker.mask.set(bit);
        }
    }

    fn clear_stream(
        stream: &mut Stream,
        confirmed: &mut HashMap<Key, Bits, Mix>,
        device: &mut HashMap<Key, Bits, Mix>,
        counts: (&mut i64, &mut i64),
    ) {
        let (orphans, host_only) = counts;
        for entry in stream.engine_keys.values() {
            if entry.tiers == HOST {
                *host_only -= 1;
            }
            match entry.key {
                None => *orphans -= 1,
                Some(key) => {
                    drop_bit(confirmed, key, stream.bit);
                    drop_bit(device, key, stream.bit);
                }
            }
        }
        stream.engine_keys = HashMap::default();
    }

    #[allow(clippy::too_many_arguments)]
    fn store_blocks(
        &mut self,
        name: &str,
        block_hashes: &[EngineHash],
        parent_block_hash: Option<EngineHash>,
        token_ids: &[i64],
        block_size: i64,
        rank: i64,
        medium: Medium,
    ) {
        self.ensure_stream(name, rank);
        let tier = tier_bit(medium);
        let worker = self.workers.get_mut(name).expect("just ensured");
        worker.has_events = true;
        let limit = worker.max_blocks;
        // The worker's streams together (every rank it claims, every tier) hold at most
        // `max_stream_blocks` (issue 68: 16 claimed ranks held 16 times it).
        let mut held: usize = worker.streams.values().map(|s| s.engine_keys.len()).sum();
        let worker_cap = self.max_stream_blocks;
        let stream = worker.streams.get_mut(&rank).expect("just ensured");
        if block_size >= 1 {
            let size = block_size as usize;
            if stream.page_size == 0 {
                // learned per stream; the index keys prompts by the page size most streams
                // have (one stream cannot set it for the fleet), the first one on a tie
                stream.page_size = size;
                let count = self.page_size_streams.entry(size).or_insert(0);
                *count += 1;
                let count = *count;
                let current = self
                    .page_size_streams
                    .get(&self.page_size)
                    .copied()
                    .unwrap_or(0);
                if !self.page_size_learned || (size != self.page_size && count > current) {
                    self.page_size = size;
                    self.page_size_learned = true;
                }
            } else if stream.page_size != size {
                self.dropped_blocks += block_hashes.len() as i64;
                return;
            }
        }
        let mut parent = match parent_block_hash {
            None => Some(ROOT_KEY),
            Some(hash) => stream.engine_keys.get(&hash).and_then(|e| e.key),
        };
        if tier == HOST {
            stream.tiered = true;
        }
        // A tiered stream holds its HBM pool and its host pool, which `/server_info` does not
        // size: up to `HOST_TIER_FACTOR` times its pool, at most `max_stream_blocks`.
        let limit = if stream.tiered {
            limit
                .saturating_mul(HOST_TIER_FACTOR)
                .min(self.max_stream_blocks)
        } else {
            limit
        };
        let size = block_size.max(0) as usize;
        let bit = stream.bit;
        let keys: Vec<Option<Key>> = (0..block_hashes.len())
            .map(|i| {
                let start = i.saturating_mul(size).min(token_ids.len());
                let end = (i + 1).saturating_mul(size).min(token_ids.len());
                parent = parent.map(|parent| page_key(parent, &token_ids[start..end]));
                parent
            })
            .collect();
        for (hashes, keys) in block_hashes.chunks(LOOKAHEAD).zip(keys.chunks(LOOKAHEAD)) {
            // Each block's entries are read before any is written: the reads do not depend
            // on each other, so their cache misses overlap (see `depths`).
            for (hash, key) in hashes.iter().zip(keys) {
                touch(stream.engine_keys.get(hash));
                if let Some(key) = key {
                    touch(self.confirmed.get(key));
                    touch(worker.predicted.get(key));
                }
            }
            for (&engine_hash, &key) in hashes.iter().zip(keys) {
                if (stream.engine_keys.len() >= limit || held >= worker_cap)
                    && !stream.engine_keys.contains_key(&engine_hash)
                {
                    self.dropped_blocks += 1; // more than its pool holds: not believed
                    continue;
                }
                let mut tiers = tier;
                let new = Entry { key, tiers };
                let replaced = stream.engine_keys.insert(engine_hash, new);
                if replaced.is_none() {
                    held += 1;
                }
                if let Some(old) = replaced {
                    // stored again: in another tier too, or (another key) replacing it
                    if old.tiers == HOST {
                        self.host_only_blocks -= 1;
                    }
                    match old.key {
                        None => self.orphan_blocks -= 1,
                        Some(old_key) if Some(old_key) != key => {
                            drop_bit(&mut self.confirmed, old_key, bit);
                            drop_bit(&mut self.device, old_key, bit);
                        }
                        Some(_) => tiers |= old.tiers,
                    }
                    if let Some(entry) = stream.engine_keys.get_mut(&engine_hash) {
                        entry.tiers = tiers;
                    }
                }
                if tiers == HOST {
                    self.host_only_blocks += 1;
                }
                match key {
                    None => self.orphan_blocks += 1,
                    Some(key) => {
                        add_bit(&mut self.confirmed, key, bit);
                        if tiers & DEVICE != 0 {
                            add_bit(&mut self.device, key, bit);
                        }
                        if worker.predicted.remove(&key) {
                            drop_bit(&mut self.predicted, key, worker.bit);
                        }
                    }
                }
            }
        }
    }

    fn remove_blocks(
        &mut self,
        name: &str,
        block_hashes: &[EngineHash],
        rank: i64,
        medium: Medium,
    ) {
        let tier = tier_bit(medium);
        let Some(worker) = self.workers.get_mut(name) else {
            return;
        };
        worker.has_events = true;
        let Some(stream) = worker.streams.get_mut(&rank) else {
            return;
        };
        for hashes in block_hashes.chunks(LOOKAHEAD) {
            // As in `store_blocks`: first the reads, their misses overlapping.
            for hash in hashes {
                if let Some(Entry { key: Some(key), .. }) = stream.engine_keys.get(hash) {
                    touch(self.confirmed.get(key));
                    touch(worker.predicted.get(key));
                }
            }
            for engine_hash in hashes {
                // Only the named tier's copy goes: a demoted block stays in host memory.
                let Some(entry) = stream.engine_keys.get_mut(engine_hash) else {
                    continue;
                };
                let was_host_only = entry.tiers == HOST;
                entry.tiers &= !tier;
                let (key, tiers) = (entry.key, entry.tiers);
                if tiers == 0 {
                    stream.engine_keys.remove(engine_hash);
                }
                if was_host_only {
                    self.host_only_blocks -= 1;
                }
                if tiers == HOST {
                    self.host_only_blocks += 1;
                }
                let Some(key) = key else {
                    if tiers == 0 {
                        self.orphan_blocks -= 1;
                    }
                    continue;
                };
                if tiers & DEVICE == 0 {
                    drop_bit(&mut self.device, key, stream.bit);
                    // a prediction stands for a device copy: the engine denies it
                    if worker.predicted.remove(&key) {
                        drop_bit(&mut self.predicted, key, worker.bit);
                    }
                }
                if tiers == 0 {
                    drop_bit(&mut self.confirmed, key, stream.bit);
                }
            }
        }
    }

    fn expire(&mut self, py: Python<'_>) -> PyResult<()> {
        let now = self.now(py)?;
        self.expire_at(now);
        Ok(())
    }

    /// Drop the predictions expired at `now`.
    fn expire_at(&mut self, now: f64) {
        if now < self.next_expiry {
            return;
        }
        let mut next_expiry = f64::INFINITY;
        for worker in self.workers.values_mut() {
            let (predicted, bit) = (&mut self.predicted, worker.bit);
            if let Some(expiry) = worker
                .predicted
                .expire(now, |key| drop_bit(predicted, key, bit))
            {
                next_expiry = next_expiry.min(expiry);
            }
        }
        let ttl = self.predicted_ttl_seconds.min(self.approximate_ttl_seconds);
        self.next_expiry = next_expiry.max(now + ttl / 10.0);
    }

    /// Each of `names`' stream bits (`empty` for a worker the index has not seen).
    fn masks<'a>(
        &'a self,
        names: &[Bound<'_, PyString>],
        empty: &'a Bits,
    ) -> PyResult<Vec<&'a Bits>> {
        let mut masks = Vec::with_capacity(names.len());
        for name in names {
            masks.push(self.workers.get(name.to_str()?).map_or(empty, |w| &w.mask));
        }
        Ok(masks)
    }

    /// For each worker mask, how many leading blocks of `keys` it holds in any tier (see
    /// `match`).
    fn depths(&self, keys: &[Key], masks: &[&Bits]) -> Vec<usize> {
        self.depths_in(&self.confirmed, keys, masks)
    }

    /// `depths` over the streams `table` names per key (with the predictions).
    fn depths_in(
        &self,
        table: &HashMap<Key, Bits, Mix>,
        keys: &[Key],
        masks: &[&Bits],
    ) -> Vec<usize> {
        let mut depths = vec![0usize; masks.len()];
        let mut alive = Bits::default();
        for mask in masks {
            alive.or_assign(mask);
        }
        let mut depth = 0;
        'window: for window in keys.chunks(LOOKAHEAD) {
            // A window's confirmed entries are looked up before any is used: the lookups do
            // not depend on each other, so their cache misses overlap (in the router the
            // table is cold between requests: a miss or two per key).
            let confirmed: [Option<&Bits>; LOOKAHEAD] =
                std::array::from_fn(|i| window.get(i).and_then(|key| table.get(key)));
            for (key, confirmed) in window.iter().zip(confirmed) {
                if alive.is_empty() {
                    break 'window;
                }
                let mut held = confirmed.map_or_else(Bits::default, |m| m.and(&alive));
                if held != alive {
                    if let Some(predicted) = self.predicted.get(key) {
                        held.or_assign(&predicted.and(&alive));
                    }
                }
                if held != alive {
                    let gone = alive.and_not(&held);
                    for (i, mask) in masks.iter().enumerate() {
                        if mask.intersects(&gone) && !mask.intersects(&held) {
                            depths[i] = depth; // its last rank dropped out here
                        }
                    }
                    alive = held;
                }
                depth += 1;
            }
        }
        if !alive.is_empty() {
            for (i, mask) in masks.iter().enumerate() {
                if mask.intersects(&alive) {
                    depths[i] = depth;
                }
            }
        }
        depths
    }

    /// `predict`, over keys as a slice, at time `now`.
    fn predict_keys(&mut self, now: f64, name: &str, keys: &[Key]) {
        self.ensure_worker(name);
        let share = self.prediction_share();
        let worker = self.workers.get_mut(name).expect("just ensured");
        let ttl = if worker.has_events {
            self.predicted_ttl_seconds
        } else {
            self.approximate_ttl_seconds
        };
        if ttl <= 0.0 {
            return;
        }
        let expiry = now + ttl;
        for window in keys.chunks(LOOKAHEAD) {
            // As in `store_blocks`: first the reads, their misses overlapping. The prediction
            // tables are read only for the keys the worker does not hold: a prompt's shared
            // prefix, most of its keys, is usually held (and its confirmed entries are warm
            // from `depths`), so two cold lookups per held key are saved.
            let held: [bool; LOOKAHEAD] = std::array::from_fn(|i| {
                window.get(i).is_some_and(|key| {
                    self.confirmed
                        .get(key)
                        .is_some_and(|m| m.intersects(&worker.mask))
                })
            });
            for (key, held) in window.iter().zip(held) {
                if !held {
                    touch(worker.predicted.get(key));
                    touch(self.predicted.get(key));
                }
            }
            for (&key, held) in window.iter().zip(held) {
                if !held && worker.predicted.insert(key, expiry) {
                    add_bit(&mut self.predicted, key, worker.bit);
                }
            }
        }
        Self::trim_predictions(worker, &mut self.predicted, share);
        if expiry < self.next_expiry {
            self.next_expiry = expiry;
        }
    }
}

#[pymethods]
impl BlockIndex {
    #[new]
    #[pyo3(signature = (*, page_size=16, predicted_ttl_seconds=2.0, approximate_ttl_seconds=120.0,
                        max_predicted_blocks=262_144, max_stream_blocks=1_048_576, clock=None))]
    fn new(
        py: Python<'_>,
        page_size: i64,
        predicted_ttl_seconds: f64,
        approximate_ttl_seconds: f64,
        max_predicted_blocks: usize,
        max_stream_blocks: usize,
        clock: Option<Py<PyAny>>,
    ) -> PyResult<BlockIndex> {
        if page_size < 1 {
            return Err(PyValueError::new_err(format!(
                "page_size must be >= 1, got {page_size}"
            )));
        }
        let clock = match clock {
            Some(clock) => clock,
            None => py.import("time")?.getattr("monotonic")?.unbind(),
        };
        Ok(BlockIndex {
            page_size: page_size as usize,
            page_size_learned: false,
            predicted_ttl_seconds,
            approximate_ttl_seconds,
            max_predicted_blocks,
            max_stream_blocks,
            dropped_blocks: 0,
            page_size_streams: HashMap::new(),
            orphan_blocks: 0,
            allocated_bits: 0,
            clock,
            workers: LinkedHashMap::new(),
            free_bits: Vec::new(),
            confirmed: HashMap::default(),
            device: HashMap::default(),
            host_only_blocks: 0,
            predicted: HashMap::default(),
            next_expiry: f64::INFINITY,
            route_params: None,
            cursor: 0,
        })
    }

    // ------------------------------------------------------------------ queries

    /// Router keys of the full pages of `token_ids`, at the index's page size.
    fn keys(&self, token_ids: &Bound<'_, PyAny>) -> PyResult<BlockKeys> {
        Ok(BlockKeys {
            keys: token_ids_keys(token_ids, self.page_size)?,
        })
    }

    /// Distinct blocks some worker reported holding.
    #[getter]
    fn confirmed_blocks(&self) -> usize {
        self.confirmed.len()
    }

    /// Distinct blocks only predicted (routed, not yet confirmed by an event).
    #[getter]
    fn predicted_blocks(&self) -> usize {
        self.predicted.len()
    }

    /// Blocks `name` reported holding (confirmed entries only), in all its DP ranks or in `rank`.
    #[pyo3(signature = (name, rank=None))]
    fn worker_blocks(&self, name: &str, rank: Option<i64>) -> usize {
        let Some(worker) = self.workers.get(name) else {
            return 0;
        };
        match rank {
            Some(rank) => worker.streams.get(&rank).map_or(0, |s| s.engine_keys.len()),
            None => worker.streams.values().map(|s| s.engine_keys.len()).sum(),
        }
    }

    /// Blocks `name` caches as `route` counts them to break ties among equally loaded workers:
    /// reported (every rank) and predicted (`cached_blocks`).
    #[pyo3(name = "cached_blocks")]
    fn py_cached_blocks(&mut self, py: Python<'_>, name: &str) -> PyResult<usize> {
        self.expire(py)?;
        Ok(cached_blocks(self.workers.get(name)))
    }

    /// The engine's own block hashes `name` reported holding and not yet removed, in all its DP
    /// ranks or in `rank` (orphans included).
    #[pyo3(signature = (name, rank=None))]
    fn engine_hashes(&self, name: &str, rank: Option<i64>) -> HashSet<EngineHash> {
        let Some(worker) = self.workers.get(name) else {
            return HashSet::new();
        };
        worker
            .streams
            .iter()
            .filter(|(r, _)| rank.is_none_or(|rank| **r == rank))
            .flat_map(|(_, stream)| stream.engine_keys.keys().copied())
            .collect()
    }

    fn workers(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }

    /// Whether `name` reported holding block `key` (confirmed, in any of its ranks).
    fn holds(&self, name: &str, key: Key) -> bool {
        match (self.workers.get(name), self.confirmed.get(&key)) {
            (Some(worker), Some(mask)) => mask.intersects(&worker.mask),
            _ => false,
        }
    }

    /// For each of `names`, how many leading blocks of `keys` it holds (the best of its DP ranks).
    #[pyo3(name = "match")]
    fn match_(
        &mut self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        names: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<usize>> {
        self.expire(py)?;
        let names: Vec<Bound<'_, PyString>> = extract_items(names)?;
        let empty = Bits::default();
        let masks = self.masks(&names, &empty)?;
        with_keys(keys, |keys| self.depths(keys, &masks))
    }

    /// For each DP rank `name` reported KV events from, how many leading blocks of `keys` that
    /// rank's stream holds (confirmed entries only: predictions are the worker's, not a
    /// rank's); empty for a worker the index does not know. A prefill engine's DP rank is
    /// chosen by it (`tpuserve_router.front.pd`).
    fn rank_depths(&self, name: &str, keys: &Bound<'_, PyAny>) -> PyResult<Vec<(i64, usize)>> {
        let Some(worker) = self.workers.get(name) else {
            return Ok(Vec::new());
        };
        with_keys(keys, |keys| {
            let mut depths: Vec<(i64, usize)> = worker
                .streams
                .iter()
                .map(|(rank, stream)| {
                    let bit = Bits::single(stream.bit);
                    let depth = keys
                        .iter()
                        .take_while(|key| {
                            self.confirmed.get(*key).is_some_and(|m| m.intersects(&bit))
                        })
                        .count();
                    (*rank, depth)
                })
                .collect();
            depths.sort_unstable();
            depths
        })
    }

    /// The parameters `route` applies (the policy's, set once): `prefix_routing.AffinityParams`'
    /// ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold`` and
    /// `QueueParams`' ``queue_margin_tokens``, ``saved_prefix_weight``, and `IndexParams`'
    /// ``host_hit_weight`` (1: a host-memory block counts as one in HBM), and `PreciseParams`'
    /// ``host_load_factor`` (the load bound of the tiered choice, `affinity::bounded`).
    #[pyo3(signature = (cache_threshold, balance_abs_threshold, balance_rel_threshold,
                        queue_margin_tokens, saved_prefix_weight, host_hit_weight=1.0,
                        host_load_factor=1.25))]
    #[allow(clippy::too_many_arguments)]
    fn set_route_params(
        &mut self,
        cache_threshold: f64,
        balance_abs_threshold: i64,
        balance_rel_threshold: f64,
        queue_margin_tokens: f64,
        saved_prefix_weight: f64,
        host_hit_weight: f64,
        host_load_factor: f64,
    ) {
        self.route_params = Some(RouteParams {
            cache_threshold,
            balance_abs_threshold,
            balance_rel_threshold,
            queue_margin_tokens,
            saved_prefix_weight,
            host_hit_weight: host_hit_weight.clamp(0.0, 1.0),
            host_load_factor: host_load_factor.max(1.0),
        });
    }

    /// For each of `names`, how many leading blocks of `keys` it holds in device memory (HBM,
    /// and its predictions); `match` counts every tier.
    fn device_match(
        &mut self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        names: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<usize>> {
        self.expire(py)?;
        let names: Vec<Bound<'_, PyString>> = extract_items(names)?;
        let empty = Bits::default();
        let masks = self.masks(&names, &empty)?;
        with_keys(keys, |keys| self.depths_in(&self.device, keys, &masks))
    }

    /// A request's routing in one call (the `precise` policy's): the prompt's block keys
    /// (`keys`), each of `names`' depth (`match`), the worker the affinity rule picks
    /// (`prefix_routing.choose_by_affinity`, with `loads` their in-flight counts) and why;
    /// and, when no queue could move it (`prefix_routing.leave_long_queue`'s first test, on
    /// `queued`, upper bounds of each worker's queued prefill tokens), the prediction of the
    /// keys on it (`predict`). Parameters as `set_route_params` set them. Returns (keys,
    /// depths, target, outcome, predicted, page size, last key or None): when not predicted,
    /// the caller settles the queues and predicts.
    fn route<'py>(
        &mut self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        names: &Bound<'py, PyAny>,
        loads: &Bound<'py, PyAny>,
        queued: &Bound<'py, PyAny>,
    ) -> PyResult<Routed<'py>> {
        let Some(params) = self.route_params else {
            return Err(PyValueError::new_err(
                "route needs its parameters: call set_route_params first",
            ));
        };
        let now = self.now(py)?; // read once: the clock is a Python call
        self.expire_at(now);
        let names: Vec<Bound<'py, PyString>> = extract_items(names)?;
        let loads: Vec<i64> = extract_items(loads)?;
        let queued: Vec<f64> = extract_items(queued)?;
        if names.is_empty() || names.len() != loads.len() || names.len() != queued.len() {
            return Err(PyValueError::new_err(format!(
                "route needs one load and one queue per name (at least one name), got {} names, \
                 {} loads and {} queues",
                names.len(),
                loads.len(),
                queued.len()
            )));
        }
        let keys = BlockKeys {
            keys: token_ids_keys(token_ids, self.page_size)?,
        };
        let empty = Bits::default();
        let masks = self.masks(&names, &empty)?;
        let depths = self.depths(&keys.keys, &masks);
        let workers = &self.workers;
        let blocks = |i: usize| {
            names[i]
                .to_str()
                .map_or(0, |name| cached_blocks(workers.get(name)))
        };
        let choice = if self.host_only_blocks > 0 {
            // Tiers: a block in HBM saves its prefill, one in host memory that less its load
            // back (`host_hit_weight` of it): HBM hit > host hit > miss, in thousandths. A
            // worker over the load bound (`affinity::bounded`) is seen as the HBM-only rule
            // sees it: its host blocks count for nothing there.
            let device = self.depths_in(&self.device, &keys.keys, &masks);
            let host_units = (params.host_hit_weight * TIER_UNITS as f64).round() as usize;
            let (held, counted) = affinity::tier_value(
                &depths,
                &device,
                &loads,
                host_units,
                TIER_UNITS,
                params.host_load_factor,
            );
            // A hit by what any tier holds where it counts: no prefix is a miss while a tier
            // of a worker within the bound holds it.
            let best = counted.iter().copied().max().unwrap_or(0);
            let prompt = keys.keys.len();
            let is_hit = prompt > 0 && (best as f64) / (prompt as f64) > params.cache_threshold;
            affinity::choose_hit(
                &held,
                is_hit,
                &loads,
                blocks,
                self.cursor,
                params.balance_abs_threshold,
                params.balance_rel_threshold,
            )
        } else {
            affinity::choose(
                &depths,
                keys.keys.len(),
                &loads,
                blocks,
                self.cursor,
                params.cache_threshold,
                params.balance_abs_threshold,
                params.balance_rel_threshold,
            )
        };
        let (target, outcome) = (choice.target, choice.outcome);
        self.cursor = choice.cursor;
        let best = depths.iter().copied().max().unwrap_or(0);
        let given_up = (best - depths[target]) as f64 * self.page_size as f64;
        let stays =
            queued[target] <= params.queue_margin_tokens - params.saved_prefix_weight * given_up;
        if stays {
            self.predict_keys(now, names[target].to_str()?, &keys.keys);
        }
        let outcome = match outcome {
            affinity::Outcome::PrefixHit => pyo3::intern!(py, "prefix_hit"),
            affinity::Outcome::BalancedAway => pyo3::intern!(py, "balanced_away"),
            affinity::Outcome::Miss => pyo3::intern!(py, "miss"),
        };
        let last = keys.keys.last().copied();
        Ok((
            keys,
            depths,
            target,
            outcome.clone(),
            stays,
            self.page_size,
            last,
        ))
    }

    // ------------------------------------------------------------------ peer snapshots

    /// A stream's engine hash -> router key entries, as a peer router's snapshot carries them.
    #[pyo3(signature = (name, rank=0))]
    fn stream_blocks(&self, name: &str, rank: i64) -> Vec<(EngineHash, Option<Key>)> {
        self.workers
            .get(name)
            .and_then(|w| w.streams.get(&rank))
            .map_or_else(Vec::new, |s| {
                s.engine_keys.iter().map(|(h, e)| (*h, e.key)).collect()
            })
    }

    /// Take a peer router's entries for one stream, as if its events had been applied here.
    fn load_stream(&mut self, name: &str, rank: i64, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        self.ensure_stream(name, rank);
        let worker = self.workers.get_mut(name).expect("just ensured");
        worker.has_events = true;
        let stream = worker.streams.get_mut(&rank).expect("just ensured");
        for block in blocks.try_iter()? {
            let (engine_hash, key): (EngineHash, Option<Key>) = block?.extract()?;
            if stream.engine_keys.contains_key(&engine_hash) {
                continue;
            }
            // a peer's snapshot carries no tiers: taken as device blocks
            let tiers = DEVICE;
            stream.engine_keys.insert(engine_hash, Entry { key, tiers });
            match key {
                None => self.orphan_blocks += 1,
                Some(key) => {
                    add_bit(&mut self.confirmed, key, stream.bit);
                    add_bit(&mut self.device, key, stream.bit);
                    if worker.predicted.remove(&key) {
                        drop_bit(&mut self.predicted, key, worker.bit);
                    }
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ routing predictions

    /// Record that `name` is about to hold `keys` (it was just routed that prompt).
    fn predict(&mut self, py: Python<'_>, name: &str, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let now = self.now(py)?;
        with_keys(keys, |keys| self.predict_keys(now, name, keys))
    }

    /// Drop `name`'s predictions of `keys`: a routing choice set aside before it was acted on
    /// (its prompt went elsewhere). A key an earlier choice predicted goes too; the engine's
    /// events confirm it if it is held.
    fn unpredict(&mut self, name: &str, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(worker) = self.workers.get_mut(name) else {
            return Ok(());
        };
        let predicted = &mut self.predicted;
        with_keys(keys, |keys| {
            for key in keys {
                if worker.predicted.remove(key) {
                    drop_bit(predicted, *key, worker.bit);
                }
            }
        })
    }

    // ------------------------------------------------------------------ engine events

    /// Apply a `BlockStored` event of `name`'s DP rank `rank`: it now holds these blocks.
    /// `medium`: the event's (None or ``GPU``: device memory; any other: a lower tier).
    #[pyo3(signature = (name, block_hashes, parent_block_hash, token_ids, block_size, rank=0,
                        medium=None))]
    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        name: &str,
        block_hashes: Vec<EngineHash>,
        parent_block_hash: Option<EngineHash>,
        token_ids: Vec<i64>,
        block_size: i64,
        rank: i64,
        medium: Option<&str>,
    ) {
        self.store_blocks(
            name,
            &block_hashes,
            parent_block_hash,
            &token_ids,
            block_size,
            rank,
            Medium::of(medium),
        );
    }

    /// Apply a `BlockRemoved` event of `name`'s DP rank `rank`.
    /// Only the tier `medium` names loses the blocks (as in `store`).
    #[pyo3(signature = (name, block_hashes, rank=0, medium=None))]
    fn remove(
        &mut self,
        name: &str,
        block_hashes: &Bound<'_, PyAny>,
        rank: i64,
        medium: Option<&str>,
    ) -> PyResult<()> {
        let hashes = block_hashes
            .try_iter()?
            .map(|h| h?.extract::<EngineHash>())
            .collect::<PyResult<Vec<EngineHash>>>()?;
        self.remove_blocks(name, &hashes, rank, Medium::of(medium));
        Ok(())
    }

    /// Apply one KV-event batch (its msgpack payload) of `name`'s DP rank `rank` when every
    /// event in it is a well-formed `BlockStored` or `BlockRemoved` (the common batch): the
    /// numbers of stored and removed events. None, with nothing applied, for any other batch:
    /// decode that one in Python (`sglang_tpu.kv_events.decode_batch`).
    #[pyo3(signature = (name, payload, rank=0))]
    pub(crate) fn apply_batch(
        &mut self,
        name: &str,
        payload: &[u8],
        rank: i64,
    ) -> Option<(usize, usize)> {
        let events = decode_common_batch(payload)?;
        let (mut stored, mut removed) = (0, 0);
        for event in events {
            match event {
                Event::Stored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    medium,
                } => {
                    self.store_blocks(name, &hashes, parent, &tokens, block_size, rank, medium);
                    stored += 1;
                }
                Event::Removed { hashes, medium } => {
                    self.remove_blocks(name, &hashes, rank, medium);
                    removed += 1;
                }
            }
        }
        Some((stored, removed))
    }

    /// Drop what `name` holds: everything, or only DP rank `rank`'s confirmed blocks.
    #[pyo3(signature = (name, rank=None))]
    fn clear(&mut self, name: &str, rank: Option<i64>) {
        let Some(worker) = self.workers.get_mut(name) else {
            return;
        };
        if let Some(rank) = rank {
            if let Some(stream) = worker.streams.get_mut(&rank) {
                Self::clear_stream(
                    stream,
                    &mut self.confirmed,
                    &mut self.device,
                    (&mut self.orphan_blocks, &mut self.host_only_blocks),
                );
            }
            return;
        }
        for stream in worker.streams.values_mut() {
            Self::clear_stream(
                stream,
                &mut self.confirmed,
                &mut self.device,
                (&mut self.orphan_blocks, &mut self.host_only_blocks),
            );
        }
        for key in worker.predicted.keys() {
            drop_bit(&mut self.predicted, *key, worker.bit);
        }
        worker.predicted = Predictions::default();
    }

    /// `name` publishes KV events: its predictions, new and old, get the short time to live.
    fn mark_event_feed(&mut self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.ensure_worker(name);
        if self.workers[name].has_events {
            return Ok(());
        }
        let latest = self.now(py)? + self.predicted_ttl_seconds;
        let worker = self.workers.get_mut(name).expect("just ensured");
        worker.has_events = true;
        worker.predicted.expire_by(latest);
        self.next_expiry = self.next_expiry.min(latest);
        Ok(())
    }

    /// The worker left: drop its entries and free its bits.
    /// The most blocks each of `name`'s streams may hold (its KV pool's pages), at most
    /// `max_stream_blocks`; a stream already holding more keeps them until it is cleared. A
    /// stream that publishes a host tier may hold `HOST_TIER_FACTOR` times it, at most
    /// `max_stream_blocks` (its pool is the HBM's; the `precise` policy still reads it as the
    /// HBM room, `worker_limit`). All the worker's streams together hold at most
    /// `max_stream_blocks`.
    fn set_worker_limit(&mut self, name: &str, max_blocks: usize) {
        self.ensure_worker(name);
        let limit = max_blocks.min(self.max_stream_blocks);
        self.workers.get_mut(name).expect("just ensured").max_blocks = limit;
    }

    /// The most blocks each of `name`'s streams may hold (None: an unknown worker).
    fn worker_limit(&self, name: &str) -> Option<usize> {
        self.workers.get(name).map(|worker| worker.max_blocks)
    }

    fn forget(&mut self, name: &str) {
        if !self.workers.contains_key(name) {
            return;
        }
        self.clear(name, None);
        let worker = self.workers.remove(name).expect("checked");
        for stream in worker.streams.values() {
            if let Some(count) = self.page_size_streams.get_mut(&stream.page_size) {
                *count -= 1;
                if *count == 0 {
                    self.page_size_streams.remove(&stream.page_size);
                }
            }
        }
        self.free_bits
            .extend(worker.streams.values().map(|s| s.bit));
    }
}

/// Blocks `worker` caches as the index knows it: reported (every rank, orphans included) and
/// predicted (`affinity::choose` breaks ties on it). 0 for a worker the index has not seen.
fn cached_blocks(worker: Option<&Worker>) -> usize {
    worker.map_or(0, |w| {
        w.predicted.len()
            + w.streams
                .values()
                .map(|s| s.engine_keys.len())
                .sum::<usize>()
    })
}
