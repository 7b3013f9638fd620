//! Run labels: who a run is for, as other processes name it (FastGPT app and chat, RAGFlow
//! task, the user it runs for). Stop and cancel flags are named after them, and checkpoint
//! stats and cleanup find a user's threads by the user label, so each is checked like any id
//! (non-empty, at most 256 bytes, no whitespace, control, bidirectional or zero-width
//! characters), when built and when read back from a record or a snapshot.

use serde::{Deserialize, Serialize};

use super::ids::{InvalidId, TextIdRule};

const APP: TextIdRule = TextIdRule {
    what: "app id",
    max: 256,
    too_long: "is longer than 256 bytes",
};
const CHAT: TextIdRule = TextIdRule {
    what: "chat id",
    max: 256,
    too_long: "is longer than 256 bytes",
};
const TASK: TextIdRule = TextIdRule {
    what: "task id",
    max: 256,
    too_long: "is longer than 256 bytes",
};
const USER: TextIdRule = TextIdRule {
    what: "user id",
    max: 256,
    too_long: "is longer than 256 bytes",
};

/// Who a run is for: the ids its flags are named after (app, chat, task) and the user it runs
/// for. Built only from checked ids ([`RunLabels::new`], [`RunLabels::app_chat`],
/// [`RunLabels::task`], [`RunLabels::with_user`]); decoding checks them too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Unchecked")]
pub struct RunLabels {
    app_id: Option<String>,
    chat_id: Option<String>,
    task_id: Option<String>,
    user_id: Option<String>,
}

/// The labels as stored, before they are checked. Labels stored before the user label existed
/// have no `user_id`.
#[derive(Deserialize)]
struct Unchecked {
    app_id: Option<String>,
    chat_id: Option<String>,
    task_id: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
}

impl TryFrom<Unchecked> for RunLabels {
    type Error = InvalidId;

    fn try_from(raw: Unchecked) -> Result<Self, InvalidId> {
        let labels = Self::new(raw.app_id, raw.chat_id, raw.task_id)?;
        match raw.user_id {
            Some(user) => labels.with_user(user),
            None => Ok(labels),
        }
    }
}

/// Labels as snapshot schemas 1 and 2 encoded them, without the user; only decoded.
#[derive(Debug, Deserialize)]
#[serde(try_from = "UncheckedV2")]
pub(crate) struct LabelsV2(pub(crate) RunLabels);

/// [`LabelsV2`] before they are checked.
#[derive(Deserialize)]
struct UncheckedV2 {
    app_id: Option<String>,
    chat_id: Option<String>,
    task_id: Option<String>,
}

impl TryFrom<UncheckedV2> for LabelsV2 {
    type Error = InvalidId;

    fn try_from(raw: UncheckedV2) -> Result<Self, InvalidId> {
        RunLabels::new(raw.app_id, raw.chat_id, raw.task_id).map(Self)
    }
}

impl RunLabels {
    /// Labels from any of the three ids, each checked.
    pub fn new(
        app_id: Option<String>,
        chat_id: Option<String>,
        task_id: Option<String>,
    ) -> Result<Self, InvalidId> {
        let checked = |rule: TextIdRule, id: Option<String>| match id {
            Some(id) => rule.check(&id).map(|()| Some(id)),
            None => Ok(None),
        };
        Ok(Self {
            app_id: checked(APP, app_id)?,
            chat_id: checked(CHAT, chat_id)?,
            task_id: checked(TASK, task_id)?,
            user_id: None,
        })
    }

    /// These labels with the user the run is for (checked), replacing any user they had.
    /// Checkpoint stats and cleanup find a user's threads by it.
    pub fn with_user(self, user_id: impl Into<String>) -> Result<Self, InvalidId> {
        let user_id = user_id.into();
        USER.check(&user_id)?;
        Ok(Self {
            user_id: Some(user_id),
            ..self
        })
    }

    /// Labels for a FastGPT-style app and chat.
    pub fn app_chat(
        app_id: impl Into<String>,
        chat_id: impl Into<String>,
    ) -> Result<Self, InvalidId> {
        Self::new(Some(app_id.into()), Some(chat_id.into()), None)
    }

    /// Labels for a RAGFlow-style task.
    pub fn task(task_id: impl Into<String>) -> Result<Self, InvalidId> {
        Self::new(None, None, Some(task_id.into()))
    }

    /// The application (FastGPT `appId`).
    pub fn app_id(&self) -> Option<&str> {
        self.app_id.as_deref()
    }

    /// The conversation (FastGPT `chatId`).
    pub fn chat_id(&self) -> Option<&str> {
        self.chat_id.as_deref()
    }

    /// The task (RAGFlow task id).
    pub fn task_id(&self) -> Option<&str> {
        self.task_id.as_deref()
    }

    /// The user the run is for.
    pub fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_checked_when_built_and_when_read() {
        let labels = RunLabels::app_chat("app1", "chat9").expect("valid");
        assert_eq!(labels.app_id(), Some("app1"));
        assert_eq!(labels.chat_id(), Some("chat9"));
        assert_eq!(labels.task_id(), None);
        let err = RunLabels::app_chat("app1", "chat\u{202E}9").expect_err("bidi");
        assert_eq!(err.what, "chat id");
        assert_eq!(RunLabels::task("").map_err(|e| e.reason), Err("is empty"));
        assert!(RunLabels::task("t".repeat(257)).is_err());
        assert!(RunLabels::new(Some("a\u{200B}".into()), None, None).is_err());
        // Four optional strings, checked when read; labels stored without a user still read.
        let json = serde_json::to_string(&labels).expect("encode");
        assert_eq!(
            json,
            r#"{"app_id":"app1","chat_id":"chat9","task_id":null,"user_id":null}"#
        );
        assert_eq!(
            serde_json::from_str::<RunLabels>(&json).ok(),
            Some(labels.clone())
        );
        let older = r#"{"app_id":"app1","chat_id":"chat9","task_id":null}"#;
        assert_eq!(
            serde_json::from_str::<RunLabels>(older).ok(),
            Some(labels.clone())
        );
        let bad = r#"{"app_id":"a\u0000","chat_id":null,"task_id":null}"#;
        assert!(serde_json::from_str::<RunLabels>(bad).is_err());
        let user = labels.clone().with_user("wang1").expect("valid");
        assert_eq!(user.user_id(), Some("wang1"));
        assert_eq!(user.app_id(), Some("app1"));
        let json = serde_json::to_string(&user).expect("encode");
        assert_eq!(serde_json::from_str::<RunLabels>(&json).ok(), Some(user));
        assert_eq!(
            labels.clone().with_user("a b").map_err(|e| e.what),
            Err("user id")
        );
        let bad = r#"{"app_id":null,"chat_id":null,"task_id":null,"user_id":""}"#;
        assert!(serde_json::from_str::<RunLabels>(bad).is_err());
        let bytes = postcard::to_allocvec(&RunLabels::task("T42").expect("valid")).expect("enc");
        assert_eq!(
            postcard::from_bytes::<RunLabels>(&bytes).ok(),
            RunLabels::task("T42").ok()
        );
    }
}
