"""Drives a lease life on a blazar-server with notifications on, and checks what oslo.messaging's
own NotificationListener receives: every event type of Blazar's, in order, each with Blazar's
envelope and payload. Run by test.sh, which starts the server and the broker's virtual host.
"""

import argparse
import datetime
import re
import sys
import threading
import time
import uuid

import oslo_messaging
import requests
from oslo_config import cfg

PAYLOAD_KEYS = {
    "lease_id", "user_id", "project_id", "trust_id", "start_date", "end_date", "status",
    "reservations", "events", "name", "created_at", "updated_at", "degraded",
}
T_FORMAT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:00\.000000$")
SPACE_FORMAT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{6})?$")


class Collector:
    """The listener's endpoint: keeps every INFO notification it is given."""

    def __init__(self):
        self.received = []
        self.lock = threading.Condition()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        with self.lock:
            self.received.append({
                "ctxt": ctxt, "publisher_id": publisher_id, "event_type": event_type,
                "payload": payload, "metadata": metadata,
            })
            self.lock.notify_all()

    def wait_for(self, count, within, what):
        deadline = time.monotonic() + within
        with self.lock:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [m["event_type"] for m in self.received]
                    fail(f"waited {within} s for {what}; received {kinds}")
                self.lock.wait(left)
            return list(self.received)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def minute(t):
    return t.strftime("%Y-%m-%d %H:%M")


def call(api, method, path, body=None, expect=(200,)):
    response = requests.request(method, api + path, json=body, timeout=30)
    if response.status_code not in expect:
        fail(f"{method} {path}: {response.status_code} {response.text}")
    return response.json() if response.content else None


def lease_request(name, start, end, before_end=None):
    body = {"name": name, "start_date": start, "end_date": end, "events": [],
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                              "hypervisor_properties": "", "resource_properties": ""}]}
    if before_end:
        body["before_end_date"] = before_end
    return body


def check_message(m, lease_id, status):
    where = m["event_type"]
    if m["publisher_id"] != "blazar.lease":
        fail(f"{where}: publisher_id {m['publisher_id']!r}")
    uuid.UUID(m["metadata"]["message_id"])
    if not SPACE_FORMAT.match(m["metadata"]["timestamp"]):
        fail(f"{where}: timestamp {m['metadata']['timestamp']!r}")
    p = m["payload"]
    if set(p) != PAYLOAD_KEYS:
        fail(f"{where}: payload keys {sorted(p)}")
    if p["lease_id"] != lease_id or p["status"] != status:
        fail(f"{where}: lease {p['lease_id']} in {p['status']}, expected {lease_id} in {status}")
    for key in ("start_date", "end_date"):
        if not T_FORMAT.match(p[key]):
            fail(f"{where}: {key} {p[key]!r}")
    if not SPACE_FORMAT.match(p["created_at"]) or p["degraded"] is not False:
        fail(f"{where}: created_at {p['created_at']!r}, degraded {p['degraded']!r}")
    if len(p["reservations"]) != 1 or p["reservations"][0]["resource_type"] != "physical:host":
        fail(f"{where}: reservations {p['reservations']}")
    for e in p["events"]:
        if not T_FORMAT.match(e["time"]) or e["lease_id"] != lease_id:
            fail(f"{where}: event {e}")
    if m["ctxt"].get("project_id") != p["project_id"]:
        fail(f"{where}: context {m['ctxt']}")


def event(payload, kind):
    found = [e for e in payload["events"] if e["event_type"] == kind]
    if len(found) != 1:
        fail(f"expected one {kind} event in {payload['events']}")
    return found[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--transport-url", required=True)
    parser.add_argument("--exchange", default="openstack")
    parser.add_argument("--topic", default="notifications")
    args = parser.parse_args()

    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(args.api + "/healthz", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            fail("blazar-server did not come up")
        time.sleep(0.2)

    conf = cfg.ConfigOpts()
    conf([], project="blazar-notifications-check")
    oslo_messaging.set_transport_defaults(control_exchange=args.exchange)
    transport = oslo_messaging.get_notification_transport(conf, url=args.transport_url)
    collector = Collector()
    listener = oslo_messaging.get_notification_listener(
        transport, [oslo_messaging.Target(topic=args.topic)], [collector], executor="threading")
    listener.start()
    try:
        run(args.api, collector)
    finally:
        listener.stop()
        listener.wait()
        transport.cleanup()
    print("OK: oslo.messaging's NotificationListener received the whole lease life")


def run(api, collector):
    call(api, "POST", "/v1/os-hosts", {"name": "compute-1"}, expect=(201,))
    # Events run on minute boundaries: start early in a minute, so that the first extension
    # comes before the lease-ending notice.
    now = datetime.datetime.now(datetime.timezone.utc)
    if now.second > 40:
        time.sleep(61 - now.second)
        now = datetime.datetime.now(datetime.timezone.utc)
    this_minute = now.replace(second=0, microsecond=0)

    def at(k):
        return minute(this_minute + datetime.timedelta(minutes=k))

    # A dry run and a refused create announce nothing.
    call(api, "POST", "/v1/leases?dry_run=true",
         lease_request("dry", at(60), at(120)), expect=(201,))
    created = requests.post(api + "/v1/leases", json=lease_request("life", "now", at(2), at(1)),
                            timeout=30)
    if created.status_code != 201:
        fail(f"POST /v1/leases: {created.status_code} {created.text}")
    lease = created.json()["lease"]
    create_request_id = created.headers["x-openstack-request-id"]
    lease_id = lease["id"]
    call(api, "POST", "/v1/leases", lease_request("refused", at(1), at(2)), expect=(409,))
    print(f"== lease {lease_id}: created, starting now, ending at {at(3)} after extension")

    got = collector.wait_for(2, 30, "lease.create and the start")
    # The context names the API request that caused the notification.
    if got[0]["ctxt"].get("request_id") != create_request_id:
        fail(f"lease.create: context {got[0]['ctxt']}, the create answered {create_request_id}")
    call(api, "PUT", f"/v1/leases/{lease_id}", {"name": "life-renamed"})
    call(api, "PUT", f"/v1/leases/{lease_id}?dry_run=true", {"end_date": at(30)})
    call(api, "PUT", f"/v1/leases/{lease_id}", {"end_date": at(3), "before_end_date": at(1)})
    got = collector.wait_for(4, 100, "the extension and the lease-ending notice")
    if event(got[3]["payload"], "before_end_lease")["status"] != "DONE":
        fail(f"the notice is not done: {got[3]['payload']['events']}")
    # Moving a notice that went out re-arms it, which Blazar announces.
    call(api, "PUT", f"/v1/leases/{lease_id}", {"before_end_date": at(2)})
    got = collector.wait_for(8, 150, "the re-armed notice and the end")
    call(api, "DELETE", f"/v1/leases/{lease_id}", expect=(200, 204))
    got = collector.wait_for(9, 30, "lease.delete")
    time.sleep(2)
    got = list(collector.received)

    expected = [
        ("lease.create", "PENDING"),
        ("lease.event.start_lease", "ACTIVE"),
        ("lease.update", "UPDATING"),
        ("lease.event.before_end_lease", "ACTIVE"),
        ("lease.update", "UPDATING"),
        ("lease.event.before_end_lease.stop", "UPDATING"),
        ("lease.event.before_end_lease", "ACTIVE"),
        ("lease.event.end_lease", "TERMINATED"),
        ("lease.delete", "DELETING"),
    ]
    seen = [(m["event_type"], m["payload"]["status"]) for m in got]
    if seen != expected:
        fail(f"received {seen}, expected {expected}")
    for m, (_, status) in zip(got, expected):
        check_message(m, lease_id, status)
        print(f"   {m['event_type']:<36} {status:<10} {m['metadata']['timestamp']}")
    if len({m["metadata"]["message_id"] for m in got}) != len(got):
        fail("a message id came twice")
    if got[0]["payload"]["name"] != "life" or got[2]["payload"]["name"] != "life-renamed":
        fail("the names do not follow the rename")
    if got[2]["payload"]["end_date"] != at(3).replace(" ", "T") + ":00.000000":
        fail(f"the extension shows end_date {got[2]['payload']['end_date']}")
    if event(got[5]["payload"], "before_end_lease")["status"] != "UNDONE":
        fail("the re-armed notice is not UNDONE")
    if event(got[7]["payload"], "end_lease")["status"] != "DONE":
        fail("the end event is not DONE in lease.event.end_lease")
    if got[7]["payload"]["reservations"][0]["status"] != "deleted":
        fail(f"reservation after the end: {got[7]['payload']['reservations'][0]['status']}")


if __name__ == "__main__":
    main()
