// `sqlx::migrate!` embeds the migration files at compile time, but cargo only rebuilds a
// crate when its sources change: without this, a new migration file would be left out of
// an incremental build.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
