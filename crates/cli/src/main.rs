//! The `ubik` command.

mod args;

/// mimalloc keeps freed batch buffers for the next batch instead of returning them to
/// the kernel and paying for fresh zeroed pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod metrics;
mod pipeline_file;
mod settings;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Parser;
use ubik_engine::EngineError;
use ubik_runtime::runner::{RunEnd, RunOptions, run_to_sink};
use ubik_runtime::{
    Endpoint, ErrorClass, Opened, PipelineSpec, RuntimeError, SinkSpec, SourceSpec,
};

use args::{Cli, Command, ValidateArgs};
use settings::RunSettings;
use ubik_runtime::progress::{self, Total};

/// Exit code for a query or configuration the user must fix.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    // Large frees go back to the kernel at once: mimalloc would keep them
    // for a second, past the memory budget (see `ubik_state::memory`).
    ubik_state::memory::release_with_mimalloc();
    let cli = Cli::parse();
    init_logging(&cli.log);
    let result = match cli.command {
        Command::Run(args) => settings::run_settings(*args).and_then(|s| {
            let origin = s.query_origin.clone();
            run(s).map_err(|e| settings::in_query_file(e, origin.as_ref()))
        }),
        Command::Validate(args) => validate(*args),
        Command::Status(args) => status(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// 2 for anything the user must fix in the query or configuration, 1 otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    let class = e.chain().find_map(|cause| {
        if let Some(r) = cause.downcast_ref::<RuntimeError>() {
            return Some(r.class());
        }
        if let Some(e) = cause.downcast_ref::<EngineError>() {
            return Some(ErrorClass::of_engine(e));
        }
        cause
            .downcast_ref::<ubik_format::FormatError>()
            .map(|_| ErrorClass::Schema)
    });
    if class.is_some_and(ErrorClass::is_usage) {
        EXIT_USAGE
    } else {
        1
    }
}

fn run(settings: RunSettings) -> Result<()> {
    let RunSettings {
        spec,
        metrics: metrics_addr,
        quiet,
        ..
    } = settings;
    let total = Total::of(&spec, false);
    let checkpointed = spec.checkpoint.is_some();
    let commit_interval = if checkpointed {
        spec.settings.checkpoint_interval
    } else {
        Duration::from_secs(1)
    };
    let commit_records = spec.settings.checkpoint_every;
    let to_kafka = matches!(spec.sink, SinkSpec::Kafka(_));
    let metrics = metrics::Metrics::default();
    if let Some(addr) = &metrics_addr {
        metrics.serve(addr)?;
    }
    let stop = stop_flag()?;
    // A status page or a terminal shows figures every second; log lines
    // come every 5 s (the progress reporter spaces them).
    let report_every = Duration::from_secs(
        if metrics_addr.is_some() || std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            1
        } else {
            5
        },
    );
    let sql = spec.sql.clone();
    if let Some(group) = &spec.group {
        tracing::info!(group = group.name, "running as a consumer group member");
        metrics.set_plan(serde_json::json!({
            "sql": sql,
            "sources": spec.sources.iter().map(|s| format!("{:?}", s.endpoint)).collect::<Vec<_>>(),
            "kind": format!("consumer group {}", group.name),
        }));
        let mut progress = progress::Progress::new(quiet, None);
        let mut last = None;
        let mut report = |s: &ubik_runtime::Stats| {
            metrics.update(s);
            progress.report(s);
            last = Some(s.clone());
        };
        let end = ubik_runtime::group::run_group(
            &spec,
            RunOptions {
                commit_interval,
                commit_records,
                stop: &stop,
                report: &mut report,
                report_every,
            },
        )?;
        if let Some(s) = &last {
            progress::Progress::new(quiet, None).finish(s, end == RunEnd::Finished);
        }
        if end == RunEnd::Stopped {
            tracing::info!("left the group: every task committed and checkpointed");
        }
        return Ok(());
    }
    let Opened {
        mut pipeline,
        mut sink,
        encoder,
    } = ubik_runtime::open(spec)?;
    if to_kafka && !checkpointed {
        tracing::warn!("no --checkpoint: a restart reprocesses the input from its start offsets");
    }
    tracing::info!(
        source = pipeline.source_name(),
        sink = sink.describe(),
        kind = pipeline.plan().kind_name(),
        key = ?pipeline.plan().key_names(),
        "running"
    );
    metrics.set_plan(serde_json::json!({
        "sql": sql,
        "sources": pipeline.plan().sources.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        "kind": pipeline.plan().kind_name(),
        "key": pipeline.plan().key_names(),
        "sink": sink.describe(),
    }));

    let mut progress = progress::Progress::new(quiet, total);
    let mut report = |s: &ubik_runtime::Stats| {
        metrics.update(s);
        progress.report(s);
    };
    let end = run_to_sink(
        &mut pipeline,
        sink.as_mut(),
        encoder,
        RunOptions {
            commit_interval,
            commit_records,
            stop: &stop,
            report: &mut report,
            report_every,
        },
    )?;
    sink.close()?;
    progress.finish(&pipeline.stats, end == RunEnd::Finished);
    if end == RunEnd::Stopped {
        tracing::info!("drained: output committed and checkpointed");
    }
    Ok(())
}

fn status(args: args::StatusArgs) -> Result<()> {
    let kafka = settings::property_flags(&args.kafka_property)?;
    print!(
        "{}",
        ubik_runtime::group::status(&args.from, &args.group, &kafka)?
    );
    Ok(())
}

/// Set by SIGTERM/SIGINT: stop cleanly; a second signal exits at once.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    Ok(stop)
}

fn validate(args: ValidateArgs) -> Result<()> {
    let file = settings::load_file(&args.query)?;
    let sql = settings::resolve_sql(&args.query, &file)?;
    // Without a source a schema stands alone: the table is the one the query reads.
    let sources = settings::source_specs(&args.from, &args.query.schema, None, &file, true)?;
    if sources.is_empty() {
        return Err(anyhow!(
            "validate needs the input schema: --schema \"col TYPE, ...\" (or @schema.json, or NAME=... per source), or --from URL to read it from the source"
        ));
    }
    let mut spec = PipelineSpec::new(sql, SourceSpec::new(Endpoint::Stdin));
    spec.sources = sources;
    spec.settings = settings::query_settings(&args.query, &file)?;
    let origin = settings::query_origin(&args.query, &file);
    let plan = ubik_runtime::validate(spec)
        .map_err(|e| settings::in_query_file(e.into(), origin.as_ref()))?;
    if args.json {
        let fields: Vec<serde_json::Value> = plan
            .output_schema
            .fields()
            .iter()
            .map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"source": plan.sources[0].name, "sources": plan.sources.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), "reads": plan.sources.iter().map(|s| (s.name.clone(), serde_json::json!(s.read_names()))).collect::<serde_json::Map<_, _>>(), "kind": plan.kind_name(), "schema": fields, "key": plan.key_names()})
        );
    } else {
        println!("{plan}");
        println!("{}", ubik_runtime::group::describe_stages(&plan));
    }
    Ok(())
}
