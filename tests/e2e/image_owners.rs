//! Images belong to the space they were built or imported for (docs/ARCHITECTURE.md, Security model,
//! "Images belong to a space"): another space's key cannot make sandboxes or templates of one, by any name
//! of it, until the admin shares it; the images nobody built through the API and the runtime's own stay
//! every space's.

use mentis_e2e::*;
use mentis_proto::api::{
    self, key_service_client::KeyServiceClient, sandbox_service_client::SandboxServiceClient,
    template_service_client::TemplateServiceClient,
};
use tonic::Code;

use super::templates::{build_with, context};

/// Removes the images named when dropped (they are the engine's, not an instance's).
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = docker(&["image", "rm", "-f", image]);
        }
    }
}

/// A space, and a key scoped to it.
async fn space_with_key(h: &mut Harness, space: &str) -> anyhow::Result<String> {
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: space.to_owned(),
                ..Default::default()
            }),
        })
        .await?;
    Ok(KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: format!("agent of {space}"),
            space_ids: vec![space.to_owned()],
        })
        .await?
        .into_inner()
        .secret)
}

fn spec(space: &str, image: &str, template: &str) -> api::CreateSandboxRequest {
    api::CreateSandboxRequest {
        spec: Some(api::SandboxSpec {
            space_id: space.to_owned(),
            image: image.to_owned(),
            template: template.to_owned(),
            ..Default::default()
        }),
    }
}

fn template(space: &str, name: &str, image: &str) -> api::CreateTemplateRequest {
    api::CreateTemplateRequest {
        template: Some(api::Template {
            space_id: space.to_owned(),
            name: name.to_owned(),
            image: image.to_owned(),
            ..Default::default()
        }),
    }
}

/// The refusal of an image of another space: PERMISSION_DENIED (IMAGE_NOT_ALLOWED), not naming the space
/// of the image (img-a) unless that is the caller's own.
fn assert_not_allowed<T: std::fmt::Debug>(got: Result<T, tonic::Status>, what: &str) {
    refused_naming_no_other_space(got, what, true);
}

fn refused_naming_no_other_space<T: std::fmt::Debug>(
    got: Result<T, tonic::Status>,
    what: &str,
    other: bool,
) {
    let status = got.expect_err(what);
    let (code, reason, _) = refusal::<T>(Err(status.clone()));
    assert_eq!(
        (code, reason.as_str()),
        (Code::PermissionDenied, "IMAGE_NOT_ALLOWED"),
        "{what}: {status:?}"
    );
    assert!(
        !(other && status.message().contains("img-a")),
        "{what}: the refusal names the image's space: {status:?}"
    );
}

#[tokio::test]
async fn images_belong_to_their_space_until_the_admin_shares_them() -> anyhow::Result<()> {
    test_images()?;
    let mut h = Harness::start().await?;
    let key_a = space_with_key(&mut h, "img-a").await?;
    let key_b = space_with_key(&mut h, "img-b").await?;
    let mut admin = TemplateServiceClient::new(h.channel.clone());
    let name = format!("mentis-test/owned-{}:1", h.guard.instance);
    let alias = format!("mentis-test/owned-alias-{}:1", h.guard.instance);
    let _images = Images(vec![name.clone(), alias.clone()]);

    // The admin builds an image for space A, holding something of A's.
    let header = api::BuildImageHeader {
        image: name.clone(),
        space_id: "img-a".to_owned(),
        ..Default::default()
    };
    let dockerfile = "FROM mentis-test/busybox:1\nRUN echo secret of a > /secret\n";
    let (output, built) =
        build_with(&mut admin, header, context(&[("Dockerfile", dockerfile)])?).await?;
    let built = built.map_err(|s| anyhow::anyhow!("{s:?}; output: {output}"))?;
    assert_eq!(
        (built.space_id.as_str(), built.shared),
        ("img-a", false),
        "{built:?}"
    );
    assert_eq!(
        docker(&[
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"io.mentis.space\"}}",
            &name
        ])?
        .trim(),
        "img-a"
    );
    docker(&["tag", &name, &alias])?;

    // A's key makes sandboxes and templates of it.
    let mut sandboxes_a = SandboxServiceClient::new(h.with_key(Some(&key_a)));
    let mut templates_a = TemplateServiceClient::new(h.with_key(Some(&key_a)));
    let sb = sandboxes_a
        .create_sandbox(spec("img-a", &name, ""))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(
        stdout(&h.sh(&sb.sandbox_id, "cat /secret").await?),
        "secret of a\n"
    );
    templates_a
        .create_template(template("img-a", "owned", &name))
        .await?;
    templates_a
        .create_template(template("img-a", "owned-alias", &alias))
        .await?;

    // B's key may not, by any name of it: its names, the default registry's spelling, a second tag, its
    // id and a short id; nor in a template, created or updated; nor through a template the admin made in B.
    let mut sandboxes_b = SandboxServiceClient::new(h.with_key(Some(&key_b)));
    let mut templates_b = TemplateServiceClient::new(h.with_key(Some(&key_b)));
    let containers = h.guard.containers().len();
    let short_id = built.image_id.trim_start_matches("sha256:")[..12].to_owned();
    for image in [
        name.clone(),
        format!("docker.io/{name}"),
        alias.clone(),
        built.image_id.clone(),
        short_id.clone(),
    ] {
        assert_not_allowed(
            sandboxes_b.create_sandbox(spec("img-b", &image, "")).await,
            &format!("a sandbox of B from {image}"),
        );
        assert_not_allowed(
            templates_b
                .create_template(template("img-b", "stolen", &image))
                .await,
            &format!("a template of B from {image}"),
        );
    }
    templates_b
        .create_template(template("img-b", "plain", "mentis-test/busybox:1"))
        .await?;
    let update = api::UpdateTemplateRequest {
        template: Some(api::Template {
            space_id: "img-b".to_owned(),
            name: "plain".to_owned(),
            image: name.clone(),
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: vec!["image".to_owned()],
        }),
    };
    assert_not_allowed(
        templates_b.update_template(update.clone()).await,
        "B's template moved to A's image",
    );
    admin
        .create_template(template("img-b", "admin-made", &name))
        .await?;
    assert_not_allowed(
        sandboxes_b
            .create_sandbox(spec("img-b", "", "admin-made"))
            .await,
        "a sandbox of B from the admin's template of A's image",
    );
    assert_eq!(
        h.guard.containers().len(),
        containers,
        "a refused create made a container"
    );

    // An image no build made (an operator's), and the runtime's own, are every space's.
    for image in ["mentis-test/busybox:1", ""] {
        let sb = sandboxes_b
            .create_sandbox(spec("img-b", image, ""))
            .await?
            .into_inner()
            .sandbox
            .unwrap();
        assert_eq!(stdout(&h.sh(&sb.sandbox_id, "echo ok").await?), "ok\n");
    }

    // The admin shares it: B's key may now use it, by its names (never by its id).
    let shared = admin
        .share_image(api::ShareImageRequest {
            image: alias.clone(),
            shared: true,
        })
        .await?
        .into_inner()
        .image
        .unwrap();
    assert_eq!(
        (
            shared.image.as_str(),
            shared.space_id.as_str(),
            shared.shared
        ),
        (alias.as_str(), "img-a", true),
        "{shared:?}"
    );
    assert_eq!(shared.image_id, built.image_id);
    let sb = sandboxes_b
        .create_sandbox(spec("img-b", &name, ""))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(
        stdout(&h.sh(&sb.sandbox_id, "cat /secret").await?),
        "secret of a\n"
    );
    templates_b.update_template(update.clone()).await?;
    sandboxes_b
        .create_sandbox(spec("img-b", "", "admin-made"))
        .await?;
    assert_not_allowed(
        sandboxes_b
            .create_sandbox(spec("img-b", &built.image_id, ""))
            .await,
        "a shared image by its id",
    );

    // Given back to A alone: refused again. A scoped key may not share.
    admin
        .share_image(api::ShareImageRequest {
            image: name.clone(),
            shared: false,
        })
        .await?;
    assert_not_allowed(
        sandboxes_b.create_sandbox(spec("img-b", &name, "")).await,
        "a sandbox of B from A's image, shared no more",
    );
    let (code, reason, _) = refusal(
        templates_a
            .share_image(api::ShareImageRequest {
                image: name.clone(),
                shared: true,
            })
            .await,
    );
    assert_eq!(
        (code, reason.as_str()),
        (Code::PermissionDenied, "ADMIN_REQUIRED")
    );

    // A deleted space's images are nobody's: a space made again under its id does not inherit them.
    h.spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "img-a".to_owned(),
            force: true,
        })
        .await?;
    let key_a2 = space_with_key(&mut h, "img-a").await?;
    refused_naming_no_other_space(
        SandboxServiceClient::new(h.with_key(Some(&key_a2)))
            .create_sandbox(spec("img-a", &name, ""))
            .await,
        "a sandbox of the new space A from the old one's image",
        false,
    );
    h.stop().await
}
