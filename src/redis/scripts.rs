//! Scripts sent as plain `EVALSHA` commands, many at once (one pipeline per node through
//! [`Conn::fan_out`]), loaded on every primary when a node does not know them yet (a restart,
//! a failover, a new node).

use std::sync::Arc;

use ::redis::{Cmd, Script, Value};
use runvisor_actors::StoreError;

use super::conn::Conn;

/// One script's keys and arguments: a step of a script made of several (see
/// [`super::end`]), or the whole of one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Part {
    /// Its keys, all in one slot.
    pub(crate) keys: Vec<String>,
    /// Its arguments.
    pub(crate) args: Vec<Vec<u8>>,
}

impl Part {
    /// The keys and arguments of a script made of several steps: each part's, one after the
    /// other, then `counts` as the last arguments (how the script tells the parts apart).
    pub(crate) fn joined(parts: impl IntoIterator<Item = Part>, counts: &[usize]) -> Part {
        let mut whole = Part::default();
        for part in parts {
            whole.keys.extend(part.keys);
            whole.args.extend(part.args);
        }
        whole
            .args
            .extend(counts.iter().map(|n| n.to_string().into_bytes()));
        whole
    }

    /// An invocation of `script` (alone) with these keys and arguments.
    pub(crate) fn invoke<'a>(&self, script: &'a Script) -> ::redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        for arg in &self.args {
            invocation.arg(arg.as_slice());
        }
        invocation
    }
}

/// A script and its source, to send by hash and load where it is unknown.
#[derive(Debug, Clone)]
pub(crate) struct Lua {
    script: Script,
    source: Arc<str>,
}

impl Lua {
    /// The script with this source.
    pub(crate) fn new(source: String) -> Self {
        Self {
            script: Script::new(&source),
            source: Arc::from(source),
        }
    }

    /// The script, to run one invocation with [`Conn::script`].
    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    /// One invocation as an `EVALSHA` command: `keys` (all in one slot), then `args`.
    pub(crate) fn cmd<K: ::redis::ToRedisArgs, A: ::redis::ToRedisArgs>(
        &self,
        keys: &[K],
        args: &[A],
    ) -> Cmd {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        for arg in args {
            cmd.arg(arg);
        }
        cmd
    }

    /// Runs invocations of this script ([`Lua::cmd`]), with any other commands among them, at
    /// once and answers one reply per command, in order; a reply may be a command's own error
    /// ([`Value::ServerError`]), for the caller to name its key. Invocations a node answers
    /// `NOSCRIPT` (which no other command answers) are sent again once the script is loaded
    /// on every primary.
    pub(crate) async fn run_many(
        &self,
        conn: &Conn,
        what: &str,
        cmds: Vec<Cmd>,
    ) -> Result<Vec<Value>, StoreError> {
        let mut replies = conn.fan_out(what, cmds.clone()).await?;
        let unknown: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Value::ServerError(e) if e.code() == "NOSCRIPT"))
            .map(|(i, _)| i)
            .collect();
        if unknown.is_empty() {
            return Ok(replies);
        }
        let mut load = ::redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&*self.source);
        conn.on_every_primary("SCRIPT LOAD", &load).await?;
        let again = conn
            .fan_out(what, unknown.iter().map(|&i| cmds[i].clone()).collect())
            .await?;
        for (i, reply) in unknown.into_iter().zip(again) {
            replies[i] = reply;
        }
        Ok(replies)
    }
}
