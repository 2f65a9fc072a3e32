//! Who the executor is, and who user code is (docs/ARCHITECTURE.md, "Security model").
//!
//! In a sandbox container the executor starts as root with two capabilities, SETUID and SETGID (the backend
//! drops every other), and [`become_supervisor`] makes it the sandbox user for everything it does while
//! keeping root as its real and saved user id: `(ruid, euid, suid) = (0, 1000, 0)`, likewise for the group
//! ids, no supplementary groups. Every process that runs user code (a command's bash, the IPython kernel)
//! is started by `crate::enter` as `(1000, 1000, 1000)`, and so has no capability at all.
//!
//! What that gives:
//! - **User code cannot signal the executor or tini.** The kernel lets a process signal another only when
//!   the sender's real or effective uid equals the target's real or saved uid (or with CAP_KILL): user code
//!   is 1000 everywhere, the executor and tini are 0 there. `kill -9 -1` kills user code only, `kill -STOP`
//!   of the executor is EPERM.
//! - **User code cannot trace the executor or tini, nor reach their descriptors** (`/proc/1/fd/1`, the
//!   executor's pipes): ptrace access, which also guards /proc/PID/fd, /mem and /environ, needs the
//!   caller's uid to equal the target's real, effective and saved uids.
//! - **The executor still acts as the sandbox user** wherever it touches the workspace or user processes:
//!   files it writes belong to 1000 and it sees the permissions user code sees (its effective uid is the
//!   file-system identity), and it signals user processes as their owner, without CAP_KILL.
//! - User processes are started with `setresuid`, which an unprivileged process may do towards any of its
//!   three ids: no capability is used after start, and none can be regained by user code (all its ids are
//!   1000, so its permitted set is empty, and no-new-privileges closes setuid binaries and file capabilities).
//!
//! Outside a container (tests, development) `MENTIS_SANDBOX_USER` is unset and user code runs as the
//! executor's own user, as before.

use std::path::PathBuf;
use std::sync::OnceLock;

use nix::unistd::{Gid, Uid};

/// `UID:GID` of the sandbox user (numeric): set, the executor supervises user code running as it.
pub const SANDBOX_USER_ENV: &str = "MENTIS_SANDBOX_USER";

/// The sandbox user that user processes run as, when the executor supervises (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxUser {
    pub uid: Uid,
    pub gid: Gid,
    /// HOME of user processes: the container's HOME when it was set for them (a read-only root's /tmp),
    /// else the user's passwd entry, else the workspace.
    pub home: PathBuf,
}

static USER: OnceLock<SandboxUser> = OnceLock::new();

/// Parses `UID:GID` (numbers only: it must hold for any image, with or without a passwd entry).
pub fn parse_user(raw: &str) -> Result<(Uid, Gid), String> {
    let bad = || format!("{SANDBOX_USER_ENV}={raw:?} is not UID:GID (numbers)");
    let (uid, gid) = raw.trim().split_once(':').ok_or_else(bad)?;
    let uid: u32 = uid.parse().map_err(|_| bad())?;
    let gid: u32 = gid.parse().map_err(|_| bad())?;
    if uid == 0 || gid == 0 {
        return Err(format!(
            "{SANDBOX_USER_ENV}={raw:?}: user code never runs as root"
        ));
    }
    Ok((Uid::from_raw(uid), Gid::from_raw(gid)))
}

/// Reads [`SANDBOX_USER_ENV`] and, when set, takes the supervisor's identity (see the module's doc).
/// Call at the top of main, before any thread starts (the id changes are process-wide). Returns the
/// user, or None when unset (user code then runs as the executor's user).
pub fn become_supervisor(
    lookup: impl Fn(&str) -> Option<String>,
    workspace: &std::path::Path,
) -> Result<Option<SandboxUser>, String> {
    let Some(raw) = lookup(SANDBOX_USER_ENV) else {
        return Ok(None);
    };
    let (uid, gid) = parse_user(&raw)?;
    let home = home_of(uid, lookup("HOME"), workspace);
    let user = SandboxUser { uid, gid, home };
    let euid = nix::unistd::geteuid();
    if euid == uid {
        // Started as the sandbox user itself (an image run by hand with `--user 1000`): nothing to change,
        // and nothing separates user code from the executor.
        eprintln!(
            "mentis-executor: warning: started as the sandbox user {uid}, not as root: user code can signal \
             the executor"
        );
    } else if euid.is_root() {
        let root = Uid::from_raw(0);
        let root_group = Gid::from_raw(0);
        nix::unistd::setgroups(&[])
            .map_err(|e| format!("cannot drop supplementary groups (CAP_SETGID?): {e}"))?;
        nix::unistd::setresgid(root_group, gid, root_group)
            .map_err(|e| format!("cannot take the sandbox group {gid} (CAP_SETGID?): {e}"))?;
        nix::unistd::setresuid(root, uid, root)
            .map_err(|e| format!("cannot take the sandbox user {uid} (CAP_SETUID?): {e}"))?;
    } else {
        return Err(format!(
            "{SANDBOX_USER_ENV}={raw:?}: the executor must start as root (to supervise user code) or as \
             that user, not as uid {euid}"
        ));
    }
    USER.set(user.clone())
        .map_err(|_| "the supervisor's identity was already taken".to_owned())?;
    Ok(Some(user))
}

fn home_of(uid: Uid, env_home: Option<String>, workspace: &std::path::Path) -> PathBuf {
    // Docker sets HOME=/root for a container that starts as root; any other value was meant for user code.
    if let Some(home) = env_home.filter(|h| !h.is_empty() && h != "/root") {
        return PathBuf::from(home);
    }
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| home_in(&passwd, uid))
        .unwrap_or_else(|| workspace.to_path_buf())
}

/// The home folder of `uid` in a passwd file (`name:x:uid:gid:gecos:home:shell`), when it names one.
///
/// Read from /etc/passwd itself, not through glibc's name service: the executor is linked statically (it
/// runs in images we did not build), and a static glibc cannot load the image's NSS modules.
fn home_in(passwd: &str, uid: Uid) -> Option<PathBuf> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            [_, _, id, _, _, home, ..] if id.parse() == Ok(uid.as_raw()) && !home.is_empty() => {
                Some(PathBuf::from(home))
            }
            _ => None,
        }
    })
}

/// The sandbox user that user processes run as, when the executor supervises (`crate::enter` starts them
/// as it).
pub(crate) fn sandbox_user() -> Option<&'static SandboxUser> {
    USER.get()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sandbox_users_are_numeric_and_never_root() {
        assert_eq!(
            parse_user("1000:1001").unwrap(),
            (Uid::from_raw(1000), Gid::from_raw(1001))
        );
        for bad in [
            "",
            "1000",
            "sandbox:sandbox",
            "1000:",
            ":1000",
            "-1:5",
            "0:1000",
            "1000:0",
        ] {
            assert!(parse_user(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn home_is_the_containers_unless_it_is_roots() {
        let ws = std::path::Path::new("/workspace");
        let uid = Uid::from_raw(0);
        assert_eq!(home_of(uid, Some("/tmp".into()), ws), PathBuf::from("/tmp"));
        // root's own HOME is not user code's: the passwd entry (root's, here) or the workspace.
        let home = home_of(Uid::from_raw(4_000_000), Some("/root".into()), ws);
        assert_eq!(home, PathBuf::from("/workspace"));
    }

    #[test]
    fn a_home_is_read_from_a_passwd_file() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbroken line\n\
                      nohome:x:1001:1001:::/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/bash\n";
        assert_eq!(
            home_in(passwd, Uid::from_raw(1000)),
            Some(PathBuf::from("/home/sandbox"))
        );
        assert_eq!(
            home_in(passwd, Uid::from_raw(0)),
            Some(PathBuf::from("/root"))
        );
        assert_eq!(home_in(passwd, Uid::from_raw(1001)), None);
        assert_eq!(home_in(passwd, Uid::from_raw(42)), None);
    }
}
