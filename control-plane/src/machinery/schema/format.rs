//! The string `format`s Kubernetes checks in CRD schemas (apiextensions' supported list:
//! the go-openapi strfmt formats). Formats outside the list are accepted and not checked, as
//! in Kubernetes; the numeric ones (int32, int64, float, double) and `password` constrain
//! nothing.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use base64::Engine;
use regex::Regex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    BsonObjectId,
    Uri,
    Email,
    Hostname,
    Ipv4,
    Ipv6,
    Cidr,
    Mac,
    Uuid,
    Uuid3,
    Uuid4,
    Uuid5,
    Isbn,
    Isbn10,
    Isbn13,
    CreditCard,
    Ssn,
    HexColor,
    RgbColor,
    Byte,
    Date,
    DateTime,
    Duration,
}

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("a format's pattern is a valid regex")
}

static UUID: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"));
static UUID3: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID4: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static UUID5: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static EMAIL: LazyLock<Regex> = LazyLock::new(|| re(r"^[^@\s<>]+@[^@\s<>]+$"));
static MAC: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)^([0-9a-f]{2}([:-][0-9a-f]{2}){5}|[0-9a-f]{2}([:-][0-9a-f]{2}){7}|[0-9a-f]{2}([:-][0-9a-f]{2}){19}|[0-9a-f]{4}(\.[0-9a-f]{4}){2,9})$",
    )
});
static HEX_COLOR: LazyLock<Regex> = LazyLock::new(|| re(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"));
static RGB_COLOR: LazyLock<Regex> = LazyLock::new(|| {
    let c = r"\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*";
    re(&format!(r"^rgb\({c},{c},{c}\)$"))
});
static SSN: LazyLock<Regex> = LazyLock::new(|| re(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"));
static BSON_ID: LazyLock<Regex> = LazyLock::new(|| re(r"^[0-9a-fA-F]{24}$"));
static DURATION: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"^\s*(\d+(\.\d+)?\s*(ns|us|µs|ms|s|m|h|d|w|nanoseconds?|microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?)\s*)+$",
    )
});
static URI_SCHEME: LazyLock<Regex> = LazyLock::new(|| re(r"^[a-zA-Z][a-zA-Z0-9+.-]*:\S*$"));

impl Format {
    pub(super) fn parse(name: &str) -> Option<Format> {
        Some(match name {
            "bsonobjectid" => Format::BsonObjectId,
            "uri" => Format::Uri,
            "email" => Format::Email,
            "hostname" => Format::Hostname,
            "ipv4" => Format::Ipv4,
            "ipv6" => Format::Ipv6,
            "cidr" => Format::Cidr,
            "mac" => Format::Mac,
            "uuid" => Format::Uuid,
            "uuid3" => Format::Uuid3,
            "uuid4" => Format::Uuid4,
            "uuid5" => Format::Uuid5,
            "isbn" => Format::Isbn,
            "isbn10" => Format::Isbn10,
            "isbn13" => Format::Isbn13,
            "creditcard" => Format::CreditCard,
            "ssn" => Format::Ssn,
            "hexcolor" => Format::HexColor,
            "rgbcolor" => Format::RgbColor,
            "byte" => Format::Byte,
            "date" => Format::Date,
            "date-time" | "datetime" => Format::DateTime,
            "duration" => Format::Duration,
            _ => return None,
        })
    }

    /// The name in error messages (`must be of type date-time`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Format::BsonObjectId => "bsonobjectid",
            Format::Uri => "uri",
            Format::Email => "email",
            Format::Hostname => "hostname",
            Format::Ipv4 => "ipv4",
            Format::Ipv6 => "ipv6",
            Format::Cidr => "cidr",
            Format::Mac => "mac",
            Format::Uuid => "uuid",
            Format::Uuid3 => "uuid3",
            Format::Uuid4 => "uuid4",
            Format::Uuid5 => "uuid5",
            Format::Isbn => "isbn",
            Format::Isbn10 => "isbn10",
            Format::Isbn13 => "isbn13",
            Format::CreditCard => "creditcard",
            Format::Ssn => "ssn",
            Format::HexColor => "hexcolor",
            Format::RgbColor => "rgbcolor",
            Format::Byte => "byte",
            Format::Date => "date",
            Format::DateTime => "date-time",
            Format::Duration => "duration",
        }
    }

    pub(super) fn accepts(self, s: &str) -> bool {
        match self {
            Format::BsonObjectId => BSON_ID.is_match(s),
            Format::Uri => URI_SCHEME.is_match(s) || s.starts_with('/'),
            Format::Email => EMAIL.is_match(s),
            Format::Hostname => hostname(s),
            Format::Ipv4 => s.parse::<Ipv4Addr>().is_ok(),
            Format::Ipv6 => s.parse::<Ipv6Addr>().is_ok(),
            Format::Cidr => s.parse::<ipnet::IpNet>().is_ok(),
            Format::Mac => MAC.is_match(s),
            Format::Uuid => UUID.is_match(s),
            Format::Uuid3 => UUID3.is_match(s),
            Format::Uuid4 => UUID4.is_match(s),
            Format::Uuid5 => UUID5.is_match(s),
            Format::Isbn => isbn10(s) || isbn13(s),
            Format::Isbn10 => isbn10(s),
            Format::Isbn13 => isbn13(s),
            Format::CreditCard => luhn(s),
            Format::Ssn => SSN.is_match(s),
            Format::HexColor => HEX_COLOR.is_match(s),
            Format::RgbColor => RGB_COLOR.is_match(s),
            Format::Byte => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
            Format::Date => s.len() == 10 && s.parse::<jiff::civil::Date>().is_ok(),
            Format::DateTime => date_time(s),
            Format::Duration => DURATION.is_match(s),
        }
    }
}

/// RFC 3339 date-time (`2006-01-02T15:04:05Z`, with fractions and offsets), also with a
/// space or lower-case `t` between date and time, as strfmt accepts.
fn date_time(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 || !matches!(b[10], b'T' | b't' | b' ') {
        return false;
    }
    let normal = format!("{}T{}", &s[..10], &s[11..]).to_ascii_uppercase();
    normal.parse::<jiff::Timestamp>().is_ok()
}

/// An RFC 1123 host name: dot-separated labels of letters, digits and hyphens, each at most
/// 63 characters and not starting or ending with a hyphen, 255 in all.
fn hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 255
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        })
}

fn digits(s: &str) -> Vec<char> {
    s.chars().filter(|c| *c != '-' && *c != ' ').collect()
}

fn isbn10(s: &str) -> bool {
    let d = digits(s);
    if d.len() != 10 {
        return false;
    }
    let mut sum = 0;
    for (i, c) in d.iter().enumerate() {
        let v = match c.to_digit(10) {
            Some(v) => v,
            None if i == 9 && (*c == 'X' || *c == 'x') => 10,
            None => return false,
        };
        sum += v * (10 - i as u32);
    }
    sum % 11 == 0
}

fn isbn13(s: &str) -> bool {
    let d = digits(s);
    if d.len() != 13 {
        return false;
    }
    let mut sum = 0;
    for (i, c) in d.iter().enumerate() {
        let Some(v) = c.to_digit(10) else {
            return false;
        };
        sum += if i % 2 == 0 { v } else { v * 3 };
    }
    sum % 10 == 0
}

fn luhn(s: &str) -> bool {
    let d = digits(s);
    if d.len() < 12 || d.len() > 19 {
        return false;
    }
    let mut sum = 0;
    for (i, c) in d.iter().rev().enumerate() {
        let Some(mut v) = c.to_digit(10) else {
            return false;
        };
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum % 10 == 0
}
