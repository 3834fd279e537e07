//! The HTTP connection loop: accepts connections, bounds how many are open and how long one
//! may hold a slot without a request in progress, and shuts down gracefully.
//!
//! axum's own `serve` keeps every connection until its client closes it, so idle and
//! "slowloris" connections (a request line, then a header byte now and then) pile up until
//! the process runs out of file descriptors and nobody is served. Hyper's header-read
//! timeout alone does not separate a slow first request from an idle keep-alive, and nothing
//! in axum or hyper bounds the number of connections, so this loop keeps a registry:
//!
//! * a connection that has not completed its first request within `header_read_timeout`,
//!   or has been idle between requests for `idle_timeout`, is closed by a sweeper;
//! * at `max_connections`, a new connection takes the slot of the connection that has waited
//!   longest without a request in progress (idle or slow), so that clients holding many
//!   useless connections cannot lock others out; if every connection is busy serving a
//!   request, the new one is closed at once;
//! * accept errors (out of file descriptors) pause the loop briefly instead of spinning.
//!
//! Request bodies are read here, before the application sees the request, because a slow
//! upload is slowloris after the headers: hyper and axum would hold the connection (and the
//! bytes received so far) for as long as the client trickles. So a body must arrive whole
//! within `body_read_timeout` (else 408), may not exceed the application's limit (else 413),
//! and all bodies being received share one byte budget (else 503); a connection whose only
//! requests are still uploading counts as waiting, so the connection bound can take its slot.
//! HTTP/2 clients get a small stream limit for the same reason.
//!
//! Answers are bounded the same way on their way out: a client may ask on many HTTP/2
//! streams and never read, and every unread answer stays in memory. So an answer counts
//! against a second byte budget (the process's and the client address's share) from when it
//! is made until it has been sent, handed to HTTP/2 in pieces so that it is not counted as
//! sent while it waits in a send buffer; a client at its share is answered 503 until it reads.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tower::{Service, ServiceExt};

/// How the server treats its clients' connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest a new connection may take to send its first request's headers.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open between requests (keep-alive).
    pub idle_timeout: Duration,
    /// Longest one request may take once its body has arrived (then 408).
    pub request_timeout: Duration,
    /// Longest a request's body may take to arrive once its headers have (then 408).
    pub body_read_timeout: Duration,
    /// Bytes of request bodies held at once across every connection (then 503).
    pub body_bytes_in_flight: usize,
    /// Of those, the most one client address may hold (then 503): a few clients cannot
    /// take the whole budget from the others.
    pub body_bytes_per_peer: usize,
    /// Bytes of answers held at once, from when one is made until it has been sent (then
    /// 503): an HTTP/2 client may ask on many streams and never read, and each unread
    /// answer stays in memory.
    pub response_bytes_in_flight: usize,
    /// Of those, the most one client address may hold (then 503).
    pub response_bytes_per_peer: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(300),
            body_read_timeout: Duration::from_secs(30),
            body_bytes_in_flight: BODY_BYTES_IN_FLIGHT,
            body_bytes_per_peer: BODY_BYTES_IN_FLIGHT / 8,
            response_bytes_in_flight: RESPONSE_BYTES_IN_FLIGHT,
            response_bytes_per_peer: RESPONSE_BYTES_IN_FLIGHT / 2,
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit, so that the connection
/// bound, not the default soft limit (often 1,024), is what stops new connections. Answers
/// the limit in force.
pub fn raise_open_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

struct Tracked {
    accepted: Instant,
    /// When the last response was sent; `None` before the first.
    last_done: Option<Instant>,
    /// Requests in progress (uploading ones included).
    busy: usize,
    /// Requests in progress whose body is still arriving.
    uploading: usize,
    /// Since when `uploading` has been above zero.
    uploading_since: Option<Instant>,
    close: Arc<Notify>,
}

impl Tracked {
    /// Since when the connection has been waiting for a request, if it is.
    fn waiting_since(&self) -> Option<Instant> {
        (self.busy == 0).then(|| self.last_done.unwrap_or(self.accepted))
    }

    /// Since when the connection has been of no use to anyone but its client: waiting for a
    /// request, or only receiving bodies (which have their own deadline). Such a connection
    /// may give its slot up at the bound.
    fn evictable_since(&self) -> Option<Instant> {
        self.waiting_since().or_else(|| {
            (self.busy == self.uploading)
                .then_some(self.uploading_since)
                .flatten()
        })
    }
}

#[derive(Default)]
struct Registry {
    connections: Mutex<HashMap<u64, Tracked>>,
    next_id: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Tracked>> {
        // A panic while holding this lock leaves plain bookkeeping behind; keep serving.
        self.connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a new connection, making room if needed. `None` when every slot is busy.
    fn admit(&self, max: usize) -> Option<(u64, Arc<Notify>)> {
        let mut connections = self.lock();
        if connections.len() >= max {
            let oldest = connections
                .iter()
                .filter_map(|(id, c)| c.evictable_since().map(|t| (t, *id)))
                .min();
            let (_, victim) = oldest?;
            if let Some(c) = connections.remove(&victim) {
                c.close.notify_one();
            }
            tracing::debug!(
                connection.id = victim,
                "connection bound reached: closed the longest-waiting connection"
            );
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        connections.insert(
            id,
            Tracked {
                accepted: Instant::now(),
                last_done: None,
                busy: 0,
                uploading: 0,
                uploading_since: None,
                close: close.clone(),
            },
        );
        Some((id, close))
    }

    fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// A request's headers arrived; its body is yet to come when `uploading`.
    fn request_started(&self, id: u64, uploading: bool) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.busy += 1;
            if uploading {
                c.uploading += 1;
                if c.uploading == 1 {
                    c.uploading_since = Some(Instant::now());
                }
            }
        }
    }

    /// A request's body has arrived (or its reading ended).
    fn body_received(&self, id: u64) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.uploading = c.uploading.saturating_sub(1);
            if c.uploading == 0 {
                c.uploading_since = None;
            }
        }
    }

    fn request_done(&self, id: u64) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.busy = c.busy.saturating_sub(1);
            c.last_done = Some(Instant::now());
        }
    }

    /// Closes the connections that waited too long for a request.
    fn sweep(&self, limits: &ConnectionLimits) {
        let now = Instant::now();
        let mut connections = self.lock();
        connections.retain(|_, c| {
            let Some(since) = c.waiting_since() else {
                return true;
            };
            let limit = if c.last_done.is_none() {
                limits.header_read_timeout
            } else {
                limits.idle_timeout
            };
            if now.duration_since(since) >= limit {
                c.close.notify_one();
                false
            } else {
                true
            }
        });
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Marks a request finished however its future ends (completed or dropped).
struct InFlight {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.registry.request_done(self.id);
    }
}

/// Marks a request's body received however its reading ends.
struct Uploading {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Uploading {
    fn drop(&mut self) {
        self.registry.body_received(self.id);
    }
}

/// Bytes of request bodies held at once by default, across every connection, while they
/// arrive and until their request has been answered. Real requests are a few kilobytes;
/// without a bound, thousands of connections each uploading the largest body allowed would
/// hold gigabytes.
const BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// Bytes of answers held at once by default until they are sent. The largest answers
/// (a year's timeline of many hosts) are about a megabyte; unread ones were only bounded by
/// the number of streams, a gigabyte for a hundred HTTP/2 connections.
const RESPONSE_BYTES_IN_FLIGHT: usize = 128 * 1024 * 1024;

/// What a streamed answer (a list written as it is read, an event stream) is counted as
/// holding: HTTP/2's send buffer of one stream, set to this size, not the whole answer.
const STREAMED_RESPONSE_BYTES: usize = 64 * 1024;

/// Largest request line and headers one HTTP/1 connection may send (then 431, or 414 for
/// the line): the longest URI hyper takes (64 KiB, a timeline's property query) and 16 KiB
/// of headers, HTTP/2's header limit. Hyper's default, about 400 kB, let every connection
/// at the connection bound hold that much while its headers never ended.
const MAX_HTTP1_HEAD_BYTES: usize = 80 * 1024;

/// Streams one HTTP/2 connection may have open at once (hyper's default is 200): each can
/// hold a body upload, so a few connections could otherwise hold the byte budget.
const MAX_HTTP2_STREAMS: u32 = 16;

/// Bytes held at once (of request bodies, or of answers not sent yet): a total for the
/// process and a share of it per client address. A request body is counted as allocated
/// (the buffer's capacity), so a body sent in tiny chunks costs what it holds.
struct ByteBudget {
    total: usize,
    per_peer: usize,
    held: Mutex<(usize, HashMap<std::net::IpAddr, usize>)>,
}

impl ByteBudget {
    fn new(total: usize, per_peer: usize) -> ByteBudget {
        ByteBudget {
            total,
            per_peer: per_peer.min(total),
            held: Mutex::new((0, HashMap::new())),
        }
    }

    /// Whether `peer` may hold anything more now (the total and its share are not used up).
    fn has_room(&self, peer: std::net::IpAddr) -> bool {
        let held = self.lock();
        let (total, by_peer) = &*held;
        *total < self.total && by_peer.get(&peer).copied().unwrap_or(0) < self.per_peer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, HashMap<std::net::IpAddr, usize>)> {
        // Plain counters: a panic while holding the lock leaves nothing half-done.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `bytes` for `peer` if both the total and the peer's share allow it.
    fn take(&self, peer: std::net::IpAddr, bytes: usize) -> bool {
        let mut held = self.lock();
        let (total, by_peer) = &mut *held;
        let mine = by_peer.get(&peer).copied().unwrap_or(0);
        if *total + bytes > self.total || mine + bytes > self.per_peer {
            return false;
        }
        *total += bytes;
        by_peer.insert(peer, mine + bytes);
        true
    }

    /// Takes `bytes` for `peer` whatever is left: for what is already in memory.
    fn take_anyway(&self, peer: std::net::IpAddr, bytes: usize) {
        let mut held = self.lock();
        let (total, by_peer) = &mut *held;
        *total += bytes;
        *by_peer.entry(peer).or_insert(0) += bytes;
    }

    fn give_back(&self, peer: std::net::IpAddr, bytes: usize) {
        let mut held = self.lock();
        let (total, by_peer) = &mut *held;
        *total = total.saturating_sub(bytes);
        if let Some(mine) = by_peer.get_mut(&peer) {
            *mine = mine.saturating_sub(bytes);
            if *mine == 0 {
                by_peer.remove(&peer);
            }
        }
    }
}

/// What one request's body (or answer) holds of its budget, given back when it is dropped.
struct Held {
    budget: Arc<ByteBudget>,
    peer: std::net::IpAddr,
    bytes: usize,
}

impl Held {
    fn grow(&mut self, bytes: usize) -> bool {
        let taken = self.budget.take(self.peer, bytes);
        if taken {
            self.bytes += bytes;
        }
        taken
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.peer, self.bytes);
    }
}

tokio::task_local! {
    /// The answers' budget of the client whose request the current task is answering, for
    /// answers written as the client reads them ([`crate::stream`]): what such an answer
    /// has made and not yet handed on is counted while it waits for the client.
    static ANSWER_ACCOUNT: AnswerAccount;
}

/// A client's place in the answers' budget.
#[derive(Clone)]
pub(crate) struct AnswerAccount {
    budget: Arc<ByteBudget>,
    peer: std::net::IpAddr,
}

impl AnswerAccount {
    /// The account of the request being answered in this task; `None` outside the
    /// listener (tests that call the router directly).
    pub(crate) fn current() -> Option<AnswerAccount> {
        ANSWER_ACCOUNT.try_with(Clone::clone).ok()
    }

    /// Whether the client may be given more now.
    pub(crate) fn has_room(&self) -> bool {
        self.budget.has_room(self.peer)
    }

    /// A count of bytes an answer holds, at zero; given back when dropped.
    pub(crate) fn charge(&self) -> Charge {
        Charge {
            account: self.clone(),
            bytes: 0,
        }
    }
}

/// Bytes an answer holds in memory, counted in its client's share of the budget. They are
/// counted even past the share: they are already made. What keeps the total bounded is
/// that a client at its share gets no new answer (503), and each answer holds little at a
/// time.
pub(crate) struct Charge {
    account: AnswerAccount,
    bytes: usize,
}

impl Charge {
    /// The answer now holds `bytes`.
    pub(crate) fn set(&mut self, bytes: usize) {
        let AnswerAccount { budget, peer } = &self.account;
        if bytes > self.bytes {
            budget.take_anyway(*peer, bytes - self.bytes);
        } else {
            budget.give_back(*peer, self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.set(0);
    }
}

pub(crate) fn too_many_answers() -> Response {
    tracing::warn!("answers not yet sent reached their byte bound");
    let mut response = error_response(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "The server holds too many answers that have not been read yet; read them or retry \
         shortly",
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    response
}

/// Counts `response` against the answers' budget until it has been sent: its length when
/// it is known, a stream's send buffer otherwise. Answers it, or a 503 (the answer made is
/// dropped at once) when the budget has no room for it.
fn hold_answer(
    response: Response,
    budget: &Arc<ByteBudget>,
    peer: std::net::IpAddr,
) -> (Response, Option<Held>) {
    let bytes = hyper::body::Body::size_hint(response.body())
        .exact()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(STREAMED_RESPONSE_BYTES);
    let mut held = Held {
        budget: budget.clone(),
        peer,
        bytes: 0,
    };
    if held.grow(bytes) {
        (response, Some(held))
    } else {
        (too_many_answers(), None)
    }
}

fn too_many_bodies() -> Response {
    tracing::warn!("request bodies in flight reached their byte bound");
    let mut response = error_response(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "The server is receiving too many request bodies; retry shortly",
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    response
}

/// Reads `body` whole, under the deadline, the size limit and the byte budget. Answers the
/// bytes and the share of the budget they hold, or the response to send instead.
async fn read_body(
    body: Incoming,
    limits: &ConnectionLimits,
    budget: &Arc<ByteBudget>,
    peer: std::net::IpAddr,
) -> Result<(hyper::body::Bytes, Held), Response> {
    use http_body_util::BodyExt;
    let max = crate::app::MAX_BODY_BYTES;
    let too_large = || {
        error_response(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            &format!("The request body is larger than {max} bytes"),
        )
    };
    // A declared length over the limit is refused before anything is read (a client that
    // asked `Expect: 100-continue` is not told to go ahead).
    let hint = hyper::body::Body::size_hint(&body);
    if usize::try_from(hint.lower()).map_or(true, |n| n > max) {
        return Err(too_large());
    }
    let mut held = Held {
        budget: budget.clone(),
        peer,
        bytes: 0,
    };
    let read = async {
        let mut body = body;
        // Grown as bytes arrive, not from the declared length: headers alone hold nothing.
        let mut bytes = Vec::new();
        let declared = hint
            .exact()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(max);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                tracing::debug!(error = %e, "a request body could not be read");
                error_response(
                    axum::http::StatusCode::BAD_REQUEST,
                    "The request body could not be read",
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers: nothing the API reads
            };
            let needed = bytes.len() + data.len();
            if needed > max {
                return Err(too_large());
            }
            if needed > bytes.capacity() {
                // Grown by doubling, as Vec would, up to the declared length, and counted
                // before it is allocated.
                let grown = (bytes.capacity() * 2).min(max).min(declared).max(needed);
                if !held.grow(grown - bytes.capacity()) {
                    return Err(too_many_bodies());
                }
                bytes.reserve_exact(grown - bytes.len());
            }
            bytes.extend_from_slice(&data);
        }
        Ok(hyper::body::Bytes::from(bytes))
    };
    match tokio::time::timeout(limits.body_read_timeout, read).await {
        Ok(read) => read.map(|bytes| (bytes, held)),
        Err(_) => Err(error_response(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "The request body took too long to arrive",
        )),
    }
}

/// A request is in progress until its answer's body has been sent (or dropped), so the
/// idle sweep and the connection bound leave alone an event stream waiting for events, and
/// a streamed list or timeline a client is still reading: counted as done once the handler
/// returned, a list that took longer than the idle timeout to read was cut short.
fn hold_while_streaming(response: Response, in_flight: InFlight, held: Option<Held>) -> Response {
    response.map(|body| {
        Body::new(HeldBody {
            body,
            rest: hyper::body::Bytes::new(),
            _in_flight: in_flight,
            _held: held,
        })
    })
}

/// A response body that keeps its request in flight, and its bytes counted, until it is
/// dropped. It hands its data out in pieces of at most [`STREAMED_RESPONSE_BYTES`]: HTTP/2
/// takes a piece whenever its stream has room for one byte, and would otherwise take a
/// whole answer into its send buffer at once, ending the body (and its count) while the
/// bytes wait there for a client that does not read.
struct HeldBody {
    body: Body,
    /// What is left of a data frame larger than a piece.
    rest: hyper::body::Bytes,
    _in_flight: InFlight,
    _held: Option<Held>,
}

impl HeldBody {
    fn piece(&mut self) -> hyper::body::Frame<hyper::body::Bytes> {
        let size = self.rest.len().min(STREAMED_RESPONSE_BYTES);
        hyper::body::Frame::data(self.rest.split_to(size))
    }
}

impl hyper::body::Body for HeldBody {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        if !self.rest.is_empty() {
            return std::task::Poll::Ready(Some(Ok(self.piece())));
        }
        match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            std::task::Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.len() > STREAMED_RESPONSE_BYTES => {
                    self.rest = data;
                    std::task::Poll::Ready(Some(Ok(self.piece())))
                }
                Ok(data) => std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data)))),
                Err(frame) => std::task::Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = hyper::body::SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets requests in flight finish.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let registry = Arc::new(Registry::default());
    let budget = Arc::new(ByteBudget::new(
        limits.body_bytes_in_flight,
        limits.body_bytes_per_peer,
    ));
    let answers = Arc::new(ByteBudget::new(
        limits.response_bytes_in_flight,
        limits.response_bytes_per_peer,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let sweeper = {
        let registry = registry.clone();
        let every = (limits.header_read_timeout.min(limits.idle_timeout) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                registry.sweep(&limits);
            }
        })
    };
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = stop_rx.clone();
    let mut last_accept_error: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => break,
        };
        // Reap finished connection tasks so the set stays as large as what is open.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, or a connection reset before accept: pause rather
                // than spin, and log once a second at most.
                if last_accept_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(error = %e, open = registry.len(), "accept failed");
                    last_accept_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((id, close)) = registry.admit(limits.max_connections) else {
            tracing::warn!(
                peer = %peer,
                max_connections = limits.max_connections,
                "every connection is busy: refused a new one"
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let registry = registry.clone();
        let app = app.clone();
        let budget = budget.clone();
        let answers = answers.clone();
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            let tracker = registry.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let bodiless = hyper::body::Body::is_end_stream(request.body());
                tracker.request_started(id, !bodiless);
                let guard = InFlight {
                    registry: tracker.clone(),
                    id,
                };
                let uploading = (!bodiless).then(|| Uploading {
                    registry: tracker.clone(),
                    id,
                });
                let app = app.clone();
                let budget = budget.clone();
                let answers = answers.clone();
                async move {
                    // A client already holding its share of unsent answers is not given more.
                    if !answers.has_room(peer.ip()) {
                        drop(uploading);
                        return Ok(hold_while_streaming(too_many_answers(), guard, None));
                    }
                    let (parts, body) = request.into_parts();
                    let (body, _held) = if bodiless {
                        (Body::empty(), None)
                    } else {
                        match read_body(body, &limits, &budget, peer.ip()).await {
                            Ok((bytes, held)) => (Body::from(bytes), Some(held)),
                            Err(response) => {
                                drop(uploading);
                                return Ok(hold_while_streaming(response, guard, None));
                            }
                        }
                    };
                    drop(uploading);
                    let mut request = Request::from_parts(parts, body);
                    // Who is asking, for handlers that care (`/metrics` on loopback).
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    let account = AnswerAccount {
                        budget: answers.clone(),
                        peer: peer.ip(),
                    };
                    let response = tokio::time::timeout(
                        limits.request_timeout,
                        ANSWER_ACCOUNT.scope(account, app.oneshot(request)),
                    )
                    .await;
                    let response = match response {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => request_timeout(),
                    };
                    let (response, held) = hold_answer(response, &answers, peer.ip());
                    Ok::<_, Infallible>(hold_while_streaming(response, guard, held))
                }
            });
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http1().max_buf_size(MAX_HTTP1_HEAD_BYTES);
            builder
                .http2()
                .max_concurrent_streams(MAX_HTTP2_STREAMS)
                .max_send_buf_size(STREAMED_RESPONSE_BYTES);
            let connection =
                builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(connection.id = id, error = %e, "connection ended with an error");
                    }
                }
                _ = close.notified() => {
                    tracing::debug!(connection.id = id, "connection closed: waited too long for a request");
                }
                () = stopped(&mut stop) => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.as_mut().await;
                }
            }
            registry.forget(id);
        });
    }
    sweeper.abort();
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Completes once shutdown is asked for (the watch's guard is not held across awaits).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

fn request_timeout() -> Response {
    error_response(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        "The request took too long to be served",
    )
}

fn error_response(status: axum::http::StatusCode, message: &str) -> Response {
    use axum::response::IntoResponse;
    crate::error::ApiError::new(status, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that pauses for longer than the idle timeout between its chunks (as a streamed
    /// list does for a slow reader) is sent whole: the connection is busy until it is done.
    #[tokio::test]
    async fn an_answer_still_being_sent_outlives_the_idle_timeout() {
        let app = axum::Router::new().route(
            "/slow",
            axum::routing::get(|| async {
                let chunks = futures::stream::unfold(0, |n| async move {
                    match n {
                        0 => Some((Ok::<_, Infallible>("[1"), 1)),
                        1 => {
                            tokio::time::sleep(Duration::from_millis(1_200)).await;
                            Some((Ok(", 2]"), 2))
                        }
                        _ => None,
                    }
                });
                Body::from_stream(chunks)
            }),
        );
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(200),
            ..ConnectionLimits::default()
        };
        let (address, server) = serve_on_loopback(app, limits).await;
        let body = reqwest::get(format!("http://{address}/slow"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "[1, 2]");
        server.abort();
    }

    /// Serves `app` under `limits` on a free loopback port: its address and the server task.
    async fn serve_on_loopback(
        app: axum::Router,
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(
            listener,
            app.into_service::<Body>(),
            limits,
            std::future::pending(),
        ));
        (address, server)
    }

    type H2Client = h2::client::SendRequest<hyper::body::Bytes>;
    type H2Answer = axum::http::Response<h2::RecvStream>;

    /// An HTTP/2 client of `address`, its connection driven in the background.
    async fn h2_client(address: std::net::SocketAddr) -> H2Client {
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// The answer to a GET of `path` on a stream of its own; its body is not read.
    async fn h2_get(client: &H2Client, address: std::net::SocketAddr, path: &str) -> H2Answer {
        let mut client = client.clone().ready().await.unwrap();
        let request = axum::http::Request::get(format!("http://{address}{path}"))
            .body(())
            .unwrap();
        let (answer, _) = client.send_request(request, true).unwrap();
        answer.await.unwrap()
    }

    /// Reads an answer's body whole, giving its window back; the bytes read.
    async fn h2_read(answer: H2Answer) -> usize {
        let mut body = answer.into_body();
        let mut read = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            read += chunk.len();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        read
    }

    /// Whether `path` is answered 200 again within a second (an answer that was read is
    /// uncounted once its body has been dropped).
    async fn h2_served_again(client: &H2Client, address: std::net::SocketAddr, path: &str) -> bool {
        for _ in 0..50 {
            if h2_get(client, address, path).await.status() == 200 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// HTTP/2 streams whose answers are never read hold those answers in memory: past the
    /// client's share of unsent answers, it is refused (503) until it reads them.
    #[tokio::test]
    async fn unread_answers_count_until_they_are_read() {
        let big = "x".repeat(200_000);
        let app = axum::Router::new().route("/big", axum::routing::get(move || async move { big }));
        let limits = ConnectionLimits {
            response_bytes_in_flight: 1_000_000,
            response_bytes_per_peer: 300_000,
            ..ConnectionLimits::default()
        };
        let (address, server) = serve_on_loopback(app, limits).await;
        let client = h2_client(address).await;
        let first = h2_get(&client, address, "/big").await;
        assert_eq!(first.status(), 200);
        // Unread, the first answer holds 200 kB: a second would go past the share.
        let second = h2_get(&client, address, "/big").await;
        assert_eq!(second.status(), 503);
        assert_eq!(h2_read(first).await, 200_000);
        // Read, it holds nothing any more.
        assert!(
            h2_served_again(&client, address, "/big").await,
            "the read answer was still counted"
        );
        server.abort();
    }

    /// Headers that never end hold at most the head's bound, then get a 431; an ordinary
    /// request with a long URI is still served.
    #[tokio::test]
    async fn request_heads_are_bounded() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let app = axum::Router::new().route("/q", axum::routing::get(|| async { "ok" }));
        let (address, server) = serve_on_loopback(app, ConnectionLimits::default()).await;
        let ask = |head: Vec<u8>| async move {
            let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
            // The server may answer and close before all of it is written.
            let _ = tcp.write_all(&head).await;
            let mut answer = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        };
        let mut long_header = b"GET /q HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        long_header.resize(long_header.len() + 200_000, b'a');
        long_header.extend_from_slice(b"\r\n");
        let answer = ask(long_header).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");
        let uri = format!(
            "GET /q?query={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "a".repeat(60_000)
        );
        let answer = ask(uri.into_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:.80}");
        server.abort();
    }

    /// Three batches of 200 kB each, as a large timeline's.
    struct BigBatches(usize);

    impl crate::stream::Batches for BigBatches {
        type Batch = usize;

        async fn next_batch(&mut self) -> blazar_service::ServiceResult<Option<usize>> {
            self.0 += 1;
            Ok((self.0 <= 3).then_some(self.0))
        }

        fn write_batch(
            &self,
            _batch: usize,
            out: &mut crate::stream::Pieces,
            written: bool,
        ) -> bool {
            let out = out.bytes();
            if written {
                out.push(b',');
            }
            out.push(b'"');
            out.resize(out.len() + 200_000, b'x');
            out.push(b'"');
            true
        }

        fn suffix(&self) -> Vec<u8> {
            b"]".to_vec()
        }
    }

    /// An answer written as the client reads it counts what it has made and not handed on
    /// (a batch), not only a send buffer: clients that ask for many and read none are
    /// refused once their share is used, instead of holding a batch per answer.
    #[tokio::test]
    async fn unread_streamed_answers_count_what_they_hold() {
        let app = axum::Router::new().route(
            "/list",
            axum::routing::get(|| async {
                crate::stream::stream_json(b"[".to_vec(), BigBatches(0)).await
            }),
        );
        let limits = ConnectionLimits {
            response_bytes_in_flight: 10_000_000,
            response_bytes_per_peer: 600_000,
            ..ConnectionLimits::default()
        };
        let (address, server) = serve_on_loopback(app, limits).await;
        let client = h2_client(address).await;
        // Each unread answer holds its first batch, 200 kB, and a send buffer, 64 KiB: two
        // fit in the share, a third does not (counted as send buffers alone, nine would).
        let first = h2_get(&client, address, "/list").await;
        assert_eq!(first.status(), 200);
        let second = h2_get(&client, address, "/list").await;
        assert_eq!(second.status(), 200);
        let third = h2_get(&client, address, "/list").await;
        assert_eq!(third.status(), 503);
        // Read whole, the two give their share back. Read side by side: they share the
        // connection's window, which the one not being read would keep taking.
        let (a, b) = tokio::join!(h2_read(first), h2_read(second));
        assert_eq!((a, b), (3 * 200_002 + 2 + 2, 3 * 200_002 + 2 + 2));
        assert!(
            h2_served_again(&client, address, "/list").await,
            "the read answers were still counted"
        );
        server.abort();
    }

    fn registry_with(waiting: &[(u64, u64)]) -> Registry {
        let registry = Registry::default();
        let now = Instant::now();
        for (age_ms, busy) in waiting {
            let (id, _) = registry.admit(usize::MAX).unwrap();
            let mut connections = registry.lock();
            let c = connections.get_mut(&id).unwrap();
            c.accepted = now - Duration::from_millis(*age_ms);
            c.busy = *busy as usize;
        }
        registry
    }

    #[test]
    fn at_the_bound_the_longest_waiting_connection_makes_room() {
        let registry = registry_with(&[(100, 0), (500, 1), (300, 0)]);
        // Connection 1 is older but busy; 2 has waited longest.
        assert!(registry.admit(3).is_some());
        let open: Vec<u64> = {
            let mut ids: Vec<u64> = registry.lock().keys().copied().collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(open, vec![0, 1, 3]);
    }

    #[test]
    fn a_connection_only_uploading_gives_its_slot_up_but_is_not_swept() {
        let registry = registry_with(&[(100, 1)]);
        {
            let mut connections = registry.lock();
            let c = connections.get_mut(&0).unwrap();
            c.uploading = 1;
            c.uploading_since = Some(Instant::now() - Duration::from_secs(5));
        }
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(200),
            ..ConnectionLimits::default()
        };
        // Its body has a deadline of its own: the sweeper leaves it.
        registry.sweep(&limits);
        assert_eq!(registry.len(), 1);
        // At the bound, it makes room.
        assert!(registry.admit(1).is_some());
        let open: Vec<u64> = registry.lock().keys().copied().collect();
        assert_eq!(open, vec![1]);
    }

    #[test]
    fn when_every_connection_is_busy_the_new_one_is_refused() {
        let registry = registry_with(&[(100, 1), (200, 2)]);
        assert!(registry.admit(2).is_none());
        assert_eq!(registry.len(), 2);
        assert!(registry.admit(3).is_some());
    }

    #[test]
    fn the_sweeper_closes_slow_and_idle_connections_only() {
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(1_000),
            ..ConnectionLimits::default()
        };
        let registry = registry_with(&[(300, 0), (100, 0), (5_000, 1)]);
        {
            // Connection 3 answered a request 500 ms ago: idle, but within its timeout.
            let (id, _) = registry.admit(usize::MAX).unwrap();
            let mut connections = registry.lock();
            let c = connections.get_mut(&id).unwrap();
            c.last_done = Some(Instant::now() - Duration::from_millis(500));
        }
        registry.sweep(&limits);
        let mut open: Vec<u64> = registry.lock().keys().copied().collect();
        open.sort_unstable();
        // 0 never finished its headers in time; 2 is busy however old; 3 is idle briefly.
        assert_eq!(open, vec![1, 2, 3]);
    }
}
