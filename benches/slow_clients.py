"""Slow-body clients against a colloquy server on loopback, and normal conversations beside them.

usage: benches/slow_clients.py PORT SLOW_CLIENTS SECONDS [length|chunked]
  e.g. prlimit --nofile=256:256 target/release/colloquy serve --listen 127.0.0.1:PORT --data DIR &
       python3 benches/slow_clients.py PORT 300 20
       python3 benches/slow_clients.py PORT 300 20 chunked

`length` (the default): each slow client declares a 1 MB body and drips a byte every 10 ms.
`chunked`: each sends a chunked body's first chunk and never the rest.
For SECONDS, two-turn conversations run beside them. Prints how many conversations succeeded (and
the slowest), what the slow clients got back and when, and when the server closed their
connections. Bounded: the slow clients give up SECONDS + 5 s after starting."""
import asyncio, json, sys, time, urllib.request

PORT = int(sys.argv[1]); N = int(sys.argv[2]); SECONDS = float(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "length"
HEAD = {"length": b"Content-Length: 1000000\r\n\r\n{",
        "chunked": b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n"}[MODE]

async def slow_client(results):
    start = time.monotonic()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", PORT)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"A2A-Version: 1.0\r\n" + HEAD)
        await w.drain()
        async def drip():
            while MODE == "length":
                await asyncio.sleep(0.01)
                w.write(b" "); await w.drain()
        d = asyncio.ensure_future(drip())
        deadline = start + SECONDS + 5
        try:
            line = await asyncio.wait_for(r.readline(), deadline - time.monotonic())
            answered = time.monotonic() - start
            try:
                while await asyncio.wait_for(r.read(4096), max(0.1, deadline - time.monotonic())):
                    pass
                closed = time.monotonic() - start
            except asyncio.TimeoutError:
                closed = None
        except asyncio.TimeoutError:
            line, answered, closed = b"(no answer)", time.monotonic() - start, None
        d.cancel()
        results.append((line.strip().decode(errors="replace"), answered, closed))
        w.close()
    except Exception as e:
        results.append((f"error {type(e).__name__}", time.monotonic() - start, None))

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
    for line, answered, closed in results:
        by.setdefault((line, closed is not None), []).append((answered, closed))
    for (line, was_closed), times in by.items():
        answered = [a for a, _ in times]
        closed = [c for _, c in times if c is not None]
        then = (f"closed by the server after {min(closed):.1f}-{max(closed):.1f} s" if was_closed
                else "held open until the end")
        print(f"slow clients ({MODE}): {len(times)} -> {line!r} after "
              f"{min(answered):.1f}-{max(answered):.1f} s, {then}")

asyncio.run(main())
