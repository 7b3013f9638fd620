//! Helpers for tests that hand the engine crafted checkpoints: snapshots sealed in their
//! envelope by hand (any payload, valid checksum), and a way to make one the newest checkpoint
//! of a thread, as a damaged or hostile store would.

use std::sync::atomic::{AtomicU64, Ordering};

use runvisor_actors::snapshot::{CODEC_POSTCARD, FORMAT_VERSION, MAGIC, SCHEMA_VERSION, Snapshot};
use runvisor_actors::store::StoredCheckpoint;
use runvisor_actors::{CheckpointId, Runtime, ThreadId};
use serde::Serialize;

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Sequence numbers past any a test run writes, one per crafted checkpoint.
static NEXT: AtomicU64 = AtomicU64::new(1_000);

/// Seals a payload in a valid envelope (magic, versions, codec, length, checksum).
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(17 + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&SCHEMA_VERSION.to_be_bytes());
    out.push(CODEC_POSTCARD);
    let len = u32::try_from(payload.len()).expect("payload fits the envelope");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&CRC32C.checksum(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// postcard's encoding of a value (fields of a struct are encoded one after the other, so a
/// snapshot's payload is the concatenation of its fields' encodings).
pub(crate) fn postcard_of<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("encodes")
}

/// The payload of `snapshot` with its fields from `graph` on replaced by hand-made bytes:
/// `graph` (the graph's encoding) and then the encodings of the fields after it.
pub(crate) fn payload_with_graph(snapshot: &Snapshot, graph: &[u8]) -> Vec<u8> {
    let s = snapshot;
    let mut out = postcard_of(&(
        &s.run_id,
        &s.parent_run_id,
        &s.thread,
        &s.sequence,
        &s.created_at_ms,
        &s.status,
        &s.stop_reason,
        &s.workflow_hash,
        &s.workflow,
        &s.inputs,
    ));
    out.extend(postcard_of(&(&s.query, &s.variables)));
    out.extend_from_slice(graph);
    out.extend(postcard_of(&(
        &s.interactions,
        &s.pending_messages,
        &s.labels,
        &s.history_len,
    )));
    out
}

/// Makes `bytes` the newest checkpoint of `thread`, as if the run of `snapshot` wrote it next.
pub(crate) async fn put_newest(
    rt: &Runtime,
    thread: &ThreadId,
    snapshot: &Snapshot,
    bytes: Vec<u8>,
) -> CheckpointId {
    let id = CheckpointId::new();
    rt.checkpoint_store()
        .put(
            thread,
            StoredCheckpoint {
                id,
                run: snapshot.run_id,
                sequence: snapshot.sequence + NEXT.fetch_add(1, Ordering::SeqCst),
                bytes,
                link: None,
            },
            None,
        )
        .await
        .expect("the memory store takes it");
    id
}

/// Makes a modified snapshot the newest checkpoint of its thread.
pub(crate) async fn put_snapshot(rt: &Runtime, snapshot: &Snapshot) -> CheckpointId {
    let bytes = snapshot.encode().expect("encodes");
    put_newest(rt, &snapshot.thread, snapshot, bytes).await
}
