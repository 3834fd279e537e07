//! `timeline TYPE`: who holds which resource when, as a terminal Gantt chart (one row per
//! resource, one character per time bucket) or as the server's JSON or YAML.

use blazar_api::{Timeline, TimelineInterval, TimelineResource};
use blazar_client::client::TimelineQuery;
use blazar_client::time::{parse_date, parse_wire};
use chrono::{DateTime, Local, TimeDelta, Utc};
use clap::{Args, ValueEnum};

use super::human::localizing;
use super::python::Py;
use super::{CliResult, Context, Failure, emit, yaml};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResourceType {
    Host,
    Floatingip,
    Network,
    Device,
}

impl ResourceType {
    fn path(self) -> &'static str {
        match self {
            ResourceType::Host => "/os-hosts",
            ResourceType::Floatingip => "/floatingips",
            ResourceType::Network => "/networks",
            ResourceType::Device => "/devices",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TimelineFormat {
    /// One row per resource, one character per time bucket
    Gantt,
    Json,
    Yaml,
}

/// Show who holds which resources over a window, as a chart
#[derive(Debug, Args)]
pub struct TimelineArgs {
    /// The resource type to show
    #[arg(value_enum)]
    resource_type: ResourceType,
    /// Start of the window (UTC unless an offset or `local` is given; now+1d works); now
    /// by default
    #[arg(long, value_name = "DATE")]
    start: Option<String>,
    /// End of the window; a week after the start by default
    #[arg(long, value_name = "DATE")]
    end: Option<String>,
    /// Only resources matching this property query (as in resource_properties)
    #[arg(long, value_name = "QUERY")]
    query: Option<String>,
    /// At most this many resources (the server says where the next page starts)
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Start after the resource with this id (the previous page's last)
    #[arg(long, value_name = "ID")]
    marker: Option<String>,
    /// Characters per line of the chart (40 to 1000); the terminal's width (or COLUMNS) by
    /// default
    #[arg(long, value_name = "COLUMNS", value_parser = clap::value_parser!(u16).range(40..=1000))]
    width: Option<u16>,
    /// The output format
    #[arg(short = 'f', long = "format", value_enum, default_value_t = TimelineFormat::Gantt)]
    format: TimelineFormat,
    /// Whether to disable indenting the JSON
    #[arg(long)]
    noindent: bool,
}

pub async fn show(ctx: &Context, args: TimelineArgs) -> CliResult {
    let now = Utc::now();
    let date = |text: &Option<String>, which: &str| -> CliResult<Option<String>> {
        text.as_deref()
            .map(|t| {
                parse_date(t, now)
                    .map(|d| d.to_wire())
                    .map_err(|e| Failure::plain(format!("--{which}: {e}")))
            })
            .transpose()
    };
    let query = TimelineQuery {
        start: date(&args.start, "start")?,
        end: date(&args.end, "end")?,
        query: args.query.clone(),
        limit: args.limit,
        marker: args.marker.clone(),
    };
    let timeline = ctx
        .client
        .timeline(args.resource_type.path(), &query)
        .await?;
    let text = match args.format {
        TimelineFormat::Gantt => {
            let width = args
                .width
                .map(usize::from)
                .or_else(chart_width)
                .unwrap_or(DEFAULT_WIDTH);
            gantt(&timeline, width, !localizing(ctx.utc))?
        }
        TimelineFormat::Json | TimelineFormat::Yaml => {
            let value = serde_json::to_value(&timeline)
                .map_err(|e| Failure::plain(format!("ERROR: {e}")))?;
            let value = Py::from(&value);
            if args.format == TimelineFormat::Json {
                let indent = if args.noindent { None } else { Some(2) };
                format!("{}\n", value.json_dumps(indent).unwrap_or_default())
            } else {
                yaml::dump(&value)
            }
        }
    };
    emit(&text);
    Ok(())
}

/// Width of a chart when neither `--width`, `COLUMNS` nor a terminal says.
const DEFAULT_WIDTH: usize = 100;
/// Fewer buckets than this make no chart.
const MIN_BUCKETS: usize = 10;
/// The widest a resource name may make the name column.
const MAX_NAME: usize = 24;

/// `COLUMNS` (what shells export, and what a test sets), else the terminal's width.
fn chart_width() -> Option<usize> {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|c| *c > 0)
        .or_else(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
        // A chart wider than a thousand columns helps no one; an absurd COLUMNS must not
        // allocate gigabytes.
        .map(|c| c.min(1000))
}

const FREE: char = '.';
const OWN: char = '=';
const OTHERS: char = '#';
const SLOTS: char = '+';
const CLEANING: char = '-';
const MAINTENANCE: char = 'x';

const LEGEND: &str = "legend: . free  = your project's lease  # another project's lease  \
+ instance slots partly used  - cleaning after a lease  x not reservable";

/// An interval with its dates read.
struct Span<'a> {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    blocked_until: DateTime<Utc>,
    interval: &'a TimelineInterval,
}

/// What one bucket of one resource shows, strongest first.
fn bucket_char(
    resource: &TimelineResource,
    busy: &[Span<'_>],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> char {
    if !resource.reservable {
        return MAINTENANCE;
    }
    let mut whole: Option<bool> = None;
    let mut cleaning = false;
    // Slots used in the bucket: the sum of every allocation touching it, an upper bound of
    // the peak, which is what a row of characters can show.
    let (mut vcpus, mut memory_mb, mut disk_gb, mut any_slots, mut own_slots) =
        (0i64, 0i64, 0i64, false, false);
    for Span {
        start,
        end,
        blocked_until,
        interval,
    } in busy
    {
        if *start >= to || *blocked_until <= from {
            continue;
        }
        if *end <= from {
            cleaning = true;
            continue;
        }
        match &interval.slots {
            None => whole = Some(whole.unwrap_or(false) || interval.own),
            Some(s) => {
                any_slots = true;
                own_slots |= interval.own;
                vcpus = vcpus.saturating_add(s.units.saturating_mul(s.vcpus));
                memory_mb = memory_mb.saturating_add(s.units.saturating_mul(s.memory_mb));
                disk_gb = disk_gb.saturating_add(s.units.saturating_mul(s.disk_gb));
            }
        }
    }
    if let Some(own) = whole {
        return if own { OWN } else { OTHERS };
    }
    if any_slots {
        let full = resource.instance_capacity.is_some_and(|c| {
            (c.vcpus > 0 && vcpus >= c.vcpus)
                || (c.memory_mb > 0 && memory_mb >= c.memory_mb)
                || (c.disk_gb > 0 && disk_gb >= c.disk_gb)
        });
        return match (full, own_slots) {
            (false, _) => SLOTS,
            (true, true) => OWN,
            (true, false) => OTHERS,
        };
    }
    if cleaning { CLEANING } else { FREE }
}

/// Pads or cuts `text` to exactly `width` characters.
fn fit(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        format!("{text}{}", " ".repeat(width - count))
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('~');
        cut
    }
}

/// The chart, `width` characters wide at most: a header with the window and the bucket
/// times (local time unless `utc`), one row per resource, and the legend.
pub fn gantt(timeline: &Timeline, width: usize, utc: bool) -> Result<String, Failure> {
    let bad = |what: &str| Failure::plain(format!("ERROR: the server sent a bad {what}"));
    let start = parse_wire(&timeline.start_date).ok_or_else(|| bad("start_date"))?;
    let end = parse_wire(&timeline.end_date).ok_or_else(|| bad("end_date"))?;
    let name_width = timeline
        .resources
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, MAX_NAME);
    // "name |....|"
    let buckets = width.saturating_sub(name_width + 3).max(MIN_BUCKETS);
    let span = (end - start).num_seconds().max(1);
    let at = |i: usize| start + TimeDelta::seconds(span * i as i64 / buckets as i64);
    let show = |t: DateTime<Utc>, format: &str| {
        if utc {
            t.format(format).to_string()
        } else {
            t.with_timezone(&Local).format(format).to_string()
        }
    };

    let mut out = String::new();
    let zone = if utc {
        "UTC".to_string()
    } else {
        show(start, "%:z")
    };
    out.push_str(&fit(
        &format!(
            "{} to {} ({zone})",
            show(start, "%Y-%m-%d %H:%M"),
            show(end, "%Y-%m-%d %H:%M"),
        ),
        width,
    ));
    out = out.trim_end().to_string();
    out.push('\n');

    // Bucket times: a tick and a label every `step` columns, as many as fit; with seconds
    // when labels are less than a minute apart, so that no two read the same.
    let label_width = 12;
    let step = label_width.max(buckets / 8).min(buckets);
    let label = if span * (step as i64) < 60 * buckets as i64 {
        "%H:%M:%S"
    } else {
        "%m-%d %H:%M"
    };
    let mut labels = String::new();
    let mut ticks = String::new();
    let mut column = 0;
    while column + label_width <= buckets {
        labels.push_str(&fit(&show(at(column), label), step.min(buckets - column)));
        ticks.push_str(&fit("|", step.min(buckets - column)));
        column += step;
    }
    let indent = " ".repeat(name_width + 2);
    out.push_str(format!("{indent}{labels}").trim_end());
    out.push('\n');
    out.push_str(format!("{indent}{ticks}").trim_end());
    out.push('\n');

    for resource in &timeline.resources {
        let mut busy = Vec::with_capacity(resource.busy.len());
        for interval in &resource.busy {
            let start = parse_wire(&interval.start_date).ok_or_else(|| bad("start_date"))?;
            let end = parse_wire(&interval.end_date).ok_or_else(|| bad("end_date"))?;
            let blocked_until = match &interval.blocked_until {
                Some(t) => parse_wire(t).ok_or_else(|| bad("blocked_until"))?,
                None => end,
            };
            busy.push(Span {
                start,
                end,
                blocked_until,
                interval,
            });
        }
        let row: String = (0..buckets)
            .map(|i| bucket_char(resource, &busy, at(i), at(i + 1)))
            .collect();
        out.push_str(&format!("{} |{row}|\n", fit(&resource.name, name_width)));
    }
    if timeline.resources.is_empty() {
        out.push_str("(no resources)\n");
    }
    if let Some(marker) = &timeline.next_marker {
        out.push_str(&fit(&format!("more: --marker {marker}"), width));
        out = out.trim_end().to_string();
        out.push('\n');
    }
    let per_bucket = TimeDelta::milliseconds(span * 1000 / buckets as i64);
    let legend = format!(
        "{LEGEND}  one column: {}",
        blazar_client::time::describe_duration(per_bucket)
    );
    for line in wrap(&legend, width) {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// Breaks `text` at spaces into lines of at most `width` characters (two spaces separate
/// legend entries and are kept together with the entry that follows).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for entry in text.split("  ") {
        let candidate = if line.is_empty() {
            entry.to_string()
        } else {
            format!("{line}  {entry}")
        };
        if candidate.chars().count() <= width || line.is_empty() {
            line = candidate;
        } else {
            lines.push(std::mem::take(&mut line));
            line = format!("  {entry}");
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use blazar_api::{InstanceSize, SlotUse};

    fn interval(start: &str, end: &str, own: bool, slots: Option<SlotUse>) -> TimelineInterval {
        TimelineInterval {
            start_date: start.into(),
            end_date: end.into(),
            blocked_until: None,
            status: "ACTIVE".into(),
            degraded: false,
            own,
            lease_id: None,
            lease_name: None,
            project_id: None,
            reservation_id: None,
            allocation: if slots.is_some() {
                "instances"
            } else {
                "whole"
            }
            .into(),
            slots,
        }
    }

    fn resource(name: &str, reservable: bool, busy: Vec<TimelineInterval>) -> TimelineResource {
        TimelineResource {
            id: name.into(),
            name: name.into(),
            reservable,
            non_reservable: Vec::new(),
            instance_capacity: Some(InstanceSize {
                vcpus: 4,
                memory_mb: 4096,
                disk_gb: 100,
            }),
            busy,
        }
    }

    #[test]
    fn one_character_per_bucket_fits_the_width() {
        let slot = |units| {
            Some(SlotUse {
                units,
                vcpus: 1,
                memory_mb: 512,
                disk_gb: 10,
            })
        };
        let timeline = Timeline {
            resource_type: "physical:host".into(),
            start_date: "2030-01-01T00:00:00.000000".into(),
            end_date: "2030-01-01T20:00:00.000000".into(),
            resources: vec![
                resource(
                    "compute-1",
                    true,
                    vec![
                        interval(
                            "2030-01-01T02:00:00.000000",
                            "2030-01-01T04:00:00.000000",
                            true,
                            None,
                        ),
                        TimelineInterval {
                            blocked_until: Some("2030-01-01T12:00:00.000000".into()),
                            ..interval(
                                "2030-01-01T10:00:00.000000",
                                "2030-01-01T11:00:00.000000",
                                false,
                                None,
                            )
                        },
                    ],
                ),
                resource(
                    "compute-2",
                    true,
                    vec![
                        interval(
                            "2030-01-01T00:00:00.000000",
                            "2030-01-01T10:00:00.000000",
                            false,
                            slot(1),
                        ),
                        interval(
                            "2030-01-01T05:00:00.000000",
                            "2030-01-01T10:00:00.000000",
                            true,
                            slot(3),
                        ),
                    ],
                ),
                resource("compute-3", false, Vec::new()),
            ],
            next_marker: None,
        };
        // 20 buckets of an hour each: "compute-1 |" is 11 characters, "|" one more.
        let text = gantt(&timeline, 32, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "2030-01-01 00:00 to 2030-01-01 ~");
        assert!(text.contains("one column: 1h"), "{text}");
        assert_eq!(lines[1], "           01-01 00:00");
        assert_eq!(lines[2], "           |");
        assert_eq!(lines[3], "compute-1 |..==......#-........|");
        assert_eq!(lines[4], "compute-2 |+++++=====..........|");
        assert_eq!(lines[5], "compute-3 |xxxxxxxxxxxxxxxxxxxx|");
        assert!(lines[6].starts_with("legend: . free"), "{text}");
        for line in &lines {
            assert!(line.chars().count() <= 32, "{line:?} is wider than 32");
        }
    }

    #[test]
    fn a_window_of_a_minute_is_labelled_to_the_second() {
        let timeline = Timeline {
            resource_type: "physical:host".into(),
            start_date: "2030-01-01T09:00:00.000000".into(),
            end_date: "2030-01-01T09:01:00.000000".into(),
            resources: vec![resource("compute-1", true, Vec::new())],
            next_marker: None,
        };
        let text = gantt(&timeline, 200, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let labels: Vec<&str> = lines[1].split_whitespace().collect();
        assert!(labels.len() > 1, "{text}");
        assert_eq!(labels[0], "09:00:00", "{text}");
        let mut distinct = labels.clone();
        distinct.dedup();
        assert_eq!(distinct, labels, "no two labels read the same: {text}");
        // 60 s over 188 columns.
        assert!(text.contains("one column: 319ms"), "{text}");
    }

    #[test]
    fn legends_wrap_between_entries() {
        let lines = wrap(LEGEND, 50);
        assert!(lines.len() > 1);
        for line in &lines {
            assert!(line.chars().count() <= 50, "{line}");
        }
        assert_eq!(lines.concat().replace("  ", ""), LEGEND.replace("  ", ""));
    }
}
