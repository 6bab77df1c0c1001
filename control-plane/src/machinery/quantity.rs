//! Kubernetes resource quantities (`500m`, `1.5Gi`, `2e3`, `128974848`): parsing with the full
//! grammar, exact comparison and addition, and the integer views the scheduler and the node
//! agent need (millicores for cpu, bytes for memory).
//!
//! A value is held exactly in nano-units (10^-9), the finest precision Kubernetes keeps: finer
//! inputs round up, as Kubernetes rounds them.

use std::cmp::Ordering;
use std::fmt;

/// How a quantity prints: the family of suffixes it was written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`
    BinarySI,
    /// `n`, `u`, `m`, ``, `k`, `M`, `G`, `T`, `P`, `E`
    DecimalSI,
    /// `1e3`, `5E-2`
    DecimalExponent,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Format,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("quantity is too large")]
    TooLarge,
}

/// A resource quantity. Equality and order compare the values (`1k == 1000 == 1e3`).
#[derive(Clone, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

const NANO: i128 = 1_000_000_000;

impl Quantity {
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let bytes = s.as_bytes();
        let mut i = 0;
        let negative = match bytes.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let mut mantissa: i128 = 0;
        let mut digits = 0usize;
        let mut frac_digits = 0i32;
        let mut seen_dot = false;
        while i < bytes.len() {
            match bytes[i] {
                b'0'..=b'9' => {
                    mantissa = mantissa
                        .checked_mul(10)
                        .and_then(|m| m.checked_add(i128::from(bytes[i] - b'0')))
                        .ok_or(QuantityError::TooLarge)?;
                    digits += 1;
                    if seen_dot {
                        frac_digits += 1;
                    }
                }
                b'.' if !seen_dot => seen_dot = true,
                _ => break,
            }
            i += 1;
        }
        if digits == 0 {
            return Err(QuantityError::Format);
        }
        let (format, binary, exp10) = parse_suffix(&s[i..])?;
        let mut numerator = mantissa
            .checked_mul(binary)
            .ok_or(QuantityError::TooLarge)?;
        if negative {
            numerator = -numerator;
        }
        let scale = exp10 + 9 - frac_digits;
        let nanos = if scale >= 0 {
            pow10(scale)
                .and_then(|p| numerator.checked_mul(p))
                .ok_or(QuantityError::TooLarge)?
        } else {
            // Below nano precision: exact up to the nano, rounded up (towards +infinity).
            match pow10(-scale) {
                Some(p) => ceil_div(numerator, p),
                None => i128::from(numerator > 0),
            }
        };
        Ok(Quantity { nanos, format })
    }

    /// Whole units rounded up (bytes for memory, cores for cpu), saturating at i64's range.
    pub fn value(&self) -> i64 {
        saturate(ceil_div(self.nanos, NANO))
    }

    /// Thousandths of a unit rounded up (millicores for cpu), saturating at i64's range.
    pub fn milli_value(&self) -> i64 {
        saturate(ceil_div(self.nanos, 1_000_000))
    }

    /// The exact value in nano-units.
    pub fn nano_value(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn from_milli(milli: i64, format: Format) -> Self {
        Quantity {
            nanos: i128::from(milli) * 1_000_000,
            format,
        }
    }

    pub fn from_value(value: i64, format: Format) -> Self {
        Quantity {
            nanos: i128::from(value) * NANO,
            format,
        }
    }

    /// Sum of two quantities (the scheduler adds up requests); keeps `self`'s format.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        Some(Quantity {
            nanos: self.nanos.checked_add(other.nanos)?,
            format: self.format,
        })
    }

    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        Some(Quantity {
            nanos: self.nanos.checked_sub(other.nanos)?,
            format: self.format,
        })
    }
}

impl TryFrom<&k8s_openapi::apimachinery::pkg::api::resource::Quantity> for Quantity {
    type Error = QuantityError;
    fn try_from(
        q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    ) -> Result<Self, Self::Error> {
        Quantity::parse(&q.0)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// Canonical form, as Kubernetes writes a quantity back: the largest suffix of the quantity's
/// family that keeps the value an integer (`1536Mi` -> `1536Mi`, `1000m` -> `1`, `0.5` -> `500m`).
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nanos;
        if n == 0 {
            return f.write_str("0");
        }
        if self.format == Format::BinarySI && n % NANO == 0 {
            let units = n / NANO;
            // Binary suffixes only where the value is a whole number of KiB or more.
            for (suffix, size) in [
                ("Ei", 1i128 << 60),
                ("Pi", 1 << 50),
                ("Ti", 1 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ] {
                if units % size == 0 {
                    return write!(f, "{}{suffix}", units / size);
                }
            }
            if units.abs() < 1024 {
                return write!(f, "{units}");
            }
        }
        for (suffix, size) in [
            ("E", NANO * 1_000_000_000_000_000_000),
            ("P", NANO * 1_000_000_000_000_000),
            ("T", NANO * 1_000_000_000_000),
            ("G", NANO * 1_000_000_000),
            ("M", NANO * 1_000_000),
            ("k", NANO * 1_000),
            ("", NANO),
            ("m", 1_000_000),
            ("u", 1_000),
            ("n", 1),
        ] {
            if n % size == 0 {
                return write!(f, "{}{suffix}", n / size);
            }
        }
        unreachable!("every value is a whole number of nanos")
    }
}

/// (format, binary multiplier, decimal exponent) of a suffix.
fn parse_suffix(s: &str) -> Result<(Format, i128, i32), QuantityError> {
    let decimal = |e| Ok((Format::DecimalSI, 1, e));
    let binary = |p: u32| Ok((Format::BinarySI, 1i128 << (10 * p), 0));
    match s {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => {
            let rest = s
                .strip_prefix('e')
                .or_else(|| s.strip_prefix('E'))
                .ok_or(QuantityError::Suffix)?;
            let unsigned = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Suffix);
            }
            let e: i32 = rest.parse().map_err(|_| QuantityError::TooLarge)?;
            if e.abs() > 1000 {
                return Err(QuantityError::TooLarge);
            }
            Ok((Format::DecimalExponent, 1, e))
        }
    }
}

fn pow10(e: i32) -> Option<i128> {
    10i128.checked_pow(u32::try_from(e).ok()?)
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a.div_euclid(b);
    if a.rem_euclid(b) != 0 {
        q + 1
    } else {
        q
    }
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn cpu_in_millicores() {
        assert_eq!(q("500m").milli_value(), 500);
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("0.1").milli_value(), 100);
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("2.").milli_value(), 2000);
        assert_eq!(q("100u").milli_value(), 1, "rounds up");
        assert_eq!(q("1e-3").milli_value(), 1);
        assert_eq!(q("250000000n").milli_value(), 250);
    }

    #[test]
    fn memory_in_bytes() {
        assert_eq!(q("128974848").value(), 128_974_848);
        assert_eq!(q("129e6").value(), 129_000_000);
        assert_eq!(q("129M").value(), 129_000_000);
        assert_eq!(q("123Mi").value(), 123 * 1024 * 1024);
        assert_eq!(q("1Gi").value(), 1 << 30);
        assert_eq!(q("1.5Gi").value(), 3 << 29);
        assert_eq!(q("1Ki").value(), 1024);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("2Ti").value(), 2 << 40);
        assert_eq!(q("1Ei").value(), 1 << 60);
        assert_eq!(q("1E").value(), 1_000_000_000_000_000_000);
        assert_eq!(
            q("1E3").value(),
            1000,
            "E followed by digits is an exponent"
        );
        assert_eq!(q("+5").value(), 5);
        assert_eq!(q("-5").value(), -5);
        assert_eq!(q("1m").value(), 1, "whole units round up");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "",
            "m",
            "Ki",
            "1.2.3",
            "1Kb",
            "1 Gi",
            " 1",
            "1e",
            "1e+",
            "--1",
            "1ki",
            "abc",
            "1.5.Gi",
            "1e99999",
            "99999999999999999999999999999999999999999",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn compares_by_value() {
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1e3"), q("1000"));
        assert_eq!(q("1000m"), q("1"));
        assert!(q("1Ki") > q("1k"));
        assert!(q("500m") < q("1"));
        assert!(q("-1") < q("0"));
    }

    #[test]
    fn canonical_display() {
        assert_eq!(q("1000m").to_string(), "1");
        assert_eq!(q("0.5").to_string(), "500m");
        assert_eq!(q("1536Mi").to_string(), "1536Mi");
        assert_eq!(q("2048Mi").to_string(), "2Gi");
        assert_eq!(q("1e3").to_string(), "1k");
        assert_eq!(q("0").to_string(), "0");
        let sum = q("250m").checked_add(&q("1.75")).unwrap();
        assert_eq!(sum.to_string(), "2");
    }

    proptest! {
        #[test]
        fn display_round_trips(units in -1_000_000_000i64..1_000_000_000, milli in any::<bool>(), binary in any::<bool>()) {
            let text = match (milli, binary) {
                (true, _) => format!("{units}m"),
                (false, true) => format!("{units}Ki"),
                (false, false) => format!("{units}"),
            };
            let parsed = q(&text);
            prop_assert_eq!(q(&parsed.to_string()), parsed);
        }

        #[test]
        fn suffixes_scale_exactly(n in 0i64..1_000_000, p in 0u32..4) {
            let k = ["", "k", "M", "G"][p as usize];
            let ki = ["", "Ki", "Mi", "Gi"][p as usize];
            prop_assert_eq!(q(&format!("{n}{k}")).value(), n * 1000i64.pow(p));
            prop_assert_eq!(q(&format!("{n}{ki}")).value(), n * 1024i64.pow(p));
            prop_assert_eq!(q(&format!("{n}e{}", 3 * p)).value(), n * 1000i64.pow(p));
        }

        #[test]
        fn addition_matches_integers(a in 0i64..1_000_000_000, b in 0i64..1_000_000_000) {
            let sum = q(&format!("{a}m")).checked_add(&q(&format!("{b}m"))).unwrap();
            prop_assert_eq!(sum.milli_value(), a + b);
            prop_assert_eq!(q(&format!("{a}m")) < q(&format!("{b}m")), a < b);
        }

        #[test]
        fn never_panics(s in "[-+0-9.eEinumkKMGTP]{0,12}") {
            let _ = Quantity::parse(&s);
        }
    }
}
