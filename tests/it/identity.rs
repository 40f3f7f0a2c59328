//! Who a caller is beyond static tokens: JWTs from an issuer whose key set a real loopback
//! server holds (and rotates), tenants (the v1.0 `tenant` field and `/{tenant}/…` routes), and
//! the tokens file reloaded on SIGHUP.

use crate::common;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "colloquy-test";
const SCOPE: &str = "a2a";
const INVALID_TOKEN: &str = "Bearer error=\"invalid_token\"";

/// A signing key of the issuer: what signs tokens, and its public half as a JWK.
struct IssuerKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
    /// The raw public key (for tokens that try to use it as an HMAC secret).
    public: Vec<u8>,
}

impl IssuerKey {
    fn es256(kid: &str) -> IssuerKey {
        let rng = SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("P-256 pkcs8");
        // The uncompressed point: 0x04, x, y.
        let point = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])});
        IssuerKey {
            kid: kid.into(),
            alg: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk,
            public: point,
        }
    }

    fn ed25519(kid: &str) -> IssuerKey {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 pkcs8");
        let public = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&public)});
        IssuerKey {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk,
            public,
        }
    }

    /// `claims` signed with this key, its kid in the header.
    fn sign(&self, claims: &Value) -> String {
        let header = Header {
            alg: self.alg,
            kid: Some(self.kid.clone()),
            ..Header::default()
        };
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("token signed")
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims the test server accepts for `sub`: its issuer, audience and scope, valid for 5 min.
fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "scope": format!("{SCOPE} other"),
        "iat": now(), "nbf": now() - 5, "exp": now() + 300})
}

/// `claims` with `changes` laid over them (a null removes the claim).
fn claims_with(sub: &str, changes: Value) -> Value {
    let mut claims = claims(sub);
    let fields = claims.as_object_mut().expect("claims object");
    for (field, value) in changes.as_object().expect("an object of changes") {
        match value {
            Value::Null => fields.remove(field),
            value => fields.insert(field.clone(), value.clone()),
        };
    }
    claims
}

/// The issuer's key set on loopback, changeable while the test runs, counting its fetches.
struct Jwks {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl Jwks {
    async fn serve(keys: &[&IssuerKey]) -> Jwks {
        let set = Arc::new(Mutex::new(keys.iter().map(|k| k.jwk.clone()).collect()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (set_in, fetches_in) = (set.clone(), fetches.clone());
        let (base, handle) = serve_json("/jwks.json", move || {
            fetches_in.fetch_add(1, Ordering::SeqCst);
            json!({"keys": *set_in.lock().expect("key set")})
        })
        .await;
        Jwks {
            url: format!("{base}jwks.json"),
            keys: set,
            fetches,
            handle,
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// The set now holds `keys` (a rotation).
    fn set(&self, keys: &[&IssuerKey]) {
        *self.keys.lock().expect("key set") = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// The echo agent behind `[auth.jwt]` for `jwks` (scope `a2a` required, tenants from the
/// `tenants` claim), with `tweak` applied after.
async fn start_with_jwt(
    jwks: &Jwks,
    tweak: impl FnOnce(&mut colloquy::config::Config),
) -> TestServer {
    let url = jwks.url.clone();
    start_echo_with(move |c| {
        let jwt = &mut c.auth.jwt;
        jwt.issuer = ISSUER.into();
        jwt.audience = vec![AUDIENCE.into()];
        jwt.jwks_url = Some(url);
        jwt.required_scopes = vec![SCOPE.into()];
        jwt.tenants_claim = Some("tenants".into());
        tweak(c);
    })
    .await
}

/// What one call came back with.
struct Answer {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

impl Answer {
    /// Refused as RFC 6750's `invalid_token`: 401, the challenge, -32014, `why` in the message.
    fn assert_invalid_token(&self, why: &str) {
        assert_eq!(self.status, 401, "{why}: {}", self.body);
        assert_eq!(self.challenge.as_deref(), Some(INVALID_TOKEN), "{why}");
        assert_eq!(
            self.body["error"]["code"],
            json!(-32014),
            "{why}: {}",
            self.body
        );
        let message = self.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{why:?} not in {message:?}");
    }

    /// The reply text of a SendMessage that succeeded.
    fn reply(&self) -> String {
        assert_eq!(self.status, 200, "{}", self.body);
        assert!(self.body.get("error").is_none(), "{}", self.body);
        artifact_text(task_of(&self.body))
    }
}

/// One v1.0 JSON-RPC call with `token` as the bearer, if any.
async fn call(server: &TestServer, token: Option<&str>, method: &str, params: Value) -> Answer {
    let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
    let mut request = server
        .client
        .post(&server.url)
        .header("A2A-Version", V1)
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ASCII challenge").to_owned());
    let body = response.json().await.expect("JSON body");
    Answer {
        status,
        challenge,
        body,
    }
}

/// SendMessage params: `text` in `context_id`, in `tenant` if given.
fn send(text: &str, context_id: &str, tenant: Option<&str>) -> Value {
    let mut params = json!({"message": user_message(V1, text, Some(context_id), None)});
    if let Some(tenant) = tenant {
        params["tenant"] = json!(tenant);
    }
    params
}

async fn say(server: &TestServer, token: &str, text: &str, context_id: &str) -> Answer {
    call(
        server,
        Some(token),
        "SendMessage",
        send(text, context_id, None),
    )
    .await
}

/// One turn of `token`'s caller in `tenant`.
async fn say_in(
    server: &TestServer,
    token: &str,
    text: &str,
    context_id: &str,
    tenant: &str,
) -> Answer {
    call(
        server,
        Some(token),
        "SendMessage",
        send(text, context_id, Some(tenant)),
    )
    .await
}

/// The context ids `token`'s principal has conversations in.
async fn conversations(server: &TestServer, token: &str) -> Vec<String> {
    let listed = call(server, Some(token), "colloquy/listConversations", json!({})).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let mut ids: Vec<String> = listed.body["result"]["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(|c| c["contextId"].as_str().expect("contextId").to_owned())
        .collect();
    ids.sort();
    ids
}

/// A token that is not signed at all: `alg: none` and an empty signature.
fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.")
}

/// An HS256 token whose HMAC secret is `secret` (a public key: what alg confusion tries).
fn hmac_signed(kid: &str, claims: &Value, secret: &[u8]) -> String {
    let header = Header {
        alg: Algorithm::HS256,
        kid: Some(kid.into()),
        ..Header::default()
    };
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).expect("HS256")
}

#[actix_rt::test]
async fn tokens_the_issuer_did_not_validly_sign_for_us_are_refused_as_invalid_token() {
    let es = IssuerKey::es256("es-1");
    let jwks = Jwks::serve(&[&es]).await;
    let server = start_with_jwt(&jwks, |_| {}).await;
    let jwk_text = es.jwk.to_string();
    let refused = [
        (
            es.sign(&claims_with("mallory", json!({"exp": now() - 120}))),
            "expired",
        ),
        (
            es.sign(&claims_with("mallory", json!({"nbf": now() + 120}))),
            "not valid yet",
        ),
        (
            es.sign(&claims_with("mallory", json!({"aud": "another-service"}))),
            "another audience",
        ),
        (
            es.sign(&claims_with("mallory", json!({"iss": "https://evil.test"}))),
            "another issuer",
        ),
        (unsigned(&claims("mallory")), "header is not valid"),
        (
            hmac_signed(&es.kid, &claims("mallory"), &es.public),
            "HS256 are not accepted",
        ),
        (
            hmac_signed(&es.kid, &claims("mallory"), jwk_text.as_bytes()),
            "HS256 are not accepted",
        ),
        (
            es.sign(&claims_with("mallory", json!({"scope": "other"}))),
            "scope",
        ),
        (
            es.sign(&claims_with(
                "mallory",
                json!({"scp": ["other"], "scope": null}),
            )),
            "scope",
        ),
        (
            IssuerKey::es256("es-1").sign(&claims("mallory")),
            "signature",
        ),
    ];
    for (token, why) in &refused {
        let answer = call(
            &server,
            Some(token),
            "SendMessage",
            send("let me in", "c", None),
        )
        .await;
        answer.assert_invalid_token(why);
    }
    // Scopes may come as a `scp` list instead.
    let scp = es.sign(&claims_with(
        "mallory",
        json!({"scp": [SCOPE], "scope": null}),
    ));
    assert_eq!(
        say(&server, &scp, "by scp", "scp").await.reply(),
        "echo: by scp (turn 1)"
    );
    // Within the leeway (30 s) a token is still good, on either side.
    let late = es.sign(&claims_with("mallory", json!({"exp": now() - 10})));
    assert_eq!(
        say(&server, &late, "just late", "late").await.reply(),
        "echo: just late (turn 1)"
    );
    let early = es.sign(&claims_with("mallory", json!({"nbf": now() + 10})));
    assert_eq!(
        say(&server, &early, "just early", "late").await.reply(),
        "echo: just early (turn 2; previously: \"just late\")"
    );
    // Nothing the refused tokens sent was stored under the principal they named.
    let good = es.sign(&claims("mallory"));
    assert_eq!(conversations(&server, &good).await, ["late", "scp"]);
    server.stop().await;
    jwks.stop().await;
}

#[actix_rt::test]
async fn no_token_is_challenged_plainly_and_a_bad_one_as_invalid_token() {
    let es = IssuerKey::es256("es-1");
    let jwks = Jwks::serve(&[&es]).await;
    let server = start_with_jwt(&jwks, |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
    })
    .await;
    for token in [None, Some("")] {
        let answer = call(&server, token, "SendMessage", send("hi", "c", None)).await;
        assert_eq!(answer.status, 401, "{token:?}");
        assert_eq!(answer.challenge.as_deref(), Some("Bearer"), "{token:?}");
        assert_eq!(answer.body["error"]["code"], json!(-32014), "{token:?}");
    }
    for token in ["not-a-jwt", "a.b.c"] {
        let answer = call(&server, Some(token), "SendMessage", send("hi", "c", None)).await;
        answer.assert_invalid_token("not valid");
    }
    assert!(conversations(&server, "alice-secret").await.is_empty());
    server.stop().await;
    jwks.stop().await;
}

#[actix_rt::test]
async fn a_jwt_caller_is_issuer_and_subject_whatever_key_signed_and_apart_from_static_tokens() {
    let es = IssuerKey::es256("es-1");
    let ed = IssuerKey::ed25519("ed-1");
    let jwks = Jwks::serve(&[&es, &ed]).await;
    let server = start_with_jwt(&jwks, |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
    })
    .await;
    let alice_es = es.sign(&claims("alice"));
    let alice_ed = ed.sign(&claims("alice"));
    let bob_ed = ed.sign(&claims("bob"));

    let first = say(&server, &alice_es, "alice's plan", "shared").await;
    assert_eq!(first.reply(), "echo: alice's plan (turn 1)");
    // The same subject, signed with the other key (EdDSA): the same caller.
    assert_eq!(
        say(&server, &alice_ed, "and then", "shared").await.reply(),
        "echo: and then (turn 2; previously: \"alice's plan\")"
    );
    // Another subject of the same issuer, and a static token named like the subject: strangers.
    assert_eq!(
        say(&server, &bob_ed, "bob here", "shared").await.reply(),
        "echo: bob here (turn 1)"
    );
    assert_eq!(
        say(&server, "alice-secret", "static alice", "shared")
            .await
            .reply(),
        "echo: static alice (turn 1)"
    );
    let task_id = task_of(&first.body)["id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let stolen = call(&server, Some(&bob_ed), "GetTask", json!({"id": task_id})).await;
    assert_eq!(
        stolen.body["error"]["code"],
        json!(-32001),
        "{}",
        stolen.body
    );
    let stolen = call(
        &server,
        Some("alice-secret"),
        "GetTask",
        json!({"id": task_id}),
    )
    .await;
    assert_eq!(
        stolen.body["error"]["code"],
        json!(-32001),
        "{}",
        stolen.body
    );
    let own = call(&server, Some(&alice_ed), "GetTask", json!({"id": task_id})).await;
    assert_eq!(own.body["result"]["id"], json!(task_id), "{}", own.body);

    // The card names the issuer's discovery document and the scope it requires.
    let card = server.card(&[]).await;
    assert_eq!(
        card["securitySchemes"]["oidc"],
        json!({"type": "openIdConnect",
            "openIdConnectUrl": format!("{ISSUER}/.well-known/openid-configuration")}),
        "{card:#}"
    );
    let security = card["security"].as_array().expect("security");
    assert!(security.contains(&json!({"oidc": [SCOPE]})), "{card:#}");
    server.stop().await;
    jwks.stop().await;
}

#[actix_rt::test]
async fn a_static_principal_may_not_take_the_name_of_a_jwt_caller() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = test_config(dir.path());
    config.auth.jwt.issuer = ISSUER.into();
    config.auth.jwt.audience = vec![AUDIENCE.into()];
    config.auth.jwt.jwks_url = Some("http://127.0.0.1:9/jwks.json".into());
    config
        .auth
        .tokens
        .insert(format!("{ISSUER}#alice"), "fake-alice".into());
    let agent = Arc::new(colloquy::agent::EchoAgent::default());
    match colloquy::app::start(config, agent).await {
        Ok(server) => {
            server.stop().await;
            panic!("the server started with a static principal named like a JWT caller");
        }
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains("JWT caller"), "{message}");
            assert!(
                !message.contains("fake-alice"),
                "the token leaked: {message}"
            );
        }
    }
}

#[actix_rt::test]
async fn a_key_rotated_in_is_fetched_when_a_token_names_it_at_most_once_per_refresh_period() {
    let old = IssuerKey::es256("old");
    let new = IssuerKey::ed25519("new");
    let jwks = Jwks::serve(&[&old]).await;
    let refresh = Duration::from_secs(1);
    let server = start_with_jwt(&jwks, |c| c.auth.jwt.jwks_refresh_secs = refresh.as_secs()).await;
    let token = new.sign(&claims("carol"));
    // The set is fetched at start.
    let deadline = Instant::now() + Duration::from_secs(10);
    while jwks.fetches() == 0 {
        assert!(
            Instant::now() < deadline,
            "the key set was not fetched at start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A burst of tokens naming a key the issuer does not have: refused, and the set is not
    // fetched again for each (at most once per refresh period).
    let (before, burst) = (jwks.fetches(), Instant::now());
    for _ in 0..10 {
        let answer = say(&server, &token, "too soon", "rotated").await;
        answer.assert_invalid_token("\"new\" is not in the issuer's key set");
    }
    let fetched = jwks.fetches() - before;
    let allowed = 1 + (burst.elapsed().as_secs_f64() / refresh.as_secs_f64()) as usize;
    assert!(
        fetched <= allowed,
        "{fetched} fetches in {:?}",
        burst.elapsed()
    );

    // The issuer rotates the new key in: once the refresh period has passed, the same token
    // fetches the set again and is accepted.
    jwks.set(&[&old, &new]);
    let deadline = Instant::now() + refresh + Duration::from_secs(5);
    let reply = loop {
        let answer = say(&server, &token, "now?", "rotated").await;
        if answer.status == 200 {
            break answer.reply();
        }
        answer.assert_invalid_token("is not in the issuer's key set");
        assert!(
            Instant::now() < deadline,
            "the rotated key was never fetched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        reply, "echo: now? (turn 1)",
        "refused attempts stored nothing"
    );
    // The key already held still verifies, without another fetch.
    let fetches = jwks.fetches();
    let by_old = old.sign(&claims("carol"));
    assert_eq!(
        say(&server, &by_old, "old key", "rotated").await.reply(),
        "echo: old key (turn 2; previously: \"now?\")"
    );
    assert_eq!(jwks.fetches(), fetches);
    server.stop().await;
    jwks.stop().await;
}

/// An HTTP+JSON request as `token` (v1.0).
async fn rest(
    server: &TestServer,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let url = format!("{}{}", server.url, path.trim_start_matches('/'));
    let mut request = server
        .client
        .request(method, url)
        .header("A2A-Version", V1)
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status().as_u16();
    // A body that is not JSON (a routing error's text) is kept as a string, for messages.
    let text = response.text().await.expect("response body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `by rest` in `context_id`, sent to `/red/message:send`.
async fn send_in_red(server: &TestServer, token: &str, context_id: &str) -> (u16, Value) {
    let message = json!({"message": user_message(V1, "by rest", Some(context_id), None)});
    let post = reqwest::Method::POST;
    rest(server, token, post, "/red/message:send", Some(message)).await
}

/// The echo agent behind alice's token (`alice-secret`), alice given the tenants red and blue.
async fn start_with_tenants() -> TestServer {
    start_echo_with(|c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
        let tenants = vec!["red".into(), "blue".into()];
        c.auth.tenants.insert("alice".into(), tenants);
    })
    .await
}

#[actix_rt::test]
async fn the_same_context_in_each_tenant_is_its_own_conversation() {
    let server = start_with_tenants().await;
    let alice = "alice-secret";
    let tenants = [Some("red"), Some("blue"), None];
    let label = |tenant: Option<&str>| tenant.unwrap_or("default").to_owned();
    // Interleaved: each tenant's first turn, then each one's second.
    for tenant in tenants {
        let text = format!("{} one", label(tenant));
        let answer = call(
            &server,
            Some(alice),
            "SendMessage",
            send(&text, "shared", tenant),
        )
        .await;
        assert_eq!(answer.reply(), format!("echo: {text} (turn 1)"));
    }
    for tenant in tenants {
        let text = format!("{} two", label(tenant));
        let answer = call(
            &server,
            Some(alice),
            "SendMessage",
            send(&text, "shared", tenant),
        )
        .await;
        assert_eq!(
            answer.reply(),
            format!(
                "echo: {text} (turn 2; previously: \"{} one\")",
                label(tenant)
            )
        );
    }

    // A tenant alice is not given, and names that are not tenant names.
    let green = say_in(&server, alice, "hi", "shared", "green").await;
    assert_eq!(green.body["error"]["code"], json!(-32017), "{}", green.body);
    for bad in ["tasks", "a/b", "", ".hidden"] {
        let answer = call(
            &server,
            Some(alice),
            "SendMessage",
            send("hi", "shared", Some(bad)),
        )
        .await;
        match bad {
            // An empty tenant is the default tenant.
            "" => assert_eq!(
                answer.reply(),
                "echo: hi (turn 3; previously: \"default two\")"
            ),
            _ => assert_eq!(
                answer.body["error"]["code"],
                json!(-32602),
                "{bad}: {}",
                answer.body
            ),
        }
    }

    // HTTP+JSON under /red/ reaches the conversation JSON-RPC's `"tenant": "red"` does.
    let (status, sent) = send_in_red(&server, alice, "shared").await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(
        artifact_text(&sent["task"]),
        "echo: by rest (turn 3; previously: \"red two\")"
    );
    let task_id = sent["task"]["id"].as_str().expect("task id").to_owned();
    let in_red = json!({"id": task_id, "tenant": "red"});
    let got = call(&server, Some(alice), "GetTask", in_red).await;
    assert_eq!(got.body["result"]["id"], json!(task_id), "{}", got.body);
    let in_blue = json!({"id": task_id, "tenant": "blue"});
    let got = call(&server, Some(alice), "GetTask", in_blue).await;
    assert_eq!(got.body["error"]["code"], json!(-32001), "{}", got.body);
    // Each tenant lists its own tasks: red has three turns, blue two.
    for (tenant, count) in [("red", 3), ("blue", 2)] {
        let path = format!("/{tenant}/tasks");
        let (status, listed) = rest(&server, alice, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{listed}");
        let tasks = listed["tasks"].as_array().map(Vec::len);
        assert_eq!(tasks, Some(count), "{tenant}: {listed}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn a_task_is_reached_under_its_own_tenants_path_only() {
    let server = start_with_tenants().await;
    let alice = "alice-secret";
    let (status, sent) = send_in_red(&server, alice, "ctx").await;
    assert_eq!(status, 200, "{sent}");
    let task_id = sent["task"]["id"].as_str().expect("task id").to_owned();
    for (tenant, expected) in [("/red", 200), ("/blue", 404), ("", 404), ("/green", 403)] {
        let path = format!("{tenant}/tasks/{task_id}");
        let (status, got) = rest(&server, alice, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, expected, "GET {path}: {got}");
        if status == 200 {
            assert_eq!(got["id"], json!(task_id), "{got}");
        }
    }
    // The task is done: cancelling it under its tenant is refused as not cancelable (409),
    // under another tenant it is not found.
    for (tenant, expected) in [("/red", 409), ("/blue", 404)] {
        let path = format!("{tenant}/tasks/{task_id}:cancel");
        let (status, body) = rest(
            &server,
            alice,
            reqwest::Method::POST,
            &path,
            Some(json!({})),
        )
        .await;
        assert_eq!(status, expected, "POST {path}: {body}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn a_jwt_claim_can_grant_tenants() {
    let ed = IssuerKey::ed25519("ed-1");
    let jwks = Jwks::serve(&[&ed]).await;
    let server = start_with_jwt(&jwks, |_| {}).await;
    let listed = ed.sign(&claims_with("dana", json!({"tenants": ["red", "teal"]})));
    let spaced = ed.sign(&claims_with("dana", json!({"tenants": "teal blue"})));
    let none = ed.sign(&claims("dana"));

    let red = say_in(&server, &listed, "in red", "ctx", "red").await;
    assert_eq!(red.reply(), "echo: in red (turn 1)");
    let teal = say_in(&server, &spaced, "in teal", "ctx", "teal").await;
    assert_eq!(teal.reply(), "echo: in teal (turn 1)");
    // The tenant is the caller's whichever token granted it.
    let teal = say_in(&server, &listed, "teal again", "ctx", "teal").await;
    assert_eq!(
        teal.reply(),
        "echo: teal again (turn 2; previously: \"in teal\")"
    );
    for (token, tenant) in [(&listed, "blue"), (&none, "red"), (&spaced, "red")] {
        let answer = call(
            &server,
            Some(token),
            "SendMessage",
            send("hi", "ctx", Some(tenant)),
        )
        .await;
        assert_eq!(
            answer.body["error"]["code"],
            json!(-32017),
            "{tenant}: {}",
            answer.body
        );
    }
    let (status, body) = rest(
        &server,
        &none,
        reqwest::Method::POST,
        "/red/message:send",
        Some(json!({"message": user_message(V1, "hi", Some("ctx"), None)})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // Dana's default tenant holds nothing of the refused requests, nor of red and teal.
    assert!(conversations(&server, &none).await.is_empty());
    server.stop().await;
    jwks.stop().await;
}

fn token_line(principal: &str, token: &str) -> String {
    format!(
        "{principal}:{}\n",
        hex::encode(colloquy::http::token_digest(token))
    )
}

/// Waits (up to 10 s) until `token` is answered with `status`.
async fn until_status(server: &TestServer, token: &str, status: u16) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = call(server, Some(token), "colloquy/listConversations", json!({})).await;
        if answer.status == status {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{token}: still {}",
            answer.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn the_tokens_file_is_read_again_on_sighup_and_a_broken_one_keeps_the_tokens_in_use() {
    use tokio::signal::unix::{SignalKind, signal};
    let listener = signal(SignalKind::hangup()).expect("SIGHUP listener");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("tokens");
    std::fs::write(&file, token_line("carol", "carol-secret")).expect("tokens file");
    let server = start_echo_with(|c| {
        c.auth.tokens_file = Some(file.clone());
        c.auth.reload_check_secs = 0;
    })
    .await;
    assert_eq!(
        say(&server, "carol-secret", "hello", "c").await.reply(),
        "echo: hello (turn 1)"
    );
    assert_eq!(
        call(
            &server,
            Some("dave-secret"),
            "colloquy/listConversations",
            json!({})
        )
        .await
        .status,
        401
    );

    // Carol is taken out, Dave put in: after SIGHUP, only Dave's token works.
    std::fs::write(&file, token_line("dave", "dave-secret")).expect("tokens file");
    hang_up(&listener);
    until_status(&server, "carol-secret", 401)
        .await
        .assert_invalid_token("not valid");
    until_status(&server, "dave-secret", 200).await;

    // A file that does not parse is not taken: Dave's token keeps working, Carol's stays out.
    std::fs::write(&file, "dave has no hash\n").expect("tokens file");
    hang_up(&listener);
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        let dave = call(
            &server,
            Some("dave-secret"),
            "colloquy/listConversations",
            json!({}),
        )
        .await;
        assert_eq!(dave.status, 200, "the broken file was taken: {}", dave.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call(
        &server,
        Some("carol-secret"),
        "colloquy/listConversations",
        json!({}),
    )
    .await
    .assert_invalid_token("not valid");
    // And the next good file is taken.
    std::fs::write(&file, token_line("erin", "erin-secret")).expect("tokens file");
    hang_up(&listener);
    until_status(&server, "erin-secret", 200).await;
    until_status(&server, "dave-secret", 401).await;
    server.stop().await;
}
