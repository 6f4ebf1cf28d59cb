//! The layer's response body: the app's own, or the gate's answer (a refusal), holding what the
//! request keeps until its last frame has been sent (its concurrency places).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::gate::Settled;

/// What the layer's boxed errors are: any app body's error, as tower and hyper box them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A gate's answer: refusals and the `500` of a missing client address.
pub(super) type GateBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

pin_project_lite::pin_project! {
    /// The body of a response through [`super::RateLimit`]: the app's body `B`, or the gate's
    /// own answer; either way, what the request holds under its rule's concurrency limits is
    /// given back when the last frame has been sent, an error ends it, or the body is dropped
    /// (the client went away).
    pub struct LayerBody<B> {
        #[pin]
        kind: Kind<B>,
        settled: Settled,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProjection]
    enum Kind<B> {
        App { #[pin] body: B },
        Gate { body: GateBody },
    }
}

impl<B> LayerBody<B> {
    /// The app's `body`.
    pub(super) fn app(body: B) -> LayerBody<B> {
        LayerBody {
            kind: Kind::App { body },
            settled: Settled::none(),
        }
    }

    /// The same body, holding what the settled admission left (its places) until it ends.
    pub(super) fn holding(self, settled: Settled) -> LayerBody<B> {
        LayerBody { settled, ..self }
    }

    /// The gate's answer.
    pub(super) fn gate(body: GateBody) -> LayerBody<B> {
        LayerBody {
            kind: Kind::Gate { body },
            settled: Settled::none(),
        }
    }
}

impl<B> std::fmt::Debug for LayerBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::App { .. } => "app",
            Kind::Gate { .. } => "gate",
        };
        f.debug_struct("LayerBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B> Body for LayerBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let (polled, ended) = match this.kind.project() {
            KindProjection::App { mut body } => {
                let polled = body.as_mut().poll_frame(cx);
                let ended = match &polled {
                    Poll::Ready(None | Some(Err(_))) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    Poll::Pending => false,
                };
                (
                    polled.map(|frame| frame.map(|result| result.map_err(Into::into))),
                    ended,
                )
            }
            KindProjection::Gate { body } => {
                let polled = Pin::new(&mut *body).poll_frame(cx);
                let polled = polled.map(|frame| frame.map(|result| result.map_err(BoxError::from)));
                (polled, false)
            }
        };
        // The last frame (or an error: nothing more will be sent): the places go back.
        if ended {
            this.settled.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::App { body } => body.is_end_stream(),
            Kind::Gate { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::App { body } => body.size_hint(),
            Kind::Gate { body } => body.size_hint(),
        }
    }
}
