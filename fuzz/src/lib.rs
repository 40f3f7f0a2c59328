//! The fuzz targets' bodies, shared by the libFuzzer binaries (`cargo fuzz run NAME`) and the
//! stable-Rust fallback driver (`cargo run --release --no-default-features --bin fuzz_fallback`).
//!
//! Each target panics when an invariant breaks; returning is success. The returned depth says how
//! far into the code the input got (the fallback driver keeps inputs that go deep as new seeds).

use colloquy::engine::StreamItem;
use colloquy::history::{CLOSE_MARKER, HistoryEntry, HistoryLimits, OPEN_MARKER, render_prompt};
use colloquy::model::{Message, Part, PartContent, Role, Task, TaskEvent};
use colloquy::protocol::codec::{
    TaskView, decode_message, decode_stream_item, encode_message, encode_stream_item,
};
use colloquy::protocol::{Method, RpcRequest, WireVersion};
use serde_json::{Value, json};

const VERSIONS: [WireVersion; 2] = [WireVersion::V1, WireVersion::V03];

fn other(version: WireVersion) -> WireVersion {
    match version {
        WireVersion::V1 => WireVersion::V03,
        WireVersion::V03 => WireVersion::V1,
    }
}

// ---- JSON-RPC decoding and version mapping ----

/// Bytes -> `RpcRequest::parse` -> method resolution and `decode_message` in both versions ->
/// encode -> decode. Nothing may panic; what decoded must re-encode to something that decodes
/// to the same model in its own version, and to the documented normal form in the other one.
pub fn rpc_codec(data: &[u8]) -> u8 {
    let Ok(request) = RpcRequest::parse(data) else {
        return 0;
    };
    let mut depth = 1;
    for version in VERSIONS {
        let _ = Method::resolve(version, &request.method);
        let params = &request.params;
        for candidate in [params.get("message"), Some(params)].into_iter().flatten() {
            if let Ok(message) = decode_message(version, candidate, "params.message") {
                depth = depth.max(2);
                check_message(version, &message);
            }
        }
        for candidate in [params.get("result"), Some(params)].into_iter().flatten() {
            if let Ok(item) = decode_stream_item(version, candidate) {
                depth = depth.max(3);
                check_stream_item(version, &item);
            }
        }
    }
    depth
}

fn check_message(version: WireVersion, message: &Message) {
    let wire = encode_message(version, message);
    let again = decode_message(version, &wire, "m")
        .unwrap_or_else(|e| panic!("our own {version:?} encoding does not decode: {e}\n{wire}"));
    assert_eq!(
        &again, message,
        "{version:?} re-encoding changed the message"
    );
    let target = other(version);
    let wire = encode_message(target, message);
    let crossed = decode_message(target, &wire, "m").unwrap_or_else(|e| {
        panic!("{version:?} message re-spoken as {target:?} does not decode: {e}\n{wire}")
    });
    assert_eq!(
        crossed,
        normal_message(target, message),
        "{version:?} -> {target:?} changed more than the documented normal form"
    );
}

fn check_stream_item(version: WireVersion, item: &StreamItem) {
    let view = TaskView::FULL;
    let wire = encode_stream_item(version, item, view);
    let again = decode_stream_item(version, &wire)
        .unwrap_or_else(|e| panic!("our own {version:?} encoding does not decode: {e}\n{wire}"));
    assert_eq!(
        &again, item,
        "{version:?} re-encoding changed the item\n{wire}"
    );
    let target = other(version);
    let wire = encode_stream_item(target, item, view);
    let crossed = decode_stream_item(target, &wire).unwrap_or_else(|e| {
        panic!("{version:?} item re-spoken as {target:?} does not decode: {e}\n{wire}")
    });
    assert_eq!(
        crossed,
        normal_item(target, item),
        "{version:?} -> {target:?} changed more than the documented normal form\n{wire}"
    );
}

/// What a model looks like after a trip through `target` (see tests/it/props_codec.rs): v1.0 drops
/// empty names (proto JSON defaults) and derives `final` from the state; v0.3 wraps non-object
/// data and has no names on text and data parts.
fn normal_part(target: WireVersion, part: &Part) -> Part {
    let mut part = part.clone();
    match target {
        WireVersion::V1 => {
            part.media_type = part.media_type.filter(|s| !s.is_empty());
            part.name = part.name.filter(|s| !s.is_empty());
        }
        WireVersion::V03 => {
            if let PartContent::Data { data } = &mut part.content
                && !data.is_object()
            {
                *data = json!({ "value": data.take() });
            }
            if matches!(
                part.content,
                PartContent::Text { .. } | PartContent::Data { .. }
            ) {
                part.media_type = None;
                part.name = None;
            }
        }
    }
    part
}

fn normal_parts(target: WireVersion, parts: &[Part]) -> Vec<Part> {
    parts.iter().map(|p| normal_part(target, p)).collect()
}

fn normal_message(target: WireVersion, message: &Message) -> Message {
    Message {
        parts: normal_parts(target, &message.parts),
        ..message.clone()
    }
}

fn normal_task(target: WireVersion, task: &Task) -> Task {
    let mut task = task.clone();
    task.status.message = task.status.message.map(|m| normal_message(target, &m));
    task.history = task
        .history
        .iter()
        .map(|m| normal_message(target, m))
        .collect();
    for artifact in &mut task.artifacts {
        artifact.parts = normal_parts(target, &artifact.parts);
    }
    task
}

fn normal_item(target: WireVersion, item: &StreamItem) -> StreamItem {
    match item {
        StreamItem::Task(task) => StreamItem::Task(normal_task(target, task)),
        StreamItem::Message(message) => StreamItem::Message(normal_message(target, message)),
        StreamItem::Event(TaskEvent::Status {
            task_id,
            context_id,
            status,
            is_final,
        }) => {
            let mut status = status.clone();
            status.message = status.message.map(|m| normal_message(target, &m));
            StreamItem::Event(TaskEvent::Status {
                task_id: task_id.clone(),
                context_id: context_id.clone(),
                is_final: match target {
                    WireVersion::V1 => status.state.ends_turn(),
                    WireVersion::V03 => *is_final,
                },
                status,
            })
        }
        StreamItem::Event(TaskEvent::Artifact {
            task_id,
            context_id,
            artifact,
            append,
            last_chunk,
        }) => {
            let mut artifact = artifact.clone();
            artifact.parts = normal_parts(target, &artifact.parts);
            StreamItem::Event(TaskEvent::Artifact {
                task_id: task_id.clone(),
                context_id: context_id.clone(),
                artifact,
                append: *append,
                last_chunk: *last_chunk,
            })
        }
    }
}

// ---- history rendering ----

/// Bytes -> limits and history texts -> `render_prompt`: the fence cannot be forged.
///
/// Layout: byte 0 picks the limit (1..=16), byte 1 `max_chars` (0..=63, or 4000 when >= 64);
/// the rest splits on 0xFF (never in UTF-8) into entries, each one role byte and a lossy UTF-8
/// text; the last piece is the current message.
pub fn history_render(data: &[u8]) -> u8 {
    let (limit, max_chars, rest) = match data {
        [l, m, rest @ ..] => (
            usize::from(l % 16) + 1,
            if *m >= 64 { 4000 } else { usize::from(*m) },
            rest,
        ),
        _ => return 0,
    };
    let mut pieces: Vec<&[u8]> = rest.split(|b| *b == 0xFF).collect();
    let current = String::from_utf8_lossy(pieces.pop().unwrap_or_default());
    let history: Vec<HistoryEntry> = pieces
        .iter()
        .map(|piece| {
            let (role, text) = piece.split_first().map_or((0, &[][..]), |(r, t)| (*r, t));
            HistoryEntry {
                role: if role % 2 == 0 {
                    Role::User
                } else {
                    Role::Agent
                },
                text: String::from_utf8_lossy(text).into_owned(),
                task_id: None,
                message_id: "m".into(),
                timestamp: None,
            }
        })
        .collect();
    let limits = HistoryLimits { limit, max_chars };
    let rendered = render_prompt(&history, &current, limits);
    let shown = &history[history.len().saturating_sub(limit)..];
    if shown.is_empty() {
        assert_eq!(rendered, current, "no history renders no block");
        return 1;
    }
    if let Err(problem) = check_fence(&rendered, shown) {
        panic!("{problem}\nrendered: {rendered:?}");
    }
    let tail = format!("{CLOSE_MARKER}\n\n{current}");
    assert!(
        rendered.ends_with(&tail),
        "the current message follows the block"
    );
    2
}

/// Every character that some reader (Unicode, Python's `str.splitlines`) ends a line at.
pub fn is_any_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{0B}'
            | '\u{0C}'
            | '\u{1C}'
            | '\u{1D}'
            | '\u{1E}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// One open and one close marker line framing the block, nothing marker-like inside, one
/// `user: ` / `assistant: ` line per shown entry in order, every other line indented.
pub fn check_fence(rendered: &str, shown: &[HistoryEntry]) -> Result<(), String> {
    let end = format!("\n{CLOSE_MARKER}\n\n");
    let Some(block_end) = rendered.find(&end) else {
        return Err("no close marker line".into());
    };
    let block = &rendered[..block_end + 1 + CLOSE_MARKER.len()];
    let lines: Vec<&str> = block.split(is_any_line_break).collect();
    let opens = lines.iter().filter(|l| **l == OPEN_MARKER).count();
    let closes = lines.iter().filter(|l| **l == CLOSE_MARKER).count();
    if opens != 1 || closes != 1 {
        return Err(format!("{opens} open and {closes} close marker lines"));
    }
    if lines.first() != Some(&OPEN_MARKER) || lines.last() != Some(&CLOSE_MARKER) {
        return Err("the markers do not frame the block".into());
    }
    let marker_like = lines
        .iter()
        .filter(|l| {
            let l = l.trim().to_ascii_lowercase();
            l.starts_with("[previous conversation")
                || l.starts_with("[end of previous conversation")
        })
        .count();
    if marker_like != 2 {
        return Err(format!("{marker_like} lines look like markers"));
    }
    let roles: Vec<Role> = lines
        .iter()
        .filter_map(|l| {
            if l.starts_with("user: ") {
                Some(Role::User)
            } else if l.starts_with("assistant: ") {
                Some(Role::Agent)
            } else {
                None
            }
        })
        .collect();
    let expected: Vec<Role> = shown.iter().map(|e| e.role).collect();
    if roles != expected {
        return Err(format!("turn lines {roles:?}, entries {expected:?}"));
    }
    for line in &lines[1..lines.len() - 1] {
        let turn = line.starts_with("user: ") || line.starts_with("assistant: ");
        if !turn && !line.is_empty() && !line.starts_with("  ") {
            return Err(format!("unindented continuation line {line:?}"));
        }
    }
    Ok(())
}

/// Keeps `Value` in the public signature used by the seeds writer.
pub fn request(method: &str, params: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .unwrap_or_default()
}
