//! Identifier newtypes: runs, threads, nodes, checkpoints, messages.
//!
//! Run, checkpoint and message ids are UUIDv7: time-ordered, so their text order is their
//! creation order. Thread ids come from the host (a chat id, a session id) and are free text,
//! checked to be non-empty and printable so they can name keys safely.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// An id that is not acceptable, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct InvalidId {
    /// Which kind of id (`"run id"`, `"thread id"`, ...).
    pub what: &'static str,
    /// The offending text.
    pub value: String,
    /// Why it was refused.
    pub reason: &'static str,
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(uuid::Uuid);

        impl $name {
            /// A new, time-ordered id.
            pub fn new() -> Self {
                Self(uuid::Uuid::now_v7())
            }

            /// The underlying UUID.
            pub fn as_uuid(&self) -> uuid::Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                uuid::Uuid::parse_str(s).map(Self).map_err(|_| InvalidId {
                    what: $what,
                    value: s.to_owned(),
                    reason: "not a UUID",
                })
            }
        }
    };
}

uuid_id!(
    /// One execution of a workflow.
    RunId,
    "run id"
);
uuid_id!(
    /// A stored snapshot of a run.
    CheckpointId,
    "checkpoint id"
);
uuid_id!(
    /// One history message.
    MessageId,
    "message id"
);
uuid_id!(
    /// One pause for a person's answer.
    InteractionId,
    "interaction id"
);

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Checks and wraps an id: non-empty, at most
            #[doc = concat!(stringify!($max))]
            /// bytes, no whitespace or control characters.
            pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidId> {
                let id = id.as_ref();
                let reason = if id.is_empty() {
                    Some("is empty")
                } else if id.len() > $max {
                    Some(concat!("is longer than ", stringify!($max), " bytes"))
                } else if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    Some("contains whitespace or a control character")
                } else {
                    None
                };
                match reason {
                    Some(reason) => Err(InvalidId { what: $what, value: id.to_owned(), reason }),
                    None => Ok(Self(Arc::from(id))),
                }
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

text_id!(
    /// A conversation: the runs of one chat or session share a thread, and with it their
    /// history and checkpoints.
    ThreadId,
    "thread id",
    256
);
text_id!(
    /// A node of a workflow, unique within the workflow (body nodes included).
    NodeId,
    "node id",
    128
);

impl ThreadId {
    /// A fresh, unique thread id (a UUIDv7 in text form).
    pub fn generate() -> Self {
        Self(Arc::from(uuid::Uuid::now_v7().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ids_are_checked() {
        assert!(NodeId::new("llm_1").is_ok());
        assert_eq!(NodeId::new("").unwrap_err().reason, "is empty");
        assert!(NodeId::new("a b").is_err());
        assert!(NodeId::new("x".repeat(129)).is_err());
        assert!(ThreadId::new("chat:42").is_ok());
        let err: Result<NodeId, _> = serde_json::from_str("\"a\\nb\"");
        assert!(err.is_err());
    }

    #[test]
    fn uuid_ids_are_time_ordered_and_parse() {
        let a = RunId::new();
        let b = RunId::new();
        assert!(a.to_string() < b.to_string() || a == b);
        assert_eq!(a.to_string().parse::<RunId>(), Ok(a));
        assert!("nope".parse::<RunId>().is_err());
    }
}
