//! The `blazar` command line: global options, the command table, and running one command
//! to an exit code.

mod actions;
mod allocations;
mod examples;
mod feeds;
mod flavors;
mod floatingips;
mod human;
mod inventory;
mod leases;
mod offers;
mod output;
mod python;
mod quotas;
mod reservations;
mod resolve;
mod table;
mod timeline;
mod webhooks;
mod yaml;

use std::io::Write;
use std::path::PathBuf;

use blazar_client::{Client, ConnectOptions, Error};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use output::{SortedListOutput, sort_by_default};

/// Exit codes: 0 success, 1 an error, 2 a usage error (clap's, like argparse's); `lease-wait`
/// and `lease-create --wait` add 3 and 4.
pub const EXIT_ERROR: u8 = 1;
/// The wait ran out of time.
pub const EXIT_TIMEOUT: u8 = 3;
/// The lease can no longer reach the awaited status (ERROR, ended, or deleted).
pub const EXIT_UNREACHABLE: u8 = 4;

/// A command that did not succeed: what to print on stderr, and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    /// A problem found before asking the server; printed as is, as python-blazarclient
    /// prints its own checks.
    pub fn plain(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: EXIT_ERROR,
        }
    }

    pub fn with_code(message: impl Into<String>, code: u8) -> Failure {
        Failure {
            message: message.into(),
            code,
        }
    }
}

impl From<Error> for Failure {
    /// Anything the server (or the network) said: `ERROR: <message>`, as python-blazarclient
    /// prints Blazar's `error_message`.
    fn from(e: Error) -> Failure {
        let message = match &e {
            Error::Unreachable { .. } => format!(
                "ERROR: {e}. Is the server running, and is the endpoint right (--os-endpoint, \
                 BLAZAR_URL, or the Keystone catalog)?"
            ),
            Error::Api { reasons, .. } if !reasons.is_empty() => {
                format!(
                    "ERROR: {e}\n{}",
                    leases::describe_reasons(reasons).trim_end()
                )
            }
            _ => format!("ERROR: {e}"),
        };
        Failure::plain(message)
    }
}

pub type CliResult<T = ()> = Result<T, Failure>;

const AFTER_HELP: &str = "\
Connection (every option also reads the variable in brackets):
  blazar --os-endpoint http://127.0.0.1:1234/v1 --os-auth-type none lease-list
  BLAZAR_URL=http://127.0.0.1:1234 blazar host-list         # noauth blazar-server
  OS_CLOUD=mycloud blazar lease-list                        # clouds.yaml
  source openrc.sh && blazar lease-list                     # OS_AUTH_URL, OS_USERNAME, ...

Dates: tables show dates in the local time zone with their offset (unless --utc, or the
zone is UTC); -f json/yaml/value/csv/shell always print Blazar's own UTC values. Dates you
type are UTC unless they carry an offset or the word `local`; `now+1h30m` counts from now.

Exit codes: 0 success, 1 error, 2 bad usage, 3 lease-wait timed out, 4 the lease can no
longer reach the awaited status (ERROR, already ended, deleted).";

/// Command-line interface to Blazar, the OpenStack reservation service.
#[derive(Debug, Parser)]
#[command(name = "blazar", version, after_help = AFTER_HELP, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes, before or after its name.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection and authentication")]
pub struct GlobalArgs {
    /// Cloud name in clouds.yaml [OS_CLOUD]
    #[arg(long, global = true, value_name = "NAME")]
    pub os_cloud: Option<String>,
    /// none, admin_token, password, token or v3applicationcredential; guessed from what is
    /// given when absent [OS_AUTH_TYPE]
    #[arg(long, global = true, value_name = "TYPE")]
    pub os_auth_type: Option<String>,
    /// Keystone URL, e.g. http://keystone:5000/v3 [OS_AUTH_URL]
    #[arg(long, global = true, value_name = "URL")]
    pub os_auth_url: Option<String>,
    /// Blazar URL, skipping the catalog, e.g. http://127.0.0.1:1234/v1 [OS_ENDPOINT,
    /// BLAZAR_URL]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        alias = "os-endpoint-override"
    )]
    pub os_endpoint: Option<String>,
    /// Token: sent as is with admin_token, exchanged with token [OS_TOKEN]
    #[arg(long, global = true, value_name = "TOKEN")]
    pub os_token: Option<String>,
    /// [OS_USERNAME]
    #[arg(long, global = true, value_name = "NAME")]
    pub os_username: Option<String>,
    /// [OS_USER_ID]
    #[arg(long, global = true, value_name = "ID")]
    pub os_user_id: Option<String>,
    /// [OS_PASSWORD]
    #[arg(long, global = true, value_name = "PASSWORD")]
    pub os_password: Option<String>,
    /// [OS_PROJECT_NAME]
    #[arg(long, global = true, value_name = "NAME", alias = "os-tenant-name")]
    pub os_project_name: Option<String>,
    /// [OS_PROJECT_ID]
    #[arg(long, global = true, value_name = "ID", alias = "os-tenant-id")]
    pub os_project_id: Option<String>,
    /// [OS_USER_DOMAIN_NAME]
    #[arg(long, global = true, value_name = "NAME")]
    pub os_user_domain_name: Option<String>,
    /// [OS_USER_DOMAIN_ID]
    #[arg(long, global = true, value_name = "ID")]
    pub os_user_domain_id: Option<String>,
    /// [OS_PROJECT_DOMAIN_NAME]
    #[arg(long, global = true, value_name = "NAME")]
    pub os_project_domain_name: Option<String>,
    /// [OS_PROJECT_DOMAIN_ID]
    #[arg(long, global = true, value_name = "ID")]
    pub os_project_domain_id: Option<String>,
    /// [OS_APPLICATION_CREDENTIAL_ID]
    #[arg(long, global = true, value_name = "ID")]
    pub os_application_credential_id: Option<String>,
    /// [OS_APPLICATION_CREDENTIAL_NAME]
    #[arg(long, global = true, value_name = "NAME")]
    pub os_application_credential_name: Option<String>,
    /// [OS_APPLICATION_CREDENTIAL_SECRET]
    #[arg(long, global = true, value_name = "SECRET")]
    pub os_application_credential_secret: Option<String>,
    /// Region of the catalog endpoint [OS_REGION_NAME]
    #[arg(long, global = true, value_name = "REGION")]
    pub os_region_name: Option<String>,
    /// Catalog interface: public (default), internal or admin [OS_INTERFACE]
    #[arg(long, global = true, value_name = "INTERFACE", alias = "endpoint-type")]
    pub os_interface: Option<String>,
    /// CA bundle to trust besides the system's [OS_CACERT]
    #[arg(long, global = true, value_name = "FILE")]
    pub os_cacert: Option<PathBuf>,
    /// Do not verify TLS certificates [OS_INSECURE]
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Accepted for compatibility; only 1 exists
    #[arg(long, global = true, hide = true, value_name = "VERSION")]
    pub os_reservation_api_version: Option<String>,

    /// Show dates in UTC as Blazar sends them, not in the local time zone
    #[arg(long, global = true, help_heading = "Display")]
    pub utc: bool,
    /// Print each HTTP request and response status on stderr
    #[arg(long, global = true, help_heading = "Display")]
    pub debug: bool,
    /// Accepted for compatibility (python-blazarclient's log verbosity)
    #[arg(short, long, global = true, action = clap::ArgAction::Count, hide = true)]
    pub verbose: u8,
    /// Accepted for compatibility (python-blazarclient's log verbosity)
    #[arg(short, long, global = true, hide = true)]
    pub quiet: bool,
}

impl GlobalArgs {
    fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            cloud: self.os_cloud.clone(),
            auth_type: self.os_auth_type.clone(),
            auth_url: self.os_auth_url.clone(),
            endpoint: self.os_endpoint.clone(),
            token: self.os_token.clone(),
            username: self.os_username.clone(),
            user_id: self.os_user_id.clone(),
            password: self.os_password.clone(),
            project_name: self.os_project_name.clone(),
            project_id: self.os_project_id.clone(),
            user_domain_name: self.os_user_domain_name.clone(),
            user_domain_id: self.os_user_domain_id.clone(),
            project_domain_name: self.os_project_domain_name.clone(),
            project_domain_id: self.os_project_domain_id.clone(),
            application_credential_id: self.os_application_credential_id.clone(),
            application_credential_name: self.os_application_credential_name.clone(),
            application_credential_secret: self.os_application_credential_secret.clone(),
            region_name: self.os_region_name.clone(),
            interface: self.os_interface.clone(),
            cacert: self.os_cacert.clone(),
            insecure: self.insecure.then_some(true),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a list of leases
    #[command(name = "lease-list", mut_args(sort_by_default("name")))]
    LeaseList(SortedListOutput),
    #[command(name = "lease-show")]
    LeaseShow(leases::ShowArgs),
    #[command(name = "lease-create")]
    LeaseCreate(leases::CreateArgs),
    #[command(name = "lease-update")]
    LeaseUpdate(leases::UpdateArgs),
    #[command(name = "lease-delete")]
    LeaseDelete(leases::DeleteArgs),
    #[command(name = "lease-wait")]
    LeaseWait(leases::WaitArgs),
    #[command(name = "lease-offers")]
    LeaseOffers(offers::OffersArgs),
    #[command(name = "lease-actions")]
    LeaseActions(actions::LeaseActionsArgs),
    #[command(name = "action-list")]
    ActionList(actions::ListArgs),

    /// Print a list of hosts
    #[command(name = "host-list")]
    HostList(inventory::ListArgs),
    /// Show host details
    #[command(name = "host-show")]
    HostShow(inventory::ShowArgs),
    /// Move a host's reservations onto other matching hosts (for the rest of their leases)
    #[command(name = "host-reallocate")]
    HostReallocate(inventory::ReallocateArgs),
    #[command(name = "host-create")]
    HostCreate(inventory::HostCreateArgs),
    /// Update attributes of a host
    #[command(name = "host-update")]
    HostUpdate(inventory::UpdateArgs),
    /// Unset attributes of a host
    #[command(name = "host-unset")]
    HostUnset(inventory::UnsetArgs),
    /// Delete a host
    #[command(name = "host-delete")]
    HostDelete(inventory::DeleteArgs),
    /// List host properties
    #[command(name = "host-property-list")]
    HostPropertyList(inventory::PropertyListArgs),
    /// Show host property
    #[command(name = "host-property-show")]
    HostPropertyShow(inventory::PropertyShowArgs),
    /// Update attributes of a host property
    #[command(name = "host-property-set")]
    HostPropertySet(inventory::PropertySetArgs),

    /// Print a list of network segments
    #[command(name = "network-list")]
    NetworkList(inventory::ListArgs),
    /// Show network segment details
    #[command(name = "network-show")]
    NetworkShow(inventory::ShowArgs),
    #[command(name = "network-create")]
    NetworkCreate(inventory::NetworkCreateArgs),
    /// Update attributes of a network segment
    #[command(name = "network-update")]
    NetworkUpdate(inventory::UpdateArgs),
    /// Unset attributes of a network segment
    #[command(name = "network-unset")]
    NetworkUnset(inventory::UnsetArgs),
    /// Delete a network segment
    #[command(name = "network-delete")]
    NetworkDelete(inventory::DeleteArgs),
    /// List network properties
    #[command(name = "network-property-list")]
    NetworkPropertyList(inventory::PropertyListArgs),
    /// Show network property
    #[command(name = "network-property-show")]
    NetworkPropertyShow(inventory::PropertyShowArgs),
    /// Update attributes of a network property
    #[command(name = "network-property-set")]
    NetworkPropertySet(inventory::PropertySetArgs),

    /// Print a list of devices
    #[command(name = "device-list")]
    DeviceList(inventory::ListArgs),
    /// Show device details
    #[command(name = "device-show")]
    DeviceShow(inventory::ShowArgs),
    #[command(name = "device-create")]
    DeviceCreate(inventory::DeviceCreateArgs),
    #[command(name = "device-update")]
    DeviceUpdate(inventory::DeviceUpdateArgs),
    /// Unset attributes of a device
    #[command(name = "device-unset")]
    DeviceUnset(inventory::UnsetArgs),
    /// Delete a device
    #[command(name = "device-delete")]
    DeviceDelete(inventory::DeleteArgs),
    /// Move a device's reservations onto other matching devices
    #[command(name = "device-reallocate")]
    DeviceReallocate(inventory::ReallocateArgs),
    /// List device properties
    #[command(name = "device-property-list")]
    DevicePropertyList(inventory::PropertyListArgs),
    /// Show device property
    #[command(name = "device-property-show")]
    DevicePropertyShow(inventory::PropertyShowArgs),
    /// Update attributes of a device property
    #[command(name = "device-property-set")]
    DevicePropertySet(inventory::PropertySetArgs),

    /// Print a list of floating IPs
    #[command(name = "floatingip-list", mut_args(sort_by_default("id")))]
    FloatingipList(SortedListOutput),
    #[command(name = "floatingip-show")]
    FloatingipShow(floatingips::ShowArgs),
    #[command(name = "floatingip-create")]
    FloatingipCreate(floatingips::CreateArgs),
    #[command(name = "floatingip-delete")]
    FloatingipDelete(floatingips::DeleteArgs),

    /// List calendar feeds (of your project; an admin sees every feed)
    #[command(name = "ical-feed-list", mut_args(sort_by_default("created_at")))]
    IcalFeedList(SortedListOutput),
    #[command(name = "ical-feed-create")]
    IcalFeedCreate(feeds::CreateArgs),
    #[command(name = "ical-feed-delete")]
    IcalFeedDelete(feeds::DeleteArgs),

    /// List webhooks (of your project; an admin sees every webhook)
    #[command(name = "webhook-list", mut_args(sort_by_default("created_at")))]
    WebhookList(SortedListOutput),
    #[command(name = "webhook-create")]
    WebhookCreate(webhooks::CreateArgs),
    #[command(name = "webhook-show")]
    WebhookShow(webhooks::ShowArgs),
    #[command(name = "webhook-delete")]
    WebhookDelete(webhooks::DeleteArgs),
    #[command(name = "webhook-deliveries")]
    WebhookDeliveries(webhooks::DeliveriesArgs),
    #[command(name = "webhook-redeliver")]
    WebhookRedeliver(webhooks::RedeliverArgs),

    /// List the projects that have quota overrides (a non-admin sees only its own)
    #[command(name = "quota-list", mut_args(sort_by_default("project_id")))]
    QuotaList(SortedListOutput),
    #[command(name = "quota-show")]
    QuotaShow(quotas::ShowArgs),
    #[command(name = "quota-set")]
    QuotaSet(quotas::SetArgs),
    #[command(name = "quota-delete")]
    QuotaDelete(quotas::DeleteArgs),

    /// Print a list of flavors
    #[command(name = "flavor-list", mut_args(sort_by_default("name")))]
    FlavorList(SortedListOutput),
    #[command(name = "flavor-show")]
    FlavorShow(flavors::ShowArgs),
    #[command(name = "flavor-create")]
    FlavorCreate(flavors::CreateArgs),
    #[command(name = "flavor-delete")]
    FlavorDelete(flavors::DeleteArgs),

    #[command(name = "allocation-list")]
    AllocationList(allocations::ListArgs),
    #[command(name = "allocation-show")]
    AllocationShow(allocations::ShowArgs),

    #[command(name = "timeline")]
    Timeline(timeline::TimelineArgs),

    /// Print a shell completion script
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// What commands get: the connection and display settings.
pub struct Context {
    pub client: Client,
    pub utc: bool,
}

/// Writes to stdout; a closed pipe (`blazar lease-list | head -1`) ends quietly.
pub fn emit(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

async fn connect(global: &GlobalArgs) -> CliResult<Client> {
    let options = global
        .connect_options()
        .or(ConnectOptions::from_env())
        .with_clouds_yaml()?;
    let client = options.connect().await?;
    Ok(client.with_debug(global.debug))
}

async fn dispatch(command: Command, global: &GlobalArgs) -> CliResult<u8> {
    use inventory::Kind;
    if let Command::Completion { shell } = command {
        let mut buffer = Vec::new();
        clap_complete::generate(shell, &mut command_line(), "blazar", &mut buffer);
        emit(&String::from_utf8_lossy(&buffer));
        return Ok(0);
    }
    let ctx = Context {
        client: connect(global).await?,
        utc: global.utc,
    };
    let ok = |r: CliResult| r.map(|()| 0);
    match command {
        Command::LeaseList(a) => ok(leases::list(&ctx, a).await),
        Command::LeaseShow(a) => ok(leases::show(&ctx, a).await),
        Command::LeaseCreate(a) => leases::create(&ctx, a).await,
        Command::LeaseUpdate(a) => ok(leases::update(&ctx, a).await),
        Command::LeaseOffers(a) => ok(offers::offers(&ctx, a).await),
        Command::LeaseDelete(a) => ok(leases::delete(&ctx, a).await),
        Command::LeaseWait(a) => leases::wait(&ctx, a).await,
        Command::LeaseActions(a) => ok(actions::lease_actions(&ctx, a).await),
        Command::ActionList(a) => ok(actions::list(&ctx, a).await),

        Command::HostList(a) => ok(inventory::list(&ctx, &Kind::HOST, a).await),
        Command::HostShow(a) => ok(inventory::show(&ctx, &Kind::HOST, a).await),
        Command::HostCreate(a) => ok(inventory::create_host(&ctx, a).await),
        Command::HostUpdate(a) => ok(inventory::update(&ctx, &Kind::HOST, a).await),
        Command::HostUnset(a) => ok(inventory::unset(&ctx, &Kind::HOST, a).await),
        Command::HostDelete(a) => ok(inventory::delete(&ctx, &Kind::HOST, a).await),
        Command::HostPropertyList(a) => ok(inventory::property_list(&ctx, &Kind::HOST, a).await),
        Command::HostPropertyShow(a) => ok(inventory::property_show(&ctx, &Kind::HOST, a).await),
        Command::HostPropertySet(a) => ok(inventory::property_set(&ctx, &Kind::HOST, a).await),

        Command::NetworkList(a) => ok(inventory::list(&ctx, &Kind::NETWORK, a).await),
        Command::NetworkShow(a) => ok(inventory::show(&ctx, &Kind::NETWORK, a).await),
        Command::NetworkCreate(a) => ok(inventory::create_network(&ctx, a).await),
        Command::NetworkUpdate(a) => ok(inventory::update(&ctx, &Kind::NETWORK, a).await),
        Command::NetworkUnset(a) => ok(inventory::unset(&ctx, &Kind::NETWORK, a).await),
        Command::NetworkDelete(a) => ok(inventory::delete(&ctx, &Kind::NETWORK, a).await),
        Command::NetworkPropertyList(a) => {
            ok(inventory::property_list(&ctx, &Kind::NETWORK, a).await)
        }
        Command::NetworkPropertyShow(a) => {
            ok(inventory::property_show(&ctx, &Kind::NETWORK, a).await)
        }
        Command::NetworkPropertySet(a) => {
            ok(inventory::property_set(&ctx, &Kind::NETWORK, a).await)
        }

        Command::DeviceList(a) => ok(inventory::list(&ctx, &Kind::DEVICE, a).await),
        Command::DeviceShow(a) => ok(inventory::show(&ctx, &Kind::DEVICE, a).await),
        Command::DeviceCreate(a) => ok(inventory::create_device(&ctx, a).await),
        Command::DeviceUpdate(a) => ok(inventory::update_device(&ctx, a).await),
        Command::DeviceUnset(a) => ok(inventory::unset(&ctx, &Kind::DEVICE, a).await),
        Command::DeviceDelete(a) => ok(inventory::delete(&ctx, &Kind::DEVICE, a).await),
        Command::DeviceReallocate(a) => ok(inventory::reallocate(&ctx, &Kind::DEVICE, a).await),
        Command::HostReallocate(a) => ok(inventory::reallocate(&ctx, &Kind::HOST, a).await),
        Command::DevicePropertyList(a) => {
            ok(inventory::property_list(&ctx, &Kind::DEVICE, a).await)
        }
        Command::DevicePropertyShow(a) => {
            ok(inventory::property_show(&ctx, &Kind::DEVICE, a).await)
        }
        Command::DevicePropertySet(a) => ok(inventory::property_set(&ctx, &Kind::DEVICE, a).await),

        Command::FloatingipList(a) => ok(leases::get_and_list(&ctx, &floatingips::LIST, &a).await),
        Command::FloatingipShow(a) => ok(floatingips::show(&ctx, a).await),
        Command::FloatingipCreate(a) => ok(floatingips::create(&ctx, a).await),
        Command::FloatingipDelete(a) => ok(floatingips::delete(&ctx, a).await),
        Command::IcalFeedList(a) => ok(leases::get_and_list(&ctx, &feeds::LIST, &a).await),
        Command::IcalFeedCreate(a) => ok(feeds::create(&ctx, a).await),
        Command::IcalFeedDelete(a) => ok(feeds::delete(&ctx, a).await),
        Command::WebhookList(a) => ok(leases::get_and_list(&ctx, &webhooks::LIST, &a).await),
        Command::WebhookCreate(a) => ok(webhooks::create(&ctx, a).await),
        Command::WebhookShow(a) => ok(webhooks::show(&ctx, a).await),
        Command::WebhookDelete(a) => ok(webhooks::delete(&ctx, a).await),
        Command::WebhookDeliveries(a) => ok(webhooks::deliveries(&ctx, a).await),
        Command::WebhookRedeliver(a) => ok(webhooks::redeliver(&ctx, a).await),
        Command::QuotaList(a) => ok(quotas::list(&ctx, a).await),
        Command::QuotaShow(a) => ok(quotas::show(&ctx, a).await),
        Command::QuotaSet(a) => ok(quotas::set(&ctx, a).await),
        Command::QuotaDelete(a) => ok(quotas::delete(&ctx, a).await),

        Command::FlavorList(a) => ok(leases::get_and_list(&ctx, &flavors::LIST, &a).await),
        Command::FlavorShow(a) => ok(flavors::show(&ctx, a).await),
        Command::FlavorCreate(a) => ok(flavors::create(&ctx, a).await),
        Command::FlavorDelete(a) => ok(flavors::delete(&ctx, a).await),

        Command::AllocationList(a) => ok(allocations::list(&ctx, a).await),
        Command::AllocationShow(a) => ok(allocations::show(&ctx, a).await),

        Command::Timeline(a) => ok(timeline::show(&ctx, a).await),

        Command::Completion { .. } => Ok(0),
    }
}

/// The command line as clap parses it, each command with its notes and examples.
fn command_line() -> clap::Command {
    examples::after_help().fold(Cli::command(), |cli, (name, text)| {
        cli.mut_subcommand(name, |command| command.after_help(text))
    })
}

/// Parses the command line, runs the command, prints any failure; returns the exit code.
pub async fn main() -> u8 {
    let cli = match command_line()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return u8::try_from(code).unwrap_or(EXIT_ERROR);
        }
    };
    match dispatch(cli.command, &cli.global).await {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{}", failure.message);
            failure.code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        command_line().debug_assert();
    }

    /// `SortedListOutput` leaves the default column to each command; one that forgot it
    /// would fail whenever `--sort-by` is not given.
    #[test]
    fn every_sort_by_has_a_default() {
        for command in Cli::command().get_subcommands() {
            let Some(sort_by) = command.get_arguments().find(|a| a.get_id() == "sort_by") else {
                continue;
            };
            let help = sort_by
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                !sort_by.get_default_values().is_empty() || help.contains("(default:"),
                "{} --sort-by has no default",
                command.get_name()
            );
        }
    }

    #[test]
    fn every_command_has_an_example() {
        for command in command_line().get_subcommands() {
            let help = command
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                help.contains("Examples:") && help.contains("blazar "),
                "{} has no example",
                command.get_name()
            );
        }
    }
}
