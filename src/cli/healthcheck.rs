//! `colloquy healthcheck`: asks a running server's `/healthz` and exits 0 only on 200, so a
//! container's `HEALTHCHECK` needs nothing in the image but the binary (no curl).

use super::CliError;
use crate::config::Config;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct HealthcheckArgs {
    /// The server's base URL [default: from the configuration's `listen` (file, then
    /// COLLOQUY_LISTEN), with an unspecified address (0.0.0.0, [::]) asked on loopback].
    #[arg(long)]
    url: Option<String>,
    /// TOML configuration file (read for `listen` only).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    timeout_secs: u64,
}

/// The URL a local client reaches a server listening on `listen` at: an unspecified host
/// (`0.0.0.0`, `[::]`, empty) becomes the loopback address of its family.
pub fn local_url(listen: &str) -> String {
    let listen = listen.trim();
    let (host, port) = listen.rsplit_once(':').unwrap_or((listen, "8080"));
    let host = match host {
        "" | "0.0.0.0" => "127.0.0.1",
        "[::]" | "::" => "[::1]",
        other => other,
    };
    format!("http://{host}:{port}/")
}

pub fn run(args: HealthcheckArgs) -> Result<ExitCode, CliError> {
    let base = match args.url {
        Some(url) => url,
        None => {
            let config = Config::load(args.config.as_deref(), serde_json::json!({}))?;
            local_url(&config.listen)
        }
    };
    let url = format!("{}/healthz", base.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    let status = runtime.block_on(async {
        // The server is local: never through an HTTP_PROXY the environment names.
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .build()
            .map_err(CliError::HttpClient)?;
        let response = client
            .get(&url)
            .send()
            .await
            .map_err(|source| CliError::Request {
                url: url.clone(),
                source,
            })?;
        Ok::<_, CliError>(response.status())
    })?;
    if status.is_success() {
        println!("{url}: {status}");
        Ok(ExitCode::SUCCESS)
    } else {
        Err(CliError::Refused(format!("{url}: {status}")))
    }
}

#[cfg(test)]
mod tests {
    use super::local_url;

    #[test]
    fn unspecified_addresses_are_asked_on_loopback() {
        assert_eq!(local_url("0.0.0.0:8080"), "http://127.0.0.1:8080/");
        assert_eq!(local_url("[::]:9000"), "http://[::1]:9000/");
        assert_eq!(local_url("127.0.0.1:4000"), "http://127.0.0.1:4000/");
        assert_eq!(local_url("node-a:8080"), "http://node-a:8080/");
    }
}
