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
        .header("X-Forwarded-Host", "agents.example")
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
