#!/usr/bin/env python3
"""Push-notification delivery under load, with a slow receiver.

    benches/push_delivery.py [--tasks 500] [--concurrency 32] [--delay-ms 50] [--binary target/release/colloquy]

Starts `colloquy serve` (echo agent, a fresh data folder, webhooks to loopback allowed) and a
receiver on loopback that answers every notification after --delay-ms. Sends --tasks messages,
--concurrency at a time, each with an inline push config, then waits until every task's
`completed` notification has arrived. Prints notifications received, delivery throughput, and
latency from the task's status timestamp to the notification's arrival (p50/p90/p99/max),
checking that each task's notifications came in order (working before completed) and that no
notification id arrived twice without the same body.

    benches/push_delivery.py --idle [--tasks 5000] [--measure-s 20] [--url-bytes N] [--binary ...]

The idle case: every webhook points at a loopback port nobody listens on, with retries
five to ten minutes apart, so --tasks sends leave 2 x --tasks notifications pending. Once each
task's first notification has had its one attempt, reads the server's CPU time (utime + stime of
/proc/<pid>/stat) and resident memory over --measure-s seconds of idleness and prints them.
"""

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_time(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def start_server(binary, env):
    data = tempfile.mkdtemp()
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data", data],
        env=dict(os.environ, COLLOQUY_PUSH__ALLOW_PRIVATE_NETWORKS="true", **env),
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    return server, port, data


def send_with_hook(port, i, hook):
    request = {
        "jsonrpc": "2.0",
        "id": i,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": f"m{i}", "role": "ROLE_USER", "parts": [{"text": f"task {i}"}]},
            "configuration": {"taskPushNotificationConfig": {"url": hook, "token": "t"}},
        },
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/",
        json.dumps(request).encode(),
        {"Content-Type": "application/json", "A2A-Version": "1.0"},
    )
    reply = json.load(urllib.request.urlopen(req, timeout=60))
    return reply["result"]["task"]["id"]


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def resident_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle(args):
    """Many notifications pending for a receiver that is down: the idle server's CPU."""
    hook = f"http://127.0.0.1:{free_port()}/hook"  # nobody listens: connection refused
    hook += "x" * max(0, args.url_bytes - len(hook))
    env = {
        "COLLOQUY_PUSH__RETRY_BASE_MS": "600000",
        "COLLOQUY_PUSH__RETRY_MAX_MS": "600000",
    }
    server, port, data = start_server(args.binary, env)
    try:
        started = time.time()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda i: send_with_hook(port, i, hook), range(args.tasks)))
        sent_s = time.time() - started
        # Each task's first notification fails once (its second waits behind it).
        while metric(port, "colloquy_push_failed_total") < args.tasks:
            time.sleep(0.5)
        settled_s = time.time() - started
        time.sleep(args.settle_s)
        cpu_before, scanned_before = cpu_seconds(server.pid), metric(port, "colloquy_push_scanned_total")
        time.sleep(args.measure_s)
        cpu = cpu_seconds(server.pid) - cpu_before
        scanned = metric(port, "colloquy_push_scanned_total") - scanned_before
        print(
            json.dumps(
                {
                    "case": "idle",
                    "tasks": args.tasks,
                    "url_bytes": len(hook),
                    "pending": metric(port, "colloquy_push_pending"),
                    "sends_s": round(sent_s, 2),
                    "first_attempts_done_s": round(settled_s, 2),
                    "measured_s": args.measure_s,
                    "cpu_s": round(cpu, 3),
                    "cpu_percent_of_a_core": round(100 * cpu / args.measure_s, 2),
                    "records_read": scanned,
                    "rss_mb": round(resident_mb(server.pid), 1),
                }
            )
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=int, default=50)
    parser.add_argument("--binary", default="target/release/colloquy")
    parser.add_argument("--idle", action="store_true")
    parser.add_argument("--measure-s", type=float, default=20)
    parser.add_argument("--settle-s", type=float, default=2, help="idle case: wait before measuring")
    parser.add_argument("--url-bytes", type=int, default=0, help="pad the idle case's webhook URL")
    args = parser.parse_args()
    if args.idle:
        return idle(args)

    arrivals = queue.Queue()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            arrived = time.time()
            time.sleep(args.delay_ms / 1000)
            arrivals.put((arrived, self.headers.get("X-Colloquy-Notification-Id"), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", free_port()), Receiver)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_port}/hook"

    server, port, data = start_server(args.binary, {})
    url = f"http://127.0.0.1:{port}/"
    try:
        def send(i):
            request = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": f"m{i}",
                        "role": "ROLE_USER",
                        "parts": [{"text": f"task {i}"}],
                    },
                    "configuration": {"taskPushNotificationConfig": {"url": hook, "token": "t"}},
                },
            }
            req = urllib.request.Request(
                url,
                json.dumps(request).encode(),
                {"Content-Type": "application/json", "A2A-Version": "1.0"},
            )
            reply = json.load(urllib.request.urlopen(req, timeout=60))
            return reply["result"]["task"]["id"]

        started = time.time()
        with ThreadPoolExecutor(args.concurrency) as pool:
            task_ids = set(pool.map(send, range(args.tasks)))
        sent_s = time.time() - started

        seen = {}
        latencies = []
        completed = set()
        ids = {}
        deadline = time.time() + 300
        while completed != task_ids and time.time() < deadline:
            try:
                arrived, note_id, body = arrivals.get(timeout=1)
            except queue.Empty:
                continue
            task = json.loads(body)["task"]
            if note_id in ids:
                assert ids[note_id] == body, "a retried notification changed"
                continue
            ids[note_id] = body
            state = task["status"]["state"]
            seen.setdefault(task["id"], []).append(state)
            latencies.append(arrived - parse_time(task["status"]["timestamp"]))
            if state == "TASK_STATE_COMPLETED":
                completed.add(task["id"])
        elapsed = time.time() - started
        in_order = all(states[-1] == "TASK_STATE_COMPLETED" and states[0] == "TASK_STATE_WORKING" for states in seen.values())
        ms = [1000 * l for l in latencies]
        print(
            json.dumps(
                {
                    "tasks": args.tasks,
                    "receiver_delay_ms": args.delay_ms,
                    "sends_s": round(sent_s, 2),
                    "notifications": len(ids),
                    "tasks_completed_notified": len(completed),
                    "all_delivered_s": round(elapsed, 2),
                    "notifications_per_s": round(len(ids) / elapsed, 1),
                    "latency_ms": {
                        "p50": round(percentile(ms, 0.5), 1),
                        "p90": round(percentile(ms, 0.9), 1),
                        "p99": round(percentile(ms, 0.99), 1),
                        "max": round(max(ms), 1),
                    },
                    "in_order": in_order,
                }
            )
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
        receiver.shutdown()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
