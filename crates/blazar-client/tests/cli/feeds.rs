//! `ical-feed-*` commands: the URL printed at creation serves the project's leases as an
//! iCalendar document until the feed is deleted.

use crate::harness::{Server, one_host_lease};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_url_serves_the_leases_until_the_feed_is_deleted() {
    let s = Server::start().await;
    s.blazar(&["host-create", "compute-1"]).await.ok();
    s.blazar(&one_host_lease("demo", &[])).await.ok();
    let created = s
        .blazar(&[
            "ical-feed-create",
            "--description",
            "lab calendar",
            "-f",
            "value",
            "-c",
            "id",
            "-c",
            "url",
        ])
        .await;
    let mut lines = created.ok().lines().skip(1);
    let (id, url) = (lines.next().unwrap(), lines.next().unwrap());
    assert!(url.starts_with(&format!("{}/ical/{id}_", s.base)), "{url}");
    let document = reqwest::get(url).await.unwrap().text().await.unwrap();
    assert!(document.contains("SUMMARY:demo\r\n"), "{document}");
    assert!(
        document.contains("DTSTART:20300101T100000Z\r\n"),
        "{document}"
    );

    let listed = s
        .blazar(&[
            "ical-feed-list",
            "-f",
            "value",
            "-c",
            "id",
            "-c",
            "description",
        ])
        .await;
    assert_eq!(listed.ok(), format!("{id} lab calendar\n"));
    let deleted = s.blazar(&["ical-feed-delete", id]).await;
    assert_eq!(deleted.ok(), format!("Deleted calendar feed: {id}\n"));
    assert_eq!(reqwest::get(url).await.unwrap().status(), 404);
    assert_eq!(s.blazar(&["ical-feed-list", "-f", "value"]).await.ok(), "");
}
