"""Drives N two-turn conversations (200 B a message) over gRPC or JSON-RPC v1.0 against a
running colloquy, one after another, checking each turn completed. Run by benches/grpc_callgrind.sh.

    python benches/grpc_turns.py grpc|jsonrpc HTTP_PORT GRPC_PORT N
(needs grpcio, httpx and a2a-sdk 1.x: the interop venv target/interop/sdk1 has them)
"""
import sys, uuid, json
import httpx, grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc

mode, http_port, grpc_port, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = "x" * 200
if mode == "grpc":
    stub = a2a_pb2_grpc.A2AServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    for i in range(n):
        ctx = f"c-{i}"
        for t in range(2):
            msg = a2a_pb2.Message(message_id=str(uuid.uuid4()), context_id=ctx, role=a2a_pb2.ROLE_USER,
                                  parts=[a2a_pb2.Part(text=text)])
            r = stub.SendMessage(a2a_pb2.SendMessageRequest(message=msg))
            assert r.task.status.state == a2a_pb2.TASK_STATE_COMPLETED, r
elif mode == "jsonrpc":
    c = httpx.Client(base_url=f"http://127.0.0.1:{http_port}", headers={"A2A-Version": "1.0"})
    for i in range(n):
        ctx = f"c-{i}"
        for t in range(2):
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
                "messageId": str(uuid.uuid4()), "contextId": ctx, "role": "ROLE_USER", "parts": [{"text": text}]}}}
            r = c.post("/", json=body).json()
            assert r["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", r
print("done", mode, n)
