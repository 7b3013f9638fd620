//! Human in the loop: an [`Interaction`] is a pause at an `interactive` node, named by its full
//! path through loop iterations and parallel items. The run that reaches it checkpoints and
//! ends as `AwaitingInput`; a resume with the answer continues in the exact frame.

use serde::{Deserialize, Serialize};

use crate::event::NodePath;
use crate::ids::{InteractionId, NodeId};
use crate::workflow::InteractionKind;

/// A question waiting for a person's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    /// Names this pause; the answer must quote it (a stale id is refused).
    pub id: InteractionId,
    /// Where: the interactive node through every enclosing loop iteration and parallel item.
    pub path: NodePath,
    /// The interactive node.
    pub node: NodeId,
    /// The rendered `prompt`, if the node has one.
    pub prompt: Option<String>,
    /// What is asked: a form or a choice.
    pub kind: InteractionKind,
}
