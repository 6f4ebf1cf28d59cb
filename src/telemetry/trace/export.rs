//! Spans out: a bounded queue between the requests that end spans and one task on the Tokio
//! runtime that sends them to the collector, a batch at a time.
//!
//! Ending a span never waits: the span goes into the queue if there is room
//! ([`QUEUE_CAPACITY`]) and is dropped and counted otherwise
//! (`tollgate_trace_spans_dropped_total{reason="queue_full"}`). The task takes whatever is
//! queued (up to [`MAX_BATCH`]) as soon as the last export is done, so a quiet gateway sends
//! each span at once and a busy one sends larger batches; a batch the collector does not take
//! (down, refusing, slower than the exporter's timeout) is dropped and counted
//! (`reason="export_failed"`), never retried into a queue that requests are filling. The
//! SDK's own batch processor is not used: it runs a thread of its own, blocks it on the
//! exporter (whose HTTP and gRPC clients need this runtime), and counts what it drops only
//! in a log line at shutdown.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};

use prometheus_client::metrics::counter::Counter;

use super::{OtlpProtocol, TraceSettings};
use crate::telemetry::throttle::LogThrottle;

/// The most spans waiting to be sent (the SDK's batch processor's default queue): about
/// 2 MB at most; past it, spans are dropped.
pub(crate) const QUEUE_CAPACITY: usize = 2048;

/// The most spans in one export (the SDK's default batch).
pub(crate) const MAX_BATCH: usize = 512;

/// What the export queue counts into (registered by the metrics); zero with traces off.
#[derive(Debug, Clone, Default)]
pub(crate) struct TraceCounters {
    /// `tollgate_trace_spans_exported_total`: spans the collector took.
    pub(crate) exported: Counter,
    /// `tollgate_trace_spans_dropped_total{reason="queue_full"}`: spans ended while the queue
    /// was full (the collector slower than the requests).
    pub(crate) dropped_queue_full: Counter,
    /// `tollgate_trace_spans_dropped_total{reason="export_failed"}`: spans of a batch the
    /// collector did not take (down, refusing, too slow).
    pub(crate) dropped_export_failed: Counter,
}

/// OTLP's exporter of `settings`, describing `resource`.
pub(super) fn exporter(
    settings: &TraceSettings,
    resource: &Resource,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match settings.protocol {
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .build(),
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(Protocol::Grpc)
            .with_endpoint(settings.endpoint.clone())
            .build(),
    };
    let mut exporter = built.map_err(|error| error.to_string())?;
    exporter.set_resource(resource);
    Ok(exporter)
}

/// The SDK's span processor: the queue's sending end.
#[derive(Debug)]
pub(super) struct ExportQueue {
    queue: mpsc::Sender<SpanData>,
    counters: TraceCounters,
}

/// The queue's task, and how to stop it.
pub(super) struct ExportTask {
    /// Tells the task to send what is queued and end.
    stop: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ExportQueue {
    /// The processor, and the task (on the current runtime) that sends what it queues
    /// through `exporter`.
    pub(super) fn spawn(
        exporter: opentelemetry_otlp::SpanExporter,
        counters: TraceCounters,
    ) -> (ExportQueue, ExportTask) {
        let (queue, spans) = mpsc::channel(QUEUE_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(send(spans, stopped, exporter, counters.clone()));
        (
            ExportQueue { queue, counters },
            ExportTask {
                stop: std::sync::Mutex::new(Some(stop)),
                task: std::sync::Mutex::new(Some(task)),
            },
        )
    }
}

impl ExportTask {
    /// Stop the task once it has sent what is queued, waiting for it up to `timeout`.
    pub(super) async fn finish(&self, timeout: Duration) {
        let stop = self.stop.lock().ok().and_then(|mut stop| stop.take());
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
        let task = self.task.lock().ok().and_then(|mut task| task.take());
        if let Some(task) = task
            && tokio::time::timeout(timeout, task).await.is_err()
        {
            tracing::warn!(?timeout, "traces: the last spans were not sent in time");
        }
    }
}

impl Drop for ExportTask {
    fn drop(&mut self) {
        if let Ok(mut task) = self.task.lock()
            && let Some(task) = task.take()
        {
            task.abort();
        }
    }
}

impl SpanProcessor for ExportQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.counters.dropped_queue_full.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The task: take what is queued, send it, again; on `stop`, send what is left and end.
async fn send(
    mut spans: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
    exporter: opentelemetry_otlp::SpanExporter,
    counters: TraceCounters,
) {
    let failures = LogThrottle::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let received = tokio::select! {
            received = spans.recv_many(&mut batch, MAX_BATCH) => received,
            _ = &mut stop => {
                spans.close();
                while spans.recv_many(&mut batch, MAX_BATCH).await > 0 {
                    export(&exporter, &mut batch, &counters, &failures).await;
                }
                return;
            }
        };
        if received == 0 {
            return;
        }
        export(&exporter, &mut batch, &counters, &failures).await;
    }
}

/// Send `batch` (emptied), counting what went and what was dropped.
async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: &mut Vec<SpanData>,
    counters: &TraceCounters,
    failures: &LogThrottle,
) {
    let count = batch.len() as u64;
    let spans = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
    match exporter.export(spans).await {
        Ok(()) => {
            counters.exported.inc_by(count);
        }
        Err(error) => {
            counters.dropped_export_failed.inc_by(count);
            if let Some(suppressed) = failures.admit() {
                tracing::warn!(
                    %error,
                    spans = count,
                    suppressed,
                    "traces: the collector did not take a batch of spans; dropped"
                );
            }
        }
    }
}
