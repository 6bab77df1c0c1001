//! The pod sandbox's placeholder process: holds the pod's namespaces, reaps zombies, and
//! exits on SIGTERM/SIGINT.

fn main() {
    skiff_images::signals::exit_on_term();
    skiff_images::signals::reap_children();
    loop {
        // SAFETY: pause(2) only blocks until a signal arrives.
        unsafe {
            libc::pause();
        }
    }
}
