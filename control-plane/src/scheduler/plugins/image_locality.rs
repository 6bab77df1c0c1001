//! ImageLocality: nodes that already hold the pod's images score higher, in proportion to the
//! images' sizes scaled by how many nodes have them (an image on every node says little), and
//! clamped between 23 MB and 1000 MB per container so that tiny images do not matter and huge
//! ones do not dominate.

use super::super::cache::Cache;
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::MAX_NODE_SCORE;

const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

pub fn score(pod: &PodInfo, node: &NodeInfo, cache: &Cache, total_nodes: usize) -> i64 {
    if pod.images.is_empty() || total_nodes == 0 {
        return 0;
    }
    let mut sum: i64 = 0;
    for image in &pod.images {
        if node.images().contains_key(image) {
            if let Some(s) = cache.image(image) {
                let spread = s.nodes as f64 / total_nodes as f64;
                sum += (s.size as f64 * spread) as i64;
            }
        }
    }
    let max = MAX_CONTAINER_THRESHOLD * pod.images.len() as i64;
    let clamped = sum.clamp(MIN_THRESHOLD, max);
    MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{cache, plain_node, pod};
    use serde_json::json;
    use std::sync::Arc;

    fn with_images(name: &str, images: &[(&str, i64)]) -> Arc<k8s_openapi::api::core::v1::Node> {
        let mut n = (*plain_node(name)).clone();
        n.status.as_mut().unwrap().images = Some(
            images
                .iter()
                .map(|(i, s)| {
                    serde_json::from_value(json!({"names": [i], "sizeBytes": s})).unwrap()
                })
                .collect(),
        );
        Arc::new(n)
    }

    #[test]
    fn larger_and_more_common_images_score_higher() {
        let c = cache(
            &[
                with_images("a", &[("web:v1", 500 * MB)]),
                with_images("b", &[("web:v1", 500 * MB)]),
                with_images("c", &[]),
                with_images("d", &[("tiny:v1", MB)]),
            ],
            &[],
        );
        let p = pod(json!({"spec": {"containers": [{"name": "c", "image": "web:v1"}]}}));
        // 500 MB * 2/4 nodes = 250 MB -> 100 * (250 - 23) / (1000 - 23)
        let want =
            MAX_NODE_SCORE * (250 * MB - MIN_THRESHOLD) / (MAX_CONTAINER_THRESHOLD - MIN_THRESHOLD);
        assert_eq!(score(&p, c.node("a").unwrap(), &c, 4), want);
        assert_eq!(score(&p, c.node("c").unwrap(), &c, 4), 0);
        let tiny = pod(json!({"spec": {"containers": [{"name": "c", "image": "tiny:v1"}]}}));
        assert_eq!(
            score(&tiny, c.node("d").unwrap(), &c, 4),
            0,
            "below the 23 MB threshold"
        );
    }
}
