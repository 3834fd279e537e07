//! Nova's notifications as a trigger of the host monitor (Blazar's notification monitor,
//! `[physical:host] enable_notification_monitor`): when Nova says a compute service was
//! disabled, forced down, enabled again, created or deleted (`service.update`,
//! `service.create`, `service.delete`), the monitor runs a pass at once instead of at its
//! next interval. And of the reconciler: when someone other than blazar-rs changes an
//! aggregate, a flavor or deletes a server group (what the reconciler repairs), it runs a
//! pass at once, so that a host taken out of its reservation's aggregate by hand is in no
//! pool (where BlazarFilter admits any project) for seconds, not a reconcile interval.
//!
//! A notification only wakes the monitor or the reconciler; the pass reads the cloud as a
//! timed pass does. So the order in which notifications arrive, duplicates, and those
//! lost while the broker was away do not matter: the pass sees the cloud as it is, and
//! the timed passes go on as before.
//!
//! Nova publishes them as oslo.messaging does: an envelope `{"oslo.version": "2.0",
//! "oslo.message": "<json>"}` on the topic exchange `nova` (its `control_exchange`), routing
//! key `<topic>.<priority>`, `service.update` on `versioned_notifications.info` when Nova's
//! `[notifications] notification_format` is `versioned` or `both`. Blazar's listener reads
//! the queue of that name, which Nova's notifier declares and which any other consumer of
//! Nova's notifications shares (each message goes to one of them). blazar-rs binds a queue
//! of its own instead (oslo.messaging's listener pools do the same), so that it takes
//! nothing from the other consumers; the replicas share it (each notification wakes one of
//! them), and it goes away with its last consumer, so that nothing piles up in it while no
//! blazar-rs listens.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::Value;
use tokio::sync::Notify;

use crate::notifier::amqp_uris;

/// The queue blazar-rs binds to Nova's exchange, shared by its replicas.
pub const MONITOR_QUEUE: &str = "blazar-rs.host-monitor";

/// Where Nova's notifications are read from.
#[derive(Debug, Clone, PartialEq)]
pub struct NovaEventSettings {
    /// oslo.messaging's transport URL of the broker Nova publishes to.
    pub transport_url: String,
    /// Nova's `control_exchange`.
    pub exchange: String,
    /// Blazar's `[physical:host] notification_topics`: every priority of each is read.
    pub topics: Vec<String>,
    /// Longest a connect and the declarations may take.
    pub timeout: Duration,
}

impl Default for NovaEventSettings {
    fn default() -> Self {
        NovaEventSettings {
            transport_url: String::new(),
            exchange: "nova".into(),
            topics: vec!["notifications".into(), "versioned_notifications".into()],
            timeout: Duration::from_secs(10),
        }
    }
}

/// The priorities oslo.messaging routes a notification by, each a routing key suffix;
/// Blazar's endpoint listens to these three.
const PRIORITIES: [&str; 3] = ["info", "warn", "error"];

/// How long the monitor's queue outlives its last use when no consumer ever came.
const QUEUE_EXPIRES_MS: u32 = 30 * 60 * 1000;

/// The longest message read: Nova's service notifications are a few KiB.
const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// A change of a compute service, as a notification tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChange {
    /// `service.update`, `service.create` or `service.delete`.
    pub event_type: String,
    /// The service's host (the compute service name).
    pub host: String,
    pub disabled: bool,
    pub forced_down: bool,
}

/// What a notification calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A compute service changed: a host monitor pass.
    Monitor(ServiceChange),
    /// Something the reconciler keeps was changed by someone else (the event type): a
    /// reconciler pass.
    Reconciler(String),
}

/// What the message (Nova's notification) calls for, if anything. `own_user` is the id of
/// the user blazar-rs acts as: its own changes to aggregates and flavors (every lease start
/// and end makes some) call for nothing.
pub fn trigger(body: &[u8], own_user: Option<&str>) -> Option<Trigger> {
    let message = message(body)?;
    if let Some(change) = service_change(&message) {
        return Some(Trigger::Monitor(change));
    }
    let event_type = message.get("event_type")?.as_str()?;
    // The versioned names, then the unversioned ones (Nova's default format, which has no
    // flavor events; `aggregate.delete.end` is the same in both).
    let kept = matches!(
        event_type,
        "aggregate.add_host.end"
            | "aggregate.remove_host.end"
            | "aggregate.delete.end"
            | "aggregate.update_metadata.end"
            | "aggregate.update_prop.end"
            | "flavor.update"
            | "flavor.delete"
            | "server_group.delete"
            | "aggregate.addhost.end"
            | "aggregate.removehost.end"
            | "aggregate.updatemetadata.end"
            | "aggregate.updateprop.end"
            | "servergroup.delete"
    );
    let by = message.get("_context_user_id").and_then(Value::as_str);
    (kept && (own_user.is_none() || by != own_user))
        .then(|| Trigger::Reconciler(event_type.to_string()))
}

/// The message of a notification, whichever of oslo's formats it came in.
fn message(body: &[u8]) -> Option<Value> {
    if body.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let outer: Value = serde_json::from_slice(body).ok()?;
    // messagingv2 wraps the message as a string; the older format sends it as it is.
    match outer.get("oslo.message").and_then(Value::as_str) {
        Some(inner) => serde_json::from_str(inner).ok(),
        None => Some(outer),
    }
}

/// The compute-service change a message tells of, if it tells of one. Other events and
/// other services' changes are `None`.
fn service_change(message: &Value) -> Option<ServiceChange> {
    let event_type = message.get("event_type")?.as_str()?;
    if !matches!(
        event_type,
        "service.update" | "service.create" | "service.delete"
    ) {
        return None;
    }
    let data = message.get("payload")?.get("nova_object.data")?;
    // Only compute services carry hosts; a scheduler or conductor disabled is no host's
    // failure. A payload without the field is taken as a compute service's.
    if data
        .get("binary")
        .and_then(Value::as_str)
        .is_some_and(|b| b != "nova-compute")
    {
        return None;
    }
    let flag = |key: &str| data.get(key).and_then(Value::as_bool).unwrap_or(false);
    Some(ServiceChange {
        event_type: event_type.to_string(),
        host: data.get("host")?.as_str()?.to_string(),
        disabled: flag("disabled"),
        forced_down: flag("forced_down"),
    })
}

/// Whom a notification wakes.
#[derive(Debug, Clone, Default)]
pub struct Wakes {
    /// The host monitor's loop.
    pub monitor: Arc<Notify>,
    /// The reconciler's loop, if it runs here.
    pub reconciler: Option<Arc<Notify>>,
}

/// Reads Nova's notifications until `shutdown`, waking the monitor at each compute-service
/// change and the reconciler at each change by others of what it keeps. Connects again,
/// after a pause that grows to a minute, whenever the broker is away or the connection
/// drops; the timed passes cover what was missed meanwhile.
pub async fn listen(
    settings: NovaEventSettings,
    wake: Wakes,
    who: crate::Session,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let uris = match amqp_uris(&settings.transport_url) {
        Ok(uris) => uris,
        Err(e) => {
            tracing::error!(error = %e, "Nova's notifications cannot be read");
            return;
        }
    };
    let mut next = 0usize;
    let mut pause = Duration::from_secs(1);
    // The id of the user blazar-rs acts as in the cloud, once Keystone has said (see
    // [`trigger`]). Asked beside the reading until Keystone answers: meanwhile every change
    // wakes the reconciler (correct, only more passes), and a Keystone that was away at
    // start must not leave it so for the process's life.
    let own_user = Arc::new(OnceLock::new());
    let asking = tokio::spawn(learn_own_user(who, own_user.clone(), settings.timeout));
    let _stop_asking = AbortOnDrop(asking);
    loop {
        let uri = &uris[next % uris.len()];
        let started = tokio::time::Instant::now();
        let outcome = tokio::select! {
            outcome = read(&settings, uri, next % uris.len(), &wake, &own_user) => outcome,
            () = &mut shutdown => return,
        };
        match outcome {
            // Was reading when the connection went: again after a short pause, growing only
            // if reading keeps ending as soon as it starts.
            Ok(lost) => {
                tracing::warn!(reason = %lost,
                    "Nova's notifications: connection lost; connecting again");
                pause = if started.elapsed() >= Duration::from_secs(30) {
                    Duration::from_secs(1)
                } else {
                    (pause * 2).min(Duration::from_secs(60))
                };
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = &mut shutdown => return,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_s = pause.as_secs(),
                    "Nova's notifications: broker connection failed; the monitor's timed passes go on");
                next += 1;
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = &mut shutdown => return,
                }
                pause = (pause * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Aborts its task when dropped (the listener returning).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Asks Keystone who blazar-rs is in the cloud until it answers, pausing from 5 s to a
/// minute between tries.
async fn learn_own_user(who: crate::Session, own_user: Arc<OnceLock<String>>, timeout: Duration) {
    let mut pause = Duration::from_secs(5);
    loop {
        match tokio::time::timeout(timeout, who.user_id()).await {
            Ok(Ok(id)) => {
                let _ = own_user.set(id);
                return;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, retry_in_s = pause.as_secs(),
                "Nova's notifications: the service user's id is unknown for now; \
                 blazar-rs's own changes wake the reconciler too"),
            Err(_) => tracing::warn!(
                retry_in_s = pause.as_secs(),
                "Nova's notifications: Keystone did not say who the service user is; \
                 blazar-rs's own changes wake the reconciler too"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

/// One connection's life: declarations, then every message until the broker or the
/// connection stops the consumer. `Ok` with why reading stopped once it had started;
/// `Err` when it could not start.
async fn read(
    settings: &NovaEventSettings,
    uri: &str,
    host: usize,
    wake: &Wakes,
    own_user: &OnceLock<String>,
) -> Result<String, String> {
    let (connection, channel) = tokio::time::timeout(settings.timeout, connect(settings, uri))
        .await
        .map_err(|_| format!("no answer within {} s", settings.timeout.as_secs()))?
        .map_err(|e| e.to_string())?;
    let outcome = consume(&channel, settings, host, wake, own_user).await;
    // Closed whichever way reading ended: a dropped connection could keep its socket.
    let _ = connection.close(200, "blazar-rs reads again".into()).await;
    outcome
}

/// Every message until the broker or the connection stops the consumer.
async fn consume(
    channel: &Channel,
    settings: &NovaEventSettings,
    host: usize,
    wake: &Wakes,
    own_user: &OnceLock<String>,
) -> Result<String, String> {
    let mut consumer = channel
        .basic_consume(
            MONITOR_QUEUE.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("consuming {MONITOR_QUEUE}: {e}"))?;
    tracing::info!(broker.host = host, exchange = %settings.exchange, topics = ?settings.topics,
        queue = MONITOR_QUEUE, "listening to Nova's notifications");
    while let Some(delivery) = consumer.next().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(e) => return Ok(format!("reading {MONITOR_QUEUE}: {e}")),
        };
        match trigger(&delivery.data, own_user.get().map(String::as_str)) {
            Some(Trigger::Monitor(change)) => {
                tracing::info!(event_type = %change.event_type, host = %change.host,
                    disabled = change.disabled, forced_down = change.forced_down,
                    "Nova: a compute service changed; host monitor pass now");
                wake.monitor.notify_one();
            }
            Some(Trigger::Reconciler(event_type)) => {
                if let Some(reconciler) = &wake.reconciler {
                    tracing::info!(%event_type, "Nova: changed by someone else; reconciler pass now");
                    reconciler.notify_one();
                }
            }
            None => {}
        }
        // Read or not, it is done with: nothing is gained by reading it again.
        if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
            return Ok(format!("acknowledging: {e}"));
        }
    }
    Ok("the broker ended the consumer".into())
}

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Broker(#[from] lapin::Error),
    #[error(
        "no exchange {0:?} on this virtual host ({1}): is the transport URL the one Nova \
         publishes to, and the exchange Nova's control_exchange?"
    )]
    NotNova(String, lapin::Error),
}
use ConnectError::NotNova;

/// Connects, checks that Nova's exchange is there, declares the monitor's queue, and binds
/// it to every topic and priority.
async fn connect(
    settings: &NovaEventSettings,
    uri: &str,
) -> Result<(Connection, Channel), ConnectError> {
    let connection = Connection::connect(
        uri,
        ConnectionProperties::default().with_connection_name("blazar-rs host monitor".into()),
    )
    .await?;
    let channel = connection.create_channel().await?;
    // Nova's exchange is Nova's: declared by its services (its RPC uses it too) with its own
    // durability. Declaring it here could set what Nova then fails to declare; only
    // whether it is there is asked.
    channel
        .exchange_declare(
            settings.exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| NotNova(settings.exchange.clone(), e))?;
    channel.basic_qos(32, BasicQosOptions::default()).await?;
    // Gone with its last consumer, or, if none ever came (a replica stopped between this
    // and consuming), half an hour after its last use: nothing piles up in it unread.
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongUInt(QUEUE_EXPIRES_MS));
    channel
        .queue_declare(
            MONITOR_QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await?;
    for topic in &settings.topics {
        for priority in PRIORITIES {
            let key = format!("{topic}.{priority}");
            channel
                .queue_bind(
                    MONITOR_QUEUE.into(),
                    settings.exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
    }
    Ok((connection, channel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The compute-service change `body` tells the monitor of, as the listener reads it.
    fn service_change(body: &[u8]) -> Option<ServiceChange> {
        match trigger(body, None) {
            Some(Trigger::Monitor(change)) => Some(change),
            _ => None,
        }
    }

    /// Nova's `service.update` as oslo.messaging's messagingv2 notifier sends it.
    fn nova_message(event_type: &str, data: Value) -> Vec<u8> {
        let message = json!({
            "message_id": "5a4e8c1a-58b0-4a42-9d2f-2c1f2b0f7d10",
            "publisher_id": "nova-compute:compute-2",
            "event_type": event_type,
            "priority": "INFO",
            "payload": {
                "nova_object.name": "ServiceStatusPayload",
                "nova_object.namespace": "nova",
                "nova_object.version": "1.1",
                "nova_object.data": data,
            },
            "timestamp": "2030-01-01 10:00:00.123456",
        });
        json!({"oslo.version": "2.0", "oslo.message": message.to_string()})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn compute_service_changes_are_read() {
        let data = json!({"host": "compute-2", "binary": "nova-compute", "disabled": true,
            "forced_down": false, "disabled_reason": "maintenance", "topic": "compute"});
        assert_eq!(
            service_change(&nova_message("service.update", data)),
            Some(ServiceChange {
                event_type: "service.update".into(),
                host: "compute-2".into(),
                disabled: true,
                forced_down: false,
            })
        );
        let down = json!({"host": "compute-1", "binary": "nova-compute", "disabled": false,
            "forced_down": true});
        let change = service_change(&nova_message("service.update", down));
        assert!(change.is_some_and(|c| c.forced_down && c.host == "compute-1"));
        let gone = json!({"host": "compute-3", "binary": "nova-compute", "disabled": false});
        assert!(service_change(&nova_message("service.delete", gone)).is_some());

        // The older format: the message itself, not wrapped.
        let plain = json!({"event_type": "service.update", "payload": {"nova_object.data":
            {"host": "compute-4", "binary": "nova-compute", "disabled": false}}});
        let change = service_change(plain.to_string().as_bytes());
        assert!(change.is_some_and(|c| c.host == "compute-4" && !c.disabled));
    }

    /// A notification of Nova's caused by `user`.
    fn by(event_type: &str, user: &str) -> Vec<u8> {
        let message = json!({"event_type": event_type, "priority": "INFO",
            "_context_user_id": user, "payload": {"nova_object.data": {"name": "r1"}}});
        json!({"oslo.version": "2.0", "oslo.message": message.to_string()})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn others_changes_to_what_the_reconciler_keeps_wake_it() {
        for event in [
            "aggregate.remove_host.end",
            "aggregate.add_host.end",
            "aggregate.delete.end",
            "aggregate.update_metadata.end",
            "aggregate.update_prop.end",
            "flavor.update",
            "flavor.delete",
            "server_group.delete",
            // Unversioned.
            "aggregate.removehost.end",
            "aggregate.addhost.end",
            "aggregate.updatemetadata.end",
            "aggregate.updateprop.end",
            "servergroup.delete",
        ] {
            assert_eq!(
                trigger(&by(event, "operator"), Some("blazar")),
                Some(Trigger::Reconciler(event.into())),
                "{event}"
            );
            // blazar-rs's own, from every lease start and end: nothing to repair.
            assert_eq!(
                trigger(&by(event, "blazar"), Some("blazar")),
                None,
                "{event}"
            );
            // Not knowing who it is, everything wakes it.
            assert!(trigger(&by(event, "blazar"), None).is_some(), "{event}");
        }
        for event in [
            "aggregate.remove_host.start",
            "aggregate.cache_images.end",
            "flavor.create",
            "instance.create.end",
        ] {
            assert_eq!(
                trigger(&by(event, "operator"), Some("blazar")),
                None,
                "{event}"
            );
        }
        let data = json!({"host": "compute-2", "binary": "nova-compute", "disabled": true});
        assert!(matches!(
            trigger(&nova_message("service.update", data), Some("blazar")),
            Some(Trigger::Monitor(_))
        ));
    }

    #[test]
    fn everything_else_is_left_alone() {
        let scheduler = json!({"host": "controller", "binary": "nova-scheduler",
            "disabled": true});
        assert_eq!(
            service_change(&nova_message("service.update", scheduler)),
            None
        );
        let instance = json!({"host": "compute-1", "binary": "nova-compute"});
        assert_eq!(
            service_change(&nova_message("instance.create.end", instance)),
            None
        );
        // The unversioned format has no service events and no nova_object payload.
        let legacy = json!({"event_type": "service.update", "payload": {"host": "compute-1"}});
        assert_eq!(service_change(legacy.to_string().as_bytes()), None);
        assert_eq!(service_change(b"not json"), None);
        assert_eq!(service_change(br#"{"oslo.message": "{broken"}"#), None);
        let mut huge = b"{\"pad\": \"".to_vec();
        huge.resize(MAX_MESSAGE_BYTES + 1, b'x');
        assert_eq!(service_change(&huge), None);
    }
}
