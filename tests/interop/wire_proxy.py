#!/usr/bin/env python3
"""Tiny logging reverse proxy (stdlib only) used to capture the exact A2A wire traffic.

    python3 tests/interop/wire_proxy.py --listen 9200 --upstream http://127.0.0.1:9101 --log /tmp/wire.log

Logs every request (method, path, all headers, body) and response (status, headers, body;
SSE bodies are relayed and logged chunk by chunk). In the agent card response the upstream
host:port is rewritten to the proxy's, so clients keep talking through the proxy.
"""
import argparse
import http.client
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--listen', type=int, required=True)
    ap.add_argument('--upstream', required=True)
    ap.add_argument('--log', default='-')
    a = ap.parse_args()
    up = urllib.parse.urlparse(a.upstream)
    out = sys.stdout if a.log == '-' else open(a.log, 'a', buffering=1)
    up_hostport = f'{up.hostname}:{up.port}'
    me_hostport = f'127.0.0.1:{a.listen}'

    def log(s: str) -> None:
        with LOCK:
            out.write(s + '\n')

    class H(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def log_message(self, *args):
            pass

        def _do(self):
            n = int(self.headers.get('Content-Length') or 0)
            body = self.rfile.read(n) if n else b''
            hdrs = '\n'.join(f'{k}: {v}' for k, v in self.headers.items())
            log(f'>>> {self.command} {self.path}\n{hdrs}\n\n{body.decode(errors="replace")}\n')
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            fwd = {k: v for k, v in self.headers.items() if k.lower() not in ('host', 'connection')}
            fwd['Host'] = up_hostport
            conn.request(self.command, self.path, body=body, headers=fwd)
            r = conn.getresponse()
            rh = '\n'.join(f'{k}: {v}' for k, v in r.getheaders())
            log(f'<<< {r.status} {r.reason}\n{rh}\n')
            is_sse = 'text/event-stream' in (r.getheader('Content-Type') or '')
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() in ('content-length', 'transfer-encoding', 'connection'):
                    continue
                self.send_header(k, v)
            if is_sse:
                self.send_header('Transfer-Encoding', 'chunked')
                self.send_header('Connection', 'close')
                self.end_headers()
                while True:
                    line = r.readline()
                    if not line:
                        break
                    log(f'[sse] {line.decode(errors="replace").rstrip()}')
                    self.wfile.write(f'{len(line):x}\r\n'.encode() + line + b'\r\n')
                    self.wfile.flush()
                self.wfile.write(b'0\r\n\r\n')
                log('[sse closed]\n')
                self.close_connection = True
            else:
                data = r.read()
                if self.command == 'GET' and 'agent' in self.path:
                    data = data.replace(up_hostport.encode(), me_hostport.encode())
                log(data.decode(errors='replace') + '\n')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            conn.close()

        do_GET = _do
        do_POST = _do

    ThreadingHTTPServer(('127.0.0.1', a.listen), H).serve_forever()


if __name__ == '__main__':
    main()
