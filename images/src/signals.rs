//! Signal dispositions for processes that run as PID 1 in a container, where the kernel
//! ignores any signal without a handler: SIGTERM must be handled explicitly to stop.

/// Exit at once (status 0) on SIGTERM and SIGINT.
pub fn exit_on_term() {
    extern "C" fn exit_now(_: libc::c_int) {
        // Only async-signal-safe calls in a handler.
        unsafe { libc::_exit(0) }
    }
    let handler = exit_now as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installing a handler that only calls the async-signal-safe _exit.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// Ignore SIGTERM (for tests of graceful termination: only SIGKILL stops the process).
pub fn ignore_term() {
    // SAFETY: SIG_IGN is always a valid disposition.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}

/// Reap every exited child without blocking (the pause process is the pod's init).
pub fn reap_children() {
    extern "C" fn reap(_: libc::c_int) {
        // SAFETY: waitpid is async-signal-safe.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }
    let handler = reap as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only calls waitpid.
    unsafe {
        libc::signal(libc::SIGCHLD, handler);
    }
}
