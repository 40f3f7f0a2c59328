#!/usr/bin/env python3
"""Push-notification configs with the official a2a-sdk 1.x client (wire v1.0).

Starts a task, then creates two configs for it (one with Bearer credentials), reads one back,
lists them (credentials must not come back), deletes one and lists again.

Run:  $INTEROP_VENVS/sdk1/bin/python tests/interop/push1.py --url http://127.0.0.1:8080 --hook https://...
Last line on success: INTEROP OK ...
"""
import argparse
import asyncio
import sys
import uuid

import httpx

from a2a.client import ClientConfig, create_client
from a2a.types import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
)


class Fail(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


async def run(args) -> str:
    async with httpx.AsyncClient(timeout=30.0) as hc:
        client = await create_client(args.url, client_config=ClientConfig(httpx_client=hc, streaming=False))
        msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text='hello')])
        task = None
        async for ev in client.send_message(SendMessageRequest(message=msg)):
            if ev.HasField('task'):
                task = ev.task
        check(task is not None, 'the send returned no task')
        created = await client.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task.id, url=args.hook, token='receiver-token',
            authentication=AuthenticationInfo(scheme='Bearer', credentials='very-secret')))
        print(f'created: {created}')
        check(created.id != '', 'no config id')
        check(created.task_id == task.id and created.url == args.hook, 'created config differs')
        check(created.authentication.credentials == '', 'credentials answered back by Create')
        second = await client.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task.id, id='second', url=args.hook))
        check(second.id == 'second', f'second config id {second.id!r}')
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id=created.id))
        check(got.url == args.hook and got.token == 'receiver-token', f'get: {got}')
        check(got.authentication.scheme == 'Bearer', f'get: scheme {got.authentication.scheme!r}')
        check(got.authentication.credentials == '', 'credentials answered back by Get')
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id))
        ids = sorted(c.id for c in listed.configs)
        check(ids == sorted([created.id, 'second']), f'list: {ids}')
        check(all(c.authentication.credentials == '' for c in listed.configs), 'credentials in List')
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id='second'))
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id))
        check([c.id for c in listed.configs] == [created.id], f'list after delete: {listed}')
        await client.close()
    return f'sdk=1.x task={task.id} configs=create,get,list,delete'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--url', required=True)
    ap.add_argument('--hook', required=True)
    args = ap.parse_args()
    try:
        details = asyncio.run(run(args))
    except Exception as e:  # noqa: BLE001
        print(f'INTEROP FAIL (a2a-sdk 1.x push): {type(e).__name__}: {e}')
        sys.exit(1)
    print(f'INTEROP OK {details}')


if __name__ == '__main__':
    main()
