#!/usr/bin/env python3
"""Interop client, a2a-sdk 1.x line (wire protocol v1.0; falls back to v0.3 if the card says so).

Three-turn conversation against BASE_URL (card at BASE_URL/.well-known/agent-card.json):
turn 1 without contextId, turns 2-3 reuse it; checks memory in replies, same contextId,
GetTask of turn 3 (completed, same contextId), ListTasks filtered by contextId (3 tasks),
CancelTask on a completed task (expects -32002), and in streaming mode that the concatenated
artifact-update chunks equal the final artifact text (as returned by GetTask).
With --binding rest the client speaks the HTTP+JSON binding (RestTransport) instead of JSON-RPC,
with --binding grpc the gRPC binding (GrpcTransport, the interface the card lists as GRPC,
its URL dialed as the channel's target); both also check that GetTask of an unknown id raises
TaskNotFoundError (-32001).

Run:  $INTEROP_VENVS/sdk1/bin/python tests/interop/client1.py --url http://127.0.0.1:8080 --mode streaming [--binding rest|grpc]
Last line on success: INTEROP OK ...
"""
import argparse
import asyncio
import sys
import uuid

import httpx

from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, TaskNotFoundError


class Fail(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


def sname(state) -> str:
    return TaskState.Name(state)


def parts_text(parts) -> str:
    return ''.join(p.text for p in parts if p.HasField('text'))


def task_reply_text(task: Task) -> str:
    if task.artifacts:
        return ''.join(parts_text(a.parts) for a in task.artifacts)
    if task.status.HasField('message'):
        return parts_text(task.status.message.parts)
    for m in reversed(task.history):
        if m.role == Role.ROLE_AGENT:
            return parts_text(m.parts)
    return ''


def grpc_channel(url: str):
    """A plaintext channel to the card's GRPC interface, its URL dialed as it stands."""
    import grpc  # only the grpc binding needs it
    return grpc.aio.insecure_channel(url)


async def one_turn(client, text: str, context_id: str | None, streaming: bool, turn: int):
    msg = Message(
        role=Role.ROLE_USER,
        message_id=str(uuid.uuid4()),
        parts=[Part(text=text)],
    )
    if context_id:
        msg.context_id = context_id
    print(f'--> turn {turn}: user: {text!r} contextId={context_id}')
    task: Task | None = None
    reply_msg: Message | None = None
    chunks: list[str] = []
    n = 0
    last_state = None
    async for ev in client.send_message(SendMessageRequest(message=msg)):
        n += 1
        if ev.HasField('message'):
            reply_msg = ev.message
            print(f'    event {n}: message {parts_text(ev.message.parts)!r}')
        elif ev.HasField('task'):
            task = ev.task
            last_state = task.status.state
            print(f'    event {n}: task id={task.id} state={sname(task.status.state)} '
                  f'artifacts={len(task.artifacts)}')
        elif ev.HasField('status_update'):
            su = ev.status_update
            last_state = su.status.state
            print(f'    event {n}: statusUpdate state={sname(su.status.state)}')
        elif ev.HasField('artifact_update'):
            au = ev.artifact_update
            t = parts_text(au.artifact.parts)
            chunks.append(t)
            print(f'    event {n}: artifactUpdate id={au.artifact.artifact_id} append={au.append} '
                  f'lastChunk={au.last_chunk} text={t!r}')
        else:
            raise Fail(f'turn {turn}: empty StreamResponse event')
    if reply_msg is not None:
        check(task is None, f'turn {turn}: got both Message and Task')
        reply = parts_text(reply_msg.parts)
        print(f'<-- turn {turn}: agent (message): {reply!r} contextId={reply_msg.context_id}')
        return reply, reply_msg.context_id, None, chunks
    check(task is not None, f'turn {turn}: no Task or Message received')
    check(last_state == TaskState.TASK_STATE_COMPLETED,
          f'turn {turn}: ended in state {sname(last_state)}, expected TASK_STATE_COMPLETED')
    if streaming:
        # the stream only carries the initial Task snapshot; fetch the final one
        final = await client.get_task(GetTaskRequest(id=task.id))
        reply = task_reply_text(final)
        got = ''.join(chunks)
        check(len(chunks) >= 1, f'turn {turn}: no artifactUpdate events in stream')
        check(got == reply, f'turn {turn}: concatenated chunks {got!r} != final artifact text {reply!r}')
        task = final
    else:
        check(n == 1, f'turn {turn}: blocking send produced {n} events')
        reply = task_reply_text(task)
    print(f'<-- turn {turn}: agent: {reply!r} taskId={task.id} contextId={task.context_id} '
          f'state={sname(task.status.state)}')
    return reply, task.context_id, task, chunks


async def run(args) -> str:
    streaming = args.mode == 'streaming'
    tag = uuid.uuid4().hex[:6]
    texts = [f'alpha-{tag}', f'bravo-{tag}', f'charlie-{tag}']
    async with httpx.AsyncClient(timeout=args.timeout) as hc:
        bindings = {'rest': [TransportProtocol.HTTP_JSON], 'grpc': [TransportProtocol.GRPC]}.get(args.binding, [])
        config = ClientConfig(httpx_client=hc, streaming=streaming, supported_protocol_bindings=bindings,
                              grpc_channel_factory=grpc_channel)
        client = await create_client(args.url, client_config=config)
        card = client._card  # noqa: SLF001 (for the transcript only)
        transport = type(client._transport).__name__  # noqa: SLF001
        ifaces = [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces]
        print(f'card: name={card.name!r} interfaces={ifaces} streaming={card.capabilities.streaming} '
              f'-> transport {transport} url={getattr(client._transport, "url", "(a gRPC channel)")}')  # noqa: SLF001
        legacy = transport.startswith('Compat')
        expected = {'rest': 'RestTransport', 'grpc': 'GrpcTransport'}.get(args.binding)
        if expected:
            check(transport == expected, f'--binding {args.binding} got transport {transport}')
        if streaming:
            check(card.capabilities.streaming, 'card does not advertise capabilities.streaming=true')
        ctx = None
        results = []
        for i, t in enumerate(texts, 1):
            reply, rctx, task, _ = await one_turn(client, t, ctx, streaming, i)
            check(bool(rctx), f'turn {i}: reply has no contextId')
            check(reply.startswith(args.expect_prefix),
                  f'turn {i}: reply {reply!r} does not start with {args.expect_prefix!r}')
            check(t in reply, f'turn {i}: reply {reply!r} does not contain the user text {t!r}')
            if i == 1:
                ctx = rctx
            else:
                check(rctx == ctx, f'turn {i}: contextId changed {ctx} -> {rctx}')
                check(texts[i - 2] in reply,
                      f'turn {i}: reply {reply!r} does not mention previous user text {texts[i - 2]!r}')
            results.append(task)
        last = results[-1]
        check(last is not None, 'turn 3 returned a Message, not a Task: cannot GetTask')
        got = await client.get_task(GetTaskRequest(id=last.id))
        print(f'GetTask {last.id}: state={sname(got.status.state)} contextId={got.context_id} '
              f'history={len(got.history)} artifacts={len(got.artifacts)}')
        check(got.id == last.id, 'GetTask returned another id')
        check(got.status.state == TaskState.TASK_STATE_COMPLETED, f'GetTask state {sname(got.status.state)}')
        check(got.context_id == ctx, f'GetTask contextId {got.context_id} != {ctx}')
        check(texts[2] in task_reply_text(got), 'GetTask artifacts do not hold turn 3 reply')
        list_note = 'list=skipped(v0.3)'
        if not legacy:
            lst = await client.list_tasks(ListTasksRequest(context_id=ctx))
            ids = [t.id for t in lst.tasks]
            print(f'ListTasks contextId={ctx}: {len(ids)} tasks {ids} nextPageToken={lst.next_page_token!r} '
                  f'pageSize={lst.page_size} totalSize={lst.total_size}')
            check(len(ids) == 3, f'ListTasks returned {len(ids)} tasks, expected 3')
            check(set(ids) == {r.id for r in results}, 'ListTasks ids differ from the three turns')
            check(all(t.context_id == ctx for t in lst.tasks), 'ListTasks returned a task of another context')
            list_note = 'list=3'
        cancel_note = 'cancel-error'
        try:
            ct = await client.cancel_task(CancelTaskRequest(id=last.id))
            raise Fail(f'CancelTask on a completed task succeeded (state={sname(ct.status.state)}); expected -32002')
        except Fail:
            raise
        except Exception as e:  # noqa: BLE001
            code = JSON_RPC_ERROR_CODE_MAP.get(type(e), '?')
            print(f'CancelTask on completed task -> error as expected: {type(e).__name__} code={code}: {e}')
            check(code == -32002, f'CancelTask error {type(e).__name__} (code {code}), expected -32002')
            cancel_note = f'cancel={code}'
        if args.binding in ('rest', 'grpc'):
            try:
                await client.get_task(GetTaskRequest(id=f'no-such-task-{tag}'))
                raise Fail('GetTask of an unknown id succeeded; expected TaskNotFoundError')
            except TaskNotFoundError as e:
                print(f'GetTask of an unknown id -> TaskNotFoundError as expected: {e}')
                cancel_note += ' not-found=-32001'
        await client.close()
    return (f'sdk=1.x transport={transport} mode={args.mode} contextId={ctx} '
            f'tasks={[r.id for r in results]} {list_note} {cancel_note}')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--url', required=True, help='server root, e.g. http://127.0.0.1:8080')
    ap.add_argument('--mode', choices=['blocking', 'streaming'], default='blocking')
    ap.add_argument('--binding', choices=['jsonrpc', 'rest', 'grpc'], default='jsonrpc')
    ap.add_argument('--expect-prefix', default='echo:')
    ap.add_argument('--timeout', type=float, default=30.0)
    args = ap.parse_args()
    try:
        details = asyncio.run(run(args))
    except Fail as e:
        print(f'INTEROP FAIL (a2a-sdk 1.x, {args.mode}): {e}')
        sys.exit(1)
    except Exception as e:  # noqa: BLE001
        print(f'INTEROP FAIL (a2a-sdk 1.x, {args.mode}): unexpected {type(e).__name__}: {e!r}')
        sys.exit(2)
    print(f'INTEROP OK {details}')


if __name__ == '__main__':
    main()
