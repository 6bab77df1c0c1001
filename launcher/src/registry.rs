//! skiff's container images in the local registry (`cargo xtask images` builds and pushes
//! them; `cargo xtask test` runs it first). Tests that run pods call [`require_images`].

use std::time::Duration;

/// The local registry every test image comes from.
pub const REGISTRY: &str = "127.0.0.1:5000";
/// The echo server (and `fetch` client and test tools): see images/src/bin/echo.rs.
pub const ECHO_IMAGE: &str = "127.0.0.1:5000/skiff/echo:latest";
/// The sandbox image.
pub const PAUSE_IMAGE: &str = "127.0.0.1:5000/skiff/pause:latest";
/// skiff-dns, the cluster DNS (deploy/dns.yaml).
pub const DNS_IMAGE: &str = "127.0.0.1:5000/skiff/dns:latest";
/// Debian's busybox as `docker.io/library/busybox` (the nodes' docker.io mirror is here).
pub const BUSYBOX_IMAGE: &str = "127.0.0.1:5000/library/busybox:latest";

/// The service proxy (deploy/proxy.yaml's DaemonSet): see proxy/ and xtask/src/images.rs.
pub const PROXY_IMAGE: &str = "127.0.0.1:5000/skiff/proxy:latest";
pub const CSI_IMAGE: &str = "127.0.0.1:5000/skiff/csi:latest";

/// Panics with what to run if the registry or the echo or pause image is missing.
pub fn require_images() {
    require_image(ECHO_IMAGE);
    require_image(PAUSE_IMAGE);
}

/// [`require_images`] and the proxy's image (clusters with `Spec::proxy_daemonset`).
pub fn require_proxy_image() {
    require_images();
    require_image(PROXY_IMAGE);
}

/// Panics with what to run if `image` (in the local registry) is missing.
pub fn require_image(image: &str) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let (repo, tag) = image
        .trim_start_matches(&format!("{REGISTRY}/"))
        .split_once(':')
        .expect("image names carry a tag");
    let url = format!("http://{REGISTRY}/v2/{repo}/manifests/{tag}");
    let found = agent
        .head(&url)
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .call()
        .is_ok_and(|r| r.status() == 200);
    assert!(
        found,
        "{image} is not in the local registry: run `cargo xtask images` first"
    );
}
