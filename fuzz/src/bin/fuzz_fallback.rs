//! A stable-Rust stand-in for `cargo fuzz run`: runs the same target functions over random
//! mutations of the seed inputs (byte flips, inserts, deletes, duplications, dictionary tokens,
//! splices), keeping inputs that reach deeper into the code as new seeds. No coverage feedback,
//! so it is a much weaker fuzzer than libFuzzer, but it runs anywhere.
//!
//! `cargo run --release --no-default-features --bin fuzz_fallback -- TARGET SECONDS [SEED]`
//! with TARGET `rpc_codec` or `history_render`. Seeds come from `seeds/TARGET/`; a failing input
//! is written to `artifacts/TARGET/crash-N` and the driver exits with status 1.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// xorshift64*: small, fast, deterministic for a given seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const RPC_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e999",
    "\\u0000",
    "\\ud800",
    "\"kind\":\"text\"",
    "\"kind\":\"file\"",
    "\"kind\":\"data\"",
    "\"kind\":\"task\"",
    "\"kind\":\"message\"",
    "\"kind\":\"status-update\"",
    "\"kind\":\"artifact-update\"",
    "\"text\":\"x\"",
    "\"raw\":\"AA==\"",
    "\"url\":\"u\"",
    "\"data\":{}",
    "\"data\":[1]",
    "\"file\":{\"bytes\":\"AA==\"}",
    "\"file\":{\"uri\":\"u\"}",
    "\"mediaType\":\"\"",
    "\"mimeType\":\"\"",
    "\"filename\":\"f\"",
    "\"name\":\"\"",
    "\"metadata\":{\"k\":1.5}",
    "\"role\":\"ROLE_USER\"",
    "\"role\":\"agent\"",
    "\"state\":\"TASK_STATE_COMPLETED\"",
    "\"state\":\"input-required\"",
    "\"final\":false",
    "\"append\":true",
    "\"lastChunk\":true",
    "\"timestamp\":\"0000-01-01T00:00:00+01:00\"",
    "\"timestamp\":\"9999-12-31T23:59:59-01:00\"",
    "\"timestamp\":\"2024-05-01T10:00:00.123456789Z\"",
    "\"timestamp\":\"2024-05-01T10:00:00Z\"",
    "\"statusUpdate\":",
    "\"artifactUpdate\":",
    "\"task\":",
    "\"message\":",
    "\"result\":",
    "\"messageId\":\"m\"",
    "\"contextId\":\"c\"",
    "\"taskId\":\"t\"",
    "\"history\":[]",
    "\"artifacts\":[]",
    "\"referenceTaskIds\":[\"a\"]",
    "\"extensions\":[1]",
];

const HISTORY_TOKENS: &[&str] = &[
    "\n",
    "\r",
    "\r\n",
    "\u{2028}",
    "\u{2029}",
    "\u{85}",
    "\u{0B}",
    "\u{0C}",
    "\u{1C}",
    "\u{1D}",
    "\u{1E}",
    "\u{FF}",
    "user: ",
    "assistant: ",
    "User:",
    " ",
    "  ",
    "[",
    "]",
    "[Previous conversation — for continuity reference only, not a new instruction]",
    "[End of previous conversation]",
    "[end of previous conversation]",
    "[END OF PREVIOUS CONVERSATION]",
    "[Previous conversation",
    "…",
    "é",
    "\0",
];

fn mutate(
    rng: &mut Rng,
    input: &mut Vec<u8>,
    corpus: &[Vec<u8>],
    tokens: &[&str],
    separator: Option<u8>,
) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            1 => {
                let at = rng.below(len + 1);
                input.insert(at, rng.next() as u8);
            }
            2 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(16));
                input.drain(at..at + n);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(32));
                let copy = input[at..at + n].to_vec();
                let to = rng.below(len + 1);
                input.splice(to..to, copy);
            }
            4 | 5 => {
                let token = tokens[rng.below(tokens.len())].as_bytes();
                let at = rng.below(len + 1);
                input.splice(at..at, token.iter().copied());
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let (from, to) = (rng.below(len + 1), rng.below(other.len() + 1));
                input.truncate(from);
                input.extend_from_slice(&other[to..]);
            }
            7 => {
                if let Some(sep) = separator {
                    let at = rng.below(len + 1);
                    input.insert(at, sep);
                }
            }
            _ => {}
        }
    }
    input.truncate(64 * 1024);
}

/// A target function, its dictionary, and the byte that separates its input's pieces.
type Target = (fn(&[u8]) -> u8, &'static [&'static str], Option<u8>);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: fuzz_fallback rpc_codec|history_render SECONDS [SEED]";
    let Some(target) = args.get(1) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let seconds: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let (run, tokens, separator): Target = match target.as_str() {
        "rpc_codec" => (colloquy_fuzz::rpc_codec, RPC_TOKENS, None),
        "history_render" => (colloquy_fuzz::history_render, HISTORY_TOKENS, Some(0xFF)),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(root.join("seeds").join(target))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    if corpus.is_empty() {
        corpus.push(b"{}".to_vec());
    }
    let seeds = corpus.len();
    // Quiet: a panic is reported once, below, with the input that caused it.
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Rng(seed | 1);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut execs: u64 = 0;
    let mut depths = [0u64; 4];
    let mut failures = 0u32;
    while Instant::now() < deadline {
        for _ in 0..256 {
            let mut input = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut input, &corpus, tokens, separator);
            execs += 1;
            match catch_unwind(AssertUnwindSafe(|| run(&input))) {
                Ok(depth) => {
                    depths[usize::from(depth).min(3)] += 1;
                    // Crude feedback: keep some inputs that got past decoding.
                    if depth >= 2 && corpus.len() < 20_000 && rng.below(64) == 0 {
                        corpus.push(input);
                    }
                }
                Err(panic) => {
                    failures += 1;
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let dir = root.join("artifacts").join(target);
                    let _ = std::fs::create_dir_all(&dir);
                    let path = dir.join(format!("crash-{failures}"));
                    let _ = std::fs::write(&path, &input);
                    eprintln!(
                        "FAILURE after {execs} executions: {message}\ninput saved to {}",
                        path.display()
                    );
                    if failures >= 5 {
                        break;
                    }
                }
            }
        }
        if failures >= 5 {
            break;
        }
    }
    println!(
        "{target}: {execs} executions in {seconds} s (seed {seed}), {seeds} seeds, corpus grew to {}, depth histogram {:?}, {failures} failures",
        corpus.len(),
        depths
    );
    if failures > 0 {
        std::process::exit(1);
    }
}
