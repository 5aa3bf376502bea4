//! Router block keys: CPython's own `hash((parent, page))`, computed without building tuples.
//!
//! The keys must equal what `hash((parent, tuple(page)))` gives in CPython 3.8 and later
//! (`Objects/tupleobject.c`, `Objects/longobject.c`): every router of a fleet, and a peer's
//! snapshot taken by an older release, must agree on them. `tests/unit/router/test_block_index.py`
//! compares these keys with the interpreter's `hash` on random pages.

/// Parent key of a sequence's first block ("tpuserve" in ASCII).
pub const ROOT_KEY: i64 = 0x7470_7573_6572_7665;

const MODULUS: u64 = (1 << 61) - 1; // _PyHASH_MODULUS on 64-bit builds
const XXPRIME_1: u64 = 11_400_714_785_074_694_791;
const XXPRIME_2: u64 = 14_029_467_366_897_019_727;
const XXPRIME_5: u64 = 2_870_177_450_012_600_261;

/// `hash(x)` of a Python int that fits in 64 bits.
#[inline]
pub fn int_hash(x: i64) -> u64 {
    let magnitude = (x.unsigned_abs() % MODULUS) as i64;
    let hash = if x < 0 { -magnitude } else { magnitude };
    (if hash == -1 { -2 } else { hash }) as u64
}

/// `hash(t)` of a tuple whose items hash to `lanes`.
#[inline]
fn tuple_hash<I: ExactSizeIterator<Item = u64>>(lanes: I) -> i64 {
    let len = lanes.len() as u64;
    let mut acc = XXPRIME_5;
    for lane in lanes {
        acc = acc.wrapping_add(lane.wrapping_mul(XXPRIME_2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(XXPRIME_1);
    }
    acc = acc.wrapping_add(len ^ (XXPRIME_5 ^ 3_527_539));
    if acc == u64::MAX {
        1_546_275_796
    } else {
        acc as i64
    }
}

/// `hash((parent, tuple(page)))`: the key of a block whose parent's key is `parent`.
#[inline]
pub fn page_key<T: Copy + Into<i64>>(parent: i64, page: &[T]) -> i64 {
    let page_hash = tuple_hash(page.iter().map(|&token| int_hash(token.into())));
    tuple_hash([int_hash(parent), page_hash as u64].into_iter())
}

/// Keys of the full pages of `token_ids` (a trailing partial page has none).
pub fn block_keys<T: Copy + Into<i64>>(token_ids: &[T], page_size: usize) -> Vec<i64> {
    if page_size == 0 {
        return Vec::new();
    }
    let mut parent = ROOT_KEY;
    token_ids
        .chunks_exact(page_size)
        .map(|page| {
            parent = page_key(parent, page);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_hash_follows_cpython() {
        assert_eq!(int_hash(0), 0);
        assert_eq!(int_hash(5), 5);
        assert_eq!(int_hash(-1), (-2i64) as u64);
        assert_eq!(int_hash(-5), (-5i64) as u64);
        assert_eq!(int_hash(MODULUS as i64), 0);
        assert_eq!(int_hash(i64::MAX), (i64::MAX as u64 % MODULUS));
    }

    #[test]
    fn empty_tuple_hash_is_cpythons() {
        // hash(()) in CPython 3.8+.
        assert_eq!(tuple_hash(std::iter::empty()), 5_740_354_900_026_072_187);
    }

    #[test]
    fn partial_pages_have_no_keys() {
        assert_eq!(block_keys(&[1i64, 2, 3], 2).len(), 1);
        assert!(block_keys(&[1i64, 2, 3], 0).is_empty());
        assert_eq!(
            block_keys(&[1u32, 2, 3, 4], 2),
            block_keys(&[1i64, 2, 3, 4], 2)
        );
    }
}
