//! Making file-system changes survive a power cut.
//!
//! A write, a new file, a rename or a delete reaches the disk only when something syncs it: the
//! file's own `fsync`/`fdatasync` for its bytes and size, and an `fsync` of the folder for its
//! entries (a file's name lives in its folder). Until then a power cut may drop it, even though
//! every process (and `kill -9`) already sees it. These are the syncs colloquy's durability rests
//! on; `docs/durability.md` says where each is used and what it prevents.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Makes the entries of folder `dir` (files created, renamed or deleted in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and any missing parents, and makes each new entry durable in its parent.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    // The first existing ancestor: every folder below it is new, and so is its entry.
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(parent) => existing = parent,
            None => break,
        }
    }
    fs::create_dir_all(dir)?;
    for folder in dir.ancestors() {
        if folder == existing {
            break;
        }
        sync_dir(parent_of(folder))?;
    }
    Ok(())
}

/// The folder holding `path`'s entry (`.` for a bare relative name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// How many files and folders [`sync_tree`] synced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub files: u64,
    pub folders: u64,
}

/// Syncs every file and folder under `dir` (and `dir` itself), except the entries of `dir`
/// named in `skip`. For a store whose own flush does not sync everything it wrote.
pub fn sync_tree(dir: &Path, skip: &[&str]) -> io::Result<Synced> {
    let mut synced = Synced::default();
    sync_tree_into(dir, skip, &mut synced)?;
    Ok(synced)
}

fn sync_tree_into(dir: &Path, skip: &[&str], synced: &mut Synced) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if skip.iter().any(|s| entry.file_name() == *s) {
            continue;
        }
        // An entry deleted since the listing (an old snapshot, a freed blob) has nothing to keep.
        let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
        };
        let result = if kind.is_dir() {
            sync_tree_into(&entry.path(), &[], synced)
        } else if kind.is_file() {
            File::open(entry.path())
                .and_then(|file| file.sync_all())
                .map(|()| synced.files += 1)
        } else {
            Ok(())
        };
        match result {
            Err(e) if !gone(&e) => return Err(e),
            _ => {}
        }
    }
    sync_dir(dir)?;
    synced.folders += 1;
    Ok(())
}

/// Replaces `path` with `bytes` so that a power cut leaves either the old file or the new one:
/// written to a temporary file beside it, synced, renamed over it, and the folder synced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = parent_of(path);
    create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        rand::random::<u32>()
    ));
    let written = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_dir_all_makes_every_new_level() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        // Existing folders are fine too.
        create_dir_all(&deep).unwrap();
    }

    #[test]
    fn a_bare_relative_name_lives_in_the_current_folder() {
        // Its entry is synced there: `--data mydata` must not leave the folder's name unsynced.
        assert_eq!(parent_of(Path::new("data")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/data")), Path::new("a"));
        assert_eq!(parent_of(Path::new("/data")), Path::new("/"));
    }

    #[test]
    fn sync_tree_counts_what_it_synced_and_skips_what_it_is_told() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("blobs")).unwrap();
        fs::create_dir_all(root.path().join("wal")).unwrap();
        fs::write(root.path().join("db"), b"x").unwrap();
        fs::write(root.path().join("blobs/1"), b"y").unwrap();
        fs::write(root.path().join("wal/0.log"), b"z").unwrap();
        let synced = sync_tree(root.path(), &["wal"]).unwrap();
        assert_eq!(
            synced,
            Synced {
                files: 2,
                folders: 2
            }
        );
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("new/sessions.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("sessions.json")]);
    }
}
