//! The connection loop under abuse: idle and slow ("slowloris") clients cannot hold the
//! server's connection slots against others, and slow connections are closed.

use std::time::{Duration, Instant};

use blazar_server::listener::ConnectionLimits;
use blazar_service::Settings;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{TestApp, TestDatabase};

async fn limited(max_connections: usize) -> TestApp {
    TestApp::spawn_limited(
        TestDatabase::new().await,
        Settings::default(),
        ConnectionLimits {
            max_connections,
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_millis(2_500),
            request_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_millis(1_500),
            body_bytes_in_flight: 256 * 1024,
            body_bytes_per_peer: 256 * 1024,
            ..ConnectionLimits::default()
        },
    )
    .await
}

fn addr(app: &TestApp) -> String {
    app.base.trim_start_matches("http://").to_string()
}

/// Whether the server closed the connection (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // Whatever the server wrote (a 408 or nothing), keep reading until it closes.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn idle_and_slow_clients_cannot_lock_others_out() {
    let app = limited(16).await;
    let target = addr(&app);
    let mut held = Vec::new();
    // More idle connections than the bound, then more slowloris ones.
    for _ in 0..24 {
        held.push(TcpStream::connect(&target).await.unwrap());
    }
    for _ in 0..24 {
        let mut s = TcpStream::connect(&target).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A")
            .await
            .unwrap();
        held.push(s);
    }
    // Another client is served at once, repeatedly, while all of them are held open.
    for _ in 0..5 {
        let started = Instant::now();
        let r = app.get("/healthz").await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "served only after {:?}",
            started.elapsed()
        );
        let r = app.get("/v1/leases").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    // The oldest held connections gave their slots up: the server closed them.
    let mut closed = 0;
    for s in held.iter_mut().take(8) {
        if closed_within(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(closed > 0, "no held connection was closed to make room");
}

#[tokio::test]
async fn slow_headers_and_idle_keep_alives_are_closed() {
    let app = limited(64).await;
    let target = addr(&app);
    // A request line, then one header byte now and then: closed after the header timeout
    // (1 s) however it trickles.
    let mut slow = TcpStream::connect(&target).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    let mut closed = false;
    for byte in b"Host: example.org".iter().cycle().take(40) {
        if slow.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(250)).await {
            closed = true;
            break;
        }
    }
    assert!(closed, "a slowloris connection stayed open");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "closed only after {:?}",
        started.elapsed()
    );

    // A connection that never sends anything: closed after the header timeout too.
    let mut silent = TcpStream::connect(&target).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(3)).await);

    // A keep-alive connection after a complete request: kept past the header timeout,
    // closed after the idle timeout (2.5 s).
    let mut kept = TcpStream::connect(&target).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(!closed_within(&mut kept, Duration::from_millis(1_500)).await);
    assert!(closed_within(&mut kept, Duration::from_secs(3)).await);
}

/// The status line of what the server answers on `stream` within `within`, if anything.
async fn status_within(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .map(str::to_string),
        _ => None,
    }
}

/// Headers announcing a `length`-byte lease body, then `sent` bytes of it.
async fn upload_part(target: &str, length: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(target).await.unwrap();
    let head = format!(
        "POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; sent]).await.unwrap();
    s
}

#[tokio::test]
async fn a_body_trickling_in_is_answered_408_at_its_deadline() {
    let app = limited(64).await;
    let target = addr(&app);
    let mut slow = upload_part(&target, 1_000, 1).await;
    let started = Instant::now();
    // A byte every 200 ms keeps the upload alive but never finishes it within 1.5 s.
    let mut status = None;
    for _ in 0..30 {
        if slow.write_all(b" ").await.is_err() {
            break;
        }
        status = status_within(&mut slow, Duration::from_millis(200)).await;
        if status.is_some() {
            break;
        }
    }
    let status = status.expect("no answer to a body that never finished");
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered only after {:?}",
        started.elapsed()
    );
    // A body that does arrive in time is served as usual.
    app.get("/v1/leases").await.assert_status(StatusCode::OK);
    let r = app
        .post(
            "/v1/leases",
            serde_json::json!({"name": "x", "start_date": "now", "end_date": "now"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

#[tokio::test]
async fn uploads_that_stall_cannot_lock_others_out() {
    let app = limited(8).await;
    let target = addr(&app);
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(upload_part(&target, 100_000, 10).await);
    }
    for _ in 0..5 {
        let started = Instant::now();
        let r = app.get("/healthz").await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "served only after {:?}",
            started.elapsed()
        );
    }
    let mut closed = 0;
    for s in held.iter_mut().take(8) {
        if closed_within(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(closed > 0, "no stalled upload gave its slot up");
}

#[tokio::test]
async fn bodies_being_received_share_one_byte_budget() {
    // The budget is 256 KiB: five bodies of 100 kB, 60 kB of each sent, do not all fit.
    let app = limited(64).await;
    let target = addr(&app);
    let mut uploads = Vec::new();
    for _ in 0..5 {
        uploads.push(upload_part(&target, 100_000, 60_000).await);
        // Each one read before the next arrives, so the refusals fall on the last ones.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A refusal is answered at once; an upload that fit is answered 408 at its deadline.
    let mut refused = Vec::new();
    for (i, s) in uploads.iter_mut().enumerate() {
        if let Some(status) = status_within(s, Duration::from_millis(100)).await {
            if status.starts_with("HTTP/1.1 503") {
                refused.push(i);
            } else {
                assert!(status.starts_with("HTTP/1.1 408"), "{status}");
            }
        }
    }
    assert!(!refused.is_empty(), "every upload fit in the budget");
    assert!(
        !refused.contains(&0),
        "the first upload was refused: {refused:?}"
    );
    // Once the stalled uploads reach their deadline, their bytes are given back.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let name = "y".repeat(150_000);
    let r = app
        .post(
            "/v1/leases",
            serde_json::json!({"name": name, "start_date": "now", "end_date": "now"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

/// One client address may hold only its share of the budget: another address is still
/// served while the first is at its share.
#[tokio::test]
async fn one_client_cannot_hold_the_whole_budget() {
    let app = TestApp::spawn_limited(
        TestDatabase::new().await,
        Settings::default(),
        ConnectionLimits {
            body_read_timeout: Duration::from_millis(1_500),
            body_bytes_in_flight: 1024 * 1024,
            body_bytes_per_peer: 128 * 1024,
            ..ConnectionLimits::default()
        },
    )
    .await;
    let target = addr(&app);
    let mut first = upload_part(&target, 100_000, 90_000).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut second = upload_part(&target, 100_000, 90_000).await;
    assert_eq!(
        status_within(&mut first, Duration::from_millis(500)).await,
        None
    );
    let status = status_within(&mut second, Duration::from_millis(500))
        .await
        .expect("the second upload of one address was not refused");
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    // The same upload from another loopback address.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(target.parse().unwrap()).await.unwrap();
    other
        .write_all(
            b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100000\r\n\r\n",
        )
        .await
        .unwrap();
    other.write_all(&vec![b' '; 90_000]).await.unwrap();
    assert_eq!(
        status_within(&mut other, Duration::from_millis(500)).await,
        None
    );
}
