//! Traces over OTLP: `colloquy serve` processes (traces need the process's own subscriber)
//! export to a collector this test runs on loopback, which decodes the protobuf requests. A
//! turn delegated by one server's `a2a` backend to another is one trace across both; an `exec`
//! agent gets the turn's context; a collector that is away costs spans, counted, never a turn.

use super::common::free_port;
use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The caller's own trace: its id, and the span the server's request span must hang from.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A span as the collector received it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: Vec<(String, String)>,
    failed: bool,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP collector on loopback keeping every span it is sent.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Collector {
    async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let server = HttpServer::new(move || {
            let kept = kept.clone();
            App::new().route(
                "/v1/traces",
                web::post().to(move |body: web::Bytes| {
                    let kept = kept.clone();
                    async move {
                        match ExportTraceServiceRequest::decode(body.as_ref()) {
                            Ok(request) => {
                                kept.lock().unwrap().extend(decode(request));
                                HttpResponse::Ok()
                                    .content_type("application/x-protobuf")
                                    .finish()
                            }
                            Err(_) => HttpResponse::BadRequest().finish(),
                        }
                    }
                }),
            )
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind");
        let url = format!("http://{}", server.addrs()[0]);
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Collector { url, spans, handle }
    }

    /// The spans of `trace_id` once they hold each `(service, name)` of `expected`.
    async fn wait_for_all(&self, trace_id: &str, expected: &[(&str, &str)]) -> Vec<Received> {
        self.wait_for(trace_id, |spans| all_of(spans, expected))
            .await
    }

    /// The spans of `trace_id` once `done` holds for them (within 20 s).
    async fn wait_for(&self, trace_id: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        for _ in 0..200 {
            let spans: Vec<Received> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|span| span.trace_id == trace_id)
                .cloned()
                .collect();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let all = self.spans.lock().unwrap().clone();
        panic!("the collector never got the spans expected; it got: {all:#?}");
    }
}

fn decode(request: ExportTraceServiceRequest) -> Vec<Received> {
    let mut received = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                received.push(Received {
                    service: service.clone(),
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                    // STATUS_CODE_ERROR
                    failed: span.status.as_ref().is_some_and(|s| s.code == 2),
                });
            }
        }
    }
    received
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `colloquy serve` process exporting to `collector` as `service`.
struct Served {
    child: Child,
    url: String,
    _data: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn serve(endpoint: &str, service: &str, tweak: impl FnOnce(&mut Command)) -> Served {
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .args(["serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data")
        .arg(data.path())
        .env("COLLOQUY_TELEMETRY__OTLP_ENDPOINT", endpoint)
        .env("COLLOQUY_GRPC_LISTEN", "")
        .env("OTEL_SERVICE_NAME", service)
        // Batches leave every 100 ms, so the test need not wait the default 5 s.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    tweak(&mut command);
    let served = Served {
        child: command.spawn().expect("colloquy starts"),
        url: format!("http://127.0.0.1:{port}/"),
        _data: data,
    };
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client
            .get(format!("{}healthz", served.url))
            .send()
            .await
            .is_ok()
        {
            return served;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("colloquy serve did not come up on {}", served.url);
}

/// `SendMessage` with `params` to `url`, as the caller whose trace is [`TRACE_ID`]; the
/// response.
async fn send_traced_params(url: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
    reqwest::Client::new()
        .post(url)
        .header("A2A-Version", "1.0")
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .header("tracestate", "caller=yes")
        .json(&body)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json")
}

fn text_message(text: &str) -> Value {
    json!({"messageId": uuid(), "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// Sends `text` to `url` as the caller whose trace is [`TRACE_ID`]; the answer's task.
async fn send_traced(url: &str, text: &str) -> Value {
    let response = send_traced_params(url, json!({"message": text_message(text)})).await;
    assert!(response["error"].is_null(), "{response}");
    response["result"]["task"].clone()
}

fn uuid() -> String {
    format!("m-{}", super::common::next_id())
}

/// Whether `spans` hold one named `name` from `service` for each pair of `expected`.
fn all_of(spans: &[Received], expected: &[(&str, &str)]) -> bool {
    expected.iter().all(|(service, name)| {
        spans
            .iter()
            .any(|s| s.service == *service && s.name == *name)
    })
}

fn one<'a>(spans: &'a [Received], service: &str, name: &str) -> &'a Received {
    let found: Vec<&Received> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {name} span of {service} in {spans:#?}");
    found[0]
}

fn children<'a>(spans: &'a [Received], parent: &Received) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| s.parent == parent.span_id)
        .collect()
}

#[actix_rt::test]
async fn a_delegated_turn_is_one_trace_across_both_servers() {
    let collector = Collector::start().await;
    let delegate = serve(&collector.url, "delegate", |_| {}).await;
    let front = serve(&collector.url, "front", |command| {
        command
            .env("COLLOQUY_AGENT__KIND", "a2a")
            .env("COLLOQUY_AGENT__PEER_URL", &delegate.url);
    })
    .await;

    let secret = "the text of the message, never in a span";
    let task = send_traced(&front.url, secret).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");

    let expected = [
        ("front", "request"),
        ("front", "turn"),
        ("front", "agent.run"),
        ("front", "store.begin_turn"),
        ("front", "store.finish_turn"),
        ("delegate", "request"),
        ("delegate", "turn"),
    ];
    let spans = collector.wait_for_all(TRACE_ID, &expected).await;

    // The front server's request continues the caller's span, and names its call.
    let request = one(&spans, "front", "request");
    assert_eq!(request.parent, CALLER_SPAN);
    assert_eq!(request.attribute("method"), Some("SendMessage"));
    assert_eq!(request.attribute("binding"), Some("jsonrpc"));
    assert_eq!(request.attribute("version"), Some("1.0"));
    assert_eq!(request.attribute("outcome"), Some("ok"));
    // Its turn, the store's writes and the agent's run hang from it.
    let turn = one(&spans, "front", "turn");
    assert_eq!(turn.parent, request.span_id);
    let conversation = turn.attribute("conversation").expect("conversation");
    assert_eq!(conversation.len(), 66, "the key's hash: {conversation}");
    assert_eq!(turn.attribute("task_id"), task["id"].as_str());
    let steps: Vec<&str> = children(&spans, turn)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for step in ["store.begin_turn", "agent.run", "store.finish_turn"] {
        assert!(steps.contains(&step), "{step} under the turn: {steps:?}");
    }
    let agent = one(&spans, "front", "agent.run");
    assert_eq!(agent.attribute("backend"), Some("a2a"));

    // The delegate's request continues the front's agent run: the traceparent it received.
    let delegated = one(&spans, "delegate", "request");
    // The backend streams from a peer that can.
    assert_eq!(delegated.attribute("method"), Some("SendStreamingMessage"));
    assert_eq!(delegated.parent, agent.span_id);
    let delegated_turn = one(&spans, "delegate", "turn");
    assert_eq!(delegated_turn.parent, delegated.span_id);
    assert_ne!(
        delegated_turn.attribute("conversation"),
        Some(conversation),
        "another conversation, on another server"
    );
    assert!(spans.iter().all(|s| !s.failed), "{spans:#?}");

    // No span carries the message's text, nor the contextId.
    let context_id = task["contextId"].as_str().expect("contextId");
    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(!value.contains(secret), "{key} of {}: {value}", span.name);
            assert!(
                !value.contains(context_id),
                "{key} of {}: {value}",
                span.name
            );
        }
    }
    collector.handle.stop(true).await;
}

#[actix_rt::test]
async fn an_exec_agent_is_given_the_turns_trace_context() {
    let collector = Collector::start().await;
    // The program answers with what it was given: the variable and the request's field.
    let script = r#"echo "env=$TRACEPARENT"; grep -o '"traceparent":"[^"]*"'"#;
    let server = serve(&collector.url, "exec", |command| {
        command.args(["--agent", "exec", "--", "sh", "-c", script]);
    })
    .await;
    let task = send_traced(&server.url, "hello").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let spans = collector
        .wait_for(TRACE_ID, |spans| {
            spans.iter().any(|s| s.name == "agent.run")
        })
        .await;
    let agent = one(&spans, "exec", "agent.run");
    let expected = format!("00-{TRACE_ID}-{}-01", agent.span_id);
    let reply = super::common::reply_text(&task);
    assert!(reply.contains(&format!("env={expected}")), "{reply}");
    assert!(
        reply.contains(&format!(r#""traceparent":"{expected}""#)),
        "{reply}"
    );
    collector.handle.stop(true).await;
}

#[actix_rt::test]
async fn with_the_collector_away_turns_go_on_and_its_spans_are_counted_dropped() {
    // A port nothing listens on.
    let away = format!("http://127.0.0.1:{}", free_port());
    let server = serve(&away, "alone", |command| {
        command.env("OTEL_EXPORTER_OTLP_TIMEOUT", "200");
    })
    .await;
    for n in 0..5 {
        let task = send_traced(&server.url, &format!("turn {n}")).await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    }
    let client = reqwest::Client::new();
    let mut dropped = 0.0;
    for _ in 0..300 {
        let metrics = client
            .get(format!("{}metrics", server.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        dropped = metrics
            .lines()
            .find(|line| line.starts_with(r#"colloquy_trace_spans_total{outcome="dropped"}"#))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        if dropped >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dropped >= 5.0, "spans counted dropped: {dropped}");
}

/// A service outside colloquy on loopback (a push receiver at `/hook`, an OpenAI-compatible
/// upstream at `/v1/chat/completions`) keeping the `traceparent` of each request by path.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Recorder {
    async fn start() -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let server = HttpServer::new(move || {
            let kept = kept.clone();
            App::new().default_service(web::to(move |req: actix_web::HttpRequest| {
                let kept = kept.clone();
                async move {
                    let traceparent = req
                        .headers()
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    kept.lock()
                        .unwrap()
                        .push((req.path().to_owned(), traceparent));
                    if req.path() == "/v1/chat/completions" {
                        let chunk = json!({"choices": [{"index": 0, "delta": {"content": "hi"}}]});
                        HttpResponse::Ok()
                            .content_type("text/event-stream")
                            .body(format!("data: {chunk}\n\ndata: [DONE]\n\n"))
                    } else {
                        HttpResponse::Ok().finish()
                    }
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind");
        let url = format!("http://{}", server.addrs()[0]);
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Recorder { url, seen, handle }
    }

    /// The `traceparent`s sent to `path`.
    fn traceparents(&self, path: &str) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, t)| t.clone())
            .collect()
    }
}

/// The span id a `traceparent` names, checking it belongs to [`TRACE_ID`].
fn parent_in_trace(traceparent: &str) -> String {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent:?}");
    assert_eq!(fields[1], TRACE_ID, "{traceparent}");
    fields[2].to_owned()
}

#[actix_rt::test]
async fn push_deliveries_and_the_openai_backend_carry_the_turns_trace() {
    let collector = Collector::start().await;
    let recorder = Recorder::start().await;
    let server = serve(&collector.url, "pushing", |command| {
        command
            .env("COLLOQUY_AGENT__KIND", "openai")
            .env("COLLOQUY_AGENT__BASE_URL", format!("{}/v1", recorder.url))
            .env("COLLOQUY_AGENT__MODEL", "test-model")
            .env("COLLOQUY_PUSH__ALLOW_PRIVATE_NETWORKS", "true");
    })
    .await;
    let hook = format!("{}/hook", recorder.url);
    let response = send_traced_params(
        &server.url,
        json!({
            "message": text_message("hello"),
            "configuration": {"taskPushNotificationConfig": {"url": hook}},
        }),
    )
    .await;
    assert_eq!(
        response["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{response}"
    );

    let spans = collector
        .wait_for_all(
            TRACE_ID,
            &[
                ("pushing", "turn"),
                ("pushing", "agent.run"),
                ("pushing", "openai"),
            ],
        )
        .await;
    let turn = one(&spans, "pushing", "turn");
    // The upstream was called from the backend's span, within the turn's agent run.
    let openai = one(&spans, "pushing", "openai");
    assert_eq!(openai.parent, one(&spans, "pushing", "agent.run").span_id);
    let upstream = recorder.traceparents("/v1/chat/completions");
    assert_eq!(upstream.len(), 1, "{upstream:?}");
    assert_eq!(parent_in_trace(&upstream[0]), openai.span_id);
    // Each delivery attempt joins the turn's trace, and the receiver gets the attempt's span.
    for _ in 0..100 {
        if !recorder.traceparents("/hook").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered = recorder.traceparents("/hook");
    assert!(!delivered.is_empty(), "the receiver got no notification");
    let parents: Vec<String> = delivered.iter().map(|t| parent_in_trace(t)).collect();
    let spans = collector
        .wait_for(TRACE_ID, |spans| {
            parents
                .iter()
                .all(|parent| spans.iter().any(|s| &s.span_id == parent))
        })
        .await;
    let attempts: Vec<&Received> = spans.iter().filter(|s| s.name == "push.deliver").collect();
    for parent in parents {
        let attempt = spans
            .iter()
            .find(|s| s.span_id == parent)
            .unwrap_or_else(|| panic!("no span {parent} in {attempts:#?}"));
        assert_eq!(attempt.name, "push.deliver");
        assert_eq!(attempt.parent, turn.span_id);
    }
    collector.handle.stop(true).await;
    recorder.handle.stop(true).await;
}

#[actix_rt::test]
async fn colloquy_send_continues_the_trace_it_was_started_in() {
    let collector = Collector::start().await;
    let server = serve(&collector.url, "answering", |_| {}).await;
    // Exporting over gRPC too: its exporter's runtime is let go at exit (once, a panic).
    let (grpc_endpoint, _) = grpc_collector::start().await;
    let home = tempfile::tempdir().expect("tempdir");
    let over_grpc = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(["send", "--to", &server.url, "hello over grpc"])
        .env("COLLOQUY_HOME", home.path())
        .env("COLLOQUY_TELEMETRY__OTLP_ENDPOINT", &grpc_endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("colloquy send runs");
    assert!(over_grpc.status.success(), "{over_grpc:?}");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(["send", "--to", &server.url, "hello from a script"])
        .env("COLLOQUY_HOME", home.path())
        .env("COLLOQUY_TELEMETRY__OTLP_ENDPOINT", &collector.url)
        .env("OTEL_SERVICE_NAME", "sender")
        .env("TRACEPARENT", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("colloquy send runs");
    assert!(output.status.success(), "{output:?}");
    let spans = collector
        .wait_for_all(
            TRACE_ID,
            &[
                ("sender", "send"),
                ("answering", "request"),
                ("answering", "turn"),
            ],
        )
        .await;
    let send = one(&spans, "sender", "send");
    assert_eq!(send.parent, CALLER_SPAN);
    let requests: Vec<&Received> = spans
        .iter()
        .filter(|s| s.service == "answering" && s.name == "request")
        .collect();
    assert!(!requests.is_empty(), "{spans:#?}");
    for request in requests {
        assert_eq!(request.parent, send.span_id, "{request:#?}");
    }

    // Exporting nothing itself (as under an `exec` agent, whose environment names no
    // collector), it passes on the context it was started in, unchanged.
    const OTHER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let passed_on = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(["send", "--to", &server.url, "hello, passed on"])
        .env("COLLOQUY_HOME", home.path())
        .env("TRACEPARENT", format!("00-{OTHER_TRACE}-{CALLER_SPAN}-01"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("colloquy send runs");
    assert!(passed_on.status.success(), "{passed_on:?}");
    let spans = collector
        .wait_for_all(
            OTHER_TRACE,
            &[("answering", "request"), ("answering", "turn")],
        )
        .await;
    assert!(
        spans
            .iter()
            .filter(|s| s.name == "request")
            .all(|s| s.parent == CALLER_SPAN),
        "{spans:#?}"
    );
    collector.handle.stop(true).await;
}

#[actix_rt::test]
async fn a_request_forwarded_to_the_node_running_its_task_stays_in_its_trace() {
    let Some(database) = super::common::pg::database("traces::forwarded") else {
        return;
    };
    let collector = Collector::start().await;
    let env = [
        ("COLLOQUY_TELEMETRY__OTLP_ENDPOINT", collector.url.as_str()),
        (
            "COLLOQUY_CLUSTER__SECRET",
            "shared between the nodes, 32 bytes or more",
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let running = super::cluster::ChildNode::start_with_env(
        &database,
        30,
        3_000,
        &[&env[..], &[("OTEL_SERVICE_NAME", "running")]].concat(),
    )
    .await;
    let asked = super::cluster::ChildNode::start_with_env(
        &database,
        30,
        0,
        &[&env[..], &[("OTEL_SERVICE_NAME", "asked")]].concat(),
    )
    .await;
    let task_id = running.send_immediately("slow", "forwarded").await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}});
    let read: Value = reqwest::Client::new()
        .post(&asked.url)
        .header("A2A-Version", "1.0")
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&body)
        .send()
        .await
        .expect("GetTask")
        .json()
        .await
        .expect("json");
    assert_eq!(
        read["result"]["status"]["state"], "TASK_STATE_WORKING",
        "read live from the node running it: {read}"
    );
    let spans = collector
        .wait_for_all(
            TRACE_ID,
            &[
                ("asked", "request"),
                ("asked", "forward"),
                ("running", "request"),
            ],
        )
        .await;
    let request = one(&spans, "asked", "request");
    assert_eq!(request.parent, CALLER_SPAN);
    let forward = one(&spans, "asked", "forward");
    assert_eq!(forward.parent, request.span_id);
    assert_eq!(forward.attribute("method"), Some("GetTask"));
    let served = one(&spans, "running", "request");
    assert_eq!(served.parent, forward.span_id);
    assert_eq!(served.attribute("method"), Some("GetTask"));
    collector.handle.stop(true).await;
}

/// An OTLP/gRPC collector on loopback, keeping spans as [`Collector`] does.
mod grpc_collector {
    use super::{Received, decode};
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use std::sync::{Arc, Mutex};

    struct Keep(Arc<Mutex<Vec<Received>>>);

    #[tonic::async_trait]
    impl TraceService for Keep {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            self.0.lock().unwrap().extend(decode(request.into_inner()));
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// Its URL, and the spans it got.
    pub(super) async fn start() -> (String, Arc<Mutex<Vec<Received>>>) {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let service = TraceServiceServer::new(Keep(spans.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (url, spans)
    }
}

#[actix_rt::test]
async fn traces_go_over_otlp_grpc_and_a_grpc_call_continues_its_callers_trace() {
    use a2a_pb::proto as pb;
    let (endpoint, spans) = grpc_collector::start().await;
    let grpc_port = free_port();
    let server = serve(&endpoint, "over-grpc", |command| {
        command
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .env("COLLOQUY_GRPC_LISTEN", format!("127.0.0.1:{grpc_port}"));
    })
    .await;
    let mut client =
        pb::a2a_service_client::A2aServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
            .await
            .expect("connects");
    let mut request = tonic::Request::new(pb::SendMessageRequest {
        message: Some(pb::Message {
            message_id: uuid(),
            role: pb::Role::User as i32,
            parts: vec![pb::Part {
                content: Some(pb::part::Content::Text("over gRPC".into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    client.send_message(request).await.expect("sent");
    let mut received = Vec::new();
    for _ in 0..200 {
        received = spans.lock().unwrap().clone();
        if all_of(
            &received,
            &[("over-grpc", "request"), ("over-grpc", "turn")],
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let request = one(&received, "over-grpc", "request");
    assert_eq!(request.trace_id, TRACE_ID);
    assert_eq!(request.parent, CALLER_SPAN);
    assert_eq!(request.attribute("binding"), Some("grpc"));
    assert_eq!(request.attribute("method"), Some("SendMessage"));
    let turn = one(&received, "over-grpc", "turn");
    assert_eq!(turn.parent, request.span_id);
    drop(server);
}

#[actix_rt::test]
async fn json_log_lines_in_a_turn_carry_its_trace_and_span_ids() {
    let collector = Collector::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    // An agent that fails: the turn logs a warning, inside its span.
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(data.path())
        .args([
            "--agent",
            "exec",
            "--",
            "sh",
            "-c",
            "echo broken >&2; exit 3",
        ])
        .env("COLLOQUY_GRPC_LISTEN", "")
        .env("COLLOQUY_LOG_FORMAT", "json")
        .env("COLLOQUY_TELEMETRY__OTLP_ENDPOINT", &collector.url)
        .env("OTEL_SERVICE_NAME", "logging")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("colloquy starts");
    let url = format!("http://127.0.0.1:{port}/");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client.get(format!("{url}healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let answer = send_traced_params(&url, json!({"message": text_message("x")})).await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_FAILED",
        "{answer}"
    );
    let spans = collector
        .wait_for_all(TRACE_ID, &[("logging", "turn"), ("logging", "agent.run")])
        .await;
    let turn = one(&spans, "logging", "turn");
    // The agent's span is failed, with the turn's reason.
    assert!(one(&spans, "logging", "agent.run").failed);
    // SIGTERM: the process ends and its stderr closes.
    let pid = child.id().expect("pid") as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let output = child.wait_with_output().await.expect("exits");
    let logs = String::from_utf8_lossy(&output.stderr);
    let failed = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "the agent failed")
        .unwrap_or_else(|| panic!("no 'the agent failed' line in {logs}"));
    let in_turn = failed["spans"]
        .as_array()
        .and_then(|spans| spans.iter().find(|s| s["name"] == "turn"))
        .unwrap_or_else(|| panic!("the line names its turn: {failed}"));
    assert_eq!(in_turn["trace_id"], TRACE_ID, "{failed}");
    assert_eq!(
        in_turn["span_id"].as_str(),
        Some(turn.span_id.as_str()),
        "{failed}"
    );
    collector.handle.stop(true).await;
}
