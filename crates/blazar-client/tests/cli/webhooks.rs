//! `webhook-*` commands: events POSTed to a receiver in the test, signed with the secret
//! printed once at creation, and the deliveries listed.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::HeaderMap;

use crate::harness::{Server, one_host_lease};

type Got = Arc<Mutex<Vec<(String, String, String, String)>>>;

async fn receive(State(got): State<Got>, headers: HeaderMap, body: String) -> &'static str {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    got.lock().unwrap().push((
        h("x-blazar-event"),
        h("x-blazar-timestamp"),
        h("x-blazar-signature"),
        body,
    ));
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receives_signed_events_and_lists_its_deliveries() {
    let got: Got = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(got.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let s = Server::start().await;
    s.blazar(&["host-create", "compute-1"]).await.ok();
    let created = s
        .blazar(&[
            "webhook-create",
            &url,
            "--event-type",
            "lease.create",
            "-f",
            "value",
            "-c",
            "id",
            "-c",
            "secret",
        ])
        .await;
    let mut lines = created.ok().lines().skip(1);
    let (id, secret) = (
        lines.next().unwrap().to_string(),
        lines.next().unwrap().to_string(),
    );
    assert_eq!(secret.len(), 64, "{secret}");
    s.blazar(&one_host_lease("demo", &[])).await.ok();
    assert_eq!(s.deliver_webhooks().await.delivered, 1);
    let (event, timestamp, signature, body) = got.lock().unwrap()[0].clone();
    assert_eq!(event, "lease.create");
    assert_eq!(
        signature,
        blazar_service::webhook_signature(&secret, timestamp.parse().unwrap(), &body)
    );
    assert!(body.contains("\"name\":\"demo\""), "{body}");

    let listed = s
        .blazar(&["webhook-list", "-f", "value", "-c", "id", "-c", "url"])
        .await;
    assert_eq!(listed.ok(), format!("{id} {url}\n"));
    let deliveries = s
        .blazar(&[
            "webhook-deliveries",
            &id,
            "-f",
            "value",
            "-c",
            "event_type",
            "-c",
            "status",
            "-c",
            "attempts",
        ])
        .await;
    assert_eq!(deliveries.ok(), "lease.create delivered 1\n");
    let shown = s.blazar(&["webhook-show", &id]).await;
    assert!(!shown.ok().contains(&secret));
    assert_eq!(
        s.blazar(&["webhook-delete", &id]).await.ok(),
        format!("Deleted webhook: {id}\n")
    );
    assert_eq!(s.blazar(&["webhook-list", "-f", "value"]).await.ok(), "");
}
