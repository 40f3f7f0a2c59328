//! Throwaway PostgreSQL for tests: one cluster per test process, started from Debian's
//! `postgresql` binaries (initdb, pg_ctl) in a temp folder on a free loopback port, as `nobody`
//! when the tests run as root; a fresh database per test. Stopped when the process exits.
//!
//! Without the binaries a test that needs PostgreSQL skips and says so, except under `CI=true`,
//! where it fails: CI installs them (`.ci/run`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Who runs the server's commands (root may not).
    user: Option<String>,
    /// The authority that signed the server's certificate, when it serves TLS (openssl made
    /// them).
    certificate: Option<PathBuf>,
}

enum Unavailable {
    /// No PostgreSQL binaries here: skip (unless under CI).
    Missing(String),
    /// The binaries are here but the cluster did not start: always a failure.
    Failed(String),
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static STOP: OnceLock<(PathBuf, PathBuf, Option<String>)> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(1);

/// The URL of a fresh, empty database, or None (said on stderr) where PostgreSQL is not
/// installed and `CI` is not `true`.
pub fn database(test: &str) -> Option<String> {
    let cluster = CLUSTER.get_or_init(|| match start() {
        Ok(cluster) => Ok(cluster),
        Err(Unavailable::Missing(why)) => Err(why),
        Err(Unavailable::Failed(why)) => panic!("the test PostgreSQL did not start: {why}"),
    });
    match cluster {
        Ok(cluster) => Some(cluster.create_database()),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test} needs PostgreSQL and CI=true: {why}")
        }
        Err(why) => {
            // Once, past the test harness's capture, so a passing run says it too.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "skipping the tests that need PostgreSQL: {why} (install Debian's postgresql \
                     package to run them; under CI=true they fail instead)"
                );
            });
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}

/// The folder holding initdb and pg_ctl: `COLLOQUY_TEST_PG_BIN` if set, else on PATH, else
/// Debian's newest under /usr/lib/postgresql.
fn binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("COLLOQUY_TEST_PG_BIN") {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").is_file().then_some(dir);
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
    });
    if let Some(initdb) = on_path {
        let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
        return real.parent().map(Path::to_path_buf);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn start() -> Result<Cluster, Unavailable> {
    let bin = binaries().ok_or_else(|| {
        Unavailable::Missing("no PostgreSQL binaries (initdb, pg_ctl) found".into())
    })?;
    let failed =
        |what: &str, e: &dyn std::fmt::Display| Unavailable::Failed(format!("{what}: {e}"));
    // PostgreSQL refuses to run as root: the cluster belongs to nobody.
    let user = (unsafe { libc::geteuid() } == 0).then(|| "nobody".to_owned());
    stop_orphans(&bin, user.as_deref());
    let dir = tempfile::Builder::new()
        .prefix(CLUSTER_PREFIX)
        .tempdir()
        .map_err(|e| failed("temp dir", &e))?
        .keep();
    std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
        .map_err(|e| failed("owner file", &e))?;
    if let Some(user) = &user {
        chown_to(&dir, user).map_err(|e| failed("chown", &e))?;
    }
    let port = super::free_port();
    let certificate = self_signed_certificate(&dir, user.as_deref());
    let cluster = Cluster {
        bin,
        dir,
        port,
        user,
        certificate,
    };
    let data = cluster.dir.join("data");
    cluster
        .run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        )
        .map_err(Unavailable::Failed)?;
    let mut options = "-c max_connections=300".to_owned();
    if cluster.certificate.is_some() {
        let (certificate, key) = (
            cluster.dir.join("server.crt"),
            cluster.dir.join("server.key"),
        );
        options.push_str(&format!(
            " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            path_str(&certificate),
            path_str(&key)
        ));
    }
    cluster.pg_ctl_start(&options).map_err(|e| {
        let _ = std::fs::remove_dir_all(&cluster.dir);
        Unavailable::Failed(e)
    })?;
    let _ = STOP.set((
        cluster.bin.clone(),
        cluster.dir.clone(),
        cluster.user.clone(),
    ));
    unsafe { libc::atexit(stop_at_exit) };
    Ok(cluster)
}

/// A test authority (`ca.crt`) and a certificate for 127.0.0.1 it signed, with its key, in `dir`
/// (owned by `user`), if openssl is here. Returns the authority's certificate.
fn self_signed_certificate(dir: &Path, user: Option<&str>) -> Option<PathBuf> {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .ok()?;
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=colloquy test authority",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    ];
    for args in steps {
        let made = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        if !made.status.success() {
            return None;
        }
    }
    let key = dir.join("server.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).ok()?;
    if let Some(user) = user {
        chown_to(&key, user).ok()?;
        chown_to(&dir.join("server.crt"), user).ok()?;
    }
    Some(dir.join("ca.crt"))
}

/// The authority of the certificate the test PostgreSQL serves TLS with (after [`database`]
/// started it); None where it serves none.
pub fn certificate() -> Option<PathBuf> {
    CLUSTER.get()?.as_ref().ok()?.certificate.clone()
}

const CLUSTER_PREFIX: &str = "colloquy-pg-";
/// The pid of the test process a cluster belongs to.
const OWNER_FILE: &str = "owner.pid";

/// Stops and removes the clusters of test processes that died without stopping theirs (killed,
/// say), so none outlives a run by more than the next one.
fn stop_orphans(bin: &Path, user: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(CLUSTER_PREFIX));
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|pid| pid.trim().parse::<libc::pid_t>().ok());
        let Some(owner) = owner.filter(|_| ours) else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(owner, 0) } == 0;
        if !alive {
            let orphan = Cluster {
                bin: bin.to_path_buf(),
                dir: dir.clone(),
                port: 0,
                user: user.map(str::to_owned),
                certificate: None,
            };
            let data = dir.join("data");
            let _ = orphan.run(
                "pg_ctl",
                &["-D", path_str(&data), "-m", "immediate", "-w", "stop"],
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

extern "C" fn stop_at_exit() {
    if let Some((bin, dir, user)) = STOP.get() {
        let cluster = Cluster {
            bin: bin.clone(),
            dir: dir.clone(),
            port: 0,
            user: user.clone(),
            certificate: None,
        };
        let data = dir.join("data");
        let _ = cluster.run(
            "pg_ctl",
            &["-D", path_str(&data), "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

fn chown_to(dir: &Path, user: &str) -> std::io::Result<()> {
    let name = std::ffi::CString::new(user)?;
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err(std::io::Error::other(format!("no user {user}")));
    }
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
}

impl Cluster {
    /// `pg_ctl start` on loopback at the cluster's port, with `extra` server options; on failure
    /// the error carries the server's log.
    fn pg_ctl_start(&self, extra: &str) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {extra}",
            self.port,
            path_str(&self.dir)
        );
        let (data, log) = (self.dir.join("data"), self.dir.join("log"));
        let args = [
            "-D",
            path_str(&data),
            "-l",
            path_str(&log),
            "-o",
            &options,
            "-w",
            "-t",
            "60",
            "start",
        ];
        self.run("pg_ctl", &args).map_err(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            format!("{e}\n{log}")
        })
    }

    /// Runs one of the cluster's programs (as its user); its output on failure.
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(program);
        let mut command = match &self.user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        let output = command
            .args(args)
            .current_dir(&self.dir)
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} {args:?}: {}\n{}",
                program.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }

    fn create_database(&self) -> String {
        let name = format!("t{}", DATABASES.fetch_add(1, Ordering::Relaxed));
        let port = self.port.to_string();
        self.run(
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", &name],
        )
        .expect("a fresh database");
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

/// A PostgreSQL primary and a synchronous standby streaming from it (`pg_basebackup -R`), each
/// in its own throwaway cluster: every commit the primary acknowledges is on the standby too.
/// Both stop when dropped.
pub struct Replicated {
    primary: Cluster,
    standby: Cluster,
}

/// A fresh primary with a synchronous standby attached, or None (said on stderr) where
/// PostgreSQL is not installed and `CI` is not `true`.
pub fn replicated(test: &str) -> Option<Replicated> {
    let (bin, user) = binaries_or_skip(test)?;
    let primary = Cluster::empty(&bin, user.as_deref());
    primary.initdb();
    // On the command line, not in postgresql.conf: the promoted standby must not wait for a
    // standby of its own.
    primary.start_server(
        "-c wal_level=replica -c synchronous_commit=on -c synchronous_standby_names=standby",
    );
    let standby = Cluster::empty(&bin, user.as_deref());
    let source = format!(
        "host=127.0.0.1 port={} user=postgres application_name=standby",
        primary.port
    );
    standby
        .run(
            "pg_basebackup",
            &[
                "-D",
                path_str(&standby.dir.join("data")),
                "-R",
                "-X",
                "stream",
                "-d",
                &source,
            ],
        )
        .expect("pg_basebackup from the primary");
    standby.start_server("");
    Some(Replicated { primary, standby })
}

impl Replicated {
    /// The database URL naming both hosts, primary first; only a host taking writes is used.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// The primary's URL alone.
    pub fn primary_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.primary.port
        )
    }

    /// Whether the primary reports the standby as its synchronous one.
    pub async fn standby_is_synchronous(&self) -> bool {
        let Ok((client, connection)) =
            tokio_postgres::connect(&self.primary_url(), tokio_postgres::NoTls).await
        else {
            return false;
        };
        tokio::spawn(connection);
        client
            .query_opt(
                "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby' \
                 AND sync_state = 'sync'",
                &[],
            )
            .await
            .is_ok_and(|row| row.is_some())
    }

    /// Kills the primary's postmaster and every process it started with SIGKILL: a machine gone.
    pub fn kill_primary(&self) {
        let pid_file = self.primary.dir.join("data").join("postmaster.pid");
        let postmaster: libc::pid_t = std::fs::read_to_string(pid_file)
            .expect("the primary's postmaster.pid")
            .lines()
            .next()
            .and_then(|pid| pid.trim().parse().ok())
            .expect("the postmaster's pid");
        let children = children_of(postmaster);
        // SAFETY: kill(2) on the processes of the cluster this test started.
        unsafe { libc::kill(postmaster, libc::SIGKILL) };
        for child in children {
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
    }

    /// Promotes the standby to primary and waits until it takes writes.
    pub fn promote_standby(&self) {
        self.standby
            .run(
                "pg_ctl",
                &[
                    "-D",
                    path_str(&self.standby.dir.join("data")),
                    "-w",
                    "-t",
                    "60",
                    "promote",
                ],
            )
            .expect("the standby is promoted");
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for cluster in [&self.standby, &self.primary] {
            let data = cluster.dir.join("data");
            let _ = cluster.run(
                "pg_ctl",
                &["-D", path_str(&data), "-m", "immediate", "-w", "stop"],
            );
            let _ = std::fs::remove_dir_all(&cluster.dir);
        }
    }
}

/// The pids whose parent is `parent` (from /proc).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // The parent's pid is the second field after the command's closing ')'.
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<libc::pid_t>().ok()
                })
                == Some(parent)
        })
        .collect()
}

impl Cluster {
    /// A fresh temp folder (owned by `user`, claimed by this process) and a free port.
    fn empty(bin: &Path, user: Option<&str>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix(CLUSTER_PREFIX)
            .tempdir()
            .expect("a temp dir")
            .keep();
        std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string()).expect("owner file");
        if let Some(user) = user {
            chown_to(&dir, user).expect("chown");
        }
        Cluster {
            bin: bin.to_path_buf(),
            dir,
            port: super::free_port(),
            user: user.map(str::to_owned),
            certificate: None,
        }
    }

    fn initdb(&self) {
        let data = self.dir.join("data");
        self.run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        )
        .expect("initdb");
    }

    /// Starts the server on its port with `extra` options; panics with its log if it does not.
    fn start_server(&self, extra: &str) {
        if let Err(e) = self.pg_ctl_start(extra) {
            panic!("PostgreSQL did not start: {e}");
        }
    }
}

/// The binaries and the user to run them as, or None (said on stderr) where PostgreSQL is not
/// installed and `CI` is not `true`.
fn binaries_or_skip(test: &str) -> Option<(PathBuf, Option<String>)> {
    let user = (unsafe { libc::geteuid() } == 0).then(|| "nobody".to_owned());
    if let Some(bin) = binaries() {
        return Some((bin, user));
    }
    let why = "no PostgreSQL binaries (initdb, pg_ctl) found";
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test} needs PostgreSQL and CI=true: {why}");
    }
    eprintln!("skipping {test}: {why}");
    None
}

/// A cluster of one test's own, to stop and start again (the shared one serves other tests).
/// Removed when dropped.
pub struct Standalone(Cluster);

pub fn standalone(test: &str) -> Option<Standalone> {
    let (bin, user) = binaries_or_skip(test)?;
    let cluster = Cluster::empty(&bin, user.as_deref());
    cluster.initdb();
    cluster.start_server("");
    Some(Standalone(cluster))
}

impl Standalone {
    /// The database as a key-value connection string (libpq's other form than the URL).
    pub fn key_value(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres target_session_attrs=read-write",
            self.0.port
        )
    }

    /// Stops the server at once (connections are cut, as by a crash).
    pub fn stop(&self) {
        let data = self.0.dir.join("data");
        self.0
            .run(
                "pg_ctl",
                &["-D", path_str(&data), "-m", "immediate", "-w", "stop"],
            )
            .expect("PostgreSQL stops");
    }

    pub fn start(&self) {
        self.0.start_server("");
    }

    /// Starts it again with more server options (`-c name=value …`).
    pub fn start_with(&self, options: &str) {
        self.0.start_server(options);
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let data = self.0.dir.join("data");
        let _ = self.0.run(
            "pg_ctl",
            &["-D", path_str(&data), "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.0.dir);
    }
}
