//! The container and the deployment files, without a container engine (.ci/container.sh builds
//! and runs the image itself):
//! - the Docker build context, assembled as Docker would from `.dockerignore`, holds what the
//!   Dockerfile's build stage copies, and `cargo metadata --locked` resolves in what it copied;
//! - deploy/ (compose and Kubernetes): probes name real routes on the Dockerfile's port, every
//!   `COLLOQUY_*` variable is one colloquy reads, the termination grace covers the shutdown grace;
//! - `colloquy healthcheck` (the image's HEALTHCHECK) tells a serving server from none.

use crate::common::*;
use serde_yaml_ng::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// .dockerignore, matched as Docker's patternmatcher does.

/// One `.dockerignore` line: a pattern, `!` re-including what it matches.
struct IgnorePattern {
    segments: Vec<String>,
    exclusion: bool,
}

fn dockerignore(text: &str) -> Vec<IgnorePattern> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (exclusion, pattern) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            assert!(
                !pattern.contains('[') && !pattern.contains('\\'),
                ".dockerignore pattern {pattern:?}: character classes and escapes are not \
                 understood by this test; extend it"
            );
            let segments = pattern
                .trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/')
                .split('/')
                .filter(|s| !s.is_empty() && *s != ".")
                .map(str::to_owned)
                .collect();
            IgnorePattern {
                segments,
                exclusion,
            }
        })
        .collect()
}

/// `*` and `?` within one path segment.
fn segment_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            segment_matches(&pattern[1..], name)
                || (!name.is_empty() && segment_matches(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => segment_matches(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => segment_matches(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// A whole path against a pattern's segments; `**` matches any number of segments.
fn path_matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skip| path_matches(rest, &path[skip..]))
        }
        Some((first, rest)) => match path.split_first() {
            Some((name, path_rest)) => {
                segment_matches(first.as_bytes(), name.as_bytes()) && path_matches(rest, path_rest)
            }
            None => false,
        },
    }
}

/// Docker's `MatchesOrParentMatches`: the last pattern that matches the path or one of its
/// parent folders decides; a `!` pattern is only tried on what is excluded so far.
fn ignored(patterns: &[IgnorePattern], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let mut excluded = false;
    for pattern in patterns {
        if pattern.exclusion != excluded {
            continue;
        }
        let matched = (1..=segments.len()).any(|n| path_matches(&pattern.segments, &segments[..n]));
        if matched {
            excluded = !pattern.exclusion;
        }
    }
    excluded
}

/// The files (paths relative to `root`, `/`-separated) Docker sends as the build context.
fn build_context(root: &Path, patterns: &[IgnorePattern]) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, patterns: &[IgnorePattern], out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                // An excluded folder is still walked when a `!` pattern could admit something
                // below it (as Docker does); else it is skipped (target/ is large).
                let reopened = patterns.iter().any(|p| {
                    p.exclusion
                        && (p
                            .segments
                            .iter()
                            .any(|s| s.contains('*') || s.contains('?'))
                            || p.segments.join("/").starts_with(&format!("{relative}/")))
                });
                if !ignored(patterns, &relative) || reopened {
                    walk(root, &path, patterns, out);
                }
            } else if !ignored(patterns, &relative) {
                out.insert(relative);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, patterns, &mut out);
    out
}

#[test]
fn dockerignore_matching_follows_docker() {
    let patterns = dockerignore("*\n!src\n!Cargo.toml\n**/target\n*.md\n!README.md\n");
    assert!(ignored(&patterns, "target"));
    assert!(ignored(&patterns, "target/release/colloquy"));
    assert!(ignored(&patterns, ".git/HEAD"));
    assert!(!ignored(&patterns, "src/main.rs"));
    assert!(!ignored(&patterns, "src/cli/mod.rs"));
    assert!(ignored(&patterns, "src/target/x"));
    assert!(!ignored(&patterns, "Cargo.toml"));
    assert!(ignored(&patterns, "Cargo.tomlx"));
    assert!(ignored(&patterns, "NOTES.md"));
    assert!(!ignored(&patterns, "README.md"));
    let plain = dockerignore("target\n/colloquy-data/\nbenches/*.py\n");
    assert!(ignored(&plain, "target/debug/x"));
    assert!(!ignored(&plain, "src/target"));
    assert!(ignored(&plain, "colloquy-data/db"));
    assert!(ignored(&plain, "benches/slow_clients.py"));
    assert!(!ignored(&plain, "benches/engine.rs"));
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile.

struct Stage {
    name: Option<String>,
    /// Instructions, continuation lines joined: (keyword upper-cased, the rest).
    instructions: Vec<(String, String)>,
}

fn dockerfile_stages(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if trimmed.starts_with('#') {
            continue; // a comment between continuation lines
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim().to_owned();
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = words
                .iter()
                .position(|w| w.eq_ignore_ascii_case("as"))
                .and_then(|i| words.get(i + 1))
                .map(|s| s.to_string());
            stages.push(Stage {
                name,
                instructions: vec![(keyword, rest)],
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((keyword, rest));
        }
    }
    stages
}

/// Splits an instruction's flags (`--from=build`) from its arguments (shell or JSON form).
fn flags_and_args(rest: &str) -> (Vec<String>, Vec<String>) {
    let words: Vec<String> = if rest.trim_start().starts_with('[') {
        serde_json::from_str(rest).unwrap_or_else(|e| panic!("{rest}: {e}"))
    } else {
        rest.split_whitespace().map(str::to_owned).collect()
    };
    let (flags, args): (Vec<String>, Vec<String>) =
        words.into_iter().partition(|w| w.starts_with("--"));
    (flags, args)
}

/// The stage the default (last) stage copies its binary from.
fn build_stage(stages: &[Stage]) -> &Stage {
    let last = stages.last().expect("the Dockerfile has stages");
    let from = last
        .instructions
        .iter()
        .filter(|(keyword, _)| keyword == "COPY")
        .find_map(|(_, rest)| {
            flags_and_args(rest)
                .0
                .iter()
                .find_map(|f| f.strip_prefix("--from=").map(str::to_owned))
        })
        .expect("the default stage copies the binary from a build stage");
    stages
        .iter()
        .find(|s| s.name.as_deref() == Some(from.as_str()))
        .unwrap_or_else(|| panic!("no stage named {from}"))
}

/// Carries out `stage`'s COPY instructions from `context` (files of the repository at `root`)
/// into `into`, relative to the stage's WORKDIR; panics as `docker build` fails on a source the
/// context lacks.
fn copy_into(stage: &Stage, root: &Path, context: &BTreeSet<String>, into: &Path) -> usize {
    let mut copied = 0;
    let mut workdir = PathBuf::from("/");
    for (keyword, rest) in &stage.instructions {
        match keyword.as_str() {
            "WORKDIR" => workdir = workdir.join(rest.trim()),
            "COPY" | "ADD" => {
                let (flags, mut args) = flags_and_args(rest);
                if flags.iter().any(|f| f.starts_with("--from=")) {
                    continue;
                }
                let dest = args.pop().expect("COPY has a destination");
                let dest_path = workdir.join(&dest);
                let dest_is_dir = dest.ends_with('/') || args.len() > 1;
                for source in args {
                    let source = source.trim_start_matches("./").trim_end_matches('/');
                    let pattern: Vec<String> = source.split('/').map(str::to_owned).collect();
                    let mut found = false;
                    for file in context {
                        let segments: Vec<&str> = file.split('/').collect();
                        // The source names this file, or a folder (or glob of them) above it.
                        let Some(n) =
                            (1..=segments.len()).find(|&n| path_matches(&pattern, &segments[..n]))
                        else {
                            continue;
                        };
                        found = true;
                        let target = if n == segments.len() {
                            // The source is the file itself.
                            if dest_is_dir {
                                dest_path.join(segments[n - 1])
                            } else {
                                dest_path.clone()
                            }
                        } else {
                            // A folder: its contents go into the destination.
                            dest_path.join(segments[n..].join("/"))
                        };
                        let target = into.join(target.strip_prefix("/").unwrap());
                        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
                        std::fs::copy(root.join(file), &target).unwrap();
                        copied += 1;
                    }
                    assert!(
                        found,
                        "`{keyword} {rest}`: {source:?} is not in the build context \
                         (.dockerignore leaves it out, or it does not exist)"
                    );
                }
            }
            _ => {}
        }
    }
    copied
}

fn build_stage_workdir(stage: &Stage) -> PathBuf {
    let mut workdir = PathBuf::from("/");
    for (keyword, rest) in &stage.instructions {
        if keyword == "WORKDIR" {
            workdir = workdir.join(rest.trim());
        }
    }
    workdir
}

fn cargo_metadata(manifest: &Path, offline: bool) -> std::process::Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["metadata", "--locked", "--format-version", "1"]);
    if offline {
        command.arg("--offline");
    }
    // Only the packages a Linux build uses: the registry cache holds those after the build.
    command
        .args(["--filter-platform", "x86_64-unknown-linux-gnu"])
        .arg("--manifest-path")
        .arg(manifest)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cargo runs")
}

/// What `docker build` does before compiling: send the context `.dockerignore` leaves, copy what
/// the build stage copies, and resolve the locked dependencies there (`cargo build --locked`
/// fails just the same where this fails: a path dependency outside what was copied, a lock file
/// that does not match, a declared target whose file is missing).
#[test]
fn the_build_stage_has_everything_cargo_build_locked_needs() {
    let root = repo();
    let patterns = dockerignore(&read(&root.join(".dockerignore")));
    for kept_out in ["target", "target/release/colloquy", "colloquy-data", ".git"] {
        assert!(
            ignored(&patterns, kept_out),
            ".dockerignore must keep {kept_out} out of the build context"
        );
    }
    let context = build_context(&root, &patterns);

    let stages = dockerfile_stages(&read(&root.join("Dockerfile")));
    let build = build_stage(&stages);
    let run = build
        .instructions
        .iter()
        .find(|(keyword, rest)| keyword == "RUN" && rest.contains("cargo build"))
        .expect("the build stage runs cargo build");
    assert!(
        run.1.contains("--locked") && run.1.contains("--release"),
        "{}",
        run.1
    );

    let assembled = tempfile::tempdir().unwrap();
    let copied = copy_into(build, &root, &context, assembled.path());
    assert!(
        copied > 0,
        "the build stage copies nothing from the context"
    );
    let workdir = assembled
        .path()
        .join(build_stage_workdir(build).strip_prefix("/").unwrap());
    let manifest = workdir.join("Cargo.toml");
    assert!(manifest.is_file(), "the build stage copies no Cargo.toml");

    let mut output = cargo_metadata(&manifest, true);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() && stderr.contains("offline") {
        // A package the registry cache lacks: ask crates.io (the lock file still decides).
        output = cargo_metadata(&manifest, false);
    }
    assert!(
        output.status.success(),
        "cargo metadata --locked in the build stage's copy of the context failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let sled = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sled")
        .expect("sled is a dependency");
    let sled_manifest = sled["manifest_path"].as_str().unwrap();
    assert!(
        Path::new(sled_manifest).starts_with(&workdir),
        "sled comes from {sled_manifest}, not from the copied vendor/sled"
    );

    // Test fixtures and build output stay out of the context.
    for file in &context {
        assert!(
            !file.starts_with("tests/") && !file.starts_with("target/"),
            "{file} is in the build context"
        );
    }

    // Files the sources include at compile time must be in the copy too.
    for file in &context {
        if !file.ends_with(".rs") {
            continue;
        }
        let text = read(&root.join(file));
        for marker in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let included = &rest[..rest.find('"').unwrap()];
                let dir = Path::new(file).parent().unwrap();
                let copied = workdir.join(dir).join(included);
                assert!(copied.exists(), "{file} includes {included}, not copied");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// deploy/: compose and Kubernetes.

fn yaml_documents(path: &Path) -> Vec<Yaml> {
    use serde::Deserialize;
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            let mut value =
                Yaml::deserialize(document).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            value
                .apply_merge()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            value
        })
        .filter(|value| !value.is_null())
        .collect()
}

fn kubernetes_objects() -> Vec<Yaml> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files.iter().flat_map(|f| yaml_documents(f)).collect()
}

fn of_kind<'a>(objects: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some(kind))
        .collect()
}

fn int(value: &Yaml, what: &str) -> u64 {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("{what} is not a number: {value:?}"))
}

/// The ports the image serves: HTTP on the port `COLLOQUY_LISTEN` names, gRPC on
/// `COLLOQUY_GRPC_LISTEN`'s; the Dockerfile EXPOSEs these two and no other.
struct ImagePorts {
    http: u64,
    grpc: u64,
}

fn image_ports() -> ImagePorts {
    let stages = dockerfile_stages(&read(&repo().join("Dockerfile")));
    let instructions = || stages.iter().flat_map(|s| s.instructions.iter());
    let exposed: BTreeSet<u64> = instructions()
        .filter(|(keyword, _)| keyword == "EXPOSE")
        .flat_map(|(_, rest)| rest.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().expect("EXPOSE port"))
        .collect();
    let env_port = |name: &str| -> u64 {
        let prefix = format!("{name}=");
        instructions()
            .filter(|(keyword, _)| keyword == "ENV")
            .flat_map(|(_, rest)| rest.split_whitespace())
            .find_map(|word| word.strip_prefix(prefix.as_str()))
            .and_then(|listen| listen.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or_else(|| panic!("the Dockerfile sets no {name} with a port"))
    };
    let ports = ImagePorts {
        http: env_port("COLLOQUY_LISTEN"),
        grpc: env_port("COLLOQUY_GRPC_LISTEN"),
    };
    assert_eq!(
        exposed,
        BTreeSet::from([ports.http, ports.grpc]),
        "EXPOSE the HTTP and gRPC ports"
    );
    ports
}

/// The port of an `http://host:port/` URL (after `$(VAR)` expansion it still has one).
fn url_port(url: &str) -> u64 {
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("not a URL: {url}"));
    let port = authority.rsplit_once(':').map(|(_, p)| p);
    port.and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{url} names no port"))
}

struct Probe {
    path: String,
    port: u64,
}

fn probe(container: &Yaml, which: &str) -> Probe {
    let get = &container[which]["httpGet"];
    let path = get["path"]
        .as_str()
        .unwrap_or_else(|| panic!("{which} has no httpGet.path"));
    let port = &get["port"];
    // A named port resolves through the container's ports.
    let port = match port.as_str().filter(|p| p.parse::<u64>().is_err()) {
        Some(name) => container["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str() == Some(name))
            .map(|p| int(&p["containerPort"], "containerPort"))
            .unwrap_or_else(|| panic!("{which}: no port named {name}")),
        None => int(port, &format!("{which} port")),
    };
    Probe {
        path: path.to_owned(),
        port,
    }
}

/// Every `COLLOQUY_*` variable a deployment file sets, with where.
fn colloquy_variables(
    names: impl IntoIterator<Item = String>,
    origin: &str,
    into: &mut Vec<(String, String)>,
) {
    for name in names {
        if name.to_ascii_uppercase().starts_with("COLLOQUY_") {
            into.push((name, origin.to_owned()));
        }
    }
}

#[test]
fn only_names_colloquy_reads_pass_the_variable_check() {
    // The check the deployment files go through tells keys from near misses.
    for real in [
        "COLLOQUY_STORE__URL",
        "COLLOQUY_CLUSTER__SECRET",
        "COLLOQUY_CLUSTER__ADVERTISE_URL",
        "COLLOQUY_SHUTDOWN__GRACE_SECS",
        "COLLOQUY_TOKENS",
        "COLLOQUY_LISTEN",
    ] {
        assert!(colloquy::config::reads_variable(real), "{real}");
    }
    for wrong in [
        "COLLOQUY_CLUSTER__SECRETS",
        "COLLOQUY_CLUSTER_SECRET",
        "COLLOQUY_STORE_URL",
        "COLLOQUY_SERVICE_HOST",
        "COLLOQUY_PORT",
        "CLUSTER__SECRET",
    ] {
        assert!(!colloquy::config::reads_variable(wrong), "{wrong}");
    }
}

#[actix_rt::test]
async fn kubernetes_manifests_probe_real_routes_on_the_image_port_and_outlast_the_grace() {
    let objects = kubernetes_objects();
    let ImagePorts { http: port, grpc } = image_ports();
    let deployments = of_kind(&objects, "Deployment");
    assert_eq!(deployments.len(), 1, "one Deployment");
    let deployment = deployments[0];
    let spec = &deployment["spec"];
    let replicas = int(&spec["replicas"], "replicas");
    assert!(replicas >= 2, "several replicas, not {replicas}");
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(&spec["selector"]["matchLabels"], labels);
    let containers = pod["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1);
    let container = &containers[0];

    // The probes: the right endpoints, on the port the image serves, answered by a real server.
    let liveness = probe(container, "livenessProbe");
    let readiness = probe(container, "readinessProbe");
    assert_eq!(
        liveness.path, "/healthz",
        "liveness asks whether the process serves"
    );
    assert_eq!(
        readiness.path, "/readyz",
        "readiness asks whether the store takes writes"
    );
    let container_ports: Vec<u64> = container["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|p| int(&p["containerPort"], "containerPort"))
        .collect();
    assert_eq!(
        container_ports,
        vec![port, grpc],
        "containerPorts are the image's HTTP and gRPC ports"
    );
    assert_eq!(liveness.port, port);
    assert_eq!(readiness.port, port);
    let server = start_echo().await;
    for path in [&liveness.path, &readiness.path] {
        let response = server
            .client
            .get(format!("{}{}", server.url, path.trim_start_matches('/')))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "GET {path}");
    }
    // ... where a path the server does not route does not answer 200.
    let response = server
        .client
        .get(format!("{}no-such-probe", server.url))
        .send()
        .await
        .unwrap();
    assert_ne!(response.status().as_u16(), 200, "GET /no-such-probe");
    server.stop().await;

    // The Service sends to that port.
    for service in of_kind(&objects, "Service") {
        for service_port in service["spec"]["ports"].as_sequence().unwrap() {
            let target = &service_port["targetPort"];
            let target = match target.as_str() {
                Some("http") => port,
                Some("grpc") => grpc,
                _ => int(target, "targetPort"),
            };
            assert!(
                [port, grpc].contains(&target),
                "Service targetPort {target}"
            );
        }
        assert_eq!(&service["spec"]["selector"], labels);
    }

    // SIGTERM: running turns get shutdown.grace_secs after the preStop pause; the pod's grace
    // must cover both.
    let grace = colloquy::config::ShutdownConfig::default().grace_secs;
    let pre_stop: u64 = container["lifecycle"]["preStop"]["exec"]["command"]
        .as_sequence()
        .map(|command| {
            let words: Vec<&str> = command.iter().filter_map(Yaml::as_str).collect();
            assert_eq!(words.first(), Some(&"sleep"), "preStop {words:?}");
            words[1].parse().expect("sleep seconds")
        })
        .unwrap_or(0);
    let termination = int(
        &pod["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    );
    assert!(
        termination > pre_stop + grace,
        "terminationGracePeriodSeconds {termination} must exceed preStop {pre_stop} s + \
         shutdown.grace_secs {grace} s"
    );

    // A PodDisruptionBudget over these pods that leaves some serving.
    let budgets = of_kind(&objects, "PodDisruptionBudget");
    assert_eq!(budgets.len(), 1, "one PodDisruptionBudget");
    let budget = &budgets[0]["spec"];
    assert_eq!(&budget["selector"]["matchLabels"], labels);
    match (
        budget["maxUnavailable"].as_u64(),
        budget["minAvailable"].as_u64(),
    ) {
        (Some(max), None) => assert!(max >= 1 && max < replicas, "maxUnavailable {max}"),
        (None, Some(min)) => assert!(min >= 1 && min < replicas, "minAvailable {min}"),
        other => panic!("the budget sets one of maxUnavailable/minAvailable: {other:?}"),
    }

    // Environment: real keys; the advertised URL is the pod's IP on the image's port; the
    // database URL and the cluster secret come from the Secret, which has those keys.
    let env = container["env"].as_sequence().expect("env");
    let mut defined: Vec<&str> = Vec::new();
    let mut variables = Vec::new();
    let mut secret_keys = BTreeMap::new();
    for entry in env {
        let name = entry["name"].as_str().expect("env name");
        if let Some(value) = entry["value"].as_str() {
            // Kubernetes expands $(VAR) only for variables defined earlier in the list.
            for (at, _) in value.match_indices("$(") {
                let var = &value[at + 2..at + value[at..].find(')').unwrap()];
                assert!(
                    defined.contains(&var),
                    "{name} uses $({var}) before it is set"
                );
            }
        }
        if let Some(key) = entry["valueFrom"]["secretKeyRef"].as_mapping() {
            let secret = key[&Yaml::from("name")].as_str().unwrap().to_owned();
            let key = key[&Yaml::from("key")].as_str().unwrap().to_owned();
            secret_keys.insert(name.to_owned(), (secret, key));
        }
        defined.push(name);
        variables.push(name.to_owned());
    }
    let mut named = Vec::new();
    colloquy_variables(variables, "deploy/kubernetes", &mut named);
    check_variables(&named);
    let by_name = |wanted: &str| {
        env.iter()
            .find(|e| e["name"].as_str() == Some(wanted))
            .unwrap_or_else(|| panic!("{wanted} is not set"))
    };
    let pod_ip = by_name("POD_IP");
    assert_eq!(
        pod_ip["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("status.podIP")
    );
    let advertise = by_name("COLLOQUY_CLUSTER__ADVERTISE_URL")["value"]
        .as_str()
        .expect("advertise_url is a value");
    assert!(advertise.contains("$(POD_IP)"), "{advertise}");
    assert_eq!(url_port(advertise), port, "{advertise}");
    let secrets = of_kind(&objects, "Secret");
    for variable in ["COLLOQUY_CLUSTER__SECRET", "COLLOQUY_STORE__URL"] {
        let (secret, key) = secret_keys
            .get(variable)
            .unwrap_or_else(|| panic!("{variable} does not come from a Secret"));
        let example = secrets
            .iter()
            .find(|s| s["metadata"]["name"].as_str() == Some(secret))
            .unwrap_or_else(|| panic!("no example of Secret {secret}"));
        let value = example["stringData"][key.as_str()]
            .as_str()
            .unwrap_or_else(|| panic!("Secret {secret} has no {key}"));
        if variable == "COLLOQUY_STORE__URL" {
            assert!(colloquy::store::postgres::is_postgres_url(value), "{value}");
        } else {
            assert_long_enough(value);
        }
    }
}

fn check_variables(named: &[(String, String)]) {
    assert!(!named.is_empty(), "no COLLOQUY_* variables found");
    let unknown: Vec<_> = named
        .iter()
        .filter(|(name, _)| !colloquy::config::reads_variable(name))
        .collect();
    assert!(
        unknown.is_empty(),
        "variables colloquy does not read (it would ignore them): {unknown:?}"
    );
}

#[test]
fn compose_nodes_share_one_database_on_the_image_port_with_real_variables() {
    let documents = yaml_documents(&repo().join("deploy/compose.yaml"));
    assert_eq!(documents.len(), 1);
    let services = documents[0]["services"]
        .as_mapping()
        .expect("services")
        .clone();
    let ImagePorts { http: port, grpc } = image_ports();
    let mut named = Vec::new();
    let mut advertised = BTreeSet::new();
    let mut databases = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let mut nodes = 0;
    for (service, definition) in &services {
        let service = service.as_str().unwrap();
        let environment = definition["environment"].as_mapping();
        let Some(environment) = environment else {
            continue;
        };
        let value = |key: &str| {
            environment
                .get(Yaml::from(key))
                .and_then(Yaml::as_str)
                .map(str::to_owned)
        };
        let names: Vec<String> = environment
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect();
        colloquy_variables(names.clone(), service, &mut named);
        if !names.iter().any(|n| n.starts_with("COLLOQUY_")) {
            continue;
        }
        nodes += 1;
        let url = value("COLLOQUY_CLUSTER__ADVERTISE_URL")
            .unwrap_or_else(|| panic!("{service} advertises no URL"));
        assert_eq!(url_port(&url), port, "{service}: {url}");
        assert!(url.contains(service), "{service} advertises {url}");
        advertised.insert(url);
        databases.insert(value("COLLOQUY_STORE__URL").expect("store.url"));
        secrets.insert(value("COLLOQUY_CLUSTER__SECRET").expect("cluster.secret"));
        for mapping in definition["ports"].as_sequence().into_iter().flatten() {
            let mapping = mapping.as_str().expect("ports as HOST:CONTAINER");
            let inside = mapping.rsplit(':').next().unwrap();
            let inside = inside.parse::<u64>().ok();
            assert!(
                inside == Some(port) || inside == Some(grpc),
                "{service}: {mapping}"
            );
        }
    }
    check_variables(&named);
    assert!(nodes >= 2, "several nodes, not {nodes}");
    assert_eq!(advertised.len(), nodes, "each node advertises itself");
    assert_eq!(databases.len(), 1, "one database: {databases:?}");
    assert_eq!(secrets.len(), 1, "one cluster secret");
    for secret in &secrets {
        assert_long_enough(secret);
    }
}

/// Nodes refuse a shorter `cluster.secret`, so an example that is copied as it is must still
/// start.
fn assert_long_enough(secret: &str) {
    let min = colloquy::app::MIN_CLUSTER_SECRET_BYTES;
    assert!(
        secret.len() >= min,
        "cluster.secret {secret:?} is shorter than {min} bytes"
    );
}

#[test]
fn the_deployment_docs_reference_every_deployment_file() {
    let docs = read(&repo().join("docs/deployment.md"));
    let mut files = vec!["deploy/compose.yaml".to_owned()];
    for entry in std::fs::read_dir(repo().join("deploy/kubernetes")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        files.push(format!("deploy/kubernetes/{name}"));
    }
    for file in files {
        assert!(
            docs.contains(&file),
            "docs/deployment.md does not mention {file}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The image's HEALTHCHECK: `colloquy healthcheck`.

#[actix_rt::test]
async fn healthcheck_succeeds_only_against_a_serving_server() {
    let server = start_echo().await;
    let address = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let port = address.rsplit_once(':').unwrap().1.to_owned();
    let healthcheck = |envs: Vec<(&str, String)>, args: Vec<String>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_colloquy"));
        command.arg("healthcheck").args(args);
        command
            .env_remove("COLLOQUY_LISTEN")
            .env_remove("COLLOQUY_TOKENS");
        for (k, v) in envs {
            command.env(k, v);
        }
        command
    };
    // From COLLOQUY_LISTEN, an unspecified address asked on loopback: how the image runs it.
    let listen_all = format!("0.0.0.0:{port}");
    let output = tokio::task::spawn_blocking({
        let mut command = healthcheck(vec![("COLLOQUY_LISTEN", listen_all)], vec![]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let url = server.url.clone();
    server.stop().await;

    // Nothing listening there any more: it fails, and says where it asked.
    let output = tokio::task::spawn_blocking({
        let mut command = healthcheck(vec![], vec!["--url".into(), url.clone()]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("healthz"), "{stderr}");
}
