//! The mentis-executor binary: reads its config, hides its token, serves until SIGTERM / SIGINT.
//! `mentis-executor launch -- PROGRAM ARGS...` is the container's entrypoint (see `launch`);
//! `mentis-executor install DIR` puts the executor and tini into DIR/bin (the volume of `/.mentis`).

use anyhow::Context as _;
use mentis_executor::{Config, TOKEN_ENV, identity, launch, threads};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [launch, dashes, program, rest @ ..] if launch == "launch" && dashes == "--" => {
            let e = launch::launch(program, rest);
            eprintln!("mentis-executor launch: {e}");
            std::process::exit(2);
        }
        [launch, ..] if launch == "launch" => {
            eprintln!("usage: mentis-executor launch -- PROGRAM [ARGS...]");
            std::process::exit(2);
        }
        [install, dir] if install == "install" => match launch::install(dir.as_ref()) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("mentis-executor install: {e}");
                std::process::exit(1);
            }
        },
        [install, ..] if install == "install" => {
            eprintln!("usage: mentis-executor install DIR");
            std::process::exit(2);
        }
        _ => {}
    }
    let from_fd = match launch::take_token_from_fd() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("mentis-executor: {e}");
            std::process::exit(2);
        }
    };
    let mut config = match Config::from_lookup(|name| match name {
        TOKEN_ENV if from_fd.is_some() => from_fd.clone(),
        _ => std::env::var(name).ok(),
    }) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("mentis-executor: {e}");
            std::process::exit(2);
        }
    };
    // User code runs as the sandbox user and the executor keeps root as its real and saved uid, so user
    // code cannot signal or trace it (see identity). Process-wide: before any thread starts.
    if let Err(e) = identity::become_supervisor(|name| std::env::var(name).ok(), &config.workspace)
    {
        eprintln!("mentis-executor: {e}");
        std::process::exit(2);
    }
    // The container's layout (launch execs tini, PID 1, which starts us): every other process there but
    // tini is user code, which a reclaim at the pids limit may kill.
    config.reclaim_all = from_fd.is_some() && nix::unistd::getppid().as_raw() == 1;
    hide_token();

    let format = match mentis_telemetry::LogFormat::from_env() {
        Ok(format) => format,
        Err(e) => {
            eprintln!("mentis-executor: {e}");
            std::process::exit(2);
        }
    };
    // Traces, when the runtime asks for them: spans wait in a buffer the runtime empties (TakeSpans), and
    // each trace is sampled or not as the runtime decided (the parent's flag).
    let provider = config.traces.then(|| {
        let buffer = mentis_telemetry::SpanBuffer::new(mentis_executor::SPAN_BUFFER);
        config.spans = Some(buffer.clone());
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_sampler(opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
                opentelemetry_sdk::trace::Sampler::AlwaysOff,
            )))
            .with_resource(
                opentelemetry_sdk::Resource::builder_empty()
                    .with_service_name("mentis-executor")
                    .build(),
            )
            .with_simple_exporter(buffer)
            .build()
    });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if let Err(e) = mentis_telemetry::install(filter, format, provider.as_ref(), "mentis-executor")
    {
        eprintln!("mentis-executor: cannot install the log subscriber: {e}");
        std::process::exit(2);
    }

    // Every thread the executor needs starts here, before user code can fill the pids limit.
    let runtime = threads::runtime().context("building the tokio runtime")?;
    runtime.block_on(run(config))
}

/// Keeps the token away from the commands we run, which execute as the same user as we do.
fn hide_token() {
    // SAFETY: called at the top of main, before the tokio runtime or anything else starts a thread, so no
    // other thread can be reading the environment concurrently (the reason remove_var is unsafe).
    #[allow(unsafe_code)]
    unsafe {
        std::env::remove_var(TOKEN_ENV);
        std::env::remove_var(launch::TOKEN_FD_ENV);
    }
    // remove_var does not touch /proc/self/environ (the initial env block), which processes of the same
    // user can read. A non-dumpable process's /proc files belong to root, closing that door. Commands we
    // spawn become dumpable again at exec, so this does not affect them.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("mentis-executor: warning: cannot mark the process non-dumpable: {e}");
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let shutdown = CancellationToken::new();
    // The signals are watched beside the server, in this task: the first one stops it.
    let serving = mentis_executor::serve(config, listener, shutdown.clone());
    tokio::pin!(serving);
    let served = tokio::select! {
        served = &mut serving => served,
        () = stop_on_signal(shutdown).instrument(tracing::info_span!("signals")) => serving.await,
    };
    served.context("serving")?;
    Ok(())
}

/// Cancels `shutdown` at SIGTERM (what tini forwards from `docker stop`) or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot listen for signals; stop with SIGKILL");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}
