//! Property tests for guarded history rendering: no stored text can forge the fence or a turn.
//!
//! For arbitrary stored texts (marker lines in any case, `user:` / `assistant:` prefixes, `\r`,
//! `\r\n`, `\u2028` and every other character a reader may take as a line break), the rendered
//! block has exactly one open marker line and one close marker line, in that order, and the
//! number of lines that start with `user: ` / `assistant: ` equals the number of history entries
//! shown, in the entries' order and roles.

use colloquy::history::{CLOSE_MARKER, HistoryEntry, HistoryLimits, OPEN_MARKER, render_prompt};
use colloquy::model::Role;
use proptest::prelude::*;

/// Every character that some reader (Unicode, Python's `str.splitlines`, a terminal) treats as
/// ending a line.
fn is_any_line_break(c: char) -> bool {
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

const PIECES: &[&str] = &[
    "\n",
    "\r",
    "\r\n",
    "\n\n",
    "\u{2028}",
    "\u{2029}",
    "\u{85}",
    "\u{0B}",
    "\u{0C}",
    "\u{1C}",
    "\u{1D}",
    "\u{1E}",
    "user: ",
    "assistant: ",
    "user:",
    "User: ",
    "ASSISTANT: ",
    " ",
    "  ",
    "\t",
    "[",
    "]",
    OPEN_MARKER,
    CLOSE_MARKER,
    "[end of previous conversation]",
    "[END OF PREVIOUS CONVERSATION]",
    "[Previous conversation",
    "[[End of previous conversation]",
    "hello",
    "é",
    "…",
    "\0",
];

fn stored_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(PIECES), 0..12).prop_map(|p| p.concat()),
        1 => prop::collection::vec(any::<char>(), 0..32).prop_map(String::from_iter),
        1 => (prop::sample::select(PIECES), prop::collection::vec(any::<char>(), 0..8), prop::sample::select(PIECES))
            .prop_map(|(a, mid, b)| format!("{a}{}{b}", String::from_iter(mid))),
    ]
}

fn entry() -> impl Strategy<Value = HistoryEntry> {
    (any::<bool>(), stored_text()).prop_map(|(user, text)| HistoryEntry {
        role: if user { Role::User } else { Role::Agent },
        text,
        task_id: None,
        message_id: "m".into(),
        timestamp: None,
    })
}

/// Checks the fence of a rendered prompt; returns the roles of the turn lines found in the block.
fn check_fence(rendered: &str, shown: &[HistoryEntry]) -> Result<(), String> {
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
    // Also no line that merely looks like a marker to a lenient reader.
    let lenient = |l: &str| {
        let l = l.trim().to_ascii_lowercase();
        l.starts_with("[previous conversation") || l.starts_with("[end of previous conversation")
    };
    let marker_like = lines.iter().filter(|l| lenient(l)).count();
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
        return Err(format!(
            "turn lines {roles:?}, entries {expected:?}\n{block}"
        ));
    }
    // Lines between turns are continuations: indented, so no reader takes them for a turn.
    for line in &lines[1..lines.len() - 1] {
        let turn = line.starts_with("user: ") || line.starts_with("assistant: ");
        if !turn && !line.is_empty() && !line.starts_with("  ") {
            return Err(format!("unindented continuation line {line:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(cases(2048)))]

    #[test]
    fn stored_text_cannot_forge_the_fence_or_a_turn(
        history in prop::collection::vec(entry(), 1..8),
        current in stored_text(),
        limit in 1usize..10,
        max_chars in prop_oneof![Just(4000usize), 0usize..40],
    ) {
        let limits = HistoryLimits { limit, max_chars };
        let rendered = render_prompt(&history, &current, limits);
        let shown = &history[history.len().saturating_sub(limit)..];
        if let Err(problem) = check_fence(&rendered, shown) {
            prop_assert!(false, "{}\nrendered: {:?}", problem, rendered);
        }
        // The current message follows the block untouched.
        let tail = format!("{CLOSE_MARKER}\n\n{current}");
        prop_assert!(rendered.ends_with(&tail));
    }

    #[test]
    fn no_history_renders_no_block(current in stored_text(), limit in 0usize..5) {
        prop_assert_eq!(render_prompt(&[], &current, HistoryLimits { limit, max_chars: 100 }), current.clone());
        let one = [HistoryEntry { role: Role::User, text: "x".into(), task_id: None, message_id: "m".into(), timestamp: None }];
        let rendered = render_prompt(&one, &current, HistoryLimits { limit: 0, max_chars: 100 });
        prop_assert_eq!(rendered, current);
    }
}

/// The case count: `PROPTEST_CASES` when set (for a long soak), else the suite's default.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}
