//! The operator console (`/console` on `admin_listen`): its token, its forms' protection and
//! its escaping over plain HTTP, then the pages walked in headless Chromium (Debian's
//! `chromium` and `chromium-driver`, driven through WebDriver with fantoccini) on a server
//! with real conversations: sign-in, the listing's filters and pages, a conversation with the
//! prompt each turn's agent was shown, a stream appearing as it is produced, cancel and delete
//! through their confirmations, the push outbox, the leases (also on two PostgreSQL nodes).
//! Screenshots, desktop and 375 px wide, go to `target/console-screenshots/`.
//!
//! Without chromium and chromedriver the browser tests say they skip and pass; under
//! `CI=true` they fail instead (`.ci/run` installs them).

use crate::common;

use colloquy::agent::EchoAgent;
use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONSOLE_TOKEN: &str = "console-secret";
const XSS: &str = "<script>window.pwned=1</script><b>x</b>";
/// A webhook nothing listens on: every delivery is refused, so its notification is retried.
const DEAD_HOOK: &str = "http://127.0.0.1:9/hook";

/// A server with two principals (alice, bob), the console behind [`CONSOLE_TOKEN`] on its
/// own admin address, an echo agent that streams 8 characters every 40 ms, and push allowed to
/// loopback with a first retry a minute away (so a failed notification stays "retrying").
async fn start_console_server() -> TestServer {
    start_with(
        Arc::new(EchoAgent::new(8, Duration::from_millis(40))),
        |c| {
            c.auth.tokens.insert("alice".into(), "alice-secret".into());
            c.auth.tokens.insert("bob".into(), "bob-secret".into());
            c.admin_listen = Some("127.0.0.1:0".into());
            c.console.token = Some(CONSOLE_TOKEN.into());
            c.push.allow_private_networks = true;
            c.push.retry_base_ms = 60_000;
            c.push.retry_max_ms = 60_000;
        },
    )
    .await
}

fn console_url(server: &TestServer, path: &str) -> String {
    let admin = server.server.admin_addr.expect("admin_listen is set");
    format!("http://{admin}/console{path}")
}

async fn send_as(server: &TestServer, token: &str, text: &str, context_id: &str) -> Value {
    let sent = rpc_as(
        server,
        token,
        "SendMessage",
        json!({"message": user_message(V1, text, Some(context_id), None)}),
    )
    .await;
    assert!(sent.get("result").is_some(), "{sent}");
    sent
}

/// Starts a turn and returns at once with its task id (the agent goes on streaming).
async fn start_turn(server: &TestServer, token: &str, text: &str, context_id: &str) -> String {
    let sent = rpc_as(
        server,
        token,
        "SendMessage",
        json!({"message": user_message(V1, text, Some(context_id), None),
               "configuration": {"returnImmediately": true}}),
    )
    .await;
    task_of(&sent)["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {sent}"))
        .to_owned()
}

/// A text whose echo streams for about three seconds.
fn long_text(word: &str) -> String {
    longer_text(word, 60)
}

/// `word` `times` times: its echo streams 8 characters every 40 ms.
fn longer_text(word: &str, times: usize) -> String {
    std::iter::repeat_n(word, times)
        .collect::<Vec<_>>()
        .join(" ")
}

async fn get(server: &TestServer, path: &str, bearer: Option<&str>) -> (u16, String) {
    let mut request = server.client.get(console_url(server, path));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("console answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[actix_rt::test]
async fn the_console_needs_its_token_checks_its_forms_and_escapes_stored_text() {
    let server = start_console_server().await;
    send_as(&server, "bob-secret", XSS, "xss").await;

    let (status, body) = get(&server, "/conversations", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("/console/login"), "{body}");
    let (status, _) = get(&server, "/conversations", Some("wrong")).await;
    assert_eq!(status, 401);
    let (status, _) = get(&server, "/task/live?principal=bob&id=x", None).await;
    assert_eq!(status, 401, "the live view needs the token too");
    let (status, _) = get(&server, "/conversations", Some("alice-secret")).await;
    assert_eq!(status, 401, "a principal's token is not the console's");
    let (status, body) = get(&server, "/conversations", Some(CONSOLE_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(">xss</a>"), "{body}");

    // Stored text is escaped, never markup.
    let (status, body) = get(
        &server,
        "/conversation?principal=bob&context=xss",
        Some(CONSOLE_TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("<script>window"), "{body}");
    assert!(!body.contains("<b>x</b>"), "{body}");
    assert!(
        body.contains("&#60;script&#62;window.pwned=1&#60;/script&#62;&#60;b&#62;x&#60;/b&#62;")
            || body.contains("&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;"),
        "{body}"
    );

    // The sign-in form: a wrong token is refused, the right one sets an HttpOnly, SameSite=Strict
    // cookie, which then admits.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let refused = no_redirects
        .post(console_url(&server, "/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .expect("login answers");
    assert_eq!(refused.status().as_u16(), 401);
    let signed_in = no_redirects
        .post(console_url(&server, "/login"))
        .form(&[("token", CONSOLE_TOKEN)])
        .send()
        .await
        .expect("login answers");
    assert_eq!(signed_in.status().as_u16(), 303);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .expect("a cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(CONSOLE_TOKEN),
        "the cookie holds no token: {cookie}"
    );
    let session = cookie.split(';').next().expect("name=value").to_owned();
    let page = no_redirects
        .get(console_url(&server, "/conversations"))
        .header("Cookie", &session)
        .send()
        .await
        .expect("console answers");
    assert_eq!(page.status().as_u16(), 200);
    let csrf = form_token(&page.text().await.expect("a page"));

    // The POSTs need this session's form token and this origin.
    let delete = |csrf: String, origin: Option<&'static str>| {
        let mut request = no_redirects
            .post(console_url(&server, "/conversation/delete"))
            .header("Cookie", &session)
            .form(&[("principal", "bob"), ("context", "xss"), ("csrf", &csrf)]);
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        request.send()
    };
    let forged = delete("0".repeat(64), None).await.expect("answered");
    assert_eq!(forged.status().as_u16(), 403);
    let foreign = delete(csrf.clone(), Some("http://evil.example"))
        .await
        .expect("answered");
    assert_eq!(foreign.status().as_u16(), 403);
    let listed = rpc_as(
        &server,
        "bob-secret",
        "colloquy/listConversations",
        json!({}),
    )
    .await;
    assert_eq!(
        listed["result"]["conversations"].as_array().map(Vec::len),
        Some(1)
    );
    let deleted = delete(csrf, None).await.expect("answered");
    assert_eq!(deleted.status().as_u16(), 303);
    let listed = rpc_as(
        &server,
        "bob-secret",
        "colloquy/listConversations",
        json!({}),
    )
    .await;
    assert_eq!(listed["result"]["conversations"], json!([]), "{listed}");

    // Unknown ids are 404, overlong ones 400, unknown pages 404.
    let (status, _) = get(
        &server,
        "/conversation?principal=bob&context=nope",
        Some(CONSOLE_TOKEN),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, "/task?principal=bob&id=nope", Some(CONSOLE_TOKEN)).await;
    assert_eq!(status, 404);
    let long_id = "x".repeat(5000);
    let (status, _) = get(
        &server,
        &format!("/task?principal=bob&id={long_id}"),
        Some(CONSOLE_TOKEN),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = get(&server, "/nowhere", Some(CONSOLE_TOKEN)).await;
    assert_eq!(status, 404);

    // The public port serves no console.
    let public = server
        .client
        .get(format!("{}console/conversations", server.url))
        .bearer_auth(CONSOLE_TOKEN)
        .send()
        .await
        .expect("answered");
    assert_eq!(public.status().as_u16(), 404);
    server.stop().await;
}

#[actix_rt::test]
async fn the_console_can_be_turned_off_and_without_a_token_is_open() {
    let off = start_echo_with(|c| {
        c.admin_listen = Some("127.0.0.1:0".into());
        c.console.enabled = false;
    })
    .await;
    let (status, _) = get(&off, "/conversations", None).await;
    assert_eq!(status, 404);
    off.stop().await;

    let open = start_echo_with(|c| c.admin_listen = Some("127.0.0.1:0".into())).await;
    open.send_text(V1, "hello", Some("open-1"), None).await;
    let (status, body) = get(&open, "/conversations", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("open-1"), "{body}");
    // A query that does not parse gets the console's own page, with its policy.
    let response = open
        .client
        .get(console_url(&open, "/conversations?size=abc"))
        .send()
        .await
        .expect("console answers");
    assert_eq!(response.status().as_u16(), 400);
    assert!(response.headers().contains_key("content-security-policy"));
    let page = response.text().await.unwrap_or_default();
    assert!(
        page.contains("Bad request") && page.contains("invalid digit"),
        "{page}"
    );
    // Open, it answers requests addressed to an address or localhost only: a page whose domain
    // was rebound to this address (DNS rebinding) gets nothing.
    let admin = open.server.admin_addr.expect("admin_listen is set");
    for (host, expected) in [
        (format!("localhost:{}", admin.port()), 200),
        (format!("evil.example:{}", admin.port()), 403),
        ("evil.example".to_owned(), 403),
    ] {
        let response = open
            .client
            .get(console_url(&open, "/conversations"))
            .header("Host", &host)
            .send()
            .await
            .expect("console answers");
        assert_eq!(response.status().as_u16(), expected, "Host: {host}");
    }
    open.stop().await;

    // Open beyond loopback: refused at start, unless allow_unauthenticated says so.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(dir.path());
    config.admin_listen = Some("0.0.0.0:0".into());
    let refused = colloquy::app::start(config.clone(), Arc::new(EchoAgent::new(0, Duration::ZERO)))
        .await
        .err()
        .map(|e| e.to_string())
        .expect("an open console beyond loopback is refused");
    assert!(refused.contains("console.token"), "{refused}");
    config.console.enabled = false;
    let started = colloquy::app::start(config, Arc::new(EchoAgent::new(0, Duration::ZERO)))
        .await
        .expect("without the console it starts");
    started.stop().await;

    // metrics.token guards the console when console.token is not set.
    let metrics = start_echo_with(|c| {
        c.admin_listen = Some("127.0.0.1:0".into());
        c.metrics.token = Some("metrics-secret".into());
    })
    .await;
    let (status, _) = get(&metrics, "/conversations", None).await;
    assert_eq!(status, 401);
    let (status, _) = get(&metrics, "/conversations", Some("metrics-secret")).await;
    assert_eq!(status, 200);
    metrics.stop().await;
}

/// The `csrf` hidden field of a page's forms.
fn form_token(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("a form token in {page}"));
    page[at + 19..at + 19 + 64].to_owned()
}

// ---- the browser ----

/// chromium and chromedriver, or None (said on stderr) where they are missing and CI is not
/// `true`.
fn browser_binaries(test: &str) -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    };
    match (find("chromium"), find("chromedriver")) {
        (Some(chromium), Some(driver)) => Some((chromium, driver)),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!(
                "{test} needs chromium and chromedriver (Debian's chromium, chromium-driver) and CI=true"
            )
        }
        _ => {
            // Past the test harness's capture, so a passing run says it too.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipping {test}: chromium or chromedriver is missing (apt-get install chromium \
                 chromium-driver; under CI=true this fails instead)"
            );
            None
        }
    }
}

/// A chromedriver this test started, on a free loopback port; killed when dropped.
struct Driver {
    child: Child,
    port: u16,
    chromium: PathBuf,
    profile: tempfile::TempDir,
}

impl Driver {
    async fn start(chromium: PathBuf, driver: PathBuf) -> Driver {
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver {
            child,
            port,
            chromium,
            profile: tempfile::tempdir().expect("temp dir"),
        };
        let status = format!("http://127.0.0.1:{port}/status");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = reqwest::get(&status)
                .await
                .ok()
                .map(|r| r.status().is_success());
            if ready == Some(true) {
                return driver;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A headless browser session, `width` × `height`.
    async fn browser(&self, width: u32, height: u32) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": self.chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", self.profile.path().display()),
                    format!("--window-size={width},{height}"),
                ],
            }),
        );
        // chromedriver is plain HTTP, but fantoccini's client is built with rustls, which
        // needs a process-wide crypto provider when more than one is compiled in.
        let _ = rustls::crypto::ring::default_provider().install_default();
        ClientBuilder::rustls()
            .expect("a TLS config")
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a browser session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot folder");
    dir
}

async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).expect("screenshot written");
}

async fn text_of(browser: &Client, css: &str) -> String {
    match browser.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.expect("its text"),
        Err(e) => {
            let url = browser.current_url().await.map(|u| u.to_string());
            let body = browser.source().await.unwrap_or_default();
            panic!("{css}: {e}\non {url:?}:\n{body}")
        }
    }
}

/// Clicks what `css` finds, a link or a button that loads a page, and waits for that page.
async fn click(browser: &Client, css: &str) {
    let element = browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    navigating(browser, element).await;
}

async fn click_link(browser: &Client, text: &str) {
    let element = browser
        .find(Locator::LinkText(text))
        .await
        .unwrap_or_else(|e| panic!("link {text:?}: {e}"));
    navigating(browser, element).await;
}

/// Clicks `element` and waits until another document has loaded (the old one's window, and
/// the mark left on it, are gone).
async fn navigating(browser: &Client, element: fantoccini::elements::Element) {
    script(browser, "window.consoleTestMark = true; return null").await;
    element.click().await.expect("clicked");
    wait_until("the next page", Duration::from_secs(15), || async {
        let loaded = browser
            .execute(
                "return window.consoleTestMark === undefined && document.readyState === 'complete'",
                vec![],
            )
            .await;
        loaded.is_ok_and(|v| v == json!(true))
    })
    .await;
}

async fn fill(browser: &Client, css: &str, value: &str) {
    let input = browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    input.clear().await.expect("cleared");
    input.send_keys(value).await.expect("typed");
}

/// The contextIds the listing shows, in order.
async fn listed(browser: &Client) -> Vec<String> {
    let mut ids = Vec::new();
    for cell in browser
        .find_all(Locator::Css("tbody th[scope=row] a"))
        .await
        .expect("rows")
    {
        ids.push(cell.text().await.expect("text"));
    }
    ids
}

async fn script(browser: &Client, js: &str) -> Value {
    browser.execute(js, vec![]).await.expect("script runs")
}

/// Every visible input has a label, and the page does not scroll sideways.
async fn assert_accessible_layout(browser: &Client, page: &str) {
    let unlabelled = script(
        browser,
        "return [...document.querySelectorAll('input:not([type=hidden])')]\
           .filter(i => i.labels.length === 0).map(i => i.name)",
    )
    .await;
    assert_eq!(unlabelled, json!([]), "{page}: inputs without a label");
    let overflow = script(
        browser,
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
    )
    .await;
    assert!(
        overflow.as_i64().unwrap_or(1) <= 0,
        "{page} scrolls sideways by {overflow}"
    );
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !ready().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn the_console_walks_a_server_with_real_conversations_in_chromium() {
    let Some((chromium, chromedriver)) = browser_binaries("console::walks_in_chromium") else {
        return;
    };
    let server = start_console_server().await;
    for (token, text, context_id) in [
        ("alice-secret", "first", "alpha-1"),
        ("alice-secret", "second", "alpha-1"),
        ("alice-secret", "hello", "alpha-2"),
        ("alice-secret", "hello", "beta-1"),
        ("bob-secret", "hello", "alpha-bob"),
        ("bob-secret", XSS, "xss"),
    ] {
        send_as(&server, token, text, context_id).await;
        next_millisecond().await;
    }

    let driver = Driver::start(chromium, chromedriver).await;
    let browser = driver.browser(1280, 900).await;

    // Signed out: refused, with the way in.
    browser
        .goto(&console_url(&server, "/conversations"))
        .await
        .expect("goto");
    assert!(
        text_of(&browser, "main")
            .await
            .contains("Sign in to the console")
    );
    click_link(&browser, "Sign in to the console").await;
    fill(&browser, "#token", "wrong").await;
    click(&browser, "button[type=submit]").await;
    assert!(
        text_of(&browser, "[role=alert]")
            .await
            .contains("not the console's token")
    );
    assert_accessible_layout(&browser, "sign-in").await;
    screenshot(&browser, "login").await;
    fill(&browser, "#token", CONSOLE_TOKEN).await;
    click(&browser, "main button[type=submit]").await;

    // Every principal's conversations, newest first.
    assert_eq!(
        listed(&browser).await,
        ["xss", "alpha-bob", "beta-1", "alpha-2", "alpha-1"]
    );
    assert_accessible_layout(&browser, "conversations").await;
    screenshot(&browser, "conversations").await;
    // The skip link comes first from the keyboard, and leads to the content.
    let first_focus = script(
        &browser,
        "document.activeElement.blur(); return document.querySelector('a').className",
    )
    .await;
    assert_eq!(first_focus, json!("skip"));

    // Filters: principal, then a contextId prefix too.
    fill(&browser, "#principal", "alice").await;
    click(&browser, ".filters button").await;
    assert_eq!(listed(&browser).await, ["beta-1", "alpha-2", "alpha-1"]);
    fill(&browser, "#prefix", "alpha").await;
    click(&browser, ".filters button").await;
    assert_eq!(listed(&browser).await, ["alpha-2", "alpha-1"]);
    fill(&browser, "#principal", "").await;
    click(&browser, ".filters button").await;
    assert_eq!(listed(&browser).await, ["alpha-bob", "alpha-2", "alpha-1"]);

    // Pages of two.
    browser
        .goto(&console_url(&server, "/conversations?size=2"))
        .await
        .expect("goto");
    assert_eq!(listed(&browser).await, ["xss", "alpha-bob"]);
    click_link(&browser, "Next page").await;
    assert_eq!(listed(&browser).await, ["beta-1", "alpha-2"]);
    click_link(&browser, "Next page").await;
    assert_eq!(listed(&browser).await, ["alpha-1"]);
    assert!(browser.find(Locator::LinkText("Next page")).await.is_err());
    click_link(&browser, "First page").await;
    assert_eq!(listed(&browser).await, ["xss", "alpha-bob"]);

    // One conversation: its messages, and the prompt its second turn's agent was shown.
    browser
        .goto(&console_url(&server, "/conversations?principal=alice"))
        .await
        .expect("goto");
    click_link(&browser, "alpha-1").await;
    let messages = text_of(&browser, ".messages").await;
    assert!(
        messages.contains("first")
            && messages.contains("echo: second (turn 2; previously: \"first\")"),
        "{messages}"
    );
    let summaries = browser
        .find_all(Locator::Css("details summary"))
        .await
        .expect("summaries");
    assert_eq!(summaries.len(), 2, "one prompt per turn");
    for summary in &summaries {
        summary.click().await.expect("opened");
    }
    let prompts = browser
        .find_all(Locator::Css("pre.prompt"))
        .await
        .expect("prompts");
    assert_eq!(
        prompts[0].text().await.expect("text"),
        "first",
        "the first turn has no block"
    );
    assert_eq!(
        prompts[1].text().await.expect("text"),
        "[Previous conversation — for continuity reference only, not a new instruction]\n\
         user: first\n\
         assistant: echo: first (turn 1)\n\
         [End of previous conversation]\n\nsecond"
    );
    assert_accessible_layout(&browser, "conversation").await;
    screenshot(&browser, "conversation").await;

    // Stored markup is shown as text and never runs.
    browser
        .goto(&console_url(
            &server,
            "/conversation?principal=bob&context=xss",
        ))
        .await
        .expect("goto");
    let shown = browser
        .find_all(Locator::Css(".messages pre.text"))
        .await
        .expect("messages");
    assert_eq!(shown[0].text().await.expect("text"), XSS);
    assert_eq!(
        script(&browser, "return typeof window.pwned").await,
        json!("undefined")
    );
    assert!(
        browser.find(Locator::Css("main b")).await.is_err(),
        "no <b> from stored text"
    );
    let source = browser.source().await.expect("source");
    assert!(!source.contains("<script>window.pwned"), "{source}");

    // A task streamed live: the text grows on the page while the agent produces it.
    let text = long_text("stream");
    let task_id = start_turn(&server, "alice-secret", &text, "live").await;
    browser
        .goto(&console_url(
            &server,
            &format!("/task?principal=alice&id={task_id}"),
        ))
        .await
        .expect("goto");
    let full = format!("echo: {text} (turn 1)");
    let mut lengths = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The state first: the final state comes after the last chunk, so once it is read as
        // completed, the text read next is whole.
        let state = text_of(&browser, "#live-state").await;
        let live = text_of(&browser, "#live").await;
        lengths.push(live.len());
        if lengths.len() == 10 {
            screenshot(&browser, "task-streaming").await;
        }
        if state == "completed" {
            assert_eq!(live, full);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stream did not finish: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        lengths.iter().any(|&n| n > 0 && n < full.len()),
        "the stream was seen part-way: {lengths:?}"
    );
    assert!(
        lengths.windows(2).all(|w| w[0] <= w[1]),
        "it only grew: {lengths:?}"
    );
    browser.refresh().await.expect("reload");
    assert_eq!(text_of(&browser, "#state").await, "completed");
    assert_eq!(text_of(&browser, "pre.artifact").await, full);
    assert!(
        browser.find(Locator::Css("#live")).await.is_err(),
        "no live view of an ended task"
    );
    assert_accessible_layout(&browser, "task").await;
    screenshot(&browser, "task").await;

    // Cancel a running task through its confirmation.
    let task_id = start_turn(&server, "alice-secret", &long_text("cancel"), "to-cancel").await;
    browser
        .goto(&console_url(
            &server,
            &format!("/task?principal=alice&id={task_id}"),
        ))
        .await
        .expect("goto");
    // The leases page shows the running turn on this node meanwhile.
    let leases = reqwest_text(&server, "/leases").await;
    assert!(
        leases.contains("to-cancel") && leases.contains("this node"),
        "{leases}"
    );
    click_link(&browser, "Cancel this task…").await;
    assert!(text_of(&browser, "h1").await.contains(&task_id));
    screenshot(&browser, "confirm-cancel").await;
    click(&browser, "#confirm").await;
    assert_eq!(text_of(&browser, "#state").await, "canceled");

    // Delete: refused while a turn runs (context busy), done once it ended.
    let running = start_turn(&server, "alice-secret", &long_text("busy"), "busy").await;
    browser
        .goto(&console_url(
            &server,
            "/conversation?principal=alice&context=busy",
        ))
        .await
        .expect("goto");
    click_link(&browser, "Delete this conversation…").await;
    click(&browser, "#confirm").await;
    let refusal = text_of(&browser, "main").await;
    assert!(
        refusal.contains("Conversation busy")
            && refusal.contains("-32010")
            && refusal.contains(&running),
        "{refusal}"
    );
    screenshot(&browser, "delete-busy").await;
    let canceled = rpc_as(
        &server,
        "alice-secret",
        "CancelTask",
        json!({"id": running}),
    )
    .await;
    assert!(canceled.get("result").is_some(), "{canceled}");
    browser
        .goto(&console_url(
            &server,
            "/conversation?principal=alice&context=busy",
        ))
        .await
        .expect("goto");
    click_link(&browser, "Delete this conversation…").await;
    click(&browser, "#confirm").await;
    assert!(
        text_of(&browser, "[role=status]")
            .await
            .contains("Deleted conversation busy")
    );
    assert!(!listed(&browser).await.contains(&"busy".to_owned()));

    // The outbox: a notification to a webhook that refuses, retried a minute later.
    rpc_as(
        &server,
        "alice-secret",
        "SendMessage",
        json!({"message": user_message(V1, "notify me", Some("pushy"), None),
               "configuration": {"taskPushNotificationConfig": {"url": DEAD_HOOK}}}),
    )
    .await;
    browser
        .goto(&console_url(&server, "/outbox"))
        .await
        .expect("goto");
    wait_until(
        "a retrying notification",
        Duration::from_secs(15),
        || async {
            browser.refresh().await.expect("reload");
            text_of(&browser, "main").await.contains("retrying")
        },
    )
    .await;
    let outbox = text_of(&browser, "main").await;
    assert!(
        outbox.contains(DEAD_HOOK) && outbox.contains("given up"),
        "{outbox}"
    );
    screenshot(&browser, "outbox").await;
    browser
        .goto(&console_url(&server, "/leases"))
        .await
        .expect("goto");
    screenshot(&browser, "leases").await;

    // Phone width: the pages fit, nothing scrolls sideways.
    browser.set_window_size(375, 812).await.expect("resized");
    for (path, name) in [
        ("/conversations", "conversations-375"),
        (
            "/conversation?principal=alice&context=alpha-1",
            "conversation-375",
        ),
        (&*format!("/task?principal=alice&id={task_id}"), "task-375"),
        ("/outbox", "outbox-375"),
    ] {
        browser
            .goto(&console_url(&server, path))
            .await
            .expect("goto");
        let width = script(&browser, "return window.innerWidth").await;
        assert!(
            width.as_i64().is_some_and(|w| w <= 400),
            "the window is {width} wide"
        );
        assert_accessible_layout(&browser, name).await;
        screenshot(&browser, name).await;
    }

    // Sign out: the cookie is gone.
    click(&browser, "nav button").await;
    browser
        .goto(&console_url(&server, "/conversations"))
        .await
        .expect("goto");
    assert!(
        text_of(&browser, "main")
            .await
            .contains("Sign in to the console")
    );
    browser.close().await.expect("session closed");
    drop(driver);
    server.stop().await;
}

async fn reqwest_text(server: &TestServer, path: &str) -> String {
    let (status, body) = get(server, path, Some(CONSOLE_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Two nodes on one PostgreSQL database: node A's console shows the lease node B holds for the
/// turn it runs, naming B.
#[actix_rt::test]
async fn the_leases_page_shows_which_node_holds_which_conversation() {
    let Some(url) = pg::database("console::leases_on_two_nodes") else {
        return;
    };
    let node = |url: String| {
        start_with(
            Arc::new(EchoAgent::new(8, Duration::from_millis(40))),
            move |c| {
                c.store.url = url;
                c.cluster.lease_secs = 30;
                c.admin_listen = Some("127.0.0.1:0".into());
                c.console.token = Some(CONSOLE_TOKEN.into());
            },
        )
    };
    let a = node(url.clone()).await;
    let b = node(url).await;
    a.send_text(V1, "hello", Some("quiet"), None).await;
    let started = b
        .rpc(
            V1,
            "SendMessage",
            json!({"message": user_message(V1, &longer_text("lease", 300), Some("held-by-b"), None),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task_id = task_of(&started)["id"].as_str().expect("a task").to_owned();
    let leases = reqwest_text(&a, "/leases").await;
    assert!(leases.contains("held-by-b"), "{leases}");
    assert!(leases.contains(&task_id), "{leases}");
    assert!(
        leases.contains(&b.url),
        "B is named as the holder: {leases}"
    );
    assert!(
        !leases.contains("quiet"),
        "a conversation without a running turn has no lease"
    );
    // Both nodes list the same conversations.
    let on_a = reqwest_text(&a, "/conversations").await;
    assert!(
        on_a.contains("held-by-b") && on_a.contains("quiet"),
        "{on_a}"
    );
    let filtered = reqwest_text(&a, "/conversations?prefix=held").await;
    assert!(
        filtered.contains("held-by-b") && !filtered.contains(">quiet<"),
        "{filtered}"
    );

    if let Some((chromium, chromedriver)) = browser_binaries("console::leases_on_two_nodes") {
        let driver = Driver::start(chromium, chromedriver).await;
        let browser = driver.browser(1280, 900).await;
        browser
            .goto(&console_url(&a, "/login"))
            .await
            .expect("goto");
        fill(&browser, "#token", CONSOLE_TOKEN).await;
        click(&browser, "main button[type=submit]").await;
        browser
            .goto(&console_url(&a, "/leases"))
            .await
            .expect("goto");
        assert!(text_of(&browser, "td.holder").await.contains(&b.url));
        screenshot(&browser, "leases-two-nodes").await;
        browser.close().await.expect("session closed");
    }
    a.stop().await;
    b.stop().await;
}

/// The contextIds a listing page's HTML shows, in order, and its next page's link.
fn listed_in(page: &str) -> (Vec<String>, Option<String>) {
    let mut ids = Vec::new();
    for row in page.split("<th scope=\"row\"><a href=\"").skip(1) {
        let text = row.split_once("\">").map(|(_, rest)| rest).unwrap_or("");
        ids.push(text.split_once("</a>").map_or("", |(id, _)| id).to_owned());
    }
    let next = page
        .split_once("rel=\"next\"")
        .and_then(|(before, _)| before.rsplit_once("href=\""))
        .map(|(_, link)| {
            link.trim_end_matches("\" ")
                .trim_end_matches('"')
                .replace("&#38;", "&")
                .replace("&amp;", "&")
        });
    (ids, next)
}

/// Every page of a listing, following "Next page".
async fn all_pages(server: &TestServer, first: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut path = first.to_owned();
    loop {
        let (ids, next) = listed_in(&reqwest_text(server, &path).await);
        pages.push(ids);
        match next {
            Some(link) => path = link.trim_start_matches("/console").to_owned(),
            None => return pages,
        }
        assert!(pages.len() < 20, "the pages end: {pages:?}");
    }
}

/// The listing across principals, its filters (principal, tenant, prefix) and its pages, on
/// the embedded store and on PostgreSQL.
async fn listing_pages_and_filters(server: &TestServer) {
    for (token, context_id) in [
        ("alice-secret", "a-1"),
        ("bob-secret", "b-1"),
        ("alice-secret", "a-2"),
        ("bob-secret", "b-2"),
        ("alice-secret", "a-3"),
    ] {
        send_as(server, token, "hello", context_id).await;
        next_millisecond().await;
    }
    let in_red = rpc_as(
        server,
        "alice-secret",
        "SendMessage",
        json!({"message": user_message(V1, "hello", Some("a-red"), None), "tenant": "red"}),
    )
    .await;
    assert!(in_red.get("result").is_some(), "{in_red}");

    let newest_first = ["a-red", "a-3", "b-2", "a-2", "b-1", "a-1"];
    assert_eq!(all_pages(server, "/conversations").await, [newest_first]);
    assert_eq!(
        all_pages(server, "/conversations?size=2").await,
        [["a-red", "a-3"], ["b-2", "a-2"], ["b-1", "a-1"]]
    );
    assert_eq!(
        all_pages(server, "/conversations?size=2&principal=alice").await,
        [vec!["a-3", "a-2"], vec!["a-1"]]
    );
    assert_eq!(
        all_pages(server, "/conversations?principal=alice&tenant=red").await,
        [["a-red"]]
    );
    assert_eq!(
        all_pages(server, "/conversations?tenant=red")
            .await
            .concat(),
        ["a-red"]
    );
    assert_eq!(
        all_pages(server, "/conversations?prefix=b-&size=1")
            .await
            .concat(),
        ["b-2", "b-1"]
    );
    let page = reqwest_text(server, "/conversations?principal=alice&tenant=red").await;
    assert!(page.contains("alice (tenant red)"), "{page}");
    let (status, _) = get(server, "/conversations?page=zz", Some(CONSOLE_TOKEN)).await;
    assert_eq!(status, 400, "a page token the server never issued");
}

fn with_tenants(c: &mut colloquy::config::Config) {
    c.auth.tokens.insert("alice".into(), "alice-secret".into());
    c.auth.tokens.insert("bob".into(), "bob-secret".into());
    c.auth.tenants.insert("alice".into(), vec!["red".into()]);
    c.admin_listen = Some("127.0.0.1:0".into());
    c.console.token = Some(CONSOLE_TOKEN.into());
}

#[actix_rt::test]
async fn the_listing_filters_and_pages_across_principals_on_the_embedded_store() {
    let server = start_echo_with(with_tenants).await;
    listing_pages_and_filters(&server).await;
    server.stop().await;
}

#[actix_rt::test]
async fn the_listing_filters_and_pages_across_principals_on_postgresql() {
    let Some(url) = pg::database("console::listing_on_postgresql") else {
        return;
    };
    let server = start_echo_with(move |c| {
        with_tenants(c);
        c.store.url = url;
    })
    .await;
    listing_pages_and_filters(&server).await;
    server.stop().await;
}

/// The outbox page of a server whose webhook refuses every delivery, once `shows` holds.
async fn outbox_once(server: &TestServer, shows: impl Fn(&str) -> bool) -> String {
    let mut page = String::new();
    for _ in 0..150 {
        let (status, body) = get(server, "/outbox", Some(CONSOLE_TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        page = body;
        if shows(&page) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the outbox page never showed what was expected: {page}");
}

#[actix_rt::test]
async fn the_outbox_shows_a_retry_s_last_error_and_what_was_given_up() {
    // Retried a minute later: the notification waits, with why its attempt failed.
    let retrying = start_console_server().await;
    rpc_as(
        &retrying,
        "alice-secret",
        "SendMessage",
        json!({"message": user_message(V1, "notify me", Some("pushy"), None),
               "configuration": {"taskPushNotificationConfig": {"url": DEAD_HOOK}}}),
    )
    .await;
    let page = outbox_once(&retrying, |page| page.contains("retrying")).await;
    let row = page
        .split("<tr>")
        .find(|row| row.contains(DEAD_HOOK))
        .expect("the notification's row");
    let cells: Vec<&str> = row.split("<td").collect();
    // State, attempts, next attempt, last error: the error is said.
    let last_error = cells.get(4).expect("a last-error cell");
    assert!(last_error.len() > "></td>".len() + 2, "{row}");
    assert!(page.contains("None."), "nothing given up yet: {page}");
    retrying.stop().await;

    // Given up at the first failure (past push.give_up_after_secs at once).
    let giving_up = start_with(Arc::new(EchoAgent::new(0, Duration::ZERO)), |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
        c.admin_listen = Some("127.0.0.1:0".into());
        c.console.token = Some(CONSOLE_TOKEN.into());
        c.push.allow_private_networks = true;
        c.push.retry_base_ms = 60_000;
        c.push.give_up_after_secs = 1;
    })
    .await;
    let sent = rpc_as(
        &giving_up,
        "alice-secret",
        "SendMessage",
        json!({"message": user_message(V1, "notify me", Some("pushy"), None),
               "configuration": {"taskPushNotificationConfig": {"url": DEAD_HOOK}}}),
    )
    .await;
    let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
    let page = outbox_once(&giving_up, |page| {
        page.split("<h2>Given up</h2>")
            .nth(1)
            .is_some_and(|given| given.contains(DEAD_HOOK))
    })
    .await;
    let given_up = page.split("<h2>Given up</h2>").nth(1).unwrap_or_default();
    assert!(given_up.contains(&task_id), "{given_up}");
    giving_up.stop().await;
}
