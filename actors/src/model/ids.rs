//! Identifier newtypes: runs, threads, nodes, checkpoints, messages.
//!
//! Run, checkpoint and message ids are UUIDv7: time-ordered, so their text order is their
//! creation order. Thread ids come from the host (a chat id, a session id) and node ids from
//! workflow definitions; both are free text, checked by one rule (`TextIdRule`) so they can name
//! keys and show in logs safely: non-empty, bounded, and without whitespace, control,
//! bidirectional-override or zero-width characters (text that could hide what it says).

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

/// Characters that change how text around them is shown (bidirectional embeddings, overrides,
/// isolates and marks) or are not shown at all (zero-width spaces, joiners, the BOM).
fn is_hidden_format(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{061C}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2060}'
            | '\u{FEFF}'
    )
}

/// What host-given id text must be: non-empty, at most `max` bytes, and without whitespace,
/// control, bidirectional or zero-width characters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextIdRule {
    /// Which kind of id, for errors (`"thread id"`).
    pub(crate) what: &'static str,
    /// The longest accepted, in bytes.
    pub(crate) max: usize,
    /// The reason given for a longer one (`"is longer than 256 bytes"`).
    pub(crate) too_long: &'static str,
}

impl TextIdRule {
    /// Checks an id against the rule.
    pub(crate) fn check(&self, id: &str) -> Result<(), InvalidId> {
        let reason = if id.is_empty() {
            Some("is empty")
        } else if id.len() > self.max {
            Some(self.too_long)
        } else if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Some("contains whitespace or a control character")
        } else if id.chars().any(is_hidden_format) {
            Some("contains a bidirectional or zero-width character")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(InvalidId {
                what: self.what,
                value: id.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }
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

impl CheckpointId {
    /// A new id that sorts after `floor`: a new time-ordered id when this process's clock is
    /// past `floor`, otherwise the next id after it (its random bits counted up by one, and
    /// the millisecond on when they run out), still a valid UUIDv7. After the last id there is
    /// (a millisecond past the year 10,000) nothing sorts: the answer is then a new id.
    ///
    /// A thread's checkpoints are ordered by id, which is time order only while the processes
    /// writing them agree on the time: a run that continues a checkpoint written by a process
    /// whose clock was ahead of this one takes its ids from here, so its checkpoints still
    /// sort after the one it continues, and the thread's newest is its newest.
    pub fn after(floor: CheckpointId) -> Self {
        let now = Self::new();
        if now > floor {
            return now;
        }
        // UUIDv7: 48 bits of milliseconds, 4 of version, 12 of `rand_a`, 2 of variant, 62 of
        // `rand_b`; counted up in the random bits, carried into the millisecond.
        const RAND_B: u128 = (1 << 62) - 1;
        const RAND_A: u128 = 0xfff << 64;
        const MILLIS: u128 = ((1 << 48) - 1) << 80;
        let v = floor.0.as_u128();
        let next = if v & RAND_B != RAND_B {
            v + 1
        } else if v & RAND_A != RAND_A {
            (v & !RAND_B) + (1 << 64)
        } else if v & MILLIS != MILLIS {
            (v & !(RAND_A | RAND_B)) + (1 << 80)
        } else {
            // The last id there is (its millisecond is past the year 10,000): nothing sorts
            // after it, and a new id never takes its place.
            return now;
        };
        Self(uuid::Uuid::from_u128(next))
    }
}
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
            /// bytes, no whitespace, control, bidirectional or zero-width characters.
            pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidId> {
                let id = id.as_ref();
                const RULE: TextIdRule = TextIdRule {
                    what: $what,
                    max: $max,
                    too_long: concat!("is longer than ", stringify!($max), " bytes"),
                };
                RULE.check(id)?;
                Ok(Self(Arc::from(id)))
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
text_id!(
    /// A worker: one runtime (usually one process) running runs, named in run records, logs
    /// and leases.
    WorkerId,
    "worker id",
    128
);

impl ThreadId {
    /// A fresh, unique thread id (a UUIDv7 in text form).
    pub fn generate() -> Self {
        Self(Arc::from(uuid::Uuid::now_v7().to_string()))
    }
}

impl WorkerId {
    /// A fresh, unique worker id (a UUIDv7 in text form).
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
    fn hidden_and_invisible_characters_are_refused() {
        for bad in [
            "a\u{202E}b",
            "a\u{202A}",
            "\u{2066}x",
            "x\u{2069}",
            "a\u{200E}",
            "a\u{200F}",
            "a\u{061C}",
            "a\u{200B}b",
            "a\u{200D}",
            "\u{2060}a",
            "\u{FEFF}a",
            "a\u{7}",
            "a\u{2028}b",
            "a\tb",
        ] {
            let err = ThreadId::new(bad).expect_err(bad);
            assert_eq!(err.what, "thread id");
            assert!(NodeId::new(bad).is_err(), "{bad:?}");
        }
        assert!(ThreadId::new("chat:é-中文").is_ok());
        assert_eq!(
            ThreadId::new("x".repeat(257)).map_err(|e| e.reason),
            Err("is longer than 256 bytes")
        );
        let err: Result<ThreadId, _> = serde_json::from_str("\"a\\u202eb\"");
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

    #[test]
    fn an_id_after_a_floor_ahead_of_the_clock_sorts_after_it_and_stays_a_uuid_v7() {
        let v7 = |id: CheckpointId| {
            let uuid = id.as_uuid();
            assert_eq!(uuid.get_version_num(), 7, "{uuid}");
            assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{uuid}");
        };
        // A checkpoint from a process whose clock is an hour ahead.
        let ahead = uuid::Timestamp::from_unix(
            uuid::NoContext,
            uuid::Timestamp::now(uuid::NoContext).to_unix().0 + 3600,
            0,
        );
        let floor = CheckpointId(uuid::Uuid::new_v7(ahead));
        let mut last = floor;
        for _ in 0..100 {
            let next = CheckpointId::after(last);
            v7(next);
            assert!(
                next > last && next.to_string() > last.to_string(),
                "{next} after {last}"
            );
            assert_eq!(
                next.as_uuid().get_timestamp(),
                floor.as_uuid().get_timestamp()
            );
            last = next;
        }
        // Behind the clock, a floor changes nothing: the id is a new one.
        let behind = CheckpointId::new();
        let next = CheckpointId::after(behind);
        assert!(next > behind);
        assert_ne!(next.as_uuid().as_u128(), behind.as_uuid().as_u128() + 1);
        // The random bits run out: the next id is the following millisecond's first.
        let full = |millis: u128| {
            CheckpointId(uuid::Uuid::from_u128(
                (millis << 80) | (0x7 << 76) | (0xfff << 64) | (0b10 << 62) | ((1 << 62) - 1),
            ))
        };
        let far = (1u128 << 47) + 5;
        let carried = CheckpointId::after(full(far));
        v7(carried);
        assert_eq!(
            carried.as_uuid().as_u128(),
            ((far + 1) << 80) | (0x7 << 76) | (0b10 << 62)
        );
        // Only `rand_b` full: `rand_a` counts up.
        let half = CheckpointId(uuid::Uuid::from_u128(
            (far << 80) | (0x7 << 76) | (0x123 << 64) | (0b10 << 62) | ((1 << 62) - 1),
        ));
        let next = CheckpointId::after(half);
        v7(next);
        assert_eq!(
            next.as_uuid().as_u128(),
            (far << 80) | (0x7 << 76) | (0x124 << 64) | (0b10 << 62)
        );
        assert!(next > half);
        // Nothing sorts after the last id there is: a new one, never the same.
        let last = CheckpointId(uuid::Uuid::from_u128(
            (((1u128 << 48) - 1) << 80)
                | (0x7 << 76)
                | (0xfff << 64)
                | (0b10 << 62)
                | ((1 << 62) - 1),
        ));
        let next = CheckpointId::after(last);
        assert_ne!(next, last);
        v7(next);
    }
}
