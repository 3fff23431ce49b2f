//! `strftime_now(fmt)` for chat templates (Llama 3.x writes "Today Date: 26 Jul 2024").
//! minijinja-contrib's datetime support needs a feature we do not build, and templates use
//! only a handful of directives, so this is a small UTC-only formatter.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats the current UTC time.
pub fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(secs, fmt)
}

/// Formats a Unix time (UTC). Unknown directives are written back unchanged, like glibc.
pub fn strftime(unix_secs: i64, fmt: &str) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = WEEKDAYS[weekday];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{hour12:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn known_dates() {
        // `date -u -d @1721952000` = Fri Jul 26 00:00:00 UTC 2024.
        assert_eq!(strftime(1_721_952_000, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(1_721_952_000, "%A %B %e, %y"),
            "Friday July 26, 24"
        );
        // 2000-02-29 13:05:09 UTC, a leap day.
        assert_eq!(
            strftime(951_829_509, "%Y-%m-%d %H:%M:%S %I%p %a %%"),
            "2000-02-29 13:05:09 01PM Tue %"
        );
        assert_eq!(strftime(0, "%d %b %Y %Q"), "01 Jan 1970 %Q");
    }
}
