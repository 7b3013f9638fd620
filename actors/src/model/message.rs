//! History messages: what a conversation remembers across runs of one thread.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::ids::{MessageId, NodeId, RunId};
/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person using the agent.
    User,
    /// The agent.
    Assistant,
    /// Instructions to the model.
    System,
    /// A tool's result.
    Tool,
}

/// One message of a thread's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Unique and time-ordered; stores use it to make appends idempotent.
    pub id: MessageId,
    /// Who wrote it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// The run that produced it, once it is attached to one.
    pub run_id: Option<RunId>,
    /// The node that produced it, if a node did.
    pub node_id: Option<NodeId>,
    /// Set when the text was cut short by a stop (a stream interrupted mid-way).
    pub truncated: bool,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

impl Message {
    /// A new message with a fresh id.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            id: MessageId::new(),
            role,
            content: content.into(),
            run_id: None,
            node_id: None,
            truncated: false,
            created_at_ms: now_ms(),
        }
    }

    /// A message from the user.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// A message from the agent.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
