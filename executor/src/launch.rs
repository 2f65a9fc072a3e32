//! `mentis-executor launch -- PROGRAM ARGS...`: the container's entrypoint. It moves the token out of the
//! environment into a pipe and execs PROGRAM (tini, which starts the executor) without it.
//!
//! Why: Docker hands the token to the container's first process in its environment, and
//! `/proc/PID/environ` keeps a process's initial environment for its whole life, readable by every process
//! of the same user. The executor hides itself (it is non-dumpable), but tini, PID 1, cannot, so user code
//! could read the token from `/proc/1/environ`. After this exec PID 1's environment no longer holds it: the
//! token waits in a pipe whose descriptor PROGRAM passes down, and the executor drains and closes it at start
//! (`MENTIS_EXECUTOR_TOKEN_FD`). Nothing can read it again: the write end was closed before the exec, so
//! once drained the pipe only gives end-of-file.
//!
//! Before that, as root and before anything else runs, `launch` readies a container of any image
//! ([`prepare`]): the image must have a `/bin/sh`, and a fresh workspace volume of an image that has no
//! `/workspace` of its own belongs to root, so it is given to the sandbox user (the one use of CAP_CHOWN,
//! which is then dropped for good). `mentis-executor install DIR` ([`install`]) copies the executor and tini
//! into the volume the runtime mounts read-only at `/.mentis` of every sandbox (docs/ARCHITECTURE.md, "Any
//! image").

use std::io::{Read as _, Write as _};
use std::os::fd::{FromRawFd as _, IntoRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

use crate::config::{DEFAULT_WORKSPACE, EGRESS_CA_DIR, EGRESS_CA_ENV, TOKEN_ENV, WORKSPACE_ENV};
use crate::identity::{SANDBOX_USER_ENV, parse_user};

/// The descriptor number holding the token, set by `launch` for the executor.
pub const TOKEN_FD_ENV: &str = "MENTIS_EXECUTOR_TOKEN_FD";

/// The shell every image must have: commands run in `/bin/bash` when there is one, else in `/bin/sh`.
pub const SH: &str = "/bin/sh";

/// Execs `program` with `args`, the token moved from the environment into an inherited pipe, once the
/// container is ready ([`prepare`]). Returns only on failure, with what went wrong.
pub fn launch(program: &str, args: &[String]) -> String {
    if let Err(e) = prepare(|name| std::env::var(name).ok()) {
        return e;
    }
    match hand_over(program, args) {
        Ok(never) => match never {},
        Err(e) => format!("cannot start {program}: {e}"),
    }
}

fn hand_over(program: &str, args: &[String]) -> std::io::Result<std::convert::Infallible> {
    let token = std::env::var(TOKEN_ENV)
        .map_err(|_| std::io::Error::other(format!("{TOKEN_ENV} is required")))?;
    let (reader, mut writer) = std::io::pipe()?;
    // A token is far smaller than a pipe's buffer, so this does not block without a reader.
    writer.write_all(token.as_bytes())?;
    drop(writer);
    let reader = OwnedFd::from(reader);
    // std makes descriptors close-on-exec; this one must survive the exec (and tini's into the executor).
    fcntl(&reader, FcntlArg::F_SETFD(FdFlag::empty()))?;
    // Kept open past this function: it is the exec'd program's now.
    let fd = reader.into_raw_fd();
    Err(Command::new(program)
        .args(args)
        .env_remove(TOKEN_ENV)
        .env(TOKEN_FD_ENV, fd.to_string())
        .exec())
}

/// When `launch` started us: reads the token from the descriptor in [`TOKEN_FD_ENV`] and closes it.
/// Call before any thread starts and before anything is spawned.
pub fn take_token_from_fd() -> Result<Option<String>, String> {
    let Ok(raw) = std::env::var(TOKEN_FD_ENV) else {
        return Ok(None);
    };
    let fd: i32 = raw
        .trim()
        .parse()
        .ok()
        .filter(|fd| *fd > 2)
        .ok_or_else(|| format!("{TOKEN_FD_ENV}={raw:?} is not a descriptor number above 2"))?;
    // /proc/self/fd lists exactly the open descriptors (its entries are links: do not follow them).
    if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(format!("{TOKEN_FD_ENV}={fd}: not an open descriptor"));
    }
    // SAFETY: the descriptor is open (checked above), was made for us by `launch`, and nothing else in this
    // process knows of it, so taking ownership (and closing it when done) cannot close someone else's file.
    #[allow(unsafe_code)]
    let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut token = String::new();
    pipe.read_to_string(&mut token)
        .map_err(|e| format!("reading the token from descriptor {fd}: {e}"))?;
    Ok(Some(token))
}

/// Readies the container before the executor starts (see the module's doc): checks the image's shell, gives
/// a root-owned workspace to the sandbox user, and drops CAP_CHOWN from every capability set this process
/// has, so nothing started from here on (tini, the executor, user code) can have it again: under
/// no-new-privileges an exec never gains a capability its caller had lost.
fn prepare(lookup: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    match std::fs::metadata(SH) {
        Ok(meta) if meta.is_file() => {}
        _ => {
            return Err(format!(
                "this image has no {SH}: sandboxes run shell commands with /bin/bash or {SH}, so the image \
                 needs one of them (dash, bash or busybox will do)"
            ));
        }
    }
    if let Some(ca) = lookup(EGRESS_CA_ENV)
        && nix::unistd::geteuid().is_root()
    {
        trust_egress_ca(&ca, std::path::Path::new(EGRESS_CA_DIR), &SYSTEM_BUNDLES);
    }
    let Some(user) = lookup(SANDBOX_USER_ENV) else {
        return Ok(());
    };
    let (uid, gid) = parse_user(&user)?;
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let workspace = lookup(WORKSPACE_ENV).unwrap_or_else(|| DEFAULT_WORKSPACE.to_owned());
    match std::fs::metadata(&workspace) {
        Ok(meta) if std::os::unix::fs::MetadataExt::uid(&meta) == 0 => {
            // A new volume on a folder the image does not have: the engine made it root's.
            match nix::unistd::chown(workspace.as_str(), Some(uid), Some(gid)) {
                Ok(()) => {}
                // A container made without CAP_CHOWN (by hand): the workspace stays as it is.
                Err(nix::errno::Errno::EPERM) => eprintln!(
                    "mentis-executor launch: warning: the workspace {workspace} belongs to root and cannot be \
                     given to the sandbox user (no CAP_CHOWN): user code may not write there"
                ),
                Err(e) => {
                    return Err(format!(
                        "cannot give the workspace {workspace} to {uid}:{gid}: {e}"
                    ));
                }
            }
        }
        Ok(_) => {}
        Err(e) => return Err(format!("the workspace {workspace} is not there: {e}")),
    }
    drop_chown()
}

/// Where images keep their trust store (Debian and Ubuntu, Alpine; Fedora and RHEL; others).
pub const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Makes the egress gateway's CA trusted (docs/EGRESS.md, "The gateway's CA"): `dir/ca.pem` is the CA,
/// `dir/bundle.pem` the image's first trust store with the CA after it (the sandbox's env points OpenSSL,
/// Python, pip, curl, git and Node at them), both root's and read-only to others; where the image's trust
/// store is writable (a writable root), the CA is added to it too. What fails is said and skipped: a sandbox
/// whose tools do not trust the CA still runs, and only its intercepted names fail TLS.
fn trust_egress_ca(ca: &str, dir: &std::path::Path, bundles: &[&str]) {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let ca = if ca.ends_with('\n') {
        ca.to_owned()
    } else {
        format!("{ca}\n")
    };
    let system = bundles
        .iter()
        .find_map(|b| Some((*b, std::fs::read(b).ok()?)));
    let write = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)?
            .write_all(bytes)
    };
    let made = std::fs::DirBuilder::new()
        .mode(0o755)
        .create(dir)
        .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
        .and_then(|()| write("ca.pem", ca.as_bytes()))
        .and_then(|()| {
            let mut bundle = system.as_ref().map(|(_, b)| b.clone()).unwrap_or_default();
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(ca.as_bytes());
            write("bundle.pem", &bundle)
        });
    if let Err(e) = made {
        eprintln!(
            "mentis-executor launch: warning: cannot write the egress gateway's CA into {}: {e}",
            dir.display()
        );
    }
    if let Some((path, bytes)) = &system
        && !bytes
            .windows(ca.trim_end().len())
            .any(|w| w == ca.trim_end().as_bytes())
    {
        // A read-only root refuses this (EROFS): the bundle above serves then.
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
            let _ = f.write_all(format!("\n{ca}").as_bytes());
        }
    }
}

/// Removes CAP_CHOWN from the effective, permitted and inheritable sets (lowering needs no privilege).
fn drop_chown() -> Result<(), String> {
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    let mut sets =
        capabilities(None).map_err(|e| format!("cannot read this process's capabilities: {e}"))?;
    sets.effective.remove(CapabilitySet::CHOWN);
    sets.permitted.remove(CapabilitySet::CHOWN);
    sets.inheritable.remove(CapabilitySet::CHOWN);
    set_capabilities(None, sets).map_err(|e| format!("cannot drop CAP_CHOWN: {e}"))
}

/// The programs `install` copies from its own folder: the executor and tini (a static build of each).
pub const INSTALLED: [&str; 2] = ["mentis-executor", "tini"];

/// `mentis-executor install DIR`: copies [`INSTALLED`] from this executable's folder into `DIR/bin`, each
/// through a temporary file renamed into place, so a sandbox starting meanwhile runs the old or the new
/// file and never half of one, and installers running at once (two runtimes starting) do not clash. A file
/// already the same is left alone.
pub fn install(dir: &std::path::Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let from = exe
        .parent()
        .ok_or_else(|| format!("{} has no folder", exe.display()))?;
    install_from(from, dir)
}

/// [`install`] from the folder `from`.
fn install_from(from: &std::path::Path, dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("cannot create {}: {e}", bin.display()))?;
    for folder in [dir, bin.as_path()] {
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot set the mode of {}: {e}", folder.display()))?;
    }
    for name in INSTALLED {
        let source = from.join(name);
        let bytes =
            std::fs::read(&source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
        let target = bin.join(name);
        if std::fs::read(&target).is_ok_and(|old| old == bytes) {
            continue;
        }
        // A name of its own (not the pid: every installer is PID 1 of its container), so installers
        // running at once never write the same file.
        let temp = bin.join(format!(".{name}.{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut file = std::fs::File::create(&temp)?;
            file.write_all(&bytes)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
            file.sync_all()?;
            std::fs::rename(&temp, &target)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(format!("cannot install {}: {e}", target.display()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_egress_ca_joins_a_copy_of_the_trust_store_and_a_writable_one_itself() {
        let root = tempfile::tempdir().unwrap();
        let system = root.path().join("ca-certificates.crt");
        std::fs::write(
            &system,
            "-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----",
        )
        .unwrap();
        let ca = "-----BEGIN CERTIFICATE-----\nGATEWAY\n-----END CERTIFICATE-----\n";
        let dir = root.path().join(".mentis-ca");
        let missing = root.path().join("missing.crt");
        let bundles = [missing.to_str().unwrap(), system.to_str().unwrap()];
        trust_egress_ca(ca, &dir, &bundles);
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca);
        let bundle = std::fs::read_to_string(dir.join("bundle.pem")).unwrap();
        assert!(bundle.starts_with("-----BEGIN CERTIFICATE-----\nSYSTEM\n"));
        assert!(bundle.ends_with(ca));
        let appended = std::fs::read_to_string(&system).unwrap();
        assert!(appended.ends_with(ca));
        // Again (a container started again): the files are made anew, the store not grown.
        trust_egress_ca(ca, &dir, &bundles);
        assert_eq!(std::fs::read_to_string(&system).unwrap(), appended);
        assert_eq!(
            std::fs::read_to_string(dir.join("bundle.pem"))
                .unwrap()
                .matches("GATEWAY")
                .count(),
            2
        );
    }

    #[test]
    fn installers_running_at_once_each_leave_whole_files() {
        let from = tempfile::tempdir().unwrap();
        for (i, name) in INSTALLED.iter().enumerate() {
            std::fs::write(
                from.path().join(name),
                vec![u8::try_from(i).unwrap(); 1 << 20],
            )
            .unwrap();
        }
        let to = tempfile::tempdir().unwrap();
        // Many at once into one folder (runtimes starting together on one engine), from one process: the
        // temporary names must not clash (every installer is PID 1 of its own container).
        std::thread::scope(|s| {
            let installs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| install_from(from.path(), to.path())))
                .collect();
            for i in installs {
                i.join().unwrap().unwrap();
            }
        });
        for name in INSTALLED {
            assert_eq!(
                std::fs::read(to.path().join("bin").join(name)).unwrap(),
                std::fs::read(from.path().join(name)).unwrap()
            );
        }
        // Nothing but the programs is left.
        let mut left: Vec<_> = std::fs::read_dir(to.path().join("bin"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["mentis-executor", "tini"]);
        // Run again with the same files: nothing to do, still whole.
        install_from(from.path(), to.path()).unwrap();
    }
}
