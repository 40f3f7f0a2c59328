"""Slow-body clients against a colloquy server on loopback, and normal conversations beside them.

usage: benches/slow_clients.py PORT SLOW_CLIENTS SECONDS
  e.g. prlimit --nofile=256:256 target/release/colloquy serve --listen 127.0.0.1:PORT --data DIR &
       python3 benches/slow_clients.py PORT 300 20

Each slow client declares a 1 MB body and drips a byte every 10 ms; for SECONDS, two-turn
conversations run beside them. Prints how many conversations succeeded (and the slowest), and what
the slow clients got back, when. Bounded: the slow clients give up SECONDS + 5 s after starting."""
import asyncio, json, sys, time, urllib.request

PORT = int(sys.argv[1]); N = int(sys.argv[2]); SECONDS = float(sys.argv[3])

async def slow_client(results):
    start = time.monotonic()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", PORT)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"A2A-Version: 1.0\r\nContent-Length: 1000000\r\n\r\n{")
        await w.drain()
        async def drip():
            while True:
                await asyncio.sleep(0.01)
                w.write(b" "); await w.drain()
        d = asyncio.ensure_future(drip())
        try:
            line = await asyncio.wait_for(r.readline(), SECONDS + 5)
        except asyncio.TimeoutError:
            line = b"(held until the end)"
        d.cancel()
        results.append((line.strip().decode(errors="replace"), time.monotonic() - start))
        w.close()
    except Exception as e:
        results.append((f"error {type(e).__name__}", time.monotonic() - start))

def rpc(text, ctx=None):
    msg = {"messageId": f"m{time.time_ns()}", "role": "ROLE_USER", "parts": [{"text": text}]}
    if ctx: msg["contextId"] = ctx
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": msg}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/", body,
        {"Content-Type": "application/json", "A2A-Version": "1.0"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)

async def normal(stats):
    end = time.monotonic() + SECONDS
    loop = asyncio.get_running_loop()
    while time.monotonic() < end:
        t = time.monotonic()
        try:
            first = await loop.run_in_executor(None, rpc, "hello")
            ctx = first["result"]["task"]["contextId"]
            second = await loop.run_in_executor(None, rpc, "again", ctx)
            ok = "previously" in json.dumps(second)
            stats.append(("ok" if ok else "wrong", time.monotonic() - t))
        except Exception as e:
            stats.append((f"error {type(e).__name__}: {e}"[:60], time.monotonic() - t))
        await asyncio.sleep(0.2)

async def main():
    results, stats = [], []
    slow = [asyncio.ensure_future(slow_client(results)) for _ in range(N)]
    await asyncio.sleep(1)
    await normal(stats)
    await asyncio.gather(*slow)
    ok = [d for s, d in stats if s == "ok"]
    print(f"normal two-turn conversations: {len(ok)} ok of {len(stats)};",
          f"max {max(ok):.2f} s" if ok else "", "; errors:", sorted(set(s for s, _ in stats if s != 'ok'))[:3])
    by = {}
    for line, d in results: by.setdefault(line, []).append(d)
    for line, ds in by.items():
        print(f"slow clients: {len(ds)} -> {line!r} after {min(ds):.1f}-{max(ds):.1f} s")

asyncio.run(main())
