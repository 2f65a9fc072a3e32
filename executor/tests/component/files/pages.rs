//! ListFiles in pages: every entry once, in order, whatever the page size; a page never near the message
//! limit; tokens bound to their listing.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use mentis_proto::executor::ListFilesRequest;
use tonic::Code;

use super::super::support::*;
use super::{Files, files};

/// Lists `path` page by page; returns every path and the number of pages.
async fn all_pages(
    client: &mut Files,
    path: &str,
    recursive: bool,
    size: u32,
) -> (Vec<String>, usize) {
    let mut token = String::new();
    let mut paths = Vec::new();
    let mut pages = 0;
    loop {
        let page = client
            .list_files(ListFilesRequest {
                path: path.into(),
                recursive,
                page_size: size,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert_eq!(page.truncated, !page.next_page_token.is_empty());
        paths.extend(page.files.into_iter().map(|f| f.path));
        if page.next_page_token.is_empty() {
            return (paths, pages);
        }
        token = page.next_page_token;
    }
}

/// What the listing must be: a depth-first walk with names in byte order, never following links.
fn expected(root: &Path, shown: &str, recursive: bool, out: &mut Vec<String>) {
    let mut names: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let shown = format!("{shown}/{}", name.to_string_lossy());
        let path = root.join(&name);
        out.push(shown.clone());
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if recursive && meta.is_dir() {
            expected(&path, &shown, recursive, out);
        }
    }
}

#[tokio::test]
async fn every_page_size_gives_every_entry_once_in_order() {
    let executor = TestExecutor::start().await;
    let root = executor.path("tree");
    // Names that sort differently as whole paths and by component ("a.txt" < "a/x" as strings), a deep
    // chain, a wide directory, an empty directory and a link to a directory (listed, not followed).
    for dir in ["a/x/y/z", "a.d", "b", "empty", "wide"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    for file in ["a.txt", "a/x/1", "a/x/y/2", "a/x/y/z/3", "a.d/4", "b/5"] {
        std::fs::write(root.join(file), b"x").unwrap();
    }
    for i in 0..57 {
        std::fs::write(root.join(format!("wide/f{i:03}")), b"").unwrap();
    }
    std::os::unix::fs::symlink("a", root.join("link-to-a")).unwrap();
    let mut client = files(&executor).await;
    for recursive in [true, false] {
        let mut want = Vec::new();
        expected(&root, "tree", recursive, &mut want);
        for size in [1, 2, 3, 7, 50, 0] {
            let (got, pages) = all_pages(&mut client, "tree", recursive, size).await;
            assert_eq!(got, want, "recursive {recursive}, page size {size}");
            if size > 0 {
                assert_eq!(
                    pages,
                    want.len().div_ceil(size as usize).max(1),
                    "size {size}"
                );
            }
        }
    }
}

#[tokio::test]
async fn tokens_are_bound_to_their_listing_and_checked() {
    let executor = TestExecutor::start().await;
    for i in 0..5 {
        std::fs::create_dir_all(executor.path(&format!("d/{i}"))).unwrap();
    }
    std::fs::create_dir_all(executor.path("other")).unwrap();
    let mut client = files(&executor).await;
    let first = client
        .list_files(ListFilesRequest {
            path: "d".into(),
            recursive: true,
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(first.truncated);
    let token = first.next_page_token;
    for (path, recursive, token, why) in [
        ("other", true, token.clone(), "another path"),
        ("d", false, token.clone(), "not recursive"),
        ("d", true, "zz".to_owned(), "not hex"),
        ("d", true, "01".to_owned(), "too short"),
        ("d", true, format!("ff{}", &token[2..]), "another version"),
    ] {
        let status = client
            .list_files(ListFilesRequest {
                path: path.into(),
                recursive,
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{why}: {status:?}");
        assert!(status.message().contains("page_token"), "{why}: {status:?}");
    }
}

#[tokio::test]
async fn a_page_stays_far_below_the_message_limit_whatever_its_size() {
    let executor = TestExecutor::start().await;
    // Long names: 10 000 entries of about 250 bytes would encode to 2.5 MiB and more in one page.
    let dir = executor.path("long");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..10_000 {
        std::fs::write(dir.join(format!("{i:05}-{}", "n".repeat(240))), b"").unwrap();
    }
    let mut client = files(&executor).await;
    let page = client
        .list_files(ListFilesRequest {
            path: "long".into(),
            recursive: false,
            page_size: 100_000,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes: usize = page.files.iter().map(|f| f.path.len()).sum();
    assert!(bytes <= 1024 * 1024, "{bytes}");
    assert!(page.truncated && !page.files.is_empty());
    let (all, _) = all_pages(&mut client, "long", false, 100_000).await;
    assert_eq!(all.len(), 10_000);
}
