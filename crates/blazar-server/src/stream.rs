//! JSON answers written a batch at a time as the client reads them (allocation lists and
//! timelines), so that an answer's size never sits in the server's memory. The body is
//! assembled by hand around serde's rendering of each item because serde writes a value
//! whole: a prefix, the array's items batch by batch, a suffix.

use std::collections::VecDeque;
use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use blazar_service::ServiceResult;

use crate::error::ApiResult;
use crate::listener::{AnswerAccount, Charge, too_many_answers};

/// The size a frame of a streamed answer is made up to from small pieces. A frame waits in
/// the connection until the client takes it, so this is what each slow reader costs beyond
/// its batch; 64 KiB keeps the writes large.
const FRAME: usize = 64 * 1024;

/// A source of batches of array items.
pub trait Batches: Send + 'static {
    type Batch: Send + 'static;
    /// The next batch; `None` once all are read.
    fn next_batch(&mut self) -> impl Future<Output = ServiceResult<Option<Self::Batch>>> + Send;
    /// Appends the batch's items, each after a comma when an item precedes it (`written`);
    /// says whether an item has been written by now. The batch is dropped afterwards,
    /// with whatever it holds (a permit of the large reads).
    fn write_batch(&self, batch: Self::Batch, out: &mut Pieces, written: bool) -> bool;
    /// What follows the array, closing the answer.
    fn suffix(&self) -> Vec<u8>;
}

/// What a batch renders to, in order: bytes written here, and renderings kept elsewhere
/// (the lease cache) that are sent from where they are instead of being copied first.
#[derive(Default)]
pub struct Pieces {
    ready: VecDeque<Bytes>,
    /// Bytes in `ready`.
    ready_len: usize,
    open: Vec<u8>,
}

impl Pieces {
    /// The buffer that bytes written now go to.
    pub fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.open
    }

    /// A rendering shared with its keeper, sent as it is.
    pub fn shared(&mut self, piece: Bytes) {
        self.close();
        self.ready_len += piece.len();
        self.ready.push_back(piece);
    }

    fn close(&mut self) {
        if !self.open.is_empty() {
            self.ready_len += self.open.len();
            self.ready
                .push_back(Bytes::from(std::mem::take(&mut self.open)));
        }
    }

    /// Bytes made and not yet handed on. Shared renderings count too: while they wait here,
    /// their keeper may have dropped its own copy.
    fn len(&self) -> usize {
        self.ready_len + self.open.len()
    }

    /// The next frame: a frame's size of the next piece when it has that much (the rest
    /// stays here, counted, rather than waiting uncounted further on), otherwise the next
    /// pieces copied together up to a frame's size; `None` once all are sent.
    fn next_frame(&mut self) -> Option<Bytes> {
        self.close();
        let mut first = self.ready.pop_front()?;
        if first.len() > FRAME {
            let frame = first.split_to(FRAME);
            self.ready.push_front(first);
            self.ready_len -= frame.len();
            return Some(frame);
        }
        self.ready_len -= first.len();
        if first.len() == FRAME {
            return Some(first);
        }
        let mut frame = Vec::with_capacity(FRAME);
        frame.extend_from_slice(&first);
        while let Some(next) = self.ready.front() {
            if frame.len() + next.len() > FRAME {
                break;
            }
            frame.extend_from_slice(next);
            self.ready_len -= next.len();
            self.ready.pop_front();
        }
        Some(Bytes::from(frame))
    }
}

/// Where the writer is.
struct Writer<S> {
    source: S,
    pending: Pieces,
    /// Whether an item was written yet.
    written: bool,
    /// The source is read to its end (or failed) and the suffix is pending.
    drained: bool,
    /// `pending`'s bytes, counted in the client's share of the answers' budget.
    charge: Option<Charge>,
}

impl<S> Writer<S> {
    fn count_pending(&mut self) {
        if let Some(charge) = &mut self.charge {
            charge.set(self.pending.len());
        }
    }
}

/// An answer of `prefix`, the items of every batch of `source` and its suffix. Errors found
/// before the first byte (the first batch's read included) are ordinary error answers; a
/// read that fails later can only cut the answer short, which a client sees as a broken
/// body. A batch is read only once the frames of the one before are taken by the client.
///
/// What a batch renders to waits in memory until the client takes it, so it is counted in
/// the client's share of the answers' budget (see [`crate::listener`]): a client that asks
/// for many such answers and reads none is refused (503) once its share is used, instead
/// of holding a batch per answer without bound.
pub async fn stream_json<S: Batches>(prefix: Vec<u8>, mut source: S) -> ApiResult<Response> {
    let account = AnswerAccount::current();
    let first = source.next_batch().await?;
    // Looked at once the first batch is read: reads take turns (the large reads' permits),
    // so the answers that went before have counted what they made by now.
    if account.as_ref().is_some_and(|a| !a.has_room()) {
        return Ok(too_many_answers());
    }
    let mut pending = Pieces::default();
    pending.bytes().extend_from_slice(&prefix);
    let written = match first {
        Some(batch) => source.write_batch(batch, &mut pending, false),
        None => false,
    };
    let mut writer = Writer {
        source,
        pending,
        written,
        drained: false,
        charge: account.map(|a| a.charge()),
    };
    writer.count_pending();
    let stream = futures::stream::unfold(writer, |mut writer| async move {
        loop {
            if let Some(frame) = writer.pending.next_frame() {
                writer.count_pending();
                return Some((Ok(frame), writer));
            }
            if writer.drained {
                return None;
            }
            match writer.source.next_batch().await {
                Ok(Some(batch)) => {
                    writer.written =
                        writer
                            .source
                            .write_batch(batch, &mut writer.pending, writer.written);
                    writer.count_pending();
                }
                Ok(None) => {
                    let suffix = writer.source.suffix();
                    writer.pending.bytes().extend_from_slice(&suffix);
                    writer.drained = true;
                }
                Err(e) => {
                    tracing::error!(error = %e, "streamed answer cut short");
                    writer.drained = true;
                    writer.pending = Pieces::default();
                    return Some((Err(std::io::Error::other(e.to_string())), writer));
                }
            }
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// A list read a page at a time by place (the outbox, hand-overs): each page goes on after
/// the place of the last item of the page before, so no page reads what came before it.
pub trait Pages: Send + 'static {
    type Place: Send + 'static;
    type Item: Send + 'static;
    type Wire: serde::Serialize;
    /// Items per page.
    const PAGE: usize;
    /// Up to `limit` items after `after`, each with its place.
    fn page(
        &self,
        after: Option<&Self::Place>,
        limit: usize,
    ) -> impl Future<Output = ServiceResult<Vec<(Self::Place, Self::Item)>>> + Send;
    /// An item as the answer shows it.
    fn wire(item: Self::Item) -> Self::Wire;
}

/// `{"<key>": [...]}` of every item of `pages`, read and written a page at a time.
pub async fn stream_pages<P: Pages>(key: &str, pages: P) -> ApiResult<Response> {
    let source = ByPlace {
        pages,
        after: None,
        done: false,
    };
    stream_json(format!("{{\"{key}\":[").into_bytes(), source).await
}

struct ByPlace<P: Pages> {
    pages: P,
    after: Option<P::Place>,
    done: bool,
}

impl<P: Pages> Batches for ByPlace<P> {
    type Batch = Vec<P::Item>;

    async fn next_batch(&mut self) -> ServiceResult<Option<Self::Batch>> {
        if self.done {
            return Ok(None);
        }
        let page = self.pages.page(self.after.as_ref(), P::PAGE).await?;
        self.done = page.len() < P::PAGE;
        let mut items = Vec::with_capacity(page.len());
        for (place, item) in page {
            self.after = Some(place);
            items.push(item);
        }
        Ok(Some(items))
    }

    fn write_batch(&self, batch: Self::Batch, out: &mut Pieces, mut written: bool) -> bool {
        for item in batch {
            written = push_item(out.bytes(), &P::wire(item), b",", written);
        }
        written
    }

    fn suffix(&self) -> Vec<u8> {
        b"]}".to_vec()
    }
}

/// Appends `item` as an array item after `separator` when one precedes it (`written`);
/// says whether an item has been written by now.
pub fn push_item<T: serde::Serialize>(
    out: &mut Vec<u8>,
    item: &T,
    separator: &[u8],
    written: bool,
) -> bool {
    match serde_json::to_vec(item) {
        Ok(bytes) => {
            if written {
                out.extend_from_slice(separator);
            }
            out.extend_from_slice(&bytes);
            true
        }
        // Strings and numbers always serialise; should one not, the answer stays valid.
        Err(e) => {
            tracing::error!(error = %e, "item left out of a streamed answer");
            written
        }
    }
}

/// `value` as JSON (a string, or null).
pub fn json_value<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec())
}
