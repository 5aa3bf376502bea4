//! `tpuserve_router._native`: the block index of the router's `precise` and `cost` policies,
//! compiled. Per request they hash a prompt's pages, match them against every worker and
//! record predictions; per KV event they key the stored blocks. In Python those loops cost
//! most of the policy's CPU (CHANGELOG.md, router CPU pass 4). The KV-event streams' frames
//! are split here too, and their batches applied without a round trip through Python.

mod affinity;
mod answers;
mod bits;
mod events;
mod framing;
mod index;
mod keys;
mod predictions;
mod sequence;
mod tokenizer;
mod tokens;
mod usage;
mod zmtp;

use pyo3::prelude::*;

/// Router keys of the full pages of `token_ids` (a trailing partial page has none).
#[pyfunction]
#[pyo3(name = "block_keys")]
fn py_block_keys(token_ids: &Bound<'_, PyAny>, page_size: i64) -> PyResult<Vec<i64>> {
    if page_size < 1 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "page_size must be >= 1, got {page_size}"
        )));
    }
    index::token_ids_keys(token_ids, page_size as usize)
}

/// (prompt, completion, cached) tokens of a worker's JSON answer, as
/// `tpuserve_router.pipeline.usage.usage_from_object` counts them, or None if it has no usage; a
/// `ValueError` when the answer is not one this reads (`usage.rs`: Python reads it then).
#[pyfunction]
fn usage_counts(body: &[u8]) -> PyResult<Option<(u64, u64, u64)>> {
    match usage::skim(body) {
        usage::Skim::Counts([prompt, completion, cached]) => Ok(Some((prompt, completion, cached))),
        usage::Skim::NoUsage => Ok(None),
        usage::Skim::NotRead => Err(pyo3::exceptions::PyValueError::new_err("not read natively")),
    }
}

/// `affinity::choose` (the `precise` policy's rule, as `BlockIndex.route` runs it) on plain
/// lists, for `tpuserve_router.policies.precise.choose_worker`: (target, outcome, next cursor).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn choose_worker(
    py: Python<'_>,
    held: Vec<usize>,
    prompt_units: usize,
    loads: Vec<i64>,
    blocks: Vec<usize>,
    cursor: usize,
    cache_threshold: f64,
    balance_abs_threshold: i64,
    balance_rel_threshold: f64,
) -> PyResult<(usize, Py<pyo3::types::PyString>, usize)> {
    if held.is_empty() || held.len() != loads.len() || held.len() != blocks.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "choose_worker needs one load and one block count per worker (at least one), got \
             {} held, {} loads and {} block counts",
            held.len(),
            loads.len(),
            blocks.len()
        )));
    }
    let choice = affinity::choose(
        &held,
        prompt_units,
        &loads,
        |i| blocks[i],
        cursor,
        cache_threshold,
        balance_abs_threshold,
        balance_rel_threshold,
    );
    let outcome = match choice.outcome {
        affinity::Outcome::PrefixHit => pyo3::intern!(py, "prefix_hit"),
        affinity::Outcome::BalancedAway => pyo3::intern!(py, "balanced_away"),
        affinity::Outcome::Miss => pyo3::intern!(py, "miss"),
    };
    Ok((choice.target, outcome.clone().unbind(), choice.cursor))
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ROOT_KEY", keys::ROOT_KEY)?;
    m.add_function(wrap_pyfunction!(py_block_keys, m)?)?;
    m.add_function(wrap_pyfunction!(usage_counts, m)?)?;
    m.add_function(wrap_pyfunction!(choose_worker, m)?)?;
    m.add_function(wrap_pyfunction!(framing::pass_on, m)?)?;
    m.add_function(wrap_pyfunction!(answers::whole_answer, m)?)?;
    m.add_class::<index::BlockIndex>()?;
    m.add_class::<index::BlockKeys>()?;
    m.add_class::<tokens::TokenIds>()?;
    m.add_class::<tokens::TokenCache>()?;
    m.add_class::<zmtp::ZmtpReader>()?;
    Ok(())
}
