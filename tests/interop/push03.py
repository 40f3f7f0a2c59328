#!/usr/bin/env python3
"""Push-notification configs with the official a2a-sdk 0.3.x client (wire v0.3).

Starts a task, sets a config with Bearer credentials (set_task_callback), reads it back
(get_task_callback), then lists and deletes through JSON-RPC requests and responses built and
parsed with the SDK's own types (its client has no list/delete): credentials must not come back.

Run:  $INTEROP_VENVS/sdk03/bin/python tests/interop/push03.py --url http://127.0.0.1:8080 --hook https://...
Last line on success: INTEROP OK ...
"""
import argparse
import asyncio
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    DeleteTaskPushNotificationConfigParams,
    DeleteTaskPushNotificationConfigRequest,
    DeleteTaskPushNotificationConfigResponse,
    GetTaskPushNotificationConfigParams,
    ListTaskPushNotificationConfigParams,
    ListTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigResponse,
    Message,
    Part,
    PushNotificationAuthenticationInfo,
    PushNotificationConfig,
    Role,
    Task,
    TaskPushNotificationConfig,
    TextPart,
)


class Fail(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


async def rpc(hc, url, request, response_type):
    answer = await hc.post(url, json=request.model_dump(mode='json', exclude_none=True))
    parsed = response_type.model_validate(answer.json()).root
    check(not hasattr(parsed, 'error') or parsed.error is None, f'error: {answer.text}')
    return parsed.result


async def run(args) -> str:
    async with httpx.AsyncClient(timeout=30.0) as hc:
        card = await A2ACardResolver(hc, args.url).get_agent_card()
        check(card.capabilities.push_notifications is True, 'card: pushNotifications is not true')
        client = ClientFactory(ClientConfig(httpx_client=hc, streaming=False)).create(card)
        msg = Message(role=Role.user, message_id=str(uuid.uuid4()), parts=[Part(root=TextPart(text='hello'))])
        task = None
        async for ev in client.send_message(msg):
            if isinstance(ev, tuple) and isinstance(ev[0], Task):
                task = ev[0]
        check(task is not None, 'the send returned no task')
        auth = PushNotificationAuthenticationInfo(schemes=['Bearer'], credentials='very-secret')
        created = await client.set_task_callback(TaskPushNotificationConfig(
            task_id=task.id,
            push_notification_config=PushNotificationConfig(url=args.hook, token='receiver-token', authentication=auth)))
        print(f'set: {created}')
        config = created.push_notification_config
        check(bool(config.id), 'no config id')
        check(config.authentication.credentials is None, 'credentials answered back by set')
        got = await client.get_task_callback(
            GetTaskPushNotificationConfigParams(id=task.id, push_notification_config_id=config.id))
        check(got.push_notification_config.url == args.hook, f'get: {got}')
        check(got.push_notification_config.authentication.credentials is None, 'credentials in get')
        listed = await rpc(hc, card.url, ListTaskPushNotificationConfigRequest(
            id=1, params=ListTaskPushNotificationConfigParams(id=task.id)), ListTaskPushNotificationConfigResponse)
        check([c.push_notification_config.id for c in listed] == [config.id], f'list: {listed}')
        await rpc(hc, card.url, DeleteTaskPushNotificationConfigRequest(
            id=2, params=DeleteTaskPushNotificationConfigParams(id=task.id, push_notification_config_id=config.id)),
            DeleteTaskPushNotificationConfigResponse)
        listed = await rpc(hc, card.url, ListTaskPushNotificationConfigRequest(
            id=3, params=ListTaskPushNotificationConfigParams(id=task.id)), ListTaskPushNotificationConfigResponse)
        check(listed == [], f'list after delete: {listed}')
        await client.close()
    return f'sdk=0.3 task={task.id} configs=set,get,list,delete'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--url', required=True)
    ap.add_argument('--hook', required=True)
    args = ap.parse_args()
    try:
        details = asyncio.run(run(args))
    except Exception as e:  # noqa: BLE001
        print(f'INTEROP FAIL (a2a-sdk 0.3 push): {type(e).__name__}: {e}')
        sys.exit(1)
    print(f'INTEROP OK {details}')


if __name__ == '__main__':
    main()
