//! CronJob schedules as Kubernetes reads them (robfig/cron's standard parser): five fields
//! (minute, hour, day of month, month, day of week) with names, ranges, steps and `?`, or a
//! descriptor (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`/`@annually`,
//! `@midnight`), evaluated in an IANA time zone. Parsing and evaluation are croner's; this
//! room only refuses what Kubernetes' parser refuses (seconds, years and croner's `L`, `W`,
//! `#` and `+` extensions) and names a time zone.

use std::str::FromStr;

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, Zoned};

/// A parsed schedule in its time zone.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
}

/// Why a schedule or a time zone is refused (the message Kubernetes' validation prints after
/// the value).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0}")]
    Syntax(String),
    #[error("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")]
    TimeZoneInSchedule,
    #[error("unknown time zone {0}")]
    UnknownTimeZone(String),
}

/// Parses a five-field schedule or a descriptor.
pub fn parse(schedule: &str) -> Result<Cron, ScheduleError> {
    let s = schedule.trim();
    if s.contains("TZ=") {
        return Err(ScheduleError::TimeZoneInSchedule);
    }
    if s.is_empty() {
        return Err(ScheduleError::Syntax("empty spec string".into()));
    }
    let s = match s.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        d if d.starts_with('@') => {
            return Err(ScheduleError::Syntax(format!(
                "unrecognized descriptor: {s}"
            )))
        }
        _ => s,
    };
    {
        let fields = s.split_whitespace().count();
        if fields != 5 {
            return Err(ScheduleError::Syntax(format!(
                "expected exactly 5 fields, found {fields}: {s}"
            )));
        }
        // Letters only in month and weekday names (JUL, WED): croner's L, W, # and + are
        // not robfig's.
        if let Some(c) = s.chars().find(|c| matches!(c, '#' | '+')) {
            return Err(ScheduleError::Syntax(format!(
                "unsupported character {c:?} in {s}"
            )));
        }
        if !names_only(s) {
            return Err(ScheduleError::Syntax(format!("unknown name in {s}")));
        }
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .sloppy_ranges(true)
        .build()
        .parse(s)
        .map_err(|e| ScheduleError::Syntax(e.to_string()))
}

/// Whether every letter of `s` belongs to a month or weekday name (JAN..DEC, SUN..SAT).
fn names_only(s: &str) -> bool {
    const NAMES: &[&str] = &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", "SUN",
        "MON", "TUE", "WED", "THU", "FRI", "SAT",
    ];
    s.split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .all(|w| NAMES.contains(&w.to_ascii_uppercase().as_str()))
}

/// The time zone a CronJob names (None: the controller's local zone, which is UTC here).
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, ScheduleError> {
    match name {
        None => Ok(TimeZone::UTC),
        Some(n) => TimeZone::get(n).map_err(|_| ScheduleError::UnknownTimeZone(n.to_string())),
    }
}

impl Schedule {
    pub fn new(schedule: &str, zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        Ok(Schedule {
            cron: parse(schedule)?,
            zone: time_zone(zone)?,
        })
    }

    fn zoned(&self, t: Timestamp) -> Zoned {
        t.to_zoned(self.zone.clone())
    }

    /// The first scheduled time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&self.zoned(t), false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The scheduled times in `(earliest, now]`, as the CronJob controller's
    /// `mostRecentScheduleTime` sees them: the most recent one and how many there were,
    /// counting no further than `limit` (Kubernetes gives up at 100 missed starts).
    pub fn missed(&self, earliest: Timestamp, now: Timestamp, limit: usize) -> Missed {
        let mut count = 0;
        let mut last = None;
        let mut t = earliest;
        while let Some(next) = self.next_after(t) {
            if next > now {
                break;
            }
            count += 1;
            last = Some(next);
            t = next;
            if count > limit {
                // Too many to count: the most recent one is still what matters.
                last = self
                    .cron
                    .find_previous_occurrence(&self.zoned(now), true)
                    .ok()
                    .map(|z| z.timestamp())
                    .or(last);
                break;
            }
        }
        Missed {
            most_recent: last,
            count,
        }
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Schedule, ScheduleError> {
        Schedule::new(s, None)
    }
}

/// Scheduled times that passed without a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missed {
    pub most_recent: Option<Timestamp>,
    /// How many (more than the limit when counting stopped there).
    pub count: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn kubernetes_schedules_parse_and_others_do_not() {
        for ok in [
            "*/1 * * * *",
            "0 0 * * *",
            "@hourly",
            "@daily",
            "@midnight",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "5 4 * * SUN",
            "0 22 * * MON-FRI",
            "0 0 1 JAN,JUL ?",
            "5/15 * * * *",
        ] {
            assert!(parse(ok).is_ok(), "{ok}: {:?}", parse(ok));
        }
        for bad in [
            "",
            "* * * *",
            "0 * * * * *",
            "61 * * * *",
            "0 0 L * *",
            "0 0 * * 5#2",
            "TZ=UTC 0 0 * * *",
            "CRON_TZ=Europe/Berlin * * * * *",
            "hello",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse("CRON_TZ=UTC * * * * *").unwrap_err(),
            ScheduleError::TimeZoneInSchedule
        );
    }

    #[test]
    fn next_and_missed_times() {
        let s: Schedule = "*/5 * * * *".parse().unwrap();
        assert_eq!(
            s.next_after(ts("2025-01-01T00:03:00Z")),
            Some(ts("2025-01-01T00:05:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2025-01-01T00:05:00Z")),
            Some(ts("2025-01-01T00:10:00Z"))
        );
        let m = s.missed(ts("2025-01-01T00:00:00Z"), ts("2025-01-01T00:17:00Z"), 100);
        assert_eq!(m.count, 3);
        assert_eq!(m.most_recent, Some(ts("2025-01-01T00:15:00Z")));
        let none = s.missed(ts("2025-01-01T00:00:00Z"), ts("2025-01-01T00:04:59Z"), 100);
        assert_eq!(none.most_recent, None);
        let many = s.missed(ts("2025-01-01T00:00:00Z"), ts("2025-01-02T00:01:00Z"), 100);
        assert!(many.count > 100);
        assert_eq!(many.most_recent, Some(ts("2025-01-02T00:00:00Z")));
    }

    #[test]
    fn time_zones_shift_the_schedule() {
        let s = Schedule::new("0 9 * * *", Some("Europe/Berlin")).unwrap();
        // 09:00 in Berlin in winter is 08:00 UTC.
        assert_eq!(
            s.next_after(ts("2025-01-01T00:00:00Z")),
            Some(ts("2025-01-01T08:00:00Z"))
        );
        // ... and 07:00 UTC in summer.
        assert_eq!(
            s.next_after(ts("2025-07-01T00:00:00Z")),
            Some(ts("2025-07-01T07:00:00Z"))
        );
        assert_eq!(
            Schedule::new("* * * * *", Some("Mars/Olympus")).unwrap_err(),
            ScheduleError::UnknownTimeZone("Mars/Olympus".into())
        );
    }
}
