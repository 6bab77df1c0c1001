//! Checks that a comparator handed to a sort or a heap is a total order: Rust's sorts may
//! panic on one that is not (Go's tolerate it, so ports of Kubernetes' comparators need
//! this check).

use std::cmp::Ordering;
use std::fmt::Debug;

/// Panics unless `cmp` is a total order on `items`: reflexive (`x == x`), antisymmetric
/// (`cmp(a, b)` is the reverse of `cmp(b, a)`) and transitive (for every triple, `a <= b`
/// and `b <= c` give `a <= c`, and equality is transitive). O(n³): keep `items` to a few
/// dozen, chosen to collide on every field the comparator reads.
pub fn assert_total_order<T: Debug>(items: &[T], cmp: impl Fn(&T, &T) -> Ordering) {
    for a in items {
        assert_eq!(cmp(a, a), Ordering::Equal, "not reflexive: {a:?}");
        for b in items {
            let ab = cmp(a, b);
            assert_eq!(ab, cmp(b, a).reverse(), "not antisymmetric: {a:?} vs {b:?}");
            for c in items {
                let bc = cmp(b, c);
                if ab != Ordering::Greater && bc != Ordering::Greater {
                    let ac = cmp(a, c);
                    let want = if ab == Ordering::Equal && bc == Ordering::Equal {
                        Ordering::Equal
                    } else {
                        Ordering::Less
                    };
                    assert_eq!(
                        ac, want,
                        "not transitive: {a:?} {ab:?} {b:?} {bc:?} {c:?} but {ac:?}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_total_order() {
        assert_total_order(&[3, 1, 2, 2, 0], |a: &i32, b: &i32| a.cmp(b));
    }

    #[test]
    #[should_panic(expected = "not transitive")]
    fn finds_a_cycle() {
        // rock-paper-scissors
        let beats = |a: &u8, b: &u8| match (a, b) {
            _ if a == b => Ordering::Equal,
            (0, 1) | (1, 2) | (2, 0) => Ordering::Less,
            _ => Ordering::Greater,
        };
        assert_total_order(&[0u8, 1, 2], beats);
    }
}
