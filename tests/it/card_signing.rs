//! Signed agent cards (`card.signing_key_file`), checked from outside colloquy's own code: the
//! card and key set a real server serves are verified by PyJWT + rfc8785 (tests/interop/
//! verify_card.py); `colloquy send` and the `a2a` backend refuse a peer whose card the trusted
//! key set did not sign, before sending anything. Also the official Python SDK client (1.x)
//! authenticated by a bearer JWT (`[auth.jwt]`, tests/interop/jwt_client1.py).

use crate::common;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use colloquy::agent::A2aAgent;
use colloquy::client::ClientOptions;
use common::{
    TestServer, V1, conversations, hang_up, run_sdk_script, serve_json, start_echo_with, task_of,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
enum KeyKind {
    /// EC P-256, PKCS#8 PEM.
    Es256Pem,
    /// Ed25519, PKCS#8 DER.
    Ed25519Der,
}

impl KeyKind {
    fn alg(self) -> &'static str {
        match self {
            KeyKind::Es256Pem => "ES256",
            KeyKind::Ed25519Der => "EdDSA",
        }
    }
}

/// A fresh card signing key written to `dir`.
fn card_key(dir: &Path, kind: KeyKind) -> PathBuf {
    let rng = SystemRandom::new();
    let (name, bytes) = match kind {
        KeyKind::Es256Pem => {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .expect("P-256 key");
            let body = STANDARD.encode(pkcs8.as_ref());
            let lines: Vec<&str> = body
                .as_bytes()
                .chunks(64)
                .map(|c| std::str::from_utf8(c).expect("base64"))
                .collect();
            let pem = format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
                lines.join("\n")
            );
            ("card-key.pem", pem.into_bytes())
        }
        KeyKind::Ed25519Der => {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("Ed25519 key");
            ("card-key.der", pkcs8.as_ref().to_vec())
        }
    };
    let path = dir.join(format!("{}-{name}", common::next_id()));
    std::fs::write(&path, bytes).expect("key written");
    path
}

/// The echo agent, its card signed with a fresh key of `kind` (kept in `keys`).
async fn signed_server(keys: &Path, kind: KeyKind) -> TestServer {
    let path = card_key(keys, kind);
    start_echo_with(move |c| signing_with(c, path)).await
}

/// The card signed with the key at `path`: served at a fixed address, named by `public_url`
/// (a signed card never takes its URLs from the request).
fn signing_with(config: &mut colloquy::config::Config, path: PathBuf) {
    let port = common::free_port();
    config.listen = format!("127.0.0.1:{port}");
    config.public_url = Some(format!("http://127.0.0.1:{port}/"));
    config.card.signing_key_file = Some(path);
}

fn card_url(server: &TestServer) -> String {
    format!("{}.well-known/agent-card.json", server.url)
}

fn jwks_url(server: &TestServer) -> String {
    format!("{}.well-known/jwks.json", server.url)
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    let response = client.get(url).send().await.expect("GET");
    assert_eq!(response.status(), 200, "{url}");
    response.json().await.expect("JSON")
}

/// The decoded protected header of the card's only signature.
fn protected_header(card: &Value) -> Value {
    let signatures = card["signatures"].as_array().expect("signatures");
    assert_eq!(signatures.len(), 1, "{card:#}");
    let protected = signatures[0]["protected"].as_str().expect("protected");
    let bytes = URL_SAFE_NO_PAD.decode(protected).expect("base64url");
    serde_json::from_slice(&bytes).expect("header JSON")
}

/// A loopback server that serves `card` as its agent card (a card relayed by someone else).
async fn serve_card(card: Value) -> (String, actix_web::dev::ServerHandle) {
    serve_json("/.well-known/agent-card.json", move || card.clone()).await
}

// ---- the card and its key set, verified by PyJWT + rfc8785 ----

#[actix_rt::test]
async fn python_verifies_the_signed_card_es256_and_eddsa() {
    let keys = tempfile::tempdir().expect("temp dir");
    let other = signed_server(keys.path(), KeyKind::Es256Pem).await;
    for kind in [KeyKind::Es256Pem, KeyKind::Ed25519Der] {
        let server = signed_server(keys.path(), kind).await;
        let card = get_json(&server.client, &card_url(&server)).await;
        let header = protected_header(&card);
        assert_eq!(header["alg"], kind.alg(), "{header}");
        assert_eq!(header["typ"], "JOSE", "{header}");
        assert_eq!(header["jku"], jwks_url(&server).as_str(), "{header}");
        let kid = header["kid"].as_str().expect("kid").to_owned();

        // The key set served holds the card's key, under the header's kid.
        let jwks = get_json(&server.client, &jwks_url(&server)).await;
        let listed = jwks["keys"].as_array().expect("keys");
        let key = listed
            .iter()
            .find(|k| k["kid"] == kid.as_str())
            .unwrap_or_else(|| panic!("kid {kid} not in the served key set {jwks:#}"));
        match kind {
            KeyKind::Es256Pem => {
                assert_eq!((&key["kty"], &key["crv"]), (&json!("EC"), &json!("P-256")))
            }
            KeyKind::Ed25519Der => {
                assert_eq!(
                    (&key["kty"], &key["crv"]),
                    (&json!("OKP"), &json!("Ed25519"))
                )
            }
        }
        assert!(
            key.get("d").is_none(),
            "a private member in the key set: {key}"
        );

        // Independently verified (PyJWT, rfc8785; the kid re-derived as the RFC 7638 thumbprint).
        let (card_at, jwks_at) = (card_url(&server), jwks_url(&server));
        let (ok, output) =
            run_sdk_script("sdk1", "verify_card.py", &[&card_at, &jwks_at, "--sdk"]).await;
        println!("{kind:?}:\n{output}");
        assert!(ok, "{kind:?}: verify_card.py failed:\n{output}");
        assert!(
            output.contains(&format!("VERIFIED {kid} {}", kind.alg())),
            "{output}"
        );

        // The card changed in one field no longer verifies.
        let (ok, output) =
            run_sdk_script("sdk1", "verify_card.py", &[&card_at, &jwks_at, "--tamper"]).await;
        assert!(!ok, "{kind:?}: a tampered card verified:\n{output}");
        assert!(output.contains("NOT VERIFIED"), "{output}");

        // Nor with a key set that lacks its key (another server's).
        let (ok, output) =
            run_sdk_script("sdk1", "verify_card.py", &[&card_at, &jwks_url(&other)]).await;
        assert!(!ok, "{kind:?}: verified by another key set:\n{output}");
        assert!(output.contains("is not in the trusted set"), "{output}");

        // A copy on disk verifies the same; a copy with one changed byte in a skill does not.
        let copy = keys.path().join(format!("card-{}.json", common::next_id()));
        std::fs::write(&copy, card.to_string()).expect("card copy");
        let copy_at = copy.to_str().expect("path");
        let (ok, output) = run_sdk_script("sdk1", "verify_card.py", &[copy_at, &jwks_at]).await;
        assert!(ok, "{kind:?}: the copy on disk:\n{output}");
        let mut changed = card.clone();
        changed["skills"][0]["description"] = json!("another description");
        std::fs::write(&copy, changed.to_string()).expect("card copy");
        let (ok, output) = run_sdk_script("sdk1", "verify_card.py", &[copy_at, &jwks_at]).await;
        assert!(!ok, "{kind:?}: a changed skill verified:\n{output}");
        server.stop().await;
    }
    other.stop().await;
}

#[actix_rt::test]
async fn the_signed_card_keeps_its_etag() {
    let keys = tempfile::tempdir().expect("temp dir");
    // ES256: a new signature would differ at each signing (ECDSA is randomized).
    let server = signed_server(keys.path(), KeyKind::Es256Pem).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let response = server
            .client
            .get(card_url(&server))
            .send()
            .await
            .expect("card");
        assert_eq!(response.status(), 200);
        let etag = response
            .headers()
            .get("etag")
            .expect("an ETag")
            .to_str()
            .expect("ASCII")
            .to_owned();
        let body = response.text().await.expect("body");
        seen.push((etag, body));
    }
    assert_eq!(seen[0].0, seen[1].0, "two GETs, two ETags");
    assert_eq!(seen[0].1, seen[1].1, "two GETs, two bodies");
    let revalidated = server
        .client
        .get(card_url(&server))
        .header("If-None-Match", &seen[0].0)
        .send()
        .await
        .expect("card");
    assert_eq!(revalidated.status(), 304);
    server.stop().await;
}

/// The extended card (`GetExtendedAgentCard`, another content) carries its own signature, which
/// verifies as the public card's does.
#[actix_rt::test]
async fn the_extended_card_is_signed_too() {
    let keys = tempfile::tempdir().expect("temp dir");
    let path = card_key(keys.path(), KeyKind::Ed25519Der);
    let server = start_echo_with(move |c| {
        signing_with(c, path);
        c.card.extended.description = Some("For members: the archive too".into());
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
    })
    .await;
    let response = common::rpc_as(&server, "alice-secret", "GetExtendedAgentCard", json!({})).await;
    let extended = &response["result"];
    assert_eq!(
        extended["description"], "For members: the archive too",
        "{response}"
    );
    let public = get_json(&server.client, &card_url(&server)).await;
    assert_ne!(extended["signatures"], public["signatures"]);
    assert_eq!(
        protected_header(extended)["kid"],
        protected_header(&public)["kid"]
    );
    let copy = keys.path().join("extended-card.json");
    std::fs::write(&copy, extended.to_string()).expect("card copy");
    let (copy_at, jwks_at) = (copy.to_str().expect("path"), jwks_url(&server));
    let (ok, output) = run_sdk_script("sdk1", "verify_card.py", &[copy_at, &jwks_at]).await;
    assert!(ok, "the extended card:\n{output}");
    let (ok, output) =
        run_sdk_script("sdk1", "verify_card.py", &[copy_at, &jwks_at, "--tamper"]).await;
    assert!(!ok, "a tampered extended card verified:\n{output}");
    server.stop().await;
}

/// The official a2a-sdk (1.3.0) verifies a card as its protobuf round trip: proto3 drops
/// fields at their default and fields v1.0 lacks (a `both` card's v0.3 fields), so it can
/// verify only a v1.0-only card, which therefore carries no field at its default.
#[actix_rt::test]
async fn the_official_sdk_verifier_accepts_a_v1_only_card() {
    let keys = tempfile::tempdir().expect("temp dir");
    let path = card_key(keys.path(), KeyKind::Es256Pem);
    let server = start_echo_with(move |c| {
        signing_with(c, path);
        c.card.versions = "1.0".into();
    })
    .await;
    let (card_at, jwks_at) = (card_url(&server), jwks_url(&server));
    let (ok, output) =
        run_sdk_script("sdk1", "verify_card.py", &[&card_at, &jwks_at, "--sdk"]).await;
    assert!(ok, "{output}");
    assert!(output.contains("SDK-VERIFIER ok"), "{output}");
    server.stop().await;
}

#[actix_rt::test]
async fn a_card_key_replaced_then_sighup_signs_with_the_new_one_and_keeps_the_old_published() {
    let keys = tempfile::tempdir().expect("temp dir");
    let path = card_key(keys.path(), KeyKind::Es256Pem);
    let configured = path.clone();
    let server = start_echo_with(move |c| signing_with(c, configured)).await;
    let kid = |card: &Value| {
        protected_header(card)["kid"]
            .as_str()
            .expect("kid")
            .to_owned()
    };
    let before = kid(&get_json(&server.client, &card_url(&server)).await);
    std::fs::rename(card_key(keys.path(), KeyKind::Ed25519Der), &path).expect("key replaced");
    let listener = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .expect("a SIGHUP listener");
    hang_up(&listener);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let after = loop {
        let now = kid(&get_json(&server.client, &card_url(&server)).await);
        if now != before {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the card key was not rotated"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let jwks = get_json(&server.client, &jwks_url(&server)).await;
    let published: Vec<&str> = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|key| key["kid"].as_str())
        .collect();
    assert!(
        published.contains(&before.as_str()),
        "the key before stays: {jwks}"
    );
    assert!(published.contains(&after.as_str()), "{jwks}");
    let (card_at, jwks_at) = (card_url(&server), jwks_url(&server));
    let (ok, output) = run_sdk_script("sdk1", "verify_card.py", &[&card_at, &jwks_at]).await;
    assert!(ok && output.contains(&after), "{output}");
    server.stop().await;
}

#[actix_rt::test]
async fn a_card_is_signed_only_with_its_own_url_configured() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::test_config(dir.path());
    config.card.signing_key_file = Some(card_key(dir.path(), KeyKind::Ed25519Der));
    let agent = Arc::new(colloquy::agent::EchoAgent::default());
    match colloquy::app::start(config, agent).await {
        Ok(server) => {
            server.stop().await;
            panic!("a card was signed with URLs any request's Host header could choose");
        }
        Err(error) => assert!(error.to_string().contains("public_url"), "{error}"),
    }
}

// ---- `colloquy send` with `card_jwks_url` ----

struct SendRun {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `colloquy send --config CONFIG --to TARGET TEXT`, with its own COLLOQUY_HOME.
async fn colloquy_send(home: &Path, config: &Path, target: &str, text: &str) -> SendRun {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .arg("send")
        .arg("--config")
        .arg(config)
        .args(["--to", target, text])
        .env("COLLOQUY_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        command.spawn().expect("colloquy runs").wait_with_output(),
    )
    .await
    .expect("colloquy send finishes within 30 s")
    .expect("output");
    SendRun {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `colloquy send`'s exit code for a peer that answered wrongly (src/cli/send.rs EXIT_PEER).
const EXIT_PEER: i32 = 5;

#[actix_rt::test]
async fn send_refuses_a_card_the_trusted_key_set_did_not_sign() {
    let keys = tempfile::tempdir().expect("temp dir");
    let trusted = signed_server(keys.path(), KeyKind::Es256Pem).await;
    let other_key = signed_server(keys.path(), KeyKind::Ed25519Der).await;
    let unsigned = start_echo_with(|_| {}).await;
    // The trusted server's own signed card, relayed by someone else with its interfaces pointed
    // at another server (the signatures kept as they were).
    let card = get_json(&trusted.client, &card_url(&trusted)).await;
    let redirected: Value = serde_json::from_str(&card.to_string().replace(
        trusted.url.trim_end_matches('/'),
        other_key.url.trim_end_matches('/'),
    ))
    .expect("card JSON");
    assert_ne!(redirected, card);
    let (relay_url, relay) = serve_card(redirected).await;

    let home = tempfile::tempdir().expect("temp dir");
    let config = home.path().join("colloquy.toml");
    let trust = jwks_url(&trusted);
    let mut toml = String::new();
    for (name, url) in [
        ("good", trusted.url.as_str()),
        ("forged", other_key.url.as_str()),
        ("unsigned", unsigned.url.as_str()),
        ("relayed", relay_url.as_str()),
    ] {
        toml.push_str(&format!(
            "[peers.{name}]\nurl = \"{url}\"\ncard_jwks_url = \"{trust}\"\n"
        ));
    }
    std::fs::write(&config, toml).expect("config written");

    let good = colloquy_send(home.path(), &config, "good", "hello").await;
    assert_eq!(
        good.code, 0,
        "stdout: {}\nstderr: {}",
        good.stdout, good.stderr
    );
    assert_eq!(good.stdout.trim(), "echo: hello (turn 1)");
    assert_eq!(conversations(&trusted).await.len(), 1);
    // The session continues, the card checked again.
    let again = colloquy_send(home.path(), &config, "good", "again").await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(
        again.stdout.trim(),
        "echo: again (turn 2; previously: \"hello\")"
    );

    for (peer, server, why) in [
        ("forged", &other_key, "no signature of the card verifies"),
        ("unsigned", &unsigned, "the card is not signed"),
        ("relayed", &other_key, "no signature of the card verifies"),
    ] {
        let run = colloquy_send(home.path(), &config, peer, "secret").await;
        assert_eq!(
            run.code, EXIT_PEER,
            "{peer}: stdout: {}\nstderr: {}",
            run.stdout, run.stderr
        );
        assert!(
            run.stderr.contains("is refused") && run.stderr.contains(why),
            "{peer}: {}",
            run.stderr
        );
        assert!(run.stdout.trim().is_empty(), "{peer}: {}", run.stdout);
        let received = conversations(server).await;
        assert!(
            received.is_empty(),
            "{peer}: the peer received {received:?}"
        );
    }
    // The trusted server still holds its one conversation, and no more.
    assert_eq!(conversations(&trusted).await.len(), 1);

    relay.stop(true).await;
    trusted.stop().await;
    other_key.stop().await;
    unsigned.stop().await;
}

// ---- the `a2a` backend with `card_jwks_url` ----

fn delegating_to(peer: &TestServer, trusted_jwks: &str) -> Arc<A2aAgent> {
    let options = ClientOptions {
        card_jwks_url: Some(trusted_jwks.to_owned()),
        connect_timeout: Duration::from_secs(5),
        timeout: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    Arc::new(A2aAgent::with_options(&peer.url, options, 20))
}

#[actix_rt::test]
async fn the_a2a_backend_delegates_only_to_a_peer_signed_by_the_trusted_key() {
    let keys = tempfile::tempdir().expect("temp dir");
    let trusted = signed_server(keys.path(), KeyKind::Ed25519Der).await;
    let other_key = signed_server(keys.path(), KeyKind::Es256Pem).await;
    let unsigned = start_echo_with(|_| {}).await;
    let trust = jwks_url(&trusted);

    // Control: the peer whose card the trusted key signed is delegated to.
    let a = common::start_with(delegating_to(&trusted, &trust), |_| {}).await;
    let r = a.send_text(V1, "one", Some("signed-peer"), None).await;
    let task = task_of(&r);
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    assert_eq!(common::artifact_text(task), "echo: one (turn 1)");
    assert_eq!(conversations(&trusted).await.len(), 1);
    a.stop().await;

    for (name, peer) in [("another key", &other_key), ("unsigned", &unsigned)] {
        let a = common::start_with(delegating_to(peer, &trust), |_| {}).await;
        let r = a
            .send_text(V1, "secret", Some("untrusted-peer"), None)
            .await;
        let task = task_of(&r);
        assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{name}: {r}");
        let why = common::status_text(task);
        assert!(why.contains("refused"), "{name}: {why}");
        let received = conversations(peer).await;
        assert!(
            received.is_empty(),
            "{name}: the peer received {received:?}"
        );
        a.stop().await;
    }

    trusted.stop().await;
    other_key.stop().await;
    unsigned.stop().await;
}

// ---- the official Python SDK client with a bearer JWT ----

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "colloquy";

/// An ES256 issuer key: its encoding key, and a JWKS file holding its public half.
struct Issuer {
    kid: String,
    encoding: EncodingKey,
}

impl Issuer {
    fn new(dir: &Path) -> (Issuer, PathBuf) {
        let rng = SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("P-256 pkcs8");
        let point = pair.public_key().as_ref();
        let kid = format!("issuer-key-{}", common::next_id());
        let jwk = json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])});
        let path = dir.join("issuer-jwks.json");
        std::fs::write(&path, json!({"keys": [jwk]}).to_string()).expect("JWKS written");
        let issuer = Issuer {
            kid,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        };
        (issuer, path)
    }

    fn token(&self, sub: &str, audience: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        let claims = json!({"iss": ISSUER, "aud": audience, "sub": sub,
            "iat": now, "nbf": now - 5, "exp": now + 300});
        let header = Header {
            alg: Algorithm::ES256,
            kid: Some(self.kid.clone()),
            ..Header::default()
        };
        jsonwebtoken::encode(&header, &claims, &self.encoding).expect("token signed")
    }
}

#[actix_rt::test]
async fn python_sdk_client_with_a_bearer_jwt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (issuer, jwks_file) = Issuer::new(dir.path());
    let server = start_echo_with(move |c| {
        c.auth.jwt.issuer = ISSUER.into();
        c.auth.jwt.audience = vec![AUDIENCE.into()];
        c.auth.jwt.jwks_file = Some(jwks_file);
    })
    .await;
    let url = server.url.trim_end_matches('/').to_owned();
    let token = issuer.token("sdk-user", AUDIENCE);

    // Three turns, the token put on each call by the SDK's AuthInterceptor for the card's scheme.
    let (ok, output) = run_sdk_script(
        "sdk1",
        "jwt_client1.py",
        &["--url", &url, "--token", &token],
    )
    .await;
    println!("{output}");
    assert!(ok, "jwt_client1.py failed:\n{output}");
    assert!(output.contains("INTEROP OK"), "{output}");

    // The conversation belongs to the token's principal (ISSUER#sub), and to no anonymous caller.
    let mine = common::rpc_as(&server, &token, "colloquy/listConversations", json!({})).await;
    let listed = mine["result"]["conversations"]
        .as_array()
        .unwrap_or_else(|| panic!("{mine}"));
    assert_eq!(listed.len(), 1, "{mine}");
    assert_eq!(listed[0]["turns"], 3, "{mine}");
    let another = issuer.token("someone-else", AUDIENCE);
    let theirs = common::rpc_as(&server, &another, "colloquy/listConversations", json!({})).await;
    assert_eq!(theirs["result"]["conversations"], json!([]), "{theirs}");

    // Streaming, the token as a plain header of the SDK's httpx client.
    let (ok, output) = run_sdk_script(
        "sdk1",
        "jwt_client1.py",
        &[
            "--url",
            &url,
            "--token",
            &token,
            "--auth",
            "header",
            "--mode",
            "streaming",
        ],
    )
    .await;
    assert!(
        ok,
        "jwt_client1.py --auth header --mode streaming:\n{output}"
    );

    // A token for another audience: HTTP 401.
    let wrong = issuer.token("sdk-user", "someone-else");
    let (ok, output) = run_sdk_script(
        "sdk1",
        "jwt_client1.py",
        &["--url", &url, "--token", &wrong, "--expect-status", "401"],
    )
    .await;
    println!("{output}");
    assert!(ok, "the wrong audience was not refused with 401:\n{output}");
    assert!(output.contains("INTEROP REFUSED 401"), "{output}");
    server.stop().await;
}
