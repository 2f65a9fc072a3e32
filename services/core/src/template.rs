//! Templates: a configuration named once in a space and reused by its sandboxes (`SandboxSpec.template`):
//! an image, default limits, env, a working directory and start-up commands (docs/ARCHITECTURE.md,
//! "Templates").

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::error::Error;
use crate::ids::SpaceId;
use crate::limits::Limits;
use crate::sandbox::SandboxRequest;
use mentis_model::quote::quoted;

/// Longest template name (a DNS label, like a space id).
pub const MAX_NAME_LEN: usize = 63;
/// Most start-up commands a template may have.
pub const MAX_SETUP_COMMANDS: usize = 32;
/// Longest start-up command, in bytes.
pub const MAX_SETUP_COMMAND_LEN: usize = 16 * 1024;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1024;
/// Most warm members a template's pool may keep.
pub const MAX_POOL_SIZE: u32 = 64;

/// A template of a space.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub space_id: SpaceId,
    /// 1-63 lowercase letters, digits or `-`, unique in its space.
    pub name: String,
    pub description: String,
    /// Empty: the runtime's default image.
    pub image: String,
    /// Limits of its sandboxes whose spec leaves them at zero (zero fields: the space's and the runtime's
    /// defaults). Bounded by the space's maxima when a sandbox is made, like a spec's.
    pub limits: Limits,
    /// Env of its sandboxes, under what a spec sets.
    pub env: BTreeMap<String, String>,
    /// Where shell actions start when they name no directory: relative to the workspace, or absolute.
    /// Empty: the workspace.
    pub work_dir: String,
    /// Shell commands run in order in each new sandbox before it is handed out; one that fails fails the
    /// create.
    pub setup: Vec<String>,
    /// Sandboxes of it kept ready (made, started, start-up commands done) for CreateSandbox to take.
    pub pool_size: u32,
    /// Runtime class of its sandboxes (one the runtime offers); empty: the space's, else the runtime's
    /// default.
    pub runtime_class: String,
    /// Egress of its sandboxes whose spec leaves it unspecified; `None`: the runtime's default.
    pub egress: Option<crate::egress::Egress>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

/// The fields an update names (an empty mask is every field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateUpdate {
    pub description: Option<String>,
    pub image: Option<String>,
    pub limits: Option<Limits>,
    pub env: Option<BTreeMap<String, String>>,
    pub work_dir: Option<String>,
    pub setup: Option<Vec<String>>,
    pub pool_size: Option<u32>,
    pub runtime_class: Option<String>,
    /// `Some(None)`: back to the runtime's default.
    pub egress: Option<Option<crate::egress::Egress>>,
}

/// Checks a template name; INVALID_ARGUMENT at `field` when malformed.
pub fn check_name(name: &str, field: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "template name {} must be 1-{MAX_NAME_LEN} lowercase letters, digits or '-', not starting or \
             ending with '-'",
            quoted(name)
        ))
        .at(field))
    }
}

impl Template {
    /// Checks what a client gave (`field` is the message's path, `template`); INVALID_ARGUMENT naming the
    /// field. Limits are checked against the space when a sandbox is made from it.
    pub fn check(&self, field: &str) -> Result<(), Error> {
        check_name(&self.name, &format!("{field}.name"))?;
        if self.description.len() > MAX_DESCRIPTION_LEN {
            return Err(Error::invalid(format!(
                "description is longer than {MAX_DESCRIPTION_LEN} bytes"
            ))
            .at(format!("{field}.description")));
        }
        if !self.image.is_empty()
            && let Err(cause) = crate::image::check_reference(&self.image)
        {
            return Err(Error::invalid(format!(
                "image {} is not a valid image reference: {cause}",
                quoted(&self.image)
            ))
            .at(format!("{field}.image")));
        }
        let l = self.limits;
        if l.cpu < 0.0
            || !l.cpu.is_finite()
            || l.memory_mb < 0
            || l.pids < 0
            || l.nofile < 0
            || l.disk_mb < 0
        {
            return Err(Error::invalid("limits cannot be negative").at(format!("{field}.limits")));
        }
        crate::sandbox::validate_env(&self.env, &format!("{field}.env"))?;
        if self.work_dir.contains('\0') || self.work_dir.len() > 4096 {
            return Err(
                Error::invalid("work_dir is not a usable path").at(format!("{field}.work_dir"))
            );
        }
        if self.setup.len() > MAX_SETUP_COMMANDS {
            return Err(
                Error::invalid(format!("at most {MAX_SETUP_COMMANDS} start-up commands"))
                    .at(format!("{field}.setup_commands")),
            );
        }
        if self.pool_size > MAX_POOL_SIZE {
            return Err(
                Error::invalid(format!("pool_size is at most {MAX_POOL_SIZE}"))
                    .at(format!("{field}.pool_size")),
            );
        }
        crate::runtime_class::check_name(&self.runtime_class, &format!("{field}.runtime_class"))?;
        for (i, c) in self.setup.iter().enumerate() {
            if c.trim().is_empty() || c.len() > MAX_SETUP_COMMAND_LEN || c.contains('\0') {
                return Err(Error::invalid(format!(
                    "a start-up command must be 1 to {MAX_SETUP_COMMAND_LEN} bytes, without NUL"
                ))
                .at(format!("{field}.setup_commands[{i}]")));
            }
        }
        Ok(())
    }

    /// Fills what `req` leaves unset from the template: the image, each zero limit, the env under the
    /// request's own.
    pub fn apply(&self, req: &mut SandboxRequest) {
        if req.image.is_empty() {
            req.image.clone_from(&self.image);
        }
        let l = self.limits;
        if req.cpu_limit == 0.0 {
            req.cpu_limit = l.cpu;
        }
        if req.memory_limit_mb == 0 {
            req.memory_limit_mb = l.memory_mb;
        }
        if req.pids_limit == 0 {
            req.pids_limit = l.pids;
        }
        if req.nofile_limit == 0 {
            req.nofile_limit = l.nofile;
        }
        if req.disk_limit_mb == 0 {
            req.disk_limit_mb = l.disk_mb;
        }
        let mut env = self.env.clone();
        env.extend(std::mem::take(&mut req.env));
        req.env = env;
        if req.egress.is_none()
            && req.egress_rules.is_empty()
            && let Some(egress) = &self.egress
        {
            req.egress = Some(egress.mode());
            req.egress_rules = egress.to_requests();
        }
    }

    /// The template with `update`'s fields set.
    pub fn updated(mut self, update: TemplateUpdate, now: SystemTime) -> Self {
        if let Some(v) = update.description {
            self.description = v;
        }
        if let Some(v) = update.image {
            self.image = v;
        }
        if let Some(v) = update.limits {
            self.limits = v;
        }
        if let Some(v) = update.env {
            self.env = v;
        }
        if let Some(v) = update.work_dir {
            self.work_dir = v;
        }
        if let Some(v) = update.setup {
            self.setup = v;
        }
        if let Some(v) = update.pool_size {
            self.pool_size = v;
        }
        if let Some(v) = update.runtime_class {
            self.runtime_class = v;
        }
        if let Some(v) = update.egress {
            self.egress = v;
        }
        self.updated_at = now;
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn template() -> Template {
        Template {
            space_id: SpaceId::default_space(),
            name: "node-22".to_owned(),
            description: String::new(),
            image: "my/node:22".to_owned(),
            limits: Limits {
                cpu: 2.0,
                memory_mb: 1024,
                ..Limits::default()
            },
            env: [
                ("NODE_ENV".to_owned(), "test".to_owned()),
                ("A".to_owned(), "template".to_owned()),
            ]
            .into(),
            work_dir: "app".to_owned(),
            setup: vec!["mkdir -p app".to_owned()],
            pool_size: 0,
            runtime_class: String::new(),
            egress: None,
            created_at: SystemTime::UNIX_EPOCH,
            updated_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_template_fills_what_the_request_leaves_unset_and_nothing_else() {
        let mut req = SandboxRequest {
            memory_limit_mb: 256,
            env: [("A".to_owned(), "request".to_owned())].into(),
            ..SandboxRequest::default()
        };
        template().apply(&mut req);
        assert_eq!(req.image, "my/node:22");
        assert_eq!(
            (req.cpu_limit, req.memory_limit_mb, req.pids_limit),
            (2.0, 256, 0)
        );
        assert_eq!(
            req.env,
            [
                ("A".to_owned(), "request".to_owned()),
                ("NODE_ENV".to_owned(), "test".to_owned())
            ]
            .into()
        );
        let mut own_image = SandboxRequest {
            image: "other:1".to_owned(),
            ..SandboxRequest::default()
        };
        template().apply(&mut own_image);
        assert_eq!(own_image.image, "other:1");
    }

    #[test]
    fn names_and_fields_are_checked_naming_the_field() {
        assert!(template().check("template").is_ok());
        for bad in ["", "Node", "-a", "a-", "a_b", &"a".repeat(64)] {
            let e = check_name(bad, "template.name").unwrap_err();
            assert_eq!(e.field(), Some("template.name"), "{bad:?}");
        }
        let cases: Vec<(Template, &str)> = vec![
            (
                Template {
                    image: "Not An Image".to_owned(),
                    ..template()
                },
                "template.image",
            ),
            (
                Template {
                    limits: Limits {
                        memory_mb: -1,
                        ..Limits::default()
                    },
                    ..template()
                },
                "template.limits",
            ),
            (
                Template {
                    env: [("A=B".to_owned(), "x".to_owned())].into(),
                    ..template()
                },
                "template.env",
            ),
            (
                Template {
                    setup: vec!["echo ok".to_owned(), "  ".to_owned()],
                    ..template()
                },
                "template.setup_commands[1]",
            ),
        ];
        for (t, field) in cases {
            let e = t.check("template").unwrap_err();
            assert!(
                e.field().is_some_and(|f| f.starts_with(field)),
                "{e:?} {field}"
            );
        }
    }
}
