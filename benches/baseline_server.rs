//! The baseline for `colloquy loadgen`: a minimal actix-web JSON-RPC handler that answers
//! `SendMessage` (and v0.3 `message/send`) with a completed task echoing the text, and does
//! nothing else: no actors, no store, no history. What the HTTP stack alone costs on this machine.
//!
//! ```text
//! cargo bench --bench baseline_server -- --listen 127.0.0.1:8090 [--workers N]
//! ```
//! Workers default to one per core, as `colloquy serve` does. Stops on SIGINT / SIGTERM.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

fn task(v1: bool, context_id: &str, text: &str) -> Value {
    let id = uuid::Uuid::new_v4().to_string();
    let now = chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let reply = format!("echo: {text} (turn 1)");
    if v1 {
        json!({"task": {
            "id": id,
            "contextId": context_id,
            "status": {"state": "TASK_STATE_COMPLETED", "timestamp": now},
            "artifacts": [{"artifactId": format!("{id}-reply"), "parts": [{"text": reply}]}],
        }})
    } else {
        json!({
            "kind": "task",
            "id": id,
            "contextId": context_id,
            "status": {"state": "completed", "timestamp": now},
            "artifacts": [{"artifactId": format!("{id}-reply"), "parts": [{"kind": "text", "text": reply}]}],
        })
    }
}

async fn rpc(request: HttpRequest, body: web::Json<Value>) -> HttpResponse {
    let v1 = request
        .headers()
        .get("A2A-Version")
        .and_then(|v| v.to_str().ok())
        == Some("1.0");
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    let method = body.get("method").and_then(Value::as_str).unwrap_or("");
    if method != "SendMessage" && method != "message/send" {
        return HttpResponse::Ok().json(json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32601, "message": "method not found"}}));
    }
    let message = &body["params"]["message"];
    let text: String = message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect();
    let context_id = match message.get("contextId").and_then(Value::as_str) {
        Some(c) => c.to_owned(),
        None => format!("ctx-{:032x}", rand::random::<u128>()),
    };
    HttpResponse::Ok()
        .json(json!({"jsonrpc": "2.0", "id": id, "result": task(v1, &context_id, &text)}))
}

fn main() -> std::io::Result<()> {
    let mut listen = "127.0.0.1:8090".to_owned();
    let mut workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().unwrap_or(listen),
            "--workers" => workers = args.next().and_then(|w| w.parse().ok()).unwrap_or(workers),
            // `cargo bench` passes `--bench`; anything else is ignored too.
            _ => {}
        }
    }
    let loopback = listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback());
    if !loopback {
        eprintln!("baseline_server: listen on a loopback address only, not {listen}");
        std::process::exit(2);
    }
    actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(|| {
            App::new()
                .app_data(web::JsonConfig::default().limit(1024 * 1024))
                .route("/", web::post().to(rpc))
        })
        .workers(workers)
        .bind(&listen)?;
        eprintln!("baseline_server listening on http://{listen}/ with {workers} workers");
        server.run().await
    })
}
