//! A set of stream bits of any width: most keys are held by a few streams of the first 128,
//! which fit inline; a fleet of more streams spills to the heap.

use smallvec::SmallVec;

/// Normalised: no trailing zero word, so the empty set has no words and equality is by words.
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct Bits(SmallVec<[u64; 2]>);

impl Bits {
    pub fn single(bit: usize) -> Bits {
        let mut bits = Bits::default();
        bits.set(bit);
        bits
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline]
    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    pub fn set(&mut self, bit: usize) {
        let word = bit / 64;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (bit % 64);
    }

    pub fn unset(&mut self, bit: usize) {
        if let Some(word) = self.0.get_mut(bit / 64) {
            *word &= !(1 << (bit % 64));
            self.trim();
        }
    }

    #[inline]
    pub fn and(&self, other: &Bits) -> Bits {
        let mut out = Bits(
            self.0
                .iter()
                .zip(other.0.iter())
                .map(|(a, b)| a & b)
                .collect(),
        );
        out.trim();
        out
    }

    /// `self & !other`.
    pub fn and_not(&self, other: &Bits) -> Bits {
        let mut out = Bits(
            self.0
                .iter()
                .enumerate()
                .map(|(i, a)| a & !other.0.get(i).copied().unwrap_or(0))
                .collect(),
        );
        out.trim();
        out
    }

    pub fn or_assign(&mut self, other: &Bits) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
    }

    #[inline]
    pub fn intersects(&self, other: &Bits) -> bool {
        self.0.iter().zip(other.0.iter()).any(|(a, b)| a & b != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations_stay_normalised() {
        let mut a = Bits::single(3);
        a.set(200);
        let b = Bits::single(200);
        assert!(a.intersects(&b));
        assert_eq!(a.and(&b), b);
        assert_eq!(a.and_not(&b), Bits::single(3));
        a.unset(3);
        assert_eq!(a, b);
        a.unset(200);
        assert!(a.is_empty());
        assert_eq!(a, Bits::default());
        let mut c = Bits::single(1);
        c.or_assign(&Bits::single(130));
        assert!(c.intersects(&Bits::single(130)) && c.intersects(&Bits::single(1)));
    }
}
