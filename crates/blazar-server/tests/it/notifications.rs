//! Notifications end to end against the machine's RabbitMQ (`BLAZAR_TEST_AMQP_URL`, default
//! amqp://guest:guest@127.0.0.1:5672): the outbox written with each change, published in
//! oslo.messaging's `messagingv2` format and read back by a consumer bound as an oslo
//! `NotificationListener` binds (queue `notifications.info` on the `openstack` topic
//! exchange). Each test has a virtual host of its own (made with `rabbitmqctl` when it can,
//! else the default one with an exchange and topic of its own).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blazar_openstack::{NotifierSettings, RabbitNotifier};
use blazar_service::NotificationSink;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::AbortHandle;

use crate::harness::{TestApp, t};

fn broker_base() -> String {
    std::env::var("BLAZAR_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
        .trim_end_matches('/')
        .to_string()
}

fn rabbitmqctl(args: &[&str]) -> bool {
    std::process::Command::new("rabbitmqctl")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A place on the broker of one test's own, removed when dropped.
struct Broker {
    /// The virtual host, if the test made one.
    vhost: Option<String>,
    exchange: String,
    topic: String,
}

impl Broker {
    fn new() -> Broker {
        let name = format!("blazar-test-{}", uuid::Uuid::new_v4().simple());
        let made = rabbitmqctl(&["add_vhost", &name])
            && rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        if made {
            Broker {
                vhost: Some(name),
                exchange: "openstack".into(),
                topic: "notifications".into(),
            }
        } else {
            Broker {
                vhost: None,
                exchange: name.clone(),
                topic: name,
            }
        }
    }

    fn path(&self) -> String {
        match &self.vhost {
            Some(v) => format!("/{v}"),
            None => "/".into(),
        }
    }

    /// The broker as blazar-server's configuration names it, reached on `port`.
    fn transport_url(&self, port: u16) -> String {
        let base = broker_base();
        let (userinfo, _) = base
            .trim_start_matches("amqp://")
            .rsplit_once('@')
            .unwrap_or(("guest:guest", ""));
        format!("rabbit://{userinfo}@127.0.0.1:{port}{}", self.path())
    }

    fn broker_port() -> u16 {
        broker_base()
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(5672)
    }

    fn notifier_via(&self, port: u16) -> RabbitNotifier {
        RabbitNotifier::new(NotifierSettings {
            transport_url: self.transport_url(port),
            exchange: self.exchange.clone(),
            topics: vec![self.topic.clone()],
            timeout: Duration::from_secs(3),
            ..NotifierSettings::default()
        })
        .unwrap()
    }

    fn notifier(&self) -> RabbitNotifier {
        self.notifier_via(Self::broker_port())
    }

    async fn connect(&self) -> Connection {
        let vhost = match &self.vhost {
            Some(v) => v.clone(),
            None => "%2f".into(),
        };
        Connection::connect(
            &format!("{}/{vhost}", broker_base()),
            ConnectionProperties::default(),
        )
        .await
        .unwrap()
    }

    /// A consumer of `<topic>.info` declared and bound as oslo.messaging's listener does.
    async fn listener(&self) -> Listener {
        let connection = self.connect().await;
        let channel = connection.create_channel().await.unwrap();
        let queue = format!("{}.info", self.topic);
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                queue.as_str().into(),
                self.exchange.as_str().into(),
                queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Listener {
            _connection: connection,
            consumer,
        }
    }

    /// Removes what the test declared in the default virtual host.
    async fn clean_default_vhost(&self) {
        if self.vhost.is_some() {
            return;
        }
        let connection = self.connect().await;
        let channel = connection.create_channel().await.unwrap();
        let _ = channel
            .queue_delete(
                format!("{}.info", self.topic).as_str().into(),
                QueueDeleteOptions::default(),
            )
            .await;
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(v) = &self.vhost {
            rabbitmqctl(&["delete_vhost", v]);
        }
    }
}

struct Listener {
    _connection: Connection,
    consumer: lapin::Consumer,
}

/// One received notification: the envelope's `oslo.message`, decoded.
fn decode(data: &[u8]) -> Value {
    let envelope: Value = serde_json::from_slice(data).unwrap();
    assert_eq!(envelope["oslo.version"], "2.0", "{envelope}");
    assert_eq!(envelope.as_object().unwrap().len(), 2, "{envelope}");
    serde_json::from_str(envelope["oslo.message"].as_str().unwrap()).unwrap()
}

impl Listener {
    /// The next `n` messages (acknowledged); fails if they do not come within 20 s.
    async fn take(&mut self, n: usize) -> Vec<Value> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(20), self.consumer.next()).await;
            let delivery = match next {
                Ok(Some(Ok(d))) => d,
                other => panic!("expected {n} notifications, got {}: {other:?}", got.len()),
            };
            delivery.ack(BasicAckOptions::default()).await.unwrap();
            got.push(decode(&delivery.data));
        }
        got
    }

    /// Whether nothing more arrives within a short while.
    async fn is_quiet(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(500), self.consumer.next())
            .await
            .is_err()
    }
}

/// A TCP proxy in front of the broker that the test can cut and restore.
struct Proxy {
    port: u16,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (o, c) = (open.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                c.lock().await.push(task.abort_handle());
            }
        })
        .abort_handle();
        Proxy {
            port,
            open,
            connections,
            accept,
        }
    }

    /// Drops every connection through the proxy and refuses new ones.
    async fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.connections.lock().await.drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn lease_request(name: &str, start: &str, end: &str) -> Value {
    json!({"name": name, "start_date": start, "end_date": end,
           "events": [], "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
           "hypervisor_properties": "", "resource_properties": ""}]})
}

fn event_status(payload: &Value, kind: &str) -> String {
    payload["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == kind && e["status"] != "DONE")
        .or_else(|| {
            payload["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["event_type"] == kind)
        })
        .map(|e| e["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_lease_life_is_announced_in_oslos_format_and_in_order() {
    let broker = Broker::new();
    let app = TestApp::spawn().await;
    let notifier = broker.notifier();
    let mut listener = broker.listener().await;
    app.create_host("compute-1", json!({})).await;

    // A dry run and a refused create write nothing to announce.
    let dry = app
        .post(
            "/v1/leases?dry_run=true",
            lease_request("dry", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    dry.assert_status(StatusCode::CREATED);
    let created = app
        .post(
            "/v1/leases",
            lease_request("life", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    created.assert_status(StatusCode::CREATED);
    let lease = created.body["lease"].clone();
    let id = lease["id"].as_str().unwrap().to_string();
    let refused = app
        .post(
            "/v1/leases",
            lease_request("refused", "2030-01-01 11:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    let report = app.service.publish_notifications(&notifier).await.unwrap();
    assert_eq!(report.sent, 1, "{report:?}");
    let create = listener.take(1).await.remove(0);
    // The envelope is oslo.messaging's; the payload is the lease as the API shows it,
    // with `lease_id` for `id` (Blazar's format_lease_payload).
    assert_eq!(create["event_type"], "lease.create");
    assert_eq!(create["publisher_id"], "blazar.lease");
    assert_eq!(create["priority"], "INFO");
    assert_eq!(create["timestamp"], "2029-12-31 08:00:00");
    assert!(create["message_id"].as_str().is_some_and(|m| m.len() == 36));
    let mut expected = app.get(&format!("/v1/leases/{id}")).await.body["lease"].clone();
    let expected_map = expected.as_object_mut().unwrap();
    let lease_id = expected_map.remove("id").unwrap();
    expected_map.insert("lease_id".into(), lease_id);
    assert_eq!(create["payload"], expected);
    assert_eq!(create["payload"]["status"], "PENDING");
    assert_eq!(
        create["payload"]["start_date"],
        "2030-01-01T10:00:00.000000"
    );
    assert_eq!(create["payload"]["created_at"], "2029-12-31 08:00:00");
    // The context names the API request that caused it, as the response did.
    let request_id = created.headers["x-openstack-request-id"].to_str().unwrap();
    assert!(request_id.starts_with("req-"), "{request_id}");
    assert_eq!(create["_context_request_id"], request_id);

    // Extend; start; the lease-ending notice; extend again (the notice comes again); end;
    // delete. A rename alone is not announced, as in Blazar.
    let renamed = app
        .put(&format!("/v1/leases/{id}"), json!({"name": "life-2"}))
        .await;
    renamed.assert_status(StatusCode::OK);
    let dry_update = app
        .put(
            &format!("/v1/leases/{id}?dry_run=true"),
            json!({"end_date": "2030-01-01 15:00"}),
        )
        .await;
    dry_update.assert_status(StatusCode::OK);
    app.put(
        &format!("/v1/leases/{id}"),
        json!({"end_date": "2030-01-01 13:00"}),
    )
    .await
    .assert_status(StatusCode::OK);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    app.put(
        &format!("/v1/leases/{id}"),
        json!({"end_date": "2030-01-01 14:00"}),
    )
    .await
    .assert_status(StatusCode::OK);
    app.tick_at(t(2030, 1, 1, 13, 0)).await;
    app.tick_at(t(2030, 1, 1, 14, 0)).await;
    app.delete(&format!("/v1/leases/{id}")).await;

    let report = app.service.publish_notifications(&notifier).await.unwrap();
    assert_eq!(report.sent, 8, "{report:?}");
    let got = listener.take(8).await;
    let seen: Vec<(&str, &str)> = got
        .iter()
        .map(|m| {
            (
                m["event_type"].as_str().unwrap(),
                m["payload"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("lease.update", "UPDATING"),
            ("lease.event.start_lease", "ACTIVE"),
            ("lease.event.before_end_lease", "ACTIVE"),
            ("lease.update", "UPDATING"),
            ("lease.event.before_end_lease.stop", "UPDATING"),
            ("lease.event.before_end_lease", "ACTIVE"),
            ("lease.event.end_lease", "TERMINATED"),
            ("lease.delete", "DELETING"),
        ]
    );
    for m in &got {
        assert_eq!(m["payload"]["lease_id"], id.as_str());
        assert_eq!(m["payload"]["name"], "life-2");
        assert_eq!(m["publisher_id"], "blazar.lease");
        assert_eq!(m["priority"], "INFO");
    }
    assert_eq!(got[0]["payload"]["end_date"], "2030-01-01T13:00:00.000000");
    assert_eq!(event_status(&got[1]["payload"], "start_lease"), "DONE");
    // Requests name theirs; an event, caused by none, names its own.
    let request_ids: Vec<&str> = got
        .iter()
        .map(|m| m["_context_request_id"].as_str().unwrap())
        .collect();
    assert_ne!(request_ids[0], request_ids[3]);
    assert_ne!(request_ids[0], request_id);
    assert_eq!(
        request_ids[1],
        format!("req-{}", got[1]["message_id"].as_str().unwrap())
    );
    assert_eq!(got[3]["payload"]["end_date"], "2030-01-01T14:00:00.000000");
    // The re-armed notice waits for its new time.
    assert_eq!(
        event_status(&got[4]["payload"], "before_end_lease"),
        "UNDONE"
    );
    assert_eq!(event_status(&got[6]["payload"], "end_lease"), "DONE");
    assert_eq!(got[6]["payload"]["reservations"][0]["status"], "deleted");
    assert_eq!(got[7]["payload"]["reservations"][0]["min"], 1);
    // Every message once: the outbox is drained.
    assert!(listener.is_quiet().await);
    assert_eq!(app.service.unsent_notifications().await.unwrap(), 0);
    assert_eq!(
        app.service
            .publish_notifications(&notifier)
            .await
            .unwrap()
            .sent,
        0
    );
    broker.clean_default_vhost().await;
}

#[tokio::test]
async fn notifications_wait_out_a_broker_outage_and_then_go_in_order() {
    let broker = Broker::new();
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(Broker::broker_port()).await;
    let notifier = broker.notifier_via(proxy.port);
    let mut listener = broker.listener().await;
    for i in 0..2 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let first = app
        .post(
            "/v1/leases",
            lease_request("before", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    first.assert_status(StatusCode::CREATED);
    assert_eq!(
        app.service
            .publish_notifications(&notifier)
            .await
            .unwrap()
            .sent,
        1
    );

    proxy.cut().await;
    // The service keeps working while the broker is away; what it decides waits.
    let mut ids = vec![first.body["lease"]["id"].as_str().unwrap().to_string()];
    let second = app
        .post(
            "/v1/leases",
            lease_request("during", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    second.assert_status(StatusCode::CREATED);
    ids.push(second.body["lease"]["id"].as_str().unwrap().to_string());
    for id in &ids {
        app.put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 13:00"}),
        )
        .await
        .assert_status(StatusCode::OK);
    }
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.delete(&format!("/v1/leases/{}", ids[0])).await;
    let report = app.service.publish_notifications(&notifier).await.unwrap();
    assert_eq!(report.sent, 0, "{report:?}");
    assert!(report.error.is_some());
    let waiting = app.service.unsent_notifications().await.unwrap();
    assert_eq!(waiting, 6);

    proxy.restore();
    let report = app.service.publish_notifications(&notifier).await.unwrap();
    assert_eq!(report.sent, 6, "{report:?}");
    let got = listener.take(7).await;
    let mut by_lease: HashMap<String, Vec<String>> = HashMap::new();
    for m in &got {
        by_lease
            .entry(m["payload"]["lease_id"].as_str().unwrap().to_string())
            .or_default()
            .push(m["event_type"].as_str().unwrap().to_string());
    }
    assert_eq!(
        by_lease[&ids[0]],
        [
            "lease.create",
            "lease.update",
            "lease.event.start_lease",
            "lease.delete"
        ]
    );
    assert_eq!(
        by_lease[&ids[1]],
        ["lease.create", "lease.update", "lease.event.start_lease"]
    );
    assert!(listener.is_quiet().await);
    broker.clean_default_vhost().await;
}

#[tokio::test]
async fn replicas_publish_each_notification_once() {
    let broker = Broker::new();
    let one = TestApp::spawn().await;
    let two = one.replica().await;
    let mut listener = broker.listener().await;
    for i in 0..4 {
        one.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let sinks = [Arc::new(broker.notifier()), Arc::new(broker.notifier())];
    let stop = Arc::new(AtomicBool::new(false));
    // Both replicas publish continuously while both write.
    let mut running = Vec::new();
    for (app, sink) in [(&one, sinks[0].clone()), (&two, sinks[1].clone())] {
        let service = app.service.clone();
        let stop = stop.clone();
        running.push(tokio::spawn(async move {
            let mut sent = 0;
            loop {
                let done = stop.load(Ordering::SeqCst);
                sent += service
                    .publish_notifications(sink.as_ref() as &dyn NotificationSink)
                    .await
                    .unwrap()
                    .sent;
                if done {
                    return sent;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut ids = Vec::new();
    for i in 0..12 {
        let app = if i % 2 == 0 { &one } else { &two };
        let start = format!("2030-01-{:02} 10:00", i + 1);
        let end = format!("2030-01-{:02} 12:00", i + 1);
        let r = app
            .post("/v1/leases", lease_request("r", &start, &end))
            .await;
        r.assert_status(StatusCode::CREATED);
        let id = r.body["lease"]["id"].as_str().unwrap().to_string();
        let end = format!("2030-01-{:02} 13:00", i + 1);
        app.put(&format!("/v1/leases/{id}"), json!({"end_date": end}))
            .await
            .assert_status(StatusCode::OK);
        app.delete(&format!("/v1/leases/{id}")).await;
        ids.push(id);
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for task in running {
        total += task.await.unwrap();
    }
    assert_eq!(total, 36);
    let got = listener.take(36).await;
    let unique: HashSet<&str> = got
        .iter()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 36);
    for id in &ids {
        let kinds: Vec<&str> = got
            .iter()
            .filter(|m| m["payload"]["lease_id"] == id.as_str())
            .map(|m| m["event_type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["lease.create", "lease.update", "lease.delete"]);
    }
    assert!(listener.is_quiet().await);
    broker.clean_default_vhost().await;
}

/// The outbox keeps every notification; its list is streamed a page at a time, in the order
/// they were written, whatever its length.
#[tokio::test]
async fn the_whole_outbox_is_listed_in_order_past_one_page() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let mut expected = Vec::new();
    for day in 0..120u32 {
        let start = t(2030, 1, 1, 0, 0) + chrono::Duration::days(i64::from(day));
        let end = start + chrono::Duration::hours(1);
        let body = lease_request(
            &format!("outbox-{day}"),
            &start.format("%Y-%m-%d %H:%M").to_string(),
            &end.format("%Y-%m-%d %H:%M").to_string(),
        );
        let created = app.post("/v1/leases", body).await;
        created.assert_status(StatusCode::CREATED);
        let id = created.body["lease"]["id"].as_str().unwrap().to_string();
        app.delete(&format!("/v1/leases/{id}")).await;
        expected.push(("lease.create".to_string(), id.clone()));
        expected.push(("lease.delete".to_string(), id));
    }

    let all = app.get("/v1/notifications").await;
    all.assert_status(StatusCode::OK);
    let listed: Vec<(String, String)> = all.body["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["event_type"].as_str().unwrap().to_string(),
                n["lease_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, expected);

    let one = &expected[201].1;
    let of_one = app.get(&format!("/v1/notifications?lease_id={one}")).await;
    let kinds: Vec<&str> = of_one.body["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["lease.create", "lease.delete"]);
    let none = app.get("/v1/notifications?lease_id=nothing").await;
    assert_eq!(none.body, json!({"notifications": []}));
}

/// A broker that takes its time with each notification (the real one, behind a pause).
struct SlowBroker {
    inner: RabbitNotifier,
    sent: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl NotificationSink for SlowBroker {
    async fn publish(&self, notification: &blazar_core::Notification) -> Result<(), String> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.inner.publish(notification).await?;
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A publisher asked to stop stops after the notification it is sending, not once the
/// whole outbox is out, and gives back what it had claimed: another run sends the rest at
/// once instead of waiting for the claim to run out.
#[tokio::test]
async fn a_stopping_publisher_gives_back_its_claim_instead_of_draining_the_outbox() {
    let broker = Broker::new();
    let app = TestApp::spawn().await;
    let mut listener = broker.listener().await;
    for i in 0..60 {
        let r = app
            .post(
                "/v1/leases",
                json!({"name": format!("l{i}"), "start_date": "2030-01-01 10:00",
                       "end_date": "2030-01-01 12:00", "reservations": [], "events": []}),
            )
            .await;
        r.assert_status(StatusCode::CREATED);
    }
    let slow = Arc::new(SlowBroker {
        inner: broker.notifier(),
        sent: Default::default(),
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let publisher = {
        let service = app.service.clone();
        let slow = slow.clone();
        tokio::spawn(async move {
            service
                .run_publisher(slow.as_ref(), Duration::from_secs(60), async {
                    let _ = stopped.await;
                })
                .await
        })
    };
    while slow.sent.load(Ordering::SeqCst) < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(());
    publisher.await.unwrap();
    let before = slow.sent.load(Ordering::SeqCst);
    assert!(before < 30, "{before} of 60 sent after the stop was asked");
    // Nothing is left claimed: a run right after sends every other one.
    let rest = app
        .service
        .publish_notifications(&broker.notifier())
        .await
        .unwrap();
    assert_eq!(rest.error, None);
    assert_eq!(before + rest.sent, 60);
    let got = listener.take(60).await;
    let unique: HashSet<&str> = got
        .iter()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 60);
    broker.clean_default_vhost().await;
}
