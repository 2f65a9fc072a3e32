//! Starting user code (docs/ARCHITECTURE.md, "Starting user code"): every process that runs user code (a
//! command's bash, a session's shell, a terminal's program, the IPython kernel) starts as `mentis-enter`
//! (executor/enter), which yields to the executor and takes the sandbox user's ids, then execs the program:
//! - OOM score adjustment 1000: when the memory limit is reached, the kernel kills user processes (the
//!   biggest first) before it would consider the executor (left at the container's value, normally 0);
//! - nice 5 for commands and terminals ([`Priority::Lowered`]): within the container's CPU quota the
//!   executor (nice 0) gets about three times a busy command's share, enough to keep answering; user code
//!   alone still gets all of it. The kernel keeps its priority: it must answer promptly;
//! - every signal at its default action: an executor started with SIGINT ignored (a shell's background
//!   job) would otherwise give user code a Ctrl-C, a timeout's SIGINT or a terminal's signal that does
//!   nothing;
//! - `(uid, gid)` of the sandbox user, all three of each, when the executor supervises (see `identity`).
//!
//! Why a program and not std's `pre_exec`: a `pre_exec` closure makes std fork the executor, and fork
//! copies the page tables of a multi-threaded process and write-protects every page it has written, which
//! then costs a fault each: about 0.6 ms a command here. Without closures, ids or a working folder (in a
//! static executor std cannot find the libc function that sets one in the spawn, see [`command`]), std
//! spawns with posix_spawn (clone with a shared address space, no copy), and the freestanding
//! `mentis-enter` (a few KiB of system calls, no libc) costs about 0.05 ms to exec. All of it is done before the program runs, so
//! the score and the niceness hold before it can fork anything (both are inherited).
//!
//! The program is embedded in the executor and run from a sealed memfd, through `/proc/self/fd/N`: one
//! binary to ship (also into images we did not build), nothing on disk that user code could replace.

#[cfg(test)]
#[allow(dead_code)]
#[path = "../enter/enter.rs"]
mod program;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::AccessFlags;
use tokio::process::Command;

/// mentis-enter, built by build.rs.
const PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mentis-enter"));
/// Niceness of shell commands, sessions and terminals.
const USER_NICE: u32 = 5;
/// The PATH a program name is looked up in when the process's env has none (glibc's execvp default, as
/// Debian's shells set it).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `memfd_create`'s MFD_EXEC (Linux 6.3): executable whatever `vm.memfd_noexec` says for memfds that do
/// not ask. Older kernels refuse the flag; there every memfd is executable.
const MFD_EXEC: MFdFlags = MFdFlags::from_bits_retain(0x0010);

/// The CPU priority of a user process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Nice 5: commands, sessions, terminals.
    Lowered,
    /// The executor's: the kernel.
    Kept,
}

/// A command that starts `program` as user code (see the module's doc) in `dir`.
///
/// `program` is a path (relative ones from `dir`) or a name looked up in `path`, the PATH the process will
/// have (its env's, else the executor's), like execvp. It is checked here, with the sandbox user's
/// permissions (the executor's effective ids): a missing or non-executable program is this function's
/// error, as a spawn's would be. The caller adds the program's arguments, env and stdio.
pub(crate) fn command(
    program: &OsStr,
    dir: &Path,
    path: Option<&OsStr>,
    priority: Priority,
) -> io::Result<Command> {
    let resolved = resolve(program, dir, path)?;
    let mut command = entering(dir, priority)?;
    command.arg(resolved).arg(program);
    Ok(command)
}

/// A command that starts `program` (found as bash finds it, see `shell::direct`) as user code in `dir`,
/// with `argv0` as its name, and `shell -c shell_command` instead if its exec fails. The caller adds the
/// program's arguments, env and stdio.
pub(crate) fn command_or_shell(
    program: &OsStr,
    argv0: &OsStr,
    dir: &Path,
    priority: Priority,
    shell: &str,
    shell_command: &str,
) -> io::Result<Command> {
    let mut command = entering(dir, priority)?;
    command
        .arg("--or")
        .arg(shell)
        .arg(shell_command)
        .arg(program)
        .arg(argv0);
    Ok(command)
}

/// `mentis-enter` with the ids, niceness and folder of user code, and its HOME.
fn entering(dir: &Path, priority: Priority) -> io::Result<Command> {
    let enter = Enter::get()?;
    let user = crate::identity::sandbox_user();
    let id = |id: Option<u32>| id.map_or_else(|| OsString::from("-"), |id| id.to_string().into());
    let nice = match priority {
        Priority::Lowered => USER_NICE.to_string().into(),
        Priority::Kept => OsString::from("-"),
    };
    let mut command = Command::new(&enter.path);
    // mentis-enter changes into `dir`, not the spawn: std's posix_spawn path sets a folder with a libc
    // function it looks up at run time (dlsym), which a static executor cannot do, so `current_dir` would
    // make it fork the executor (about 0.5 ms a command; see the module's doc).
    command
        .arg(id(user.map(|u| u.uid.as_raw())))
        .arg(id(user.map(|u| u.gid.as_raw())))
        .arg(nice)
        .arg(dir);
    if let Some(user) = user {
        // Before the caller's env, which may set HOME.
        command.env("HOME", &user.home);
    }
    Ok(command)
}

/// The PATH a process will see: the first of `layers` (the PATH values of its envs, from the most specific,
/// an action's, to the least, the sandbox's) that is set, else the executor's own.
pub(crate) fn path_of<'a>(
    layers: impl IntoIterator<Item = Option<&'a String>>,
) -> Option<OsString> {
    layers
        .into_iter()
        .flatten()
        .next()
        .map(OsString::from)
        .or_else(|| std::env::var_os("PATH"))
}

/// Where `program` is, as execvp would find it: a path as it is (from `dir`), a name in each PATH
/// directory in turn. The first executable regular file wins; with none, the error of one that exists but
/// may not be run, else "No such file or directory".
fn resolve(program: &OsStr, dir: &Path, path: Option<&OsStr>) -> io::Result<PathBuf> {
    if program.is_empty() {
        return Err(Errno::ENOENT.into());
    }
    if program.as_bytes().contains(&b'/') {
        // join keeps an absolute path as it is.
        let full = dir.join(program);
        runnable(&full)?;
        return Ok(full);
    }
    let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut refused = None;
    for entry in std::env::split_paths(path) {
        // An empty entry is the current directory.
        let candidate = dir.join(entry).join(program);
        match runnable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => refused = Some(e),
            Err(_) => {}
        }
    }
    Err(refused.unwrap_or_else(|| Errno::ENOENT.into()))
}

/// A regular file the sandbox user may execute (`AT_EACCESS`: by the effective ids, which are the sandbox
/// user's when the executor supervises).
pub(crate) fn runnable(path: &Path) -> io::Result<()> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(Errno::EACCES.into());
    }
    nix::unistd::faccessat(AT_FDCWD, path, AccessFlags::X_OK, AtFlags::AT_EACCESS)?;
    Ok(())
}

/// mentis-enter in a sealed memfd, made once.
struct Enter {
    /// Kept open for the executor's life (close-on-exec: no user process inherits it).
    _fd: OwnedFd,
    path: PathBuf,
}

static ENTER: OnceLock<Result<Enter, String>> = OnceLock::new();

impl Enter {
    fn get() -> io::Result<&'static Self> {
        ENTER
            .get_or_init(|| Self::create().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| io::Error::other(format!("cannot prepare mentis-enter: {e}")))
    }

    fn create() -> io::Result<Self> {
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd = match memfd_create(c"mentis-enter", flags | MFD_EXEC) {
            Err(Errno::EINVAL) => memfd_create(c"mentis-enter", flags)?,
            fd => fd?,
        };
        std::fs::File::from(fd.try_clone()?).write_all(PROGRAM)?;
        // Nobody changes it from here on, not even the executor.
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_WRITE
                    | SealFlag::F_SEAL_SHRINK
                    | SealFlag::F_SEAL_GROW
                    | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        // A spawned child resolves this in its own descriptor table, a copy of ours until its exec.
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Self { _fd: fd, path })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;
    use std::process::Stdio;

    use super::*;

    fn own_score() -> String {
        std::fs::read_to_string("/proc/self/oom_score_adj").unwrap()
    }

    #[tokio::test]
    async fn commands_start_with_the_top_oom_score_lowered_priority_default_signals_and_their_env()
    {
        // The first thing the command does is fork, and the child already has the score and the nice value
        // (field 19 of /proc/PID/stat); SigIgn of an ignored SIGINT (the test's own) is gone.
        let own = own_score();
        let dir = tempfile::tempdir().unwrap();
        let mut command = command(OsStr::new("bash"), dir.path(), None, Priority::Lowered).unwrap();
        command
            .arg("-c")
            .arg(
                "cat /proc/self/oom_score_adj; cut -d' ' -f19 /proc/self/stat; \
                 grep SigIgn /proc/self/status; echo \"$0\"; pwd; env",
            )
            .env("odd-name.x", "kept")
            .stdout(Stdio::piped());
        let out = command.output().await.unwrap();
        let out = String::from_utf8(out.stdout).unwrap();
        let dir = dir.path().display().to_string();
        assert!(
            out.starts_with(&format!(
                "1000\n5\nSigIgn:\t0000000000000000\nbash\n{dir}\n"
            )),
            "{out}"
        );
        assert!(out.contains("\nodd-name.x=kept\n"), "{out}");
        assert_eq!(own_score(), own, "the executor's own score is untouched");
    }

    #[tokio::test]
    async fn the_kernel_keeps_its_priority() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = command(OsStr::new("/bin/sh"), dir.path(), None, Priority::Kept).unwrap();
        let own_nice = rustix::process::getpriority_process(None).unwrap();
        command
            .arg("-c")
            .arg("cat /proc/self/oom_score_adj; cut -d' ' -f19 /proc/self/stat")
            .stdout(Stdio::piped());
        let out = command.output().await.unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("1000\n{own_nice}\n")
        );
    }

    #[test]
    fn programs_are_found_as_execvp_finds_them_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("bin")).unwrap();
        let tool = root.join("bin/tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        let plain = root.join("bin/plain");
        std::fs::write(&plain, "data").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = OsString::from(format!("/nonexistent:{}/bin", root.display()));

        assert_eq!(resolve("tool".as_ref(), root, Some(&path)).unwrap(), tool);
        assert_eq!(resolve("bin/tool".as_ref(), root, None).unwrap(), tool);
        assert_eq!(
            resolve("/bin/sh".as_ref(), root, None).unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert_eq!(
            resolve("sh".as_ref(), root, None).unwrap().file_name(),
            Some(OsStr::new("sh"))
        );
        let missing = resolve("no-such-tool".as_ref(), root, Some(&path)).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc_enoent()));
        assert!(resolve("".as_ref(), root, None).is_err());
        // A directory is never a program. Root may read what it likes, but not execute a file without x.
        assert!(resolve("bin".as_ref(), root, Some(root.as_os_str())).is_err());
        assert!(resolve("bin/plain".as_ref(), root, None).is_err());
    }

    fn libc_enoent() -> i32 {
        Errno::ENOENT as i32
    }

    #[test]
    fn path_comes_from_the_most_specific_env_that_sets_it() {
        let action = HashMap::from([("X".to_owned(), "1".to_owned())]);
        let sandbox = HashMap::from([("PATH".to_owned(), "/opt/bin".to_owned())]);
        assert_eq!(
            path_of([action.get("PATH"), sandbox.get("PATH")]),
            Some(OsString::from("/opt/bin"))
        );
        assert_eq!(path_of([action.get("PATH")]), std::env::var_os("PATH"));
    }

    #[test]
    fn the_programs_arguments_are_parsed_strictly_and_errors_have_words() {
        assert_eq!(program::parse(b"-"), Some(None));
        assert_eq!(program::parse(b"1000"), Some(Some(1000)));
        assert_eq!(program::parse(b"4294967295"), Some(Some(u32::MAX)));
        for bad in [&b""[..], b"4294967296", b"-1", b"10a", b" 5"] {
            assert_eq!(program::parse(bad), None, "{bad:?}");
        }
        assert_eq!(program::reason(2), b"No such file or directory");
        assert_eq!(program::reason(13), b"Permission denied");
        assert_eq!(program::reason(9999), b"unexpected error");
    }

    #[test]
    fn the_fallback_takes_the_added_variables_out_of_the_environment_in_place() {
        let vars = [
            c"A=1",
            c"PWD=/w",
            c"SHLVL=0",
            c"PWDX=2",
            c"_=/bin/ls",
            c"B=_=",
        ];
        let mut envp: Vec<*const u8> = vars.iter().map(|v| v.as_ptr().cast()).collect();
        envp.push(std::ptr::null());
        #[allow(unsafe_code)]
        // SAFETY: a writable, null-terminated array of NUL-terminated strings that outlive the call.
        let left: Vec<&str> = unsafe {
            program::remove_vars(envp.as_ptr(), &[b"PWD=", b"SHLVL=", b"_="]);
            envp.iter()
                .take_while(|p| !p.is_null())
                .map(|&p| std::ffi::CStr::from_ptr(p.cast()).to_str().unwrap())
                .collect()
        };
        assert_eq!(left, ["A=1", "PWDX=2", "B=_="]);
    }

    #[tokio::test]
    async fn the_program_starts_in_its_folder_and_a_missing_one_ends_it_with_126() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let out = command(OsStr::new("/bin/pwd"), &sub, None, Priority::Kept)
            .unwrap()
            .output()
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{}\n", sub.display())
        );
        // Gone between the check and the start: the process says so and runs nothing.
        let mut command = command(OsStr::new("/bin/pwd"), &sub, None, Priority::Kept).unwrap();
        std::fs::remove_dir(&sub).unwrap();
        let out = command.stderr(Stdio::piped()).output().await.unwrap();
        assert_eq!(out.status.code(), Some(126));
        assert!(out.stdout.is_empty());
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "mentis-enter: cannot enter the folder {}: No such file or directory\n",
                sub.display()
            )
        );
    }

    #[tokio::test]
    async fn a_program_that_cannot_be_executed_ends_with_126_and_says_why() {
        // The check above sees the file executable; the kernel then refuses its format.
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("bogus");
        std::fs::write(&bogus, b"\x7fELF not really").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&bogus, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = command(bogus.as_os_str(), dir.path(), None, Priority::Kept).unwrap();
        let out = command.stderr(Stdio::piped()).output().await.unwrap();
        assert_eq!(out.status.code(), Some(126));
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "mentis-enter: cannot execute {}: Exec format error\n",
                bogus.display()
            )
        );
    }
}
