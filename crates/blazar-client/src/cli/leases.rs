//! `lease-*` commands: list, show, create (with `--wait`), update, delete, and `lease-wait`.

use std::io::IsTerminal;
use std::time::Duration;

use blazar_client::NewLease;
use blazar_client::api::{LeaseUpdate, RefusalReason, ReservationRef};
use blazar_client::time::{
    DateInput, describe_duration, floor_minute, format_minute, parse_date, parse_duration,
    parse_wire,
};
use blazar_client::wait::{WaitOutcome, status_of, wait_for_lease};
use chrono::{TimeDelta, Utc};
use clap::{ArgGroup, Args};
use serde_json::{Map, Value};

use super::human::{describe_date, localize};
use super::output::{
    ShowOutput, SortedListOutput, check_sort, render_list, render_show, show_fields, sort_objects,
};
use super::reservations::{RequestArgs, parse_update};
use super::resolve::{IdShape, Lookup, find_id};
use super::{CliResult, Context, EXIT_TIMEOUT, EXIT_UNREACHABLE, Failure, emit};

const LIST_COLUMNS: &[&str] = &["id", "name", "start_date", "end_date"];

pub(super) const LEASES: Lookup<'static> = Lookup {
    resource: "lease",
    list_path: "/leases",
    list_key: "leases",
    name_keys: &["name"],
    shape: IdShape::Uuid,
    list_command: "lease-list",
};

/// Show details about the given lease
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID or name of lease to look up
    #[arg(value_name = "LEASE")]
    id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a lease
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Name for the lease
    #[arg(value_name = "LEASE")]
    name: String,
    #[command(flatten)]
    request: RequestArgs,
    /// Start of the lease (default: now, the server's current minute)
    #[arg(long = "start-date", value_name = "DATE")]
    start: Option<String>,
    /// End of the lease (default: 24h after now)
    #[arg(long = "end-date", value_name = "DATE", conflicts_with = "duration")]
    end: Option<String>,
    /// Length of the lease instead of --end-date, e.g. 3h, 1d12h
    #[arg(long, value_name = "DURATION")]
    duration: Option<String>,
    /// Book the earliest window of --duration in which the lease fits, from --start-date
    /// (default now) to --within (default 30 days); searched and booked at once
    #[arg(long, requires = "duration", conflicts_with_all = ["end", "before_end", "wait"])]
    earliest: bool,
    /// With --earliest: the lease must end within this span of --start-date, e.g. 7d
    #[arg(long, value_name = "DURATION", requires = "earliest")]
    within: Option<String>,
    /// Time for taking an action before the end of the lease (default: depends on system
    /// default)
    #[arg(long = "before-end-date", value_name = "DATE")]
    before_end: Option<String>,
    /// Creates an event with key/value pairs for the lease. Specify option multiple times to
    /// create multiple events. event_type: type of event (e.g. notification). event_date:
    /// Time for event (YYYY-MM-DD HH:MM) UTC TZ
    #[arg(long = "event", value_name = "event_type=STR,event_date=TIME")]
    events: Vec<String>,
    /// After creating it, wait until the lease is ACTIVE (exit code 3 on timeout, 4 if it
    /// fails)
    #[arg(long, help_heading = "Waiting")]
    wait: bool,
    /// Give up waiting after this long, e.g. 10m (default: no limit)
    #[arg(
        long,
        value_name = "DURATION",
        requires = "wait",
        help_heading = "Waiting"
    )]
    timeout: Option<String>,
    /// Time between two looks at the lease
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "2s",
        help_heading = "Waiting"
    )]
    poll_interval: String,
    /// Only ask whether the lease would be created, and with what: the server answers as
    /// for a create (the lease and its hosts, or why not) and writes nothing
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
    #[command(flatten)]
    out: ShowOutput,
}

/// Update a lease
#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("end_change").args(["prolong_for", "prolong_for_legacy", "reduce_by", "end_date"])),
    group(ArgGroup::new("start_change").args(["defer_by", "advance_by", "start_date"]))
)]
pub struct UpdateArgs {
    /// ID or name of lease to update
    #[arg(value_name = "LEASE")]
    id: String,
    /// New name for the lease
    #[arg(long)]
    name: Option<String>,
    /// Reservation values to update. The reservation must be selected with the
    /// id=<reservation-id> key-value pair
    #[arg(long = "reservation", value_name = "KEY=VALUE,...")]
    reservations: Vec<String>,
    /// Time to prolong lease for
    #[arg(long, value_name = "DURATION")]
    prolong_for: Option<String>,
    #[arg(long = "prolong_for", hide = true)]
    prolong_for_legacy: Option<String>,
    /// Time to reduce lease by
    #[arg(long, value_name = "DURATION")]
    reduce_by: Option<String>,
    /// End date of the lease
    #[arg(long, value_name = "DATE")]
    end_date: Option<String>,
    /// Time to defer the lease start
    #[arg(long, value_name = "DURATION")]
    defer_by: Option<String>,
    /// Time to advance the lease start
    #[arg(long, value_name = "DURATION")]
    advance_by: Option<String>,
    /// Start date of the lease
    #[arg(long, value_name = "DATE")]
    start_date: Option<String>,
    /// Time of the before-end action
    #[arg(long, value_name = "DATE")]
    before_end_date: Option<String>,
    /// Only ask whether the lease could be changed so: the server answers as for the
    /// update (the lease as it would be, or why not) and writes nothing
    #[arg(long)]
    dry_run: bool,
    /// How to print the lease (the one a dry run would leave, or the updated one); the
    /// default table prints only `Updated lease: <id>`, as Blazar's client does
    #[command(flatten)]
    out: ShowOutput,
}

/// Delete a lease
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID or name of lease to delete
    #[arg(value_name = "LEASE")]
    id: String,
}

/// Wait until a lease reaches a status
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// ID or name of lease to wait for
    #[arg(value_name = "LEASE")]
    id: String,
    /// Status to wait for: PENDING, ACTIVE, TERMINATED or ERROR
    #[arg(long, default_value = "ACTIVE", value_parser = ["PENDING", "ACTIVE", "TERMINATED", "ERROR"], ignore_case = true)]
    status: String,
    /// Give up after this long, e.g. 10m, 1h30m (default: no limit)
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Time between two looks at the lease
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    poll_interval: String,
}

pub async fn list(ctx: &Context, list: SortedListOutput) -> CliResult {
    check_sort(&list.sort_by, LIST_COLUMNS)?;
    let mut leases: Vec<Map<String, Value>> = ctx.client.get("/leases", "leases").await?;
    sort_objects(&mut leases, &list.sort_by);
    if list.out.is_human() {
        leases.iter_mut().for_each(|lease| localize(lease, ctx.utc));
    }
    emit(&render_list(&leases, LIST_COLUMNS, &list.out)?);
    Ok(())
}

/// Renders one object for a show-type command.
pub fn show_object(
    ctx: &Context,
    mut object: Map<String, Value>,
    out: &ShowOutput,
) -> CliResult<String> {
    if out.is_human() {
        localize(&mut object, ctx.utc);
    }
    render_show(show_fields(&object, true), out)
}

/// `GET path` and prints the object under `key`, as a show-type command does.
pub async fn get_and_show(ctx: &Context, path: &str, key: &str, out: &ShowOutput) -> CliResult {
    let object: Map<String, Value> = ctx.client.get(path, key).await?;
    emit(&show_object(ctx, object, out)?);
    Ok(())
}

/// `DELETE path` and says so, as a delete-type command does: `Deleted <what>: <name>`.
pub async fn delete_and_say(ctx: &Context, path: &str, what: &str, name: &str) -> CliResult {
    ctx.client.delete(path).await?;
    emit(&format!("Deleted {what}: {name}\n"));
    Ok(())
}

/// What a list-type command of resources without dates to localise shows: the objects under
/// `key` of `GET path`, in `columns`.
pub struct Listing {
    pub path: &'static str,
    pub key: &'static str,
    pub columns: &'static [&'static str],
}

/// `GET path` and prints the list sorted by `--sort-by`, as such a command does.
pub async fn get_and_list(ctx: &Context, listing: &Listing, list: &SortedListOutput) -> CliResult {
    check_sort(&list.sort_by, listing.columns)?;
    let mut items: Vec<Map<String, Value>> = ctx.client.get(listing.path, listing.key).await?;
    sort_objects(&mut items, &list.sort_by);
    emit(&render_list(&items, listing.columns, &list.out)?);
    Ok(())
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let id = find_id(ctx, &LEASES, &args.id).await?;
    let lease: Map<String, Value> = ctx
        .client
        .get(
            &format!("/leases/{}", blazar_client::client::segment(&id)),
            "lease",
        )
        .await?;
    emit(&show_object(ctx, lease, &args.out)?);
    Ok(())
}

/// The line after a dry run's lease.
const DRY_RUN_NOTE: &str = "Dry run: nothing was written.\n";

/// Prints a dry run's answer: `heading`, the lease as `out` formats it, and the note. In a
/// machine format only the lease goes to stdout (what a person reads goes to stderr), so
/// that it stays parseable.
fn emit_dry_run(
    heading: &str,
    lease: Map<String, Value>,
    ctx: &Context,
    out: &ShowOutput,
) -> CliResult<()> {
    let table = show_object(ctx, lease, out)?;
    if out.format == super::output::ShowFormat::Table {
        emit(&format!("{heading}\n{table}{DRY_RUN_NOTE}"));
    } else {
        eprintln!("{heading}");
        emit(&table);
        eprint!("{DRY_RUN_NOTE}");
    }
    Ok(())
}

/// Why the server refused a lease create or update, one line per reason, for after its
/// message. Dates are Blazar's, in UTC.
pub fn describe_reasons(reasons: &[RefusalReason]) -> String {
    reasons
        .iter()
        .map(|r| format!("  {}\n", describe_reason(r)))
        .collect()
}

fn describe_reason(r: &RefusalReason) -> String {
    let minute = |text: &str| parse_wire(text).map_or_else(|| text.to_string(), format_minute);
    let mut parts: Vec<String> = Vec::new();
    let mut subject = match &r.reservation {
        Some(ReservationRef::Position(n)) => format!("reservation {n}"),
        Some(ReservationRef::Id(id)) => format!("reservation {id}"),
        None => String::new(),
    };
    if let Some(kind) = &r.resource_type {
        subject = format!("{subject} ({kind})").trim_start().to_string();
    }
    if let Some(q) = &r.requested {
        parts.push(format!("requested {}", describe_requested(q)));
    }
    if let Some(matching) = r.matching {
        parts.push(format!("{matching} matching"));
    }
    if let Some(free) = r.free {
        let window = match (&r.start_date, &r.end_date) {
            (Some(start), Some(end)) => {
                format!(" from {} to {} UTC", minute(start), minute(end))
            }
            _ => String::new(),
        };
        parts.push(format!("{free} free{window}"));
    }
    if let Some(Some(offer)) = &r.next_offer {
        parts.push(format!(
            "next offer: {} to {} UTC",
            minute(&offer.start_date),
            minute(&offer.end_date)
        ));
    }
    if let Some(rule) = &r.rule {
        parts.push(format!("refused by policy rule {rule}"));
    }
    if let Some(field) = &r.field {
        parts.push(format!("bad field: {field}"));
    }
    if let Some(filter) = &r.filter {
        parts.push(format!("refused by usage enforcement filter {filter}"));
    }
    if let Some(q) = &r.quota {
        let when = match (&q.at, &q.month) {
            (Some(at), _) => format!(" at {} UTC", minute(at)),
            (None, Some(month)) => format!(" in {month}"),
            (None, None) => String::new(),
        };
        parts.push(format!(
            "quota {}: {} in use{when}, {} requested, limit {}",
            q.name, q.in_use, q.requested, q.limit
        ));
    }
    match (subject.is_empty(), parts.is_empty()) {
        (true, _) => parts.join("; "),
        (false, true) => subject,
        (false, false) => format!("{subject}: {}", parts.join("; ")),
    }
}

fn describe_requested(q: &blazar_client::api::Requested) -> String {
    let mut out: Vec<String> = Vec::new();
    let numbers = [
        ("min", q.min.map(i64::from)),
        ("max", q.max.map(i64::from)),
        ("amount", q.amount.map(i64::from)),
        ("vcpus", q.vcpus),
        ("memory_mb", q.memory_mb),
        ("disk_gb", q.disk_gb),
    ];
    for (key, value) in numbers {
        if let Some(v) = value {
            out.push(format!("{key} {v}"));
        }
    }
    for (key, value) in [
        ("affinity", &q.affinity),
        ("flavor", &q.flavor),
        ("network", &q.network_id),
    ] {
        if let Some(v) = value {
            out.push(format!("{key} {v}"));
        }
    }
    if !q.required_floatingips.is_empty() {
        out.push(format!("addresses {}", q.required_floatingips.join(" ")));
    }
    out.join(", ")
}

fn incorrect(detail: impl std::fmt::Display) -> Failure {
    Failure::plain(format!("The lease parameters are incorrect: {detail}"))
}

fn duration_arg(option: &str, text: &str) -> CliResult<TimeDelta> {
    parse_duration(text).map_err(|e| Failure::plain(format!("{option}: {e}")))
}

fn std_duration(option: &str, text: &str) -> CliResult<Duration> {
    let delta = duration_arg(option, text)?;
    delta
        .to_std()
        .map_err(|_| Failure::plain(format!("{option}: the duration must be positive")))
}

fn parse_event(argument: &str) -> CliResult<Value> {
    let err_msg = format!(
        "Invalid event argument '{argument}'. Event arguments must be of the form --event \
         <event_type=str,event_date=time>"
    );
    let mut event_type = String::new();
    let mut event_date = String::new();
    for pair in argument.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Failure::plain(err_msg));
        };
        match key {
            "event_type" => event_type = value.to_string(),
            "event_date" => event_date = value.to_string(),
            _ => return Err(Failure::plain(err_msg)),
        }
    }
    if event_type.is_empty() && event_date.is_empty() {
        return Err(Failure::plain(err_msg));
    }
    let date = parse_date(&event_date, Utc::now()).map_err(incorrect)?;
    Ok(serde_json::json!({ "event_type": event_type, "event_date": date.to_wire() }))
}

pub async fn create(ctx: &Context, args: CreateArgs) -> CliResult<u8> {
    if args.earliest {
        return create_earliest(ctx, args).await;
    }
    let now = Utc::now();
    let start = match &args.start {
        Some(text) => parse_date(text, now).map_err(incorrect)?,
        None => DateInput::Now,
    };
    // The server reads `now` as its current minute; the client's clock stands in for it.
    let start_at = start.instant(floor_minute(now));
    let end = match (&args.end, &args.duration) {
        (Some(text), _) => parse_date(text, now).map_err(incorrect)?,
        (None, Some(duration)) => DateInput::At(start_at + duration_arg("--duration", duration)?),
        (None, None) => DateInput::At(floor_minute(now) + TimeDelta::days(1)),
    };
    let end_at = end.instant(floor_minute(now));
    if start_at > end_at {
        let which = if args.end.is_none() && args.duration.is_none() {
            "the default end, 24h from now,"
        } else {
            "the end"
        };
        return Err(incorrect(format!(
            "the start ({}) is after {which} ({}); give a later --end-date, or --duration",
            format_minute(start_at),
            format_minute(end_at)
        )));
    }
    let before_end = match &args.before_end {
        Some(text) => {
            let at = parse_date(text, now).map_err(incorrect)?.instant(now);
            if at < start_at || at > end_at {
                return Err(incorrect(format!(
                    "--before-end-date {} is outside the lease ({} to {})",
                    format_minute(at),
                    format_minute(start_at),
                    format_minute(end_at)
                )));
            }
            Some(format_minute(at))
        }
        None => None,
    };
    // A lease without reservations is allowed, as python-blazarclient and the API allow it.
    let reservations = args.request.parse()?;
    let events = args
        .events
        .iter()
        .map(|e| parse_event(e))
        .collect::<CliResult<Vec<_>>>()?;
    let request = NewLease {
        name: Some(Value::String(args.name.clone())),
        start_date: Some(Value::String(start.to_wire())),
        end_date: Some(Value::String(end.to_wire())),
        // Sent as null when not given, as python-blazarclient sends it.
        before_end_date: Some(before_end.map_or(Value::Null, Value::String)),
        reservations: Some(Value::Array(
            reservations.into_iter().map(Value::Object).collect(),
        )),
        events: Some(Value::Array(events)),
        ..NewLease::default()
    };
    submit(ctx, &args, &request).await
}

/// Sends a lease create: as a dry run, or for real (then waits for it when asked).
async fn submit(
    ctx: &Context,
    args: &CreateArgs,
    request: &impl serde::Serialize,
) -> CliResult<u8> {
    let plan = WaitPlan::new("ACTIVE", args.timeout.as_deref(), &args.poll_interval)?;
    if args.dry_run {
        let lease: Map<String, Value> = ctx
            .client
            .post("/leases?dry_run=true", "lease", request)
            .await?;
        emit_dry_run("Would create a new lease:", lease, ctx, &args.out)?;
        return Ok(0);
    }
    let lease: Map<String, Value> = ctx.client.post("/leases", "lease", request).await?;
    let id = lease
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !args.wait || lease.is_empty() {
        print_created(ctx, lease, &args.out)?;
        return Ok(0);
    }
    // With --wait the lease is printed as it is when the wait ends (ACTIVE, or the state
    // that ended the wait), not as it was created.
    let outcome = plan.outcome(ctx, &id, &args.name).await?;
    let last = match &outcome {
        WaitOutcome::Reached(l) | WaitOutcome::Unreachable(l) | WaitOutcome::TimedOut(l) => {
            l.clone()
        }
        WaitOutcome::Deleted => lease,
    };
    print_created(ctx, last, &args.out)?;
    plan.conclude(ctx, &id, &args.name, outcome)
}

/// `lease-create --earliest`: the server searches and books the first window that fits.
async fn create_earliest(ctx: &Context, args: CreateArgs) -> CliResult<u8> {
    let reservations = args.request.parse()?;
    if reservations.is_empty() {
        return Err(incorrect(
            "a lease needs at least one --physical-reservation or --reservation",
        ));
    }
    let mut body =
        super::offers::search_window(args.start.as_deref(), None, args.within.as_deref())?;
    body.extend(super::offers::durations(
        args.duration.as_deref(),
        None,
        None,
    )?);
    body.insert("name".into(), Value::String(args.name.clone()));
    body.insert("start_date".into(), Value::String("earliest".into()));
    body.insert(
        "reservations".into(),
        Value::Array(reservations.into_iter().map(Value::Object).collect()),
    );
    body.insert("events".into(), Value::Array(Vec::new()));
    submit(ctx, &args, &Value::Object(body)).await
}

fn print_created(ctx: &Context, lease: Map<String, Value>, out: &ShowOutput) -> CliResult<()> {
    if lease.is_empty() {
        emit(&render_show(
            vec![(String::new(), super::python::Py::Str(String::new()))],
            out,
        )?);
    } else {
        let table = show_object(ctx, lease, out)?;
        emit(&format!("Created a new lease:\n{table}"));
    }
    Ok(())
}

/// Moves one of the lease's dates by `delta`, as the Python client does for
/// `--prolong-for` and friends: from the date Blazar holds, to the minute.
fn shifted(
    lease: &Map<String, Value>,
    key: &str,
    option: &str,
    delta: TimeDelta,
) -> CliResult<String> {
    let current = lease
        .get(key)
        .and_then(Value::as_str)
        .and_then(parse_wire)
        .ok_or_else(|| {
            Failure::plain(format!(
                "the lease has no readable {key} to shift with {option}"
            ))
        })?;
    let shifted = current.checked_add_signed(delta).ok_or_else(|| {
        Failure::plain(format!(
            "{option} moves the {key} past any date the service accepts"
        ))
    })?;
    Ok(format_minute(shifted))
}

pub async fn update(ctx: &Context, args: UpdateArgs) -> CliResult {
    let now = Utc::now();
    // Every option is checked before the first request, so a typo costs no round trip.
    let prolong = args
        .prolong_for
        .as_ref()
        .or(args.prolong_for_legacy.as_ref());
    let end_shift = match (prolong, &args.reduce_by) {
        (Some(text), _) => Some(("--prolong-for", duration_arg("--prolong-for", text)?)),
        (None, Some(text)) => Some(("--reduce-by", -duration_arg("--reduce-by", text)?)),
        (None, None) => None,
    };
    let start_shift = match (&args.defer_by, &args.advance_by) {
        (Some(text), _) => Some(("--defer-by", duration_arg("--defer-by", text)?)),
        (None, Some(text)) => Some(("--advance-by", -duration_arg("--advance-by", text)?)),
        (None, None) => None,
    };
    let absolute = |option: &str, text: &Option<String>| -> CliResult<Option<String>> {
        text.as_deref()
            .map(|t| {
                parse_date(t, now)
                    .map(DateInput::to_wire)
                    .map_err(|e| Failure::plain(format!("{option}: {e}")))
            })
            .transpose()
    };
    let end_date = absolute("--end-date", &args.end_date)?;
    let start_date = absolute("--start-date", &args.start_date)?;
    let before_end_date = absolute("--before-end-date", &args.before_end_date)?;
    let reservations = args
        .reservations
        .iter()
        .map(|r| parse_update(r).map(Value::Object))
        .collect::<CliResult<Vec<_>>>()?;

    let id = find_id(ctx, &LEASES, &args.id).await?;
    let path = format!("/leases/{}", blazar_client::client::segment(&id));
    let lease: Map<String, Value> = if end_shift.is_some() || start_shift.is_some() {
        ctx.client.get(&path, "lease").await?
    } else {
        Map::new()
    };
    let end = match (end_date, end_shift) {
        (Some(date), _) => Some(date),
        (None, Some((option, delta))) => Some(shifted(&lease, "end_date", option, delta)?),
        (None, None) => None,
    };
    let start = match (start_date, start_shift) {
        (Some(date), _) => Some(date),
        (None, Some((option, delta))) => Some(shifted(&lease, "start_date", option, delta)?),
        (None, None) => None,
    };
    let changes = LeaseUpdate {
        name: args.name.clone().map(Value::String),
        start_date: start.map(Value::String),
        end_date: end.map(Value::String),
        before_end_date: before_end_date.map(Value::String),
        reservations: (!reservations.is_empty()).then_some(Value::Array(reservations)),
        ..LeaseUpdate::default()
    };
    if changes == LeaseUpdate::default() {
        return Err(Failure::plain(
            "No values to update passed: give --name, --end-date, --prolong-for, --reduce-by, \
             --start-date, --defer-by, --advance-by, --before-end-date or --reservation",
        ));
    }
    if args.dry_run {
        let answer: Result<Map<String, Value>, _> = ctx
            .client
            .put(&format!("{path}?dry_run=true"), "lease", &changes)
            .await;
        let lease = match answer {
            Ok(lease) => lease,
            // A refused extension: say how far the lease can go as it is.
            Err(e) if changes.end_date.is_some() && changes.start_date.is_none() => {
                let mut failure = Failure::from(e);
                if let Some(note) = latest_end_note(ctx, &path).await {
                    failure.message = format!("{}\n{note}", failure.message);
                }
                return Err(failure);
            }
            Err(e) => return Err(e.into()),
        };
        emit_dry_run(
            &format!("Would update lease {}:", args.id),
            lease,
            ctx,
            &args.out,
        )?;
        return Ok(());
    }
    let lease: Map<String, Value> = ctx.client.put(&path, "lease", &changes).await?;
    if args.out.format == super::output::ShowFormat::Table {
        emit(&format!("Updated lease: {}\n", args.id));
    } else {
        emit(&show_object(ctx, lease, &args.out)?);
    }
    Ok(())
}

/// The extension check's latest end, as a line for a refused extension; nothing when
/// the check cannot be asked (an older server) or finds no later end.
async fn latest_end_note(ctx: &Context, path: &str) -> Option<String> {
    let answer: Value = ctx
        .client
        .get(&format!("{path}/extension"), "extension")
        .await
        .ok()?;
    let searched = answer["searched_until"].as_str().and_then(parse_wire)?;
    let show = |t| {
        if super::human::localizing(ctx.utc) {
            super::human::local_text(t)
        } else {
            format!("{} UTC", t.format("%Y-%m-%d %H:%M"))
        }
    };
    Some(
        match answer["latest_end_date"].as_str().and_then(parse_wire) {
            Some(latest) => format!(
                "Keeping the resources it holds, the lease can end at {} at the latest.",
                show(latest)
            ),
            None => format!(
                "Keeping the resources it holds, the lease cannot end later (searched until {}).",
                show(searched)
            ),
        },
    )
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let id = find_id(ctx, &LEASES, &args.id).await?;
    let path = format!("/leases/{}", blazar_client::client::segment(&id));
    delete_and_say(ctx, &path, "lease", &args.id).await
}

pub async fn wait(ctx: &Context, args: WaitArgs) -> CliResult<u8> {
    let id = find_id(ctx, &LEASES, &args.id).await?;
    let target = args.status.to_ascii_uppercase();
    let plan = WaitPlan::new(&target, args.timeout.as_deref(), &args.poll_interval)?;
    plan.run(ctx, &id, &args.id).await
}

/// When the lease starts (or ends, when waiting for its end), relative to now.
fn timing(lease: &Map<String, Value>, target: &str, utc: bool) -> String {
    let (key, verb) = if target == "TERMINATED" {
        ("end_date", "ends")
    } else {
        ("start_date", "starts")
    };
    lease
        .get(key)
        .and_then(Value::as_str)
        .and_then(parse_wire)
        .map(|at| {
            let left = at - Utc::now();
            if left > TimeDelta::zero() {
                format!(
                    "{verb} in {} ({})",
                    describe_duration(left),
                    describe_date(at, utc)
                )
            } else {
                format!(
                    "{verb} at {}, {} ago",
                    describe_date(at, utc),
                    describe_duration(-left)
                )
            }
        })
        .unwrap_or_default()
}

/// What `lease-wait` and `lease-create --wait` wait for: a status, for how long at most, and
/// how often to look. Its methods take the lease's id and `label`, the lease as the user
/// named it, for messages.
struct WaitPlan<'a> {
    target: &'a str,
    timeout: Option<Duration>,
    poll: Duration,
}

impl<'a> WaitPlan<'a> {
    /// The wait for `target` with the `--timeout` and `--poll-interval` given.
    fn new(target: &'a str, timeout: Option<&str>, poll_interval: &str) -> CliResult<Self> {
        Ok(WaitPlan {
            target,
            timeout: timeout.map(|t| std_duration("--timeout", t)).transpose()?,
            poll: std_duration("--poll-interval", poll_interval)?,
        })
    }

    /// Waits and turns the outcome into an exit code and message; progress goes to stderr
    /// only when a person is watching it.
    async fn run(&self, ctx: &Context, id: &str, label: &str) -> CliResult<u8> {
        let outcome = self.outcome(ctx, id, label).await?;
        self.conclude(ctx, id, label, outcome)
    }

    /// Waits, showing progress on a terminal.
    async fn outcome(&self, ctx: &Context, id: &str, label: &str) -> CliResult<WaitOutcome> {
        let target = self.target;
        let tty = std::io::stderr().is_terminal();
        let outcome = wait_for_lease(&ctx.client, id, target, self.timeout, self.poll, |lease| {
            if tty {
                eprint!(
                    "\r\x1b[KWaiting for lease {label} to be {target}: {}, {}",
                    status_of(lease),
                    timing(lease, target, ctx.utc)
                );
            }
        })
        .await;
        if tty {
            eprint!("\r\x1b[K");
        }
        Ok(outcome?)
    }

    /// The exit code or error a wait ends with.
    fn conclude(
        &self,
        ctx: &Context,
        id: &str,
        label: &str,
        outcome: WaitOutcome,
    ) -> CliResult<u8> {
        let (target, timeout) = (self.target, self.timeout);
        let tty = std::io::stderr().is_terminal();
        match outcome {
            WaitOutcome::Reached(_) => {
                if tty {
                    eprintln!("Lease {label} is {target}");
                }
                Ok(0)
            }
            WaitOutcome::Unreachable(lease) => {
                let status = status_of(&lease);
                let why = if status == "ERROR" {
                    format!("; `blazar lease-show {id}` shows which reservation or event failed")
                } else {
                    " any more".to_string()
                };
                Err(Failure::with_code(
                    format!("ERROR: lease {label} is {status} and cannot become {target}{why}"),
                    EXIT_UNREACHABLE,
                ))
            }
            WaitOutcome::Deleted => Err(Failure::with_code(
                format!("ERROR: lease {label} was deleted while waiting for it to be {target}"),
                EXIT_UNREACHABLE,
            )),
            WaitOutcome::TimedOut(lease) => {
                let limit = timeout
                    .and_then(|t| TimeDelta::from_std(t).ok())
                    .map(describe_duration)
                    .unwrap_or_default();
                Err(Failure::with_code(
                    format!(
                        "ERROR: lease {label} is still {} after {limit} (it {}); wait longer with \
                         `blazar lease-wait {id} --status {target} --timeout 1h`",
                        status_of(&lease),
                        timing(&lease, target, ctx.utc)
                    ),
                    EXIT_TIMEOUT,
                ))
            }
        }
    }
}
