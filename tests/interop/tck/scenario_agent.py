#!/usr/bin/env python3
"""A colloquy `exec` agent that answers the official TCK's scenarios as its feature files ask of
a SUT (the 1.0 line's scenarios/*.feature, keyed by messageId prefix): the agent
tests/interop/tck/run.sh gives the server it starts.

TCK_DEFAULT=input-required makes other messages wait for input (what the 0.3 line's cancel,
continue and history tests assume of a SUT); otherwise they complete with an echo.
"""
import json
import os
import sys
import time


def out(obj):
    print(json.dumps(obj), flush=True)


request = json.load(sys.stdin)
mid = request["message"].get("messageId", "")
text_in = "".join(p.get("text", "") for p in request["message"].get("parts", []))

if mid.startswith("tck-stream-artifact-chunked"):
    out({"status": "working", "text": "working"})
    out({"text": "chunk-1 "})
    out({"text": "chunk-2"})
elif mid.startswith("test-resubscribe-message-id"):
    out({"status": "working", "text": "working"})
    time.sleep(4.5)
    out({"status": "completed"})
elif mid.startswith("tck-stream-artifact-text"):
    out({"status": "working", "text": "working"})
    out({"text": "Streamed text content"})
elif mid.startswith("tck-stream-artifact-file") or mid.startswith("tck-artifact-file") and not mid.startswith("tck-artifact-file-url"):
    out({"artifact": {"name": "output", "parts": [{"raw": "dGNr", "mediaType": "text/plain", "filename": "output.txt"}]}})
    out({"status": "completed"})
elif mid.startswith("tck-artifact-file-url"):
    out({"artifact": {"name": "output", "parts": [{"url": "https://example.com/output.txt", "mediaType": "text/plain", "filename": "output.txt"}]}})
    out({"status": "completed"})
elif mid.startswith("tck-stream-ordering-001"):
    out({"status": "working", "text": "working"})
    out({"text": "Ordered output"})
elif mid.startswith("tck-message-response"):
    out({"message": {"parts": [{"text": "Direct message response"}]}})
elif mid.startswith("tck-input-required"):
    out({"status": "input-required", "text": "need input"})
elif mid.startswith("tck-complete-task"):
    out({"status": "completed", "text": "Hello from TCK"})
elif mid.startswith("tck-artifact-text"):
    out({"text": "Generated text content"})
elif mid.startswith("tck-artifact-data"):
    out({"artifact": {"name": "output", "parts": [{"data": {"key": "value", "count": 42}}]}})
    out({"status": "completed"})
elif mid.startswith("tck-reject-task"):
    out({"status": "rejected", "text": "rejected"})
elif mid.startswith("tck-stream-001"):
    out({"status": "working", "text": "working"})
    out({"text": "Stream hello from TCK"})
elif mid.startswith("tck-stream-002"):
    out({"status": "completed"})
elif mid.startswith("tck-stream-003"):
    out({"status": "working", "text": "working"})
    out({"text": "Stream task lifecycle"})
elif os.environ.get("TCK_DEFAULT") == "input-required":
    out({"text": "echo: " + text_in})
    out({"status": "input-required", "text": "anything else?"})
else:
    out({"text": "echo: " + text_in})
