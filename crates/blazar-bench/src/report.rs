//! Tables: a run as markdown (per step, and p50 per scale step), side-by-side ratios of two
//! runs, and the issue-6 targets with the measured figure next to each.

use std::fmt::Write;

use crate::model::{BurstStats, OpStats, RunReport, StepReport};

pub fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn mb(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |m| format!("{m:.0} MB"))
}

pub fn scale(step: &StepReport) -> String {
    format!(
        "{} hosts / {} allocations",
        step.hosts, step.standing_allocations
    )
}

fn short_scale(step: &StepReport) -> String {
    format!("{}h/{}a", step.hosts, thousands(step.allocations))
}

fn thousands(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// Every table of one run.
pub fn render_run(run: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {}\n", run.label);
    let _ = writeln!(
        out,
        "Server {} measured {} to {} on {}.\n",
        run.url,
        run.started,
        run.finished,
        run.machine.describe()
    );
    for step in &run.steps {
        let _ = writeln!(out, "#### {} ({})\n", scale(step), run.label);
        let seed = &step.seed;
        let mut notes = Vec::new();
        if seed.hosts_created > 0 {
            notes.push(format!(
                "seeded {} hosts in {:.1} s",
                seed.hosts_created, seed.hosts_seconds
            ));
        }
        if seed.leases_created > 0 || seed.failures > 0 {
            notes.push(format!(
                "seeded {} leases / {} allocations in {:.1} s ({} leases/s, {} failures)",
                seed.leases_created,
                seed.allocations_created,
                seed.leases_seconds,
                rate(seed.leases_per_s),
                seed.failures
            ));
        }
        notes.push(format!(
            "server RSS after seeding {}, at the end {} (peak {})",
            mb(step.rss_after_seed_mb),
            mb(step.rss_end_mb),
            mb(step.peak_rss_mb)
        ));
        if let Some(check) = &step.overlap_check {
            if check.race_clients > 0 {
                notes.push(format!(
                    "race: {} clients at once asked for the same host and hour, {} got it (1 is right)",
                    check.race_clients, check.race_winners
                ));
            }
            notes.push(format!(
                "overlapping allocation pairs after the concurrent creates: **{}** (of {} allocations on {} hosts)",
                check.overlapping_pairs, check.allocations, check.hosts
            ));
        }
        if let Some(lag) = &step.start_lag {
            notes.push(format!(
                "start lag of leases starting `now`: p50 {} ms, max {} ms ({} samples, {} timeouts)",
                ms(lag.p50_ms),
                ms(lag.max_ms),
                lag.samples,
                lag.timeouts
            ));
        }
        let waits: Vec<String> = step
            .ops
            .iter()
            .filter_map(|o| {
                let ms = o.lock_wait_ms?;
                let requests = (o.ok + o.errors).max(1) as f64;
                Some(format!(
                    "{} c={}: {:.0} ms in all, {:.2} ms per request, at most {} waiting",
                    o.op,
                    o.concurrency,
                    ms,
                    ms / requests,
                    o.most_lock_waiters.unwrap_or(0)
                ))
            })
            .collect();
        if !waits.is_empty() {
            notes.push(format!(
                "PostgreSQL lock wait (sessions waiting on a lock, sampled every 20 ms): {}",
                waits.join("; ")
            ));
        }
        if let Some(burst) = &step.burst {
            notes.push(format!(
                "burst of {} leases starting in one minute ({} created in {:.1} s): ACTIVE p50 {} ms, last {} ms after the start time ({} timeouts){}",
                burst.leases,
                burst.created,
                burst.create_s,
                ms(burst.p50_ms),
                ms(burst.last_ms),
                burst.timeouts,
                if burst.errors.is_empty() {
                    String::new()
                } else {
                    format!("; {}", burst.errors.join("; "))
                }
            ));
        }
        notes.push(format!(
            "step took {:.0} s; machine load average {} at the start, {} at the end",
            step.seconds,
            step.load_avg_start
                .map_or("n/a".into(), |l| format!("{l:.1}")),
            step.load_avg_end
                .map_or("n/a".into(), |l| format!("{l:.1}"))
        ));
        for n in notes {
            let _ = writeln!(out, "* {n}");
        }
        let _ = writeln!(
            out,
            "\n| operation | c | ok | errors | p50 ms | p95 ms | p99 ms | ok/s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for op in &step.ops {
            let name = match op.items {
                Some(n) => format!("{} ({n} items)", op.op),
                None => op.op.clone(),
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} | {} |",
                op.concurrency,
                op.ok,
                op.errors,
                ms(op.p50_ms),
                ms(op.p95_ms),
                ms(op.p99_ms),
                rate(op.throughput_per_s)
            );
        }
        let errors: Vec<String> = step
            .ops
            .iter()
            .filter_map(|o| {
                o.error_examples
                    .first()
                    .map(|e| format!("{} c={}: {e}", o.op, o.concurrency))
            })
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(out, "\nFirst error of each phase with errors:\n");
            for e in errors {
                let _ = writeln!(out, "* `{}`", e.replace('`', "'"));
            }
        }
        let _ = writeln!(out);
    }
    if run.steps.len() > 1 {
        out.push_str(&render_growth(run));
    }
    out
}

/// p50 of each operation at each scale step.
pub fn render_growth(run: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#### How cost grows: p50 ms per scale step ({})\n",
        run.label
    );
    let mut header = String::from("| operation | c |");
    let mut rule = String::from("| --- | ---: |");
    for step in &run.steps {
        let _ = write!(header, " {} |", short_scale(step));
        rule.push_str(" ---: |");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    let mut keys: Vec<(String, usize)> = Vec::new();
    for step in &run.steps {
        for op in &step.ops {
            let key = (op.op.clone(), op.concurrency);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    for (name, c) in keys {
        let mut row = format!("| {name} | {c} |");
        for step in &run.steps {
            let cell = find(step, &name, c).map_or("".into(), |o| ms(o.p50_ms));
            let _ = write!(row, " {cell} |");
        }
        let _ = writeln!(out, "{row}");
    }
    let mut rss = String::from("| server RSS after seeding (MB) | |");
    for step in &run.steps {
        let _ = write!(
            rss,
            " {} |",
            step.rss_after_seed_mb
                .map_or("".into(), |m| format!("{m:.0}"))
        );
    }
    let _ = writeln!(out, "{rss}\n");
    out
}

fn find<'a>(step: &'a StepReport, op: &str, c: usize) -> Option<&'a OpStats> {
    step.ops.iter().find(|o| o.op == op && o.concurrency == c)
}

/// Side by side: the same operation at the same scale on two servers, with ratios.
pub fn render_compare(base: &RunReport, other: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#### {} vs {}: p50 latency and throughput, ratio = {} / {}\n",
        base.label, other.label, base.label, other.label
    );
    let _ = writeln!(
        out,
        "| scale | operation | c | {b} p50 ms | {o} p50 ms | p50 ratio | {b} ok/s | {o} ok/s | throughput ratio |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        b = base.label,
        o = other.label
    );
    for bs in &base.steps {
        let Some(os) = other
            .steps
            .iter()
            .find(|s| s.hosts == bs.hosts && s.allocations == bs.allocations)
        else {
            continue;
        };
        let mut one_sided: Vec<&str> = Vec::new();
        for bo in &bs.ops {
            let Some(oo) = find(os, &bo.op, bo.concurrency) else {
                continue;
            };
            // An operation one side does not offer (every request refused) has no ratio.
            if bo.ok == 0 || oo.ok == 0 {
                if !one_sided.contains(&bo.op.as_str()) {
                    one_sided.push(&bo.op);
                }
                continue;
            }
            let ratio = |a: f64, b: f64| {
                if a > 0.0 && b > 0.0 {
                    format!("{:.0}x", a / b)
                } else {
                    "n/a".into()
                }
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                short_scale(bs),
                bo.op,
                bo.concurrency,
                ms(bo.p50_ms),
                ms(oo.p50_ms),
                ratio(bo.p50_ms, oo.p50_ms),
                rate(bo.throughput_per_s),
                rate(oo.throughput_per_s),
                ratio(oo.throughput_per_s, bo.throughput_per_s)
            );
        }
        if let (Some(bl), Some(ol)) = (&bs.start_lag, &os.start_lag) {
            let _ = writeln!(
                out,
                "| {} | start lag (p50) | 1 | {} | {} | {} | | | |",
                short_scale(bs),
                ms(bl.p50_ms),
                ms(ol.p50_ms),
                if ol.p50_ms > 0.0 {
                    format!("{:.0}x", bl.p50_ms / ol.p50_ms)
                } else {
                    "n/a".into()
                }
            );
        }
        if let (Some(bb), Some(ob)) = (&bs.burst, &os.burst) {
            // A lease never seen ACTIVE makes "last" a lower bound.
            let last = |b: &BurstStats| {
                if b.timeouts > 0 {
                    format!("> {} ({} never)", ms(b.last_ms), b.timeouts)
                } else {
                    ms(b.last_ms)
                }
            };
            for (what, b, o, bt, ot) in [
                (
                    "ACTIVE p50",
                    bb.p50_ms,
                    ob.p50_ms,
                    ms(bb.p50_ms),
                    ms(ob.p50_ms),
                ),
                ("last ACTIVE", bb.last_ms, ob.last_ms, last(bb), last(ob)),
            ] {
                let _ = writeln!(
                    out,
                    "| {} | burst of {}/{} leases starting together: {what} after the start | | {} | {} | {} | | | |",
                    short_scale(bs),
                    bb.created,
                    ob.created,
                    bt,
                    ot,
                    if o > 0.0 {
                        format!("{:.0}x", b / o)
                    } else {
                        "n/a".into()
                    }
                );
            }
        }
        if let (Some(bc), Some(oc)) = (&bs.overlap_check, &os.overlap_check)
            && bc.race_clients > 0
            && oc.race_clients > 0
        {
            let _ = writeln!(
                out,
                "| {} | race winners ({} clients, one host, 1 is right) | | {} | {} | | | | |",
                short_scale(bs),
                bc.race_clients,
                bc.race_winners,
                oc.race_winners
            );
        }
        if let (Some(bc), Some(oc)) = (&bs.overlap_check, &os.overlap_check) {
            let _ = writeln!(
                out,
                "| {} | overlapping pairs after c=max creates | | {} | {} | | | | |",
                short_scale(bs),
                bc.overlapping_pairs,
                oc.overlapping_pairs
            );
        }
        if !one_sided.is_empty() {
            let _ = writeln!(
                out,
                "| {} | answered by one side only (left out): {} | | | | | | | |",
                short_scale(bs),
                one_sided.join(", ")
            );
        }
    }
    out.push('\n');
    out
}

/// The issue-6 targets at 10,000 hosts / 100,000 allocations, each with the measured figure.
pub fn render_targets(run: &RunReport, postgres: bool) -> String {
    let mut out = String::new();
    let step = run
        .steps
        .iter()
        .find(|s| s.hosts == 10_000 && s.allocations == 100_000)
        .or_else(|| run.steps.last());
    let Some(step) = step else {
        return out;
    };
    let _ = writeln!(
        out,
        "#### Issue-6 targets, {} at {}\n",
        run.label,
        scale(step)
    );
    if step.hosts != 10_000 || step.allocations != 100_000 {
        let _ = writeln!(
            out,
            "(the run has no 10,000 hosts / 100,000 allocations step; its largest step is shown)\n"
        );
    }
    let _ = writeln!(
        out,
        "| target | limit | measured | verdict |\n| --- | ---: | ---: | --- |"
    );
    let mut row = |name: &str,
                   limit: String,
                   measured: Option<f64>,
                   unit: &str,
                   at_most: bool,
                   bound: f64| {
        let (value, verdict) = match measured {
            None => ("not measured".to_string(), "n/a".to_string()),
            Some(v) => {
                let met = if at_most { v <= bound } else { v >= bound };
                let verdict = if met {
                    "met".to_string()
                } else if bound == 0.0 {
                    "missed".to_string()
                } else if at_most {
                    format!(
                        "missed by {}{unit} ({:.1}x the limit)",
                        ms(v - bound),
                        v / bound
                    )
                } else {
                    format!(
                        "missed by {}{unit} ({:.2}x the target)",
                        rate(bound - v),
                        v / bound
                    )
                };
                (
                    match unit {
                        "/s" => format!("{}/s", rate(v)),
                        "" => format!("{v:.0}"),
                        _ => format!("{}{unit}", ms(v)),
                    },
                    verdict,
                )
            }
        };
        let _ = writeln!(out, "| {name} | {limit} | {value} | {verdict} |");
    };
    let c1 = find(step, "lease_create", 1);
    let c64 = step
        .ops
        .iter()
        .filter(|o| o.op == "lease_create")
        .max_by_key(|o| o.concurrency);
    if postgres {
        row(
            "lease create p50, c=1",
            "<= 10 ms".into(),
            c1.map(|o| o.p50_ms),
            " ms",
            true,
            10.0,
        );
    } else {
        row(
            "lease create p50, c=1",
            "<= 5 ms".into(),
            c1.map(|o| o.p50_ms),
            " ms",
            true,
            5.0,
        );
        row(
            "lease create p99, c=1",
            "<= 25 ms".into(),
            c1.map(|o| o.p99_ms),
            " ms",
            true,
            25.0,
        );
        row(
            &format!(
                "successful creates/s, c={}",
                c64.map_or(64, |o| o.concurrency)
            ),
            ">= 500/s".into(),
            c64.map(|o| o.throughput_per_s),
            "/s",
            false,
            500.0,
        );
    }
    row(
        "overlapping allocations after concurrent creates",
        "0".into(),
        step.overlap_check
            .as_ref()
            .map(|c| c.overlapping_pairs as f64),
        "",
        true,
        0.0,
    );
    row(
        "race winners for one host and hour (1 is right)",
        "1".into(),
        step.overlap_check
            .as_ref()
            .filter(|c| c.race_clients > 0)
            .map(|c| c.race_winners as f64),
        "",
        true,
        1.0,
    );
    row(
        "lease list of one project (100 leases) p50, c=1",
        "<= 5 ms".into(),
        find(step, "lease_list_project", 1).map(|o| o.p50_ms),
        " ms",
        true,
        5.0,
    );
    row(
        &format!("host list of {} hosts p50, c=1", step.hosts),
        "<= 100 ms".into(),
        find(step, "host_list", 1).map(|o| o.p50_ms),
        " ms",
        true,
        100.0,
    );
    row(
        &format!("timeline of {} hosts over a month p50, c=1", step.hosts),
        "<= 150 ms".into(),
        find(step, "host_timeline_month", 1).map(|o| o.p50_ms),
        " ms",
        true,
        150.0,
    );
    row(
        "timeline of ~100 hosts matching a property over a week p50, c=1",
        "<= 10 ms".into(),
        find(step, "host_timeline_week_query", 1).map(|o| o.p50_ms),
        " ms",
        true,
        10.0,
    );
    row(
        "server RSS after seeding",
        "<= 200 MB".into(),
        step.rss_after_seed_mb,
        " MB",
        true,
        200.0,
    );
    row(
        "start lag of a lease starting now (max)",
        "<= 1000 ms".into(),
        step.start_lag
            .as_ref()
            .filter(|l| l.samples > 0)
            .map(|l| l.max_ms),
        " ms",
        true,
        1000.0,
    );
    out.push('\n');
    out
}
