//! Templates: proto ⇄ domain.

use std::time::SystemTime;

use mentis_core::{Error, Limits, SpaceId, Template, TemplateUpdate, quoted};
use mentis_proto::api;

use super::timestamp;

fn limits_from_proto(l: Option<api::SandboxLimits>) -> Limits {
    let l = l.unwrap_or_default();
    Limits {
        cpu: l.cpu,
        memory_mb: l.memory_mb,
        pids: l.pids,
        nofile: l.nofile,
        disk_mb: l.disk_mb,
    }
}

/// A template to create, checked; InvalidArgument naming the field.
pub fn template_from_proto(t: Option<api::Template>) -> Result<Template, Error> {
    let t = t.ok_or_else(|| Error::invalid("template is required").at("template"))?;
    let now = SystemTime::now();
    let template = Template {
        space_id: SpaceId::parse_or_default(&t.space_id).map_err(|e| e.within("template"))?,
        name: t.name,
        description: t.description,
        image: t.image,
        limits: limits_from_proto(t.limits),
        env: t.env.into_iter().collect(),
        work_dir: t.work_dir,
        setup: t.setup_commands,
        pool_size: t.pool_size,
        runtime_class: t.runtime_class,
        egress: template_egress(t.egress, t.egress_rules)?,
        created_at: now,
        updated_at: now,
    };
    template.check("template")?;
    Ok(template)
}

/// The space, name and change an UpdateTemplate asks for: the fields named in the mask, or all when it
/// is empty.
pub fn template_update_from_proto(
    t: Option<api::Template>,
    mask: Option<prost_types::FieldMask>,
) -> Result<(SpaceId, String, TemplateUpdate), Error> {
    const PATHS: [&str; 9] = [
        "description",
        "image",
        "limits",
        "env",
        "work_dir",
        "setup_commands",
        "pool_size",
        "runtime_class",
        "egress",
    ];
    let t = t.ok_or_else(|| Error::invalid("template is required").at("template"))?;
    let space = SpaceId::parse_or_default(&t.space_id).map_err(|e| e.within("template"))?;
    mentis_core::template::check_name(&t.name, "template.name")?;
    let paths = mask.map(|m| m.paths).unwrap_or_default();
    if let Some(p) = paths.iter().find(|p| !PATHS.contains(&p.as_str())) {
        return Err(Error::invalid(format!(
            "update_mask: {} cannot be updated ({})",
            quoted(p),
            PATHS.join(", ")
        ))
        .at("update_mask"));
    }
    let wants = |f: &str| paths.is_empty() || paths.iter().any(|p| p == f);
    Ok((
        space,
        t.name,
        TemplateUpdate {
            description: wants("description").then_some(t.description),
            image: wants("image").then_some(t.image),
            limits: wants("limits").then(|| limits_from_proto(t.limits)),
            env: wants("env").then(|| t.env.into_iter().collect()),
            work_dir: wants("work_dir").then_some(t.work_dir),
            setup: wants("setup_commands").then_some(t.setup_commands),
            pool_size: wants("pool_size").then_some(t.pool_size),
            runtime_class: wants("runtime_class").then_some(t.runtime_class),
            egress: if wants("egress") {
                Some(template_egress(t.egress, t.egress_rules)?)
            } else {
                None
            },
        },
    ))
}

/// A template's egress: `None` when it names neither a mode nor rules (the runtime's default).
fn template_egress(
    mode: i32,
    rules: Vec<api::EgressRule>,
) -> Result<Option<mentis_core::egress::Egress>, Error> {
    let mode = super::egress_mode_from_proto(mode).map_err(|e| e.within("template"))?;
    if mode.is_none() && rules.is_empty() {
        return Ok(None);
    }
    mentis_core::egress::validate(
        mode,
        rules.into_iter().map(super::rule_from_proto).collect(),
        &mentis_core::egress::Egress::Deny,
        "template.egress",
    )
    .map(Some)
}

/// The public proto of a template.
pub fn template_to_proto(t: &Template) -> api::Template {
    let (egress, egress_rules) = t.egress.as_ref().map_or(
        (api::Egress::Unspecified, Vec::new()),
        super::egress_to_proto,
    );
    api::Template {
        space_id: t.space_id.to_string(),
        name: t.name.clone(),
        description: t.description.clone(),
        image: t.image.clone(),
        limits: Some(api::SandboxLimits {
            cpu: t.limits.cpu,
            memory_mb: t.limits.memory_mb,
            pids: t.limits.pids,
            nofile: t.limits.nofile,
            disk_mb: t.limits.disk_mb,
        }),
        env: t.env.clone().into_iter().collect(),
        work_dir: t.work_dir.clone(),
        setup_commands: t.setup.clone(),
        pool_size: t.pool_size,
        runtime_class: t.runtime_class.clone(),
        egress: egress as i32,
        egress_rules,
        create_time: Some(timestamp(t.created_at)),
        update_time: Some(timestamp(t.updated_at)),
    }
}
