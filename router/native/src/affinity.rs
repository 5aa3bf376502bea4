//! The affinity rule of the `precise` policy (`tpuserve_router.policies.precise.choose_worker`
//! states it): which worker a prompt goes to given how much of it each worker holds, their
//! loads and how many blocks each caches. `BlockIndex.route` runs it per request, and the
//! fleet model (`tpuserve.bench.fleet`) calls it through `choose_worker`: one rule for both.

/// Why a worker was chosen (`policies.base.Outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    PrefixHit,
    BalancedAway,
    Miss,
}

/// sglang-router's imbalance test over in-flight counts (`base.loads_imbalanced`).
pub fn imbalanced(loads: &[i64], abs_threshold: i64, rel_threshold: f64) -> bool {
    let (Some(&low), Some(&high)) = (loads.iter().min(), loads.iter().max()) else {
        return false;
    };
    high - low > abs_threshold && (high as f64) > rel_threshold * (low as f64)
}

/// What `choose` decided: the worker's index, why, and the rotation cursor to pass next time
/// (moved past the target when equals were rotated, else as given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub target: usize,
    pub outcome: Outcome,
    pub cursor: usize,
}

/// The worker to use and why, with `held[i]` the units of the prompt (`prompt_units` long)
/// worker `i` holds, `loads[i]` its in-flight count and `blocks(i)` how many blocks it caches
/// (asked only to break ties). A hit goes to the least loaded of the workers holding the
/// longest prefix (the first listed among them on equal loads); imbalance and a miss go to
/// the least loaded worker, ties broken by the fewest cached blocks (the most free cache),
/// then by `cursor`: the first of the equals at or after it, in list order, cyclically, so
/// equals take turns. `held` and `loads` are as long, and not empty.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    held: &[usize],
    prompt_units: usize,
    loads: &[i64],
    blocks: impl Fn(usize) -> usize,
    cursor: usize,
    cache_threshold: f64,
    abs_threshold: i64,
    rel_threshold: f64,
) -> Choice {
    let best = held.iter().copied().max().unwrap_or(0);
    let is_hit = prompt_units > 0 && (best as f64) / (prompt_units as f64) > cache_threshold;
    choose_hit(
        held,
        is_hit,
        loads,
        blocks,
        cursor,
        abs_threshold,
        rel_threshold,
    )
}

/// `choose` with whether the prompt is a hit decided by the caller (the tiered choice: a hit
/// when any tier of any worker holds more than the threshold, whatever each tier is worth).
pub fn choose_hit(
    held: &[usize],
    is_hit: bool,
    loads: &[i64],
    blocks: impl Fn(usize) -> usize,
    cursor: usize,
    abs_threshold: i64,
    rel_threshold: f64,
) -> Choice {
    let best = held.iter().copied().max().unwrap_or(0);
    if loads.len() > 1 && imbalanced(loads, abs_threshold, rel_threshold) {
        let (target, cursor) = least_loaded(loads, blocks, cursor);
        let outcome = if !is_hit {
            Outcome::Miss
        } else if held[target] == best {
            Outcome::PrefixHit
        } else {
            Outcome::BalancedAway
        };
        return Choice {
            target,
            outcome,
            cursor,
        };
    }
    if is_hit {
        let mut target = held.iter().position(|&h| h == best).unwrap_or(0);
        for i in target + 1..held.len() {
            if held[i] == best && loads[i] < loads[target] {
                target = i;
            }
        }
        return Choice {
            target,
            outcome: Outcome::PrefixHit,
            cursor,
        };
    }
    let (target, cursor) = least_loaded(loads, blocks, cursor);
    Choice {
        target,
        outcome: Outcome::Miss,
        cursor,
    }
}

/// Whether worker `i`'s load is within the bound of consistent hashing with bounded loads
/// (the `cost` policy's rule): with this request it would carry at most `load_factor` times
/// the fleet's mean, `loads[i] + 1 <= ceil(load_factor * (sum(loads) + 1) / n)`. The least
/// loaded worker is always within it (for `load_factor` >= 1).
pub fn bounded(loads: &[i64], load_factor: f64) -> Vec<bool> {
    let n = loads.len().max(1) as f64;
    let total: i64 = loads.iter().sum();
    let cap = (load_factor * (total + 1) as f64 / n).ceil();
    loads.iter().map(|&load| (load + 1) as f64 <= cap).collect()
}

/// The tiered choice's view of what each worker holds (`BlockIndex.route`): `held[i]`, the
/// value of its cached prefix in units (a block in HBM `tier_units`, one only in host memory
/// `host_units`), and `counted[i]`, the blocks that make the prompt a hit (every tier's, or
/// only HBM's when a host block is worth nothing). `depths[i]`: leading blocks worker `i` holds
/// in any tier, `device[i]` of them in HBM. A host block spares only prefill compute (it is
/// loaded into free HBM, as a miss would be computed there), so it may not buy a worker its
/// load bound excludes (`bounded`): there only its HBM blocks count, as the HBM-only rule
/// counts them, and a prefix held only in the host memory of a busy worker is a miss that goes
/// to the least loaded, as it would without the tier.
pub fn tier_value(
    depths: &[usize],
    device: &[usize],
    loads: &[i64],
    host_units: usize,
    tier_units: usize,
    load_factor: f64,
) -> (Vec<usize>, Vec<usize>) {
    let within = bounded(loads, load_factor);
    let mut held = Vec::with_capacity(depths.len());
    let mut counted = Vec::with_capacity(depths.len());
    for (i, (&all, &dev)) in depths.iter().zip(device).enumerate() {
        let dev = dev.min(all);
        let host = if host_units > 0 && within[i] {
            all - dev
        } else {
            0
        };
        held.push(dev * tier_units + host * host_units);
        counted.push(dev + host);
    }
    (held, counted)
}

/// The least loaded worker, ties broken by the fewest `blocks`, then by `cursor` (see
/// `choose`); and the next cursor. Blocks are counted only when loads tie.
fn least_loaded(loads: &[i64], blocks: impl Fn(usize) -> usize, cursor: usize) -> (usize, usize) {
    let n = loads.len();
    let mut least = 0;
    let mut ties = 1;
    for (i, &load) in loads.iter().enumerate().skip(1) {
        if load < loads[least] {
            least = i;
            ties = 1;
        } else if load == loads[least] {
            ties += 1;
        }
    }
    if ties == 1 {
        return (least, cursor);
    }
    let low = loads[least];
    let start = cursor % n;
    // (fewest blocks, then the fewest steps from the cursor): the first in cyclic order wins
    let mut chosen = (usize::MAX, usize::MAX, least);
    let mut equals = 0;
    for step in 0..n {
        let i = (start + step) % n;
        if loads[i] != low {
            continue;
        }
        let count = blocks(i);
        if count < chosen.0 {
            chosen = (count, step, i);
            equals = 1;
        } else if count == chosen.0 {
            equals += 1;
        }
    }
    let target = chosen.2;
    (target, if equals > 1 { target + 1 } else { cursor })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(held: &[usize], loads: &[i64], blocks: &[usize], cursor: usize) -> Choice {
        choose(held, 10, loads, |i| blocks[i], cursor, 0.3, 64, 1.5)
    }

    #[test]
    fn a_miss_goes_to_the_least_loaded() {
        assert_eq!(pick(&[0, 0, 0], &[3, 1, 2], &[0, 9, 0], 0).target, 1);
    }

    #[test]
    fn equal_loads_go_to_the_fewest_cached_blocks() {
        let choice = pick(&[0, 0, 0], &[1, 1, 1], &[5, 2, 7], 0);
        assert_eq!((choice.target, choice.cursor), (1, 0)); // no equals rotated: cursor stays
    }

    #[test]
    fn equals_take_turns_from_the_cursor() {
        let mut cursor = 0;
        let mut seen = Vec::new();
        for _ in 0..6 {
            let choice = pick(&[0, 0, 0], &[0, 0, 0], &[0, 0, 0], cursor);
            seen.push(choice.target);
            cursor = choice.cursor;
        }
        assert_eq!(seen, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn the_bound_is_the_mean_times_the_factor() {
        // 4 workers, 120 in flight: with this request at most ceil(1.25 * 121 / 4) = 38
        assert_eq!(bounded(&[40, 32, 26, 22], 1.25), [false, true, true, true]);
        assert_eq!(bounded(&[36, 32, 26, 22], 1.25), [true, true, true, true]); // cap 37
        assert_eq!(bounded(&[0, 0], 1.0), [true, true]);
    }

    #[test]
    fn host_blocks_do_not_buy_a_busy_worker() {
        // worker 0 holds the prompt (68 blocks) only in host memory and is over the bound:
        // the prompt is a miss and goes to the least loaded, as without the tier
        let (held, counted) = tier_value(
            &[68, 0, 0, 0],
            &[0, 0, 0, 0],
            &[40, 32, 26, 22],
            830,
            1000,
            1.25,
        );
        assert_eq!((held, counted), (vec![0, 0, 0, 0], vec![0, 0, 0, 0]));
        let choice = choose_hit(&[0, 0, 0, 0], false, &[40, 32, 26, 22], |_| 0, 0, 64, 1.5);
        assert_eq!((choice.target, choice.outcome), (3, Outcome::Miss));
        // within the bound its host blocks count
        let (held, counted) = tier_value(
            &[68, 0, 0, 0],
            &[0, 0, 0, 0],
            &[30, 32, 26, 22],
            830,
            1000,
            1.25,
        );
        assert_eq!((held[0], counted[0]), (68 * 830, 68));
        // its HBM blocks count whatever its load
        let (held, _) = tier_value(
            &[68, 0, 0, 0],
            &[40, 0, 0, 0],
            &[40, 32, 26, 22],
            830,
            1000,
            1.25,
        );
        assert_eq!(held[0], 40 * 1000);
    }

    #[test]
    fn a_hit_ignores_the_cursor_and_the_blocks() {
        let choice = pick(&[4, 8, 8], &[0, 2, 1], &[0, 0, 9], 1);
        assert_eq!(
            (choice.target, choice.outcome, choice.cursor),
            (2, Outcome::PrefixHit, 1)
        );
    }
}
