//! Property tests for the two wire-version mappings onto the internal model.
//!
//! For arbitrary messages, parts, tasks, send results and stream events:
//! - model -> v1.0 JSON -> (text and back) -> model is the identity;
//! - the same for v0.3, on the part of the model v0.3 can carry;
//! - v0.3 JSON -> model -> v1.0 JSON -> model is the identity.
//!
//! What the generators leave out, and why (each is a property of the wire formats, not a loss in
//! colloquy):
//! - `Message::timestamp` is not on the wire in either version: always `None` here.
//! - v1.0 is proto JSON, where an empty string is the default and so "absent": a part's
//!   `mediaType` / `filename` of `""` decode as `None`. Generated names are non-empty.
//! - JSON `null` is "absent" in both versions, so a data part's payload is never `null`.
//! - v0.3 data parts hold a JSON object (other values are wrapped as `{"value": ..}` on the way
//!   out), and v0.3 text and data parts have no `mimeType` / `name`: the v0.3 profile generates
//!   object payloads and names only on file parts.
//! - v1.0 status-update events have no `final` flag: a decoded event is final exactly when its
//!   state ends a turn, so v1.0 events are generated that way. v0.3 carries `final` as is.
//! - Timestamps are milliseconds (what both versions carry) from year 1 to year 9999.
//! - JSON numbers are integers: serde_json's default float parsing may differ in the last bit
//!   after a text round trip, which is serde_json's business, not the mapping's.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use colloquy::engine::StreamItem;
use colloquy::model::{
    Artifact, Message, Metadata, Part, PartContent, Role, SendResult, Task, TaskEvent, TaskState,
    TaskStatus,
};
use colloquy::protocol::WireVersion;
use colloquy::protocol::codec::{
    self, TaskView, decode_message, decode_send_result, decode_stream_item, decode_task,
    encode_event, encode_message, encode_send_result, encode_stream_item, encode_task,
};
use proptest::prelude::*;
use serde_json::Value;

/// What a generated model must be representable in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Profile {
    /// Everything v1.0 carries.
    V1,
    /// What v0.3 (and so also v1.0) carries.
    V03,
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(any::<char>(), 0..24).prop_map(String::from_iter),
        "[a-z0-9 /._:-]{0,16}",
    ]
}

fn non_empty_text() -> impl Strategy<Value = String> {
    text().prop_filter("non-empty", |s| !s.is_empty())
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Metadata> {
    prop::collection::btree_map(text(), json_value(), 0..4).prop_map(|m| m.into_iter().collect())
}

fn metadata() -> impl Strategy<Value = Option<Metadata>> {
    prop::option::of(json_object())
}

fn timestamp() -> impl Strategy<Value = DateTime<Utc>> {
    (-62_135_596_800_000i64..=253_402_300_799_999i64)
        .prop_map(|ms| DateTime::from_timestamp_millis(ms).expect("in range"))
}

fn base64_bytes() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 0..32)
        .prop_map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn part(profile: Profile) -> impl Strategy<Value = Part> {
    let data = match profile {
        Profile::V1 => json_value()
            .prop_filter("null is absent", |v| !v.is_null())
            .boxed(),
        Profile::V03 => json_object().prop_map(Value::Object).boxed(),
    };
    let content = prop_oneof![
        text().prop_map(|text| PartContent::Text { text }),
        base64_bytes().prop_map(|base64| PartContent::FileBytes { base64 }),
        text().prop_map(|url| PartContent::FileUrl { url }),
        data.prop_map(|data| PartContent::Data { data }),
    ];
    let name = || prop::option::of(non_empty_text());
    (content, name(), name(), metadata()).prop_map(move |(content, media_type, name, metadata)| {
        let is_file = matches!(
            content,
            PartContent::FileBytes { .. } | PartContent::FileUrl { .. }
        );
        let named = profile == Profile::V1 || is_file;
        Part {
            content,
            media_type: media_type.filter(|_| named),
            name: name.filter(|_| named),
            metadata,
        }
    })
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::User), Just(Role::Agent)]
}

fn state() -> impl Strategy<Value = TaskState> {
    prop::sample::select(TaskState::ALL.to_vec())
}

fn message(profile: Profile) -> impl Strategy<Value = Message> {
    (
        text(),
        role(),
        prop::collection::vec(part(profile), 0..4),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::collection::vec(text(), 0..3),
        metadata(),
        prop::collection::vec(text(), 0..3),
    )
        .prop_map(
            |(
                message_id,
                role,
                parts,
                context_id,
                task_id,
                reference_task_ids,
                metadata,
                extensions,
            )| Message {
                message_id,
                role,
                parts,
                context_id,
                task_id,
                reference_task_ids,
                metadata,
                extensions,
                timestamp: None,
            },
        )
}

fn status(profile: Profile) -> impl Strategy<Value = TaskStatus> {
    (state(), prop::option::of(message(profile)), timestamp()).prop_map(
        |(state, message, timestamp)| TaskStatus {
            state,
            message,
            timestamp,
        },
    )
}

fn artifact(profile: Profile) -> impl Strategy<Value = Artifact> {
    (
        text(),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::collection::vec(part(profile), 0..4),
        metadata(),
    )
        .prop_map(
            |(artifact_id, name, description, parts, metadata)| Artifact {
                artifact_id,
                name,
                description,
                parts,
                metadata,
            },
        )
}

fn task(profile: Profile) -> impl Strategy<Value = Task> {
    (
        text(),
        text(),
        status(profile),
        prop::collection::vec(artifact(profile), 0..3),
        prop::collection::vec(message(profile), 0..3),
        metadata(),
    )
        .prop_map(
            |(id, context_id, status, artifacts, history, metadata)| Task {
                id,
                context_id,
                status,
                artifacts,
                history,
                metadata,
            },
        )
}

fn event(profile: Profile, version: WireVersion) -> impl Strategy<Value = TaskEvent> {
    let status_event = (text(), text(), status(profile), any::<bool>()).prop_map(
        move |(task_id, context_id, status, is_final)| TaskEvent::Status {
            task_id,
            context_id,
            is_final: match version {
                WireVersion::V1 => status.state.ends_turn(),
                WireVersion::V03 => is_final,
            },
            status,
        },
    );
    let artifact_event = (
        text(),
        text(),
        artifact(profile),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(task_id, context_id, artifact, append, last_chunk)| TaskEvent::Artifact {
                task_id,
                context_id,
                artifact,
                append,
                last_chunk,
            },
        );
    prop_oneof![status_event, artifact_event]
}

/// Through the bytes a peer would send, as the front and the client read them.
fn through_text(value: &Value) -> Value {
    let bytes = serde_json::to_vec(value).expect("serialises");
    serde_json::from_slice(&bytes).expect("parses")
}

fn message_round_trip(version: WireVersion, message: &Message) -> Message {
    let wire = through_text(&encode_message(version, message));
    decode_message(version, &wire, "message")
        .unwrap_or_else(|e| panic!("decoding our own {version:?} message {wire}: {e}"))
}

fn task_round_trip(version: WireVersion, task: &Task) -> Task {
    let wire = through_text(&encode_task(version, task, TaskView::FULL));
    decode_task(version, &wire, "task")
        .unwrap_or_else(|e| panic!("decoding our own {version:?} task {wire}: {e}"))
}

fn event_round_trip(version: WireVersion, event: &TaskEvent) -> TaskEvent {
    let wire = through_text(&encode_event(version, event));
    match decode_stream_item(version, &wire) {
        Ok(StreamItem::Event(event)) => event,
        other => panic!("decoding our own {version:?} event {wire}: {other:?}"),
    }
}

const BOTH: [(WireVersion, Profile); 2] = [
    (WireVersion::V1, Profile::V1),
    (WireVersion::V03, Profile::V03),
];

proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(cases(256)))]

    #[test]
    fn v1_messages_round_trip(message in message(Profile::V1)) {
        prop_assert_eq!(message_round_trip(WireVersion::V1, &message), message);
    }

    #[test]
    fn v03_messages_round_trip(message in message(Profile::V03)) {
        prop_assert_eq!(message_round_trip(WireVersion::V03, &message), message);
    }

    #[test]
    fn parts_round_trip(v1 in part(Profile::V1), v03 in part(Profile::V03)) {
        for (version, part) in [(WireVersion::V1, &v1), (WireVersion::V03, &v03)] {
            let wire = through_text(&codec::encode_part(version, part));
            let decoded = codec::decode_part(version, &wire, "part");
            prop_assert_eq!(decoded.as_ref(), Ok(part), "{:?}: {}", version, wire);
        }
    }

    #[test]
    fn v03_data_parts_that_are_not_objects_are_wrapped(data in json_value()) {
        prop_assume!(!data.is_object() && !data.is_null());
        let part = Part { content: PartContent::Data { data: data.clone() }, media_type: None, name: None, metadata: None };
        let wire = codec::encode_part(WireVersion::V03, &part);
        let decoded = codec::decode_part(WireVersion::V03, &wire, "part").expect("decodes");
        prop_assert_eq!(decoded.content, PartContent::Data { data: serde_json::json!({ "value": data }) });
    }

    #[test]
    fn state_and_role_names_round_trip(state in state(), role in role()) {
        for (version, _) in BOTH {
            prop_assert_eq!(codec::parse_state(version, codec::state_name(version, state)), Some(state));
            prop_assert_eq!(codec::parse_role(version, codec::role_name(version, role)), Some(role));
        }
    }
}

proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(cases(96)))]

    #[test]
    fn v1_tasks_round_trip(task in task(Profile::V1)) {
        prop_assert_eq!(task_round_trip(WireVersion::V1, &task), task);
    }

    #[test]
    fn v03_tasks_round_trip(task in task(Profile::V03)) {
        prop_assert_eq!(task_round_trip(WireVersion::V03, &task), task);
    }

    #[test]
    fn v1_events_round_trip(event in event(Profile::V1, WireVersion::V1)) {
        prop_assert_eq!(event_round_trip(WireVersion::V1, &event), event);
    }

    #[test]
    fn v03_events_round_trip(event in event(Profile::V03, WireVersion::V03)) {
        prop_assert_eq!(event_round_trip(WireVersion::V03, &event), event);
    }

    /// Send results and stream items: `{"task": ..}` / `{"message": ..}` wrappers in v1.0, bare in v0.3.
    #[test]
    fn send_results_round_trip(task in task(Profile::V03), message in message(Profile::V03)) {
        for (version, _) in BOTH {
            for result in [SendResult::Task(task.clone()), SendResult::Message(message.clone())] {
                let text = encode_send_result(version, &result, TaskView::FULL);
                let wire: Value = serde_json::from_slice(text.as_bytes()).expect("parses");
                let decoded = decode_send_result(version, &wire);
                prop_assert_eq!(decoded.as_ref(), Ok(&result), "{:?}: {}", version, wire);
            }
            let item = StreamItem::Task(task.clone());
            let wire = through_text(&encode_stream_item(version, &item, TaskView::FULL));
            let decoded = decode_stream_item(version, &wire);
            prop_assert_eq!(decoded.as_ref(), Ok(&item));
        }
    }

    /// A v0.3 peer's message, task or event, re-spoken as v1.0, means the same thing.
    #[test]
    fn v03_to_model_to_v1_to_model(
        message in message(Profile::V03),
        task in task(Profile::V03),
        event in event(Profile::V03, WireVersion::V1),
    ) {
        let from_v03 = message_round_trip(WireVersion::V03, &message);
        prop_assert_eq!(&message_round_trip(WireVersion::V1, &from_v03), &from_v03);
        prop_assert_eq!(from_v03, message);

        let from_v03 = task_round_trip(WireVersion::V03, &task);
        prop_assert_eq!(&task_round_trip(WireVersion::V1, &from_v03), &from_v03);
        prop_assert_eq!(from_v03, task);

        let from_v03 = event_round_trip(WireVersion::V03, &event);
        prop_assert_eq!(&event_round_trip(WireVersion::V1, &from_v03), &from_v03);
        prop_assert_eq!(from_v03, event);
    }
}

/// Found by the fuzzer: a peer's status time with sub-millisecond digits, or one that lands
/// outside years 0000-9999 once converted to UTC, decoded to a time we could not pass on
/// unchanged. Decoding now keeps milliseconds and refuses such years.
#[test]
fn decoded_times_re_encode_to_themselves() {
    for (version, state) in [
        (WireVersion::V1, "TASK_STATE_WORKING"),
        (WireVersion::V03, "working"),
    ] {
        for (text, expected) in [
            (
                "2024-05-01T10:00:00.1023Z",
                Some("2024-05-01T10:00:00.102Z"),
            ),
            (
                "2024-05-01T12:00:00.999999999+02:00",
                Some("2024-05-01T10:00:00.999Z"),
            ),
            ("0000-01-01T00:00:00Z", Some("0000-01-01T00:00:00.000Z")),
            ("0000-01-01T00:00:00+01:00", None),
            ("9999-12-31T23:59:59-01:00", None),
        ] {
            let wire = serde_json::json!({"state": state, "timestamp": text});
            let decoded = codec::decode_status(version, &wire, "status");
            match expected {
                Some(expected) => {
                    let status = decoded.expect("decodes");
                    assert_eq!(colloquy::model::format_time(&status.timestamp), expected);
                    let task = Task {
                        id: "t".into(),
                        context_id: "c".into(),
                        status,
                        artifacts: Vec::new(),
                        history: Vec::new(),
                        metadata: None,
                    };
                    assert_eq!(task_round_trip(version, &task), task);
                }
                None => assert!(decoded.is_err(), "{text} is refused"),
            }
        }
    }
}

/// The case count: `PROPTEST_CASES` when set (for a long soak), else the suite's default.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}
