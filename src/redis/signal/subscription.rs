//! The pub/sub connection that carries notices: a plain subscription (`SUBSCRIBE`) on one
//! server, a sharded one (`SSUBSCRIBE`, RESP3 push messages) on a cluster, where the channel
//! lives on the node that owns its slot. Either way a [`Subscription`] yields the payloads of
//! the channel's messages until the connection breaks, and answers pings.

use std::time::Duration;

use ::redis::aio::{PubSubSink, PubSubStream};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::redis::RedisConfig;
use crate::redis::conn::cluster;
use crate::redis::keys::hash_slot;

/// Where notices are subscribed to.
pub(super) enum Target {
    /// One server: `SUBSCRIBE` on a connection of its own.
    Plain(::redis::Client),
    /// A cluster: `SSUBSCRIBE` through a cluster connection of its own (seed nodes, config).
    Sharded(Vec<String>, RedisConfig),
}

/// A live subscription to the notice channel.
pub(super) enum Subscription {
    /// `SUBSCRIBE` on one server.
    Plain {
        sink: PubSubSink,
        stream: PubSubStream,
    },
    /// `SSUBSCRIBE` on the cluster node that owns the channel's slot.
    Sharded {
        connection: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        slot: u16,
    },
}

impl Target {
    /// Opens a connection of its own and subscribes it to `channel`.
    pub(super) async fn open(&self, channel: &str) -> RedisResult<Subscription> {
        match self {
            Self::Plain(client) => {
                let (mut sink, stream) = client.get_async_pubsub().await?.split();
                sink.subscribe(channel).await?;
                Ok(Subscription::Plain { sink, stream })
            }
            Self::Sharded(nodes, config) => {
                let (tx, pushes) = mpsc::unbounded_channel();
                let client = cluster::builder(nodes, config)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .build()?;
                let mut connection = client.get_async_connection().await?;
                connection.ssubscribe(channel).await?;
                Ok(Subscription::Sharded {
                    connection,
                    pushes,
                    slot: hash_slot(channel.as_bytes()),
                })
            }
        }
    }
}

impl Subscription {
    /// The payload of the channel's next message; `None` once the subscription has ended (the
    /// connection broke or closed, or the cluster moved the channel's slot elsewhere).
    pub(super) async fn next(&mut self) -> Option<Vec<u8>> {
        match self {
            Self::Plain { stream, .. } => stream
                .next()
                .await
                .map(|message| message.get_payload_bytes().to_vec()),
            Self::Sharded { pushes, .. } => loop {
                let push = pushes.recv().await?;
                match push.kind {
                    PushKind::SMessage => {
                        if let Some(Value::BulkString(payload)) = push.data.into_iter().nth(1) {
                            return Some(payload);
                        }
                    }
                    // The cluster connection would resubscribe by itself, but notices sent
                    // meanwhile are lost: end, so that readers re-read every flag.
                    PushKind::Disconnection | PushKind::SUnsubscribe => return None,
                    _ => {}
                }
            },
        }
    }

    /// Pings the node that serves the subscription, within `timeout`.
    pub(super) async fn ping(&mut self, timeout: Duration) -> Result<(), String> {
        let answer = match self {
            Self::Plain { sink, .. } => tokio::time::timeout(timeout, sink.ping::<Value>()).await,
            Self::Sharded {
                connection, slot, ..
            } => {
                let route =
                    SingleNodeRoutingInfo::SpecificNode(Route::new(*slot, SlotAddr::Master));
                tokio::time::timeout(
                    timeout,
                    connection.route_command(::redis::cmd("PING"), RoutingInfo::SingleNode(route)),
                )
                .await
            }
        };
        match answer {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("broke: {error}")),
            Err(_) => Err(format!("did not answer within {timeout:?}")),
        }
    }
}
