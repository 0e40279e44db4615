//! The worker: registers the workflow (idempotent by content: a restart
//! with the same definition registers nothing new) and runs its steps.
//!
//!     composer dev                  # in one terminal
//!     cargo run                     # in another
//!     composer run start greet --input '{"name": "Ada"}' --wait

mod workflow;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("COMPOSER_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let api_token = std::env::var("COMPOSER_API_TOKEN").ok().filter(|t| !t.is_empty());
    let wf = workflow::workflow();
    let registered = composer_worker::workflow::register(&url, api_token.as_deref(), &wf.definition(), None).await?;
    println!("workflow greet is version {} (new: {})", registered.version, registered.created);
    // COMPOSER_URL and COMPOSER_WORKER_TOKEN, as every worker reads them.
    let mut worker = composer_worker::Worker::new(composer_worker::Config::from_env()?);
    wf.install(&mut worker);
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    worker.run(stop).await?;
    Ok(())
}
