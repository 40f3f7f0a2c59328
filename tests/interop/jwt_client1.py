#!/usr/bin/env python3
"""Interop client, a2a-sdk 1.x line, authenticated with a bearer JWT.

A three-turn conversation against BASE_URL (turn 1 without contextId, turns 2-3 reuse it),
checking the echo agent's memory, then GetTask of turn 3; every call carries
`Authorization: Bearer TOKEN`.
  --auth interceptor (default): the SDK's AuthInterceptor puts the token on each call, for the
      security scheme the agent card declares (the card must declare one; else no header is sent);
  --auth header: the token is a default header of the httpx client.
With --expect-status N the first call must fail with HTTP N (e.g. 401 for a refused token):
prints `INTEROP REFUSED N` and exits 0; a success then is a failure.

Run:  $INTEROP_VENVS/sdk1/bin/python tests/interop/jwt_client1.py --url http://127.0.0.1:8080 --token JWT
Last line on success: INTEROP OK ...
"""
import argparse
import asyncio
import re
import sys
import uuid

import httpx

from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.client.auth.credentials import CredentialService
from a2a.client.auth.interceptor import AuthInterceptor
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, Task, TaskState


class Fail(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


class OneToken(CredentialService):
    """The same token for whichever scheme the card declares."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.asked: list[str] = []

    async def get_credentials(self, security_scheme_name: str, context: ClientCallContext | None) -> str | None:
        self.asked.append(security_scheme_name)
        return self.token


def parts_text(parts) -> str:
    return ''.join(p.text for p in parts if p.HasField('text'))


def reply_of(task: Task) -> str:
    return ''.join(parts_text(a.parts) for a in task.artifacts)


async def turn(client, text: str, context_id: str | None) -> Task:
    msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=text)])
    if context_id:
        msg.context_id = context_id
    task = None
    async for ev in client.send_message(SendMessageRequest(message=msg)):
        if ev.HasField('task'):
            task = ev.task
        elif ev.HasField('message'):
            raise Fail(f'got a Message, expected a Task: {ev.message}')
    check(task is not None, f'no Task for {text!r}')
    if task.status.state != TaskState.TASK_STATE_COMPLETED:
        # streaming: the first event is the submitted task; fetch the final one
        task = await client.get_task(GetTaskRequest(id=task.id))
    check(task.status.state == TaskState.TASK_STATE_COMPLETED,
          f'{text!r} ended {TaskState.Name(task.status.state)}')
    print(f'<-- {reply_of(task)!r} taskId={task.id} contextId={task.context_id}')
    return task


def http_status(e: BaseException) -> int | None:
    """The HTTP status an SDK error carries (attribute, message or cause)."""
    while e is not None:
        status = getattr(e, 'status_code', None)
        if isinstance(status, int):
            return status
        if isinstance(e, httpx.HTTPStatusError):
            return e.response.status_code
        m = re.search(r'HTTP(?: Error)? (\d{3})', str(e))
        if m:
            return int(m.group(1))
        e = e.__cause__ or e.__context__
    return None


async def run(args) -> str:
    headers = {'Authorization': f'Bearer {args.token}'} if args.auth == 'header' else {}
    credentials = OneToken(args.token)
    interceptors = [AuthInterceptor(credentials)] if args.auth == 'interceptor' else []
    tag = uuid.uuid4().hex[:6]
    texts = [f'alpha-{tag}', f'bravo-{tag}', f'charlie-{tag}']
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers) as hc:
        config = ClientConfig(httpx_client=hc, streaming=args.mode == 'streaming')
        client = await create_client(args.url, client_config=config, interceptors=interceptors)
        card = client._card  # noqa: SLF001 (for the transcript only)
        print(f'card: name={card.name!r} schemes={list(card.security_schemes)} '
              f'requirements={[list(r.schemes) for r in card.security_requirements]} auth={args.auth}')
        if args.auth == 'interceptor':
            check(bool(card.security_requirements), 'the card declares no security requirement')
        if args.expect_status:
            try:
                await turn(client, texts[0], None)
            except Fail:
                raise
            except Exception as e:  # noqa: BLE001
                status = http_status(e)
                print(f'refused: {type(e).__name__}: {e}')
                check(status == args.expect_status, f'refused with HTTP {status}, expected {args.expect_status}')
                await client.close()
                return f'REFUSED {status}'
            raise Fail(f'the call succeeded; expected HTTP {args.expect_status}')
        ctx = None
        last = None
        for i, text in enumerate(texts):
            last = await turn(client, text, ctx)
            reply = reply_of(last)
            check(text in reply, f'turn {i + 1}: {reply!r} does not hold {text!r}')
            if ctx is None:
                ctx = last.context_id
            else:
                check(last.context_id == ctx, f'turn {i + 1}: contextId {last.context_id} != {ctx}')
                check(texts[i - 1] in reply, f'turn {i + 1}: {reply!r} does not recall {texts[i - 1]!r}')
        got = await client.get_task(GetTaskRequest(id=last.id))
        check(got.context_id == ctx and texts[2] in reply_of(got), f'GetTask: {got}')
        if args.auth == 'interceptor':
            check(bool(credentials.asked), 'the interceptor never asked for a credential')
        await client.close()
    return f'OK sdk=1.x auth={args.auth} mode={args.mode} contextId={ctx} turns=3'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--url', required=True)
    ap.add_argument('--token', required=True)
    ap.add_argument('--auth', choices=['interceptor', 'header'], default='interceptor')
    ap.add_argument('--mode', choices=['blocking', 'streaming'], default='blocking')
    ap.add_argument('--expect-status', type=int, default=None)
    ap.add_argument('--timeout', type=float, default=30.0)
    args = ap.parse_args()
    try:
        details = asyncio.run(run(args))
    except Fail as e:
        print(f'INTEROP FAIL (a2a-sdk 1.x, jwt): {e}')
        sys.exit(1)
    except Exception as e:  # noqa: BLE001
        print(f'INTEROP FAIL (a2a-sdk 1.x, jwt): unexpected {type(e).__name__}: {e!r}')
        sys.exit(2)
    print(f'INTEROP {details}')


if __name__ == '__main__':
    main()
