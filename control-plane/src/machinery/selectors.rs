//! Label and field selectors: parsing Kubernetes' selector syntax (`app=web,tier in (a,b),!canary`,
//! `spec.nodeName=node-1`), converting the API's structured selectors (metav1.LabelSelector,
//! core/v1 NodeSelectorRequirement with its numeric Gt/Lt), and matching objects. Shared by
//! the API server's list and watch, the controllers and the scheduler.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use super::status::ApiError;
use super::validation::{label_value_errors, qualified_name_errors};

/// A requirement's operator. `Equals`/`DoubleEquals` behave alike; they are kept apart only
/// so a parsed selector prints back the way it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// Numeric `>`: node affinity's `Gt`.
    GreaterThan,
    /// Numeric `<`: node affinity's `Lt`.
    LessThan,
}

/// One `key op values` term of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Operator,
    /// Sorted and deduplicated, as Kubernetes keeps them.
    values: Vec<String>,
}

impl Requirement {
    /// Validates like Kubernetes' `labels.NewRequirement`.
    pub fn new(key: &str, op: Operator, values: Vec<String>) -> Result<Self, ApiError> {
        let errs = qualified_name_errors(key);
        if !errs.is_empty() {
            return Err(bad_selector(format!(
                "invalid label key \"{key}\": {}",
                errs.join("; ")
            )));
        }
        match op {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(bad_selector(
                    "for 'in', 'notin' operators, values set can't be empty".into(),
                ))
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                return Err(bad_selector(
                    "exact-match compatibility requires one single value".into(),
                ))
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(bad_selector(
                    "values set must be empty for exists and does not exist".into(),
                ))
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    return Err(bad_selector(
                        "for 'Gt', 'Lt' operators, exactly one value is required".into(),
                    ));
                }
                if values[0].parse::<i64>().is_err() {
                    return Err(bad_selector(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer: \"{}\"",
                        values[0]
                    )));
                }
            }
            _ => {}
        }
        if !matches!(op, Operator::GreaterThan | Operator::LessThan) {
            for v in &values {
                let errs = label_value_errors(v);
                if !errs.is_empty() {
                    return Err(bad_selector(format!(
                        "invalid label value: \"{v}\": at key: \"{key}\": {}",
                        errs.join("; ")
                    )));
                }
            }
        }
        let mut values = values;
        values.sort();
        values.dedup();
        Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }
    pub fn operator(&self) -> Operator {
        self.op
    }
    pub fn values(&self) -> &[String] {
        &self.values
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.op {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                value.is_some_and(|v| self.values.binary_search(v).is_ok())
            }
            Operator::NotEquals | Operator::NotIn => {
                value.is_none_or(|v| self.values.binary_search(v).is_err())
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), Ok(want)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values[0].parse::<i64>(),
                ) else {
                    return false;
                };
                if self.op == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        let one = || self.values.first().map(String::as_str).unwrap_or("");
        match self.op {
            Operator::Equals => write!(f, "{k}={}", one()),
            Operator::DoubleEquals => write!(f, "{k}=={}", one()),
            Operator::NotEquals => write!(f, "{k}!={}", one()),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::GreaterThan => write!(f, "{k}>{}", one()),
            Operator::LessThan => write!(f, "{k}<{}", one()),
        }
    }
}

/// A label selector: a conjunction of requirements. The empty selector matches everything;
/// `LabelSelector::nothing()` (what an absent metav1 selector means) matches nothing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    pub fn nothing() -> Self {
        LabelSelector {
            requirements: vec![],
            nothing: true,
        }
    }

    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        // Kubernetes sorts by key so equal selectors print (and compare) alike.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            requirements,
            nothing: false,
        }
    }

    /// Parses the `labelSelector` query syntax; an empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        Parser::new(s)?.selector()
    }

    /// A metav1 selector (matchLabels and matchExpressions with In/NotIn/Exists/DoesNotExist).
    pub fn from_meta(selector: &metav1::LabelSelector) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for (k, v) in selector.match_labels.iter().flatten() {
            reqs.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        for expr in selector.match_expressions.iter().flatten() {
            let op = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(bad_selector(format!(
                        "\"{other}\" is not a valid label selector operator"
                    )))
                }
            };
            let values = expr.values.clone().unwrap_or_default();
            reqs.push(Requirement::new(&expr.key, op, values)?);
        }
        Ok(LabelSelector::from_requirements(reqs))
    }

    /// A metav1 selector that may be absent: absent selects nothing, as in Kubernetes.
    pub fn from_optional_meta(selector: Option<&metav1::LabelSelector>) -> Result<Self, ApiError> {
        selector.map_or(Ok(LabelSelector::nothing()), LabelSelector::from_meta)
    }

    /// Node affinity terms (`matchExpressions` of a NodeSelectorTerm, or its `matchFields`
    /// against a map of field values): In, NotIn, Exists, DoesNotExist, Gt, Lt.
    pub fn from_node_selector_requirements(
        requirements: &[NodeSelectorRequirement],
    ) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for r in requirements {
            let op = match r.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                "Gt" => Operator::GreaterThan,
                "Lt" => Operator::LessThan,
                other => {
                    return Err(bad_selector(format!(
                        "\"{other}\" is not a valid node selector operator"
                    )))
                }
            };
            reqs.push(Requirement::new(
                &r.key,
                op,
                r.values.clone().unwrap_or_default(),
            )?);
        }
        Ok(LabelSelector::from_requirements(reqs))
    }

    /// A map selector such as a Service's `spec.selector` or a pod's `nodeSelector`.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for (k, v) in map {
            reqs.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        Ok(LabelSelector::from_requirements(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    pub fn is_everything(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    pub fn is_nothing(&self) -> bool {
        self.nothing
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// The value an equality requirement pins `key` to, if any: lets an index answer a
    /// selector such as `app=web` without scanning.
    pub fn required_value(&self, key: &str) -> Option<&str> {
        self.requirements.iter().find_map(|r| {
            (r.key == key
                && matches!(
                    r.op,
                    Operator::Equals | Operator::DoubleEquals | Operator::In
                )
                && r.values.len() == 1)
                .then(|| r.values[0].as_str())
        })
    }
}

/// Whether a node satisfies one NodeSelectorTerm: its `matchExpressions` over the node's
/// labels and its `matchFields` over the node's fields (`metadata.name`), all of them.
/// A term with neither, or one that does not parse, matches nothing, as in Kubernetes.
pub fn node_selector_term_matches(
    term: &NodeSelectorTerm,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let field_values: BTreeMap<String, String> =
        [("metadata.name".to_string(), node_name.to_string())].into();
    let by_labels = LabelSelector::from_node_selector_requirements(expressions);
    let by_fields = LabelSelector::from_node_selector_requirements(fields);
    match (by_labels, by_fields) {
        (Ok(l), Ok(f)) => l.matches(labels) && f.matches(&field_values),
        _ => false,
    }
}

/// Node affinity's required selector: the terms are ORed.
pub fn node_selector_matches(
    selector: &NodeSelector,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| node_selector_term_matches(t, labels, node_name))
}

/// Kubernetes' text form (`app=web,tier in (a,b)`); kubectl's wide SELECTOR column prints it,
/// with `<none>` for an empty selector.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

fn bad_selector(message: String) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {message}"))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn new(s: &str) -> Result<Self, ApiError> {
        let mut tokens = vec![];
        let chars: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            let (tok, len) = match c {
                c if c.is_whitespace() => {
                    i += 1;
                    continue;
                }
                '!' if next == Some('=') => (Token::NotEq, 2),
                '!' => (Token::Not, 1),
                '=' if next == Some('=') => (Token::DoubleEq, 2),
                '=' => (Token::Eq, 1),
                '>' => (Token::Gt, 1),
                '<' => (Token::Lt, 1),
                '(' => (Token::Open, 1),
                ')' => (Token::Close, 1),
                ',' => (Token::Comma, 1),
                _ => {
                    let start = i;
                    while i < chars.len()
                        && !chars[i].is_whitespace()
                        && !"!=><(),".contains(chars[i])
                    {
                        i += 1;
                    }
                    tokens.push(Token::Ident(chars[start..i].iter().collect()));
                    continue;
                }
            };
            tokens.push(tok);
            i += len;
        }
        Ok(Parser { tokens, pos: 0 })
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn selector(&mut self) -> Result<LabelSelector, ApiError> {
        let mut reqs = vec![];
        if self.tokens.is_empty() {
            return Ok(LabelSelector::everything());
        }
        loop {
            reqs.push(self.requirement()?);
            match self.next() {
                None => break,
                Some(Token::Comma) => {
                    if self.peek().is_none() {
                        return Err(bad_selector(
                            "found '', expected: identifier after ','".into(),
                        ));
                    }
                }
                Some(t) => {
                    return Err(bad_selector(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        describe(&t)
                    )))
                }
            }
        }
        Ok(LabelSelector::from_requirements(reqs))
    }

    fn requirement(&mut self) -> Result<Requirement, ApiError> {
        let negated = self.peek() == Some(&Token::Not);
        if negated {
            self.pos += 1;
        }
        let key = match self.next() {
            Some(Token::Ident(k)) => k,
            other => {
                return Err(bad_selector(format!(
                    "found '{}', expected: identifier",
                    other.as_ref().map_or("", describe)
                )))
            }
        };
        if negated {
            return Requirement::new(&key, Operator::DoesNotExist, vec![]);
        }
        let op = match self.peek() {
            None | Some(Token::Comma) => return Requirement::new(&key, Operator::Exists, vec![]),
            Some(Token::Eq) => Operator::Equals,
            Some(Token::DoubleEq) => Operator::DoubleEquals,
            Some(Token::NotEq) => Operator::NotEquals,
            Some(Token::Gt) => Operator::GreaterThan,
            Some(Token::Lt) => Operator::LessThan,
            Some(Token::Ident(w)) if w == "in" => Operator::In,
            Some(Token::Ident(w)) if w == "notin" => Operator::NotIn,
            Some(t) => {
                return Err(bad_selector(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    describe(t)
                )))
            }
        };
        self.pos += 1;
        let values = match op {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => match self.peek() {
                // `key=` selects the empty value (e.g. `spec.nodeName=` style label queries).
                None | Some(Token::Comma) => vec![String::new()],
                Some(Token::Ident(_)) => match self.next() {
                    Some(Token::Ident(v)) => vec![v],
                    _ => unreachable!("peeked an identifier"),
                },
                Some(t) => {
                    return Err(bad_selector(format!(
                        "found '{}', expected: identifier",
                        describe(t)
                    )))
                }
            },
        };
        Requirement::new(&key, op, values)
    }

    fn value_set(&mut self) -> Result<Vec<String>, ApiError> {
        if self.next() != Some(Token::Open) {
            return Err(bad_selector("found '', expected: '('".into()));
        }
        let mut values = vec![];
        let mut expect_value = true;
        loop {
            match self.next() {
                Some(Token::Close) => {
                    if expect_value && !values.is_empty() {
                        // `(a,)` ends with an empty value, as in Kubernetes.
                        values.push(String::new());
                    }
                    return Ok(values);
                }
                Some(Token::Ident(v)) if expect_value => {
                    values.push(v);
                    expect_value = false;
                }
                Some(Token::Comma) => {
                    if expect_value {
                        values.push(String::new());
                    }
                    expect_value = true;
                }
                other => {
                    return Err(bad_selector(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        other.as_ref().map_or("", describe)
                    )))
                }
            }
        }
    }
}

fn describe(t: &Token) -> &str {
    match t {
        Token::Ident(s) => s,
        Token::Not => "!",
        Token::Eq => "=",
        Token::DoubleEq => "==",
        Token::NotEq => "!=",
        Token::Gt => ">",
        Token::Lt => "<",
        Token::Open => "(",
        Token::Close => ")",
        Token::Comma => ",",
    }
}

/// A field selector term's operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOperator {
    Equals,
    DoubleEquals,
    NotEquals,
}

/// One `field=value` / `field!=value` term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub operator: FieldOperator,
    pub value: String,
}

/// A field selector (`metadata.name=web,status.phase!=Running`): a conjunction of equality
/// tests on the fields a kind supports (see `kinds::KindRules::field`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` syntax; `\,`, `\=` and `\\` escape in values as in Kubernetes.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut requirements = vec![];
        if s.is_empty() {
            return Ok(FieldSelector { requirements });
        }
        for term in split_unescaped(s, ',') {
            let (field, operator, value) = split_term(&term).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                ))
            })?;
            if field.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; field name is empty in '{term}'"
                )));
            }
            requirements.push(FieldRequirement {
                field: field.to_string(),
                operator,
                value: unescape(value).map_err(|e| {
                    ApiError::bad_request(format!("invalid field selector value '{value}': {e}"))
                })?,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// True when every requirement holds; `field` answers a field's value (None: absent,
    /// which compares as the empty string, as in Kubernetes' fields.Set).
    pub fn matches(&self, field: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let have = field(&r.field).unwrap_or_default();
            match r.operator {
                FieldOperator::Equals | FieldOperator::DoubleEquals => have == r.value,
                FieldOperator::NotEquals => have != r.value,
            }
        })
    }

    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The value `field` must equal, if the selector pins it (e.g. `spec.nodeName=node-1`).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find_map(|r| {
            (r.field == field && r.operator != FieldOperator::NotEquals).then_some(r.value.as_str())
        })
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match r.operator {
                FieldOperator::Equals => "=",
                FieldOperator::DoubleEquals => "==",
                FieldOperator::NotEquals => "!=",
            };
            let escaped = r
                .value
                .replace('\\', "\\\\")
                .replace(',', "\\,")
                .replace('=', "\\=");
            write!(f, "{}{op}{escaped}", r.field)?;
        }
        Ok(())
    }
}

/// Splits on `sep` where it is not escaped by a backslash (escapes are kept for `unescape`).
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = vec![];
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
}

/// `field!=value`, `field==value` or `field=value`, at the first unescaped operator.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'!' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((&term[..i], FieldOperator::NotEquals, &term[i + 2..]))
            }
            b'=' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((&term[..i], FieldOperator::DoubleEquals, &term[i + 2..]))
            }
            b'=' => return Some((&term[..i], FieldOperator::Equals, &term[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence: \\{e}")),
                None => return Err("invalid trailing escape sequence".into()),
            }
        } else if c == ',' || c == '=' {
            return Err(format!("unescaped {c} in value"));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse(
            "app=web, tier==front,env!=prod,zone in (a, b),role notin (x),canary,!legacy",
        )
        .unwrap();
        assert_eq!(s.requirements().len(), 7);
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("zone", "b"),
            ("canary", ""),
        ]);
        assert!(s.matches(&l));
        let mut l2 = l.clone();
        l2.insert("legacy".into(), "1".into());
        assert!(!s.matches(&l2));
        let mut l3 = l.clone();
        l3.insert("env".into(), "prod".into());
        assert!(!s.matches(&l3));
        let mut l4 = l.clone();
        l4.insert("role".into(), "x".into());
        assert!(!s.matches(&l4));
        assert_eq!(
            s.to_string(),
            "app=web,canary,env!=prod,!legacy,role notin (x),tier==front,zone in (a,b)"
        );
    }

    #[test]
    fn numeric_comparisons() {
        let s = LabelSelector::parse("gpu>1,cores<64").unwrap();
        assert!(s.matches(&labels(&[("gpu", "2"), ("cores", "8")])));
        assert!(!s.matches(&labels(&[("gpu", "1"), ("cores", "8")])));
        assert!(!s.matches(&labels(&[("gpu", "two"), ("cores", "8")])));
        assert!(!s.matches(&labels(&[("cores", "8")])));
        assert!(LabelSelector::parse("gpu>x").is_err());
    }

    #[test]
    fn empty_and_nothing() {
        assert!(LabelSelector::parse("").unwrap().is_everything());
        assert!(LabelSelector::parse("  ").unwrap().is_everything());
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
        assert!(!LabelSelector::nothing().matches(&labels(&[])));
        assert!(LabelSelector::from_optional_meta(None)
            .unwrap()
            .is_nothing());
    }

    #[test]
    fn empty_value_and_sets() {
        let s = LabelSelector::parse("a=").unwrap();
        assert!(s.matches(&labels(&[("a", "")])));
        assert!(!s.matches(&labels(&[("a", "x")])));
        let s = LabelSelector::parse("a in (x,)").unwrap();
        assert!(s.matches(&labels(&[("a", "")])));
    }

    #[test]
    fn rejects_bad_syntax() {
        for bad in [
            "a in ()",
            "a in (x",
            "a in x",
            "!",
            "=a",
            "a=b=c",
            "a,",
            ",a",
            "a b",
            "a!b",
            "Bad Key=1",
            "a=-x",
            "a notin",
            "!a=b",
            "a==",
            "a>",
        ] {
            let r = LabelSelector::parse(bad);
            if bad == "a==" {
                // `a==` selects the empty value, like `a=`.
                assert!(r.is_ok());
                continue;
            }
            let e = r.expect_err(bad);
            assert_eq!(e.code, 400, "{bad}");
        }
    }

    #[test]
    fn from_meta_selector() {
        let sel = metav1::LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![metav1::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        let s = LabelSelector::from_meta(&sel).unwrap();
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert_eq!(s.to_string(), "app=web,tier notin (db)");
        let bad = metav1::LabelSelector {
            match_expressions: Some(vec![metav1::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "Gt".into(),
                values: Some(vec!["1".into()]),
            }]),
            ..Default::default()
        };
        assert!(LabelSelector::from_meta(&bad).is_err());
        assert!(LabelSelector::from_meta(&Default::default())
            .unwrap()
            .is_everything());
    }

    #[test]
    fn node_affinity_terms() {
        let reqs = vec![
            NodeSelectorRequirement {
                key: "kubernetes.io/os".into(),
                operator: "In".into(),
                values: Some(vec!["linux".into()]),
            },
            NodeSelectorRequirement {
                key: "cpus".into(),
                operator: "Gt".into(),
                values: Some(vec!["4".into()]),
            },
        ];
        let s = LabelSelector::from_node_selector_requirements(&reqs).unwrap();
        assert!(s.matches(&labels(&[("kubernetes.io/os", "linux"), ("cpus", "8")])));
        assert!(!s.matches(&labels(&[("kubernetes.io/os", "linux"), ("cpus", "4")])));
    }

    #[test]
    fn node_selector_terms() {
        let term = |exprs: Vec<(&str, &str, Vec<&str>)>, fields: Vec<(&str, &str, Vec<&str>)>| {
            let reqs = |v: Vec<(&str, &str, Vec<&str>)>| {
                Some(
                    v.into_iter()
                        .map(|(k, op, vals)| NodeSelectorRequirement {
                            key: k.into(),
                            operator: op.into(),
                            values: Some(vals.into_iter().map(String::from).collect()),
                        })
                        .collect(),
                )
            };
            NodeSelectorTerm {
                match_expressions: reqs(exprs),
                match_fields: reqs(fields),
            }
        };
        let node = labels(&[("zone", "a"), ("gpus", "2")]);
        let zone_a = term(vec![("zone", "In", vec!["a", "b"])], vec![]);
        let named = term(vec![], vec![("metadata.name", "In", vec!["node-1"])]);
        let big = term(vec![("gpus", "Gt", vec!["4"])], vec![]);
        assert!(node_selector_term_matches(&zone_a, &node, "node-2"));
        assert!(node_selector_term_matches(&named, &node, "node-1"));
        assert!(!node_selector_term_matches(&named, &node, "node-2"));
        assert!(!node_selector_term_matches(&big, &node, "node-1"));
        assert!(!node_selector_term_matches(
            &term(vec![], vec![]),
            &node,
            "node-1"
        ));
        let bad = term(vec![("zone", "Near", vec!["a"])], vec![]);
        assert!(!node_selector_term_matches(&bad, &node, "node-1"));
        let selector = NodeSelector {
            node_selector_terms: vec![big, named],
        };
        assert!(node_selector_matches(&selector, &node, "node-1"));
        assert!(!node_selector_matches(&selector, &node, "node-3"));
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse("spec.nodeName=node-1,status.phase!=Failed").unwrap();
        let pod = |node: &str, phase: &str| {
            let (node, phase) = (node.to_string(), phase.to_string());
            move |k: &str| match k {
                "spec.nodeName" => Some(node.clone()),
                "status.phase" => Some(phase.clone()),
                _ => None,
            }
        };
        assert!(f.matches(pod("node-1", "Running")));
        assert!(!f.matches(pod("node-2", "Running")));
        assert!(!f.matches(pod("node-1", "Failed")));
        assert_eq!(f.required_value("spec.nodeName"), Some("node-1"));

        let unscheduled = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(unscheduled.matches(pod("", "Pending")));
        assert!(unscheduled.matches(|_| None));

        let f = FieldSelector::parse(
            "involvedObject.name=web,involvedObject.namespace=default,involvedObject.uid=u-1",
        )
        .unwrap();
        assert_eq!(f.requirements().len(), 3);

        let escaped = FieldSelector::parse(r"metadata.name=a\,b\=c").unwrap();
        assert_eq!(escaped.requirements()[0].value, "a,b=c");
        assert_eq!(escaped.to_string(), r"metadata.name=a\,b\=c");
        assert!(FieldSelector::parse("").unwrap().is_everything());
        for bad in ["nonsense", "=x", r"a=b\q", "a=b=c"] {
            assert_eq!(FieldSelector::parse(bad).unwrap_err().code, 400, "{bad}");
        }
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![Just("app"), Just("tier"), Just("example.com/role")].prop_map(String::from)
    }
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![Just("a"), Just("b"), Just("c1"), Just("")].prop_map(String::from)
    }
    fn requirement() -> impl Strategy<Value = Requirement> {
        (key(), 0..7usize, proptest::collection::vec(value(), 1..3)).prop_map(|(k, op, vals)| {
            let op = [
                Operator::Equals,
                Operator::DoubleEquals,
                Operator::NotEquals,
                Operator::In,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist,
            ][op];
            let vals = match op {
                Operator::Exists | Operator::DoesNotExist => vec![],
                Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                    vals[..1].to_vec()
                }
                _ => vals
                    .into_iter()
                    .filter(|v| !v.is_empty())
                    .chain(["z".into()])
                    .collect(),
            };
            Requirement::new(&k, op, vals).unwrap()
        })
    }

    proptest! {
        // Printing a selector and parsing it back gives a selector that matches the same sets.
        #[test]
        fn print_parse_round_trip(
            reqs in proptest::collection::vec(requirement(), 0..4),
            objs in proptest::collection::vec(proptest::collection::btree_map(key(), value(), 0..3), 1..6),
        ) {
            let s = LabelSelector::from_requirements(reqs);
            let back = LabelSelector::parse(&s.to_string()).unwrap();
            prop_assert_eq!(&back, &s);
            for o in &objs {
                prop_assert_eq!(back.matches(o), s.matches(o));
            }
        }

        // A selector is the conjunction of its requirements.
        #[test]
        fn conjunction(reqs in proptest::collection::vec(requirement(), 0..4),
                       obj in proptest::collection::btree_map(key(), value(), 0..3)) {
            let s = LabelSelector::from_requirements(reqs.clone());
            prop_assert_eq!(s.matches(&obj), reqs.iter().all(|r| r.matches(&obj)));
        }

        #[test]
        fn never_panics(s in "[a-z!=<>(), .0-9\\\\/]{0,30}") {
            let _ = LabelSelector::parse(&s);
            let _ = FieldSelector::parse(&s);
        }
    }
}
