//! JSON answers written a batch at a time as the client reads them (allocation lists and
//! timelines), so that an answer's size never sits in the server's memory. The body is
//! assembled by hand around serde's rendering of each item because serde writes a value
//! whole: a prefix, the array's items batch by batch, a suffix.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use blazar_service::ServiceResult;

use crate::error::ApiResult;

/// A source of batches of array items.
pub trait Batches: Send + 'static {
    type Batch: Send + 'static;
    /// The next batch; `None` once all are read.
    fn next_batch(&mut self) -> impl Future<Output = ServiceResult<Option<Self::Batch>>> + Send;
    /// Appends the batch's items, each after a comma when an item precedes it (`written`);
    /// says whether an item has been written by now. The batch is dropped afterwards,
    /// with whatever it holds (a permit of the large reads).
    fn write_batch(&self, batch: Self::Batch, out: &mut Vec<u8>, written: bool) -> bool;
    /// What follows the array, closing the answer.
    fn suffix(&self) -> Vec<u8>;
}

/// Where the writer is.
enum Part<T> {
    /// The prefix and the first batch, read before the answer began.
    Head(Vec<u8>, Option<T>),
    /// Batches read as the client takes them; whether an item was written yet.
    Batches {
        written: bool,
    },
    Done,
}

/// An answer of `prefix`, the items of every batch of `source` and its suffix. Errors found
/// before the first byte (the first batch's read included) are ordinary error answers; a
/// read that fails later can only cut the answer short, which a client sees as a broken
/// body.
pub async fn stream_json<S: Batches>(prefix: Vec<u8>, mut source: S) -> ApiResult<Response> {
    let first = source.next_batch().await?;
    let stream = futures::stream::unfold(
        (source, Part::Head(prefix, first)),
        |(mut source, part)| async move {
            match part {
                Part::Head(mut out, first) => {
                    let written = match first {
                        Some(batch) => source.write_batch(batch, &mut out, false),
                        None => false,
                    };
                    Some((Ok(Bytes::from(out)), (source, Part::Batches { written })))
                }
                Part::Batches { written } => match source.next_batch().await {
                    Ok(Some(batch)) => {
                        let mut out = Vec::new();
                        let written = source.write_batch(batch, &mut out, written);
                        Some((Ok(Bytes::from(out)), (source, Part::Batches { written })))
                    }
                    Ok(None) => {
                        let out = source.suffix();
                        Some((Ok(Bytes::from(out)), (source, Part::Done)))
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "streamed answer cut short");
                        Some((
                            Err(std::io::Error::other(e.to_string())),
                            (source, Part::Done),
                        ))
                    }
                },
                Part::Done => None,
            }
        },
    );
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
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
