//! [`ObjectMap`]: the objects of a [`Value`](super::value::Value) (as `Map`), keys in sorted
//! order.
//!
//! Objects in workflows are mostly small (a node's output, a form's answer), and a run may hold
//! hundreds of thousands of them (a loop's history, a parallel's results). A `BTreeMap` spends
//! several hundred bytes on a one-field object; this map keeps its entries in one sorted vector
//! whose capacity starts at one entry and grows by half, so a small object costs little more
//! than its entries. Lookups are binary searches; inserting in key order is amortized `O(1)`,
//! building in bulk from any order `O(n log n)`. Keys are always in sorted order, so rendering
//! and snapshots are deterministic.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An object: text keys in sorted order. `Value`'s objects are `ObjectMap<Value>`, named
/// `Map`.
#[derive(Clone, PartialEq)]
pub struct ObjectMap<Value>(Vec<(String, Value)>);

impl<Value> Default for ObjectMap<Value> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<Value> ObjectMap<Value> {
    /// An empty object.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// An empty object with room for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Vec::with_capacity(capacity))
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// The value of a key, to change it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.find(key).ok().map(|i| &mut self.0[i].1)
    }

    /// Whether a key is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets a key; returns its previous value.
    pub fn insert(&mut self, key: String, value: Value) -> Option<Value> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                if self.0.len() == self.0.capacity() {
                    // Grow by half (at least one): small objects stay exact.
                    self.0.reserve_exact((self.0.len() / 2).max(1));
                }
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes a key; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Keeps the entries the predicate accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&String, &Value) -> bool) {
        self.0.retain(|(k, v)| keep(k, v));
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&String, &Value)> + ExactSizeIterator {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The entries, in key order, values mutable.
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&String, &mut Value)> + ExactSizeIterator {
        self.0.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Value> + ExactSizeIterator {
        self.0.iter().map(|(_, v)| v)
    }

    /// The values, in key order, mutable.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut Value> + ExactSizeIterator {
        self.0.iter_mut().map(|(_, v)| v)
    }

    /// Builds a map from entries in any order; a repeated key keeps its last value.
    fn from_entries(mut entries: Vec<(String, Value)>) -> Self {
        if !entries.is_sorted_by(|a, b| a.0 < b.0) {
            // Stable: of equal keys, the last one given wins below.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut deduped: Vec<(String, Value)> = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                match deduped.last_mut() {
                    Some(last) if last.0 == k => last.1 = v,
                    _ => deduped.push((k, v)),
                }
            }
            entries = deduped;
        }
        entries.shrink_to_fit();
        Self(entries)
    }
}

impl<Value> std::ops::Index<&str> for ObjectMap<Value> {
    type Output = Value;

    /// The value of a key. Panics when the key is missing, as `BTreeMap` does; use
    /// [`ObjectMap::get`] for keys that may be absent.
    fn index(&self, key: &str) -> &Value {
        match self.get(key) {
            Some(v) => v,
            None => panic!("no key {key:?} in the map"),
        }
    }
}

impl<Value: fmt::Debug> fmt::Debug for ObjectMap<Value> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Into<String>, Value> FromIterator<(K, Value)> for ObjectMap<Value> {
    fn from_iter<T: IntoIterator<Item = (K, Value)>>(iter: T) -> Self {
        Self::from_entries(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<K: Into<String>, Value, const N: usize> From<[(K, Value); N]> for ObjectMap<Value> {
    fn from(entries: [(K, Value); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K: Into<String>, Value> Extend<(K, Value)> for ObjectMap<Value> {
    fn extend<T: IntoIterator<Item = (K, Value)>>(&mut self, iter: T) {
        for (k, v) in iter {
            self.insert(k.into(), v);
        }
    }
}

impl<Value> IntoIterator for ObjectMap<Value> {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, Value> IntoIterator for &'a ObjectMap<Value> {
    type Item = (&'a String, &'a Value);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a String, &'a Value)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<Value: Serialize> Serialize for ObjectMap<Value> {
    /// As a map, in key order (the same encoding as a `BTreeMap`, in every format).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, Value: Deserialize<'de>> Deserialize<'de> for ObjectMap<Value> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(std::marker::PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = ObjectMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<ObjectMap<V>, A::Error> {
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(4096));
                while let Some(entry) = access.next_entry::<String, V>()? {
                    entries.push(entry);
                }
                Ok(ObjectMap::from_entries(entries))
            }
        }

        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Map = ObjectMap<i64>;

    #[test]
    fn keys_stay_sorted_and_the_last_value_wins() {
        let m: Map = [("b", 1), ("a", 2), ("b", 3)].into_iter().collect();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(m.get("b"), Some(&3));
        let mut m = m;
        m.insert("0".into(), 0);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["0", "a", "b"]);
        assert_eq!(m.remove("a"), Some(2));
        assert_eq!(m.len(), 2);
        assert_eq!(m["b"], 3);
    }

    #[test]
    fn small_objects_stay_exact_and_large_ones_grow_by_half() {
        let mut m = Map::new();
        m.insert("a".into(), 1);
        assert_eq!(m.0.capacity(), 1);
        for i in 0..1000 {
            m.insert(format!("k{i:04}"), i);
        }
        assert_eq!(m.len(), 1001);
        assert!(m.0.capacity() < 1001 * 2);
    }

    #[test]
    fn encodes_like_a_btree_map() {
        let m = Map::from([("x", 1), ("a", -7)]);
        let b: std::collections::BTreeMap<String, i64> =
            [("x".to_owned(), 1), ("a".to_owned(), -7)].into();
        assert_eq!(
            postcard::to_allocvec(&m).expect("encode"),
            postcard::to_allocvec(&b).expect("encode")
        );
        assert_eq!(
            serde_json::to_string(&m).expect("encode"),
            serde_json::to_string(&b).expect("encode")
        );
        let back: Map =
            postcard::from_bytes(&postcard::to_allocvec(&b).expect("encode")).expect("decode");
        assert_eq!(back, m);
        let json: Map = serde_json::from_str(r#"{"z": 1, "a": 2, "z": 3}"#).expect("decode");
        assert_eq!(json, Map::from([("a", 2), ("z", 3)]));
    }
}
