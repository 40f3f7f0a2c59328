//! Where a data folder's bytes go, by record type: opens sled's tree directly (the server must
//! be stopped; a clean stop has checkpointed everything into it) and sums keys and values.
//!
//! ```text
//! cargo bench --bench store_bytes -- DIR [TURNS]
//! ```
//! With TURNS (the turns the folder holds), also prints bytes per turn.

use colloquy::store::embedded::{KvBackend, SledBackend};
use std::collections::BTreeMap;
use std::ops::Bound;

fn record_type(first: u8) -> &'static str {
    match first {
        b'c' => "conversation metadata (c)",
        b'M' => "messages (M)",
        b'm' => "messages under hashed keys (m)",
        b't' => "tasks (t)",
        b'I' => "tasks by conversation index (I)",
        b'i' => "tasks by conversation index under hashed keys (i)",
        b'p' => "tasks by principal index (p)",
        b'l' => "conversations by principal index (l)",
        b'r' => "running-task index (r)",
        _ => "other",
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let dir = args.next().ok_or("usage: store_bytes DIR [TURNS]")?;
    let turns: Option<u64> = args.next().map(|t| t.parse()).transpose()?;
    let sled = SledBackend::open(std::path::Path::new(&dir), 16 << 20)?;
    let mut by_type: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for entry in sled.scan(Bound::Unbounded, Bound::Unbounded, false) {
        let (key, value) = entry?;
        let row = by_type
            .entry(record_type(key.first().copied().unwrap_or(0)))
            .or_default();
        row.0 += 1;
        row.1 += key.len() as u64;
        row.2 += value.len() as u64;
    }
    let on_disk = sled.size_on_disk()?;
    let logical: u64 = by_type.values().map(|(_, k, v)| k + v).sum();
    let per_turn =
        |bytes: u64| turns.map_or(String::new(), |t| format!("{:.0}", bytes as f64 / t as f64));
    println!("| record type | records | key bytes | value bytes | bytes per turn |");
    println!("|---|---:|---:|---:|---:|");
    for (name, (count, keys, values)) in &by_type {
        println!(
            "| {name} | {count} | {keys} | {values} | {} |",
            per_turn(keys + values)
        );
    }
    println!("| all records | | | {logical} | {} |", per_turn(logical));
    println!("| sled on disk | | | {on_disk} | {} |", per_turn(on_disk));
    println!(
        "space amplification (on disk / records): {:.2}",
        on_disk as f64 / logical.max(1) as f64
    );
    Ok(())
}
