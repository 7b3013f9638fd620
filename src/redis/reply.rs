//! Reading Redis replies without trusting them: every shape or text that is not what the
//! layout promises becomes [`StoreError::Corrupt`] naming the key, never a panic. Replies are
//! accepted in both protocol versions (RESP2 arrays, RESP3 maps and sets).

use std::str::FromStr;

use ::redis::Value;
use runvisor_actors::StoreError;

/// A corrupt-data error about a key.
pub(crate) fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// A short description of a reply, for error messages (never the whole payload).
fn shape(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) | Value::VerbatimString { .. } => "a string",
        Value::Array(_) | Value::Set(_) => "an array",
        Value::Map(_) => "a map",
        Value::Okay => "OK",
        _ => "an unexpected reply",
    }
}

/// A per-command error inside a pipeline reply (with `ignore_errors`), as a store error
/// naming the command and the key, transient or permanent as its code says (see
/// [`classify`](super::conn::classify)).
pub(crate) fn server_error(value: &Value, command: &str, key: &str) -> Result<(), StoreError> {
    match value {
        Value::ServerError(e) => Err(super::conn::server_error(command, key, e)),
        _ => Ok(()),
    }
}

/// The bytes of a string reply.
pub(crate) fn bytes<'a>(value: &'a Value, key: &str) -> Result<&'a [u8], StoreError> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        Value::VerbatimString { text, .. } => Ok(text.as_bytes()),
        other => Err(corrupt(
            key,
            format!("expected a string, got {}", shape(other)),
        )),
    }
}

/// The text of a string reply.
pub(crate) fn text<'a>(value: &'a Value, key: &str) -> Result<&'a str, StoreError> {
    utf8(bytes(value, key)?, key, "value")
}

/// Bytes that must be UTF-8.
pub(crate) fn utf8<'a>(b: &'a [u8], key: &str, what: &str) -> Result<&'a str, StoreError> {
    std::str::from_utf8(b).map_err(|_| corrupt(key, format!("{what} is not UTF-8")))
}

/// The elements of an array reply (nil is empty).
pub(crate) fn array<'a>(value: &'a Value, key: &str) -> Result<&'a [Value], StoreError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(&[]),
        other => Err(corrupt(
            key,
            format!("expected an array, got {}", shape(other)),
        )),
    }
}

/// An integer reply.
pub(crate) fn int(value: &Value, key: &str) -> Result<i64, StoreError> {
    match value {
        Value::Int(i) => Ok(*i),
        other => text(other, key)?
            .parse()
            .map_err(|_| corrupt(key, format!("expected an integer, got {}", shape(other)))),
    }
}

/// Parses a text (an id, a number) read from a key.
pub(crate) fn parse<T: FromStr>(raw: &[u8], key: &str, what: &str) -> Result<T, StoreError> {
    let text = utf8(raw, key, what)?;
    text.parse()
        .map_err(|_| corrupt(key, format!("{what} {text:?} is not valid")))
}

/// The field/value pairs of a hash reply (`HGETALL`); empty when the key does not exist.
#[derive(Debug)]
pub(crate) struct Fields<'a> {
    key: &'a str,
    pairs: Vec<(&'a [u8], &'a [u8])>,
}

impl<'a> Fields<'a> {
    pub(crate) fn read(value: &'a Value, key: &'a str) -> Result<Self, StoreError> {
        let pairs = match value {
            Value::Map(pairs) => pairs
                .iter()
                .map(|(f, v)| Ok((bytes(f, key)?, bytes(v, key)?)))
                .collect::<Result<Vec<_>, StoreError>>()?,
            other => {
                let items = array(other, key)?;
                if items.len() % 2 != 0 {
                    return Err(corrupt(key, "hash reply with an odd number of items"));
                }
                items
                    .chunks_exact(2)
                    .map(|pair| Ok((bytes(&pair[0], key)?, bytes(&pair[1], key)?)))
                    .collect::<Result<Vec<_>, StoreError>>()?
            }
        };
        Ok(Self { key, pairs })
    }

    /// Whether the hash has no fields (the key does not exist).
    pub(crate) fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// A field's raw value.
    pub(crate) fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.pairs
            .iter()
            .find(|(f, _)| *f == name.as_bytes())
            .map(|(_, v)| *v)
    }

    /// A field that must be present.
    pub(crate) fn required(&self, name: &str) -> Result<&'a [u8], StoreError> {
        self.get(name)
            .ok_or_else(|| corrupt(self.key, format!("field `{name}` is missing")))
    }

    /// A field that must be present and UTF-8.
    pub(crate) fn required_text(&self, name: &str) -> Result<&'a str, StoreError> {
        utf8(self.required(name)?, self.key, &format!("field `{name}`"))
    }

    /// A field that may be absent, UTF-8 when present.
    pub(crate) fn optional_text(&self, name: &str) -> Result<Option<&'a str>, StoreError> {
        self.get(name)
            .map(|raw| utf8(raw, self.key, &format!("field `{name}`")))
            .transpose()
    }

    /// A field that must be present and parse.
    pub(crate) fn required_parsed<T: FromStr>(&self, name: &str) -> Result<T, StoreError> {
        parse(self.required(name)?, self.key, &format!("field `{name}`"))
    }

    /// A field that may be absent, parsing when present.
    pub(crate) fn optional_parsed<T: FromStr>(&self, name: &str) -> Result<Option<T>, StoreError> {
        self.get(name)
            .map(|raw| parse(raw, self.key, &format!("field `{name}`")))
            .transpose()
    }
}

/// The value of one parameter in a `CONFIG GET` reply.
pub(crate) fn config_value(value: &Value, name: &str) -> Option<String> {
    let fields = Fields::read(value, "CONFIG GET").ok()?;
    let raw = fields.get(name)?;
    std::str::from_utf8(raw).ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn hashes_in_both_protocols() {
        let resp2 = Value::Array(vec![bulk("a"), bulk("1"), bulk("b"), bulk("x")]);
        let resp3 = Value::Map(vec![(bulk("a"), bulk("1")), (bulk("b"), bulk("x"))]);
        for value in [resp2, resp3] {
            let f = Fields::read(&value, "k").expect("a hash");
            assert_eq!(f.required_parsed::<u64>("a"), Ok(1));
            assert!(matches!(
                f.required_parsed::<u64>("b"),
                Err(StoreError::Corrupt { key, .. }) if key == "k"
            ));
            assert_eq!(f.optional_text("c"), Ok(None));
            assert!(f.required("c").is_err());
        }
        assert!(Fields::read(&Value::Array(vec![bulk("a")]), "k").is_err());
        assert!(Fields::read(&Value::Int(3), "k").is_err());
        assert!(Fields::read(&Value::Nil, "k").expect("empty").is_empty());
    }

    #[test]
    fn config_replies() {
        let reply = Value::Array(vec![bulk("maxmemory-policy"), bulk("noeviction")]);
        assert_eq!(
            config_value(&reply, "maxmemory-policy").as_deref(),
            Some("noeviction")
        );
        assert_eq!(
            config_value(&Value::Array(vec![]), "maxmemory-policy"),
            None
        );
    }

    #[test]
    fn scalars() {
        assert_eq!(int(&Value::Int(4), "k"), Ok(4));
        assert_eq!(int(&bulk("5"), "k"), Ok(5));
        assert!(int(&bulk("x"), "k").is_err());
        assert!(text(&Value::BulkString(vec![0xff]), "k").is_err());
        assert!(bytes(&Value::Nil, "k").is_err());
        assert_eq!(array(&Value::Nil, "k").map(<[Value]>::len), Ok(0));
    }
}
