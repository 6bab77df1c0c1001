//! Image pulls as `imagePullPolicy` asks, with the kubelet's events (Pulling, Pulled,
//! Failed, ErrImageNeverPull).

use super::events::Reason;
use crate::cri::Cri;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy; unset means Always for `:latest` or untagged images, else
    /// IfNotPresent (the API server's defaulting rule).
    pub fn of(c: &Container) -> PullPolicy {
        match c.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ => {
                let image = c.image.as_deref().unwrap_or_default();
                let last = image.rsplit('/').next().unwrap_or_default();
                if image.contains('@') || (last.contains(':') && !last.ends_with(":latest")) {
                    PullPolicy::IfNotPresent
                } else {
                    PullPolicy::Always
                }
            }
        }
    }
}

/// Why an image is not available (the container's waiting reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullError {
    /// The pull failed: ErrImagePull, then ImagePullBackOff while waiting to retry.
    Failed(String),
    /// Policy Never and the image is absent.
    NeverPull(String),
}

/// Makes the image available; returns the image reference for status.imageID. `emit`
/// receives the events to report.
pub async fn ensure(
    cri: &Cri,
    image: &str,
    policy: PullPolicy,
    sandbox: &cri::PodSandboxConfig,
    mut emit: impl FnMut(Reason, String),
) -> Result<String, PullError> {
    if policy != PullPolicy::Always {
        let present = cri
            .image_id(image)
            .await
            .map_err(|e| PullError::Failed(e.message()))?;
        match (present, policy) {
            (Some(id), _) => {
                emit(
                    Reason::Pulled,
                    format!("Container image \"{image}\" already present on machine"),
                );
                return Ok(id);
            }
            (None, PullPolicy::Never) => {
                let msg =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                emit(Reason::ErrImageNeverPull, msg.clone());
                return Err(PullError::NeverPull(msg));
            }
            (None, _) => {}
        }
    }
    emit(Reason::Pulling, format!("Pulling image \"{image}\""));
    let started = Instant::now();
    match cri.pull_image(image, Some(sandbox.clone())).await {
        Ok(image_ref) => {
            emit(
                Reason::Pulled,
                format!(
                    "Successfully pulled image \"{image}\" in {:.3?}",
                    started.elapsed()
                ),
            );
            Ok(image_ref)
        }
        Err(e) => {
            let msg = format!("Failed to pull image \"{image}\": {}", e.message());
            emit(Reason::Failed, msg.clone());
            Err(PullError::Failed(msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(image: &str, explicit: Option<&str>) -> PullPolicy {
        PullPolicy::of(&Container {
            image: Some(image.into()),
            image_pull_policy: explicit.map(Into::into),
            ..Default::default()
        })
    }

    #[test]
    fn defaults_follow_the_tag() {
        assert_eq!(policy("nginx", None), PullPolicy::Always);
        assert_eq!(policy("nginx:latest", None), PullPolicy::Always);
        assert_eq!(
            policy("127.0.0.1:5000/skiff/echo", None),
            PullPolicy::Always
        );
        assert_eq!(
            policy("127.0.0.1:5000/skiff/echo:v1", None),
            PullPolicy::IfNotPresent
        );
        assert_eq!(policy("x@sha256:abc", None), PullPolicy::IfNotPresent);
        assert_eq!(policy("nginx", Some("Never")), PullPolicy::Never);
    }
}
