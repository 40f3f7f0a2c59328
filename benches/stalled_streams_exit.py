"""SIGTERM with stalled stream readers: seconds from SIGTERM to the process's exit.

usage: benches/stalled_streams_exit.py BINARY PORT GRACE SUBSCRIBERS
  e.g. python3 benches/stalled_streams_exit.py target/release/colloquy 18771 30 150

Starts BINARY on loopback with a GRACE-second shutdown grace, streams one 5 MB turn slowly, opens
SUBSCRIBERS SubscribeToTask connections that never read (small receive buffers), sends SIGTERM and
times the exit. Bounded: a server still running GRACE + 60 s after SIGTERM is killed."""
import json, os, signal, socket, subprocess, sys, tempfile, time, urllib.request
BIN, PORT, GRACE, N = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
env = dict(os.environ, COLLOQUY_SHUTDOWN__GRACE_SECS=GRACE, COLLOQUY_LIMITS__BODY_BYTES="16000000",
           COLLOQUY_LIMITS__TEXT_BYTES="16000000", RUST_LOG="warn")
srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{PORT}", "--data", tempfile.mkdtemp(),
                        "--echo-chunk-chars", "262144", "--echo-delay-ms", "150"], env=env)
time.sleep(1.5)
def raw(body):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", PORT)); b = json.dumps(body).encode()
    s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n"
              b"Content-Length: %d\r\n\r\n" % len(b) + b); return s
starter = raw({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": {
    "messageId": "m1", "role": "ROLE_USER", "contextId": "long", "parts": [{"text": "x" * 5 * 1024 * 1024}]}}})
time.sleep(0.5)
q = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {"contextId": "long"}}).encode()
tasks = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{PORT}/", q,
    {"Content-Type": "application/json", "A2A-Version": "1.0"})))
task_id = tasks["result"]["tasks"][0]["id"]
subs = [raw({"jsonrpc": "2.0", "id": 3, "method": "SubscribeToTask", "params": {"id": task_id}}) for _ in range(N)]
time.sleep(0.5)
t = time.monotonic(); srv.send_signal(signal.SIGTERM)
try:
    code = srv.wait(timeout=float(GRACE) + 60)
except subprocess.TimeoutExpired:
    srv.kill(); code = "killed (still running GRACE + 60 s after SIGTERM)"
print(f"{BIN}: grace {GRACE} s, {N} stalled subscribers: exit {code} {time.monotonic() - t:.1f} s after SIGTERM")
