//! The engine's dynamic value: node outputs, run inputs and variables.
//!
//! `serde_json::Value` cannot be decoded by a non-self-describing codec such as postcard (it
//! needs `deserialize_any`), so snapshots could not hold it. [`Value`] serializes as plain JSON
//! for human-readable formats and as a tagged enum for binary ones, so both work. Falsy values
//! (`0`, `""`, `false`, `[]`) are ordinary values: nothing here treats them as missing.
//!
//! Values nest at most [`MAX_DEPTH`] levels. Deeper ones are refused wherever they enter (run
//! inputs, handler outputs, answers, decoding) because everything that walks a value by
//! recursion (clone, compare, encode, drop) would otherwise overflow the stack. Decoding counts
//! the nesting itself, for every deserializer; [`Value::depth`], [`Value::check_depth`] and
//! [`Value::dismantle`] work without recursion, so they are safe on a value of any depth.

use std::cell::Cell;
use std::fmt;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::map::ObjectMap;

/// An object: text keys in sorted order, so rendering and snapshots are deterministic.
pub type Map = ObjectMap<Value>;

/// How many arrays and objects a value may nest, one in another. A scalar nests 0 levels,
/// `[]` one, `[[1]]` two. Run inputs count as one object, so each input may nest one level
/// less. serde_json refuses JSON text nested 128 levels or more by its own recursion limit.
pub const MAX_DEPTH: usize = 128;

/// A value nested deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("nested deeper than {limit} levels of arrays and objects (the limit)")]
#[non_exhaustive]
pub struct TooDeep {
    /// The limit that was passed: [`MAX_DEPTH`].
    pub limit: usize,
}

impl TooDeep {
    /// The error for the value limit, [`MAX_DEPTH`].
    pub const fn value() -> Self {
        Self { limit: MAX_DEPTH }
    }
}

/// A dynamic value.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    /// JSON `null`; also what a reference to a node that did not run resolves to.
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// A whole number that fits in an `i64`.
    Int(i64),
    /// Any other number.
    Float(f64),
    /// Text.
    String(String),
    /// An ordered list.
    Array(Vec<Value>),
    /// A map with text keys.
    Object(Map),
}

impl Value {
    /// The name of this value's type, as error messages show it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "integer",
            Value::Float(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The text, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The number as `i64`, if this is an integer (or a float with no fractional part).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Float(f) if f.fract() == 0.0 && f.is_finite() => {
                // Saturating casts are fine: the check above rules out NaN.
                let i = *f as i64;
                (i as f64 == *f).then_some(i)
            }
            _ => None,
        }
    }

    /// The number as `f64`, if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The map, if this is an object.
    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// Looks up a field of an object (`None` for other types or a missing key).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object().and_then(|m| m.get(key))
    }

    /// Follows a path of object keys and array indices (`["items", "0", "name"]`).
    /// Returns `None` when a step does not exist; a present `null`, `0` or `""` is `Some`.
    pub fn pointer<I, S>(&self, path: I) -> Option<&Value>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut current = self;
        for step in path {
            let step = step.as_ref();
            current = match current {
                Value::Object(m) => m.get(step)?,
                Value::Array(items) => items.get(step.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(current)
    }

    /// Renders the value as text for templates: strings as they are, `null` as nothing,
    /// numbers and booleans in their JSON form, arrays and objects as compact JSON.
    pub fn render_into(&self, out: &mut String) {
        use std::fmt::Write as _;
        match self {
            Value::Null => {}
            Value::String(s) => out.push_str(s),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            other => out.push_str(&other.to_json().to_string()),
        }
    }

    /// Renders the value as text (see [`Value::render_into`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out);
        out
    }

    /// How many arrays and objects nest in this value on its deepest path (0 for a scalar).
    /// Walks the value without recursion, so any depth is safe.
    pub fn depth(&self) -> usize {
        self.deepest(usize::MAX)
    }

    /// Checks that the value nests at most [`MAX_DEPTH`] levels. Stops at the first path that
    /// goes deeper; no recursion, so any depth is safe.
    pub fn check_depth(&self) -> Result<(), TooDeep> {
        self.check_depth_within(MAX_DEPTH)
    }

    /// Checks that the value nests at most `limit` levels (see [`Value::check_depth`]).
    pub fn check_depth_within(&self, limit: usize) -> Result<(), TooDeep> {
        if self.deepest(limit) > limit {
            Err(TooDeep { limit })
        } else {
            Ok(())
        }
    }

    /// The depth, or any depth past `limit` as soon as one path passes it.
    fn deepest(&self, limit: usize) -> usize {
        let mut deepest = 0;
        // Each value with the number of arrays and objects around it.
        let mut pending: Vec<(&Value, usize)> = vec![(self, 0)];
        while let Some((value, around)) = pending.pop() {
            let level = around + 1;
            match value {
                Value::Array(items) => pending.extend(items.iter().map(|v| (v, level))),
                Value::Object(m) => pending.extend(m.values().map(|v| (v, level))),
                _ => continue,
            }
            deepest = deepest.max(level);
            if deepest > limit {
                break;
            }
        }
        deepest
    }

    /// Drops the value without recursion. Dropping a value the ordinary way recurses once per
    /// level; use this for a value that may be deeper than [`MAX_DEPTH`] (one just refused).
    pub fn dismantle(self) {
        let mut pending = vec![self];
        while let Some(value) = pending.pop() {
            match value {
                Value::Array(items) => pending.extend(items),
                Value::Object(m) => pending.extend(m.into_iter().map(|(_, v)| v)),
                _ => {}
            }
        }
    }

    /// Converts to a `serde_json::Value` (non-finite floats become `null`, as in JSON).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::String(s) => serde_json::Value::String(s.clone()),
            Value::Array(items) => items.iter().map(Value::to_json).collect(),
            Value::Object(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }
}

/// About how many bytes these values take in memory, themselves and what they own (texts,
/// items, entries): what a bound on the values kept in memory counts. An estimate: spare
/// capacity and the allocator's own overhead are not counted. Linear in the values' size, and
/// any depth: one stack of its own serves them all, and only values inside arrays and objects
/// go on it, so weighing texts and numbers allocates nothing.
pub(crate) fn weigh<'a>(values: impl IntoIterator<Item = &'a Value>) -> usize {
    let mut stack: Vec<&Value> = Vec::new();
    let mut total = 0usize;
    for root in values {
        let mut next = Some(root);
        while let Some(value) = next.take().or_else(|| stack.pop()) {
            total = total.saturating_add(std::mem::size_of::<Value>());
            match value {
                Value::String(text) => total = total.saturating_add(text.len()),
                Value::Array(items) => stack.extend(items),
                Value::Object(map) => {
                    for (key, item) in map.iter() {
                        total = total.saturating_add(std::mem::size_of::<String>() + key.len());
                        stack.push(item);
                    }
                }
                Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => {}
            }
        }
    }
    total
}

impl From<&serde_json::Value> for Value {
    fn from(json: &serde_json::Value) -> Self {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::String(s.clone()),
            serde_json::Value::Array(items) => {
                Value::Array(items.iter().map(Value::from).collect())
            }
            serde_json::Value::Object(m) => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), Value::from(v))).collect())
            }
        }
    }
}

impl From<serde_json::Value> for Value {
    fn from(json: serde_json::Value) -> Self {
        Value::from(&json)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<i32> for Value {
    fn from(i: i32) -> Self {
        Value::Int(i.into())
    }
}

impl From<u32> for Value {
    fn from(i: u32) -> Self {
        Value::Int(i.into())
    }
}

impl From<usize> for Value {
    fn from(i: usize) -> Self {
        i64::try_from(i).map_or(Value::Float(i as f64), Value::Int)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<Map> for Value {
    fn from(m: Map) -> Self {
        Value::Object(m)
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(items: Vec<T>) -> Self {
        Value::Array(items.into_iter().map(Into::into).collect())
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Value {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        Value::Object(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl fmt::Display for Value {
    /// Compact JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

/// The tagged form used by binary codecs (postcard and the like).
#[derive(Serialize, Deserialize)]
#[serde(rename = "Value")]
enum Tagged<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String(std::borrow::Cow<'a, str>),
    Array(std::borrow::Cow<'a, [Value]>),
    Object(std::borrow::Cow<'a, Map>),
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use std::borrow::Cow;
        if serializer.is_human_readable() {
            return match self {
                Value::Null => serializer.serialize_unit(),
                Value::Bool(b) => serializer.serialize_bool(*b),
                Value::Int(i) => serializer.serialize_i64(*i),
                Value::Float(f) if f.is_finite() => serializer.serialize_f64(*f),
                Value::Float(_) => serializer.serialize_unit(),
                Value::String(s) => serializer.serialize_str(s),
                Value::Array(items) => items.serialize(serializer),
                Value::Object(m) => m.serialize(serializer),
            };
        }
        let tagged = match self {
            Value::Null => Tagged::Null,
            Value::Bool(b) => Tagged::Bool(*b),
            Value::Int(i) => Tagged::Int(*i),
            Value::Float(f) => Tagged::Float(*f),
            Value::String(s) => Tagged::String(Cow::Borrowed(s)),
            Value::Array(items) => Tagged::Array(Cow::Borrowed(items)),
            Value::Object(m) => Tagged::Object(Cow::Borrowed(m)),
        };
        tagged.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Value {
    /// Decodes a value, refusing one nested deeper than [`MAX_DEPTH`] before recursing any
    /// further, whatever the deserializer.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let level = DecodeLevel::enter::<D::Error>()?;
        let value = if deserializer.is_human_readable() {
            deserializer.deserialize_any(JsonVisitor)?
        } else {
            match Tagged::deserialize(deserializer)? {
                Tagged::Null => Value::Null,
                Tagged::Bool(b) => Value::Bool(b),
                Tagged::Int(i) => Value::Int(i),
                Tagged::Float(f) => Value::Float(f),
                Tagged::String(s) => Value::String(s.into_owned()),
                Tagged::Array(items) => Value::Array(items.into_owned()),
                Tagged::Object(m) => Value::Object(m.into_owned()),
            }
        };
        level.leave(&value)?;
        Ok(value)
    }
}

thread_local! {
    /// How many values this thread is decoding, one inside another.
    static DECODING: Cell<usize> = const { Cell::new(0) };
    /// Whether a value was refused for its depth since [`watch_depth`] last looked.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// One level of value decoding on this thread. Entered before a value is decoded; a value is
/// refused as soon as it sits inside `MAX_DEPTH` others (its inner values are never decoded),
/// and an array or object inside `MAX_DEPTH` values (an empty one) when it is left.
struct DecodeLevel {
    around: usize,
}

impl DecodeLevel {
    fn enter<E: serde::de::Error>() -> Result<Self, E> {
        let around = DECODING.get();
        if around > MAX_DEPTH {
            return Err(refuse());
        }
        DECODING.set(around + 1);
        Ok(Self { around })
    }

    fn leave<E: serde::de::Error>(self, value: &Value) -> Result<(), E> {
        if self.around >= MAX_DEPTH && matches!(value, Value::Array(_) | Value::Object(_)) {
            return Err(refuse());
        }
        Ok(())
    }
}

impl Drop for DecodeLevel {
    fn drop(&mut self) {
        DECODING.set(self.around);
    }
}

fn refuse<E: serde::de::Error>() -> E {
    REFUSED.set(true);
    E::custom(TooDeep::value())
}

/// Runs a decode on this thread and tells whether it refused a value for its depth: codecs
/// such as postcard drop the message of a custom error, and this names it anyway.
pub(crate) fn watch_depth<T>(decode: impl FnOnce() -> T) -> (T, bool) {
    REFUSED.set(false);
    let out = decode();
    (out, REFUSED.replace(false))
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(i64::try_from(u).map_or(Value::Float(u as f64), Value::Int))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        // Collected, then sorted once: objects with many keys in any order build in
        // O(n log n).
        let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(4096));
        while let Some(entry) = access.next_entry::<String, Value>()? {
            entries.push(entry);
        }
        Ok(Value::Object(entries.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value weighs its texts, items and entries, linearly: a thousand copies of an object
    /// weigh a thousand times one, plus the array's slots.
    #[test]
    fn a_value_weighs_its_texts_items_and_entries() {
        let slot = std::mem::size_of::<Value>();
        assert_eq!(weigh([&Value::Int(7)]), slot);
        assert_eq!(weigh([&Value::String("x".repeat(1000))]), slot + 1000);
        let one = sample();
        let many = Value::Array(vec![one.clone(); 1000]);
        assert_eq!(weigh([&many]), slot + 1000 * weigh([&one]));
        assert_eq!(weigh([&one, &many]), weigh([&one]) + weigh([&many]));
        let mut entry = Map::new();
        entry.insert("key".into(), Value::String("text".into()));
        assert_eq!(
            weigh([&Value::Object(entry)]),
            slot + std::mem::size_of::<String>() + 3 + slot + 4
        );
    }

    fn sample() -> Value {
        let mut m = Map::new();
        m.insert("zero".into(), Value::Int(0));
        m.insert("empty".into(), Value::String(String::new()));
        m.insert("no".into(), Value::Bool(false));
        m.insert("none".into(), Value::Array(vec![]));
        m.insert("null".into(), Value::Null);
        m.insert("pi".into(), Value::Float(3.25));
        m.insert(
            "nested".into(),
            Value::Array(vec![Value::from("a"), Value::Object(Map::new())]),
        );
        Value::Object(m)
    }

    #[test]
    fn falsy_values_survive_postcard() {
        let v = sample();
        let bytes = postcard::to_allocvec(&v).expect("encode");
        let back: Value = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(back, v);
    }

    #[test]
    fn json_form_is_plain_json() {
        let v = sample();
        let text = serde_json::to_string(&v).expect("encode");
        assert_eq!(
            text,
            r#"{"empty":"","nested":["a",{}],"no":false,"none":[],"null":null,"pi":3.25,"zero":0}"#
        );
        let back: Value = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, v);
        assert_eq!(Value::from(v.to_json()), v);
    }

    #[test]
    fn pointer_finds_falsy_values_and_array_items() {
        let v = sample();
        assert_eq!(v.pointer(["zero"]), Some(&Value::Int(0)));
        assert_eq!(v.pointer(["null"]), Some(&Value::Null));
        assert_eq!(v.pointer(["nested", "0"]), Some(&Value::from("a")));
        assert_eq!(v.pointer(["nested", "7"]), None);
        assert_eq!(v.pointer(["zero", "x"]), None);
        assert_eq!(v.pointer(["missing"]), None);
    }

    #[test]
    fn rendering() {
        assert_eq!(Value::Null.render(), "");
        assert_eq!(Value::Int(0).render(), "0");
        assert_eq!(Value::Bool(false).render(), "false");
        assert_eq!(Value::from("x").render(), "x");
        assert_eq!(Value::from(vec![1, 2]).render(), "[1,2]");
        assert_eq!(Value::Float(1.5).render(), "1.5");
    }

    /// `[[...[null]...]]`, `levels` arrays deep, in postcard's encoding of the tagged form:
    /// variant 5 (array) and length 1 per level, then variant 0 (null).
    fn postcard_nested(levels: usize, innermost: &[u8]) -> Vec<u8> {
        let mut bytes = [5u8, 1].repeat(levels);
        bytes.extend_from_slice(innermost);
        bytes
    }

    fn nested(levels: usize) -> Value {
        let mut v = Value::Null;
        for _ in 0..levels {
            v = Value::Array(vec![v]);
        }
        v
    }

    #[test]
    fn depth_counts_arrays_and_objects_without_recursion() {
        assert_eq!(Value::Int(1).depth(), 0);
        assert_eq!(Value::Array(vec![]).depth(), 1);
        assert_eq!(sample().depth(), 3);
        let deep = nested(10_000);
        assert_eq!(deep.depth(), 10_000);
        assert_eq!(deep.check_depth(), Err(TooDeep { limit: MAX_DEPTH }));
        assert_eq!(deep.check_depth_within(10_000), Ok(()));
        deep.dismantle();
        assert_eq!(nested(MAX_DEPTH).check_depth(), Ok(()));
        assert!(nested(MAX_DEPTH + 1).check_depth().is_err());
    }

    #[test]
    fn decoding_refuses_values_past_the_limit_for_every_codec() {
        // At the limit: decodes, with an empty array or a scalar innermost.
        let at: Value = postcard::from_bytes(&postcard_nested(MAX_DEPTH, &[0])).expect("decode");
        assert_eq!(at.depth(), MAX_DEPTH);
        at.dismantle();
        let empty = postcard_nested(MAX_DEPTH - 1, &[5, 0]);
        assert!(postcard::from_bytes::<Value>(&empty).is_ok());
        // One past: refused, also when the innermost array is empty.
        for bytes in [
            postcard_nested(MAX_DEPTH + 1, &[0]),
            postcard_nested(MAX_DEPTH, &[5, 0]),
            postcard_nested(100_000, &[0]),
        ] {
            let (result, refused) = watch_depth(|| postcard::from_bytes::<Value>(&bytes));
            assert!(result.is_err());
            assert!(refused);
        }
        // The thread's count is back to zero after a refusal.
        assert!(postcard::from_bytes::<Value>(&postcard_nested(MAX_DEPTH, &[0])).is_ok());
        // JSON: serde_json's own limit, and ours for a deserializer without one.
        let text = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let mut json = serde_json::Value::Null;
        for _ in 0..MAX_DEPTH + 5 {
            json = serde_json::Value::Array(vec![json]);
        }
        let (result, refused) = watch_depth(|| Value::deserialize(&json));
        assert!(result.is_err());
        assert!(refused);
    }

    #[test]
    fn integer_views() {
        assert_eq!(Value::Float(3.0).as_i64(), Some(3));
        assert_eq!(Value::Float(3.5).as_i64(), None);
        assert_eq!(Value::Float(f64::NAN).as_i64(), None);
        assert_eq!(Value::from(u64::MAX as f64).as_i64(), None);
    }
}
