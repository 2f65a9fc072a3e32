//! `MENTIS_S3_ENDPOINT`, `MENTIS_S3_BUCKET`, `MENTIS_S3_REGION`, `MENTIS_S3_PREFIX`: where snapshots go.

use super::error::{ConfigError, err};
use crate::snapshots::S3Settings;

/// The snapshot store: a folder of the data folder, or an S3-compatible bucket.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SnapshotStoreConfig {
    /// `MENTIS_DATA_DIR/snapshots`.
    #[default]
    Local,
    S3(S3Settings),
}

pub(super) fn snapshot_store(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<SnapshotStoreConfig, ConfigError> {
    let var = |name: &str| get(name).filter(|v| !v.is_empty());
    let Some(endpoint) = var("MENTIS_S3_ENDPOINT") else {
        for other in ["MENTIS_S3_BUCKET", "MENTIS_S3_REGION", "MENTIS_S3_PREFIX"] {
            if let Some(v) = var(other) {
                return Err(err(other, &v, "set without MENTIS_S3_ENDPOINT"));
            }
        }
        return Ok(SnapshotStoreConfig::Local);
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(err(
            "MENTIS_S3_ENDPOINT",
            &endpoint,
            "not an http:// or https:// URL",
        ));
    }
    let Some(bucket) = var("MENTIS_S3_BUCKET") else {
        return Err(err(
            "MENTIS_S3_BUCKET",
            "",
            "required with MENTIS_S3_ENDPOINT",
        ));
    };
    let mut prefix = var("MENTIS_S3_PREFIX").unwrap_or_default();
    if !prefix.is_empty() && !prefix.ends_with('/') {
        prefix.push('/');
    }
    Ok(SnapshotStoreConfig::S3(S3Settings {
        endpoint,
        bucket,
        region: var("MENTIS_S3_REGION").unwrap_or_else(|| "us-east-1".to_owned()),
        prefix,
        credentials: var("AWS_ACCESS_KEY_ID").zip(var("AWS_SECRET_ACCESS_KEY")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<SnapshotStoreConfig, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        snapshot_store(&|name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_store_is_local_unless_an_endpoint_names_a_bucket() {
        assert_eq!(read(&[]).ok(), Some(SnapshotStoreConfig::Local));
        let s3 = read(&[
            ("MENTIS_S3_ENDPOINT", "http://127.0.0.1:9000"),
            ("MENTIS_S3_BUCKET", "snaps"),
            ("MENTIS_S3_PREFIX", "team"),
        ]);
        assert_eq!(
            s3.ok(),
            Some(SnapshotStoreConfig::S3(S3Settings {
                endpoint: "http://127.0.0.1:9000".into(),
                bucket: "snaps".into(),
                region: "us-east-1".into(),
                prefix: "team/".into(),
                credentials: None,
            }))
        );
        for bad in [
            vec![("MENTIS_S3_ENDPOINT", "http://x")],
            vec![
                ("MENTIS_S3_ENDPOINT", "s3.example.com"),
                ("MENTIS_S3_BUCKET", "b"),
            ],
            vec![("MENTIS_S3_BUCKET", "b")],
        ] {
            let e = read(&bad).expect_err("refused");
            assert!(e.to_string().contains("MENTIS_S3_"), "{e}");
        }
    }
}
