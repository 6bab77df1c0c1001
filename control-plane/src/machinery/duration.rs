//! Human-readable ages as kubectl prints them (`5s`, `3m2s`, `2d3h`, `<invalid>`), shared by
//! every table's AGE and LAST SEEN columns.

use k8s_openapi::jiff::Timestamp;

/// `now - then` rendered like kubectl's `translateTimestampSince`: `<unknown>` without a time.
pub fn age(then: Option<Timestamp>, now: Timestamp) -> String {
    match then {
        None => "<unknown>".to_string(),
        Some(then) => {
            let millis = now.as_millisecond() - then.as_millisecond();
            human_duration(millis.div_euclid(1000))
        }
    }
}

/// Kubernetes' `duration.HumanDuration`: precision shrinks as the duration grows. Up to one
/// second in the future still reads `0s`, to absorb clock skew between machines.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let d = days % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Expected strings are the ones Kubernetes' own HumanDuration table test lists.
    #[test]
    fn matches_kubectl() {
        let cases = [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (182, "3m2s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600 - 1, "7h59m"),
            (8 * 3600, "8h"),
            (48 * 3600 - 1, "47h"),
            (48 * 3600, "2d"),
            (51 * 3600, "2d3h"),
            (8 * 86400 - 1, "7d23h"),
            (8 * 86400, "8d"),
            (2 * 365 * 86400 - 1, "729d"),
            (2 * 365 * 86400, "2y"),
            (2 * 365 * 86400 + 86400, "2y1d"),
            (8 * 365 * 86400 - 1, "7y364d"),
            (8 * 365 * 86400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn age_from_timestamps() {
        let then: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        let now: Timestamp = "2024-01-01T00:03:02.900Z".parse().unwrap();
        assert_eq!(age(Some(then), now), "3m2s");
        assert_eq!(age(None, now), "<unknown>");
    }

    proptest! {
        // Longer durations never print a smaller leading number in the same unit: the
        // rendering is monotone in the sense that parsing it back never exceeds the input.
        #[test]
        fn never_overstates(secs in 0i64..400_000_000) {
            let s = human_duration(secs);
            let mut total = 0i64;
            let mut num = 0i64;
            for c in s.chars() {
                if let Some(d) = c.to_digit(10) {
                    num = num * 10 + i64::from(d);
                } else {
                    let unit = match c { 's' => 1, 'm' => 60, 'h' => 3600, 'd' => 86400, 'y' => 365 * 86400, _ => unreachable!() };
                    total += num * unit;
                    num = 0;
                }
            }
            prop_assert!(total <= secs, "{s} > {secs}");
            // and it loses less than the coarsest precision used (one year)
            prop_assert!(secs - total < 365 * 86400);
        }
    }
}
