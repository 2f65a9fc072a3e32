//! Templates (docs/ARCHITECTURE.md, "Templates"): a configuration named once in a space (an image of
//! our own, limits, env, a working directory, start-up commands) that sandboxes are made from; CRUD and
//! scoping as for everything else; a start-up command that fails fails the create and leaves nothing.

use mentis_e2e::*;
use mentis_proto::api::{
    self, key_service_client::KeyServiceClient, template_service_client::TemplateServiceClient,
};
use tonic::Code;

fn busybox_template(name: &str, setup: &[&str]) -> api::Template {
    api::Template {
        space_id: "tpl".to_owned(),
        name: name.to_owned(),
        description: "busybox with a prepared app folder".to_owned(),
        image: "mentis-test/busybox:1".to_owned(),
        limits: Some(api::SandboxLimits {
            memory_mb: 160,
            pids: 80,
            ..Default::default()
        }),
        env: [
            ("GREETING".to_owned(), "hello".to_owned()),
            ("SHARED".to_owned(), "from the template".to_owned()),
        ]
        .into(),
        work_dir: "app".to_owned(),
        setup_commands: setup.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_template_makes_sandboxes_of_its_image_limits_env_and_start_up_commands()
-> anyhow::Result<()> {
    test_images()?;
    let mut h = Harness::start().await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "tpl".to_owned(),
                ..Default::default()
            }),
        })
        .await?;
    let made = templates
        .create_template(api::CreateTemplateRequest {
            template: Some(busybox_template(
                "busy",
                &[
                    "mkdir -p app && echo ready > app/marker",
                    "echo \"$GREETING\" > app/greeting",
                ],
            )),
        })
        .await?
        .into_inner()
        .template
        .unwrap();
    assert_eq!(made.space_id, "tpl");
    assert!(made.create_time.is_some());
    // What Create returned is what Get returns.
    let got = templates
        .get_template(api::GetTemplateRequest {
            space_id: "tpl".to_owned(),
            name: "busy".to_owned(),
        })
        .await?
        .into_inner()
        .template;
    assert_eq!(got.as_ref(), Some(&made));

    // A sandbox of the template: its image, limits and env (the spec's over the template's), its
    // start-up commands done before CreateSandbox returned, its shell actions in its work_dir.
    let sb = h
        .create(api::SandboxSpec {
            space_id: "tpl".to_owned(),
            template: "busy".to_owned(),
            env: [("SHARED".to_owned(), "from the spec".to_owned())].into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(
        (sb.image.as_str(), sb.memory_limit_mb, sb.pids_limit),
        ("mentis-test/busybox:1", 160, 80)
    );
    assert_eq!(
        (sb.template.as_str(), sb.work_dir.as_str()),
        ("busy", "app")
    );
    let id = sb.sandbox_id;
    let out = h
        .sh(&id, "pwd; cat marker greeting; echo \"$SHARED\"")
        .await?;
    assert_eq!(
        stdout(&out),
        "/workspace/app\nready\nhello\nfrom the spec\n",
        "{}",
        stderr(&out)
    );
    // An action that names its directory, and a session, keep theirs.
    let named = h
        .exec(
            &id,
            api::ShellAction {
                work_dir: "/tmp".to_owned(),
                ..cmd("pwd")
            },
        )
        .await?;
    assert_eq!(stdout(&named), "/tmp\n");
    let session = h
        .exec(
            &id,
            api::ShellAction {
                session: "s".to_owned(),
                ..cmd("pwd")
            },
        )
        .await?;
    assert_eq!(stdout(&session), "/workspace\n");

    // A spec's own limits win over the template's.
    let own = h
        .create(api::SandboxSpec {
            space_id: "tpl".to_owned(),
            template: "busy".to_owned(),
            memory_limit_mb: 200,
            ..Default::default()
        })
        .await?;
    assert_eq!((own.memory_limit_mb, own.pids_limit), (200, 80));
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: own.sandbox_id,
        })
        .await?;

    // A start-up command that fails: the create fails with its exit and output, and leaves nothing.
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(busybox_template(
                "broken",
                &["echo preparing; echo oops >&2; exit 3"],
            )),
        })
        .await?;
    let containers_before = h.guard.containers().len();
    let failed = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "tpl".to_owned(),
                template: "broken".to_owned(),
                ..Default::default()
            }),
        })
        .await
        .expect_err("its start-up command fails");
    assert_eq!(failed.code(), Code::FailedPrecondition, "{failed:?}");
    assert_eq!(
        failed.message(),
        "start-up command 1 of template \"broken\" (\"echo preparing; echo oops >&2; exit 3\") exited \
         with 3; its output ends with: preparing\noops"
    );
    assert_eq!(h.guard.containers().len(), containers_before);

    // Names are checked, known ones found, unknown ones not.
    let unknown = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "tpl".to_owned(),
                template: "nope".to_owned(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(unknown), Code::NotFound);
    let again = templates
        .create_template(api::CreateTemplateRequest {
            template: Some(busybox_template("busy", &[])),
        })
        .await;
    assert_eq!(code(again), Code::AlreadyExists);
    let bad = templates
        .create_template(api::CreateTemplateRequest {
            template: Some(busybox_template("Not_A_Name", &[])),
        })
        .await;
    assert_eq!(
        refusal(bad),
        (
            Code::InvalidArgument,
            "INVALID_ARGUMENT".to_owned(),
            Some("template.name".to_owned())
        )
    );
    let no_space = templates
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                space_id: "no-such-space".to_owned(),
                ..busybox_template("x", &[])
            }),
        })
        .await;
    assert_eq!(code(no_space), Code::NotFound);

    // List, update (the mask's fields only), get, delete.
    let listed = templates
        .list_templates(api::ListTemplatesRequest {
            space_id: "tpl".to_owned(),
            page_size: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.templates.len(), 1);
    assert_eq!(listed.templates[0].name, "broken");
    let rest = templates
        .list_templates(api::ListTemplatesRequest {
            space_id: "tpl".to_owned(),
            page_size: 1,
            page_token: listed.next_page_token,
        })
        .await?
        .into_inner();
    assert_eq!(
        rest.templates
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["busy"]
    );
    let updated = templates
        .update_template(api::UpdateTemplateRequest {
            template: Some(api::Template {
                space_id: "tpl".to_owned(),
                name: "broken".to_owned(),
                setup_commands: vec!["true".to_owned()],
                image: "ignored:1".to_owned(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["setup_commands".to_owned()],
            }),
        })
        .await?
        .into_inner()
        .template
        .unwrap();
    assert_eq!(updated.setup_commands, ["true"]);
    assert_eq!(updated.image, "mentis-test/busybox:1");
    assert_eq!(
        updated.env.get("GREETING").map(String::as_str),
        Some("hello")
    );
    let fixed = h
        .create(api::SandboxSpec {
            space_id: "tpl".to_owned(),
            template: "broken".to_owned(),
            ..Default::default()
        })
        .await?;
    assert_eq!(fixed.state, api::SandboxState::Running as i32);

    // A key of another space sees none of them.
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "elsewhere".to_owned(),
                ..Default::default()
            }),
        })
        .await?;
    let secret = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "elsewhere".to_owned(),
            space_ids: vec!["elsewhere".to_owned()],
        })
        .await?
        .into_inner()
        .secret;
    let mut theirs = TemplateServiceClient::new(h.with_key(Some(&secret)));
    let denied = theirs
        .get_template(api::GetTemplateRequest {
            space_id: "tpl".to_owned(),
            name: "busy".to_owned(),
        })
        .await;
    assert_eq!(code(denied), Code::PermissionDenied);
    let own_space = theirs
        .list_templates(api::ListTemplatesRequest {
            space_id: "elsewhere".to_owned(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(own_space.templates.is_empty());

    templates
        .delete_template(api::DeleteTemplateRequest {
            space_id: "tpl".to_owned(),
            name: "busy".to_owned(),
        })
        .await?;
    let gone = templates
        .get_template(api::GetTemplateRequest {
            space_id: "tpl".to_owned(),
            name: "busy".to_owned(),
        })
        .await;
    assert_eq!(code(gone), Code::NotFound);
    // Its sandbox keeps running.
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}

#[tokio::test]
async fn a_template_with_a_pool_serves_its_sandboxes_warm() -> anyhow::Result<()> {
    test_images()?;
    let mut h = Harness::start().await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                name: "pooled".to_owned(),
                image: "mentis-test/busybox:1".to_owned(),
                setup_commands: vec!["echo prepared ahead > marker".to_owned()],
                pool_size: 1,
                ..Default::default()
            }),
        })
        .await?;
    let client = h.sandboxes.clone();
    let pool = || {
        let mut sandboxes = client.clone();
        async move {
            sandboxes
                .list_pools(api::ListPoolsRequest {})
                .await
                .map(|r| {
                    r.into_inner()
                        .pools
                        .into_iter()
                        .find(|p| p.template == "pooled")
                })
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pool().await?.is_none_or(|p| p.idle < 1) {
        assert!(std::time::Instant::now() < deadline, "{:?}", pool().await?);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let member = h.guard.containers();
    assert_eq!(member.len(), 1, "{member:?}");

    // The sandbox is the container made ahead, its start-up command done.
    let sb = h
        .create(api::SandboxSpec {
            template: "pooled".to_owned(),
            ..Default::default()
        })
        .await?;
    assert!(
        inspect(&container_of(&sb.sandbox_id), "{{.Id}}")?.starts_with(&member[0]),
        "not the member made ahead"
    );
    let p = pool().await?.unwrap();
    assert_eq!(
        (p.hits, p.misses, p.image.as_str()),
        (1, 0, "mentis-test/busybox:1")
    );
    assert_eq!(
        stdout(
            &h.sh(&sb.sandbox_id, "cat marker; readlink /proc/$$/exe")
                .await?
        ),
        "prepared ahead\n/bin/busybox\n"
    );
    // Deleting the template retires its pool; the sandbox stays.
    templates
        .delete_template(api::DeleteTemplateRequest {
            space_id: String::new(),
            name: "pooled".to_owned(),
        })
        .await?;
    assert!(pool().await?.is_none());
    assert_eq!(
        h.get(&sb.sandbox_id).await?.state,
        api::SandboxState::Running as i32
    );
    h.stop().await
}

/// A tar of `files` (name, content), as a build context.
pub(crate) fn context(files: &[(&str, &str)]) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, content.as_bytes())?;
    }
    Ok(builder.into_inner()?)
}

/// BuildImage of `context` as `image`: the output, and the image or the status it ended with.
async fn build(
    client: &mut TemplateServiceClient<ApiChannel>,
    image: &str,
    context: Vec<u8>,
) -> anyhow::Result<(String, Result<api::BuiltImage, tonic::Status>)> {
    let header = api::BuildImageHeader {
        image: image.to_owned(),
        ..Default::default()
    };
    build_with(client, header, context).await
}

/// BuildImage of `context` with `header`: the output, and the image or the status it ended with.
pub(crate) async fn build_with(
    client: &mut TemplateServiceClient<ApiChannel>,
    header: api::BuildImageHeader,
    context: Vec<u8>,
) -> anyhow::Result<(String, Result<api::BuiltImage, tonic::Status>)> {
    let mut messages = vec![api::BuildImageRequest {
        kind: Some(api::build_image_request::Kind::Header(header)),
    }];
    // In small chunks, as a client streaming a big context would send it.
    for chunk in context.chunks(1000) {
        messages.push(api::BuildImageRequest {
            kind: Some(api::build_image_request::Kind::Context(
                bytes::Bytes::copy_from_slice(chunk),
            )),
        });
    }
    let mut stream = match client.build_image(futures::stream::iter(messages)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Ok((String::new(), Err(s))),
    };
    let mut output = String::new();
    loop {
        match stream.message().await {
            Ok(Some(api::BuildImageResponse {
                kind: Some(api::build_image_response::Kind::Output(text)),
            })) => output.push_str(&text),
            Ok(Some(api::BuildImageResponse {
                kind: Some(api::build_image_response::Kind::Image(built)),
            })) => return Ok((output, Ok(built))),
            Ok(other) => anyhow::bail!("unexpected {other:?} after {output}"),
            Err(s) => return Ok((output, Err(s))),
        }
    }
}

#[tokio::test]
async fn images_are_built_from_a_dockerfile_or_imported_from_a_root_filesystem_through_the_api()
-> anyhow::Result<()> {
    test_images()?;
    let mut h = Harness::start().await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    let built_name = format!("mentis-test/built-{}:1", h.guard.instance);
    let imported_name = format!("mentis-test/imported-{}:1", h.guard.instance);
    // The images are the engine's: removed whatever happens.
    struct Images(Vec<String>);
    impl Drop for Images {
        fn drop(&mut self) {
            for image in &self.0 {
                let _ = docker(&["image", "rm", "-f", image]);
            }
        }
    }
    let _images = Images(vec![built_name.clone(), imported_name.clone()]);

    // A Dockerfile on a local image, its output streamed back, then a template of it.
    let ctx = context(&[
        (
            "Dockerfile",
            "FROM mentis-test/busybox:1\nCOPY hello.txt /srv/hello.txt\nRUN echo built by the engine > /srv/built.txt\nENV BUILT=yes\n",
        ),
        ("hello.txt", "hello from the context\n"),
    ])?;
    let (output, built) = build(&mut templates, &built_name, ctx).await?;
    let built = built.map_err(|s| anyhow::anyhow!("{s:?}; output: {output}"))?;
    assert_eq!(built.image, built_name);
    assert!(built.image_id.starts_with("sha256:"), "{built:?}");
    assert!(output.contains(" : FROM mentis-test/busybox:1"), "{output}");
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                name: "built".to_owned(),
                image: built_name.clone(),
                ..Default::default()
            }),
        })
        .await?;
    let sb = h
        .create(api::SandboxSpec {
            template: "built".to_owned(),
            ..Default::default()
        })
        .await?;
    assert_eq!(
        stdout(
            &h.sh(
                &sb.sandbox_id,
                "cat /srv/hello.txt /srv/built.txt; echo $BUILT"
            )
            .await?
        ),
        "hello from the context\nbuilt by the engine\nyes\n"
    );

    // A FROM the engine does not have is refused before the build; a step that fails ends the stream
    // with the engine's message, after the output.
    let (_, missing) = build(
        &mut templates,
        &built_name,
        context(&[("Dockerfile", "FROM mentis-test/not-here:1\nRUN true\n")])?,
    )
    .await?;
    let missing = missing.expect_err("no such base");
    assert_eq!(missing.code(), Code::FailedPrecondition);
    assert!(
        missing
            .message()
            .contains("FROM \"mentis-test/not-here:1\" names an image this engine does not have"),
        "{missing:?}"
    );
    let (output, failed) = build(
        &mut templates,
        &format!("mentis-test/broken-{}:1", h.guard.instance),
        context(&[(
            "Dockerfile",
            "FROM mentis-test/busybox:1\nRUN echo trying; exit 3\n",
        )])?,
    )
    .await?;
    let failed = failed.expect_err("the RUN step fails");
    assert_eq!(failed.code(), Code::FailedPrecondition);
    assert!(
        failed.message().contains("returned a non-zero code: 3"),
        "{failed:?}"
    );
    assert!(output.contains("trying"), "{output}");

    // A root filesystem tarball (here busybox's, exported), with the instructions it needs.
    let exporter = docker(&["create", "mentis-test/busybox:1"])?;
    let exported = std::process::Command::new("docker")
        .args(["export", exporter.trim()])
        .output()?;
    docker(&["rm", "-f", exporter.trim()])?;
    assert!(exported.status.success());
    let mut messages = vec![api::ImportImageRequest {
        kind: Some(api::import_image_request::Kind::Header(
            api::ImportImageHeader {
                image: imported_name.clone(),
                changes: vec![
                    "ENV PATH=/bin".to_owned(),
                    "LABEL origin=tarball".to_owned(),
                ],
                ..Default::default()
            },
        )),
    }];
    for chunk in exported.stdout.chunks(1 << 20) {
        messages.push(api::ImportImageRequest {
            kind: Some(api::import_image_request::Kind::Data(
                bytes::Bytes::copy_from_slice(chunk),
            )),
        });
    }
    let imported = templates
        .import_image(futures::stream::iter(messages))
        .await?
        .into_inner()
        .image
        .unwrap();
    assert_eq!(imported.image, imported_name);
    assert_eq!(
        inspect_image(&imported_name, "{{index .Config.Labels \"origin\"}}")?,
        "tarball"
    );
    let sb = h
        .create(api::SandboxSpec {
            image: imported_name.clone(),
            ..Default::default()
        })
        .await?;
    assert_eq!(
        stdout(
            &h.sh(&sb.sandbox_id, "echo imported; readlink /proc/$$/exe")
                .await?
        ),
        "imported\n/bin/busybox\n"
    );

    // Images are the engine's: a key of a space may not build or import them.
    let secret = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "default only".to_owned(),
            space_ids: vec!["default".to_owned()],
        })
        .await?
        .into_inner()
        .secret;
    let mut theirs = TemplateServiceClient::new(h.with_key(Some(&secret)));
    let (_, denied) = build(
        &mut theirs,
        &built_name,
        context(&[("Dockerfile", "FROM mentis-test/busybox:1\n")])?,
    )
    .await?;
    assert_eq!(
        denied.expect_err("not admin").code(),
        Code::PermissionDenied
    );
    h.stop().await
}

fn inspect_image(image: &str, format: &str) -> anyhow::Result<String> {
    Ok(docker(&["image", "inspect", "--format", format, image])?
        .trim()
        .to_owned())
}

/// Issue 40, finding 3: a space limited to one sandbox had its key make three templates with pools of six:
/// 18 warm containers. Now a space's template pools together keep at most as many warm sandboxes as the space
/// may run, and a space holds at most 100 templates.
#[tokio::test]
async fn template_pools_stay_within_their_space_quota_and_templates_per_space_are_bounded()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "small".to_owned(),
                limits: Some(api::SpaceLimits {
                    max_sandboxes: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    let key = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "small".into(),
            space_ids: vec!["small".into()],
        })
        .await?
        .into_inner()
        .secret;
    let mut templates = TemplateServiceClient::new(h.with_key(Some(&key)));
    let pooled = |name: &str, pool_size: u32| api::CreateTemplateRequest {
        template: Some(api::Template {
            space_id: "small".to_owned(),
            name: name.to_owned(),
            pool_size,
            ..Default::default()
        }),
    };
    templates.create_template(pooled("one", 1)).await?;
    for (name, size) in [("two", 1), ("six", 6)] {
        let refused = templates.create_template(pooled(name, size)).await;
        let status = refused.expect_err("over the space's quota");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("pool"), "{status:?}");
    }
    let grown = templates
        .update_template(api::UpdateTemplateRequest {
            template: Some(api::Template {
                space_id: "small".to_owned(),
                name: "one".to_owned(),
                pool_size: 6,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["pool_size".into()],
            }),
        })
        .await;
    assert_eq!(code(grown), Code::ResourceExhausted);
    // Templates without pools are bounded in number.
    for i in 1..100 {
        templates
            .create_template(pooled(&format!("t{i}"), 0))
            .await?;
    }
    let refused = templates.create_template(pooled("t100", 0)).await;
    assert_eq!(code(refused), Code::ResourceExhausted);
    // What runs: the one warm member, and no more, however long the pools have to fill.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        h.guard.containers().len() <= 1,
        "{:?}",
        h.guard.containers()
    );
    h.stop().await
}

/// Issue 40, finding 9: a start-up command that hangs kept its sandbox CREATING, and DeleteSandbox waited
/// up to the create's deadline (10 minutes). The delete now cuts the create short: it returns within seconds,
/// the create fails saying why, and nothing is left.
#[tokio::test]
async fn deleting_a_sandbox_whose_start_up_command_hangs_ends_its_create_at_once()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    TemplateServiceClient::new(h.channel.clone())
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                space_id: "default".to_owned(),
                name: "hangs".to_owned(),
                setup_commands: vec!["sleep 600".to_owned()],
                ..Default::default()
            }),
        })
        .await?;
    let mut creating = tokio::task::JoinSet::new();
    let mut sandboxes = h.sandboxes.clone();
    creating.spawn(async move {
        sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(api::SandboxSpec {
                    template: "hangs".to_owned(),
                    ..Default::default()
                }),
            })
            .await
    });
    // The sandbox shows up CREATING while its start-up command runs.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let id = loop {
        let listed = h
            .sandboxes
            .list_sandboxes(api::ListSandboxesRequest::default())
            .await?
            .into_inner();
        if let Some(s) = listed
            .sandboxes
            .iter()
            .find(|s| s.state == api::SandboxState::Creating as i32)
        {
            break s.sandbox_id.clone();
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no sandbox CREATING"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    // Give the start-up command time to start.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        h.sandboxes.delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        }),
    )
    .await
    .map_err(|_| anyhow::anyhow!("DeleteSandbox still waits after 20 s"))??;
    let took = started.elapsed();
    let created = creating.join_next().await.expect("the create")?;
    let refused = created.expect_err("the create was cut short");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("deleted"), "{refused:?}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    assert!(
        h.guard.containers().is_empty(),
        "{:?}",
        h.guard.containers()
    );
    h.stop().await
}
