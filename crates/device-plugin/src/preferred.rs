// SPDX-License-Identifier: Apache-2.0
//! `GetPreferredAllocation`: which of the available devices kubelet should give a
//! container. Full GPUs are chosen to be close to each other (NVLink, then PCIe
//! switch, then NUMA node, from the [`Topology`] cached at start); replicas and MIG
//! devices are spread across their units. Deterministic: the same request always
//! gets the same answer.
//!
//! Pure and fast: a few hash lookups and, for full GPUs, a search over at most a few
//! thousand candidate sets. No NVML, no I/O.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::allocate::{AllocateError, IdList, positions};
use crate::resources::{Resource, ResourceIndex, Unit};
use crate::topology::Topology;

/// Above this many candidate sets the full-GPU search goes greedy. 8 GPUs have at
/// most C(8,4) = 70 sets; 16 GPUs choosing 8 have 12,870.
const EXHAUSTIVE_LIMIT: u64 = 5_000;

/// Picks `size` devices from `available`, all of `must_include` among them, and
/// returns their IDs in device order.
///
/// - Full GPUs (an unshared resource of whole GPUs): the set with the highest sum of
///   pairwise [`Topology::score`]s; ties go to the set that leaves the best-connected
///   GPUs for later requests (lowest score to the GPUs left over), then to the set
///   earliest in device order. Every set is tried when there are few enough
///   (`EXHAUSTIVE_LIMIT`), else the set grows greedily from `must_include` (or the
///   best pair).
/// - Replicas and MIG devices: NVIDIA's `distributed` policy, stricter about
///   spreading: each pick goes to a unit not yet picked in this request if there is
///   one, then to the unit with the most available devices left, then to the
///   earliest unit; within a unit, the lowest replica.
pub fn preferred(
    resource: &Resource,
    index: &ResourceIndex,
    topology: &Topology,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Result<Vec<String>, AllocateError> {
    let name = || resource.name.clone();
    if size == 0 {
        return Err(AllocateError::ZeroSize { resource: name() });
    }
    let mut unknown = IdList::default();
    let mut avail = positions(resource, index, available, &mut unknown);
    let mut must = positions(resource, index, must_include, &mut unknown);
    if !unknown.is_empty() {
        return Err(AllocateError::UnknownDevices {
            resource: name(),
            ids: unknown,
            known: IdList::of(resource),
        });
    }
    // kubelet sends sets; repeats carry no meaning.
    avail.sort_unstable();
    avail.dedup();
    must.sort_unstable();
    must.dedup();
    let mut missing = IdList::default();
    for p in &must {
        if avail.binary_search(p).is_err() {
            missing.push(&resource.devices[*p].id);
        }
    }
    if !missing.is_empty() {
        return Err(AllocateError::MustIncludeNotAvailable {
            resource: name(),
            ids: missing,
        });
    }
    if size > avail.len() {
        return Err(AllocateError::NotEnoughAvailable {
            resource: name(),
            size,
            available: avail.len(),
        });
    }
    if must.len() > size {
        return Err(AllocateError::MustIncludeTooMany {
            resource: name(),
            must_include: must.len(),
            size,
        });
    }
    let candidates: Vec<usize> = avail
        .iter()
        .copied()
        .filter(|p| must.binary_search(p).is_err())
        .collect();
    let whole_gpus =
        resource.replicas.is_none() && resource.devices.iter().all(|d| d.unit.mig.is_none());
    let mut chosen = if must.len() == size {
        must
    } else if whole_gpus {
        closest(resource, topology, &must, &candidates, size)
    } else {
        spread(resource, &must, &candidates, size)
    };
    chosen.sort_unstable();
    Ok(chosen
        .into_iter()
        .map(|p| resource.devices[p].id.clone())
        .collect())
}

/// The replica / MIG policy (see [`preferred`]).
fn spread(resource: &Resource, must: &[usize], candidates: &[usize], size: usize) -> Vec<usize> {
    struct Slot {
        /// Candidate positions of this unit not taken yet, lowest first.
        left: std::collections::VecDeque<usize>,
        picked: usize,
    }
    let mut units: BTreeMap<Unit, Slot> = BTreeMap::new();
    for p in candidates {
        units
            .entry(resource.devices[*p].unit)
            .or_insert_with(|| Slot {
                left: Default::default(),
                picked: 0,
            })
            .left
            .push_back(*p);
    }
    for p in must {
        if let Some(slot) = units.get_mut(&resource.devices[*p].unit) {
            slot.picked += 1;
        }
    }
    let mut chosen = must.to_vec();
    while chosen.len() < size {
        // Units iterate in unit order and min_by_key keeps the first minimum, so
        // ties go to the earliest unit.
        let best = units
            .values_mut()
            .filter(|s| !s.left.is_empty())
            .min_by_key(|s| (s.picked.min(1), Reverse(s.left.len())));
        let Some(slot) = best else { break };
        if let Some(p) = slot.left.pop_front() {
            slot.picked += 1;
            chosen.push(p);
        }
    }
    chosen
}

/// How good a set of full GPUs is: its inner score, then (reversed) its score to
/// the GPUs left over; higher is better.
type SetValue = (u64, Reverse<u64>);

/// The full-GPU policy (see [`preferred`]).
fn closest(
    resource: &Resource,
    topology: &Topology,
    must: &[usize],
    candidates: &[usize],
    size: usize,
) -> Vec<usize> {
    // Everything in one dense matrix over the available devices: must first.
    let all: Vec<usize> = must.iter().chain(candidates).copied().collect();
    let n = all.len();
    let gpu = |i: usize| resource.devices[all[i]].unit.gpu;
    let mut score = vec![0u64; n * n];
    for i in 0..n {
        for j in (i + 1)..n {
            let s = u64::from(topology.score(gpu(i), gpu(j)));
            score[i * n + j] = s;
            score[j * n + i] = s;
        }
    }
    let pair = |i: usize, j: usize| score[i * n + j];
    let fixed: Vec<usize> = (0..must.len()).collect();
    let free: Vec<usize> = (must.len()..n).collect();
    let k = size - must.len();

    let picked = if binomial(free.len() as u64, k as u64) <= EXHAUSTIVE_LIMIT {
        // (inner score, Reverse(score to the leftovers)), maximised; the first set
        // in lexicographic order wins ties.
        // A set's score to the leftovers is its rows' sums less its inner pairs,
        // counted from both ends.
        let row: Vec<u64> = (0..n).map(|i| (0..n).map(|j| pair(i, j)).sum()).collect();
        let evaluate = |set: &[usize]| {
            let mut inner = 0u64;
            let mut rows = 0u64;
            for (a, &i) in set.iter().enumerate() {
                inner += set[a + 1..].iter().map(|&j| pair(i, j)).sum::<u64>();
                rows += row[i];
            }
            (inner, Reverse(rows - 2 * inner))
        };
        let mut best: Option<(SetValue, Vec<usize>)> = None;
        let mut set = fixed.clone();
        for_each_combination(&free, k, &mut |combo| {
            set.truncate(fixed.len());
            set.extend_from_slice(combo);
            let value = evaluate(&set);
            if best.as_ref().is_none_or(|(b, _)| value > *b) {
                best = Some((value, set.clone()));
            }
        });
        best.map(|(_, set)| set).unwrap_or(fixed)
    } else {
        greedy(n, &pair, fixed, free, size)
    };
    picked.into_iter().map(|i| all[i]).collect()
}

/// Grows a set one GPU at a time, each the best-connected to the set so far; an
/// empty start is seeded with the best pair (or, for one GPU, the least-connected
/// GPU, keeping well-connected groups free).
fn greedy(
    n: usize,
    pair: &dyn Fn(usize, usize) -> u64,
    mut set: Vec<usize>,
    mut free: Vec<usize>,
    size: usize,
) -> Vec<usize> {
    if set.is_empty() && size == 1 {
        let least = free
            .iter()
            .copied()
            .min_by_key(|&i| (0..n).map(|j| pair(i, j)).sum::<u64>());
        return least.into_iter().collect();
    }
    if set.is_empty() && free.len() >= 2 {
        let mut best = (0, 1, 0u64);
        let mut first = true;
        for a in 0..free.len() {
            for b in (a + 1)..free.len() {
                let s = pair(free[a], free[b]);
                if first || s > best.2 {
                    best = (a, b, s);
                    first = false;
                }
            }
        }
        set.push(free[best.0]);
        set.push(free[best.1]);
        free.remove(best.1);
        free.remove(best.0);
    }
    while set.len() < size && !free.is_empty() {
        let mut best = 0;
        let mut best_score = None;
        for (f, &i) in free.iter().enumerate() {
            let s: u64 = set.iter().map(|&j| pair(i, j)).sum();
            if best_score.is_none_or(|b| s > b) {
                best = f;
                best_score = Some(s);
            }
        }
        set.push(free.remove(best));
    }
    set
}

/// C(n, k), saturating at `u64::MAX`.
fn binomial(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut c: u64 = 1;
    for i in 0..k {
        // c * (n - i) / (i + 1) stays exact: c is C(n, i) and C(n, i+1) is whole.
        c = match c.checked_mul(n - i) {
            Some(v) => v / (i + 1),
            None => return u64::MAX,
        };
    }
    c
}

/// Calls `f` with every `k`-subset of `items`, in lexicographic order.
fn for_each_combination(items: &[usize], k: usize, f: &mut dyn FnMut(&[usize])) {
    let n = items.len();
    if k > n {
        return;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    let mut combo: Vec<usize> = idx.iter().map(|&i| items[i]).collect();
    loop {
        f(&combo);
        // Find the rightmost index that can still move right.
        let Some(i) = (0..k).rev().find(|&i| idx[i] != i + n - k) else {
            return;
        };
        idx[i] += 1;
        for j in (i + 1)..k {
            idx[j] = idx[j - 1] + 1;
        }
        for j in i..k {
            combo[j] = items[idx[j]];
        }
    }
}

#[cfg(test)]
#[path = "preferred_tests.rs"]
mod tests;
