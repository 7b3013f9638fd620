//! Run labels: who a run is for, as other processes name it (FastGPT app and chat, RAGFlow
//! task). Stop and cancel flags are named after them.

use serde::{Deserialize, Serialize};

/// Who a run is for the processes that may stop it: the ids its flags are named after.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLabels {
    /// The application (FastGPT `appId`).
    pub app_id: Option<String>,
    /// The conversation (FastGPT `chatId`).
    pub chat_id: Option<String>,
    /// The task (RAGFlow task id).
    pub task_id: Option<String>,
}

impl RunLabels {
    /// Labels for a FastGPT-style app and chat.
    pub fn app_chat(app_id: impl Into<String>, chat_id: impl Into<String>) -> Self {
        Self {
            app_id: Some(app_id.into()),
            chat_id: Some(chat_id.into()),
            task_id: None,
        }
    }

    /// Labels for a RAGFlow-style task.
    pub fn task(task_id: impl Into<String>) -> Self {
        Self {
            task_id: Some(task_id.into()),
            ..Self::default()
        }
    }
}
