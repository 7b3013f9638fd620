//! Snapshots: the state of a run at a checkpoint, and its versioned binary envelope.
//!
//! Envelope (all integers big-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `RVSN` |
//! | 2 | format version (this layout): 1 |
//! | 2 | schema version (the [`Snapshot`] struct): 3 (1 and 2 are still read) |
//! | 1 | codec id: 1 = postcard, 2 = postcard in an LZ4 block |
//! | 4 | payload length |
//! | 4 | crc32c of the payload |
//! | n | payload |
//!
//! With codec 2 the payload is the length of the postcard bytes (4 bytes) followed by those
//! bytes compressed as one LZ4 block. A payload of at least [`COMPRESS_FROM`] bytes is written
//! so when that saves at least an eighth of it (a base holding a long loop's history);
//! smaller ones (most deltas) stay plain postcard, which every earlier build reads.
//!
//! The length is checked against [`MAX_SNAPSHOT_BYTES`] and against the bytes actually present
//! before anything is allocated, and the checksum before anything is decoded; so is the length
//! a compressed payload declares, and the block must fill it exactly. Decoding never
//! panics and never recurses without bound: values nested deeper than
//! [`MAX_DEPTH`](crate::model::MAX_DEPTH) and loop and parallel frames nested deeper than
//! [`MAX_FRAME_DEPTH`] are refused as they are read. Every problem is a [`SnapshotError`]
//! naming what is wrong. What a decoded snapshot says (nodes, indices, counts) is checked against
//! its workflow before a run restores it (`check.rs`).
//!
//! The same envelope carries checkpoint deltas (see [`delta`](crate::delta)): magic `RVDL`,
//! format 1, the delta schema version
//! ([`DELTA_SCHEMA_VERSION`](crate::delta::DELTA_SCHEMA_VERSION): 1), the same codec, length
//! limit, checksum and nesting checks. [`Snapshot::decode`] of a delta is
//! [`SnapshotError::NotWhole`]: a delta restores only with its chain
//! ([`materialize`](crate::delta::materialize)). Whole snapshots written before deltas existed
//! are bases, and restore as they are.
//!
//! Schema versions: 2 added [`Snapshot::history_len`], where the thread's history stood at the
//! checkpoint (what a fork copies). A version-1 snapshot decodes with `history_len: None`.
//! 3 added the user to the run's [`labels`](Snapshot::labels); older snapshots decode without
//! one.

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

pub use crate::core::{ItemError, IterationDetail};
use crate::model::{
    Interaction, MAX_DEPTH, Map, Message, NodeId, Route, RunId, RunStatus, StopReason, ThreadId,
    Value, watch_depth,
};
/// The persistent vector snapshots hold growing lists in (iterations, items, messages): shared
/// with the run's state, so taking a snapshot copies nothing. It encodes as a plain sequence.
pub use imbl::Vector;

/// The envelope's magic bytes.
pub const MAGIC: [u8; 4] = *b"RVSN";
/// The envelope's magic bytes for a delta (see [`delta`](crate::delta)).
pub const DELTA_MAGIC: [u8; 4] = *b"RVDL";
/// The envelope layout version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// The [`Snapshot`] schema version this build writes; it reads this one and older ones
/// (version 1: without [`Snapshot::history_len`]; 1 and 2: labels without a user).
pub const SCHEMA_VERSION: u16 = 3;
/// The codec id of postcard.
pub const CODEC_POSTCARD: u8 = 1;
/// The codec id of postcard compressed as one LZ4 block (see the module docs).
pub const CODEC_POSTCARD_LZ4: u8 = 2;
/// Payloads of at least this many bytes are compressed when that saves an eighth of them.
pub const COMPRESS_FROM: usize = 1024;
/// The largest payload accepted (64 MiB).
pub const MAX_SNAPSHOT_BYTES: usize = 64 * 1024 * 1024;

/// How many loop and parallel frames a snapshot may nest, one inside another (a loop in a
/// parallel in a loop...). Deeper ones are refused when decoding.
pub const MAX_FRAME_DEPTH: usize = 128;

const HEADER_LEN: usize = 4 + 2 + 2 + 1 + 4 + 4;
// Slice-by-16 tables: the same checksum as byte-at-a-time, several times faster.
const CRC32C: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);

/// A node that completed, as a snapshot records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletedNode {
    /// The node.
    pub node: NodeId,
    /// Which of its outgoing edges it activated.
    pub route: Route,
    /// Its output (shared with the run's state, so a snapshot copies no output).
    pub output: std::sync::Arc<Value>,
}

/// The progress of one execution of a graph: the workflow's, one loop iteration's, or one
/// parallel item's.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GraphState {
    /// Completed nodes, in completion order (a persistent vector: the run keeps it as nodes
    /// complete, so taking a snapshot copies nothing).
    pub completed: Vector<CompletedNode>,
    /// The nodes a resume starts: interrupted ones and ready ones not yet started.
    pub frontier: Vec<NodeId>,
    /// The saved progress of loop and parallel nodes of the frontier that were cut short.
    pub frames: Vec<SavedFrame>,
}

/// The progress of a loop or parallel node that was cut short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedFrame {
    /// The loop or parallel node.
    pub node: NodeId,
    /// Its progress. Every nesting of frames passes through here: decoding counts it.
    #[serde(deserialize_with = "nested_frame")]
    pub state: FrameState,
}

thread_local! {
    /// How many frames this thread is decoding, one inside another.
    static FRAMES: Cell<usize> = const { Cell::new(0) };
    /// Whether frames were refused for their nesting since the last decode began.
    static FRAMES_REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// Decodes a frame (or a frame's delta) inside at most [`MAX_FRAME_DEPTH`] others.
pub(crate) fn nested_frame<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct Level(usize);
    impl Drop for Level {
        fn drop(&mut self) {
            FRAMES.set(self.0);
        }
    }
    let around = FRAMES.get();
    if around >= MAX_FRAME_DEPTH {
        FRAMES_REFUSED.set(true);
        return Err(serde::de::Error::custom(format!(
            "loop and parallel frames nested deeper than {MAX_FRAME_DEPTH}"
        )));
    }
    FRAMES.set(around + 1);
    let _level = Level(around);
    T::deserialize(deserializer)
}

/// Loop or parallel progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FrameState {
    /// A loop.
    Loop(LoopState),
    /// A parallel node.
    Parallel(ParallelState),
}

/// What a loop keeps: finished iterations are never run again; the current one continues from
/// its own frontier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// The current iteration (from 0).
    pub iteration: u32,
    /// The loop variables as the current iteration left them.
    pub vars: Map,
    /// The `output` of each finished iteration.
    pub history: Vector<Value>,
    /// The body nodes that ran in each finished iteration.
    pub details: Vector<IterationDetail>,
    /// The items, in array mode.
    pub items: Option<Arc<[Value]>>,
    /// The current iteration's progress.
    pub body: GraphState,
    /// Assignments made in the loop to variables it does not own, in order.
    pub assigned: Vec<(String, Value)>,
}

/// What a parallel node keeps: finished items are never run again; items in progress continue
/// from their own frontier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelState {
    /// The items.
    pub items: Arc<[Value]>,
    /// The `output` of each finished item, by input index.
    pub results: Vector<Option<Value>>,
    /// Whether each item has finished (succeeded or failed).
    pub done: Vector<bool>,
    /// The errors of failed items.
    pub errors: Vector<ItemError>,
    /// Items in progress.
    pub in_progress: Vec<ItemState>,
    /// Assignments each item made to variables the node does not own (for items in progress,
    /// what they assigned so far).
    pub assigned: Vector<(u32, Vec<(String, Value)>)>,
}

/// A parallel item in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemState {
    /// The item's input index.
    pub index: u32,
    /// Its progress.
    pub body: GraphState,
}

/// The state of a run at a checkpoint: enough to continue it in another run (or process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The run that wrote it.
    pub run_id: RunId,
    /// The run that one resumed, if any.
    pub parent_run_id: Option<RunId>,
    /// The thread.
    pub thread: ThreadId,
    /// The writing run's sequence number for this snapshot.
    pub sequence: u64,
    /// Milliseconds since the epoch.
    pub created_at_ms: u64,
    /// The run's status when the snapshot was taken.
    pub status: RunStatus,
    /// Why it stopped, if it did.
    pub stop_reason: Option<StopReason>,
    /// The content hash of the workflow definition (xxh3-128, hex), stored once per thread in
    /// the checkpoint store, so any process can resume the run.
    pub workflow_hash: String,
    /// The definition itself, as JSON, when it could not be stored apart (then the snapshot
    /// is self-contained).
    pub workflow: Option<std::sync::Arc<str>>,
    /// The run inputs.
    pub inputs: Map,
    /// The current `{{sys.query}}` (a resume may have replaced the original).
    pub query: Option<Value>,
    /// The workflow variables.
    pub variables: Map,
    /// The workflow graph's progress, nested frames included.
    pub graph: GraphState,
    /// Interactions waiting for an answer.
    pub interactions: Vec<Interaction>,
    /// Messages the history store has not confirmed; a resume persists them first.
    pub pending_messages: Vector<Message>,
    /// The ids the run's stop and cancel flags are named by, and the user it runs for; a
    /// resume keeps them.
    pub labels: crate::model::RunLabels,
    /// Where the thread's history stood at this checkpoint: how many of the messages its
    /// history store holds (oldest first) were part of it. The `pending_messages` come after
    /// them. A fork copies exactly these messages, then the pending ones, into its new thread.
    ///
    /// `None` in snapshots written before schema version 2, which did not record it: a fork of
    /// such a checkpoint copies the source thread's whole history as stored when it forks.
    pub history_len: Option<u64>,
}

/// A [`Snapshot`] as schema version 2 wrote it: the same fields, in the same order, with
/// labels without a user. Only decoded, never written.
#[derive(Deserialize)]
struct SnapshotV2 {
    run_id: RunId,
    parent_run_id: Option<RunId>,
    thread: ThreadId,
    sequence: u64,
    created_at_ms: u64,
    status: RunStatus,
    stop_reason: Option<StopReason>,
    workflow_hash: String,
    workflow: Option<std::sync::Arc<str>>,
    inputs: Map,
    query: Option<Value>,
    variables: Map,
    graph: GraphState,
    interactions: Vec<Interaction>,
    pending_messages: Vector<Message>,
    labels: crate::model::LabelsV2,
    history_len: Option<u64>,
}

impl From<SnapshotV2> for Snapshot {
    fn from(v2: SnapshotV2) -> Self {
        Snapshot {
            run_id: v2.run_id,
            parent_run_id: v2.parent_run_id,
            thread: v2.thread,
            sequence: v2.sequence,
            created_at_ms: v2.created_at_ms,
            status: v2.status,
            stop_reason: v2.stop_reason,
            workflow_hash: v2.workflow_hash,
            workflow: v2.workflow,
            inputs: v2.inputs,
            query: v2.query,
            variables: v2.variables,
            graph: v2.graph,
            interactions: v2.interactions,
            pending_messages: v2.pending_messages,
            labels: v2.labels.0,
            history_len: v2.history_len,
        }
    }
}

/// A [`Snapshot`] as schema version 1 wrote it: the same fields, in the same order, without
/// `history_len`, with labels without a user. Only decoded, never written.
#[derive(Deserialize)]
struct SnapshotV1 {
    run_id: RunId,
    parent_run_id: Option<RunId>,
    thread: ThreadId,
    sequence: u64,
    created_at_ms: u64,
    status: RunStatus,
    stop_reason: Option<StopReason>,
    workflow_hash: String,
    workflow: Option<std::sync::Arc<str>>,
    inputs: Map,
    query: Option<Value>,
    variables: Map,
    graph: GraphState,
    interactions: Vec<Interaction>,
    pending_messages: Vector<Message>,
    labels: crate::model::LabelsV2,
}

impl From<SnapshotV1> for Snapshot {
    fn from(v1: SnapshotV1) -> Self {
        Snapshot {
            run_id: v1.run_id,
            parent_run_id: v1.parent_run_id,
            thread: v1.thread,
            sequence: v1.sequence,
            created_at_ms: v1.created_at_ms,
            status: v1.status,
            stop_reason: v1.stop_reason,
            workflow_hash: v1.workflow_hash,
            workflow: v1.workflow,
            inputs: v1.inputs,
            query: v1.query,
            variables: v1.variables,
            graph: v1.graph,
            interactions: v1.interactions,
            pending_messages: v1.pending_messages,
            labels: v1.labels.0,
            history_len: None,
        }
    }
}

/// A snapshot to write: what the checkpointer stores for a run, in sequence order.
#[derive(Debug)]
pub(crate) struct SnapshotWrite {
    pub(crate) thread: ThreadId,
    pub(crate) run: RunId,
    pub(crate) sequence: u64,
    /// The writing run's fencing token: the store refuses the write once it is stale.
    pub(crate) fence: Option<crate::model::Fence>,
    pub(crate) snapshot: Box<Snapshot>,
    /// How it is written: `sync` (awaited progress), `async` (in the background) or `final`
    /// (the run's end): named on the write's span.
    pub(crate) mode: &'static str,
    /// The span the write's span is a child of (the run's).
    pub(crate) parent: tracing::Span,
}

/// An awaited snapshot that was not stored: why, and the checkpoint as it was to be stored
/// (once encoded), handed back so that the caller can keep it elsewhere.
#[derive(Debug)]
pub(crate) struct SaveFailed {
    pub(crate) error: crate::model::CheckpointError,
    pub(crate) unwritten: Option<super::ports::StoredCheckpoint>,
}

impl From<crate::model::CheckpointError> for SaveFailed {
    fn from(error: crate::model::CheckpointError) -> Self {
        Self {
            error,
            unwritten: None,
        }
    }
}

/// A snapshot that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Fewer bytes than the header or the declared length.
    #[error("truncated snapshot: {0}")]
    Truncated(String),
    /// Not a runvisor snapshot.
    #[error("not a runvisor snapshot (bad magic bytes)")]
    BadMagic,
    /// Written by a newer build.
    #[error(
        "unsupported snapshot version: format {format}, schema {schema} (this build reads format {FORMAT_VERSION}, schema <= {SCHEMA_VERSION})"
    )]
    UnsupportedVersion {
        /// The format version found.
        format: u16,
        /// The schema version found.
        schema: u16,
    },
    /// An unknown codec.
    #[error("unsupported snapshot codec {0}")]
    UnsupportedCodec(u8),
    /// A compressed payload whose block does not decompress to the length it declares.
    #[error("compressed snapshot payload does not decompress: {0}")]
    Decompress(String),
    /// The declared payload is larger than allowed.
    #[error("snapshot payload of {0} bytes exceeds the {MAX_SNAPSHOT_BYTES}-byte limit")]
    TooLarge(usize),
    /// The checksum does not match: the bytes were altered.
    #[error("snapshot checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the payload.
        computed: u32,
    },
    /// The payload does not decode.
    #[error("snapshot payload does not decode: {0}")]
    Decode(String),
    /// The snapshot could not be encoded.
    #[error("snapshot does not encode: {0}")]
    Encode(String),
    /// A delta (what one checkpoint changed), not a whole snapshot: it restores only on top
    /// of the checkpoints it builds on (see [`delta`](crate::delta)).
    #[error(
        "a checkpoint delta, not a whole snapshot: it restores with the checkpoints it builds on"
    )]
    NotWhole,
    /// A delta does not fit the state it is applied to.
    #[error("checkpoint delta does not fit the state it builds on: {0}")]
    Mismatch(String),
    /// A checkpoint a delta builds on is gone (expired, or removed by hand).
    #[error("checkpoint {checkpoint}, which this one builds on, is missing")]
    MissingLink {
        /// The missing checkpoint.
        checkpoint: crate::model::CheckpointId,
    },
    /// A checkpoint this one builds on does not decode.
    #[error("checkpoint {checkpoint}, which this one builds on: {error}")]
    InChain {
        /// The checkpoint that does not decode.
        checkpoint: crate::model::CheckpointId,
        /// Why.
        error: Box<SnapshotError>,
    },
    /// The payload nests deeper than this build reads: a value past
    /// [`MAX_DEPTH`](crate::model::MAX_DEPTH), or frames past [`MAX_FRAME_DEPTH`].
    #[error("snapshot payload nests {what} deeper than {limit} levels (the limit)")]
    TooDeep {
        /// What nests too deep: `a value` or `loop and parallel frames`.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
}

impl Snapshot {
    /// Encodes the snapshot in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        seal(&MAGIC, SCHEMA_VERSION, self)
    }

    /// Decodes a snapshot from its envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        if bytes.starts_with(&DELTA_MAGIC) {
            return Err(SnapshotError::NotWhole);
        }
        let (schema, payload) = open(bytes, &MAGIC, SCHEMA_VERSION)?;
        match schema {
            1 => decode_payload::<SnapshotV1>(&payload).map(Snapshot::from),
            2 => decode_payload::<SnapshotV2>(&payload).map(Snapshot::from),
            _ => decode_payload::<Snapshot>(&payload),
        }
    }
}

/// Encodes `value` in an envelope with these magic bytes and schema version.
pub(crate) fn seal<T: Serialize>(
    magic: &[u8; 4],
    schema: u16,
    value: &T,
) -> Result<Vec<u8>, SnapshotError> {
    // The payload is written behind room for the header, in the buffer that is returned: a
    // payload stored as it is (every delta below the compression threshold) is not copied,
    // and a small one is written without regrowing the buffer.
    let mut out = Vec::with_capacity(HEADER_LEN + SEAL_CAPACITY);
    out.resize(HEADER_LEN, 0);
    let mut out = postcard::serialize_with_flavor(value, Sealing(out))
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    let plain = out.len() - HEADER_LEN;
    if plain > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(plain));
    }
    let plain_len = u32::try_from(plain).map_err(|_| SnapshotError::TooLarge(plain))?;
    if let Some(smaller) = compressed(&out[HEADER_LEN..], plain_len) {
        return frame(magic, schema, CODEC_POSTCARD_LZ4, &smaller);
    }
    let head = header(magic, schema, CODEC_POSTCARD, &out[HEADER_LEN..])?;
    out[..HEADER_LEN].copy_from_slice(&head);
    Ok(out)
}

/// The room [`seal`] makes for a payload before it grows its buffer: more than most deltas.
const SEAL_CAPACITY: usize = 256;

/// The postcard output [`seal`] writes into: a vector already holding room for the header.
struct Sealing(Vec<u8>);

impl postcard::ser_flavors::Flavor for Sealing {
    type Output = Vec<u8>;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// The envelope around a payload already in `codec`: header, then payload.
fn frame(
    magic: &[u8; 4],
    schema: u16,
    codec: u8,
    payload: &[u8],
) -> Result<Vec<u8>, SnapshotError> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header(magic, schema, codec, payload)?);
    out.extend_from_slice(payload);
    Ok(out)
}

/// The envelope's header for a payload already in `codec`: magic, versions, codec, length
/// and checksum.
fn header(
    magic: &[u8; 4],
    schema: u16,
    codec: u8,
    payload: &[u8],
) -> Result<[u8; HEADER_LEN], SnapshotError> {
    let len = u32::try_from(payload.len()).map_err(|_| SnapshotError::TooLarge(payload.len()))?;
    let mut head = [0u8; HEADER_LEN];
    head[..4].copy_from_slice(magic);
    head[4..6].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
    head[6..8].copy_from_slice(&schema.to_be_bytes());
    head[8] = codec;
    head[9..13].copy_from_slice(&len.to_be_bytes());
    head[13..17].copy_from_slice(&CRC32C.checksum(payload).to_be_bytes());
    Ok(head)
}

/// How many bytes of postcard an encoded snapshot or delta holds: its payload's length, or the
/// length a compressed payload declares; 0 for bytes that are not an envelope. What a chain's
/// compaction weighs (a base's cost to write and restore follows its decoded size).
pub(crate) fn plain_size(bytes: &[u8]) -> usize {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return 0;
    };
    match header[8] {
        CODEC_POSTCARD_LZ4 => bytes
            .get(HEADER_LEN..HEADER_LEN + 4)
            .and_then(|len| <[u8; 4]>::try_from(len).ok())
            .map_or(0, |len| u32::from_be_bytes(len) as usize),
        _ => bytes.len() - HEADER_LEN,
    }
}

/// The payload of codec 2 for `plain` (its length, then its LZ4 block), when `plain` is at
/// least [`COMPRESS_FROM`] bytes and that saves at least an eighth of them.
fn compressed(plain: &[u8], plain_len: u32) -> Option<Vec<u8>> {
    if plain.len() < COMPRESS_FROM {
        return None;
    }
    let bound = plain.len() - plain.len() / 8;
    let mut out = vec![0; 4 + lz4_flex::block::get_maximum_output_size(plain.len())];
    out[..4].copy_from_slice(&plain_len.to_be_bytes());
    let n = lz4_flex::block::compress_into(plain, &mut out[4..]).ok()?;
    if 4 + n > bound {
        return None;
    }
    out.truncate(4 + n);
    Some(out)
}

/// The postcard bytes of a codec-2 payload: the declared length is checked against
/// [`MAX_SNAPSHOT_BYTES`] before anything is allocated, and the block must decompress to
/// exactly that many bytes.
fn decompressed(payload: &[u8]) -> Result<Vec<u8>, SnapshotError> {
    let Some((len, block)) = payload.split_first_chunk::<4>() else {
        return Err(SnapshotError::Truncated(format!(
            "compressed payload of {} bytes, its length alone is 4",
            payload.len()
        )));
    };
    let len = u32::from_be_bytes(*len) as usize;
    if len > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(len));
    }
    let mut plain = vec![0; len];
    let n = lz4_flex::block::decompress_into(block, &mut plain)
        .map_err(|e| SnapshotError::Decompress(e.to_string()))?;
    if n != len {
        return Err(SnapshotError::Decompress(format!(
            "the block holds {n} bytes, the payload declares {len}"
        )));
    }
    Ok(plain)
}

/// Checks an envelope with these magic bytes (schema versions 1 to `max_schema`): returns the
/// schema version and the postcard payload, whose checksum matched (decompressed when its
/// codec says so).
pub(crate) fn open<'b>(
    bytes: &'b [u8],
    magic: &[u8; 4],
    max_schema: u16,
) -> Result<(u16, Cow<'b, [u8]>), SnapshotError> {
    if bytes.len() < HEADER_LEN {
        return Err(SnapshotError::Truncated(format!(
            "{} bytes, the header alone is {HEADER_LEN}",
            bytes.len()
        )));
    }
    let (header, payload) = bytes.split_at(HEADER_LEN);
    if header[0..4] != magic[..] {
        return Err(SnapshotError::BadMagic);
    }
    let format = u16::from_be_bytes([header[4], header[5]]);
    let schema = u16::from_be_bytes([header[6], header[7]]);
    if format != FORMAT_VERSION || schema > max_schema || schema == 0 {
        return Err(SnapshotError::UnsupportedVersion { format, schema });
    }
    let codec = header[8];
    if codec != CODEC_POSTCARD && codec != CODEC_POSTCARD_LZ4 {
        return Err(SnapshotError::UnsupportedCodec(codec));
    }
    let len = u32::from_be_bytes([header[9], header[10], header[11], header[12]]) as usize;
    if len > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(len));
    }
    if payload.len() != len {
        return Err(SnapshotError::Truncated(format!(
            "header declares {len} payload bytes, {} present",
            payload.len()
        )));
    }
    let stored = u32::from_be_bytes([header[13], header[14], header[15], header[16]]);
    let computed = CRC32C.checksum(payload);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    if codec == CODEC_POSTCARD_LZ4 {
        return Ok((schema, Cow::Owned(decompressed(payload)?)));
    }
    Ok((schema, Cow::Borrowed(payload)))
}

/// Decodes a payload of one schema version: values and frames nested too deep are refused as
/// they are read, and every byte must be used.
pub(crate) fn decode_payload<T: serde::de::DeserializeOwned>(
    payload: &[u8],
) -> Result<T, SnapshotError> {
    FRAMES_REFUSED.set(false);
    let (decoded, value_too_deep) = watch_depth(|| postcard::take_from_bytes::<T>(payload));
    let frames_too_deep = FRAMES_REFUSED.replace(false);
    let (snapshot, rest) = decoded.map_err(|e| {
        if value_too_deep {
            SnapshotError::TooDeep {
                what: "a value",
                limit: MAX_DEPTH,
            }
        } else if frames_too_deep {
            SnapshotError::TooDeep {
                what: "loop and parallel frames",
                limit: MAX_FRAME_DEPTH,
            }
        } else {
            SnapshotError::Decode(e.to_string())
        }
    })?;
    if !rest.is_empty() {
        return Err(SnapshotError::Decode(format!(
            "{} trailing bytes after the snapshot",
            rest.len()
        )));
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let node = |s: &str| NodeId::new(s).expect("id");
        let mut inputs = Map::new();
        inputs.insert("count".into(), Value::Int(0));
        inputs.insert("flag".into(), Value::Bool(false));
        inputs.insert("text".into(), Value::from(""));
        Snapshot {
            run_id: RunId::new(),
            parent_run_id: None,
            thread: ThreadId::new("t").expect("id"),
            sequence: 3,
            created_at_ms: 1,
            status: RunStatus::Stopped,
            stop_reason: Some(StopReason::UserInterrupted),
            workflow_hash: "00".into(),
            workflow: Some(std::sync::Arc::from("{}")),
            inputs,
            query: Some(Value::from("hi")),
            variables: Map::new(),
            graph: GraphState {
                completed: vec![CompletedNode {
                    node: node("a"),
                    route: Route::branches(["x"]),
                    output: std::sync::Arc::new(Value::from(vec![Value::Int(0), Value::Null])),
                }]
                .into(),
                frontier: vec![node("b")],
                frames: vec![SavedFrame {
                    node: node("b"),
                    state: FrameState::Loop(LoopState {
                        iteration: 0,
                        vars: Map::new(),
                        history: vec![Value::Bool(false)].into(),
                        details: vec![IterationDetail {
                            index: 0,
                            nodes: vec![node("c")],
                        }]
                        .into(),
                        items: Some(vec![Value::Int(0), Value::from("")].into()),
                        body: GraphState::default(),
                        assigned: vec![("x".into(), Value::Int(0))],
                    }),
                }],
            },
            interactions: Vec::new(),
            pending_messages: vec![Message::assistant("partial")].into(),
            labels: crate::model::RunLabels::app_chat("a", "c").expect("valid labels"),
            history_len: Some(4),
        }
    }

    #[test]
    fn round_trip_keeps_falsy_values() {
        let s = sample();
        let bytes = s.encode().expect("encode");
        assert_eq!(Snapshot::decode(&bytes), Ok(s));
    }

    #[test]
    fn damaged_envelopes_are_errors() {
        let bytes = sample().encode().expect("encode");
        assert!(matches!(
            Snapshot::decode(&bytes[..10]),
            Err(SnapshotError::Truncated(_))
        ));
        assert!(matches!(
            Snapshot::decode(&bytes[..bytes.len() - 1]),
            Err(SnapshotError::Truncated(_))
        ));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(Snapshot::decode(&bad), Err(SnapshotError::BadMagic));
        let mut bad = bytes.clone();
        bad[7] = 9;
        assert!(matches!(
            Snapshot::decode(&bad),
            Err(SnapshotError::UnsupportedVersion { schema: 9, .. })
        ));
        let mut bad = bytes.clone();
        bad[9..13].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Snapshot::decode(&bad),
            Err(SnapshotError::TooLarge(_))
        ));
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        assert!(matches!(
            Snapshot::decode(&bad),
            Err(SnapshotError::Checksum { .. })
        ));
    }

    /// The sample with a loop history of `turns` texts made by `text`.
    fn with_history(turns: usize, mut text: impl FnMut(usize) -> String) -> Snapshot {
        let mut s = sample();
        let FrameState::Loop(l) = &mut s.graph.frames[0].state else {
            unreachable!("the sample's frame is a loop")
        };
        l.history = (0..turns).map(|i| Value::from(text(i))).collect();
        s
    }

    /// A conversation's worth of loop outputs: compresses well, as text does.
    fn chatty() -> Snapshot {
        with_history(200, |i| {
            format!("turn {i}: the assistant looked the order up and answered the question")
        })
    }

    /// An envelope around `payload` with this codec and a matching checksum.
    fn envelope(codec: u8, payload: &[u8]) -> Vec<u8> {
        frame(&MAGIC, SCHEMA_VERSION, codec, payload).expect("a small payload")
    }

    #[test]
    fn a_large_snapshot_is_compressed_and_round_trips() {
        let s = chatty();
        let plain = postcard::to_allocvec(&s).expect("postcard");
        let bytes = s.encode().expect("encode");
        assert_eq!(bytes[8], CODEC_POSTCARD_LZ4);
        assert!(
            bytes.len() < plain.len() / 3,
            "{} bytes for {} of postcard",
            bytes.len(),
            plain.len()
        );
        assert_eq!(Snapshot::decode(&bytes), Ok(s));
        // The small sample stays plain postcard, as every earlier build wrote it.
        assert_eq!(sample().encode().expect("encode")[8], CODEC_POSTCARD);
    }

    #[test]
    fn a_payload_that_does_not_compress_stays_plain() {
        // Pseudo-random hex: LZ4 finds little to share.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let s = with_history(100, |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}{:016x}", x.rotate_left(29))
        });
        let bytes = s.encode().expect("encode");
        assert!(bytes.len() - HEADER_LEN >= COMPRESS_FROM);
        assert_eq!(bytes[8], CODEC_POSTCARD);
        assert_eq!(Snapshot::decode(&bytes), Ok(s));
    }

    #[test]
    fn damaged_compressed_payloads_are_errors() {
        let plain = postcard::to_allocvec(&chatty()).expect("postcard");
        let good = compressed(&plain, plain.len() as u32).expect("compresses");
        assert!(Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &good)).is_ok());
        // A declared length other than what the block holds.
        for len in [plain.len() - 1, plain.len() + 1, 0] {
            let mut bad = good.clone();
            bad[..4].copy_from_slice(&(len as u32).to_be_bytes());
            assert!(
                matches!(
                    Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &bad)),
                    Err(SnapshotError::Decompress(_))
                ),
                "declared {len}"
            );
        }
        // A declared length over the limit is refused before anything is allocated.
        let mut bad = good.clone();
        bad[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &bad)),
            Err(SnapshotError::TooLarge(_))
        ));
        // A block cut short, and a payload without room for its length.
        assert!(matches!(
            Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &good[..good.len() / 2])),
            Err(SnapshotError::Decompress(_))
        ));
        assert!(matches!(
            Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &good[..3])),
            Err(SnapshotError::Truncated(_))
        ));
        // Plain postcard labelled as compressed.
        assert!(Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &plain)).is_err());
    }

    proptest::proptest! {
        /// Whatever a compressed payload holds (its checksum matching), decoding answers an
        /// error or a snapshot, never a panic.
        #[test]
        fn crafted_compressed_payloads_never_panic(
            len in 0u32..1 << 16,
            block in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            let mut payload = len.to_be_bytes().to_vec();
            payload.extend_from_slice(&block);
            let _ = Snapshot::decode(&envelope(CODEC_POSTCARD_LZ4, &payload));
        }
    }

    /// Every single bit flipped in `bytes` is an error (never a panic): a flip in the header
    /// or payload is caught by the checks.
    fn every_bit_flip_is_caught(bytes: &[u8]) {
        for i in 0..bytes.len() * 8 {
            let mut flipped = bytes.to_vec();
            flipped[i / 8] ^= 1 << (i % 8);
            assert!(
                Snapshot::decode(&flipped).is_err(),
                "bit {i} went unnoticed"
            );
        }
    }

    #[test]
    fn every_single_bit_flip_is_an_error() {
        every_bit_flip_is_caught(&sample().encode().expect("encode"));
        let compressed = chatty().encode().expect("encode");
        assert_eq!(compressed[8], CODEC_POSTCARD_LZ4);
        every_bit_flip_is_caught(&compressed);
    }
}
