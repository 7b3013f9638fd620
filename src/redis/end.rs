//! A run's whole end in one script on Redis ([`EndStore`]): the final checkpoint's write
//! ([`checkpoint::PUT`]), then the history's append ([`history::APPEND`]) when the run has
//! messages for it, then the record's write ([`run::PUT`]) with, where it can, the rest of the
//! end after it (flags deleted, their notices published, the lease given up: see
//! [`run::put_end_script`]). Each step is the script it is alone, called as a Lua function
//! with its own keys and arguments, and runs only when the one before it answered `ok`; all
//! of them are fenced by the run's token and touch the thread's slot only. The record's
//! pointer and its index entries go in the same pipeline, as a record's write sends them.
//!
//! A run's end on Redis then costs one round trip instead of three (checkpoint, history,
//! record) or two (checkpoint, record, for a run without messages).

use std::fmt;
use std::sync::Arc;

use ::redis::Value;
use async_trait::async_trait;
use runvisor_actors::StoreError;
use runvisor_actors::store::{EndFailed, EndStep, EndStore, EndWritten, WholeEnd};

use super::checkpoint::{self, RedisCheckpointStore};
use super::history::{self, RedisHistoryStore};
use super::lease::FENCE_CHECK;
use super::reply;
use super::run::{self, RedisRunStore};
use super::scripts::{Lua, Part};

/// Runs the steps in order, each with its part of `KEYS` and `ARGV`.
///
/// ARGV ends with five counts: the checkpoint step's keys and arguments, the history step's
/// (both zero: no messages), and `1` when the record's step carries the rest of the end (else
/// `0`: the record alone). The record's step takes the keys and arguments left. Returns
/// `{step, reply}`: the first step whose reply is not `ok` with that reply, or `record` with
/// the record's.
const STEPS: &str = r#"
local n = #ARGV
local counts = {}
for i = 1, 5 do counts[i] = tonumber(ARGV[n - 5 + i]) end
local key_at, arg_at = 1, 1
local function take(keys, args)
  local k, a = {}, {}
  for i = 1, keys do k[i] = KEYS[key_at + i - 1] end
  for i = 1, args do a[i] = ARGV[arg_at + i - 1] end
  key_at, arg_at = key_at + keys, arg_at + args
  return k, a
end
local reply = checkpoint_put(take(counts[1], counts[2]))
if reply[1] ~= 'ok' then return {'checkpoint', reply} end
if counts[3] > 0 then
  reply = history_append(take(counts[3], counts[4]))
  if reply[1] ~= 'ok' then return {'history', reply} end
end
local record = record_alone
if counts[5] == 1 then record = record_end end
return {'record', record(take(#KEYS - key_at + 1, n - 5 - arg_at + 1))}
"#;

/// The whole end's script: the steps' scripts as functions whose parameters `KEYS` and `ARGV`
/// stand for the globals they read alone, then [`STEPS`].
fn whole_end_script() -> String {
    format!(
        "{FENCE_CHECK}{helpers}\
         local function checkpoint_put(KEYS, ARGV)\n{checkpoint}end\n\
         local function history_append(KEYS, ARGV)\n{history}end\n\
         local function record_alone(KEYS, ARGV)\n{alone}{record}end\n\
         local function record_end(KEYS, ARGV)\n{end}end\n\
         {STEPS}",
        helpers = checkpoint::HELPERS,
        checkpoint = checkpoint::PUT,
        history = history::APPEND,
        alone = run::PUT_ALONE,
        record = run::PUT,
        end = run::put_end_script(),
    )
}

/// [`EndStore`] on Redis: a run's final checkpoint, messages, record, flags and lease in one
/// script in the thread's slot. See [Atomicity and fencing](super#atomicity-and-fencing).
pub struct RedisEndStore {
    checkpoints: Arc<RedisCheckpointStore>,
    history: Arc<RedisHistoryStore>,
    runs: Arc<RedisRunStore>,
    lua: Lua,
}

impl fmt::Debug for RedisEndStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisEndStore").finish_non_exhaustive()
    }
}

impl RedisEndStore {
    /// The whole end through these stores' scripts (which must share one connection).
    pub(crate) fn new(
        checkpoints: Arc<RedisCheckpointStore>,
        history: Arc<RedisHistoryStore>,
        runs: Arc<RedisRunStore>,
    ) -> Self {
        Self {
            checkpoints,
            history,
            runs,
            lua: Lua::new(whole_end_script()),
        }
    }
}

#[async_trait]
impl EndStore for RedisEndStore {
    async fn put_whole_end(&self, end: &WholeEnd<'_>) -> Result<EndWritten, EndFailed> {
        let failed = |step| move |error| EndFailed { step, error };
        let record = end.record;
        let thread = &record.thread;
        let fence = Some(end.lease.fence);
        let checkpoint = self.checkpoints.put_part(thread, end.checkpoint, fence);
        // A message that cannot be encoded stops the end before anything is sent.
        let history = if end.messages.is_empty() {
            Part::default()
        } else {
            self.history
                .append_part(thread, end.messages, fence)
                .map_err(failed(EndStep::Checkpoint))?
        };
        let mut last = self.runs.record_part(record, fence);
        let released = self.runs.end_in_script(thread, end.flags);
        if released {
            self.runs.end_part(thread, end.flags, &mut last);
        }
        let key = last.keys[0].clone();
        let counts = [
            checkpoint.keys.len(),
            checkpoint.args.len(),
            history.keys.len(),
            history.args.len(),
            usize::from(released),
        ];
        let whole = Part::joined([checkpoint, history, last], &counts);
        // A reply that did not come (or makes no sense) leaves what landed unknown: the
        // caller writes every step again, each idempotent.
        let (reply, indexed) = self
            .runs
            .send(&self.lua, record, self.lua.cmd(&whole.keys, &whole.args))
            .await
            .map_err(failed(EndStep::Checkpoint))?;
        let (step, answer) = steps(&reply, &key).map_err(failed(EndStep::Checkpoint))?;
        match step {
            "checkpoint" => Err(failed(EndStep::Checkpoint)(refusal(
                self.checkpoints
                    .put_answer(answer, thread, end.checkpoint, fence),
                &key,
                answer,
            ))),
            "history" => Err(failed(EndStep::History)(refusal(
                self.history.append_answer(answer, thread, fence),
                &key,
                answer,
            ))),
            "record" => {
                self.runs
                    .recorded(record, fence, &key, answer, indexed)
                    .await
                    .map_err(failed(EndStep::Record))?;
                Ok(if released {
                    EndWritten::Released {
                        announced: self.runs.announces(),
                    }
                } else {
                    EndWritten::Record
                })
            }
            other => Err(failed(EndStep::Checkpoint)(StoreError::Unavailable(
                format!("the run end script for {key} answered an unknown step {other:?}"),
            ))),
        }
    }
}

/// The whole end script's reply: the step it ended at, and that step's reply.
fn steps<'a>(reply: &'a Value, key: &str) -> Result<(&'a str, &'a Value), StoreError> {
    match reply::array(reply, key)? {
        [step, answer] => Ok((reply::text(step, key)?, answer)),
        _ => Err(StoreError::Unavailable(format!(
            "unexpected reply from the run end script for {key}: {reply:?}"
        ))),
    }
}

/// The error a step's reply stands for; one that reads as a success (the script stops only
/// at a step that failed) is unexpected.
fn refusal(answered: Result<(), StoreError>, key: &str, answer: &Value) -> StoreError {
    answered.err().unwrap_or_else(|| {
        StoreError::Unavailable(format!(
            "the run end script for {key} stopped at a step that answered {answer:?}"
        ))
    })
}
