//! Confinement of request paths to the workspace: parsing (lexical) and walking (by file descriptor).
//!
//! Why descriptors and not `canonicalize` + prefix check: a check on a path string is a time-of-check /
//! time-of-use race. Commands in the sandbox run as our user and can swap a directory for a symbolic link
//! between our check and our open. Instead, every call starts from a descriptor of the workspace root and
//! opens one component at a time relative to the previous directory's descriptor, with `O_NOFOLLOW` (and
//! `O_DIRECTORY` for directories). The kernel then guarantees each step names a real directory entry of a
//! directory we hold open: a link swapped in at any moment makes the open fail (`ELOOP`/`ENOTDIR`) instead of
//! leading elsewhere, and `..` never reaches the kernel because it is refused while parsing. The final
//! component is likewise opened, created, renamed or removed relative to its parent's descriptor, never by
//! a path string. (`openat2(RESOLVE_BENEATH)` would do the same in one call, but not on every kernel or
//! gVisor; this walk works everywhere.) Policy: no link is ever followed, even one that stays inside the
//! workspace; links are listed, described and deleted, never traversed.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::error::Error;

/// A request path, checked to stay inside the workspace: its components below the root, none of them
/// `.`, `..` or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WsPath {
    parts: Vec<OsString>,
}

impl WsPath {
    /// Parses `raw`: relative to the workspace, or absolute under `workspace`. Refuses `..`, NUL bytes and
    /// absolute paths elsewhere with InvalidArgument.
    pub(crate) fn parse(workspace: &Path, raw: &str) -> Result<Self, Error> {
        if raw.contains('\0') {
            return Err(Error::InvalidArgument(
                "path must not contain NUL bytes".to_owned(),
            ));
        }
        let path = Path::new(raw);
        let below = if path.is_absolute() {
            path.strip_prefix(workspace).map_err(|_| {
                Error::InvalidArgument(format!(
                    "path {raw:?} is outside the workspace {}",
                    workspace.display()
                ))
            })?
        } else {
            path
        };
        Self::from_relative(below).map_err(|()| {
            Error::InvalidArgument(format!(
                "path {raw:?} leaves the workspace (\"..\" is not allowed)"
            ))
        })
    }

    /// Components of a relative path; `Err` for `..` or anything absolute.
    pub(crate) fn from_relative(path: &Path) -> Result<Self, ()> {
        let mut parts = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(name) => parts.push(name.to_owned()),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(()),
            }
        }
        Ok(Self { parts })
    }

    /// A path from components already checked (taken from another `WsPath`).
    pub(crate) fn from_parts(parts: &[OsString]) -> Self {
        Self {
            parts: parts.to_vec(),
        }
    }

    /// The workspace root itself.
    pub(crate) fn root() -> Self {
        Self { parts: Vec::new() }
    }

    pub(crate) fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    pub(crate) fn parts(&self) -> &[OsString] {
        &self.parts
    }

    /// The parent's components and the last name; `None` for the root.
    pub(crate) fn split_last(&self) -> Option<(&[OsString], &OsStr)> {
        self.parts
            .split_last()
            .map(|(last, parent)| (parent, last.as_os_str()))
    }

    /// This path with `name` appended.
    pub(crate) fn join(&self, name: &OsStr) -> Self {
        let mut parts = self.parts.clone();
        parts.push(name.to_owned());
        Self { parts }
    }

    /// The path as the API shows it: relative, `/`-separated, `""` for the root.
    pub(crate) fn display(&self) -> String {
        let mut out = String::new();
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            out.push_str(&p.to_string_lossy());
        }
        out
    }
}

/// Opens a directory given by a trusted path (the configured workspace root).
pub(crate) fn open_root(workspace: &Path) -> Result<OwnedFd, Error> {
    open(
        workspace,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        context: format!("opening the workspace {}", workspace.display()),
        source: e.into(),
    })
}

/// Opens `name` in `dir` as a directory without following a link.
pub(crate) fn open_dir_at(dir: impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether `name` in `dir` is a symbolic link (false when it cannot be told).
pub(crate) fn is_symlink_at(dir: impl AsFd, name: &OsStr) -> bool {
    fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
        .unwrap_or(false)
}

/// A directory reached by [`walk`], and the directories the walk created (to undo them on failure).
pub(crate) struct Walked {
    pub(crate) fd: OwnedFd,
    /// Index in the walked parts of the first directory this walk created, if any.
    pub(crate) first_created: Option<usize>,
}

/// Walks `parts` below `root` one component at a time (see the module comment), each a real directory.
/// With `create`, missing directories are made with that mode. `shown` names the request's path in errors.
pub(crate) fn walk(
    root: &OwnedFd,
    parts: &[OsString],
    create: Option<Mode>,
    shown: &str,
) -> Result<Walked, Error> {
    let mut current = root.try_clone().map_err(|source| Error::Io {
        context: "duplicating the workspace descriptor".to_owned(),
        source,
    })?;
    let mut first_created = None;
    for (i, name) in parts.iter().enumerate() {
        let next = match open_dir_at(&current, name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create.is_some() => {
                let mode = create.unwrap_or(Mode::from_bits_truncate(0o755));
                match mkdirat(&current, name.as_os_str(), mode) {
                    Ok(()) => {
                        first_created.get_or_insert(i);
                    }
                    // Someone else made it meanwhile: use theirs (if it is a directory).
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(errno_error(e, &current, name, shown)),
                }
                open_dir_at(&current, name).map_err(|e| errno_error(e, &current, name, shown))?
            }
            Err(e) => return Err(errno_error(e, &current, name, shown)),
        };
        current = next;
    }
    Ok(Walked {
        fd: current,
        first_created,
    })
}

/// Removes (if empty) the directories a failed operation created: `parts[first..]`, deepest first.
pub(crate) fn undo_created(root: &OwnedFd, parts: &[OsString], first: usize) {
    for end in (first + 1..=parts.len()).rev() {
        let Some((name, parent)) = parts[..end].split_last() else {
            continue;
        };
        if let Ok(w) = walk(root, parent, None, "") {
            let _ = unlinkat(&w.fd, name.as_os_str(), UnlinkatFlags::RemoveDir);
        }
    }
}

/// Turns a failed system call on `name` (in `dir`) into the request's error.
pub(crate) fn errno_error(e: Errno, dir: impl AsFd, name: &OsStr, shown: &str) -> Error {
    match e {
        // O_NOFOLLOW on a link gives ELOOP, O_DIRECTORY on it may give ENOTDIR first: ask what it is.
        Errno::ELOOP | Errno::ENOTDIR if is_symlink_at(dir.as_fd(), name) => {
            Error::InvalidArgument(format!(
                "path {shown:?} goes through the symbolic link {:?}; links are not followed",
                name.to_string_lossy()
            ))
        }
        other => path_error(other, shown),
    }
}

/// The error of a failed system call on the request's path `shown`.
pub(crate) fn path_error(e: Errno, shown: &str) -> Error {
    match e {
        Errno::ENOENT => Error::PathNotFound(format!("{shown:?} does not exist")),
        Errno::EEXIST => Error::PathExists(format!("{shown:?} already exists")),
        Errno::ELOOP => Error::InvalidArgument(format!(
            "path {shown:?} goes through a symbolic link; links are not followed"
        )),
        Errno::ENOTDIR => {
            Error::InvalidArgument(format!("a component of {shown:?} is not a directory"))
        }
        Errno::EISDIR => Error::InvalidArgument(format!("{shown:?} is a directory")),
        Errno::ENAMETOOLONG => Error::InvalidArgument(format!("{shown:?} is too long")),
        Errno::ENOTEMPTY => Error::FailedPrecondition(format!(
            "directory {shown:?} is not empty (set recursive to delete it with its content)"
        )),
        Errno::EACCES | Errno::EPERM | Errno::EROFS => {
            Error::FailedPrecondition(format!("permission denied on {shown:?}"))
        }
        Errno::ENOSPC | Errno::EDQUOT => Error::WorkspaceFull,
        other => Error::Io {
            context: format!("file operation on {shown:?}"),
            source: other.into(),
        },
    }
}

/// `name` as bytes, for building temporary names.
pub(crate) fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(raw: &str) -> Result<String, Error> {
        WsPath::parse(Path::new("/workspace"), raw).map(|p| p.display())
    }

    #[test]
    fn relative_and_absolute_paths_inside_the_workspace_are_accepted() {
        assert_eq!(parse("a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(parse("./a//b/./c").unwrap(), "a/b/c");
        assert_eq!(parse("/workspace/a/b").unwrap(), "a/b");
        assert_eq!(parse("/workspace").unwrap(), "");
        assert_eq!(parse("").unwrap(), "");
        assert_eq!(parse(".").unwrap(), "");
    }

    #[test]
    fn escapes_are_invalid_arguments() {
        for raw in [
            "../../etc/passwd",
            "a/../../b",
            "a/..",
            "..",
            "/etc/passwd",
            "/workspace2/x",
            "/workspace/../etc",
            "/",
            "a\0b",
        ] {
            assert!(
                matches!(parse(raw), Err(Error::InvalidArgument(_))),
                "{raw:?} must be refused"
            );
        }
    }
}
