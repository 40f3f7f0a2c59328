//! What the container (cgroup) this process runs in allows it.

/// The memory limit of this process's cgroup in bytes, if it has one: cgroup v2's `memory.max`,
/// else v1's `memory.limit_in_bytes`. None when unlimited or not in a cgroup.
pub fn memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    read("/sys/fs/cgroup/memory.max")
        .and_then(|text| parse_limit(&text))
        .or_else(|| {
            read("/sys/fs/cgroup/memory/memory.limit_in_bytes").and_then(|text| parse_limit(&text))
        })
}

/// A cgroup memory limit as written: `max` (v2) or a huge number (v1's "unlimited") mean none.
fn parse_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    // cgroup v1 writes about 2^63 rounded to the page size for "no limit".
    (bytes < 1 << 60).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::parse_limit;

    #[test]
    fn limits_are_read_as_cgroups_write_them() {
        assert_eq!(parse_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }
}
