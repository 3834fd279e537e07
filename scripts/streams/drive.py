"""Lease creates while event streams are open, and what idle streams cost the server.

    drive.py --port P --pid PID --streams N --creates M [--projects K]

Opens N `GET /v1/leases/events` streams (spread over K projects, as members), then makes M
one-host lease creates one after another (each in the next free hour of the year 2030,
in turn for each project) and prints create latency and how many events the streams got
(each create is one event for every stream of its project). Then, streams still open and
nothing happening, the server's CPU over 20 s. Standard library only.
"""

import argparse
import asyncio
import json
import statistics
import time
import urllib.request


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def create(port, k, project):
    day, hour = 1 + k // 24 % 28, k % 24
    body = {
        "name": f"stream-bench-{k}",
        "start_date": f"2030-{1 + k // 672 % 12:02d}-{day:02d} {hour:02d}:00",
        "end_date": f"2030-{1 + k // 672 % 12:02d}-{day:02d} {hour:02d}:30",
        "events": [],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "hypervisor_properties": "", "resource_properties": ""}],
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/leases", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-Project-Id": project,
                 "X-User-Id": "bench", "X-Roles": "member"})
    started = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


async def stream(port, project, received):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"GET /v1/leases/events HTTP/1.1\r\nHost: bench\r\nX-Project-Id: {project}"
                  "\r\nX-User-Id: bench\r\nX-Roles: member\r\n\r\n").encode())
    await writer.drain()
    while True:
        line = await reader.readline()
        if not line:
            return
        if line.startswith(b"data:"):
            received[0] += 1


async def main(args):
    received = [0]
    tasks = [asyncio.create_task(stream(args.port, f"p{i % args.projects}", received))
             for i in range(args.streams)]
    await asyncio.sleep(3)
    loop = asyncio.get_running_loop()
    latencies = []
    for k in range(args.creates):
        project = f"p{k % args.projects}"
        latencies.append(await loop.run_in_executor(
            None, create, args.port, args.offset + k, project))
    await asyncio.sleep(3)
    latencies.sort()
    expected = sum(1 for k in range(args.creates) for i in range(args.streams)
                   if i % args.projects == k % args.projects)
    before, at = cpu_seconds(args.pid), time.time()
    await asyncio.sleep(20)
    idle = 100 * (cpu_seconds(args.pid) - before) / (time.time() - at)
    print(f"| {args.streams} | {statistics.median(latencies):.1f} | "
          f"{latencies[int(len(latencies) * 0.9)]:.1f} | {received[0]} of {expected} | {idle:.1f} % |")
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--creates", type=int, default=200)
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--offset", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
