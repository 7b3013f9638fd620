//! The snapshot format, pinned: encoded sample snapshots are committed under
//! `tests/snapshots/` (at the workspace root) and every build must decode them to exactly the
//! values built here, and encode those values to exactly the committed bytes. Any change to the
//! envelope or to the [`Snapshot`] schema (a field added, reordered or retyped, an enum variant
//! moved) fails here, so a format change is always a deliberate one: bump
//! [`SCHEMA_VERSION`] (or [`FORMAT_VERSION`]), keep reading the old samples, and add new ones.
//!
//! Samples of older schema versions (`v1_*`: before `history_len`; `v2_*`: labels without a
//! user) are only decoded: they must still give their values, with what this build fills in
//! for the fields they lack. Samples of the current version (`v3_*`) are decoded and encoded.
//!
//! Regenerating the current version's samples (only when the change is intended):
//!
//! ```sh
//! RUNVISOR_WRITE_SNAPSHOT_SAMPLES=1 cargo test -p runvisor-actors --test engine snapshot_format
//! ```
//!
//! writes `tests/snapshots/v3_<name>.bin` from the values below, then the test checks them as
//! usual. Older samples are never rewritten.
//!
//! Also a deterministic fuzz of the decoder (seeded PRNG, a few thousand cases, well under a
//! second): random buffers, truncations and multi-bit flips of the samples, payload mutations
//! re-sealed with a valid checksum (so postcard itself is fuzzed), and headers declaring huge
//! lengths. Decoding must return an error (or `Ok` only where the input is a valid snapshot),
//! never panic, and never allocate anything near a declared length: a counting allocator
//! records the largest single allocation made while the decoder runs on the test's thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;

use runvisor_actors::snapshot::{
    CODEC_POSTCARD, CompletedNode, FORMAT_VERSION, FrameState, GraphState, ItemError, ItemState,
    IterationDetail, LoopState, MAGIC, MAX_SNAPSHOT_BYTES, ParallelState, SCHEMA_VERSION,
    SavedFrame, Snapshot, SnapshotError,
};
use runvisor_actors::store::RunStatus;
use runvisor_actors::{
    FieldType, FormField, Interaction, InteractionKind, Map, Message, NodeId, Role, Route,
    RunLabels, SelectOption, StopReason, ThreadId, Value,
};

/// Set to `1` to (re)write the committed samples from the values built here.
const WRITE_ENV: &str = "RUNVISOR_WRITE_SNAPSHOT_SAMPLES";

/// The envelope header: magic, format, schema, codec, length, crc32c.
const HEADER_LEN: usize = 4 + 2 + 2 + 1 + 4 + 4;
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

// ---------------------------------------------------------------------------------------------
// The samples.

fn node(id: &str) -> NodeId {
    NodeId::new(id).expect("valid node id")
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Map {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

fn done(id: &str, route: Route, output: Value) -> CompletedNode {
    CompletedNode {
        node: node(id),
        route,
        output: Arc::new(output),
    }
}

fn message(id: &str, role: Role, content: &str, node_id: Option<&str>, at: u64) -> Message {
    Message {
        id: id.parse().expect("message id"),
        role,
        content: content.to_owned(),
        run_id: Some(RUN.parse().expect("run id")),
        node_id: node_id.map(node),
        truncated: false,
        created_at_ms: at,
    }
}

const RUN: &str = "01920000-0000-7000-8000-0000000000a1";
const PARENT: &str = "01920000-0000-7000-8000-0000000000a0";
/// 2024-09-01T00:00:00Z.
const T0: u64 = 1_725_148_800_000;

fn base(status: RunStatus, workflow: &str) -> Snapshot {
    Snapshot {
        run_id: RUN.parse().expect("run id"),
        parent_run_id: None,
        thread: ThreadId::new("chat:sample").expect("thread id"),
        sequence: 1,
        created_at_ms: T0,
        status,
        stop_reason: None,
        workflow_hash: "5eed".repeat(8),
        // Stored apart normally; inline here so one sample covers the self-contained form.
        workflow: Some(Arc::from(workflow)),
        inputs: Map::new(),
        query: None,
        variables: Map::new(),
        graph: GraphState::default(),
        interactions: Vec::new(),
        pending_messages: Vec::new().into(),
        labels: RunLabels::default(),
        history_len: None,
    }
}

/// A linear run stopped by the user in the middle of a stream: completions with both routes,
/// falsy values everywhere, a truncated message waiting to be persisted.
fn stopped() -> Snapshot {
    let mut truncated = message(
        "01920000-0000-7000-8000-0000000000c2",
        Role::Assistant,
        "Half an ans",
        Some("answer"),
        T0 + 900,
    );
    truncated.truncated = true;
    Snapshot {
        parent_run_id: Some(PARENT.parse().expect("run id")),
        sequence: 7,
        stop_reason: Some(StopReason::UserInterrupted),
        inputs: map([
            ("query", Value::from("refund my order")),
            ("tier", Value::Int(0)),
            ("vip", Value::Bool(false)),
            ("note", Value::from("")),
            ("tags", Value::Array(Vec::new())),
        ]),
        query: Some(Value::from("refund my order")),
        variables: map([
            ("score", Value::Float(0.5)),
            ("attempts", Value::Int(-3)),
            ("seen", Value::Null),
            (
                "profile",
                Value::Object(map([("name", Value::from("Ada"))])),
            ),
        ]),
        graph: GraphState {
            completed: vec![
                done("start", Route::All, Value::Object(Map::new())),
                done(
                    "classify",
                    Route::branches(["refund"]),
                    Value::Object(map([
                        ("label", Value::from("refund")),
                        ("confidence", Value::Float(0.93)),
                    ])),
                ),
                done(
                    "lookup",
                    Route::All,
                    Value::Array(vec![Value::Int(0), Value::Null, Value::from("")]),
                ),
            ]
            .into(),
            frontier: vec![node("answer")],
            frames: Vec::new(),
        },
        pending_messages: vec![
            message(
                "01920000-0000-7000-8000-0000000000c1",
                Role::User,
                "refund my order",
                None,
                T0,
            ),
            truncated,
        ]
        .into(),
        labels: RunLabels::app_chat("app-1", "chat-9").expect("valid labels"),
        ..base(
            RunStatus::Stopped,
            r#"{"id":"support","nodes":[{"id":"start","kind":"begin"}]}"#,
        )
    }
}

/// A run paused at a form inside an inner loop inside an outer loop, with a second (choice)
/// interaction pending: nested loop frames and both interaction kinds.
fn awaiting_loop() -> Snapshot {
    let inner = LoopState {
        iteration: 0,
        vars: map([("draft", Value::from(""))]),
        history: Vec::new().into(),
        details: Vec::new().into(),
        items: Some(vec![Value::from("a"), Value::from("b")].into()),
        body: GraphState {
            completed: vec![done(
                "write",
                Route::All,
                Value::Object(map([("text", Value::from("draft 1"))])),
            )]
            .into(),
            frontier: vec![node("ask")],
            frames: Vec::new(),
        },
        assigned: Vec::new(),
    };
    let outer = LoopState {
        iteration: 2,
        vars: map([("round", Value::Int(2)), ("done", Value::Bool(false))]),
        history: vec![Value::Int(0), Value::Object(Map::new())].into(),
        details: vec![
            IterationDetail {
                index: 0,
                nodes: vec![node("plan"), node("inner")],
            },
            IterationDetail {
                index: 1,
                nodes: vec![node("plan"), node("inner")],
            },
        ]
        .into(),
        items: None,
        body: GraphState {
            completed: vec![done("plan", Route::All, Value::from("step 3"))].into(),
            frontier: vec![node("inner")],
            frames: vec![SavedFrame {
                node: node("inner"),
                state: FrameState::Loop(inner),
            }],
        },
        assigned: vec![("total".to_owned(), Value::Int(42))],
    };
    let form = Interaction {
        id: "01920000-0000-7000-8000-0000000000d1"
            .parse()
            .expect("interaction id"),
        path: "outer/#2/inner/#0/ask".parse().expect("path"),
        node: node("ask"),
        prompt: Some("Approve the draft?".to_owned()),
        kind: InteractionKind::FormInput {
            fields: vec![
                FormField {
                    name: "approved".to_owned(),
                    ty: FieldType::Bool,
                    required: true,
                    label: Some("Approved".to_owned()),
                    default: None,
                },
                FormField {
                    name: "budget".to_owned(),
                    ty: FieldType::Number,
                    required: false,
                    label: None,
                    default: Some(Value::Float(0.0)),
                },
                FormField {
                    name: "count".to_owned(),
                    ty: FieldType::Integer,
                    required: false,
                    label: None,
                    default: Some(Value::Int(0)),
                },
                FormField {
                    name: "comment".to_owned(),
                    ty: FieldType::String,
                    required: false,
                    label: None,
                    default: Some(Value::from("")),
                },
            ],
        },
    };
    let choice = Interaction {
        id: "01920000-0000-7000-8000-0000000000d2"
            .parse()
            .expect("interaction id"),
        path: "pick".parse().expect("path"),
        node: node("pick"),
        prompt: None,
        kind: InteractionKind::UserSelect {
            options: vec![
                SelectOption {
                    value: "yes".to_owned(),
                    label: "Yes".to_owned(),
                },
                SelectOption {
                    value: "no".to_owned(),
                    label: "No".to_owned(),
                },
            ],
        },
    };
    Snapshot {
        sequence: 12,
        created_at_ms: T0 + 60_000,
        query: Some(Value::from("plan my trip")),
        variables: map([("total", Value::Int(40))]),
        graph: GraphState {
            completed: vec![done("start", Route::All, Value::Null)].into(),
            frontier: vec![node("outer"), node("pick")],
            frames: vec![SavedFrame {
                node: node("outer"),
                state: FrameState::Loop(outer),
            }],
        },
        interactions: vec![form, choice],
        labels: RunLabels::task("task-7").expect("valid label"),
        ..base(RunStatus::AwaitingInput, r#"{"id":"trip"}"#)
    }
}

/// A parallel node cut short by a shutdown: finished, failed and in-progress items, items in
/// progress with their own frontier, assignments by item.
fn parallel() -> Snapshot {
    let state = ParallelState {
        items: vec![
            Value::from("alpha"),
            Value::from("beta"),
            Value::from("gamma"),
            Value::from("delta"),
        ]
        .into(),
        results: vec![
            Some(Value::Object(map([("len", Value::Int(5))]))),
            None,
            None,
            Some(Value::Null),
        ]
        .into(),
        done: vec![true, false, false, true].into(),
        errors: vec![ItemError {
            index: 3,
            error: "node `fetch` failed: timeout".to_owned(),
        }]
        .into(),
        in_progress: vec![
            ItemState {
                index: 1,
                body: GraphState {
                    completed: vec![done("fetch", Route::All, Value::from("beta!"))].into(),
                    frontier: vec![node("summarize")],
                    frames: Vec::new(),
                },
            },
            ItemState {
                index: 2,
                body: GraphState {
                    completed: Default::default(),
                    frontier: vec![node("fetch")],
                    frames: Vec::new(),
                },
            },
        ],
        assigned: vec![(0, vec![("seen".to_owned(), Value::Int(1))])].into(),
    };
    Snapshot {
        sequence: u64::MAX - 1,
        created_at_ms: T0 + 3_600_000,
        stop_reason: Some(StopReason::Shutdown),
        graph: GraphState {
            completed: vec![done("start", Route::All, Value::Object(Map::new()))].into(),
            frontier: vec![node("fan")],
            frames: vec![SavedFrame {
                node: node("fan"),
                state: FrameState::Parallel(state),
            }],
        },
        pending_messages: vec![message(
            "01920000-0000-7000-8000-0000000000c3",
            Role::Tool,
            "fetched 5 bytes: \u{1f600}",
            Some("fetch"),
            T0 + 3_599_000,
        )]
        .into(),
        // The usual form: the definition is stored apart, named by its hash.
        workflow: None,
        ..base(RunStatus::Stopped, r#"{"id":"fan-out"}"#)
    }
}

/// The samples as schema version 1 wrote them (no `history_len`: decoded as `None`).
fn v1_samples() -> [(&'static str, Snapshot); 3] {
    [
        ("v1_stopped", stopped()),
        ("v1_awaiting_loop", awaiting_loop()),
        ("v1_parallel", parallel()),
    ]
}

/// The samples as schema version 2 wrote them: where the thread's history stood, recorded (a
/// run that found no history, one that found some, and the largest count); no user label.
fn v2_samples() -> [(&'static str, Snapshot); 3] {
    let [(_, stopped), (_, awaiting), (_, parallel)] = v1_samples();
    [
        (
            "v2_stopped",
            Snapshot {
                history_len: Some(0),
                ..stopped
            },
        ),
        (
            "v2_awaiting_loop",
            Snapshot {
                history_len: Some(12),
                ..awaiting
            },
        ),
        (
            "v2_parallel",
            Snapshot {
                history_len: Some(u64::MAX),
                ..parallel
            },
        ),
    ]
}

/// The samples in the current schema: the user a run is for among its labels (beside app and
/// chat, beside a task, and none).
fn samples() -> [(&'static str, Snapshot); 3] {
    let [(_, stopped), (_, awaiting), (_, parallel)] = v2_samples();
    let with_user = |labels: RunLabels, user: &str| labels.with_user(user).expect("valid user");
    [
        (
            "v3_stopped",
            Snapshot {
                labels: with_user(stopped.labels.clone(), "wang1"),
                ..stopped
            },
        ),
        ("v3_awaiting_loop", awaiting),
        (
            "v3_parallel",
            Snapshot {
                labels: with_user(parallel.labels.clone(), "u-\u{e9}t\u{e9}"),
                ..parallel
            },
        ),
    ]
}

fn sample_path(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/snapshots"))
        .join(format!("{name}.bin"))
}

/// Where two byte strings first differ, for a readable failure.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn samples_of_schema_1_still_decode_to_their_values_with_no_history_len() {
    for (name, expected) in v1_samples() {
        let path = sample_path(name);
        let committed =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert_eq!(&committed[..4], &MAGIC, "{name}: magic");
        assert_eq!(
            u16::from_be_bytes([committed[6], committed[7]]),
            1,
            "{name}: schema version"
        );
        match Snapshot::decode(&committed) {
            Ok(decoded) => assert_eq!(decoded, expected, "{name}"),
            Err(e) => panic!("{name}: a schema-1 sample no longer decodes: {e}"),
        }
    }
}

#[test]
fn samples_of_schema_2_still_decode_to_their_values_with_no_user() {
    for (name, expected) in v2_samples() {
        let path = sample_path(name);
        let committed =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert_eq!(
            u16::from_be_bytes([committed[6], committed[7]]),
            2,
            "{name}: schema version"
        );
        match Snapshot::decode(&committed) {
            Ok(decoded) => {
                assert_eq!(decoded.labels.user_id(), None, "{name}");
                assert_eq!(decoded, expected, "{name}");
            }
            Err(e) => panic!("{name}: a schema-2 sample no longer decodes: {e}"),
        }
    }
}

/// Without a user and a history length, a schema-3 payload ends in two `None` fields (a byte
/// each in postcard): the labels' user, then `history_len`. Without the user's byte it is a
/// schema-2 payload, without both a schema-1 payload; each reads only as its own version.
#[test]
fn the_schema_version_decides_how_a_payload_is_read() {
    for (name, v1) in v1_samples() {
        let v3 = v1.encode().expect("encodes");
        let v1_payload = &v3[HEADER_LEN..v3.len() - 2];
        let mut v2_payload = v1_payload.to_vec();
        v2_payload.push(0);
        assert_eq!(
            Snapshot::decode(&seal_as(1, v1_payload)).as_ref(),
            Ok(&v1),
            "{name}"
        );
        assert_eq!(
            Snapshot::decode(&seal_as(2, &v2_payload)).as_ref(),
            Ok(&v1),
            "{name}"
        );
        let older_payloads = [seal_as(2, v1_payload), seal(v1_payload), seal(&v2_payload)];
        for sealed in older_payloads {
            let schema = u16::from_be_bytes([sealed[6], sealed[7]]);
            assert!(
                matches!(Snapshot::decode(&sealed), Err(SnapshotError::Decode(_))),
                "{name}: a schema-{schema} header over an older payload must not decode"
            );
        }
    }
}

#[test]
fn committed_samples_decode_to_their_values_and_their_values_encode_to_them() {
    let write = std::env::var(WRITE_ENV).is_ok_and(|v| v == "1");
    for (name, expected) in samples() {
        let path = sample_path(name);
        let encoded = expected.encode().expect("the sample encodes");
        if write {
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
            std::fs::write(&path, &encoded).expect("write the sample");
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}; generate it with {WRITE_ENV}=1 (see this file's docs)",
                path.display()
            )
        });
        // The committed bytes are in this build's envelope.
        assert_eq!(&committed[..4], &MAGIC, "{name}: magic");
        assert_eq!(
            u16::from_be_bytes([committed[4], committed[5]]),
            FORMAT_VERSION,
            "{name}: format version"
        );
        assert_eq!(
            u16::from_be_bytes([committed[6], committed[7]]),
            SCHEMA_VERSION,
            "{name}: schema version"
        );
        assert_eq!(committed[8], CODEC_POSTCARD, "{name}: codec");
        // (a) What was written decodes to the value.
        match Snapshot::decode(&committed) {
            Ok(decoded) => assert_eq!(
                decoded, expected,
                "{name}: the committed sample decodes to something else: the schema changed"
            ),
            Err(e) => panic!(
                "{name}: the committed sample no longer decodes ({e}): the format changed; \
                 bump the schema version and keep reading old snapshots"
            ),
        }
        // (b) The value encodes to what was written.
        assert!(
            encoded == committed,
            "{name}: the encoding changed (first difference at byte {:?}; {} bytes now, {} \
             committed); if intended, bump the version and regenerate with {WRITE_ENV}=1",
            first_difference(&encoded, &committed),
            encoded.len(),
            committed.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The decoder fuzz.

/// Records the largest single allocation made on a thread while it tracks.
struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the allocator may run while thread locals are being torn down.
    let _ = TRACKING.try_with(|tracking| {
        if tracking.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping touches
// only `const`-initialised thread locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded; `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded; `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Decodes with allocation tracking on; returns the result and the largest allocation.
fn decode_tracked(bytes: &[u8]) -> (Result<Snapshot, SnapshotError>, usize) {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let result = Snapshot::decode(bytes);
    TRACKING.with(|t| t.set(false));
    (result, LARGEST.with(Cell::get))
}

/// No decode may allocate more than this at once (postcard/serde cap speculative
/// preallocation at 1 MiB); every declared length the fuzz uses is far larger.
const ALLOCATION_BOUND: usize = 2 * 1024 * 1024;

/// splitmix64: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// An envelope of the current schema around `payload` with a correct checksum and length.
fn seal(payload: &[u8]) -> Vec<u8> {
    seal_as(SCHEMA_VERSION, payload)
}

/// An envelope of schema `schema` around `payload` with a correct checksum and length.
fn seal_as(schema: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&schema.to_be_bytes());
    out.push(CODEC_POSTCARD);
    out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&CRC32C.checksum(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes one fuzzed input: never a panic, never a large allocation; `Ok` only if allowed,
/// and then a snapshot that survives its own round trip.
#[track_caller]
fn check(case: &str, bytes: &[u8], ok_allowed: bool) {
    let (result, largest) = decode_tracked(bytes);
    assert!(
        largest <= ALLOCATION_BOUND,
        "{case}: decoding {} bytes allocated {largest} bytes at once",
        bytes.len()
    );
    match result {
        Err(e) => {
            // Every error names its problem.
            assert!(!e.to_string().is_empty(), "{case}");
        }
        Ok(snapshot) => {
            assert!(ok_allowed, "{case}: damaged input decoded: {snapshot:?}");
            // Compared by bytes: a mutated float may be NaN, which is not equal to itself.
            let again = snapshot.encode().expect("a decoded snapshot encodes");
            let redecoded = Snapshot::decode(&again).expect("and decodes again");
            assert_eq!(redecoded.encode().expect("encodes"), again, "{case}");
        }
    }
}

/// A fixed seed and fixed counts of cases: the same inputs, and the same work, on every run.
#[test]
fn the_decoder_survives_garbage_damage_and_lying_headers() {
    let mut rng = Rng(0x5eed_0fc0_ffee);
    // The current schema's samples, and the committed older ones (their decoders too).
    let mut encoded: Vec<Vec<u8>> = samples()
        .iter()
        .map(|(_, s)| s.encode().expect("encodes"))
        .collect();
    for (name, _) in v1_samples().into_iter().chain(v2_samples()) {
        encoded.push(std::fs::read(sample_path(name)).expect("an older sample"));
    }
    let mut decoded_ok = 0usize;

    // Random buffers, 0..4096 bytes; some start with a valid header prefix so the checks
    // after the magic are reached too.
    for i in 0..2000 {
        let len = rng.below(4096);
        let mut bytes = rng.bytes(len);
        if i % 2 == 0 && len >= 9 {
            bytes[..4].copy_from_slice(&MAGIC);
            bytes[4..6].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
            bytes[6..8].copy_from_slice(&SCHEMA_VERSION.to_be_bytes());
            bytes[8] = CODEC_POSTCARD;
        }
        check(&format!("random buffer #{i} ({len} bytes)"), &bytes, false);
    }

    for (s, sample) in encoded.iter().enumerate() {
        // The unmodified sample decodes, and the allocation tracking sees its allocations.
        let (result, largest) = decode_tracked(sample);
        assert!(result.is_ok(), "sample {s}: {result:?}");
        assert!(largest > 0, "the counting allocator tracks nothing");
        // Every strict prefix is an error (checked exhaustively: the samples are small), and
        // so is any extension.
        for cut in 0..sample.len() {
            check(&format!("sample {s} cut at {cut}"), &sample[..cut], false);
        }
        for extra in [1, 7, 4096] {
            let mut longer = sample.clone();
            longer.extend(rng.bytes(extra));
            check(&format!("sample {s} + {extra} bytes"), &longer, false);
        }
        // Multi-bit flips anywhere (header, checksum or payload): always detected.
        for i in 0..1000 {
            let mut flipped = sample.clone();
            let bits = 2 + rng.below(15);
            for _ in 0..bits {
                let bit = rng.below(flipped.len() * 8);
                flipped[bit / 8] ^= 1 << (bit % 8);
            }
            if flipped != *sample {
                check(
                    &format!("sample {s} flip #{i} ({bits} bits)"),
                    &flipped,
                    false,
                );
            }
        }
        // Payload mutations re-sealed with a correct checksum reach postcard: bit flips,
        // random bytes, and huge varints (lengths, counts) written over real fields.
        let payload = &sample[HEADER_LEN..];
        for i in 0..600 {
            let mut mutated = payload.to_vec();
            match i % 3 {
                0 => {
                    for _ in 0..1 + rng.below(4) {
                        let bit = rng.below(mutated.len() * 8);
                        mutated[bit / 8] ^= 1 << (bit % 8);
                    }
                }
                1 => {
                    let at = rng.below(mutated.len());
                    let n = (1 + rng.below(8)).min(mutated.len() - at);
                    let junk = rng.bytes(n);
                    mutated[at..at + n].copy_from_slice(&junk);
                }
                _ => {
                    // A varint of up to 2^63 (or 2^32-ish) where a length may be read.
                    let at = rng.below(mutated.len());
                    let huge: &[u8] = if rng.below(2) == 0 {
                        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]
                    } else {
                        &[0xff, 0xff, 0xff, 0xff, 0x0f]
                    };
                    let n = huge.len().min(mutated.len() - at);
                    mutated[at..at + n].copy_from_slice(&huge[..n]);
                }
            }
            let schema = u16::from_be_bytes([sample[6], sample[7]]);
            let sealed = seal_as(schema, &mutated);
            let (result, _) = decode_tracked(&sealed);
            decoded_ok += usize::from(result.is_ok());
            check(&format!("sample {s} resealed mutation #{i}"), &sealed, true);
        }
    }

    // Headers that declare huge lengths over little (or no) payload: refused from the header,
    // before anything of that size is allocated.
    for i in 0..1000 {
        let declared: u32 = match i % 4 {
            0 => u32::MAX,
            1 => u32::try_from(MAX_SNAPSHOT_BYTES).expect("fits") + 1 + rng.below(1 << 20) as u32,
            2 => u32::try_from(MAX_SNAPSHOT_BYTES).expect("fits") - rng.below(1 << 20) as u32,
            _ => rng.next() as u32,
        };
        let present = rng.below(4096);
        let payload = rng.bytes(present);
        let mut bytes = Vec::with_capacity(HEADER_LEN + present);
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        bytes.extend_from_slice(&SCHEMA_VERSION.to_be_bytes());
        bytes.push(CODEC_POSTCARD);
        bytes.extend_from_slice(&declared.to_be_bytes());
        bytes.extend_from_slice(&CRC32C.checksum(&payload).to_be_bytes());
        bytes.extend_from_slice(&payload);
        let case = format!("header #{i} declaring {declared} bytes over {present}");
        check(&case, &bytes, false);
        if declared as usize > MAX_SNAPSHOT_BYTES {
            assert_eq!(
                Snapshot::decode(&bytes),
                Err(SnapshotError::TooLarge(declared as usize)),
                "{case}"
            );
        } else if declared as usize != present {
            assert!(
                matches!(Snapshot::decode(&bytes), Err(SnapshotError::Truncated(_))),
                "{case}"
            );
        }
    }

    // Re-sealed mutations mostly break the payload; the few that decode are valid snapshots
    // (a flipped character in a string, say). Neither extreme would mean much.
    let mutations = 600 * encoded.len();
    assert!(
        decoded_ok < mutations,
        "{decoded_ok} of {mutations} mutations decoded"
    );
}
