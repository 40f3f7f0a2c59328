#!/usr/bin/env python3
"""Reference A2A v1.0 server built from a2a-sdk 1.x classes (peer for colloquy tests).

Serves v1.0 (A2A-Version: 1.0, PascalCase methods) and, with --v03-compat (default on),
also v0.3 method names on the same endpoint (the SDK's own compat adapter).

Echo agent with per-contextId memory; reply text:
    sdk-echo: <text> (turn N; previously: "<prev user text>")   (turn 1: "sdk-echo: <text> (turn 1)")
Emitted as 3 artifact chunks (same artifactId, append after the first, lastChunk on the last).

With --rest-only it serves (and its card lists) only the HTTP+JSON binding.

Run:  $INTEROP_VENVS/sdk1/bin/python tests/interop/sdk_server1.py --port 9101 [--rest-only]
"""
import argparse
import asyncio
import logging

import uvicorn
from starlette.applications import Starlette

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)

MEMORY: dict[str, list[str]] = {}


def reply_text(context_id: str, text: str) -> str:
    hist = MEMORY.setdefault(context_id, [])
    hist.append(text)
    n = len(hist)
    if n == 1:
        return f'sdk-echo: {text} (turn 1)'
    return f'sdk-echo: {text} (turn {n}; previously: "{hist[-2]}")'


def chunks(s: str, k: int = 3) -> list[str]:
    step = max(1, -(-len(s) // k))
    return [s[i:i + step] for i in range(0, len(s), step)]


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            task = Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message],
            )
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        text = reply_text(task.context_id, context.get_user_input())
        pieces = chunks(text)
        artifact_id = f'{task.id}-reply'
        for i, piece in enumerate(pieces):
            await updater.add_artifact(
                [Part(text=piece)],
                artifact_id=artifact_id,
                name='reply',
                append=(i > 0),
                last_chunk=(i == len(pieces) - 1),
            )
            await asyncio.sleep(0.01)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def build_app(port: int, v03_compat: bool, advertise_v03: bool, rest_only: bool = False) -> Starlette:
    url = f'http://127.0.0.1:{port}/'
    binding = 'HTTP+JSON' if rest_only else 'JSONRPC'
    interfaces = [AgentInterface(url=url, protocol_binding=binding, protocol_version='1.0')]
    if advertise_v03:
        interfaces.append(AgentInterface(url=url, protocol_binding='JSONRPC', protocol_version='0.3'))
    card = AgentCard(
        name='sdk-echo-1',
        description='a2a-sdk 1.x reference echo agent',
        version='1.0.0',
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(id='echo', name='echo', description='echoes with memory', tags=['echo'])],
    )
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    if rest_only:
        return Starlette(routes=create_agent_card_routes(card) + create_rest_routes(handler))
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(
        handler, rpc_url='/', enable_v0_3_compat=v03_compat
    )
    return Starlette(routes=routes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--port', type=int, default=9101)
    ap.add_argument('--log-level', default='warning')
    ap.add_argument('--no-v03-compat', action='store_true', help='do not accept v0.3 method names')
    ap.add_argument('--advertise-v03', action='store_true',
                    help='also list a JSONRPC 0.3 interface in supportedInterfaces')
    ap.add_argument('--rest-only', action='store_true',
                    help='serve and list only the HTTP+JSON binding (no JSON-RPC)')
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level.upper())
    app = build_app(a.port, not a.no_v03_compat, a.advertise_v03, a.rest_only)
    uvicorn.run(app, host='127.0.0.1', port=a.port, log_level=a.log_level)


if __name__ == '__main__':
    main()
