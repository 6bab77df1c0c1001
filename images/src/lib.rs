//! skiff-images: the small programs that skiff ships as container images.
//!
//! - `echo`: an HTTP/1.1 server (std only, thread per connection) that answers with the pod's
//!   identity from the downward API environment (else its host name, service account
//!   namespace and interface address) and the client address it sees, plus subcommands that tests and demos run
//!   inside pods (`fetch URL`, `cat`, `write`, `alloc`, `exit`, ...).
//!   `webhook` is a sidecar-injecting mutating admission webhook over HTTPS; `incluster`
//!   calls the API as an in-cluster client (see `incluster`).
//! - `pause`: the sandbox's placeholder process: sleeps, reaps zombies, exits on SIGTERM.
//!
//! The library holds the pure parts (HTTP parsing, the answer format) so they are unit-tested.

pub mod http;
pub mod identity;
pub mod incluster;
pub mod signals;
pub mod webhook;
