//! crashfs: a FUSE filesystem that forgets, on command, everything not yet synced, as a power
//! cut does.
//!
//! Files and folders live in memory, each in two versions: the live one that reads see, and the
//! durable one that a power cut leaves. Every change (write, truncate, and for a folder every new
//! or removed entry: create, mkdir, rename, unlink) is applied to the live version and queued as
//! pending, numbered in the order it happened. `fsync`/`fdatasync` of a file makes that file's
//! pending changes durable; `fsync` of a folder makes its entries durable. Nothing else does: not
//! `close`, not `sync_file_range`, not a sync of some other file. This is POSIX's promise and no
//! more, which is what a program may count on across a power cut.
//!
//! [`Mount::cut_power`] then drops the pending changes, or keeps some of them as real devices may:
//! a prefix in the order they happened (a device that writes in order), or any subset (one with a
//! volatile write cache that reorders), and a kept write may be torn after any sector. Whatever is unreachable from the root after the cut is
//! gone. Nothing here is for production: it exists so that a test can check a program's sync
//! discipline rather than the page cache's kindness.

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The kernel must ask again every time: after a cut, what it cached may be gone.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

/// Which of the changes not yet synced survive a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Survivors {
    /// None of them.
    None,
    /// The first N, in the order they happened, N chosen at random.
    Prefix,
    /// Each one with probability one half, independently.
    Subset,
}

/// What a power cut did.
#[derive(Debug, Default)]
pub struct CutReport {
    pub pending: usize,
    pub kept: usize,
}

/// Counts of what the program asked for since the mount.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncCounts {
    pub file_syncs: u64,
    pub dir_syncs: u64,
}

/// A mounted crashfs. Unmounts when dropped.
pub struct Mount {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    path: PathBuf,
}

impl Mount {
    /// Mounts an empty crashfs at `mountpoint` (an existing empty folder).
    pub fn new(mountpoint: &Path) -> std::io::Result<Mount> {
        let state = Arc::new(Mutex::new(State::new()));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("crashfs".into()),
            MountOption::RW,
            MountOption::NoAtime,
        ];
        let filesystem = CrashFs {
            state: state.clone(),
        };
        let session = fuser::spawn_mount(filesystem, mountpoint, &config)?;
        Ok(Mount {
            state,
            session: Some(session),
            path: mountpoint.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets what was never synced, keeping `survivors` of it. Call it only once every process
    /// using the filesystem is dead: they would otherwise see their files change under them.
    pub fn cut_power(&self, survivors: Survivors, rng: &mut impl Rng) -> CutReport {
        lock(&self.state).cut(survivors, rng)
    }

    pub fn sync_counts(&self) -> SyncCounts {
        lock(&self.state).syncs
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct CrashFs {
    state: Arc<Mutex<State>>,
}

/// A change not yet synced, with its place in the order of all changes.
struct Pending<C> {
    order: u64,
    change: C,
}

enum FileChange {
    Write { offset: usize, data: Vec<u8> },
    Truncate(usize),
}

enum DirChange {
    Link(OsString, u64),
    Unlink(OsString),
}

struct FileNode {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending<FileChange>>,
}

struct DirNode {
    parent: u64,
    live: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
    pending: Vec<Pending<DirChange>>,
}

enum Body {
    File(FileNode),
    Dir(DirNode),
}

struct Node {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    next_order: u64,
    /// Open handles per node: an unlinked file stays readable while open.
    open: HashMap<u64, u32>,
    syncs: SyncCounts,
}

impl FileChange {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            FileChange::Write {
                offset,
                data: bytes,
            } => {
                let end = offset + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*offset..end].copy_from_slice(bytes);
            }
            FileChange::Truncate(len) => data.resize(*len, 0),
        }
    }
}

/// A device may have written only some sectors of a write when the power went: one kept write
/// in four keeps only its first sectors.
fn tear(change: FileChange, rng: &mut impl Rng) -> FileChange {
    const SECTOR: usize = 512;
    match change {
        FileChange::Write { offset, mut data } if data.len() > SECTOR && rng.gen_bool(0.25) => {
            let sectors = rng.gen_range(0..data.len().div_ceil(SECTOR));
            data.truncate(sectors * SECTOR);
            FileChange::Write { offset, data }
        }
        other => other,
    }
}

impl DirChange {
    fn apply(&self, entries: &mut BTreeMap<OsString, u64>) {
        match self {
            DirChange::Link(name, ino) => {
                entries.insert(name.clone(), *ino);
            }
            DirChange::Unlink(name) => {
                entries.remove(name);
            }
        }
    }
}

impl State {
    fn new() -> State {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = Node {
            body: Body::Dir(DirNode {
                parent: ROOT,
                live: BTreeMap::new(),
                durable: BTreeMap::new(),
                pending: Vec::new(),
            }),
            perm: 0o755,
            uid,
            gid,
            mtime: SystemTime::now(),
        };
        State {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            next_order: 0,
            open: HashMap::new(),
            syncs: SyncCounts::default(),
        }
    }

    fn order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (kind, size, nlink) = match &node.body {
            Body::File(file) => (FileType::RegularFile, file.live.len() as u64, 1),
            Body::Dir(_) => (FileType::Directory, 0, 2),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind,
            perm: node.perm,
            nlink,
            uid: node.uid,
            gid: node.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn dir(&self, ino: u64) -> Result<&DirNode, Errno> {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(dir)) => Ok(dir),
            Some(Body::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::File(file)) => Ok(file),
            Some(Body::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .live
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    /// Adds or removes an entry of folder `parent`, live now and durable once the folder is synced.
    fn change_dir(&mut self, parent: u64, change: DirChange) -> Result<(), Errno> {
        let order = self.order();
        let node = self.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        let Body::Dir(dir) = &mut node.body else {
            return Err(Errno::ENOTDIR);
        };
        change.apply(&mut dir.live);
        dir.pending.push(Pending { order, change });
        node.mtime = SystemTime::now();
        Ok(())
    }

    fn change_file(&mut self, ino: u64, change: FileChange) -> Result<(), Errno> {
        let order = self.order();
        let file = self.file_mut(ino)?;
        change.apply(&mut file.live);
        file.pending.push(Pending { order, change });
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.mtime = SystemTime::now();
        }
        Ok(())
    }

    fn make_node(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        body: Body,
    ) -> Result<u64, Errno> {
        if self.dir(parent)?.live.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                body,
                perm: (mode & 0o7777) as u16,
                uid: req.uid(),
                gid: req.gid(),
                mtime: SystemTime::now(),
            },
        );
        self.change_dir(parent, DirChange::Link(name.to_owned(), ino))?;
        Ok(ino)
    }

    fn new_file() -> Body {
        Body::File(FileNode {
            live: Vec::new(),
            durable: Vec::new(),
            pending: Vec::new(),
        })
    }

    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (&self.nodes[&ino].body, want_dir) {
            (Body::Dir(dir), true) if !dir.live.is_empty() => return Err(Errno::ENOTEMPTY),
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (Body::File(_), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.change_dir(parent, DirChange::Unlink(name.to_owned()))?;
        self.collect_garbage();
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        if let Ok(target) = self.lookup(new_parent, new_name) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if let Body::Dir(dir) = &self.nodes[&target].body
                && !dir.live.is_empty()
            {
                return Err(Errno::ENOTEMPTY);
            }
        }
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        self.change_dir(parent, DirChange::Unlink(name.to_owned()))?;
        self.change_dir(new_parent, DirChange::Link(new_name.to_owned(), ino))?;
        if let Some(Body::Dir(dir)) = self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            dir.parent = new_parent;
        }
        self.collect_garbage();
        Ok(())
    }

    fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        match &mut node.body {
            Body::File(file) => {
                for pending in file.pending.drain(..) {
                    pending.change.apply(&mut file.durable);
                }
                self.syncs.file_syncs += 1;
            }
            Body::Dir(dir) => {
                for pending in dir.pending.drain(..) {
                    pending.change.apply(&mut dir.durable);
                }
                self.syncs.dir_syncs += 1;
                self.collect_garbage();
            }
        }
        Ok(())
    }

    fn cut(&mut self, survivors: Survivors, rng: &mut impl Rng) -> CutReport {
        let orders: Vec<u64> = self
            .nodes
            .values()
            .flat_map(|node| match &node.body {
                Body::File(file) => file.pending.iter().map(|p| p.order).collect::<Vec<_>>(),
                Body::Dir(dir) => dir.pending.iter().map(|p| p.order).collect(),
            })
            .collect();
        let kept: HashSet<u64> = match survivors {
            Survivors::None => HashSet::new(),
            Survivors::Prefix => {
                let first = orders.iter().min().copied().unwrap_or(0);
                let last = orders.iter().max().copied().unwrap_or(0);
                let end = rng.gen_range(first..=last + 1);
                orders.iter().copied().filter(|&o| o < end).collect()
            }
            Survivors::Subset => orders
                .iter()
                .copied()
                .filter(|_| rng.gen_bool(0.5))
                .collect(),
        };
        for node in self.nodes.values_mut() {
            match &mut node.body {
                Body::File(file) => {
                    for pending in file.pending.drain(..).filter(|p| kept.contains(&p.order)) {
                        tear(pending.change, rng).apply(&mut file.durable);
                    }
                    file.live = file.durable.clone();
                }
                Body::Dir(dir) => {
                    for pending in dir.pending.drain(..).filter(|p| kept.contains(&p.order)) {
                        pending.change.apply(&mut dir.durable);
                    }
                    dir.live = dir.durable.clone();
                }
            }
        }
        // Whoever held files open died with the power.
        self.open.clear();
        self.collect_garbage();
        self.fix_parents();
        CutReport {
            pending: orders.len(),
            kept: kept.len(),
        }
    }

    /// Drops nodes that no entry (live, durable or pending) and no open handle can reach.
    fn collect_garbage(&mut self) {
        let mut reachable = HashSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            let Some(Body::Dir(dir)) = self.nodes.get(&ino).map(|n| &n.body) else {
                continue;
            };
            let linked = dir.pending.iter().filter_map(|p| match &p.change {
                DirChange::Link(_, ino) => Some(ino),
                DirChange::Unlink(_) => None,
            });
            for &child in dir.live.values().chain(dir.durable.values()).chain(linked) {
                if reachable.insert(child) {
                    stack.push(child);
                }
            }
        }
        reachable.extend(self.open.keys());
        self.nodes.retain(|ino, _| reachable.contains(ino));
    }

    /// A folder renamed since its last sync may be back under its old parent.
    fn fix_parents(&mut self) {
        let links: Vec<(u64, u64)> = self
            .nodes
            .iter()
            .filter_map(|(&ino, node)| match &node.body {
                Body::Dir(dir) => Some(dir.live.values().map(move |&child| (child, ino))),
                Body::File(_) => None,
            })
            .flatten()
            .collect();
        for (child, parent) in links {
            if let Some(Body::Dir(dir)) = self.nodes.get_mut(&child).map(|n| &mut n.body) {
                dir.parent = parent;
            }
        }
    }
}

impl CrashFs {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

fn reply_entry(state: &State, ino: Result<u64, Errno>, reply: ReplyEntry) {
    match ino.and_then(|ino| state.attr(ino)) {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for CrashFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let state = self.state();
        reply_entry(&state, state.lookup(parent.0, name), reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state();
        let changed = (|| {
            if let Some(size) = size {
                state.change_file(ino.0, FileChange::Truncate(size as usize))?;
            }
            if let Some(mode) = mode {
                state.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?.perm = (mode & 0o7777) as u16;
            }
            state.attr(ino.0)
        })();
        match changed {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut state = self.state();
        let ino = state.make_node(req, parent.0, name, mode, State::new_file());
        reply_entry(&state, ino, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.state();
        let dir = Body::Dir(DirNode {
            parent: parent.0,
            live: BTreeMap::new(),
            durable: BTreeMap::new(),
            pending: Vec::new(),
        });
        let ino = state.make_node(req, parent.0, name, mode, dir);
        reply_entry(&state, ino, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.state().remove(parent.0, name, false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.state().remove(parent.0, name, true), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            self.state()
                .rename(parent.0, name, new_parent.0, new_name, flags),
            reply,
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.state();
        if !state.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        *state.open.entry(ino.0).or_default() += 1;
        // No FOPEN_KEEP_CACHE: each open drops the kernel's cached pages, which a cut may have
        // made stale.
        reply.opened(FileHandle(ino.0), FopenFlags::empty());
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.state();
        let created = state
            .make_node(req, parent.0, name, mode, State::new_file())
            .and_then(|ino| state.attr(ino));
        match created {
            Ok(attr) => {
                *state.open.entry(attr.ino.0).or_default() += 1;
                reply.created(
                    &TTL,
                    &attr,
                    Generation(0),
                    FileHandle(attr.ino.0),
                    FopenFlags::empty(),
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.state();
        match state.file_mut(ino.0) {
            Ok(file) => {
                let start = (offset as usize).min(file.live.len());
                let end = (start + size as usize).min(file.live.len());
                reply.data(&file.live[start..end]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let change = FileChange::Write {
            offset: offset as usize,
            data: data.to_vec(),
        };
        match self.state().change_file(ino.0, change) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        if let Some(count) = state.open.get_mut(&ino.0) {
            *count -= 1;
            if *count == 0 {
                state.open.remove(&ino.0);
                state.collect_garbage();
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.state().sync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().dir(ino.0) {
            Ok(_) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = self.state();
        let dir = match state.dir(ino.0) {
            Ok(dir) => dir,
            Err(e) => return reply.error(e),
        };
        let dots = [
            (OsString::from("."), ino.0),
            (OsString::from(".."), dir.parent),
        ];
        let entries = dots
            .into_iter()
            .chain(dir.live.iter().map(|(n, &i)| (n.clone(), i)));
        for (index, (name, child)) in entries.enumerate().skip(offset as usize) {
            let kind = match state.nodes.get(&child).map(|n| &n.body) {
                Some(Body::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.state().sync(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let exists = self.state().nodes.contains_key(&ino.0);
        reply_empty(if exists { Ok(()) } else { Err(Errno::ENOENT) }, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut state = self.state();
        let grown = (|| {
            let len = state.file_mut(ino.0)?.live.len();
            let end = (offset + length) as usize;
            if end > len {
                state.change_file(ino.0, FileChange::Truncate(end))?;
            }
            Ok(())
        })();
        reply_empty(grown, reply);
    }
}
