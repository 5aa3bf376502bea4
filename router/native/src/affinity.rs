//! The affinity rule of the prefix policies (`prefix_routing.choose_by_affinity`, which states
//! it): which worker a prompt goes to given how much of it each worker holds and their loads.

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

/// The index of the worker to use and why, with `held[i]` the units of the prompt
/// (`prompt_units` long) worker `i` holds and `loads[i]` its in-flight count; a miss goes to
/// the least loaded. Among equals the first listed wins. `held` and `loads` are as long, and
/// not empty.
pub fn choose(
    held: &[usize],
    prompt_units: usize,
    loads: &[i64],
    cache_threshold: f64,
    abs_threshold: i64,
    rel_threshold: f64,
) -> (usize, Outcome) {
    let best = held.iter().copied().max().unwrap_or(0);
    let is_hit = prompt_units > 0 && (best as f64) / (prompt_units as f64) > cache_threshold;
    choose_hit(held, is_hit, loads, abs_threshold, rel_threshold)
}

/// `choose` with whether the prompt is a hit decided by the caller (the tiered choice: a hit
/// when any tier of any worker holds more than the threshold, whatever each tier is worth).
pub fn choose_hit(
    held: &[usize],
    is_hit: bool,
    loads: &[i64],
    abs_threshold: i64,
    rel_threshold: f64,
) -> (usize, Outcome) {
    let best = held.iter().copied().max().unwrap_or(0);
    let least = first_least(loads);
    if loads.len() > 1 && imbalanced(loads, abs_threshold, rel_threshold) {
        if !is_hit {
            return (least, Outcome::Miss);
        }
        let outcome = if held[least] == best {
            Outcome::PrefixHit
        } else {
            Outcome::BalancedAway
        };
        return (least, outcome);
    }
    if is_hit {
        let mut target = held.iter().position(|&h| h == best).unwrap_or(0);
        for i in target + 1..held.len() {
            if held[i] == best && loads[i] < loads[target] {
                target = i;
            }
        }
        return (target, Outcome::PrefixHit);
    }
    (least, Outcome::Miss)
}

/// The first index of the smallest load.
fn first_least(loads: &[i64]) -> usize {
    let mut least = 0;
    for (i, &load) in loads.iter().enumerate() {
        if load < loads[least] {
            least = i;
        }
    }
    least
}
