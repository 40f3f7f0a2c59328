//! Bad input gets the right JSON-RPC error naming the problem, the server keeps serving, and no
//! stored conversation changes. Each limit, hit, gives a clear error.

use crate::common;

use common::*;
use serde_json::{Value, json};

struct Case {
    name: &'static str,
    version: Option<&'static str>,
    content_type: &'static str,
    body: Vec<u8>,
    http: u16,
    code: i64,
    mentions: &'static str,
}

fn case(
    name: &'static str,
    version: Option<&'static str>,
    body: Value,
    code: i64,
    mentions: &'static str,
) -> Case {
    Case {
        name,
        version,
        content_type: "application/json",
        body: body.to_string().into_bytes(),
        http: 200,
        code,
        mentions,
    }
}

fn raw(name: &'static str, body: &str, http: u16, code: i64, mentions: &'static str) -> Case {
    Case {
        name,
        version: None,
        content_type: "application/json",
        body: body.as_bytes().to_vec(),
        http,
        code,
        mentions,
    }
}

fn send(version: &str, message: Value) -> Value {
    let method = if version == V1 {
        "SendMessage"
    } else {
        "message/send"
    };
    json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": message}})
}

fn cases() -> Vec<Case> {
    let v1_part = |part: Value| json!({"messageId": "m", "role": "ROLE_USER", "contextId": "keep", "parts": [part]});
    vec![
        raw(
            "not JSON",
            "{\"jsonrpc\": \"2.0\", ",
            200,
            -32700,
            "not valid JSON",
        ),
        raw("empty body", "", 200, -32700, "not valid JSON"),
        raw("a string", "\"hello\"", 200, -32600, "JSON object"),
        raw(
            "a batch",
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks/get\"}]",
            200,
            -32600,
            "batch",
        ),
        Case {
            name: "invalid UTF-8",
            version: None,
            content_type: "application/json",
            body: b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}".to_vec(),
            http: 200,
            code: -32700,
            mentions: "not valid JSON",
        },
        raw(
            "a member twice",
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","method":"tasks/cancel","params":{"id":"x"}}"#,
            200,
            -32600,
            "duplicate field `method`",
        ),
        raw(
            "a param twice",
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"x","id":"y"}}"#,
            200,
            -32602,
            "duplicate field `id`",
        ),
        raw(
            "params nested past the limit",
            &format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{{"message":{{"kind":"message","messageId":"m","role":"user","parts":[{{"kind":"data","data":{}{}}}]}}}}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            200,
            -32602,
            "recursion limit",
        ),
        raw(
            "id nested past the limit",
            &format!(
                r#"{{"jsonrpc":"2.0","id":{}{},"method":"tasks/get","params":{{"id":"x"}}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            200,
            -32600,
            "id must be",
        ),
        case(
            "jsonrpc null",
            None,
            json!({"jsonrpc": null, "id": 1, "method": "tasks/get", "params": {"id": "x"}}),
            -32600,
            "must be \"2.0\"",
        ),
        case(
            "jsonrpc 1.0",
            None,
            json!({"jsonrpc": "1.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}}),
            -32600,
            "jsonrpc",
        ),
        case(
            "no jsonrpc",
            None,
            json!({"id": 1, "method": "tasks/get"}),
            -32600,
            "jsonrpc",
        ),
        case(
            "no method",
            None,
            json!({"jsonrpc": "2.0", "id": 1}),
            -32600,
            "method",
        ),
        case(
            "method a number",
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": 5}),
            -32600,
            "method",
        ),
        case(
            "id an object",
            None,
            json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "tasks/get"}),
            -32600,
            "id",
        ),
        case(
            "id an array",
            None,
            json!({"jsonrpc": "2.0", "id": [1], "method": "tasks/get"}),
            -32600,
            "id",
        ),
        case(
            "unknown method",
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/explode"}),
            -32601,
            "tasks/explode",
        ),
        case(
            "v1.0 name under v0.3",
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage"}),
            -32601,
            "A2A-Version",
        ),
        case(
            "v0.3 name under v1.0",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/send"}),
            -32601,
            "SendMessage",
        ),
        case(
            "unknown version",
            Some("2.0"),
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}),
            -32009,
            "2.0",
        ),
        case(
            "params an array",
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": [1]}),
            -32602,
            "params",
        ),
        case(
            "no message",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}),
            -32602,
            "message",
        ),
        case(
            "no messageId",
            Some(V1),
            send(
                V1,
                json!({"role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": "keep"}),
            ),
            -32602,
            "message.messageId",
        ),
        case(
            "no role",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "parts": [{"text": "x"}], "contextId": "keep"}),
            ),
            -32602,
            "message.role",
        ),
        case(
            "v0.3 role under v1.0",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "user", "parts": [{"text": "x"}], "contextId": "keep"}),
            ),
            -32602,
            "ROLE_USER",
        ),
        case(
            "agent role",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}], "contextId": "keep"}),
            ),
            -32602,
            "role",
        ),
        case(
            "no parts",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "contextId": "keep"}),
            ),
            -32602,
            "message.parts",
        ),
        case(
            "empty parts",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [], "contextId": "keep"}),
            ),
            -32602,
            "parts",
        ),
        case(
            "parts an object",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": {"text": "x"}, "contextId": "keep"}),
            ),
            -32602,
            "message.parts",
        ),
        case(
            "text a number",
            Some(V1),
            send(V1, v1_part(json!({"text": 5}))),
            -32602,
            "message.parts[0].text",
        ),
        case(
            "two contents",
            Some(V1),
            send(V1, v1_part(json!({"text": "a", "url": "http://x"}))),
            -32602,
            "exactly one",
        ),
        case(
            "v0.3 part under v1.0",
            Some(V1),
            send(V1, v1_part(json!({"kind": "text"}))),
            -32602,
            "v0.3",
        ),
        case(
            "bad base64",
            Some(V1),
            send(V1, v1_part(json!({"raw": "***"}))),
            -32602,
            "base64",
        ),
        case(
            "v0.3 unknown kind",
            None,
            send(
                V03,
                json!({"kind": "message", "messageId": "m", "role": "user", "contextId": "keep", "parts": [{"kind": "video"}]}),
            ),
            -32602,
            "video",
        ),
        case(
            "v0.3 file without content",
            None,
            send(
                V03,
                json!({"kind": "message", "messageId": "m", "role": "user", "contextId": "keep", "parts": [{"kind": "file", "file": {}}]}),
            ),
            -32602,
            "bytes or uri",
        ),
        case(
            "v0.3 wrong message kind",
            None,
            send(
                V03,
                json!({"kind": "task", "messageId": "m", "role": "user", "contextId": "keep", "parts": [{"kind": "text", "text": "x"}]}),
            ),
            -32602,
            "message.kind",
        ),
        case(
            "contextId a number",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": 42}),
            ),
            -32602,
            "message.contextId",
        ),
        case(
            "empty contextId",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": ""}),
            ),
            -32602,
            "contextId",
        ),
        case(
            "huge contextId",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": "k".repeat(100_000)}),
            ),
            -32602,
            "contextId",
        ),
        case(
            "unknown taskId",
            Some(V1),
            send(
                V1,
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": "keep", "taskId": "nope"}),
            ),
            -32001,
            "nope",
        ),
        case(
            "historyLength negative",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x", "historyLength": -1}}),
            -32602,
            "historyLength",
        ),
        case(
            "GetTask without id",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}),
            -32602,
            "id",
        ),
        case(
            "pageSize zero",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 0}}),
            -32602,
            "pageSize",
        ),
        case(
            "unknown status",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"status": "done"}}),
            -32602,
            "status",
        ),
        case(
            "bad timestamp",
            Some(V1),
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"statusTimestampAfter": "yesterday"}}),
            -32602,
            "statusTimestampAfter",
        ),
        case(
            "blocking a string",
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"kind": "message", "messageId": "m", "role": "user", "contextId": "keep", "parts": [{"kind": "text", "text": "x"}]}, "configuration": {"blocking": "yes"}}}),
            -32602,
            "configuration.blocking",
        ),
        Case {
            name: "text/plain body",
            version: None,
            content_type: "text/plain",
            body: b"{}".to_vec(),
            http: 415,
            code: -32005,
            mentions: "Content-Type",
        },
    ]
}

async fn snapshot(server: &TestServer) -> (Value, Vec<Value>) {
    let listed = server
        .rpc(V1, "colloquy/listConversations", json!({}))
        .await;
    (
        listed["result"]["conversations"].clone(),
        server.stored_messages(V1, "keep").await,
    )
}

#[actix_rt::test]
async fn malformed_requests_get_the_right_error_and_change_nothing() {
    let server = start_echo().await;
    server
        .send_text(V1, "the one stored message", Some("keep"), None)
        .await;
    let before = snapshot(&server).await;
    let cases = cases();
    assert!(cases.len() >= 25);
    for case in cases {
        let (status, body) = server
            .post_raw(case.version, case.content_type, case.body.clone())
            .await;
        assert_eq!(status, case.http, "{}: HTTP status ({body})", case.name);
        assert_eq!(
            body["error"]["code"],
            json!(case.code),
            "{}: {body}",
            case.name
        );
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(case.mentions),
            "{}: {message:?} should mention {:?}",
            case.name,
            case.mentions
        );
        if case.version.is_none() && case.content_type == "application/json" && case.http == 200 {
            assert_v03_valid("JSONRPCErrorResponse", &body);
        }
    }
    assert_eq!(
        snapshot(&server).await,
        before,
        "no stored conversation changed"
    );
    let after = server
        .send_text(V1, "still serving", Some("keep"), None)
        .await;
    assert_eq!(
        artifact_text(task_of(&after)),
        "echo: still serving (turn 2; previously: \"the one stored message\")"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn every_limit_gives_a_clear_error_and_the_server_keeps_serving() {
    let server = start_with(
        std::sync::Arc::new(colloquy::agent::EchoAgent::default()),
        |c| {
            c.limits.body_bytes = 64 * 1024;
            c.limits.parts_per_message = 3;
            c.limits.text_bytes = 1000;
            c.limits.context_id_bytes = 16;
            c.contexts.max_resident = 10;
        },
    )
    .await;
    let big = send(
        V1,
        json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x".repeat(100 * 1024)}]}),
    );
    let (status, body) = server
        .post_raw(Some(V1), "application/json", big.to_string().into_bytes())
        .await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["code"], json!(-32600));
    assert!(body["error"]["message"].as_str().unwrap().contains("65536"));

    let parts = json!([{"text": "a"}, {"text": "b"}, {"text": "c"}, {"text": "d"}]);
    let response = server
        .rpc(
            V1,
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}}),
        )
        .await;
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4 parts, more than the limit of 3")
    );
    let response = server.send_text(V1, &"t".repeat(1001), None, None).await;
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1001 bytes of text")
    );
    let response = server
        .send_text(V1, "hi", Some("seventeen-bytes-x"), None)
        .await;
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 16")
    );

    // Past the resident limit idle conversations make room: all 30 are served.
    for i in 0..30 {
        let response = server
            .send_text(V1, "hello", Some(&format!("r{i}")), None)
            .await;
        assert_eq!(
            task_of(&response)["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{response}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(server.server.engine.resident_contexts() <= 11);
    let ok = server.send_text(V1, "still fine", Some("r0"), None).await;
    assert_eq!(
        artifact_text(task_of(&ok)),
        "echo: still fine (turn 2; previously: \"hello\")"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn a_body_that_is_not_json_by_its_content_type_gets_415_and_content_type_not_supported() {
    let server = start_echo().await;
    let body = send(
        V1,
        json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}),
    );
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        for version in [None, Some(V1)] {
            let (status, answer) = server
                .post_raw(version, content_type, body.to_string().into_bytes())
                .await;
            assert_eq!(status, 415, "{content_type} {version:?}: {answer}");
            assert_eq!(answer["error"]["code"], json!(-32005), "{answer}");
            assert_eq!(answer["id"], Value::Null, "{answer}");
        }
    }
    // JSON under its A2A media type is JSON.
    let (status, answer) = server
        .post_raw(
            Some(V1),
            "application/a2a+json",
            body.to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"]["task"]["id"].is_string(), "{answer}");
    server.stop().await;
}
