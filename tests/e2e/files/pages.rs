//! A recursive listing of 150 000 entries, page by page, by a client with tonic's default message limit
//! (4 MiB): every entry once, in order.

use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;

use super::files;

const DIRS: usize = 15;
const PER_DIR: usize = 10_000;

#[tokio::test]
async fn a_recursive_listing_of_150k_entries_pages_within_default_limits() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sandbox = h.create_default().await?.sandbox_id;
    let made = h
        .exec(
            &sandbox,
            api::ShellAction {
                command: format!(
                    "mkdir big && cd big && for d in $(seq -w 1 {DIRS}); do mkdir d$d && \
                     (cd d$d && seq -w 1 {PER_DIR} | sed 's/^/f/' | xargs touch) || exit 1; done; \
                     find . -mindepth 1 | wc -l"
                ),
                timeout_seconds: 600,
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(
        stdout(&made).trim(),
        (DIRS * (PER_DIR + 1)).to_string(),
        "{made:?}"
    );

    // The default client: 4 MiB decoding limit, as any generated client has.
    let mut client = files(&h);
    let mut token = String::new();
    let mut paths = Vec::new();
    let mut pages = 0;
    let started = std::time::Instant::now();
    loop {
        let page = client
            .list_files(api::ListFilesRequest {
                sandbox_id: sandbox.clone(),
                path: "big".into(),
                recursive: true,
                page_size: 0,
                page_token: token,
            })
            .await?
            .into_inner();
        pages += 1;
        assert!(page.files.len() <= 1000, "{}", page.files.len());
        paths.extend(page.files.into_iter().map(|f| f.path));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "paging too slowly"
        );
    }
    let total = DIRS * (PER_DIR + 1);
    assert_eq!(paths.len(), total);
    assert_eq!(pages, total.div_ceil(1000));
    // Depth first, names in byte order: here the same as sorting the whole paths.
    let mut sorted = paths.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, paths, "in order and no entry twice");
    assert_eq!(paths.first().map(String::as_str), Some("big/d01"));
    assert_eq!(paths.last().map(String::as_str), Some("big/d15/f10000"));
    h.stop().await
}
