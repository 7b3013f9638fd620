//! What the runtime asks of the tracing backend the host installed, which it knows nothing
//! of: the engine makes `tracing` spans (a run, its nodes, iterations, items, stops,
//! checkpoint writes, resumes); a host that exports them (OpenTelemetry) tells the engine how
//! to name a span's place in its trace, so that the run record can keep it, and how to link a
//! span to a trace named so, so that a resumed run points back to the run it continues.

/// A tracing backend's view of spans, as a W3C `traceparent` string
/// (`00-<trace id>-<span id>-<flags>`). Set with
/// [`RuntimeBuilder::trace_context`](crate::RuntimeBuilder::trace_context).
pub trait TraceContext: Send + Sync + 'static {
    /// The `traceparent` naming `span`, when the backend records it.
    fn traceparent(&self, span: &tracing::Span) -> Option<String>;

    /// Links `span` to the span `traceparent` names (a resumed run's to the run it
    /// continues). A `traceparent` the backend cannot read is ignored.
    fn link(&self, span: &tracing::Span, traceparent: &str);
}

/// The longest `traceparent` a run record keeps (version `00` has 55 characters; later
/// versions may add fields).
pub(crate) const MAX_TRACEPARENT: usize = 256;
