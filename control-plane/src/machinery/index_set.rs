//! Sets of completion indexes in Kubernetes' compressed text form (`1,3-5,7`), as Indexed
//! Jobs keep them in `status.completedIndexes` and `status.failedIndexes` and name them in
//! `successPolicy.rules[].succeededIndexes`: sorted, non-overlapping intervals.

use std::collections::BTreeMap;
use std::fmt;

/// Sorted, disjoint, non-adjacent closed intervals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSet {
    /// start -> end (inclusive).
    ranges: BTreeMap<i32, i32>,
}

/// Why an index list does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

impl IndexSet {
    pub fn new() -> IndexSet {
        IndexSet::default()
    }

    /// Parses `1,3-5,7`; every index below `limit` (the Job's completions) when given. The
    /// intervals must be ordered and must not overlap, as Kubernetes requires.
    pub fn parse(s: &str, limit: Option<i32>) -> Result<IndexSet, ParseError> {
        let mut set = IndexSet::new();
        let mut previous: Option<i32> = None;
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let n = num(part)?;
                    (n, n)
                }
            };
            if a > b {
                return Err(ParseError(format!(
                    "non-increasing order, previous: {a}, current: {b}"
                )));
            }
            if let Some(p) = previous.filter(|p| a <= *p) {
                return Err(ParseError(format!(
                    "non-increasing order, previous: {p}, current: {a}"
                )));
            }
            if let Some(l) = limit.filter(|l| b >= *l) {
                return Err(ParseError(format!(
                    "too large: {b}, must be less than completions: {l}"
                )));
            }
            previous = Some(b);
            for i in a..=b {
                set.insert(i);
            }
        }
        Ok(set)
    }

    pub fn contains(&self, i: i32) -> bool {
        self.ranges
            .range(..=i)
            .next_back()
            .is_some_and(|(_, end)| i <= *end)
    }

    /// Adds `i`, merging with the neighbouring intervals.
    pub fn insert(&mut self, i: i32) {
        if self.contains(i) {
            return;
        }
        let mut start = i;
        let mut end = i;
        if let Some((&s, &e)) = self.ranges.range(..i).next_back() {
            if e + 1 == i {
                start = s;
                self.ranges.remove(&s);
            }
        }
        if let Some(&e) = self.ranges.get(&(i + 1)) {
            end = e;
            self.ranges.remove(&(i + 1));
        }
        self.ranges.insert(start, end);
    }

    /// How many indexes the set holds.
    pub fn len(&self) -> usize {
        self.ranges
            .iter()
            .map(|(s, e)| usize::try_from(e - s + 1).unwrap_or(0))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Every index, in order.
    pub fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        self.ranges.iter().flat_map(|(s, e)| *s..=*e)
    }

    /// Whether every index of `other` is in this set.
    pub fn is_superset(&self, other: &IndexSet) -> bool {
        other.iter().all(|i| self.contains(i))
    }

    /// How many of `other`'s indexes are in this set.
    pub fn count_in(&self, other: &IndexSet) -> usize {
        other.iter().filter(|i| self.contains(*i)).count()
    }
}

fn num(s: &str) -> Result<i32, ParseError> {
    s.parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| ParseError(format!("cannot convert string to integer for index: {s:?}")))
}

impl fmt::Display for IndexSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (s, e) in &self.ranges {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if s == e {
                write!(f, "{s}")?;
            } else {
                write!(f, "{s}-{e}")?;
            }
        }
        Ok(())
    }
}

impl FromIterator<i32> for IndexSet {
    fn from_iter<T: IntoIterator<Item = i32>>(iter: T) -> Self {
        let mut s = IndexSet::new();
        for i in iter {
            s.insert(i);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_format_and_merge() {
        let s = IndexSet::parse("1,3-5,7", Some(10)).unwrap();
        assert_eq!(s.to_string(), "1,3-5,7");
        assert_eq!(s.len(), 5);
        assert!(s.contains(4) && !s.contains(6) && !s.contains(0));
        let mut t = s.clone();
        t.insert(6);
        assert_eq!(t.to_string(), "1,3-7");
        t.insert(2);
        t.insert(0);
        assert_eq!(t.to_string(), "0-7");
        assert_eq!(IndexSet::parse("", None).unwrap().to_string(), "");
        assert!(IndexSet::parse("3,1", None).is_err());
        assert!(IndexSet::parse("1-3,2", None).is_err());
        assert!(IndexSet::parse("5-2", None).is_err());
        assert!(IndexSet::parse("1,x", None).is_err());
        assert!(IndexSet::parse("10", Some(10)).is_err());
        let collected: IndexSet = [5, 1, 2, 9].into_iter().collect();
        assert_eq!(collected.to_string(), "1-2,5,9");
        assert!(t.is_superset(&collected.iter().filter(|i| *i < 8).collect()));
        assert_eq!(t.count_in(&collected), 3);
    }
}
