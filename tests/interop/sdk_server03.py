#!/usr/bin/env python3
"""Reference A2A v0.3 server built from a2a-sdk 0.3.x classes (peer for colloquy tests).

Echo agent with per-contextId memory; reply text:
    sdk-echo: <text> (turn N; previously: "<prev user text>")   (turn 1: "sdk-echo: <text> (turn 1)")
The reply is emitted as 3 artifact chunks (same artifactId, append=true after the first,
lastChunk=true on the last), then the task completes.

Run:  $INTEROP_VENVS/sdk03/bin/python tests/interop/sdk_server03.py --port 9103
"""
import argparse
import asyncio
import logging

import uvicorn

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.apps import A2AStarletteApplication
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentSkill,
    Part,
    TextPart,
)
from a2a.utils import new_task

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
            task = new_task(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        text = reply_text(task.context_id, context.get_user_input())
        pieces = chunks(text)
        artifact_id = f'{task.id}-reply'
        for i, piece in enumerate(pieces):
            await updater.add_artifact(
                [Part(root=TextPart(text=piece))],
                artifact_id=artifact_id,
                name='reply',
                append=(i > 0),
                last_chunk=(i == len(pieces) - 1),
            )
            await asyncio.sleep(0.01)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.cancel()


def build_app(port: int):
    card = AgentCard(
        name='sdk-echo-03',
        description='a2a-sdk 0.3.x reference echo agent',
        url=f'http://127.0.0.1:{port}/',
        version='1.0.0',
        protocol_version='0.3.0',
        preferred_transport='JSONRPC',
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(id='echo', name='echo', description='echoes with memory', tags=['echo'])],
    )
    handler = DefaultRequestHandler(agent_executor=EchoExecutor(), task_store=InMemoryTaskStore())
    return A2AStarletteApplication(agent_card=card, http_handler=handler).build()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--port', type=int, default=9103)
    ap.add_argument('--log-level', default='warning')
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level.upper())
    uvicorn.run(build_app(a.port), host='127.0.0.1', port=a.port, log_level=a.log_level)


if __name__ == '__main__':
    main()
