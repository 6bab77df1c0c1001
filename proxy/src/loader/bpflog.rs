//! Kernel-side logging (`proxy run --bpf-log`): the programs' aya-log records, read from
//! their ring buffer as it becomes readable and written to this process's tracing log
//! (target `skiff_proxy::bpf`, at info: whoever passes the flag wants to see them). Without
//! the flag the loader sets aya-log's level constant to 0, the verifier removes every log
//! statement as dead code, and nothing here runs.

use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// aya-log hands records to a `log::Log`; this one forwards them to tracing.
pub struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        tracing::info!(target: "skiff_proxy::bpf", level = %record.level(), "{}", record.args());
    }

    fn flush(&self) {}
}

/// The programs' log, ready to be drained.
pub type KernelLog = EbpfLogger<ToTracing>;

/// Drains the ring buffer whenever the kernel signals records, until the process ends.
pub fn spawn(log: KernelLog) -> std::io::Result<tokio::task::JoinHandle<()>> {
    // SAFETY: the logger owns its ring buffer's file descriptor, which stays open and the
    // same for as long as the logger lives, and the AsyncFd owns the logger.
    let mut fd = unsafe { AsyncFd::register_with_interest(log, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut ready) = fd.readable_mut().await else {
                tracing::warn!("kernel log: the ring buffer is no longer readable");
                return;
            };
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    }))
}
