//! The agent card: one card valid for both wire versions (or one, per `card.versions`).

use super::origin::base_url;
use super::state::AppState;
use crate::config::SkillConfig;
use crate::protocol::RpcError;
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The request headers [`base_url`] may read when no `public_url` is configured.
const URL_HEADERS: &str = "Host, Forwarded, X-Forwarded-Host, X-Forwarded-Proto";

/// The extended card (`GetExtendedAgentCard`), for callers already authenticated.
pub fn extended_card(state: &AppState, url: &str) -> Result<Value, RpcError> {
    let extended = &state.config.card.extended;
    if !extended.configured() {
        return Err(RpcError::ExtendedCardNotConfigured);
    }
    let mut card = unsigned_card(state, url);
    if let Some(description) = &extended.description {
        card.insert("description".into(), json!(description));
    }
    if let Some(Value::Array(skills)) = card.get_mut("skills") {
        skills.extend(extended.skills.iter().map(skill));
    }
    Ok(signed(state, card, url))
}

/// The card with its `signatures` when `card.signing_key_file` is set; the JWS header's `jku`
/// names the key set served beside it.
fn signed(state: &AppState, mut card: Map<String, Value>, url: &str) -> Value {
    if let Some(signer) = state.keys.card()
        && let Err(error) = signer.sign(&mut card, &jwks_url(url))
    {
        tracing::error!(%error, "the agent card is served unsigned");
    }
    Value::Object(card)
}

fn skill(config: &SkillConfig) -> Value {
    json!({"id": config.id, "name": config.name, "description": config.description, "tags": config.tags})
}

/// Where the gRPC binding is reached, if it is served: `grpc_public_url`, else the host the card
/// names with the gRPC port, as `host:port`: the target a gRPC client dials (the official SDKs'
/// channels and the TCK take it as it stands; an `http://` URL is not a gRPC target).
fn grpc_url(state: &AppState, url: &str) -> Option<String> {
    let port = state.grpc_addr?.port();
    if let Some(public) = &state.config.grpc_public_url {
        return Some(public.clone());
    }
    let card_url = reqwest::Url::parse(url).ok()?;
    Some(format!("{}:{port}", card_url.host_str()?))
}

/// The public card, signed if a key is configured.
pub fn card(state: &AppState, url: &str) -> Value {
    signed(state, unsigned_card(state, url), url)
}

fn unsigned_card(state: &AppState, url: &str) -> Map<String, Value> {
    let config = &state.config.card;
    let agent = state.engine.agent();
    let description = config
        .description
        .clone()
        .unwrap_or_else(|| agent.description());
    let has_extended = config.extended.configured();
    let skills: Vec<Value> = if config.skills.is_empty() {
        vec![json!({
            "id": agent.kind(),
            "name": agent.kind(),
            "description": agent.description(),
            "tags": ["conversation", "multi-turn"],
        })]
    } else {
        config.skills.iter().map(skill).collect()
    };
    let mut card = Map::new();
    card.insert("name".into(), json!(config.name));
    card.insert("description".into(), json!(description));
    card.insert("version".into(), json!(config.version));
    card.insert(
        "capabilities".into(),
        json!({
            "streaming": true,
            "pushNotifications": state.push.is_some(),
            "extensions": [push_signature_extension(url)],
            "extendedAgentCard": has_extended,
        }),
    );
    card.insert("defaultInputModes".into(), json!(["text/plain"]));
    card.insert("defaultOutputModes".into(), json!(["text/plain"]));
    card.insert("skills".into(), Value::Array(skills));
    // HTTP+JSON clients append the route (`/message:send`) to the interface's URL: a trailing
    // slash would make it `//message:send`.
    let http_json_url = url.trim_end_matches('/');
    if config.versions != "0.3" {
        let mut interfaces = vec![
            json!({"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}),
            json!({"url": http_json_url, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}),
        ];
        if let Some(grpc_url) = grpc_url(state, url) {
            interfaces.push(
                json!({"url": grpc_url, "protocolBinding": "GRPC", "protocolVersion": "1.0"}),
            );
        }
        if let Some(tenant) = &config.tenant {
            for interface in &mut interfaces {
                interface["tenant"] = json!(tenant);
            }
        }
        card.insert("supportedInterfaces".into(), Value::Array(interfaces));
    }
    if config.versions != "1.0" {
        card.insert("protocolVersion".into(), json!("0.3.0"));
        card.insert("url".into(), json!(url));
        card.insert("preferredTransport".into(), json!("JSONRPC"));
        // v0.3's HTTP+JSON routes sit under `/v1` of the same URL (its clients add the prefix).
        card.insert(
            "additionalInterfaces".into(),
            json!([
                {"url": url, "transport": "JSONRPC"},
                {"url": http_json_url, "transport": "HTTP+JSON"},
            ]),
        );
        card.insert(
            "supportsAuthenticatedExtendedCard".into(),
            json!(has_extended),
        );
    }
    if state.auth.enabled() {
        add_security(&mut card, &state.auth, config.versions == "1.0");
    }
    card
}

/// The schemes a caller may authenticate with, any one of them: static bearer tokens, and
/// JWTs from the OpenID Connect issuer (with the scopes they must hold). v1.0's card spells
/// each scheme as its kind's object and the requirements as `securityRequirements`; v0.3's
/// (and the card serving both) as `type`d objects and `security`.
fn add_security(card: &mut Map<String, Value>, auth: &crate::http::Auth, v1_only: bool) {
    let mut schemes = Map::new();
    let mut any_of = Vec::new();
    if auth.has_static_tokens() {
        let scheme = match v1_only {
            true => json!({"httpAuthSecurityScheme": {"scheme": "Bearer"}}),
            false => json!({"type": "http", "scheme": "bearer"}),
        };
        schemes.insert("bearer".into(), scheme);
        any_of.push(("bearer", Vec::new()));
    }
    if let Some(jwt) = auth.jwt() {
        let url = jwt.discovery_url();
        let scheme = match v1_only {
            true => json!({"openIdConnectSecurityScheme": {"openIdConnectUrl": url}}),
            false => json!({"type": "openIdConnect", "openIdConnectUrl": url}),
        };
        schemes.insert("oidc".into(), scheme);
        any_of.push(("oidc", jwt.required_scopes().to_vec()));
    }
    card.insert("securitySchemes".into(), Value::Object(schemes));
    let requirements: Vec<Value> = any_of
        .into_iter()
        .map(|(name, scopes)| match v1_only {
            true => json!({"schemes": {name: {"list": scopes}}}),
            false => json!({name: scopes}),
        })
        .collect();
    let field = if v1_only {
        "securityRequirements"
    } else {
        "security"
    };
    card.insert(field.into(), Value::Array(requirements));
}

/// The card, with `Cache-Control` and a strong `ETag` (over the bytes served); a request whose
/// `If-None-Match` holds that tag gets 304 with no body.
pub async fn agent_card(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let url = base_url(&state, &req);
    let body = card(&state, &url).to_string();
    let etag = format!(
        "\"{}\"",
        hex::encode(&Sha256::digest(body.as_bytes())[..16])
    );
    let cache_control = format!("max-age={}", state.config.card.max_age_secs);
    let not_modified = if_none_match_holds(&req, &etag);
    let mut response = HttpResponse::build(if not_modified {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    });
    response
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, cache_control));
    if state.config.public_url.is_none() {
        // The card's URL comes from these headers: a shared cache must key on them.
        response.insert_header((header::VARY, URL_HEADERS));
    }
    if not_modified {
        return response.finish();
    }
    response.content_type("application/json").body(body)
}

/// `If-None-Match` is `*` or lists `etag` (weak comparison, as RFC 9110 asks for this header).
fn if_none_match_holds(req: &HttpRequest, etag: &str) -> bool {
    req.headers()
        .get_all(header::IF_NONE_MATCH)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == etag)
}

/// The key set served beside the card at `url`: the keys push notifications and the card are
/// signed with.
fn jwks_url(url: &str) -> String {
    format!(
        "{}{}",
        url.trim_end_matches('/'),
        crate::push::sign::JWKS_PATH
    )
}

/// Where a receiver finds the keys push notifications are signed with (`docs/push.md`).
fn push_signature_extension(url: &str) -> Value {
    let jwks_url = jwks_url(url);
    json!({
        "uri": "urn:colloquy:push-signature:v1",
        "description": "Push notifications carry an ES256 JWT in the X-Colloquy-Signature header over the body's SHA-256; verify it with the keys at jwksUrl",
        // `required` is left at its default (false) by leaving it out: verifiers that
        // canonicalize the card after a protobuf round trip (the official SDKs) drop defaults,
        // and would then check a card other than the one signed.
        "params": {
            "jwksUrl": jwks_url,
            "header": crate::push::sign::SIGNATURE_HEADER,
            "alg": "ES256",
        },
    })
}
