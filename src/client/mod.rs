//! An async A2A client: the agent card, protocol negotiation (v1.0 when the card offers it, else
//! v0.3; JSON-RPC, else the v1.0 HTTP+JSON binding), blocking and streaming sends, `GetTask`;
//! bearer tokens; typed errors.
//!
//! Shared by `colloquy send` and the `a2a` agent backend. Wire shapes come from
//! [`crate::protocol::codec`], the same mapping the server uses.

use crate::error::chain;
use crate::model::{Artifact, Message, SendResult, StreamItem, Task, TaskEvent};
use crate::protocol::jsonrpc::ERROR_INFO_TYPE;
use crate::protocol::{RpcError, WireVersion, codec, protojson};
use eventsource_stream::Eventsource;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;

/// Why a call to a peer failed. Each kind gets its own exit code in `colloquy send`.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0:?} is not a usable URL: {1}")]
    InvalidUrl(String, #[source] UrlProblem),
    #[error("connection refused by {url} (is the agent running?)")]
    ConnectionRefused { url: String },
    #[error("could not connect to {url}: {detail}")]
    Connect {
        url: String,
        detail: String,
        source: reqwest::Error,
    },
    #[error("timed out after {secs} s waiting for {url}")]
    Timeout { url: String, secs: u64 },
    #[error("TLS failure talking to {url}: {detail}")]
    Tls {
        url: String,
        detail: String,
        source: reqwest::Error,
    },
    /// A request that failed for another reason than the ones above.
    #[error("the request to {url} failed: {}", chain(.source))]
    Request { url: String, source: reqwest::Error },
    #[error("{url} answered HTTP 401 Unauthorized{}", if *.with_token { " (the bearer token was refused)" } else { " (no bearer token was sent)" })]
    Unauthorized { url: String, with_token: bool },
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the peer answered JSON-RPC error {code}: {message}")]
    Rpc {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    #[error("malformed response from {url}: {detail}")]
    Malformed { url: String, detail: String },
    #[error("malformed response from {url}: {source}")]
    Card { url: String, source: NoInterface },
    /// The peer's card is not signed by a key of the trusted key set (`card_jwks_url`).
    #[error("the agent card at {url} is refused: {source}")]
    CardSignature {
        url: String,
        source: crate::protocol::signing::CardSignatureError,
    },
    #[error("the trusted key set {url} could not be read: {detail}")]
    TrustedKeys { url: String, detail: String },
}

/// The JSON-RPC code colloquy (and this client) uses for "context busy".
pub const CONTEXT_BUSY: i64 = -32010;

impl ClientError {
    /// For a "context busy" error: the task the peer is still working on, if it says.
    pub fn busy_task_id(&self) -> Option<String> {
        let ClientError::Rpc { code, data, .. } = self else {
            return None;
        };
        if *code != CONTEXT_BUSY {
            return None;
        }
        let data = data.as_ref();
        let from_v03 = data.and_then(|d| d.get("taskId")).and_then(Value::as_str);
        let from_v1 = data
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|d| d.pointer("/metadata/taskId").and_then(Value::as_str));
        Some(from_v03.or(from_v1).unwrap_or("(unknown)").to_owned())
    }

    fn from_reqwest(url: &str, error: reqwest::Error, timeout: Duration) -> ClientError {
        let url = url.to_owned();
        if error.is_timeout() {
            return ClientError::Timeout {
                url,
                secs: timeout.as_secs(),
            };
        }
        let mut causes = Vec::new();
        let mut source: Option<&dyn std::error::Error> = Some(&error);
        let mut refused = false;
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => refused = true,
                    std::io::ErrorKind::TimedOut => {
                        return ClientError::Timeout {
                            url,
                            secs: timeout.as_secs(),
                        };
                    }
                    _ => {}
                }
            }
            causes.push(e.to_string());
            source = e.source();
        }
        // The innermost cause says what happened (refused, reset, a certificate not trusted).
        let detail = causes.pop().unwrap_or_default();
        let text = format!("{} {detail}", causes.join(" ")).to_lowercase();
        if refused {
            ClientError::ConnectionRefused { url }
        } else if ["tls", "certificate", "handshake", "rustls"]
            .iter()
            .any(|w| text.contains(w))
        {
            ClientError::Tls {
                url,
                detail,
                source: error,
            }
        } else if error.is_connect() {
            ClientError::Connect {
                url,
                detail,
                source: error,
            }
        } else {
            ClientError::Request { url, source: error }
        }
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

/// Why a URL does not parse (the `url` crate's error, which reqwest does not name).
pub type UrlError = <reqwest::Url as std::str::FromStr>::Err;

/// What is wrong with a URL given as a peer.
#[derive(Debug, thiserror::Error)]
pub enum UrlProblem {
    #[error(transparent)]
    Parse(UrlError),
    #[error("only http:// and https:// URLs are supported")]
    Scheme,
}

/// How to reach peers.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub token: Option<String>,
    /// Connecting (TCP + TLS).
    pub connect_timeout: Duration,
    /// A blocking call, from sending to the whole response; for streams, the longest silence.
    pub timeout: Duration,
    /// The key set the peer's card must be signed by; None: the card is taken as served.
    pub card_jwks_url: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(300),
            card_jwks_url: None,
        }
    }
}

/// A peer whose card was read: where to post, in which version.
#[derive(Debug, Clone)]
pub struct Peer {
    pub base_url: String,
    pub endpoint: String,
    pub version: WireVersion,
    pub binding: Binding,
    pub card: Value,
    pub streaming: bool,
    http: reqwest::Client,
    options: ClientOptions,
}

/// How requests travel: JSON-RPC at the endpoint, or the v1.0 HTTP+JSON binding's resource URLs
/// under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    JsonRpc,
    HttpJson,
}

/// One interface of a card: what to speak, how, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub version: WireVersion,
    pub binding: Binding,
    pub url: String,
}

/// What colloquy speaks of what the card offers: JSON-RPC as [`negotiate`] picks it, else a
/// v1.0 HTTP+JSON interface.
pub fn negotiate_interface(card: &Value, base_url: &str) -> Result<Interface, NoInterface> {
    let jsonrpc_error = match negotiate(card, base_url) {
        Ok((version, url)) => {
            return Ok(Interface {
                version,
                binding: Binding::JsonRpc,
                url,
            });
        }
        Err(e) => e,
    };
    card.get("supportedInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|i| i.get("protocolBinding").and_then(Value::as_str) == Some("HTTP+JSON"))
        .find(|i| {
            let v = i
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            v == "1.0" || v.starts_with("1.0.")
        })
        .and_then(|i| i.get("url").and_then(Value::as_str))
        .map(|url| Interface {
            version: WireVersion::V1,
            binding: Binding::HttpJson,
            url: url.to_owned(),
        })
        .ok_or_else(|| NoInterface::NorHttpJson(Box::new(jsonrpc_error)))
}

/// What a call asks of the peer, whichever binding carries it.
#[derive(Debug, Clone, Copy)]
enum Operation<'a> {
    Send,
    Stream,
    GetTask(&'a str),
    Subscribe(&'a str),
}

impl Operation<'_> {
    fn jsonrpc_method(self, version: WireVersion) -> &'static str {
        match (self, version) {
            (Operation::Send, WireVersion::V1) => "SendMessage",
            (Operation::Send, WireVersion::V03) => "message/send",
            (Operation::Stream, WireVersion::V1) => "SendStreamingMessage",
            (Operation::Stream, WireVersion::V03) => "message/stream",
            (Operation::GetTask(_), WireVersion::V1) => "GetTask",
            (Operation::GetTask(_), WireVersion::V03) => "tasks/get",
            (Operation::Subscribe(_), WireVersion::V1) => "SubscribeToTask",
            (Operation::Subscribe(_), WireVersion::V03) => "tasks/resubscribe",
        }
    }
}

/// Where the card of the agent at `url` is: `url` itself when it names the card, else
/// `<url>/.well-known/agent-card.json`.
pub fn card_url(url: &str) -> String {
    if url.ends_with("/.well-known/agent-card.json") || url.ends_with("/.well-known/agent.json") {
        url.to_owned()
    } else {
        format!("{}/.well-known/agent-card.json", url.trim_end_matches('/'))
    }
}

/// Checks that `url` is an absolute http(s) URL.
pub fn check_url(url: &str) -> ClientResult<reqwest::Url> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ClientError::InvalidUrl(url.to_owned(), UrlProblem::Parse(e)))?;
    match parsed.scheme() {
        "http" | "https" if parsed.host().is_some() => Ok(parsed),
        _ => Err(ClientError::InvalidUrl(url.to_owned(), UrlProblem::Scheme)),
    }
}

/// The version and endpoint the card offers: v1.0 JSONRPC in `supportedInterfaces`, else v0.3.
/// Why a card offers nothing colloquy speaks.
#[derive(Debug, thiserror::Error)]
pub enum NoInterface {
    #[error(
        "the card offers protocol {version} over {transport}; colloquy speaks A2A 1.0 and 0.3 over JSON-RPC"
    )]
    Unsupported { version: String, transport: String },
    #[error(
        "the card at {card_url} offers no JSON-RPC interface (no supportedInterfaces entry for 1.0 or 0.3, no url)"
    )]
    NoJsonRpc { card_url: String },
    #[error("{0}, nor an HTTP+JSON 1.0 one")]
    NorHttpJson(#[source] Box<NoInterface>),
}

pub fn negotiate(card: &Value, base_url: &str) -> Result<(WireVersion, String), NoInterface> {
    let interfaces = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let jsonrpc = |i: &&Value| i.get("protocolBinding").and_then(Value::as_str) == Some("JSONRPC");
    let version_of = |i: &Value| {
        i.get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let url_of = |i: &Value| i.get("url").and_then(Value::as_str).map(str::to_owned);
    if let Some(url) = interfaces
        .iter()
        .filter(jsonrpc)
        .find(|i| {
            let v = version_of(i);
            v == "1.0" || v.starts_with("1.0.")
        })
        .and_then(url_of)
    {
        return Ok((WireVersion::V1, url));
    }
    if let Some(url) = interfaces
        .iter()
        .filter(jsonrpc)
        .find(|i| version_of(i).starts_with("0.3"))
        .and_then(url_of)
    {
        return Ok((WireVersion::V03, url));
    }
    let legacy_version = card
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("0.3.0");
    let transport = card
        .get("preferredTransport")
        .and_then(Value::as_str)
        .unwrap_or("JSONRPC");
    if let Some(url) = card.get("url").and_then(Value::as_str) {
        if legacy_version.starts_with("0.3") && transport.eq_ignore_ascii_case("JSONRPC") {
            return Ok((WireVersion::V03, url.to_owned()));
        }
        return Err(NoInterface::Unsupported {
            version: legacy_version.to_owned(),
            transport: transport.to_owned(),
        });
    }
    Err(NoInterface::NoJsonRpc {
        card_url: card_url(base_url),
    })
}

fn build_http(options: &ClientOptions) -> ClientResult<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(options.connect_timeout)
        .build()
        .map_err(|source| ClientError::Connect {
            url: String::new(),
            detail: source.to_string(),
            source,
        })
}

/// Reads the card at `url` and picks the version to speak.
pub async fn connect(url: &str, options: ClientOptions) -> ClientResult<Peer> {
    check_url(url)?;
    let http = build_http(&options)?;
    let card_url = card_url(url);
    let mut request = http
        .get(&card_url)
        .timeout(options.timeout.min(Duration::from_secs(30)))
        .header("Accept", "application/json");
    if let Some(token) = &options.token {
        request = request.bearer_auth(token);
    }
    let timeout = options.timeout.min(Duration::from_secs(30));
    let response = request
        .send()
        .await
        .map_err(|e| ClientError::from_reqwest(&card_url, e, timeout))?;
    let response = check_status(&card_url, response, options.token.is_some()).await?;
    let card: Value = response
        .json()
        .await
        .map_err(|e| malformed_or_io(&card_url, e, timeout, "the agent card is not JSON"))?;
    if !card.is_object() {
        return Err(ClientError::Malformed {
            url: card_url,
            detail: "the agent card is not a JSON object".into(),
        });
    }
    if let Some(jwks_url) = &options.card_jwks_url {
        let jwks = trusted_keys(&http, jwks_url, timeout).await?;
        crate::protocol::signing::verify_card(&card, &jwks).map_err(|source| {
            ClientError::CardSignature {
                url: card_url.clone(),
                source,
            }
        })?;
    }
    let interface = negotiate_interface(&card, url).map_err(|source| ClientError::Card {
        url: card_url.clone(),
        source,
    })?;
    let Interface {
        version,
        binding,
        url: endpoint,
    } = interface;
    check_url(&endpoint).map_err(|e| ClientError::Malformed {
        url: card_url.clone(),
        detail: format!("the card's interface URL: {e}"),
    })?;
    let streaming = card
        .pointer("/capabilities/streaming")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Peer {
        base_url: url.to_owned(),
        endpoint,
        version,
        binding,
        card,
        streaming,
        http,
        options,
    })
}

/// The key set a peer's card must be signed by.
async fn trusted_keys(http: &reqwest::Client, url: &str, timeout: Duration) -> ClientResult<Value> {
    let refused = |detail: String| ClientError::TrustedKeys {
        url: url.to_owned(),
        detail,
    };
    let response = http
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| refused(e.to_string()))?;
    if !response.status().is_success() {
        return Err(refused(format!("HTTP {}", response.status().as_u16())));
    }
    let bytes = read_limited(response, MAX_KEY_SET_BYTES)
        .await
        .map_err(refused)?;
    serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))
}

/// The largest key set read.
pub const MAX_KEY_SET_BYTES: usize = 1 << 20;

/// A response's body, if it is at most `limit` bytes (read no further than that).
pub async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > limit {
            return Err(format!("the body is larger than {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn malformed_or_io(url: &str, e: reqwest::Error, timeout: Duration, what: &str) -> ClientError {
    if e.is_decode() {
        ClientError::Malformed {
            url: url.to_owned(),
            detail: format!("{what}: {e}"),
        }
    } else {
        ClientError::from_reqwest(url, e, timeout)
    }
}

async fn check_status(
    url: &str,
    response: reqwest::Response,
    with_token: bool,
) -> ClientResult<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(ClientError::Unauthorized {
            url: url.to_owned(),
            with_token,
        });
    }
    let body = response.text().await.unwrap_or_default();
    // A JSON-RPC error sent with an HTTP error status is still the peer's JSON-RPC error.
    if let Ok(value) = serde_json::from_str::<Value>(&body)
        && let Some(error) = value.get("error").filter(|e| e.get("code").is_some())
    {
        return Err(rpc_error(error));
    }
    let mut body: String = body.chars().take(300).collect();
    if body.is_empty() {
        body = status.canonical_reason().unwrap_or("").to_owned();
    }
    Err(ClientError::Http {
        url: url.to_owned(),
        status: status.as_u16(),
        body,
    })
}

/// The peer's error: a JSON-RPC `error`, or an HTTP+JSON `google.rpc.Status`, whose ErrorInfo
/// reason gives the JSON-RPC code (its `details` kept as `data`, as v1.0 JSON-RPC carries them).
fn rpc_error(error: &Value) -> ClientError {
    if let Some(details) = error
        .get("details")
        .filter(|_| error.get("status").is_some())
    {
        let reason = details
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d.get("@type").and_then(Value::as_str) == Some(ERROR_INFO_TYPE))
            .and_then(|d| d.get("reason").and_then(Value::as_str));
        return ClientError::Rpc {
            code: reason
                .and_then(RpcError::code_for_reason)
                .or_else(|| error.get("code").and_then(Value::as_i64))
                .unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .to_owned(),
            data: Some(details.clone()),
        };
    }
    ClientError::Rpc {
        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .to_owned(),
        data: error.get("data").cloned(),
    }
}

/// What a stream yields: the task or message first, then status and artifact updates.
pub type EventStream = BoxStream<'static, ClientResult<StreamItem>>;

impl Peer {
    /// The agent card's `name`.
    pub fn name(&self) -> Option<&str> {
        self.card.get("name").and_then(Value::as_str)
    }

    /// The longest wait for an answer.
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    fn request(&self, operation: Operation<'_>, params: Value) -> reqwest::RequestBuilder {
        let mut request = match self.binding {
            Binding::JsonRpc => {
                let body = json!({
                    "jsonrpc": "2.0",
                    "id": uuid::Uuid::new_v4().to_string(),
                    "method": operation.jsonrpc_method(self.version),
                    "params": params,
                });
                self.http.post(&self.endpoint).json(&body)
            }
            Binding::HttpJson => {
                let base = self.endpoint.trim_end_matches('/');
                match operation {
                    Operation::Send => self.http.post(format!("{base}/message:send")).json(&params),
                    Operation::Stream => self
                        .http
                        .post(format!("{base}/message:stream"))
                        .json(&params),
                    Operation::GetTask(id) => self
                        .http
                        .get(format!("{base}/tasks/{}", percent_encode_segment(id))),
                    Operation::Subscribe(id) => self.http.get(format!(
                        "{base}/tasks/{}:subscribe",
                        percent_encode_segment(id)
                    )),
                }
            }
        };
        if self.version == WireVersion::V1 {
            request = request.header("A2A-Version", "1.0");
        }
        if let Some(token) = &self.options.token {
            request = request.bearer_auth(token);
        }
        crate::telemetry::propagation::onto(request)
    }

    fn send_params(&self, message: &Message) -> Value {
        let configuration = match self.version {
            WireVersion::V1 => json!({}),
            WireVersion::V03 => json!({"blocking": true}),
        };
        json!({
            "message": codec::encode_message(self.version, message),
            "configuration": configuration,
        })
    }

    async fn call(&self, operation: Operation<'_>, params: Value) -> ClientResult<Value> {
        let timeout = self.options.timeout;
        let response = self
            .request(operation, params)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| ClientError::from_reqwest(&self.endpoint, e, timeout))?;
        let response = check_status(&self.endpoint, response, self.options.token.is_some()).await?;
        let value: Value = response
            .json()
            .await
            .map_err(|e| malformed_or_io(&self.endpoint, e, timeout, "the response is not JSON"))?;
        self.result_of(value)
    }

    fn result_of(&self, value: Value) -> ClientResult<Value> {
        if let Some(error) = value.get("error") {
            return Err(rpc_error(error));
        }
        if self.binding == Binding::HttpJson {
            // No envelope: the body is the result.
            let mut result = value;
            protojson::to_json_names(&mut result, "result").map_err(|e| self.malformed(e))?;
            return Ok(result);
        }
        match value {
            Value::Object(mut map) if map.contains_key("result") => {
                let mut result = map.remove("result").unwrap_or(Value::Null);
                // A v1.0 peer may answer with proto field names, as ProtoJSON allows.
                if self.version == WireVersion::V1 {
                    protojson::to_json_names(&mut result, "result")
                        .map_err(|e| self.malformed(e))?;
                }
                Ok(result)
            }
            _ => Err(ClientError::Malformed {
                url: self.endpoint.clone(),
                detail: "a JSON-RPC response needs `result` or `error`".into(),
            }),
        }
    }

    fn malformed(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Malformed {
            url: self.endpoint.clone(),
            detail: e.to_string(),
        }
    }

    /// A blocking send: waits until the task is terminal or waits for input.
    pub async fn send(&self, message: &Message) -> ClientResult<SendResult> {
        let result = self
            .call(Operation::Send, self.send_params(message))
            .await?;
        codec::decode_send_result(self.version, &result).map_err(|e| self.malformed(e))
    }

    /// `GetTask` / `tasks/get`.
    pub async fn get_task(&self, task_id: &str) -> ClientResult<Task> {
        let result = self
            .call(Operation::GetTask(task_id), json!({ "id": task_id }))
            .await?;
        codec::decode_task(self.version, &result, "result").map_err(|e| self.malformed(e))
    }

    /// A streaming send. Each item arrives as the peer sends it; the stream ends when the turn
    /// does (a message, or a final status). A connection that drops before then is resumed:
    /// the task is subscribed to again with the last event id seen (`Last-Event-ID`), up to
    /// [`RESUME_ATTEMPTS`] times, so the items go on where they stopped (or, from a peer that no
    /// longer has those events, with the task as it stands). A silence longer than the timeout
    /// ends it with [`ClientError::Timeout`].
    pub async fn stream(&self, message: &Message) -> ClientResult<EventStream> {
        let request = self.request(Operation::Stream, self.send_params(message));
        let first = self.open_stream(request).await?;
        let state = Resumable {
            peer: self.clone(),
            current: Some(first),
            last_id: None,
            task_id: None,
            finished: false,
            attempts: 0,
        };
        Ok(futures_util::stream::unfold(state, Resumable::next).boxed())
    }

    /// Sends a streaming request and reads its answer as SSE events.
    async fn open_stream(&self, request: reqwest::RequestBuilder) -> ClientResult<Frames> {
        let timeout = self.options.timeout;
        let response = request
            .header("Accept", "text/event-stream")
            .header("Cache-Control", "no-store")
            .send()
            .await
            .map_err(|e| ClientError::from_reqwest(&self.endpoint, e, timeout))?;
        let response = check_status(&self.endpoint, response, self.options.token.is_some()).await?;
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // A plain JSON answer: an error, or one result.
            let value: Value = response.json().await.map_err(|e| {
                malformed_or_io(&self.endpoint, e, timeout, "the response is not JSON")
            })?;
            let result = self.result_of(value)?;
            let item =
                codec::decode_stream_item(self.version, &result).map_err(|e| self.malformed(e))?;
            return Ok(futures_util::stream::iter([Ok((None, item))]).boxed());
        }
        let version = self.version;
        let endpoint = self.endpoint.clone();
        let events = response.bytes_stream().eventsource();
        let peer = self.clone();
        let frames = idle_timeout(events, timeout).map(move |event| {
            let event = match event {
                Err(None) => {
                    return Err(Cut::Fatal(ClientError::Timeout {
                        url: endpoint.clone(),
                        secs: timeout.as_secs(),
                    }));
                }
                Err(Some(e)) => {
                    return Err(Cut::Dropped(
                        peer.malformed(format!("reading the stream: {e}")),
                    ));
                }
                Ok(event) => event,
            };
            let value: Value = serde_json::from_str(&event.data)
                .map_err(|e| peer.malformed(format!("a stream event is not JSON: {e}")))?;
            if event.event == "error"
                && let Some(error) = value.get("error")
            {
                return Err(Cut::Fatal(rpc_error(error)));
            }
            let result = peer.result_of(value)?;
            let item =
                codec::decode_stream_item(version, &result).map_err(|e| peer.malformed(e))?;
            Ok(((!event.id.is_empty()).then_some(event.id), item))
        });
        Ok(frames.boxed())
    }
}

/// How many times a stream whose connection dropped is resumed.
pub const RESUME_ATTEMPTS: u32 = 5;

/// A stream's events as they come: each with its SSE id, if it had one.
type Frames = BoxStream<'static, Result<(Option<String>, StreamItem), Cut>>;

/// Why a stream's events stopped.
enum Cut {
    /// The connection broke: worth resuming.
    Dropped(ClientError),
    /// The peer answered with an error, or was silent too long.
    Fatal(ClientError),
}

impl From<ClientError> for Cut {
    fn from(error: ClientError) -> Self {
        Cut::Fatal(error)
    }
}

/// A streamed turn that resumes after a dropped connection.
struct Resumable {
    peer: Peer,
    current: Option<Frames>,
    last_id: Option<String>,
    task_id: Option<String>,
    finished: bool,
    attempts: u32,
}

/// Whether an item ends a streamed turn.
fn ends_turn(item: &StreamItem) -> bool {
    match item {
        StreamItem::Message(_) => true,
        StreamItem::Task(task) => task.status.state.ends_turn(),
        StreamItem::Event(TaskEvent::Status {
            status, is_final, ..
        }) => *is_final || status.state.ends_turn(),
        StreamItem::Event(TaskEvent::Artifact { .. }) => false,
    }
}

fn task_id_of(item: &StreamItem) -> Option<&str> {
    match item {
        StreamItem::Message(message) => message.task_id.as_deref(),
        StreamItem::Task(task) => Some(&task.id),
        StreamItem::Event(TaskEvent::Status { task_id, .. })
        | StreamItem::Event(TaskEvent::Artifact { task_id, .. }) => Some(task_id),
    }
}

impl Resumable {
    async fn next(mut self) -> Option<(ClientResult<StreamItem>, Self)> {
        loop {
            if self.finished {
                return None;
            }
            let frame = match self.current.as_mut() {
                Some(frames) => frames.next().await,
                None => return None,
            };
            let dropped = match frame {
                Some(Ok((id, item))) => {
                    self.last_id = id.or(self.last_id.take());
                    if self.task_id.is_none() {
                        self.task_id = task_id_of(&item).map(str::to_owned);
                    }
                    self.finished = ends_turn(&item);
                    return Some((Ok(item), self));
                }
                Some(Err(Cut::Fatal(error))) => {
                    self.current = None;
                    return Some((Err(error), self));
                }
                Some(Err(Cut::Dropped(error))) => error,
                None => self.peer.malformed("the stream ended before the turn did"),
            };
            match self.resume().await {
                Ok(frames) => self.current = Some(frames),
                Err(error) => {
                    self.current = None;
                    // Nothing to resume from, or the peer would not: the drop is the error.
                    let error = if matches!(error, ClientError::Malformed { .. }) {
                        dropped
                    } else {
                        error
                    };
                    return Some((Err(error), self));
                }
            }
        }
    }

    /// Subscribes to the task again after the last event seen.
    async fn resume(&mut self) -> ClientResult<Frames> {
        let (Some(task_id), Some(last_id)) = (&self.task_id, &self.last_id) else {
            return Err(self.peer.malformed("no event id to resume from"));
        };
        if self.attempts >= RESUME_ATTEMPTS {
            return Err(self.peer.malformed("resumed too many times"));
        }
        self.attempts += 1;
        tokio::time::sleep(Duration::from_millis(100 << self.attempts.min(4))).await;
        tracing::info!(%task_id, %last_id, attempt = self.attempts, "resuming a dropped stream");
        let request = self
            .peer
            .request(Operation::Subscribe(task_id), json!({ "id": task_id }))
            .header("Last-Event-ID", last_id.as_str());
        self.peer.open_stream(request).await
    }
}

/// `text` as one URL path segment.
fn percent_encode_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Ends with `Err(None)` after `timeout` without an item; stream errors become `Err(Some(..))`.
fn idle_timeout<S, T, E>(
    stream: S,
    timeout: Duration,
) -> impl Stream<Item = Result<T, Option<String>>> + Send + 'static
where
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    futures_util::stream::unfold(
        (Box::pin(stream), false),
        move |(mut stream, done)| async move {
            if done {
                return None;
            }
            match tokio::time::timeout(timeout, stream.next()).await {
                Err(_) => Some((Err(None), (stream, true))),
                Ok(None) => None,
                Ok(Some(Ok(item))) => Some((Ok(item), (stream, false))),
                Ok(Some(Err(e))) => Some((Err(Some(e.to_string())), (stream, true))),
            }
        },
    )
}

/// Folds stream items into the task they describe, the way a careful client does: appended
/// artifact chunks join their artifact, status updates replace the status.
#[derive(Debug, Default, Clone)]
pub struct TaskAssembler {
    pub task: Option<Task>,
    pub message: Option<Message>,
    /// The reply text received so far, in order (text parts of artifact updates and of the first task).
    pub streamed_text: String,
    /// Whether a final status (terminal or interrupted) arrived.
    pub finished: bool,
}

/// The text parts of an artifact, concatenated.
pub fn artifact_text(artifact: &Artifact) -> String {
    artifact.text()
}

/// All artifact text of a task, in order.
pub fn task_text(task: &Task) -> String {
    task.artifacts.iter().map(artifact_text).collect()
}

impl TaskAssembler {
    /// Applies one item; returns the new reply text it carried (for printing as it arrives).
    pub fn apply(&mut self, item: StreamItem) -> String {
        match item {
            StreamItem::Message(message) => {
                let text = message.text();
                self.streamed_text.push_str(&text);
                self.message = Some(message);
                self.finished = true;
                text
            }
            StreamItem::Task(task) => {
                // A task is everything so far: after the stream's first event (a resume from a
                // snapshot, a later turn) only what it adds is new.
                let text = task_text(&task);
                let new = match text.strip_prefix(self.streamed_text.as_str()) {
                    Some(added) => added.to_owned(),
                    None => text.clone(),
                };
                self.streamed_text = text;
                self.finished = task.status.state.ends_turn();
                self.task = Some(task);
                new
            }
            StreamItem::Event(TaskEvent::Status {
                task_id,
                context_id,
                status,
                is_final,
            }) => {
                self.finished = is_final || status.state.ends_turn();
                let task = self.task.get_or_insert_with(|| Task {
                    id: task_id,
                    context_id,
                    status: status.clone(),
                    artifacts: Vec::new(),
                    history: Vec::new(),
                    metadata: None,
                });
                task.status = status;
                String::new()
            }
            StreamItem::Event(TaskEvent::Artifact {
                task_id,
                context_id,
                artifact,
                append,
                ..
            }) => {
                let text = artifact_text(&artifact);
                self.streamed_text.push_str(&text);
                let task = self.task.get_or_insert_with(|| Task {
                    id: task_id,
                    context_id,
                    status: crate::model::TaskStatus::new(crate::model::TaskState::Working, None),
                    artifacts: Vec::new(),
                    history: Vec::new(),
                    metadata: None,
                });
                match task
                    .artifacts
                    .iter_mut()
                    .find(|a| a.artifact_id == artifact.artifact_id)
                {
                    Some(existing) if append => existing.parts.extend(artifact.parts),
                    Some(existing) => *existing = artifact,
                    None => task.artifacts.push(artifact),
                }
                text
            }
        }
    }
}

/// The text a finished send answered with: the message's text, or the task's artifacts.
pub fn reply_text(result: &SendResult) -> String {
    match result {
        SendResult::Message(message) => message.text(),
        SendResult::Task(task) => task_text(task),
    }
}

/// The status message text of a task, if any.
pub fn status_text(task: &Task) -> Option<String> {
    task.status
        .message
        .as_ref()
        .map(Message::text)
        .filter(|t| !t.is_empty())
}

/// A user message with one text part.
pub fn user_text_message(text: &str, context_id: Option<&str>, task_id: Option<&str>) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: crate::model::Role::User,
        parts: vec![crate::model::Part::text(text)],
        context_id: context_id.map(str::to_owned),
        task_id: task_id.map(str::to_owned),
        reference_task_ids: Vec::new(),
        metadata: None,
        extensions: Vec::new(),
        timestamp: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_v1_and_falls_back_to_v03() {
        let dual = json!({"supportedInterfaces":[{"url":"http://a/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}],
            "protocolVersion":"0.3.0","url":"http://b/"});
        assert_eq!(
            negotiate(&dual, "http://x").unwrap(),
            (WireVersion::V1, "http://a/".into())
        );
        let legacy =
            json!({"protocolVersion":"0.3.0","url":"http://b/","preferredTransport":"JSONRPC"});
        assert_eq!(
            negotiate(&legacy, "http://x").unwrap(),
            (WireVersion::V03, "http://b/".into())
        );
        let only03 = json!({"supportedInterfaces":[{"url":"http://c/","protocolBinding":"JSONRPC","protocolVersion":"0.3"}]});
        assert_eq!(
            negotiate(&only03, "http://x").unwrap(),
            (WireVersion::V03, "http://c/".into())
        );
        assert!(negotiate(&json!({"name":"x"}), "http://x").is_err());
        let grpc = json!({"supportedInterfaces":[{"url":"http://a/","protocolBinding":"GRPC","protocolVersion":"1.0"}]});
        assert!(negotiate(&grpc, "http://x").is_err());
    }

    #[test]
    fn an_http_json_interface_is_taken_only_without_a_json_rpc_one() {
        let rest = json!({"url":"http://r/","protocolBinding":"HTTP+JSON","protocolVersion":"1.0"});
        let jsonrpc =
            json!({"url":"http://j/","protocolBinding":"JSONRPC","protocolVersion":"1.0"});
        let both = json!({"supportedInterfaces": [rest, jsonrpc]});
        let picked = negotiate_interface(&both, "http://x").unwrap();
        assert_eq!(
            (picked.binding, picked.url.as_str()),
            (Binding::JsonRpc, "http://j/")
        );
        let only_rest = json!({"supportedInterfaces": [rest]});
        let picked = negotiate_interface(&only_rest, "http://x").unwrap();
        assert_eq!(
            picked,
            Interface {
                version: WireVersion::V1,
                binding: Binding::HttpJson,
                url: "http://r/".into()
            }
        );
        let grpc = json!({"supportedInterfaces":[{"url":"http://a/","protocolBinding":"GRPC","protocolVersion":"1.0"}]});
        assert!(negotiate_interface(&grpc, "http://x").is_err());
    }

    #[test]
    fn http_json_errors_become_the_json_rpc_error_of_their_reason() {
        let status = json!({"code": 409, "status": "ABORTED", "message": "context busy",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "CONTEXT_BUSY",
                         "domain": "a2a-protocol.org", "metadata": {"contextId": "c", "taskId": "t9"}}]});
        let error = rpc_error(&status);
        assert!(
            matches!(
                error,
                ClientError::Rpc {
                    code: CONTEXT_BUSY,
                    ..
                }
            ),
            "{error:?}"
        );
        assert_eq!(error.busy_task_id().as_deref(), Some("t9"));
        let not_found = json!({"code": 404, "status": "NOT_FOUND", "message": "no",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND"}]});
        assert!(matches!(
            rpc_error(&not_found),
            ClientError::Rpc { code: -32001, .. }
        ));
    }

    #[test]
    fn busy_task_id_from_both_versions() {
        let v1 = ClientError::Rpc {
            code: CONTEXT_BUSY,
            message: "busy".into(),
            data: Some(json!([{"@type":"x","metadata":{"taskId":"t1","contextId":"c"}}])),
        };
        assert_eq!(v1.busy_task_id().as_deref(), Some("t1"));
        let v03 = ClientError::Rpc {
            code: CONTEXT_BUSY,
            message: "busy".into(),
            data: Some(json!({"taskId":"t2"})),
        };
        assert_eq!(v03.busy_task_id().as_deref(), Some("t2"));
    }

    #[test]
    fn card_url_forms() {
        assert_eq!(
            card_url("http://h:1/"),
            "http://h:1/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("http://h:1"),
            "http://h:1/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("http://h:1/.well-known/agent-card.json"),
            "http://h:1/.well-known/agent-card.json"
        );
    }
}
