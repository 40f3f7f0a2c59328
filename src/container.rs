//! What the container (cgroup) this process runs in allows it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The memory limit of this process's cgroup in bytes, if it has one: the lowest `memory.max`
/// (cgroup v2) or `memory.limit_in_bytes` (v1) of its cgroup and the cgroups above it. None when
/// unlimited or not in a cgroup.
///
/// The cgroup is found through `/proc/self/cgroup`: in a container with its own cgroup namespace
/// that is the root of `/sys/fs/cgroup`, but a systemd unit's `MemoryMax=` or a cgroup made by
/// hand is a folder below it.
///
/// Read once per process: every budget sized from it at start (resident conversations, the
/// write-ahead log's tables) sees the same limit.
pub fn memory_limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        lowest_limit(&membership, |path| std::fs::read_to_string(path).ok())
    })
}

/// The lowest limit among the files `limit_files` names that `read` finds.
fn lowest_limit(membership: &str, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    limit_files(membership)
        .iter()
        .filter_map(|file| read(file).and_then(|text| parse_limit(&text)))
        .min()
}

/// The memory limit files of the cgroups in `membership` (`/proc/self/cgroup`'s lines,
/// `id:controllers:path`) and of every cgroup above them; the root's when it names none.
fn limit_files(membership: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (base, file) = if id == "0" && controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        for folder in Path::new(path).ancestors() {
            let relative = folder.strip_prefix("/").unwrap_or(folder);
            files.push(Path::new(base).join(relative).join(file));
        }
    }
    if files.is_empty() {
        files.push("/sys/fs/cgroup/memory.max".into());
        files.push("/sys/fs/cgroup/memory/memory.limit_in_bytes".into());
    }
    files
}

/// A cgroup memory limit as written: `max` (v2) or a huge number (v1's "unlimited") mean none.
fn parse_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    // cgroup v1 writes about 2^63 rounded to the page size for "no limit".
    (bytes < 1 << 60).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::{lowest_limit, parse_limit};
    use std::path::Path;

    #[test]
    fn limits_are_read_as_cgroups_write_them() {
        assert_eq!(parse_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    /// A fake `/sys/fs/cgroup` holding `files`.
    fn reader(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        move |path| {
            files
                .iter()
                .find(|(p, _)| Path::new(p) == path)
                .map(|(_, t)| t.clone())
        }
    }

    #[test]
    fn the_limit_is_the_lowest_on_the_way_to_the_root() {
        // A systemd service under a slice, cgroup v2, no cgroup namespace.
        let read = reader(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/app.slice/memory.max", "1073741824\n"),
            (
                "/sys/fs/cgroup/app.slice/colloquy.service/memory.max",
                "max\n",
            ),
        ]);
        let membership = "0::/app.slice/colloquy.service\n";
        assert_eq!(lowest_limit(membership, &read), Some(1 << 30));

        // cgroup v1: the memory controller's line, among others.
        let read = reader(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
                "536870912\n",
            ),
        ]);
        let membership = "8:pids:/\n4:memory:/job\n1:cpu:/\n0::/\n";
        assert_eq!(lowest_limit(membership, &read), Some(512 << 20));
    }

    #[test]
    fn a_container_with_its_own_namespace_reads_the_root() {
        let read = reader(&[("/sys/fs/cgroup/memory.max", "268435456\n")]);
        assert_eq!(lowest_limit("0::/\n", &read), Some(256 << 20));
        // No /proc: the root's files.
        assert_eq!(lowest_limit("", &read), Some(256 << 20));
        assert_eq!(lowest_limit("0::/\n", reader(&[])), None);
    }
}
