#!/usr/bin/env python3
"""Interop client, a2a-sdk 0.3.x line (wire protocol v0.3).

Three-turn conversation against BASE_URL (card at BASE_URL/.well-known/agent-card.json):
turn 1 without contextId, turns 2-3 reuse it; checks memory in replies, same contextId,
tasks/get of turn 3 (completed, same contextId), tasks/cancel on a completed task (expects an error),
and in streaming mode that the concatenated artifact-update chunks equal the final artifact text.

With --binding rest the client speaks v0.3's HTTP+JSON binding (RestTransport, `/v1/...` routes).

Run:  $INTEROP_VENVS/sdk03/bin/python tests/interop/client03.py --url http://127.0.0.1:8080 --mode streaming [--binding rest]
Last line on success: INTEROP OK ...
"""
import argparse
import asyncio
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskIdParams,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
    TransportProtocol,
)


class Fail(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


def parts_text(parts) -> str:
    out = []
    for p in parts or []:
        root = getattr(p, 'root', p)
        if getattr(root, 'kind', None) == 'text':
            out.append(root.text)
    return ''.join(out)


def task_reply_text(task: Task) -> str:
    if task.artifacts:
        return ''.join(parts_text(a.parts) for a in task.artifacts)
    if task.status.message is not None:
        return parts_text(task.status.message.parts)
    for m in reversed(task.history or []):
        if m.role == Role.agent:
            return parts_text(m.parts)
    return ''


async def one_turn(client, text: str, context_id: str | None, streaming: bool, turn: int):
    msg = Message(
        role=Role.user,
        message_id=str(uuid.uuid4()),
        context_id=context_id,
        parts=[Part(root=TextPart(text=text))],
    )
    print(f'--> turn {turn}: user: {text!r} contextId={context_id}')
    last_task: Task | None = None
    reply_msg: Message | None = None
    chunks: list[str] = []
    n_events = 0
    last_status: TaskStatusUpdateEvent | None = None
    async for ev in client.send_message(msg):
        n_events += 1
        if isinstance(ev, Message):
            reply_msg = ev
            print(f'    event {n_events}: message {parts_text(ev.parts)!r}')
            continue
        task, update = ev
        last_task = task
        if update is None:
            print(f'    event {n_events}: task id={task.id} state={task.status.state.value}')
        elif isinstance(update, TaskArtifactUpdateEvent):
            t = parts_text(update.artifact.parts)
            chunks.append(t)
            print(f'    event {n_events}: artifact-update id={update.artifact.artifact_id} '
                  f'append={update.append} lastChunk={update.last_chunk} text={t!r}')
        elif isinstance(update, TaskStatusUpdateEvent):
            last_status = update
            print(f'    event {n_events}: status-update state={update.status.state.value} final={update.final}')
    if reply_msg is not None:
        check(last_task is None, 'got both a Message and Task events')
        reply = parts_text(reply_msg.parts)
        print(f'<-- turn {turn}: agent (message): {reply!r} contextId={reply_msg.context_id}')
        return reply, reply_msg.context_id, None, chunks
    check(last_task is not None, f'turn {turn}: no Task or Message received')
    if streaming:
        check(last_status is not None, f'turn {turn}: stream had no status-update event')
        check(last_status.final is True, f'turn {turn}: last status-update not final=true')
        check(last_task.status.state == TaskState.completed,
              f'turn {turn}: stream ended in state {last_task.status.state}')
    else:
        check(n_events == 1, f'turn {turn}: blocking send produced {n_events} events')
        check(last_task.status.state == TaskState.completed,
              f'turn {turn}: blocking send returned state {last_task.status.state}')
    reply = task_reply_text(last_task)
    print(f'<-- turn {turn}: agent: {reply!r} taskId={last_task.id} contextId={last_task.context_id} '
          f'state={last_task.status.state.value}')
    return reply, last_task.context_id, last_task, chunks


async def run(args) -> str:
    streaming = args.mode == 'streaming'
    tag = uuid.uuid4().hex[:6]
    texts = [f'alpha-{tag}', f'bravo-{tag}', f'charlie-{tag}']
    async with httpx.AsyncClient(timeout=args.timeout) as hc:
        card = await A2ACardResolver(hc, args.url).get_agent_card()
        print(f'card: name={card.name!r} protocolVersion={card.protocol_version} url={card.url} '
              f'preferredTransport={card.preferred_transport} streaming={card.capabilities.streaming}')
        if streaming:
            check(bool(card.capabilities.streaming), 'card does not advertise capabilities.streaming=true')
        transports = [TransportProtocol.http_json] if args.binding == 'rest' else [TransportProtocol.jsonrpc]
        config = ClientConfig(httpx_client=hc, streaming=streaming, supported_transports=transports)
        client = ClientFactory(config).create(card)
        transport = type(client._transport).__name__  # noqa: SLF001
        print(f'transport {transport}')
        if args.binding == 'rest':
            check(transport == 'RestTransport', f'--binding rest got transport {transport}')
        ctx = None
        results = []
        for i, t in enumerate(texts, 1):
            reply, rctx, task, chunks = await one_turn(client, t, ctx, streaming, i)
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
            if streaming and task is not None:
                got = ''.join(chunks)
                check(len(chunks) >= 1, f'turn {i}: no artifact-update events in stream')
                check(got == reply, f'turn {i}: concatenated chunks {got!r} != final artifact text {reply!r}')
                fetched = await client.get_task(TaskQueryParams(id=task.id))
                check(task_reply_text(fetched) == got,
                      f'turn {i}: tasks/get artifact text {task_reply_text(fetched)!r} != streamed {got!r}')
            results.append(task)
        last = results[-1]
        check(last is not None, 'turn 3 returned a Message, not a Task: cannot tasks/get')
        got = await client.get_task(TaskQueryParams(id=last.id))
        print(f'tasks/get {last.id}: state={got.status.state.value} contextId={got.context_id} '
              f'history={len(got.history or [])} artifacts={len(got.artifacts or [])}')
        check(got.id == last.id, 'tasks/get returned another id')
        check(got.status.state == TaskState.completed, f'tasks/get state {got.status.state}')
        check(got.context_id == ctx, f'tasks/get contextId {got.context_id} != {ctx}')
        check(texts[2] in task_reply_text(got), 'tasks/get artifacts do not hold turn 3 reply')
        cancel_note = 'cancel-error'
        try:
            ct = await client.cancel_task(TaskIdParams(id=last.id))
            raise Fail(f'tasks/cancel on a completed task succeeded (state={ct.status.state}); expected -32002')
        except Fail:
            raise
        except Exception as e:  # noqa: BLE001
            code = getattr(getattr(getattr(e, 'error', None), 'code', None), '__str__', lambda: '?')()
            print(f'tasks/cancel on completed task -> error as expected: {type(e).__name__} code={code}: {e}')
            if args.binding == 'rest':
                # HTTP+JSON: TaskNotCancelableError is HTTP 409 (the SDK raises A2AClientHTTPError).
                status = getattr(e, 'status_code', None)
                check(status == 409, f'tasks/cancel HTTP status {status}, expected 409')
                code = f'http-{status}'
            else:
                check(code in ('-32002', '?'), f'tasks/cancel error code {code}, expected -32002')
            cancel_note = f'cancel={code}'
        await client.close()
    return f'sdk=0.3 binding={args.binding} mode={args.mode} contextId={ctx} tasks={[r.id for r in results]} {cancel_note}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--url', required=True, help='server root, e.g. http://127.0.0.1:8080')
    ap.add_argument('--mode', choices=['blocking', 'streaming'], default='blocking')
    ap.add_argument('--binding', choices=['jsonrpc', 'rest'], default='jsonrpc')
    ap.add_argument('--expect-prefix', default='echo:')
    ap.add_argument('--timeout', type=float, default=30.0)
    args = ap.parse_args()
    try:
        details = asyncio.run(run(args))
    except Fail as e:
        print(f'INTEROP FAIL (a2a-sdk 0.3, {args.mode}): {e}')
        sys.exit(1)
    except Exception as e:  # noqa: BLE001
        print(f'INTEROP FAIL (a2a-sdk 0.3, {args.mode}): unexpected {type(e).__name__}: {e}')
        sys.exit(2)
    print(f'INTEROP OK {details}')


if __name__ == '__main__':
    main()
