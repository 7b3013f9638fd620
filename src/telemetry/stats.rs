//! Engine timings as metrics. The engine knows nothing of metrics: it tells a
//! [`CheckpointObserver`] of every checkpoint write as it ends (mode, size, time), and makes a
//! span per full read of the stop flags (`watcher_tick`), which this module's layer times as
//! it closes. The instruments are the process's meters' ([`super::meters`]), which `/metrics`
//! renders and the OTLP metrics export sends.

use std::any::TypeId;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use runvisor_actors::CheckpointObserver;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::meters::meters;

/// The stop watcher's full read span's name.
const WATCHER_TICK: &str = "watcher_tick";

/// The engine's timings of this process.
#[derive(Debug)]
pub(crate) struct EngineStats {
    checkpoint_bytes: Histogram<f64>,
    checkpoint_seconds: Histogram<f64>,
    watcher_tick: Histogram<f64>,
    /// The `mode` attribute of each mode, made once.
    modes: [[KeyValue; 1]; 3],
}

/// `n` bounds from `first`, each `factor` times the one before.
pub(crate) fn exponential(first: f64, factor: f64, n: usize) -> Vec<f64> {
    std::iter::successors(Some(first), |b| Some(b * factor))
        .take(n)
        .collect()
}

/// 100 µs to about 6.5 s.
fn seconds() -> Vec<f64> {
    exponential(0.0001, 2.0, 17)
}

/// 256 B to 64 MiB.
fn bytes() -> Vec<f64> {
    exponential(256.0, 4.0, 10)
}

/// The modes checkpoints are written in.
const MODES: [&str; 3] = ["sync", "async", "final"];

/// This process's engine timings (one set, however many layers record into it).
pub(crate) fn engine_stats() -> &'static EngineStats {
    static STATS: OnceLock<EngineStats> = OnceLock::new();
    STATS.get_or_init(|| {
        let meters = meters();
        let stats = EngineStats {
            checkpoint_bytes: meters.histogram(
                "runvisor_checkpoint_bytes",
                "Size of the checkpoints written, by mode (sync, async, final)",
                "By",
                bytes(),
                &["mode"],
            ),
            checkpoint_seconds: meters.histogram(
                "runvisor_checkpoint_write_seconds",
                "Time to write a checkpoint (its retries included), by mode",
                "s",
                seconds(),
                &["mode"],
            ),
            watcher_tick: meters.histogram(
                "runvisor_watcher_tick_seconds",
                "Time of the stop watcher's read of every watched flag, per tick",
                "s",
                seconds(),
                &[],
            ),
            modes: MODES.map(|mode| [KeyValue::new("mode", mode)]),
        };
        meters.preset("runvisor_watcher_tick_seconds", &[]);
        for mode in MODES {
            meters.preset("runvisor_checkpoint_bytes", &[mode]);
            meters.preset("runvisor_checkpoint_write_seconds", &[mode]);
        }
        meters.counter_reading(
            "runvisor_spans_dropped",
            "Spans not exported: queue full, or the collector did not take them",
            super::dropped_spans_total,
        );
        stats
    })
}

/// When a timed span began.
struct Timed(Instant);

/// Checkpoint writes into [`engine_stats`], as the engine tells of them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CheckpointMetrics;

impl CheckpointObserver for CheckpointMetrics {
    fn written(&self, mode: &'static str, bytes: usize, took: Duration, _stored: bool) {
        let stats = engine_stats();
        let i = MODES.iter().position(|m| *m == mode).unwrap_or(0);
        let mode = &stats.modes[i];
        stats.checkpoint_seconds.record(took.as_secs_f64(), mode);
        #[allow(clippy::cast_precision_loss)]
        stats.checkpoint_bytes.record(bytes as f64, mode);
    }
}

/// Times the engine's watcher spans into [`engine_stats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StatsLayer;

fn timed(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("runvisor_actors") && meta.name() == WATCHER_TICK
}

impl<S> Layer<S> for StatsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // Unfiltered behind a global filter, it sees every span that filter admits.
        if let Some(span) = ctx.span(id)
            && timed(span.metadata())
        {
            span.extensions_mut().insert(Timed(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(Timed(started)) = span.extensions_mut().remove::<Timed>() else {
            return;
        };
        if span.name() == WATCHER_TICK {
            engine_stats()
                .watcher_tick
                .record(started.elapsed().as_secs_f64(), &[]);
        }
    }
}

/// The process's one filter: `RUST_LOG`'s, the spans [`StatsLayer`] times whatever it says,
/// and, when spans are exported, the engine's and this crate's spans and events at `info` and
/// up ([`exported`]). A global filter rather than one per layer: with per-layer filters every
/// span a run makes costs bookkeeping on every entry and exit (about a third of a trivial
/// node's time) even when no layer wants it; a global filter leaves unwanted callsites
/// disabled once and for all, and the layers behind it see what they want of it ([`Judged`]).
#[derive(Debug)]
pub(crate) struct Admit {
    env: EnvFilter,
    exporting: bool,
}

impl Admit {
    pub(crate) fn new(env: EnvFilter, exporting: bool) -> Self {
        Self { env, exporting }
    }

    fn always(&self, meta: &Metadata<'_>) -> bool {
        timed(meta) || (self.exporting && exported(meta))
    }
}

/// What the OpenTelemetry layer exports: the spans and events of the engine and this crate,
/// `info` and up.
pub(crate) fn exported(meta: &Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::INFO && meta.target().starts_with("runvisor")
}

impl<S> Layer<S> for Admit
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.always(meta) {
            Interest::always()
        } else {
            Layer::<S>::register_callsite(&self.env, meta)
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, cx: Context<'_, S>) -> bool {
        self.always(meta) || Layer::<S>::enabled(&self.env, meta, cx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // The timed spans are made at debug level.
        Layer::<S>::max_level_hint(&self.env).map(|level| level.max(LevelFilter::DEBUG))
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        self.env.on_new_span(attrs, id, cx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        self.env.on_record(id, values, cx);
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        self.env.on_enter(id, cx);
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        self.env.on_exit(id, cx);
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        self.env.on_close(id, cx);
    }
}

/// What a layer behind [`Admit`] wants to see of what the global filter admits.
pub(crate) trait Judge<S> {
    /// Whether the layer sees this span or event.
    fn admits(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool;
}

/// What `RUST_LOG` admits, for the events layer: the events it formats, and the fields of the
/// spans those events show. `RUST_LOG`'s span-field directives are not applied here.
#[derive(Debug)]
pub(crate) struct Logged(pub(crate) EnvFilter);

impl<S> Judge<S> for Logged
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn admits(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        Layer::<S>::enabled(&self.0, meta, cx.clone())
    }
}

/// What is exported ([`exported`]), for the OpenTelemetry layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exported;

impl<S> Judge<S> for Exported {
    fn admits(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        exported(meta)
    }
}

/// A layer behind [`Admit`], seeing the spans and events its [`Judge`] admits, nothing of what
/// only another layer wanted: neither their creation, their fields nor their events. Entering,
/// leaving and closing a span it did not see is nothing to it, and is passed on as is.
#[derive(Debug)]
pub(crate) struct Judged<L, J> {
    inner: L,
    judge: J,
}

impl<L, J> Judged<L, J> {
    pub(crate) fn new(inner: L, judge: J) -> Self {
        Self { inner, judge }
    }
}

impl<S, L, J> Layer<S> for Judged<L, J>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
    J: Judge<S> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        if self.judge.admits(attrs.metadata(), &cx) {
            self.inner.on_new_span(attrs, id, cx);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        if cx
            .metadata(id)
            .is_some_and(|meta| self.judge.admits(meta, &cx))
        {
            self.inner.on_record(id, values, cx);
        }
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, cx: Context<'_, S>) {
        self.inner.on_follows_from(span, follows, cx);
    }

    fn on_event(&self, event: &tracing::Event<'_>, cx: Context<'_, S>) {
        if self.judge.admits(event.metadata(), &cx) {
            self.inner.on_event(event, cx);
        }
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        self.inner.on_enter(id, cx);
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        self.inner.on_exit(id, cx);
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        self.inner.on_close(id, cx);
    }

    fn on_id_change(&self, old: &Id, new: &Id, cx: Context<'_, S>) {
        self.inner.on_id_change(old, new, cx);
    }

    // The inner layer is found through this one (`tracing-opentelemetry` reads a span's
    // context by downcasting the subscriber).
    #[allow(unsafe_code)]
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            Some(std::ptr::from_ref(self).cast())
        } else {
            // SAFETY: forwarded as asked; the inner layer answers for its own types, and it
            // lives as long as this one.
            unsafe { self.inner.downcast_raw(id) }
        }
    }
}
