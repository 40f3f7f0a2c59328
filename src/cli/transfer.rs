//! `colloquy export` and `colloquy import`: conversations, messages and tasks as JSON lines,
//! to move a store's contents to another store (sled to PostgreSQL, say).
//!
//! The format (version 1): the first line is a header,
//! `{"kind":"header","format":"colloquy-export","version":1}`; then each conversation as a
//! `conversation` line followed by its `message` lines (in sequence order, without gaps) and its
//! `task` lines (task-id order). Records keep colloquy's stored shapes (snake_case fields), and
//! every line names its conversation's principal and contextId. Conversations come in key order,
//! so two exports of the same contents are the same bytes.

use super::CliError;
use super::store_commands::{load_config, open_store, wait};
use crate::engine::{EngineError, MessageLimits, check_context_id, check_sizes};
use crate::model::Role;
use crate::model::{Message, Task};
use crate::store::{
    ConversationKey, ConversationMeta, ConversationRecords, Imported, SharedStore, TaskRecords,
};
use chrono::{DateTime, Utc};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

const FORMAT: &str = "colloquy-export";
/// The newest line format this build writes and reads.
const FORMAT_VERSION: u32 = 1;
/// Conversations read from the store per page on export.
const EXPORT_PAGE: usize = 64;
/// Records written to the store per atomic import write (a conversation is never split).
const IMPORT_BATCH_RECORDS: usize = 10_000;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Only this principal's conversations (default: every principal's).
    #[arg(long)]
    principal: Option<String>,
    /// With --principal: that principal's conversations in this tenant (default: the default
    /// tenant). Conversations in a tenant are written with the principal `PRINCIPAL\u001fTENANT`.
    #[arg(long, requires = "principal")]
    tenant: Option<String>,
    /// Write to FILE instead of stdout.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Data folder (default: from the config, else ./colloquy-data); ignored with store.url.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Read from FILE instead of stdin.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Data folder, created if missing (default: from the config, else ./colloquy-data);
    /// ignored with store.url.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long)]
    config: Option<PathBuf>,
}

/// One line of an export.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum Line {
    Header {
        format: String,
        version: u32,
    },
    #[serde(rename_all = "camelCase")]
    Conversation {
        principal: String,
        context_id: String,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        turns: u64,
        next_seq: u64,
        token: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        running_task: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_state: Option<serde_json::Value>,
    },
    #[serde(rename_all = "camelCase")]
    Message {
        principal: String,
        context_id: String,
        seq: u64,
        message: Message,
    },
    #[serde(rename_all = "camelCase")]
    Task {
        principal: String,
        context_id: String,
        history_seqs: Vec<u64>,
        task: Task,
    },
}

fn conversation_line(meta: &ConversationMeta) -> Line {
    Line::Conversation {
        principal: meta.principal.clone(),
        context_id: meta.context_id.clone(),
        created_at: meta.created_at,
        updated_at: meta.updated_at,
        turns: meta.turns,
        next_seq: meta.next_seq,
        token: meta.token,
        running_task: meta.running_task.clone(),
        agent_state: meta.agent_state.clone(),
    }
}

fn write_line(out: &mut impl Write, line: &Line) -> Result<(), CliError> {
    // Our own plain data types always serialise.
    let json = serde_json::to_string(line)?;
    writeln!(out, "{json}").map_err(CliError::Write)
}

fn write_conversation(out: &mut impl Write, item: ConversationRecords) -> Result<(), CliError> {
    let meta = &item.meta;
    write_line(out, &conversation_line(meta))?;
    for (offset, message) in item.messages.into_iter().enumerate() {
        let line = Line::Message {
            principal: meta.principal.clone(),
            context_id: meta.context_id.clone(),
            seq: item.first_seq + offset as u64,
            message,
        };
        write_line(out, &line)?;
    }
    for record in item.tasks {
        let line = Line::Task {
            principal: meta.principal.clone(),
            context_id: meta.context_id.clone(),
            history_seqs: record.history_seqs,
            task: record.task,
        };
        write_line(out, &line)?;
    }
    Ok(())
}

pub fn export(args: ExportArgs) -> Result<ExitCode, CliError> {
    let store = open_store(
        &load_config(args.config.as_deref())?,
        args.data.clone(),
        false,
    )?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|source| CliError::File {
                path: path.display().to_string(),
                source,
            })?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let header = Line::Header {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
    };
    write_line(&mut out, &header)?;
    let principal = args
        .principal
        .as_deref()
        .map(|principal| crate::model::principal_in_tenant(principal, args.tenant.as_deref()));
    let mut after: Option<ConversationKey> = None;
    let mut exported = 0usize;
    loop {
        let page = wait(store.export_conversations(principal.clone(), after, EXPORT_PAGE))?;
        let Some(last) = page.last() else { break };
        after = Some(last.meta.key());
        exported += page.len();
        for item in page {
            write_conversation(&mut out, item)?;
        }
    }
    out.flush().map_err(CliError::Write)?;
    eprintln!("exported {exported} conversations");
    Ok(ExitCode::SUCCESS)
}

pub fn import(args: ImportArgs) -> Result<ExitCode, CliError> {
    let input: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(std::io::BufReader::new(std::fs::File::open(path).map_err(
            |source| CliError::File {
                path: path.display().to_string(),
                source,
            },
        )?)),
        None => Box::new(std::io::BufReader::new(std::io::stdin().lock())),
    };
    let config = load_config(args.config.as_deref())?;
    let store = open_store(&config, args.data.clone(), true)?;
    let limits = RecordLimits {
        message: crate::app::message_limits(&config),
        response_bytes: config.limits.response_bytes,
    };
    let mut importer = Importer {
        store,
        batch: Vec::new(),
        records: 0,
        done: Imported::default(),
    };
    let result = read_lines(input, &limits, &mut importer).and_then(|()| importer.flush());
    let done = importer.done;
    eprintln!(
        "imported {} conversations ({} already stored, left as they were)",
        done.conversations, done.skipped
    );
    result?;
    Ok(ExitCode::SUCCESS)
}

/// What an imported record may hold: what the wire lets a caller and an agent store, so an
/// import never holds what no request could have written.
struct RecordLimits {
    message: MessageLimits,
    /// An agent's reply (`limits.response_bytes`).
    response_bytes: usize,
}

impl RecordLimits {
    fn check_message(&self, message: &Message) -> Result<(), EngineError> {
        let (limits, text_bytes) = match message.role {
            Role::User => (self.message, self.message.text_bytes),
            // A reply is bounded as the agent's output is: by its text, not a caller's part count.
            _ => (
                MessageLimits {
                    parts: usize::MAX,
                    ..self.message
                },
                self.response_bytes,
            ),
        };
        check_sizes(message, &limits, text_bytes)
    }

    fn check_task(&self, task: &Task) -> Result<(), LineError> {
        if task.id.is_empty() || task.id.len() > self.message.id_bytes {
            return Err(LineError::TaskId(self.message.id_bytes));
        }
        Ok(check_context_id(&task.context_id, &self.message)?)
    }
}

/// Reads the header and then every record, handing each whole conversation to the importer.
fn read_lines(
    input: impl BufRead,
    limits: &RecordLimits,
    importer: &mut Importer,
) -> Result<(), CliError> {
    let mut lines = input.lines().enumerate();
    let at = |n: usize| {
        move |source: LineError| ImportError::Line {
            line: n + 1,
            source,
        }
    };
    let parse = |n: usize, text: std::io::Result<String>| -> Result<Line, ImportError> {
        let text = text.map_err(|e| at(n)(LineError::Read(e)))?;
        serde_json::from_str(&text).map_err(|e| at(n)(LineError::Json(e)))
    };
    match lines.next() {
        Some((n, text)) => match parse(n, text)? {
            Line::Header { format, version } if format == FORMAT => {
                if version > FORMAT_VERSION {
                    return Err(ImportError::NewerFormat(version).into());
                }
            }
            _ => return Err(at(n)(LineError::NotHeader).into()),
        },
        None => return Err(ImportError::Empty.into()),
    }
    let mut current: Option<ConversationRecords> = None;
    for (n, text) in lines {
        if text.as_ref().is_ok_and(|text| text.trim().is_empty()) {
            continue;
        }
        match parse(n, text)? {
            Line::Header { .. } => return Err(at(n)(LineError::SecondHeader).into()),
            Line::Conversation {
                principal,
                context_id,
                created_at,
                updated_at,
                turns,
                next_seq,
                token,
                running_task,
                agent_state,
            } => {
                if let Some(done) = current.take() {
                    importer.add(done)?;
                }
                check_context_id(&context_id, &limits.message)
                    .map_err(|e| at(n)(LineError::Invalid(e)))?;
                current = Some(ConversationRecords {
                    meta: ConversationMeta {
                        context_id,
                        principal,
                        created_at,
                        updated_at,
                        turns,
                        next_seq,
                        running_task,
                        token,
                        agent_state,
                    },
                    first_seq: 0,
                    messages: Vec::new(),
                    tasks: Vec::new(),
                });
            }
            Line::Message {
                principal,
                context_id,
                seq,
                message,
            } => {
                let item = of_current(&mut current, &principal, &context_id).map_err(at(n))?;
                if item.messages.is_empty() {
                    item.first_seq = seq;
                }
                if seq != item.first_seq + item.messages.len() as u64 {
                    return Err(at(n)(LineError::OutOfSequence(seq)).into());
                }
                limits
                    .check_message(&message)
                    .map_err(|source| at(n)(LineError::Message { seq, source }))?;
                item.messages.push(message);
            }
            Line::Task {
                principal,
                context_id,
                history_seqs,
                task,
            } => {
                let item = of_current(&mut current, &principal, &context_id).map_err(at(n))?;
                limits.check_task(&task).map_err(at(n))?;
                item.tasks.push(TaskRecords {
                    task,
                    stream: None,
                    history_seqs,
                });
            }
        }
    }
    if let Some(done) = current {
        importer.add(done)?;
    }
    Ok(())
}

/// The conversation being read, if the record names it.
fn of_current<'a>(
    current: &'a mut Option<ConversationRecords>,
    principal: &str,
    context_id: &str,
) -> Result<&'a mut ConversationRecords, LineError> {
    match current {
        Some(item) if item.meta.principal == principal && item.meta.context_id == context_id => {
            Ok(item)
        }
        _ => Err(LineError::Outside {
            principal: principal.to_owned(),
            context_id: context_id.to_owned(),
        }),
    }
}

/// Why an import stopped.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("line {line}: {source}")]
    Line { line: usize, source: LineError },
    #[error(
        "the export is format version {0}, newer than this colloquy reads ({FORMAT_VERSION}): \
         use a newer colloquy"
    )]
    NewerFormat(u32),
    #[error("the input is empty (no header line)")]
    Empty,
}

/// What is wrong with one line of an export.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error(transparent)]
    Read(std::io::Error),
    #[error(transparent)]
    Json(serde_json::Error),
    #[error("not a {FORMAT} header")]
    NotHeader,
    #[error("a second header")]
    SecondHeader,
    #[error("message {0} out of sequence")]
    OutOfSequence(u64),
    #[error("message {seq}: {source}")]
    Message { seq: u64, source: EngineError },
    #[error("task id: must be 1 to {0} bytes")]
    TaskId(usize),
    #[error(transparent)]
    Invalid(#[from] EngineError),
    #[error("a record of conversation {context_id:?} ({principal:?}) outside its conversation")]
    Outside {
        principal: String,
        context_id: String,
    },
}

/// Collects whole conversations into atomic writes of about [`IMPORT_BATCH_RECORDS`].
struct Importer {
    store: SharedStore,
    batch: Vec<ConversationRecords>,
    records: usize,
    done: Imported,
}

impl Importer {
    fn add(&mut self, item: ConversationRecords) -> Result<(), CliError> {
        self.records += 1 + item.messages.len() + item.tasks.len();
        self.batch.push(item);
        if self.records >= IMPORT_BATCH_RECORDS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), CliError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        self.records = 0;
        let imported = wait(self.store.import_conversations(batch))?;
        self.done.conversations += imported.conversations;
        self.done.skipped += imported.skipped;
        Ok(())
    }
}
