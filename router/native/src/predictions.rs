//! A worker's predicted blocks (`BlockIndex.predict`): router key -> expiry, and the order
//! they expire in. The order is a plain queue that may hold stale entries (a key refreshed,
//! removed or predicted again since): only an entry whose expiry is still its key's counts.
//! Per predicted key that is one hash-table probe and a push at the queue's end, where a
//! linked hash map cost a node and the probes of its neighbours, each a cache miss in a
//! table of up to `max_predicted_blocks` entries (the router's CPU per request grew with it).

use std::collections::{HashMap, VecDeque};

type Mix = foldhash::fast::RandomState;
type Key = i64;

/// Stale entries the queue may hold beyond twice the live ones before it is rebuilt.
const SLACK: usize = 1024;

#[derive(Default)]
pub struct Predictions {
    expiry: HashMap<Key, f64, Mix>,
    order: VecDeque<(Key, f64)>,
}

impl Predictions {
    pub fn len(&self) -> usize {
        self.expiry.len()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.expiry.keys()
    }

    /// Predict `key` until `until` (a later prediction of it replaces an earlier one): true
    /// when it was not predicted.
    pub fn insert(&mut self, key: Key, until: f64) -> bool {
        let new = self.expiry.insert(key, until).is_none();
        self.order.push_back((key, until));
        if self.order.len() > 2 * self.expiry.len() + SLACK {
            self.rebuild();
        }
        new
    }

    /// `key`'s expiry, if it is predicted.
    pub fn get(&self, key: &Key) -> Option<&f64> {
        self.expiry.get(key)
    }

    /// Forget `key`: true when it was predicted.
    pub fn remove(&mut self, key: &Key) -> bool {
        self.expiry.remove(key).is_some()
    }

    /// Remove the prediction that expires first, and say which it was.
    pub fn pop_oldest(&mut self) -> Option<Key> {
        while let Some((key, until)) = self.order.pop_front() {
            if self.expiry.get(&key) == Some(&until) {
                self.expiry.remove(&key);
                return Some(key);
            }
        }
        None
    }

    /// Remove the predictions expired at `now`, calling `expired` with each; the earliest
    /// expiry left (None when there is none).
    pub fn expire(&mut self, now: f64, mut expired: impl FnMut(Key)) -> Option<f64> {
        while let Some(&(key, until)) = self.order.front() {
            if until > now {
                return Some(until);
            }
            self.order.pop_front();
            if self.expiry.get(&key) == Some(&until) {
                self.expiry.remove(&key);
                expired(key);
            }
        }
        None
    }

    /// Bring every expiry later than `latest` forward to it.
    pub fn expire_by(&mut self, latest: f64) {
        for until in self.expiry.values_mut() {
            if *until > latest {
                *until = latest;
            }
        }
        self.rebuild();
    }

    /// The queue again from the live entries only, in expiry order.
    fn rebuild(&mut self) {
        let mut live: Vec<(Key, f64)> = self.expiry.iter().map(|(k, u)| (*k, *u)).collect();
        live.sort_by(|a, b| a.1.total_cmp(&b.1));
        self.order = live.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refreshed_key_expires_at_its_last_expiry() {
        let mut p = Predictions::default();
        assert!(p.insert(1, 1.0));
        assert!(p.insert(2, 2.0));
        assert!(!p.insert(1, 3.0));
        let mut gone = Vec::new();
        assert_eq!(p.expire(2.5, |k| gone.push(k)), Some(3.0));
        assert_eq!(gone, vec![2]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.expire(3.0, |k| gone.push(k)), None);
        assert_eq!(gone, vec![2, 1]);
    }

    #[test]
    fn the_oldest_live_prediction_goes_first_and_removed_ones_never_come_back() {
        let mut p = Predictions::default();
        p.insert(1, 1.0);
        p.insert(2, 2.0);
        p.insert(3, 3.0);
        assert!(p.remove(&1));
        p.insert(2, 4.0);
        assert_eq!(p.pop_oldest(), Some(3));
        assert_eq!(p.pop_oldest(), Some(2));
        assert_eq!(p.pop_oldest(), None);
    }

    #[test]
    fn expiries_brought_forward_expire_then() {
        let mut p = Predictions::default();
        p.insert(1, 10.0);
        p.insert(2, 1.0);
        p.expire_by(2.0);
        let mut gone = Vec::new();
        assert_eq!(p.expire(2.0, |k| gone.push(k)), None);
        gone.sort();
        assert_eq!(gone, vec![1, 2]);
    }

    #[test]
    fn the_queue_stays_bounded_by_the_live_entries() {
        let mut p = Predictions::default();
        for i in 0..100_000 {
            p.insert(7, f64::from(i));
        }
        assert_eq!(p.len(), 1);
        assert!(p.order.len() <= 2 + SLACK + 1);
    }
}
