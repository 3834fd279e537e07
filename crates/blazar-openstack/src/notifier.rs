//! Notifications over RabbitMQ as oslo.messaging's `messagingv2` notifier sends them, so
//! that OpenStack consumers (Ceilometer, a `NotificationListener`) read them unchanged:
//! the envelope `{"oslo.version": "2.0", "oslo.message": "<json>"}`, published to the
//! topic exchange `control_exchange` (default `openstack`) with routing key
//! `<topic>.info`, and a queue of that name declared and bound, as oslo's rabbit driver
//! declares it so that nothing is lost before a consumer binds its own.
//!
//! Each publish waits for the broker's confirm. A failure drops the connection; the next
//! publish connects again (to the next host of the URL, if it names several).

use std::time::Duration;

use async_trait::async_trait;
use blazar_core::Notification;
use blazar_service::NotificationSink;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// Where and how notifications are published.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifierSettings {
    /// oslo.messaging's transport URL: `rabbit://user:pass@host:port[,user:pass@host2:port]/vhost`.
    pub transport_url: String,
    /// oslo.messaging's `control_exchange`.
    pub exchange: String,
    /// oslo.messaging's `[oslo_messaging_notifications] topics`: each notification goes to
    /// `<topic>.info` of every one.
    pub topics: Vec<String>,
    /// Blazar's `[notifications] publisher_id`.
    pub publisher_id: String,
    /// oslo.messaging's `amqp_durable_queues`: whether the exchange and the queues it
    /// declares survive a broker restart (they must match what the site declared).
    pub durable: bool,
    /// Longest a connect or a publish with its confirm may take.
    pub timeout: Duration,
}

impl Default for NotifierSettings {
    fn default() -> Self {
        NotifierSettings {
            transport_url: String::new(),
            exchange: "openstack".into(),
            topics: vec!["notifications".into()],
            publisher_id: "blazar.lease".into(),
            durable: false,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The AMQP URIs a `rabbit://` transport URL names, one per host, in order.
pub fn amqp_uris(transport_url: &str) -> Result<Vec<String>, String> {
    let bad =
        |why: &str| format!("transport_url: {why} (expected rabbit://user:pass@host:port/vhost)");
    let rest = transport_url
        .strip_prefix("rabbit://")
        .or_else(|| transport_url.strip_prefix("amqp://"))
        .ok_or_else(|| bad("only rabbit:// is supported"))?;
    let (hosts, vhost) = match rest.split_once('/') {
        Some((hosts, vhost)) => (hosts, vhost.split(['?', '#']).next().unwrap_or_default()),
        None => (rest, ""),
    };
    // oslo.messaging takes TLS from the URL's query (`?ssl=1`); connecting in plain AMQP to
    // a TLS listener would only fail at every attempt, so such a URL is refused at start.
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let tls = query.split('&').any(|kv| {
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        // oslo's bool_from_string: these are true, anything else false.
        key == "ssl"
            && matches!(
                value.to_ascii_lowercase().as_str(),
                "1" | "t" | "true" | "on" | "y" | "yes"
            )
    });
    if tls {
        return Err(bad(
            "TLS (ssl=1) is not supported; use a plain AMQP listener",
        ));
    }
    // oslo.messaging: no virtual host in the URL is the broker's default one, `/`.
    let vhost = if vhost.is_empty() {
        "%2f".to_string()
    } else {
        vhost.to_string()
    };
    let uris: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            if h.rsplit_once('@').map_or(h, |(_, host)| host).contains(':') {
                format!("amqp://{h}/{vhost}")
            } else {
                format!("amqp://{h}:5672/{vhost}")
            }
        })
        .collect();
    if uris.is_empty() {
        return Err(bad("no host"));
    }
    Ok(uris)
}

/// `2030-01-01 10:00:00`: Python's `str()` of a UTC datetime, oslo's notification
/// timestamp (microseconds only when there are some).
fn oslo_timestamp(t: chrono::DateTime<chrono::Utc>) -> String {
    if t.timestamp_subsec_micros() == 0 {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
    }
}

/// The `messagingv2` message of a notification. Its `message_id` is the outbox row's id,
/// the same on every delivery, so a consumer can drop a duplicate.
pub fn oslo_message(n: &Notification, publisher_id: &str) -> Value {
    let payload = &n.payload;
    let message = json!({
        "message_id": n.id,
        "publisher_id": publisher_id,
        "event_type": n.event_type,
        "priority": "INFO",
        "payload": payload,
        "timestamp": oslo_timestamp(n.created_at),
        // oslo.messaging packs the request context beside the message (`pack_context`);
        // Blazar's is the lease owner's.
        "_context_user_id": payload.get("user_id").cloned().unwrap_or(Value::Null),
        "_context_project_id": payload.get("project_id").cloned().unwrap_or(Value::Null),
        // The API call that caused it; the scheduler's events were caused by none, and
        // name their own, as each of Blazar's periodic tasks makes a fresh context.
        "_context_request_id": n.request_id.clone().unwrap_or_else(|| format!("req-{}", n.id)),
    });
    json!({
        "oslo.version": "2.0",
        "oslo.message": message.to_string(),
    })
}

/// Publishes notifications to RabbitMQ; one connection, made on first use and again after
/// a failure.
pub struct RabbitNotifier {
    settings: NotifierSettings,
    uris: Vec<String>,
    /// The channel in confirm mode, with its connection; `None` until connected and after
    /// a failure. Next host to try first.
    state: Mutex<(Option<(Connection, Channel)>, usize)>,
}

impl RabbitNotifier {
    pub fn new(settings: NotifierSettings) -> Result<Self, String> {
        let uris = amqp_uris(&settings.transport_url)?;
        if settings.topics.is_empty() {
            return Err("notifications: at least one topic is needed".into());
        }
        Ok(RabbitNotifier {
            settings,
            uris,
            state: Mutex::new((None, 0)),
        })
    }

    /// Connects to one host and declares what oslo.messaging's notifier declares.
    async fn connect(&self, uri: &str) -> Result<(Connection, Channel), lapin::Error> {
        let connection = Connection::connect(
            uri,
            ConnectionProperties::default().with_connection_name("blazar-rs notifications".into()),
        )
        .await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let durable = self.settings.durable;
        channel
            .exchange_declare(
                self.settings.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        for topic in &self.settings.topics {
            let key = format!("{topic}.info");
            channel
                .queue_declare(
                    key.as_str().into(),
                    QueueDeclareOptions {
                        durable,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            channel
                .queue_bind(
                    key.as_str().into(),
                    self.settings.exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok((connection, channel))
    }

    async fn send(&self, channel: &Channel, body: &[u8]) -> Result<(), String> {
        for topic in &self.settings.topics {
            let key = format!("{topic}.info");
            let confirm = channel
                .basic_publish(
                    self.settings.exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default()
                        .with_content_type("application/json".into())
                        .with_content_encoding("utf-8".into())
                        .with_delivery_mode(2),
                )
                .await
                .map_err(|e| format!("publish to {key}: {e}"))?
                .await
                .map_err(|e| format!("confirm from {key}: {e}"))?;
            if !confirm.is_ack() {
                return Err(format!("the broker refused the notification ({key})"));
            }
        }
        Ok(())
    }
}

#[async_trait]
impl NotificationSink for RabbitNotifier {
    async fn publish(&self, notification: &Notification) -> Result<(), String> {
        let body = oslo_message(notification, &self.settings.publisher_id).to_string();
        let timeout = self.settings.timeout;
        let mut state = self.state.lock().await;
        if state.0.is_none() {
            let next = state.1 % self.uris.len();
            let uri = &self.uris[next];
            match tokio::time::timeout(timeout, self.connect(uri)).await {
                Ok(Ok(connected)) => {
                    tracing::info!(broker.host = next, "connected to the notification broker");
                    state.0 = Some(connected);
                }
                Ok(Err(e)) => {
                    state.1 = next + 1;
                    return Err(format!("connecting to the broker: {e}"));
                }
                Err(_) => {
                    state.1 = next + 1;
                    return Err(format!(
                        "connecting to the broker: no answer within {} s",
                        timeout.as_secs()
                    ));
                }
            }
        }
        let Some((_, channel)) = &state.0 else {
            return Err("not connected".into());
        };
        let sent = match tokio::time::timeout(timeout, self.send(channel, body.as_bytes())).await {
            Ok(result) => result,
            Err(_) => Err(format!("no confirm within {} s", timeout.as_secs())),
        };
        if sent.is_err() {
            // Whatever state the connection is in, the next publish starts afresh.
            if let Some((connection, _)) = state.0.take() {
                tokio::spawn(async move {
                    let _ = connection.close(320, "blazar-rs reconnects".into()).await;
                });
            }
            state.1 += 1;
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_urls_become_amqp_uris() {
        let check = |url: &str, expected: Result<Vec<&str>, ()>| {
            let got = amqp_uris(url).map_err(|_| ());
            let expected = expected.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, expected, "{url}");
        };
        check(
            "rabbit://guest:guest@127.0.0.1:5672/",
            Ok(vec!["amqp://guest:guest@127.0.0.1:5672/%2f"]),
        );
        check(
            "rabbit://u:p@h1:5672,u:p@h2/blazar",
            Ok(vec![
                "amqp://u:p@h1:5672/blazar",
                "amqp://u:p@h2:5672/blazar",
            ]),
        );
        check("rabbit://h", Ok(vec!["amqp://h:5672/%2f"]));
        check(
            "rabbit://u:p@h:5672/blazar?heartbeat=60&ssl=0",
            Ok(vec!["amqp://u:p@h:5672/blazar"]),
        );
        check("rabbit://u:p@h:5671/blazar?ssl=1", Err(()));
        check("rabbit://u:p@h:5671/?ssl=true", Err(()));
        check("rabbit://u:p@h/?ssl=off", Ok(vec!["amqp://u:p@h:5672/%2f"]));
        check("kafka://h:9092/", Err(()));
        check("rabbit:///", Err(()));
    }

    #[test]
    fn the_envelope_is_oslos() {
        let Some(at) = chrono::DateTime::from_timestamp(1_893_492_000, 0) else {
            panic!("valid time");
        };
        let n = Notification {
            id: "m1".into(),
            event_type: "lease.create".into(),
            lease_id: Some("l1".into()),
            payload: json!({"lease_id": "l1", "user_id": "u1", "project_id": "p1"}),
            created_at: at,
            request_id: Some("req-0d1f6c2e-6a55-4c1e-9a2b-3f7a8a1d2c4e".into()),
        };
        let envelope = oslo_message(&n, "blazar.lease");
        assert_eq!(envelope["oslo.version"], "2.0");
        let Some(text) = envelope["oslo.message"].as_str() else {
            panic!("oslo.message is a string");
        };
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            panic!("oslo.message is JSON");
        };
        assert_eq!(message["message_id"], "m1");
        assert_eq!(message["publisher_id"], "blazar.lease");
        assert_eq!(message["event_type"], "lease.create");
        assert_eq!(message["priority"], "INFO");
        assert_eq!(message["timestamp"], "2030-01-01 10:00:00");
        assert_eq!(message["payload"]["lease_id"], "l1");
        assert_eq!(message["_context_project_id"], "p1");
        assert_eq!(
            message["_context_request_id"],
            "req-0d1f6c2e-6a55-4c1e-9a2b-3f7a8a1d2c4e"
        );

        // An event's notification was caused by no request: it names its own.
        let event = Notification {
            request_id: None,
            ..n
        };
        let envelope = oslo_message(&event, "blazar.lease");
        let text = envelope["oslo.message"].as_str().unwrap_or_default();
        let message: Value = serde_json::from_str(text).unwrap_or_default();
        assert_eq!(message["_context_request_id"], "req-m1");
    }
}
