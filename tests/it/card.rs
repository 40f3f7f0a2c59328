//! The agent card's HTTP caching (Cache-Control, ETag, If-None-Match) and the extended card.

use crate::common::*;
use serde_json::Value;
use std::sync::Arc;

const CARD_PATHS: [&str; 2] = [".well-known/agent-card.json", ".well-known/agent.json"];

async fn get(server: &TestServer, path: &str, if_none_match: Option<&str>) -> reqwest::Response {
    let mut request = server.client.get(format!("{}{path}", server.url));
    if let Some(tag) = if_none_match {
        request = request.header("If-None-Match", tag);
    }
    request.send().await.unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

#[actix_rt::test]
async fn the_card_carries_cache_control_and_a_strong_etag_and_a_matching_tag_gets_304() {
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.card.max_age_secs = 120;
    })
    .await;
    for path in CARD_PATHS {
        let first = get(&server, path, None).await;
        assert_eq!(first.status(), 200);
        assert_eq!(header(&first, "cache-control"), "max-age=120");
        assert_eq!(
            header(&first, "vary"),
            "Host, Forwarded, X-Forwarded-Host, X-Forwarded-Proto",
            "the card's URL follows these headers"
        );
        let etag = header(&first, "etag");
        assert!(
            etag.starts_with('"') && etag.ends_with('"') && etag.len() > 10,
            "{etag}"
        );
        let body = first.bytes().await.unwrap();
        serde_json::from_slice::<Value>(&body).expect("a JSON card");

        let again = get(&server, path, None).await;
        assert_eq!(header(&again, "etag"), etag, "the same bytes, the same tag");

        for tag in [
            etag.clone(),
            format!("\"other\", {etag}"),
            format!("W/{etag}"),
            "*".into(),
        ] {
            let cached = get(&server, path, Some(&tag)).await;
            assert_eq!(cached.status(), 304, "{tag}");
            assert_eq!(header(&cached, "etag"), etag);
            assert_eq!(header(&cached, "cache-control"), "max-age=120");
            assert!(cached.bytes().await.unwrap().is_empty(), "304 has no body");
        }
        let stale = get(&server, path, Some("\"an-older-card\"")).await;
        assert_eq!(stale.status(), 200);
        assert_eq!(stale.bytes().await.unwrap(), body);
    }
    // Another card (here: another Host) is another tag.
    let elsewhere = server
        .client
        .get(format!("{}{}", server.url, CARD_PATHS[0]))
        .header("Host", "agents.example")
        .send()
        .await
        .unwrap();
    let first = get(&server, CARD_PATHS[0], None).await;
    assert_ne!(header(&elsewhere, "etag"), header(&first, "etag"));
    server.stop().await;
}

#[actix_rt::test]
async fn the_card_max_age_defaults_to_five_minutes() {
    let server = start_echo().await;
    let response = get(&server, CARD_PATHS[0], None).await;
    assert_eq!(header(&response, "cache-control"), "max-age=300");
    server.stop().await;
}

fn with_extended_card(config: &mut colloquy::config::Config) {
    config
        .auth
        .tokens
        .insert("alice".into(), "alice-secret".into());
    config.card.extended.description = Some("For members: the archive too".into());
    config
        .card
        .extended
        .skills
        .push(colloquy::config::SkillConfig {
            id: "archive".into(),
            name: "Archive search".into(),
            description: "Searches the members' archive".into(),
            tags: vec!["members".into()],
        });
}

async fn rpc_as(server: &TestServer, version: &str, method: &str, token: Option<&str>) -> Value {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}});
    let mut request = server
        .client
        .post(&server.url)
        .header("A2A-Version", version)
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().json().await.unwrap()
}

async fn rest_extended_card(server: &TestServer, token: Option<&str>) -> (u16, Value) {
    let mut request = server
        .client
        .get(format!("{}extendedAgentCard", server.url))
        .header("A2A-Version", "1.0");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn skill_ids(card: &Value) -> Vec<&str> {
    card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect()
}

#[actix_rt::test]
async fn an_authenticated_caller_gets_the_extended_card_on_every_binding_and_version() {
    let server = start_with(
        Arc::new(colloquy::agent::EchoAgent::default()),
        with_extended_card,
    )
    .await;
    let public = server.card(&[]).await;
    assert_eq!(public["capabilities"]["extendedAgentCard"], true);
    assert_eq!(public["supportsAuthenticatedExtendedCard"], true);
    assert_v03_valid("AgentCard", &public);
    assert!(!skill_ids(&public).contains(&"archive"), "{public}");
    assert_ne!(public["description"], "For members: the archive too");

    let by_v1 = rpc_as(&server, V1, "GetExtendedAgentCard", Some("alice-secret")).await;
    let by_v03 = rpc_as(
        &server,
        V03,
        "agent/getAuthenticatedExtendedCard",
        Some("alice-secret"),
    )
    .await;
    let (status, by_rest) = rest_extended_card(&server, Some("alice-secret")).await;
    assert_eq!(status, 200, "{by_rest}");
    for extended in [&by_v1["result"], &by_v03["result"], &by_rest] {
        assert_eq!(extended["description"], "For members: the archive too");
        assert_eq!(skill_ids(extended).last(), Some(&"archive"), "{extended}");
        assert_eq!(extended["skills"].as_array().unwrap().len(), 2);
        assert_eq!(extended["name"], public["name"]);
        assert_eq!(extended["capabilities"]["extendedAgentCard"], true);
    }
    assert_v03_valid("AgentCard", &by_v03["result"]);

    // Without a token (or with a wrong one): the auth error, not the card.
    for token in [None, Some("wrong")] {
        let refused = rpc_as(&server, V1, "GetExtendedAgentCard", token).await;
        assert!(refused.get("result").is_none(), "{refused}");
        assert!(refused["error"]["code"].is_i64(), "{refused}");
        let (status, body) = rest_extended_card(&server, token).await;
        assert_eq!(status, 401, "{body}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn without_an_extended_card_the_public_card_says_so_and_the_methods_answer_32007() {
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
    })
    .await;
    let public = server.card(&[]).await;
    assert_eq!(public["capabilities"]["extendedAgentCard"], false);
    assert_eq!(public["supportsAuthenticatedExtendedCard"], false);
    let token = Some("alice-secret");
    for (version, method) in [
        (V1, "GetExtendedAgentCard"),
        (V03, "agent/getAuthenticatedExtendedCard"),
    ] {
        let answer = rpc_as(&server, version, method, token).await;
        assert_eq!(answer["error"]["code"], -32007, "{answer}");
    }
    let (status, body) = rest_extended_card(&server, token).await;
    assert_ne!(status, 200, "{body}");
    server.stop().await;
}

/// v0.3's HTTP+JSON `GET /v1/card` is its authenticated extended card, as v0.3's `AgentCard`
/// message: no v1.0 fields, security in the message form.
#[actix_rt::test]
async fn v03_rest_card_is_the_extended_card_in_v03_message_form() {
    let server = start_with(
        Arc::new(colloquy::agent::EchoAgent::default()),
        with_extended_card,
    )
    .await;
    let url = format!("{}v1/card", server.url);
    let refused = server.client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let response = server
        .client
        .get(&url)
        .bearer_auth("alice-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let card: Value = response.json().await.unwrap();
    assert_eq!(card["description"], "For members: the archive too");
    assert_eq!(skill_ids(&card).last(), Some(&"archive"));
    assert!(card.get("supportedInterfaces").is_none(), "{card}");
    assert!(card["capabilities"].get("extendedAgentCard").is_none());
    assert_eq!(card["supportsAuthenticatedExtendedCard"], true);
    assert_eq!(
        card["securitySchemes"]["bearer"],
        serde_json::json!({"httpAuthSecurityScheme": {"scheme": "bearer"}})
    );
    assert_eq!(
        card["security"],
        serde_json::json!([{"schemes": {"bearer": {"list": []}}}])
    );
    let public = server.card(&[]).await;
    let transports: Vec<&str> = public["additionalInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["transport"].as_str().unwrap())
        .collect();
    assert_eq!(transports, ["JSONRPC", "HTTP+JSON"]);
    server.stop().await;
}

/// The card's interface URLs, for a request with `headers`.
async fn card_url(server: &TestServer, headers: &[(&str, &str)]) -> String {
    let card = server.card(headers).await;
    card["supportedInterfaces"][0]["url"]
        .as_str()
        .expect("an interface URL")
        .to_owned()
}

#[actix_rt::test]
async fn forwarding_headers_count_only_from_trusted_proxies_and_only_when_sane() {
    let forged = [
        ("X-Forwarded-Proto", "javascript"),
        ("X-Forwarded-Host", "evil.example"),
    ];
    let direct = start_echo().await;
    let own = format!("http://{}/", direct.server.addr);
    assert_eq!(card_url(&direct, &forged).await, own, "no proxy is trusted");
    assert_eq!(
        card_url(&direct, &[("Forwarded", "proto=https;host=evil.example")]).await,
        own
    );
    assert_eq!(
        card_url(&direct, &[("Host", "agents.example:8443")]).await,
        "http://agents.example:8443/",
        "the request's own Host still names the server"
    );
    assert_eq!(
        card_url(&direct, &[("Host", "evil@agents.example")]).await,
        own,
        "a Host that is not an authority is not reflected"
    );
    direct.stop().await;

    let proxied = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.trusted_proxies = vec!["127.0.0.0/8".into()];
    })
    .await;
    assert_eq!(
        card_url(
            &proxied,
            &[
                ("X-Forwarded-Proto", "https"),
                ("X-Forwarded-Host", "agents.example")
            ]
        )
        .await,
        "https://agents.example/"
    );
    let checked = card_url(&proxied, &forged).await;
    assert_eq!(
        checked, "http://evil.example/",
        "a trusted proxy's host is taken, its scheme only if http or https"
    );
    assert_eq!(
        card_url(&proxied, &[("X-Forwarded-Host", "a b/c")]).await,
        format!("http://{}/", proxied.server.addr),
        "a host that is not an authority is ignored"
    );
    // Only the last value counts: the one the proxy added after whatever the client sent.
    assert_eq!(
        card_url(
            &proxied,
            &[("X-Forwarded-Host", "evil.example, agents.example")]
        )
        .await,
        "http://agents.example/"
    );
    assert_eq!(
        card_url(
            &proxied,
            &[(
                "Forwarded",
                "host=evil.example;proto=http, host=\"agents.example\";proto=https"
            )]
        )
        .await,
        "https://agents.example/"
    );
    proxied.stop().await;
}

#[test]
fn trusted_proxies_must_be_addresses_or_ranges() {
    let mut config = colloquy::config::Config {
        trusted_proxies: vec!["10.0.0.0/8".into(), "192.0.2.7".into(), "::1".into()],
        ..Default::default()
    };
    assert_eq!(config.trusted_proxies().expect("valid").len(), 3);
    config.trusted_proxies = vec!["proxy.internal".into()];
    let error = config
        .trusted_proxies()
        .expect_err("a name is not an address");
    assert!(error.to_string().contains("proxy.internal"), "{error}");
}
