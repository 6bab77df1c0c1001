//! The real kubectl against a test's own API server process.

use std::path::Path;

pub use skiff_launcher::kubectl::*;

/// A `control-plane apiserver` process with a kubectl bound to it and a scratch directory
/// (kubectl's HOME, files a test writes), all removed on Drop.
pub struct ServerFixture {
    pub server: crate::apiserver::ApiServerProcess,
    pub k: Kubectl,
    pub dir: tempfile::TempDir,
}

impl ServerFixture {
    /// Starts `binary apiserver` with `extra_args` in a fresh directory.
    pub fn start(binary: &Path, extra_args: &[&str]) -> ServerFixture {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let server =
            crate::apiserver::ApiServerProcess::start(binary, &dir.path().join("data"), extra_args);
        let k = Kubectl::new(&server.kubeconfig(), dir.path());
        ServerFixture { server, k, dir }
    }

    /// Writes `content` to `name` in the scratch directory; returns its path.
    pub fn file(&self, name: &str, content: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("writing a test file");
        path.to_string_lossy().into_owned()
    }
}
