//! `kubectl-skiff`: kubectl runs it for `kubectl skiff ...` when it is on PATH.
//!
//! `kubectl skiff trace deployment/web [-n NS] [-o table|json]`: each step of the path from
//! the API server's acceptance to every node's service proxy and cluster DNS server, with its
//! time.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use skiff_cli::collect::{self, AddOn, Target};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "kubectl-skiff", about = "skiff's kubectl plugin")]
struct Cli {
    /// The kubeconfig (default: $KUBECONFIG, then ~/.kube/config, as kubectl).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's, then `default`).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The steps of a Deployment's, Service's or Pod's path with their times: accepted,
    /// ReplicaSet and pods created, scheduled, sandbox ready, image pulled, started, Ready,
    /// in the EndpointSlice, programmed into each node's service proxy, name resolvable by
    /// each cluster DNS server.
    Trace {
        /// deployment/NAME, service/NAME or pod/NAME.
        target: Target,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        /// The port of the proxies' status endpoint (`proxy run --status`).
        #[arg(long, default_value_t = AddOn::proxies().port)]
        proxy_port: u16,
        /// The port of the cluster DNS servers' metrics endpoint (`skiff-dns --metrics-listen`).
        #[arg(long, default_value_t = AddOn::dns().port)]
        dns_port: u16,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

async fn client(cli: &Cli) -> Result<(kube::Client, String)> {
    let options = kube::config::KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((kube::Client::try_from(config)?, namespace))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (client, namespace) = client(&cli).await?;
        match &cli.command {
            Command::Trace {
                target,
                output,
                proxy_port,
                dns_port,
            } => {
                let proxies = AddOn {
                    port: *proxy_port,
                    ..AddOn::proxies()
                };
                let dns = AddOn {
                    port: *dns_port,
                    ..AddOn::dns()
                };
                let trace = collect::trace(client, &namespace, target, &proxies, &dns).await?;
                match output {
                    Output::Table => print!("{}", trace.table()),
                    Output::Json => println!("{}", serde_json::to_string_pretty(&trace)?),
                }
            }
        }
        Ok(())
    })
}
