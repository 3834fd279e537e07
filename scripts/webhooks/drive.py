"""Steps 3-6 of bench-webhooks.sh: the backlog, the idle window, the healthy endpoint.
Standard library only."""

import argparse
import http.client
import json
import os
import sqlite3
import threading
import time
from contextlib import closing

FAILING = ["/fail-400/a", "/fail-400/b", "/hang/a", "/hang/b", "/endless"]


def call(port, method, path, body=None, conn=None):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body and json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def add_webhook(port, url):
    status, data = call(port, "POST", "/v1/webhooks", {"url": url, "all_projects": True})
    if status not in (200, 201):
        raise SystemExit(f"POST /v1/webhooks {url}: {status} {data[:200]!r}")


def create_leases(port, names, threads=16):
    """One reservation-less lease per name, THREADS at a time; returns the failures."""
    todo, failures, lock = list(names), [], threading.Lock()

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
            body = {"name": name, "start_date": "2030-01-01 10:00",
                    "end_date": "2030-01-01 11:00", "events": [], "reservations": []}
            try:
                status, data = call(port, "POST", "/v1/leases", body, conn)
            except (OSError, http.client.HTTPException) as e:
                conn.close()  # reconnects on the next request
                status, data = None, str(e).encode()
            if status not in (200, 201, 202):
                failures.append(f"{name}: {status} {data[:200]!r}")

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    [w.start() for w in workers]
    [w.join() for w in workers]
    return failures


def counts(port):
    return json.loads(call(port, "GET", "/_counts")[1])


def refused_attempts(db, url):
    """A closed port counts nothing, so read the server's own count (None if unreadable)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as c:
            return c.execute("SELECT coalesce(sum(d.attempts), 0) FROM webhook_deliveries d JOIN "
                             "webhooks w ON w.id = d.webhook_id WHERE w.url = ?", (url,)).fetchone()[0]
    except sqlite3.Error:
        return None


def proc(pid):
    """(monotonic time, CPU seconds used, RSS MiB) of PID."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])  # utime, stime
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), rss / 1024


def main(a):
    base, refused = f"http://127.0.0.1:{a.endpoints}", f"http://127.0.0.1:{a.refused}/refused"
    print("3. six failing webhooks and the leases ...", flush=True)
    started = time.monotonic()
    for url in [base + p for p in FAILING] + [refused]:
        add_webhook(a.port, url)
    failures = create_leases(a.port, [f"b{i}" for i in range(a.leases)])
    for f in failures[:3]:
        print("  failed:", f)
    pending = next(float(line.split()[1]) for line in call(a.port, "GET", "/metrics")[1].decode()
                   .splitlines() if line.startswith("blazar_webhook_deliveries_pending "))
    print(f"  {a.leases - len(failures)} leases, {len(failures)} failed; pending deliveries "
          f"{pending:.0f} (expected {a.leases * 6})\n  done in {time.monotonic() - started:.1f} s")

    print(f"4. {a.window} s with no API traffic: server CPU, RSS, attempts ...", flush=True)
    before, refused_before = counts(a.endpoints)["counts"], refused_attempts(a.db, refused)
    start, cpu, rss = proc(a.pid)
    t, cores, rsss = start, [], [rss]
    while t - start < a.window - 0.01:
        time.sleep(min(5, a.window - (t - start)))
        t1, cpu1, rss = proc(a.pid)
        cores.append((cpu1 - cpu) / (t1 - t))
        rsss.append(rss)
        print(f"  t={t1 - start:5.1f} s  cores {cores[-1]:.3f}  RSS {rss:.1f} MiB", flush=True)
        t, cpu = t1, cpu1
    window = t - start
    after, refused_after = counts(a.endpoints)["counts"], refused_attempts(a.db, refused)
    attempts = {p: after.get(p, 0) - before.get(p, 0) for p in FAILING}
    if None not in (refused_before, refused_after):
        attempts["/refused (server's count)"] = refused_after - refused_before
    print(f"  done in {window:.1f} s")

    print("5. a healthy webhook and 20 leases ...", flush=True)
    add_webhook(a.port, base + "/ok")
    names, seen = {f"b{a.leases + i}" for i in range(20)}, {}
    first_post = time.time()  # wall clock: the endpoints stamp arrivals with time.time()
    failures = create_leases(a.port, names, threads=4)
    while len(seen) < len(names) and time.time() - first_post < 120:
        time.sleep(0.2)
        seen = {n: t for t, n in counts(a.endpoints)["arrivals"] if n in names}
    print(f"  {len(seen)}/20 arrived, {len(failures)} creates failed\n"
          f"  done in {time.time() - first_post:.1f} s")

    mean, total = sum(cores) / len(cores), sum(attempts.values())
    print(f"\nsummary: {a.leases} leases, six failing webhooks, window {window:.0f} s")
    print(f"  pending deliveries       {pending:.0f}")
    print(f"  server CPU, cores        mean {mean:.3f}, max {max(cores):.3f} ({len(cores)} samples)")
    print(f"  server RSS, max          {max(rsss):.1f} MiB")
    print("  attempts/s in the window")
    for path, n in attempts.items():
        print(f"    {path:28} {n / window:7.2f}  ({n})")
    per = f"{mean * window / total * 1000:.1f} ms" if total else "n/a"
    print(f"  CPU per attempt          {per} ({total} attempts)")
    if len(seen) == len(names):
        arrived = sorted(t - first_post for t in seen.values())
        print(f"  healthy endpoint         first {arrived[0]:.2f} s, last {arrived[-1]:.2f} s "
              "after the first POST")
    else:
        print(f"  healthy endpoint         gave up after 120 s, {len(seen)}/20 arrived")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for name in ("port", "pid", "endpoints", "refused", "leases", "window"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--db", required=True)
    main(p.parse_args())
